"""funcnet.outputs against real MXNet 1.9.1 (golden file) and written-out formulas.

Golden values come from ``tests/golden/make_mxnet_golden.py`` (run under a
separate MXNet venv, see its docstring); the numpy references below are loops
over the MXNet C++ formulas, independent of the vectorised implementation.
"""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import outputs as O

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "mxnet_outputs.npz")
_Z = np.load(GOLDEN)
_META = json.loads(str(_Z["meta"]))
SINGLE = [c for c in _META["cases"] if c["kind"] == "single"]
RTOL, ATOL = 1e-5, 1e-6


def close(actual, expected, rtol=RTOL, atol=ATOL, err_msg=""):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, err_msg=err_msg)


def golden(name, key):
    return _Z[f"{name}/{key}"]


# --------------------------------------------------------------------------- #
# Golden values from MXNet 1.9.1.
# --------------------------------------------------------------------------- #


def test_golden_file_is_from_mxnet_191_and_covers_every_op():
    assert _META["mxnet_version"] == "1.9.1"
    ops = {c["op"] for c in SINGLE}
    assert ops == {
        "softmax_output",
        "linear_regression_output",
        "logistic_regression_output",
        "mae_regression_output",
        "svm_output",
        "make_loss",
    }
    assert len(SINGLE) > 80


@pytest.mark.parametrize("case", SINGLE, ids=[c["name"] for c in SINGLE])
def test_matches_mxnet(case):
    name, op, kwargs = case["name"], getattr(O, case["op"]), case["kwargs"]
    inputs = [jnp.asarray(golden(name, f"in/{k}")) for k in case["inputs"]]
    argnums = tuple(range(len(inputs)))
    out, grads = O.value_and_grad(lambda *a: op(*a, **kwargs), argnums=argnums)(*inputs)
    close(out, golden(name, "out"), err_msg=f"{name}: forward")
    for key, g in zip(case["inputs"], grads):
        # MXNet's label gradient is all zeros too; the golden file checks both.
        close(g, golden(name, f"grad/{key}"), err_msg=f"{name}: grad of {key}")


def _group_net(x, w, label, target):
    z = x @ w
    return (
        O.softmax_output(z, label, normalization="batch"),
        O.linear_regression_output(z, target, grad_scale=0.5),
        O.make_loss(jnp.sum(z * z, axis=1), normalization="batch"),
    )


@pytest.mark.parametrize("jit", [False, True])
def test_group_of_heads_matches_mxnet_executor(jit):
    keys = ("x", "w", "label", "target")
    args = [jnp.asarray(golden("group", f"in/{k}")) for k in keys]
    vg = O.value_and_grad(_group_net, argnums=(0, 1, 2, 3))
    if jit:
        vg = jax.jit(vg)
    outs, grads = vg(*args)
    for i, out in enumerate(outs):
        close(out, golden("group", f"out{i}"))
    for key, g in zip(keys, grads):
        close(g, golden("group", f"grad/{key}"), rtol=1e-5, atol=1e-5, err_msg=key)
    g_only = O.grad(_group_net, argnums=(0, 1))
    g_only = jax.jit(g_only) if jit else g_only
    gx, gw = g_only(*args)
    close(gx, golden("group", "grad/x"), atol=1e-5)
    close(gw, golden("group", "grad/w"), atol=1e-5)


def test_block_grad_inside_make_loss_matches_mxnet():
    x = jnp.asarray(golden("blockgrad_chain", "in/x"))
    f = lambda x: O.make_loss(x * O.block_grad(x))  # noqa: E731
    close(f(x), golden("blockgrad_chain", "out"))
    close(O.grad(f)(x), golden("blockgrad_chain", "grad/x"))
    close(jax.grad(lambda x: jnp.sum(O.block_grad(x) * 3.0))(x), np.zeros(x.shape))


