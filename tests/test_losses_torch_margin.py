"""funcnet.losses' soft_margin, multilabel_margin, multilabel_soft_margin and hinge_embedding
losses against torch.nn.functional (20 random configurations per loss and dtype, values and
gradients, float32 and float64), and torch's behaviour at the edges: cosine_embedding_loss at
zero vectors, and the gradient of an impossible CTC alignment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import losses

from helpers.torch_ref import torch

F = torch.nn.functional

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-10)]
REDUCTIONS = ["mean", "sum", "none"]
K = 7  # random configurations of each kind, for each reduction: over 20 per loss


def _torch_side(theirs, red, arrays, grad_args, rng):
    """torch's value and gradients of ``sum(out * g)``, and the random ``g``."""
    ts = [torch.tensor(a, requires_grad=i in grad_args) for i, a in enumerate(arrays)]
    out = theirs(red, *ts)
    g = rng.standard_normal(tuple(out.shape)).astype(arrays[grad_args[0]].dtype)
    (out * torch.tensor(g)).sum().backward()
    return out.detach().numpy(), [ts[i].grad.numpy() for i in grad_args], g


def _parity(ours, theirs, kinds, grad_args, tol, seed):
    """``ours(red, *arrays)`` against ``theirs(red, *tensors)`` for every reduction and
    every configuration of every kind (a kind: K configurations with the same shapes),
    values and gradients, all in one compiled program (vmapped over the configurations)."""
    rng = np.random.default_rng(seed)
    expected = [
        [[_torch_side(theirs, red, arrays, grad_args, rng) for arrays in cases] for red in REDUCTIONS]
        for cases in kinds
    ]

    def one(red, arrays, g):
        def f(*diff):
            args = list(arrays)
            for i, d in zip(grad_args, diff):
                args[i] = d
            return ours(red, *args)

        value, vjp = jax.vjp(f, *[arrays[i] for i in grad_args])
        return value, vjp(g)

    def program(batched, gs):
        return [
            [jax.vmap(lambda a, g, red=red: one(red, a, g))(arrays, g) for red, g in zip(REDUCTIONS, per_red)]
            for arrays, per_red in zip(batched, gs)
        ]

    batched = [tuple(np.stack(col) for col in zip(*cases)) for cases in kinds]
    gs = [[np.stack([e[2] for e in per]) for per in per_kind] for per_kind in expected]
    got = jax.jit(program)(batched, gs)
    for k, cases in enumerate(kinds):
        for r, red in enumerate(REDUCTIONS):
            values, grads = got[k][r]
            for c, (value, t_grads, _) in enumerate(expected[k][r]):
                cfg = dict(kind=k, reduction=red, case=c, shapes=[a.shape for a in cases[c]])
                np.testing.assert_allclose(values[c], value, rtol=tol, atol=tol, err_msg=f"value {cfg}")
                for i, t_grad in enumerate(t_grads):
                    np.testing.assert_allclose(
                        grads[i][c], t_grad, rtol=tol, atol=tol, err_msg=f"grad of argument {grad_args[i]} {cfg}"
                    )


def _x64(dtype):
    return jax.enable_x64(dtype == np.float64)


SHAPES = [(5,), (3, 4), (2, 3, 2)]


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_soft_margin_loss(dtype, tol):
    rng = np.random.default_rng(20)

    def case(shape):
        x = rng.standard_normal(shape) * 3
        y = rng.choice([-1.0, 1.0], shape) if rng.integers(2) else rng.uniform(-2, 2, shape)
        return x.astype(dtype), y.astype(dtype)  # torch uses any real target as given

    kinds = [[case(shape) for _ in range(K)] for shape in SHAPES]
    with _x64(dtype):  # torch has no gradient for the targets
        _parity(
            lambda red, x, y: losses.soft_margin_loss(x, y, reduction=red),
            lambda red, x, y: F.soft_margin_loss(x, y, reduction=red),
            kinds,
            [0],
            tol,
            0,
        )


