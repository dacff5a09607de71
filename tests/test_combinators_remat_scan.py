"""funcnet.combinators: Remat (jax.checkpoint) and Scan (lax.scan over stacked copies)."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funcnet
from funcnet import Remat, Scan, serial, stack_params, unstack_params
from funcnet.core import MismatchError
from funcnet.layers import BatchNorm, Dense, Dropout, Tanh
from funcnet.testing import check_layer

KEY = jax.random.key(0)
APPLY_KEY = jax.random.key(1)
X = np.random.RandomState(0).randn(3, 4).astype(np.float32)
TOL = dict(rtol=1e-5, atol=1e-6)


def _block():
    return serial(Dense(4), Tanh, Dropout(0.5))


def _bn_block():
    return serial(Dense(4), BatchNorm())


def _value_and_grads(layer, params, state, x, train=True, rng=APPLY_KEY):
    """(outputs, new_state) and the grads of a scalar loss w.r.t. params and inputs."""

    def loss(p, x):
        out, s = layer.apply(p, state, x, rng=rng, train=train)
        return jnp.sum(jnp.sin(out)), (out, s)

    # jit: one compilation instead of one per primitive, eagerly.
    (_, (out, new_state)), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(params, x)
    return out, new_state, grads


def _jitted(thunk):
    """Runs ``thunk`` as one compiled program (eagerly, each primitive compiles alone)."""
    return jax.jit(thunk)()


def _residual_bytes(fn, *args):
    """Bytes the backward pass of ``fn`` keeps from the forward pass (jax.vjp's closure)."""
    # eval_shape: traced, never run; the residuals are the leaves of the vjp closure.
    vjp = jax.eval_shape(lambda *a: jax.vjp(fn, *a)[1], *args)
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(vjp))


# --------------------------------------------------------------------------- #
# Remat
# --------------------------------------------------------------------------- #


def test_remat_matches_the_layer_with_dropout():
    plain, remat = _block(), Remat(_block())
    shape, params, state = plain.init(KEY, (-1, 4))
    r_shape, r_params, r_state = remat.init(KEY, (-1, 4))
    assert r_shape == shape and r_state == state == ((), (), ())
    chex.assert_trees_all_equal(r_params, params)
    assert remat.name == "Remat(serial)"
    want = _value_and_grads(plain, params, state, X)
    got = _value_and_grads(remat, params, state, X)
    chex.assert_trees_all_close(got, want, **TOL)
    assert np.any(np.asarray(got[0]) == 0)  # the dropout mask did apply inside the checkpoint
    # rng=None in eval mode goes through the checkpoint too.
    chex.assert_trees_all_close(*_jitted(lambda: (remat.apply(params, state, X)[0], plain.apply(params, state, X)[0])))
    # Not a tautology: the apply really runs under jax.checkpoint.
    run = lambda p: remat.apply(p, state, X, rng=APPLY_KEY, train=True)  # noqa: E731
    jaxpr = str(jax.make_jaxpr(run)(params))
    assert "checkpoint" in jaxpr or "remat" in jaxpr


def test_remat_threads_batchnorm_state():
    plain, remat = _bn_block(), Remat(_bn_block())
    # Gradients: compared with the plain layer's below (check_layer's float64 finite
    # differences run on Scan(Remat(...)) in test_check_layer_on_scan_of_remat).
    _, params, state = check_layer(remat, (-1, 4), train_modes=(True,), grad_check=False)
    want = _value_and_grads(plain, params, state, X)
    got = _value_and_grads(remat, params, state, X)
    chex.assert_trees_all_close(got, want, **TOL)
    assert not np.allclose(got[1][1]["mean"], state[1]["mean"])  # train mode updated the stats