# --------------------------------------------------------------------------- #
# Independent numpy references (loops over MXNet's C++ formulas).
# --------------------------------------------------------------------------- #


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_softmax_grad_rows(prob, labels, grad_scale, ignore_label, use_ignore, normalization, smooth_alpha):
    """prob (L, C) rows, labels (L,): MXNet's SoftmaxGrad / SmoothSoftmaxGrad loop."""
    n_rows, c = prob.shape
    g = np.zeros_like(prob, dtype=np.float64)
    for y in range(n_rows):
        k = int(labels[y])
        for x in range(c):
            if use_ignore and k == int(ignore_label):
                g[y, x] = 0.0
            elif smooth_alpha:
                g[y, x] = prob[y, x] - 1 + smooth_alpha if x == k else prob[y, x] - smooth_alpha / (c - 1)
            else:
                g[y, x] = prob[y, x] - (1.0 if x == k else 0.0)
    valid = max(1, sum(int(v) != int(ignore_label) for v in labels))
    norm = {"null": 1, "batch": n_rows, "valid": valid}[normalization]
    return g * grad_scale / norm


@pytest.mark.parametrize("normalization", ["null", "batch", "valid"])
@pytest.mark.parametrize("use_ignore,smooth_alpha", [(False, 0.0), (True, 0.0), (True, 0.25)])
def test_softmax_output_2d_formula(normalization, use_ignore, smooth_alpha):
    rs = np.random.RandomState(0)
    x = rs.randn(7, 4).astype(np.float32)
    labels = np.array([0, 3, -1, 2, 1, -1, 3], np.float32)
    kw = dict(grad_scale=1.7, use_ignore=use_ignore, normalization=normalization, smooth_alpha=smooth_alpha)
    out = O.softmax_output(x, labels, **kw)
    g = O.grad(lambda d: O.softmax_output(d, labels, **kw))(x)
    p = np_softmax(x.astype(np.float64), 1)
    close(out, p)
    close(g, ref_softmax_grad_rows(p, labels, 1.7, -1.0, use_ignore, normalization, smooth_alpha))


@pytest.mark.parametrize("normalization", ["null", "batch", "valid"])
@pytest.mark.parametrize("use_ignore", [False, True])
def test_softmax_output_multi_output_formula(normalization, use_ignore):
    rs = np.random.RandomState(1)
    n, c, d1, d2 = 2, 3, 2, 2
    x = rs.randn(n, c, d1, d2).astype(np.float32)
    labels = np.array([[[0, 2], [-1, 1]], [[2, 2], [0, -1]]], np.float32)
    kw = dict(grad_scale=0.8, use_ignore=use_ignore, normalization=normalization, multi_output=True)
    g = np.asarray(O.grad(lambda d: O.softmax_output(d, labels, **kw))(x))
    p = np_softmax(x.astype(np.float64), 1)
    expected = np.zeros_like(p)
    positions = n * d1 * d2
    valid = max(1, int(np.sum(labels != -1)))
    # multi_output: "null" divides by D = d1*d2, "batch" by N*D, "valid" by the count.
    norm = {"null": d1 * d2, "batch": positions, "valid": valid}[normalization]
    for i in range(n):
        for a in range(d1):
            for b in range(d2):
                k = int(labels[i, a, b])
                for cls in range(c):
                    if use_ignore and k == -1:
                        continue
                    expected[i, cls, a, b] = (p[i, cls, a, b] - (cls == k)) * 0.8 / norm
    close(g, expected)
    close(O.softmax_output(x, labels, **kw), p)


def test_softmax_output_probability_label_formula():
    rs = np.random.RandomState(2)
    x = rs.randn(3, 4).astype(np.float32)
    q = rs.rand(3, 4).astype(np.float32)
    g = O.grad(lambda d: O.softmax_output(d, q, grad_scale=2.0, normalization="batch"))(x)
    close(g, (np_softmax(x.astype(np.float64), 1) - q) * 2.0)


