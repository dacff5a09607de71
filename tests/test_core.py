"""The layer contract, combinators, summary and the contract checker itself."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funcnet
from funcnet import combinators, core
from funcnet.layers import Dense
from funcnet.testing import check_layer

KEY = jax.random.key(0)


def _counter_layer():
    """A stateful layer that counts calls in train mode and adds its bias."""

    def init(rng, input_shape):
        return input_shape, {"b": jnp.zeros(input_shape[-1])}, {"calls": jnp.zeros((), jnp.int32)}

    def apply(params, state, x, *, rng=None, train=False):
        calls = state["calls"] + (1 if train else 0)
        return x + params["b"], {"calls": calls}

    return funcnet.named("Counter", init, apply)


def _noise_layer():
    """Adds rng-driven noise in train mode: makes key splitting observable."""

    def init(rng, input_shape):
        return input_shape, (), ()

    def apply(params, state, x, *, rng=None, train=False):
        if not train:
            return x, state
        return x + jax.random.normal(core.need_rng("Noise", rng), x.shape), state

    return funcnet.named("Noise", init, apply)


def test_layer_is_a_namedtuple_that_unpacks():
    layer = Dense(3)
    init, apply = layer
    assert isinstance(layer, funcnet.Layer) and isinstance(layer, tuple)
    assert layer._fields == ("init", "apply")
    out_shape, params, state = init(KEY, (-1, 5))
    assert out_shape == (-1, 3) and state == ()
    y, new_state = apply(params, state, jnp.ones((4, 5)))
    assert y.shape == (4, 3) and new_state == ()


def test_dense_matches_formula_and_torch_default_init():
    out_shape, params, _ = Dense(200).init(KEY, (-1, 50))
    bound = 1 / math.sqrt(50)
    for p in (params["W"], params["b"]):
        assert float(jnp.max(jnp.abs(p))) <= bound
        assert float(jnp.max(jnp.abs(p))) > 0.9 * bound  # really uniform over the range
    # U(-a, a) has variance a^2 / 3.
    np.testing.assert_allclose(np.var(params["W"]), bound ** 2 / 3, rtol=0.05)
    x = jax.random.normal(KEY, (3, 7, 50))
    y, _ = Dense(200).apply(params, (), x)
    np.testing.assert_allclose(y, np.asarray(x) @ np.asarray(params["W"]) + np.asarray(params["b"]),
                               rtol=1e-5, atol=1e-5)


def test_params_and_state_are_plain_pytrees_for_jit_grad_pmap_optax():
    import optax

    net = funcnet.serial(Dense(8), _counter_layer(), Dense(2))
    _, params, state = net.init(KEY, (-1, 4))
    leaves = jax.tree.leaves((params, state))
    assert all(isinstance(x, jax.Array) for x in leaves)
    opt = optax.adam(1e-2)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, state, opt_state, x):
        def loss(p):
            y, s = net.apply(p, state, x, train=True)
            return jnp.sum(y ** 2), s
        (l, s), g = jax.value_and_grad(loss, has_aux=True)(params)
        upd, opt_state = opt.update(g, opt_state)
        return optax.apply_updates(params, upd), s, opt_state, l

    x = jnp.ones((3, 4))
    l0 = None
    for _ in range(5):
        params, state, opt_state, l = step(params, state, opt_state, x)
        l0 = l if l0 is None else l0
    assert float(l) < float(l0)
    assert int(state[1]["calls"]) == 5

    n = jax.device_count()
    ys, states = jax.pmap(lambda p, s, x: net.apply(p, s, x, train=True), in_axes=(None, None, 0))(
        params, state, jnp.ones((n, 3, 4)))
    assert ys.shape == (n, 3, 2) and states[1]["calls"].shape == (n,)


def test_serial_threads_state_and_nests():
    inner = funcnet.serial(_counter_layer(), Dense(3))
    net = funcnet.serial(inner, _counter_layer())
    check_layer(net, (-1, 3))
    _, params, state = net.init(KEY, (-1, 3))
    assert isinstance(state, tuple) and len(state) == 2 and len(state[0]) == 2
    x = jnp.ones((2, 3))
    _, s1 = net.apply(params, state, x, train=True)
    _, s2 = net.apply(params, s1, x, train=True)
    assert int(s2[0][0]["calls"]) == 2 and int(s2[1]["calls"]) == 2
    _, s3 = net.apply(params, s2, x, train=False)
    assert int(s3[1]["calls"]) == 2


def test_parallel_fanout_fanin_and_state():
    net = funcnet.serial(funcnet.FanOut(2), funcnet.parallel(_counter_layer(), Dense(3)),
                         funcnet.FanInConcat(axis=-1))
    out_shape, params, state = check_layer(net, (-1, 3))
    assert out_shape == (-1, 6)
    x = jax.random.normal(KEY, (2, 3))
    y, new_state = net.apply(params, state, x, train=True)
    np.testing.assert_allclose(y[:, :3], x + params[1][0]["b"])
    np.testing.assert_allclose(y[:, 3:], x @ params[1][1]["W"] + params[1][1]["b"], rtol=1e-6)
    assert int(new_state[1][0]["calls"]) == 1

    summed = funcnet.serial(funcnet.FanOut(3), funcnet.parallel(Dense(4), Dense(4), Dense(4)),
                            funcnet.FanInSum)
    out_shape, params, state = check_layer(summed, (-1, 3))
    y, _ = summed.apply(params, state, x)
    want = sum(x @ p["W"] + p["b"] for p in params[1])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_residual_and_identity():
    net = funcnet.Residual(Dense(4))
    _, params, state = check_layer(net, (-1, 4))
    x = jax.random.normal(KEY, (2, 4))
    y, _ = net.apply(params, state, x)
    np.testing.assert_allclose(y, x + x @ params["W"] + params["b"], rtol=1e-5, atol=1e-6)
    check_layer(funcnet.Identity, (-1, 2, 3))
    with pytest.raises(ValueError, match=r"Residual.*\(-1, 4\).*\(-1, 5\)"):
        funcnet.Residual(Dense(5)).init(KEY, (-1, 4))


def test_combinators_give_every_sublayer_an_independent_key():
    net = funcnet.serial(funcnet.FanOut(2), funcnet.parallel(_noise_layer(), _noise_layer()))
    _, params, state = net.init(KEY, (-1, 16))
    (a, b), _ = net.apply(params, state, jnp.zeros((1, 16)), rng=KEY, train=True)
    assert not np.allclose(a, b)
    chain = funcnet.serial(_noise_layer(), _noise_layer())
    y, _ = chain.apply(((), ()), ((), ()), jnp.zeros((1, 4096)), rng=KEY, train=True)
    # Two independent N(0,1) draws add to variance 2; the same draw twice gives 4.
    assert abs(float(jnp.var(y)) - 2.0) < 0.3


def test_missing_rng_in_train_mode_is_a_clear_error():
    net = funcnet.serial(Dense(2), _noise_layer())
    _, params, state = net.init(KEY, (-1, 2))
    with pytest.raises(ValueError, match="Noise: train=True needs randomness.*rng"):
        net.apply(params, state, jnp.ones((1, 2)), train=True)


@pytest.mark.parametrize("shape, err, msg", [
    ((-1, 3.0), TypeError, r"Dense\(2\): input_shape must contain only ints"),
    ((-1, "3"), TypeError, "only ints"),
    ([-1, True], TypeError, "only ints"),
    ((-1, 0), ValueError, "positive or -1"),
    ((3, -1), ValueError, r"feature dimension .* must be known"),
    ((), ValueError, r"rank >= 1"),
    (5, TypeError, "must be a tuple of ints"),
])
def test_bad_input_shapes_at_init(shape, err, msg):
    with pytest.raises(err, match=msg):
        Dense(2).init(KEY, shape)


def test_wrong_feature_dimension_names_layer_and_shapes_even_under_jit():
    _, params, state = Dense(2).init(KEY, (-1, 3))
    apply = jax.jit(lambda p, x: Dense(2).apply(p, (), x)[0])
    with pytest.raises(ValueError, match=r"Dense\(2\).*4 features.*built for 3.*expected shape \(5, 3\), got \(5, 4\)"):
        apply(params, jnp.ones((5, 4)))


def test_constructor_argument_errors():
    with pytest.raises(ValueError, match="Dense: out_dim must be a positive int"):
        Dense(0)
    with pytest.raises(ValueError, match="FanOut"):
        funcnet.FanOut(0)
    with pytest.raises(TypeError, match="looks like a layer constructor"):
        funcnet.serial(Dense)
    with pytest.raises(TypeError, match="expected a funcnet Layer"):
        funcnet.serial(3)
    with pytest.raises(ValueError, match="params do not match this serial of 2 layers"):
        net = funcnet.serial(Dense(2), Dense(2))
        net.apply((), ((), ()), jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="parallel: expected 2 branches, got 3"):
        funcnet.parallel(Dense(2), Dense(2)).init(KEY, ((-1, 2),) * 3)
    with pytest.raises(ValueError, match="FanInSum: all branches must have the same shape"):
        funcnet.FanInSum.init(KEY, ((-1, 2), (-1, 3)))
    with pytest.raises(ValueError, match="FanInConcat"):
        funcnet.FanInConcat(axis=0).init(KEY, ((2, 2), (2, 3)))


def test_plain_pairs_are_accepted_by_combinators():
    def init(rng, shape):
        return shape, (), ()

    def apply(params, state, x, *, rng=None, train=False):
        return 2 * x, state

    net = funcnet.serial((init, apply), Dense(2))
    _, params, state = net.init(KEY, (-1, 2))
    y, _ = net.apply(params, state, jnp.ones((1, 2)))
    assert y.shape == (1, 2)


def test_summary_table_counts_and_nesting():
    net = funcnet.serial(Dense(400), funcnet.serial(Dense(100), _counter_layer()), Dense(10))
    s = funcnet.summary(net, (-1, 784), print_fn=None)
    assert s.total_params == 784 * 400 + 400 + 400 * 100 + 100 + 100 + 100 * 10 + 10
    assert s.total_state == 1
    assert s.output_shape == (-1, 10)
    names = [(r.depth, r.name) for r in s.rows]
    assert names == [(0, "serial"), (1, "Dense(400)"), (1, "serial"), (2, "Dense(100)"),
                     (2, "Counter"), (1, "Dense(10)")]
    assert "Dense(400)" in s.table and "314,000" in s.table and "(?, 10)" in s.table
    assert f"Total params: {s.total_params:,}" in s.table
    printed = []
    funcnet.summary(net, (-1, 784), print_fn=printed.append)
    assert printed == [s.table]


def test_tinynn_mlp_builds_as_in_the_issue():
    from funcnet.layers import Relu
    net = funcnet.serial(Dense(400), Relu, Dense(100), Relu, Dense(10))
    assert funcnet.summary(net, (-1, 784), print_fn=None).total_params == 784 * 400 + 400 + 400 * 100 + 100 + 1010


# --------------------------------------------------------------------------- #
# check_layer must fail on layers that break the contract.
# --------------------------------------------------------------------------- #

def _broken(init_shape_delta=0, state_change=None, jit_differs=False, bad_grad=False):
    def init(rng, input_shape):
        out = input_shape[:-1] + (input_shape[-1] + init_shape_delta,)
        return out, {"w": jnp.ones(input_shape[-1])}, {"s": jnp.zeros(3)}

    def apply(params, state, x, *, rng=None, train=False):
        y = x * params["w"]
        if jit_differs and not isinstance(x, jax.core.Tracer):
            y = y + 1.0
        if bad_grad:
            y = _wrong_grad(y)
        s = state_change(state) if state_change else state
        return y, s

    return funcnet.named("Broken", init, apply)


@jax.custom_vjp
def _wrong_grad(y):
    return y


_wrong_grad.defvjp(lambda y: (y, None), lambda _, g: (3.0 * g,))


@pytest.mark.parametrize("layer, msg", [
    (_broken(init_shape_delta=1), "init's output shape"),
    (_broken(state_change=lambda s: {"s": jnp.zeros(4)}), "shape"),
    (_broken(state_change=lambda s: {"s": jnp.zeros(3, jnp.int32)}), "dtype"),
    (_broken(state_change=lambda s: {"t": s["s"]}), "structure|struct"),
    (_broken(jit_differs=True), "jit"),
    (_broken(bad_grad=True), "JVP|VJP|check|close|Not equal|tolerance"),
])
def test_check_layer_catches_contract_violations(layer, msg):
    with pytest.raises(AssertionError, match=msg):
        check_layer(layer, (-1, 3))


def test_check_layer_accepts_a_correct_custom_layer():
    check_layer(_broken(), (-1, 3))


def test_split_rng_and_shape_helpers():
    assert combinators.split_rng(None, 3) == (None, None, None)
    assert len(combinators.split_rng(KEY, 3)) == 3
    assert core.as_tuple("L", 2, 3, "strides") == (2, 2, 2)
    with pytest.raises(ValueError, match="L: strides must be a positive int or 2 positive ints"):
        core.as_tuple("L", (1, 0), 2, "strides")
    chex.assert_equal(core.check_shape("L", [2, 3]), (2, 3))


def test_check_layer_accepts_state_that_is_a_bare_array():
    def init(rng, shape):
        return shape, (), jnp.zeros(())

    def apply(params, state, x, *, rng=None, train=False):
        return x * 2.0, state + 1.0

    check_layer(funcnet.named("Counter", init, apply), (-1, 3))