def test_remat_policy_is_passed_and_checked():
    net = serial(Dense(8), Tanh, Dense(8), Tanh)
    _, params, state = net.init(KEY, (-1, 4))
    x = np.ones((16, 4), np.float32)

    def saved(layer):
        return _residual_bytes(lambda p: layer.apply(p, state, x)[0], params)

    plain = saved(net)
    nothing = saved(Remat(net))
    dots = saved(Remat(net, policy=jax.checkpoint_policies.dots_saveable))
    everything = saved(Remat(net, policy=jax.checkpoint_policies.everything_saveable))
    assert nothing < dots < plain and everything >= dots
    no_cse = Remat(net, policy=jax.checkpoint_policies.dots_saveable, prevent_cse=False)
    chex.assert_trees_all_close(
        *_jitted(lambda: (no_cse.apply(params, state, x)[0], net.apply(params, state, x)[0])), **TOL
    )
    with pytest.raises(TypeError, match=r"Remat: policy must be .*got str"):
        Remat(net, policy="dots_saveable")
    with pytest.raises(ValueError, match=r"Remat: prevent_cse must be True or False"):
        Remat(net, prevent_cse="yes")
    with pytest.raises(TypeError, match=r"Remat: expected a funcnet Layer.*call it"):
        Remat(Dense)


def _deep(remat):
    block = lambda: serial(Dense(256), Tanh)  # noqa: E731
    return serial(*[Remat(block()) if remat else block() for _ in range(8)])


def test_remat_keeps_fewer_intermediates_for_the_backward_pass():
    x = np.random.RandomState(1).randn(256, 256).astype(np.float32)
    kept = []
    for remat in (False, True):
        net = _deep(remat)
        _, params, state = net.init(KEY, (-1, 256))
        total = _residual_bytes(lambda p: jnp.sum(net.apply(p, state, x)[0] ** 2), params)
        kept.append((total - sum(p.nbytes for p in jax.tree.leaves(params))) / x.nbytes)
    # In activations (beyond the params the backward pass needs either way). Plain: each
    # block keeps its input and its tanh output; Remat: its input only.
    plain, remat = kept
    assert plain >= 15 and remat <= 9.5, kept


def _temp_bytes(net, x):
    _, params, state = net.init(KEY, (-1, x.shape[-1]))
    loss = lambda p, x: jnp.sum(net.apply(p, state, x)[0] ** 2)  # noqa: E731
    stats = jax.jit(jax.grad(loss)).lower(params, x).compile().memory_analysis()
    if stats is None:
        pytest.skip(f"memory_analysis() returns None on the {jax.default_backend()} backend")
    return stats.temp_size_in_bytes


@pytest.mark.parametrize("form", ["scan", "serial"])
def test_remat_lowers_compiled_temp_memory(form):
    """Compiled scratch memory of grad: Remat around each block must shrink it.

    XLA:CPU (jax 0.10.2) drops checkpoint's optimization barriers in an unrolled
    stack and reuses the forward matmuls, so temp_size does not drop for ``serial``
    there (measured: it grows); inside a loop the recomputation cannot be hoisted
    and it drops on every backend.
    """
    if form == "serial" and jax.default_backend() == "cpu":
        pytest.skip(
            "XLA:CPU CSEs the rematerialised forward of an unrolled stack back into "
            "the forward pass: temp_size does not drop (the scan form and "
            "test_remat_keeps_fewer_intermediates_for_the_backward_pass cover it)"
        )
    x = np.random.RandomState(1).randn(256, 256).astype(np.float32)
    if form == "scan":
        block = serial(Dense(256), Tanh, Dense(256), Tanh)
        plain, remat = _temp_bytes(Scan(block, 8), x), _temp_bytes(Scan(Remat(block), 8), x)
    else:
        plain, remat = _temp_bytes(_deep(False), x), _temp_bytes(_deep(True), x)
    assert remat < 0.6 * plain, (remat, plain)


# --------------------------------------------------------------------------- #
# Scan
# --------------------------------------------------------------------------- #


def test_scan_init_is_serials_init_stacked():
    n = 3
    shape, params, state = Scan(_block(), n).init(KEY, (-1, 4))
    s_shape, s_params, s_state = serial(*[_block()] * n).init(KEY, (-1, 4))
    assert shape == s_shape == (-1, 4)
    assert params[0]["W"].shape == (n, 4, 4)
    chex.assert_trees_all_equal(params, stack_params(s_params))
    chex.assert_trees_all_equal(unstack_params(params, n), s_params)
    assert state == s_state[0] == ((), (), ())  # nothing to stack: the copy's own ()
    _, bn_params, bn_state = Scan(_bn_block(), n).init(KEY, (-1, 4))
    _, s_params, s_state = serial(*[_bn_block()] * n).init(KEY, (-1, 4))
    chex.assert_trees_all_equal((bn_params, bn_state), (stack_params(s_params), stack_params(s_state)))


