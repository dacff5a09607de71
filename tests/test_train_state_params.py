"""TrainState.create(params=..., state=...): start from params you have (loaded weights,
another framework's init) without running the layer's init, checked against it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import Layer, serial
from funcnet.errors import ArgumentError, MismatchError
from funcnet.layers import BatchNorm, Dense, Relu
from funcnet.train import Aux, TrainState, make_train_step

KEY = jax.random.key(0)
NET = serial(Dense(4), Relu, Dense(2))


def _loaded():
    _, params, _ = NET.init(jax.random.key(7), (-1, 3))
    return jax.tree.map(lambda x: x + 1.0, params)  # not what KEY's init would draw


def _loss(net):
    def loss(params, state, batch, rng):
        out, state = net.apply(params, state, batch, train=True)
        return jnp.mean(out**2), Aux(state=state)

    return loss


def test_given_params_are_used_as_given_and_the_init_is_only_traced():
    calls = []
    inner = Dense(2)

    def init(rng, input_shape):
        calls.append(isinstance(rng, jax.core.Tracer))
        return inner.init(rng, input_shape)

    loaded = {"W": jnp.full((3, 2), 0.5), "b": jnp.zeros(2)}
    ts = TrainState.create(Layer(init, inner.apply), optax.sgd(0.1), KEY, (-1, 3), params=loaded)
    assert calls == [True]  # traced once for the check, never run on a concrete key
    assert ts.params["W"] is loaded["W"] and ts.params["b"] is loaded["b"]
    assert ts.state == () and int(ts.step) == 0


def test_training_from_given_params_is_training_from_replaced_params():
    opt, loaded = optax.adam(1e-2), _loaded()
    given = TrainState.create(NET, opt, KEY, (-1, 3), params=loaded)
    created = TrainState.create(NET, opt, KEY, (-1, 3))
    replaced = created.replace(params=loaded, opt_state=opt.init(loaded))
    step = jax.jit(make_train_step(_loss(NET), opt))
    batch = jnp.arange(12.0).reshape(4, 3) / 10
    (a, ma), (b, mb) = step(given, batch), step(replaced, batch)
    assert float(ma["loss"]) == float(mb["loss"])
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(jax.random.key_data(given.rng), jax.random.key_data(created.rng))


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda p: (p[0], p[1], {"W": p[2]["W"][:, :1], "b": p[2]["b"]}),
            "2/W: float32[4, 1] where the init gives float32[4, 2]",
        ),
        (lambda p: (p[0], p[1], {"W": p[2]["W"].astype(jnp.float16), "b": p[2]["b"]}), "2/W: float16[4, 2]"),
        (lambda p: (p[0], p[1], {"W": p[2]["W"]}), "missing 2/b"),
        (lambda p: (p[0], p[1], {**p[2], "extra": jnp.zeros(2)}), "not in serial: 2/extra"),
        (lambda p: [p[0], p[1], p[2]], "another tree of containers"),
    ],
    ids=["shape", "dtype", "missing", "extra", "containers"],
)
def test_params_of_another_architecture_are_refused_with_the_leaf_named(change, says):
    with pytest.raises(MismatchError) as err:
        TrainState.create(NET, optax.sgd(0.1), KEY, (-1, 3), params=change(_loaded()))
    assert "TrainState.create: the params given are not serial's for input shape (-1, 3)" in str(err.value)
    assert says in str(err.value)


def test_a_layer_with_state_takes_it_too():
    net = serial(Dense(2), BatchNorm())
    _, params, state = net.init(jax.random.key(3), (-1, 3))
    state = jax.tree.map(lambda x: x + 2.0, state)  # statistics saved with the params
    with pytest.raises(MismatchError, match=r"serial has state .*pass state= too"):
        TrainState.create(net, optax.sgd(0.1), KEY, (-1, 3), params=params)
    ts = TrainState.create(net, optax.sgd(0.1), KEY, (-1, 3), params=params, state=state)
    assert ts.state[1]["mean"] is state[1]["mean"]
    with pytest.raises(MismatchError, match="the state given is not serial's"):
        TrainState.create(net, optax.sgd(0.1), KEY, (-1, 3), params=params, state=((), {"mean": state[1]["mean"]}))


def test_state_alone_and_params_for_several_models_are_argument_errors():
    with pytest.raises(ArgumentError, match="state= goes with params="):
        TrainState.create(NET, optax.sgd(0.1), KEY, (-1, 3), state=())
    with pytest.raises(ArgumentError, match="a single layer's"):
        TrainState.create({"a": (Dense(2), (-1, 3))}, optax.sgd(0.1), KEY, params={"a": {}})