@pytest.mark.parametrize("use_linear", [False, True])
def test_svm_output_formula(use_linear):
    rs = np.random.RandomState(3)
    x = (rs.randn(5, 4) * 1.5).astype(np.float32)
    labels = np.array([0, 3, 1, 2, 7], np.float32)
    m, r = 0.6, 1.3
    g = O.grad(lambda d: O.svm_output(d, labels, margin=m, regularization_coefficient=r, use_linear=use_linear))(x)
    expected = np.zeros((5, 4))
    for i in range(5):
        for c in range(4):
            o = float(x[i, c])
            if c == int(labels[i]):  # hinge on max(0, m - o)
                hinge = m - o
                expected[i, c] = -(r if use_linear else 2 * r * hinge) if hinge > 0 else 0.0
            else:  # hinge on max(0, m + o)
                hinge = m + o
                expected[i, c] = (r if use_linear else 2 * r * hinge) if hinge > 0 else 0.0
    close(g, expected)
    close(O.svm_output(x, labels), x)


@pytest.mark.parametrize(
    "op,fwd,resid",
    [
        (O.linear_regression_output, lambda x: x, lambda o, y: o - y),
        (O.logistic_regression_output, lambda x: 1 / (1 + np.exp(-x)), lambda o, y: o - y),
        (O.mae_regression_output, lambda x: x, lambda o, y: np.where(o - y > 0, 1.0, -1.0)),
    ],
)
def test_regression_formula(op, fwd, resid):
    rs = np.random.RandomState(4)
    x = rs.randn(4, 2, 3).astype(np.float32)
    y = rs.rand(4, 6).astype(np.float32)  # same size, another shape
    y[0, 0] = x[0, 0, 0]  # MAE tie -> -1
    o = fwd(x.astype(np.float64))
    close(op(x, y), o)
    g = O.grad(lambda d: op(d, y, grad_scale=3.0))(x)
    close(g, resid(o, y.reshape(x.shape)) * 3.0 / 6)


@pytest.mark.parametrize("normalization", ["null", "batch", "valid"])
def test_make_loss_formula(normalization):
    x = np.array([[[0.5, 0.2], [1.0, -1.0], [0.2, 0.3]]], np.float32)  # (1, 3, 2)
    g = O.grad(lambda d: O.make_loss(d, grad_scale=2.0, normalization=normalization, valid_thresh=0.2))(x)
    norm = {
        "null": 1,
        "batch": 1 * 3,  # prod(shape[:-1])
        "valid": int(np.sum(x > np.float32(0.2))),
    }[normalization]  # strict > -> 3
    close(g, np.full(x.shape, 2.0 / norm))


def test_make_loss_valid_count_clamps_to_one():
    g = O.grad(lambda d: O.make_loss(d, normalization="valid", grad_scale=5.0))(-jnp.ones(4))
    close(g, np.full(4, 5.0))


# --------------------------------------------------------------------------- #
# Output-layer behaviour: cotangent ignored, zero label grad, jit, vmap.
# --------------------------------------------------------------------------- #

_X = np.random.RandomState(5).randn(4, 3).astype(np.float32)
_LAB = np.array([0, 2, 1, 1], np.float32)
OPS = {
    "softmax": lambda d, l: O.softmax_output(d, l, normalization="valid"),
    "linear": lambda d, l: O.linear_regression_output(d, jnp.zeros_like(d) + l[:, None]),
    "logistic": lambda d, l: O.logistic_regression_output(d, jnp.zeros_like(d) + l[:, None]),
    "mae": lambda d, l: O.mae_regression_output(d, jnp.zeros_like(d) + l[:, None]),
    "svm": lambda d, l: O.svm_output(d, l, use_linear=True),
    "make_loss": lambda d, l: O.make_loss(d * l[:, None], normalization="valid"),
}


