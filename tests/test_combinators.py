"""funcnet.combinators: serial, parallel, fan-out/in, residual; keys and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import funcnet
from funcnet import core
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