def test_scan_equals_serial_with_dropout():
    n = 3
    scan, unrolled = Scan(_block(), n), serial(*[_block()] * n)
    _, params, state = scan.init(KEY, (-1, 4))
    s_params = unstack_params(params, n)
    out, new_state, (g_params, g_x) = _value_and_grads(scan, params, state, X)
    s_out, _, (s_gp, s_gx) = _value_and_grads(unrolled, s_params, (), X)
    chex.assert_trees_all_close((out, g_params, g_x), (s_out, stack_params(s_gp), s_gx), **TOL)
    assert new_state == state
    assert np.any(np.asarray(out) == 0)  # dropout ran: the keys match serial's per copy
    # Eval mode with rng=None needs no key; state=() is accepted and given back.
    (y, s), s_y = _jitted(lambda: (scan.apply(params, (), X), unrolled.apply(s_params, (), X)[0]))
    assert s == ()
    chex.assert_trees_all_close(y, s_y, **TOL)


def test_scan_threads_batchnorm_state_like_serial():
    n = 3
    scan, unrolled = Scan(_bn_block(), n), serial(*[_bn_block()] * n)
    _, params, state = scan.init(KEY, (-1, 4))
    s_params, s_state = unstack_params(params, n), unstack_params(state, n)
    out, new_state, grads = _value_and_grads(scan, params, state, X)
    s_out, s_new, s_grads = _value_and_grads(unrolled, s_params, s_state, X)
    # atol: a Dense bias in front of a BatchNorm has a gradient of 0 up to rounding.
    chex.assert_trees_all_close(
        (out, new_state, grads),
        (s_out, stack_params(s_new), (stack_params(s_grads[0]), s_grads[1])),
        rtol=1e-5,
        atol=1e-5,
    )
    assert new_state[1]["mean"].shape == (n, 4)
    assert not np.allclose(new_state[1]["mean"], state[1]["mean"])
    # The running statistics are used in eval mode, copy by copy.
    chex.assert_trees_all_close(
        *_jitted(lambda: (scan.apply(params, new_state, X)[0], unrolled.apply(s_params, s_new, X)[0])), **TOL
    )
    with pytest.raises(ValueError, match=r"BatchNorm.*state"):
        scan.apply(params, (), X)


def test_scan_of_residual_block_and_of_remat_and_unroll():
    n = 4
    block = funcnet.Residual(serial(Dense(4), Tanh))
    unrolled = serial(*[block] * n)
    _, params, _ = Scan(block, n).init(KEY, (-1, 4))
    s_params = unstack_params(params, n)
    want = _value_and_grads(unrolled, s_params, (), X, train=False)
    want = (want[0], want[1], (stack_params(want[2][0]), want[2][1]))
    for scan in (Scan(block, n), Scan(Remat(block), n, unroll=2)):
        assert scan.init(KEY, (-1, 4))[1][0]["W"].shape == (n, 4, 4)
        chex.assert_trees_all_close(_value_and_grads(scan, params, (), X, train=False), want, **TOL)
    jaxpr = str(jax.make_jaxpr(lambda p: Scan(block, n, unroll=2).apply(p, (), X))(params))
    assert "unroll=2" in jaxpr


def test_scan_program_size_is_flat_in_n():
    block = serial(Dense(4), Tanh)

    def eqns(layer):
        _, params, _ = layer.init(KEY, (-1, 4))
        return len(jax.make_jaxpr(lambda p: layer.apply(p, (), X))(params).jaxpr.eqns)

    assert eqns(Scan(block, 2)) == eqns(Scan(block, 16))
    assert eqns(serial(*[block] * 16)) > 4 * eqns(serial(*[block] * 2))


