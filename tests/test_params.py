"""Named serial, the path view of params, masks, and freeze."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import optim, serial
from funcnet.layers import BatchNorm, Conv, Dense, Embedding, Flatten, LayerNorm, LSTM, Relu
from funcnet.params import freeze, kernel_mask, mask_where, paths, subtree_mask

KEY = jax.random.key(0)


def autoencoder():
    return serial(encoder=serial(Dense(4), LayerNorm(), Relu), decoder=serial(Dense(3), Dense(6)))


def test_named_serial_params_are_dicts_and_apply_in_written_order():
    net = serial(zeta=Dense(4), alpha=Dense(2))  # sorted keys != written order
    out_shape, params, state = net.init(KEY, (-1, 3))
    assert out_shape == (-1, 2) and set(params) == {"zeta", "alpha"}
    assert params["zeta"]["W"].shape == (3, 4) and state == {"zeta": (), "alpha": ()}
    x = jnp.ones((2, 3))
    want = (x @ params["zeta"]["W"] + params["zeta"]["b"]) @ params["alpha"]["W"] + params["alpha"]["b"]
    np.testing.assert_allclose(net.apply(params, state, x)[0], want, rtol=1e-6)


def test_named_serial_matches_positional_serial():
    pos = serial(Dense(4), Relu, Dense(2))
    nam = serial(a=Dense(4), b=Relu, c=Dense(2))
    _, p_pos, _ = pos.init(KEY, (-1, 3))
    _, p_nam, _ = nam.init(KEY, (-1, 3))  # same key split in the same order
    jax.tree.map(np.testing.assert_array_equal, list(p_pos), [p_nam[k] for k in "abc"])
    x = jnp.ones((2, 3))
    np.testing.assert_array_equal(pos.apply(p_pos, (), x)[0], nam.apply(p_nam, (), x)[0])


def test_named_serial_errors():
    with pytest.raises(TypeError, match="either all positionally or all by name"):
        serial(Dense(2), head=Dense(2))
    net = serial(a=Dense(2))
    _, params, state = net.init(KEY, (-1, 3))
    with pytest.raises(ValueError, match=r"params do not match .*\['a'\].*got \['b'\]"):
        net.apply({"b": params["a"]}, state, jnp.ones((1, 3)))


def test_paths_of_a_named_net():
    _, params, _ = autoencoder().init(KEY, (-1, 6))
    view = paths(params)
    assert list(view) == [
        "decoder/0/W",
        "decoder/0/b",
        "decoder/1/W",
        "decoder/1/b",
        "encoder/0/W",
        "encoder/0/b",
        "encoder/1/bias",
        "encoder/1/scale",
    ]
    assert view["encoder/0/W"] is params["encoder"][0]["W"]
    assert funcnet.paths(params).keys() == view.keys()


def test_kernel_mask_selects_exactly_the_kernels():
    net = serial(conv=serial(Conv(2, (3, 3)), BatchNorm(), Relu, Flatten), head=Dense(3))
    _, params, _ = net.init(KEY, (-1, 5, 5, 1))
    _, emb, _ = serial(Embedding(7, 4), LSTM(3)).init(KEY, (-1, 2))
    selected = {p for p, m in paths(kernel_mask({"cnn": params, "rnn": emb})).items() if m}
    assert selected == {"cnn/conv/0/W", "cnn/head/W", "rnn/0/E", "rnn/1/W_hh", "rnn/1/W_ih"}


def test_decay_on_kernels_only_leaves_biases_and_norms_untouched():
    _, params, _ = autoencoder().init(KEY, (-1, 6))
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    tx = optax.masked(optax.add_decayed_weights(0.1), kernel_mask)
    updates, _ = tx.update(zero_grads, tx.init(params), params)
    for path, u in paths(updates).items():
        if path.endswith("/W"):
            np.testing.assert_allclose(u, 0.1 * paths(params)[path], rtol=1e-6)
        else:
            assert not np.any(u), path


def test_subtree_mask_and_mask_where():
    _, params, _ = autoencoder().init(KEY, (-1, 6))
    enc = paths(subtree_mask(params, "encoder"))
    assert {p for p, m in enc.items() if m} == {p for p in enc if p.startswith("encoder/")}
    assert [p for p, m in paths(subtree_mask(params, "decoder/1")).items() if m] == ["decoder/1/W", "decoder/1/b"]
    biases = mask_where(params, lambda path, x: path.endswith("/b"))
    assert [p for p, m in paths(biases).items() if m] == ["decoder/0/b", "decoder/1/b", "encoder/0/b"]
    with pytest.raises(ValueError, match=r"no parameter path starts with 'enc'.*encoder/0/W"):
        subtree_mask(params, "enc")  # whole components only: a typo is an error


def _frozen_step(tx, net, params, x):
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        grads = jax.grad(lambda p: jnp.sum(net.apply(p, (), x)[0] ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(3):
        params, opt_state = step(params, opt_state)
    return params


def test_freeze_keeps_a_subnetwork_bit_identical_under_weight_decay_and_momentum():
    net = autoencoder()
    _, params, _ = net.init(KEY, (-1, 6))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 6)), jnp.float32)
    sgd = optim.sgd(0.1, momentum=0.9, weight_decay=0.1)
    after = _frozen_step(freeze(sgd, lambda p: subtree_mask(p, "encoder")), net, params, x)
    jax.tree.map(np.testing.assert_array_equal, after["encoder"], params["encoder"])
    assert not np.allclose(after["decoder"][0]["W"], params["decoder"][0]["W"])


def test_stop_gradient_alone_does_not_freeze_under_weight_decay():
    """Why freeze exists: a zero gradient still gets weight decay in optax."""
    _, params, _ = autoencoder().init(KEY, (-1, 6))
    x = jnp.ones((4, 6))
    stopped = serial(encoder=_stop_gradient(serial(Dense(4), LayerNorm(), Relu)), decoder=serial(Dense(3), Dense(6)))
    after = _frozen_step(optim.sgd(0.1, momentum=0.9, weight_decay=0.1), stopped, params, x)
    assert not np.allclose(after["encoder"][0]["W"], params["encoder"][0]["W"])


def _stop_gradient(layer):
    def apply(params, state, x, *, rng=None, train=False):
        return layer.apply(jax.lax.stop_gradient(params), state, x, rng=rng, train=train)

    return funcnet.named("StopGradient", layer.init, apply)


@pytest.mark.parametrize(
    "name,make",
    [
        ("sgd", lambda: optim.sgd(0.1, momentum=0.9, weight_decay=0.1)),
        ("adam", lambda: optim.adam(0.1, weight_decay=0.1)),
        ("adamw", lambda: optim.adamw(0.1)),  # weight_decay=0.01 by default
        ("rmsprop", lambda: optim.rmsprop(0.1, momentum=0.9, weight_decay=0.1)),
    ],
)
def test_freeze_keeps_params_bit_identical_under_every_decaying_recipe(name, make):
    """The promise in optim's docstrings: freeze(), not stop_gradient, freezes."""
    net = autoencoder()
    _, params, _ = net.init(KEY, (-1, 6))
    x = jnp.ones((4, 6))
    after = _frozen_step(freeze(make(), lambda p: subtree_mask(p, "encoder")), net, params, x)
    jax.tree.map(np.testing.assert_array_equal, after["encoder"], params["encoder"])
    assert not np.allclose(after["decoder"][0]["W"], params["decoder"][0]["W"])