@pytest.mark.parametrize("name", list(OPS))
def test_incoming_cotangent_is_ignored(name):
    op = OPS[name]
    base = jax.grad(lambda d: jnp.sum(op(d, _LAB)))(_X)
    scaled = jax.grad(lambda d: jnp.sum(7.0 * op(d, _LAB)))(_X)
    close(scaled, base)
    out, vjp = jax.vjp(lambda d: op(d, _LAB), _X)
    (random_ct,) = vjp(jnp.asarray(np.random.RandomState(6).randn(*out.shape), out.dtype))
    close(random_ct, base)
    close(O.grad(lambda d: op(d, _LAB))(_X), base)
    assert np.any(np.asarray(base) != 0)


def test_label_gets_zero_gradient_and_integer_labels_work():
    lab = jnp.asarray(_LAB)
    _, g_lab = jax.grad(lambda d, l: jnp.sum(O.softmax_output(d, l)), argnums=(0, 1))(_X, lab)
    close(g_lab, np.zeros(4))
    _, g_lab = jax.grad(lambda d, l: jnp.sum(O.linear_regression_output(d, l)), argnums=(0, 1))(_X[:, :1], lab)
    close(g_lab, np.zeros(4))
    g_float = O.grad(lambda d: O.softmax_output(d, lab))(_X)
    g_int = O.grad(lambda d: O.softmax_output(d, lab.astype(jnp.int32)))(_X)
    close(g_int, g_float)
    g_svm = O.grad(lambda d: O.svm_output(d, lab.astype(jnp.int32)))(_X)
    close(g_svm, O.grad(lambda d: O.svm_output(d, lab))(_X))


def test_jit_matches_eager_with_traced_labels():
    f = lambda d, l: O.softmax_output(
        d,
        l,
        use_ignore=True,
        ignore_label=1,  # noqa: E731
        normalization="valid",
        smooth_alpha=0.1,
    )
    eager = O.value_and_grad(f)(_X, _LAB)
    jitted = jax.jit(O.value_and_grad(f))(_X, _LAB)
    close(jitted[0], eager[0])
    close(jitted[1], eager[1])
    # Only the two rows whose label is 1 are ignored, so valid = 2.
    p = np_softmax(_X.astype(np.float64), 1)
    close(eager[1], ref_softmax_grad_rows(p, _LAB, 1.0, 1.0, True, "valid", 0.1))


def test_vmap_over_an_ensemble_axis():
    xs = np.random.RandomState(7).randn(3, 4, 3).astype(np.float32)
    labs = np.array([[0, 1, 2, 0], [1, -1, 2, 2], [-1, -1, -1, 0]], np.float32)
    f = O.grad(lambda d, l: O.softmax_output(d, l, use_ignore=True, normalization="valid"))
    batched = jax.jit(jax.vmap(f))(xs, labs)
    for e in range(3):
        p = np_softmax(xs[e].astype(np.float64), 1)
        close(batched[e], ref_softmax_grad_rows(p, labs[e], 1.0, -1.0, True, "valid", 0.0))


def test_grad_has_aux_plain_heads_and_pytrees():
    lab = jnp.asarray(_LAB)

    def net(params, lab):
        z = _X * params["s"]
        heads = {"cls": O.softmax_output(z, lab), "plain": 2.0 * z, "idx": jnp.argmax(z, 1)}
        return heads, {"mean": jnp.mean(z)}

    params = {"s": jnp.ones((3,), jnp.float32)}
    grads, aux = O.grad(net, has_aux=True)(params, lab)
    (heads, aux2), grads2 = O.value_and_grad(net, has_aux=True)(params, lab)
    p = np_softmax(_X.astype(np.float64), 1)
    g_z = ref_softmax_grad_rows(p, _LAB, 1.0, -1.0, False, "null", 0.0) + 2.0  # plain: ones
    close(grads["s"], np.sum(g_z * _X, axis=0), atol=1e-5)
    close(grads2["s"], grads["s"])
    close(aux["mean"], np.mean(_X))
    close(aux2["mean"], np.mean(_X))
    close(heads["cls"], p)
    assert heads["idx"].dtype == jnp.int32