def test_check_layer_on_scan_of_remat():
    # Remat alone: test_remat_threads_batchnorm_state. Train mode only (eval mode is
    # compared with serial above), to keep the compilations few.
    block = serial(Dense(4), Dropout(0.5))
    check_layer(Scan(Remat(block, policy=jax.checkpoint_policies.dots_saveable), 2), (-1, 4), train_modes=(True,))


def test_scan_without_params_counts_its_copies():
    scan = Scan(Dropout(0.5), 3)  # no params, no state: nothing to scan over but the keys
    _, params, state = scan.init(KEY, (-1, 4))
    assert params == () and state == ()
    x = np.ones((2, 4), np.float32)
    unrolled = serial(*[Dropout(0.5)] * 3)
    y, s_y, y_eval = _jitted(
        lambda: (
            scan.apply(params, state, x, rng=APPLY_KEY, train=True)[0],
            unrolled.apply(((),) * 3, (), x, rng=APPLY_KEY, train=True)[0],
            scan.apply(params, state, x)[0],
        )
    )
    chex.assert_trees_all_close(y, s_y)
    assert set(np.unique(np.asarray(y))) <= {0.0, 8.0}  # three inverted-dropout scalings
    chex.assert_trees_all_close(y_eval, x)


def test_scan_errors():
    with pytest.raises(
        ValueError,
        match=r"Scan\(Dense\(3\), 2\): the layer must keep the shape"
        r".*\(-1, 4\) to \(-1, 3\)",
    ):
        Scan(Dense(3), 2).init(KEY, (-1, 4))
    with pytest.raises(ValueError, match=r"Scan: n must be a positive int"):
        Scan(Dense(4), 0)
    with pytest.raises(ValueError, match=r"Scan: unroll must be a positive int"):
        Scan(Dense(4), 2, unroll=0)
    scan = Scan(Dense(4), 2)
    _, params3, _ = Scan(Dense(4), 3).init(KEY, (-1, 4))
    with pytest.raises(
        MismatchError,
        match=r"expected params of 2 copies stacked on axis 0, "
        r"got shapes \{'W': float32\[3, 4, 4\]",
    ):
        scan.apply(params3, (), X)
    _, serial_params, _ = serial(Dense(4), Dense(4)).init(KEY, (-1, 4))
    with pytest.raises(MismatchError, match=r"stack_params"):
        scan.apply(serial_params, (), X)
    # Inside a combinator the error says where the Scan sits.
    outer = serial(Tanh, scan)
    with pytest.raises(
        MismatchError,
        match=r"layer 1 \(Scan\(Dense\(4\), 2\)\) do not fit it: "
        r"it expects 2 copies stacked on axis 0",
    ):
        outer.apply(((), params3), (), X)
    _, bn_params, bn_state = Scan(BatchNorm(), 2).init(KEY, (-1, 4))
    with pytest.raises(MismatchError, match=r"expected state of 2 copies"):
        Scan(BatchNorm(), 2).apply(bn_params, unstack_params(bn_state, 2)[0], X)


def test_stack_and_unstack_params():
    trees = [{"W": np.full((2,), i, np.float32), "b": (np.float32(i),)} for i in range(3)]
    stacked = stack_params(trees)
    np.testing.assert_array_equal(stacked["W"], [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(stacked["b"][0], [0, 1, 2])
    chex.assert_trees_all_equal(unstack_params(stacked, 3), tuple(trees))
    assert stack_params([(), ()]) == () and unstack_params((), 2) == ((), ())
    with pytest.raises(ValueError, match=r"non-empty"):
        stack_params([])
    with pytest.raises(ValueError, match=r"tree 1 is"):
        stack_params([{"W": np.zeros(2)}, {"V": np.zeros(2)}])
    with pytest.raises(ValueError, match=r"expected every leaf to hold 2 copies.*float32\[3, 2\]"):
        unstack_params(stacked, 2)
    assert {"Remat", "Scan", "stack_params", "unstack_params"} <= set(funcnet.__all__)
    assert {"Remat", "Scan", "stack_params", "unstack_params", "serial", "Residual"} <= set(funcnet.combinators.__all__)