def _multilabel_targets(rng, shape):
    """torch's class lists: distinct classes (a repeat now and then), -1, then padding that
    must be ignored (any class ids or -1)."""
    C = shape[-1]
    rows = []
    for _ in range(int(np.prod(shape[:-1]))):
        k = int(rng.integers(0, C + 1))
        listed = list(rng.permutation(C)[:k])
        if k >= 2 and rng.integers(3) == 0:
            listed[-1] = listed[0]  # a class listed twice counts twice
        tail = list(rng.integers(-1, C, C - k))
        if tail:
            tail[0] = -1
        rows.append(listed + tail)
    return np.array(rows, np.int64).reshape(shape)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_multilabel_margin_loss(dtype, tol):
    rng = np.random.default_rng(21)
    kinds = [
        [(rng.standard_normal(shape).astype(dtype), _multilabel_targets(rng, shape)) for _ in range(K)]
        for shape in [(5,), (3, 4)]
    ]
    with _x64(dtype):
        _parity(
            lambda red, x, y: losses.multilabel_margin_loss(x, y, reduction=red),
            lambda red, x, y: F.multilabel_margin_loss(x, y, reduction=red),
            kinds,
            [0],
            tol,
            1,
        )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_multilabel_soft_margin_loss(dtype, tol):
    rng = np.random.default_rng(22)

    def case(shape, w_shape):
        x = rng.standard_normal(shape) * 2
        y = rng.uniform(0, 1, shape)
        y = y if rng.integers(2) else (y > 0.5)
        arrays = (x.astype(dtype), y.astype(dtype))
        if w_shape is not None:
            arrays += (rng.uniform(0.2, 2, w_shape).astype(dtype),)
        return arrays

    kinds = [
        [case(shape, w_shape) for _ in range(K)]
        for shape, w_shape in [((4,), None), ((3, 4), (4,)), ((2, 3, 4), (2, 3, 4))]
    ]
    with _x64(dtype):
        for weighted in (False, True):  # the inputs', the targets' and the weights' gradients
            _parity(
                lambda red, x, y, *w: losses.multilabel_soft_margin_loss(
                    x, y, weight=w[0] if w else None, reduction=red
                ),
                lambda red, x, y, *w: F.multilabel_soft_margin_loss(x, y, weight=w[0] if w else None, reduction=red),
                [k for k in kinds if (len(k[0]) == 3) == weighted],
                [0, 1, 2] if weighted else [0, 1],
                tol,
                2,
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_hinge_embedding_loss(dtype, tol):
    rng = np.random.default_rng(23)

    def case(shape):
        return (
            rng.uniform(-1, 3, shape).astype(dtype),
            rng.choice([-1, 1], shape),
            np.asarray(rng.uniform(-0.5, 2), dtype),
        )  # the margin, traced here

    kinds = [[case(shape) for _ in range(K)] for shape in SHAPES]
    with _x64(dtype):
        _parity(
            lambda red, x, y, m: losses.hinge_embedding_loss(x, y, margin=m, reduction=red),
            lambda red, x, y, m: F.hinge_embedding_loss(x, y, margin=float(m), reduction=red),
            kinds,
            [0],
            tol,
            3,
        )


def test_hinge_embedding_loss_at_the_margin_takes_torch_gradient():
    # margin - x = 0 exactly: torch's clamp_min passes the gradient (-1), jnp.maximum would
    # split it in halves
    x = np.array([1.0, 0.5], np.float32)
    y = np.array([-1, -1])
    g = jax.jit(jax.grad(lambda a: losses.hinge_embedding_loss(a, y, reduction="sum")))(x)
    np.testing.assert_array_equal(g, [-1.0, -1.0])
    t = torch.tensor(x, requires_grad=True)
    F.hinge_embedding_loss(t, torch.tensor(y), reduction="sum").backward()
    np.testing.assert_array_equal(g, t.grad.numpy())


def test_multilabel_margin_loss_tie_has_no_gradient():
    # 1 - (x_0 - x_i) = 0 exactly for both other classes: torch counts z > 0 only, so no
    # score moves (jnp.maximum would move them by halves)
    x = np.array([[1.0, 0.0, 0.0]], np.float32)
    y = np.array([[0, -1, 2]])  # class 0 only: the 2 after the -1 is padding
    g = jax.jit(jax.grad(lambda a: losses.multilabel_margin_loss(a, y)))(x)
    np.testing.assert_array_equal(g, np.zeros_like(x))
    t = torch.tensor(x, requires_grad=True)
    F.multilabel_margin_loss(t, torch.tensor(y)).backward()
    np.testing.assert_array_equal(g, t.grad.numpy())


# --------------------------------------------------------------------------- #
# cosine_embedding_loss at zero vectors: torch's float32 epsilon
# --------------------------------------------------------------------------- #


def _zero_rows(dtype):
    rng = np.random.default_rng(24)
    x1 = rng.standard_normal((4, 3)).astype(dtype)
    x2 = rng.standard_normal((4, 3)).astype(dtype)
    x1[0] = 0.0  # one zero vector
    x2[1] = 0.0  # the other one
    x1[2] = x2[2] = 0.0  # both
    return x1, x2, np.array([1, -1, 1, -1])


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_cosine_embedding_loss_at_zero_vectors_matches_torch(dtype, tol):
    with _x64(dtype):
        _parity(
            lambda red, a, b, y: losses.cosine_embedding_loss(a, b, y, margin=-0.5, reduction=red),
            lambda red, a, b, y: F.cosine_embedding_loss(a, b, y, margin=-0.5, reduction=red),
            [[_zero_rows(dtype)]],
            [0, 1],
            tol,
            4,
        )


def test_cosine_embedding_loss_epsilon_is_float32_1e_12_in_float64():
    # Without torch: the gradient at a zero x1 is -x2 / sqrt(eps (|x2|^2 + eps)), which
    # tells float32(1e-12) = 9.9999998e-13 from a float64 1e-12 (a relative 2e-8 apart).
    x1, x2, _ = _zero_rows(np.float64)
    with jax.enable_x64(True):
        g = jax.grad(lambda a: losses.cosine_embedding_loss(a, jnp.asarray(x2), jnp.ones(4), reduction="sum"))(
            jnp.asarray(x1)
        )

    def zero_x1_gradient(eps):
        return -x2[0] / np.sqrt(eps * (np.sum(x2[0] ** 2) + eps))

    np.testing.assert_allclose(g[0], zero_x1_gradient(float(np.float32(1e-12))), rtol=1e-12)
    assert not np.allclose(g[0], zero_x1_gradient(1e-12), rtol=1e-9, atol=0)


# --------------------------------------------------------------------------- #
# ctc_loss of an impossible alignment (zero_infinity=False): torch's NaN gradient
# --------------------------------------------------------------------------- #


def _impossible_ctc(dtype=np.float32):
    rng = np.random.default_rng(25)
    logits = rng.standard_normal((3, 5, 4)).astype(dtype)
    # sequence 0: "1 1" needs 3 frames, it has 2; sequence 2 has no frame at all
    targets = np.array([[1, 1, 0], [1, 2, 3], [2, 0, 0]])
    input_lengths = np.array([2, 5, 0])
    target_lengths = np.array([2, 3, 1])
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("red", REDUCTIONS)
def test_ctc_impossible_alignment_gradient_is_torch_nan(red):
    logits, *args = _impossible_ctc()

    def ours(lg):
        out = losses.ctc_loss(jax.nn.log_softmax(lg), *args, reduction=red)
        return jnp.sum(out * np.arange(1.0, 1.0 + out.size, dtype=np.float32).reshape(out.shape))

    value, g = jax.jit(jax.value_and_grad(ours))(logits)
    t = torch.tensor(logits, requires_grad=True)
    out = F.ctc_loss(t.log_softmax(-1).transpose(0, 1), *map(torch.tensor, args), reduction=red)
    weighted = (out * torch.arange(1.0, 1.0 + out.numel()).reshape(out.shape)).sum()
    weighted.backward()
    assert np.isinf(value) and np.isinf(weighted.item())
    np.testing.assert_array_equal(np.isnan(g), np.isnan(t.grad.numpy()))
    np.testing.assert_allclose(g[1], t.grad.numpy()[1], rtol=1e-5, atol=1e-6)


def test_ctc_impossible_alignment_gradient_pattern():
    # Without torch: NaN on the impossible sequence's frames within input_lengths, whatever
    # its cotangent (0 here); 0 on its padded frames and on a sequence with no frames.
    logits, *args = _impossible_ctc()
    weights = jnp.array([0.0, 1.0, 1.0])

    def f(x, zero_infinity):
        per_sequence = losses.ctc_loss(x, *args, reduction="none", zero_infinity=zero_infinity)
        return jnp.sum(weights * jnp.where(jnp.arange(3) == 1, per_sequence, 0.0))

    def every(lp):  # one program
        tangent = jax.jvp(lambda x: losses.ctc_loss(x, *args, reduction="none"), (lp,), (jnp.ones_like(lp),))[1]
        return jax.grad(f)(lp, False), jax.grad(f)(lp, True), tangent

    g, g0, tangent = jax.jit(every)(jax.nn.log_softmax(jnp.asarray(logits)))
    assert np.isnan(g[0, :2]).all() and (g[0, 2:] == 0).all()
    assert (g[2] == 0).all() and np.isfinite(g[1]).all()
    assert np.isfinite(g0).all() and (g0[0] == 0).all()
    np.testing.assert_allclose(g0[1], g[1])
    # forward mode still works (the NaN gradient is a JVP rule)
    assert np.isnan(tangent[0]) and np.isfinite(tangent[1:]).all()


# --------------------------------------------------------------------------- #
# under jit, and the refused arguments
# --------------------------------------------------------------------------- #


def test_new_losses_under_jit_match_torch():
    rng = np.random.default_rng(26)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    signs = rng.choice([-1, 1], (4, 3))
    lists = np.array([[2, 0, -1], [1, -1, 0], [-1, 2, 2], [0, 1, 2]])
    probs = rng.uniform(0, 1, (4, 3)).astype(np.float32)
    calls = [
        (losses.soft_margin_loss, F.soft_margin_loss, (x, signs.astype(np.float32))),
        (losses.multilabel_margin_loss, F.multilabel_margin_loss, (x, lists)),
        (losses.multilabel_soft_margin_loss, F.multilabel_soft_margin_loss, (x, probs)),
        (losses.hinge_embedding_loss, F.hinge_embedding_loss, (np.abs(x), signs)),
    ]
    values = jax.jit(lambda every: [ours(*args) for (ours, _, _), args in zip(calls, every)])(
        [args for _, _, args in calls]
    )
    for (_, theirs, args), value in zip(calls, values):
        np.testing.assert_allclose(value, theirs(*map(torch.tensor, args)).item(), rtol=1e-5, err_msg=theirs.__name__)


def test_multilabel_margin_loss_out_of_range_under_jit_is_nan():
    x = jnp.zeros((2, 3))
    out = jax.jit(lambda y: losses.multilabel_margin_loss(x, y, reduction="none"))(
        jnp.array([[0, 3, -1], [1, -1, 7]])
    )  # 3 is listed; the 7 after -1 is padding
    assert np.isnan(out[0]) and np.isfinite(out[1])


@pytest.mark.parametrize(
    "call,error,match",
    [
        (
            lambda: losses.multilabel_margin_loss(jnp.zeros((2, 3)), jnp.array([[0, 3, -1], [1, -1, 9]])),
            ValueError,
            r"targets must be class ids in \[0, 3\) or -1, .*found \[3, 9\]",
        ),
        (
            lambda: losses.multilabel_margin_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3))),
            TypeError,
            "targets must be integer class ids",
        ),
        (
            lambda: losses.multilabel_margin_loss(jnp.zeros((2, 2, 3)), jnp.zeros((2, 2, 3), int)),
            ValueError,
            r"inputs must be \(C,\) or \(N, C\)",
        ),
        (
            lambda: losses.multilabel_margin_loss(jnp.zeros((2, 3)), jnp.zeros((2,), int)),
            ValueError,
            "targets must have the shape of inputs",
        ),
        (
            lambda: losses.soft_margin_loss(jnp.zeros((2, 3)), jnp.ones((3,))),
            ValueError,
            "targets must have the shape of inputs",
        ),
        (
            lambda: losses.soft_margin_loss(jnp.zeros(3, int), jnp.ones(3)),
            TypeError,
            "inputs must have a floating dtype",
        ),
        (
            lambda: losses.soft_margin_loss(jnp.zeros(3), jnp.ones(3), reduction="batchmean"),
            ValueError,
            "reduction must be one of",
        ),
        (
            lambda: losses.multilabel_soft_margin_loss(jnp.zeros((2, 3)), jnp.ones((2, 3)), weight=jnp.ones(2)),
            ValueError,
            r"weight of shape \(2,\) does not broadcast",
        ),
        (lambda: losses.multilabel_soft_margin_loss(jnp.zeros(()), jnp.ones(())), ValueError, "class axis"),
        (
            lambda: losses.hinge_embedding_loss(jnp.zeros(3), jnp.array([1, 0, -1])),
            ValueError,
            "labels must be 1 or -1, found \\[0\\]",
        ),
        (
            lambda: losses.hinge_embedding_loss(jnp.zeros(3), jnp.array([1, -1])),
            ValueError,
            r"labels must have shape \(3,\)",
        ),
    ],
)
def test_bad_arguments_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()