# --------------------------------------------------------------------------- #
# Errors.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: O.softmax_output(_X, _LAB, normalization="mean"), ValueError, "normalization"),
        (lambda: O.make_loss(_X, normalization="sum"), ValueError, "normalization"),
        (lambda: O.softmax_output(_X, _LAB[:3]), ValueError, r"label of shape \(4,\)"),
        (lambda: O.softmax_output(_X[:, 0], _LAB), ValueError, "at least 2-D"),
        (lambda: O.softmax_output(np.zeros((2, 3, 4), np.float32), np.zeros((2, 3))), ValueError, "multi_output=True"),
        (
            lambda: O.softmax_output(np.zeros((2, 3, 4), np.float32), np.zeros((2, 3)), multi_output=True),
            ValueError,
            r"\(2, 4\)",
        ),
        (
            lambda: O.softmax_output(
                np.zeros((2, 3, 4), np.float32), np.zeros((2, 4)), multi_output=True, preserve_shape=True
            ),
            ValueError,
            "conflict",
        ),
        (
            lambda: O.softmax_output(
                np.zeros((2, 3, 4), np.float32), np.zeros((2, 4)), multi_output=True, smooth_alpha=0.1
            ),
            ValueError,
            "smooth_alpha",
        ),
        (lambda: O.softmax_output(_X, np.zeros((4, 3)), smooth_alpha=0.1), ValueError, "smooth_alpha"),
        (lambda: O.softmax_output(_X, _LAB, grad_scale="2"), TypeError, "grad_scale"),
        (lambda: O.softmax_output(_X, _LAB, use_ignore=1), TypeError, "use_ignore"),
        (lambda: O.softmax_output(_X.astype(np.int32), _LAB), TypeError, "floating"),
        (lambda: O.linear_regression_output(_X, np.zeros((4, 2))), ValueError, "same|batch size"),
        (lambda: O.mae_regression_output(_X, np.zeros((3, 4))), ValueError, "batch size"),
        (lambda: O.logistic_regression_output(jnp.float32(1.0), 0.0), ValueError, "scalar"),
        (lambda: O.svm_output(_X, np.zeros((4, 3))), ValueError, r"label of shape \(4,\)"),
        (lambda: O.grad(lambda d: d, has_aux=True)(_X), TypeError, "pair"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_errors_raise_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="label"):
        jax.jit(lambda d, l: O.softmax_output(d, l))(_X, _LAB[:2])
    assert math.isclose(float(jnp.sum(jax.jit(O.softmax_output)(_X, _LAB))), 4.0, rel_tol=1e-5)


def test_softmax_output_checks_concrete_label_range_and_keeps_mxnet_semantics_under_jit():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(
        ValueError,
        match=r"softmax_output: labels must be class ids in \[0, 4\) "
        r"or ignore_label=-1, found \[4, 7\].*multi_output",
    ):
        O.softmax_output(x, np.array([0, 4, 7], np.float32))
    with pytest.raises(ValueError, match=r"found \[-2\]"):
        O.grad(lambda d: O.softmax_output(d, np.array([0, -2, 1])))(x)  # labels concrete
    with pytest.raises(ValueError, match=r"\[0, 3\).*found \[3\]"):  # classes on axis 1
        O.softmax_output(np.zeros((2, 3, 5), np.float32), np.full((2, 5), 3), multi_output=True)
    O.softmax_output(x, np.array([0, -1, 3.7]))  # ignore_label, and 3.7 truncates to 3
    O.softmax_output(x, np.array([0, 5, 1]), ignore_label=5, use_ignore=True)
    # Under jit the values are unknown: MXNet's rule, an out-of-range label hits no class.
    g = jax.jit(O.grad(lambda d, l: O.softmax_output(d, l)))(x, jnp.array([0, 4, 7]))
    close(g[1:], np.full((2, 4), 0.25))
