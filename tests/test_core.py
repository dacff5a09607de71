"""funcnet.core: the layer contract, pytrees, rng and shape checks."""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
import funcnet
from funcnet import combinators, core
from funcnet.layers import Dense

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
            return jnp.sum(y**2), s

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
        params, state, jnp.ones((n, 3, 4))
    )
    assert ys.shape == (n, 3, 2) and states[1]["calls"].shape == (n,)


def test_missing_rng_in_train_mode_is_a_clear_error():
    net = funcnet.serial(Dense(2), _noise_layer())
    _, params, state = net.init(KEY, (-1, 2))
    with pytest.raises(ValueError, match="Noise: train=True needs randomness.*rng"):
        net.apply(params, state, jnp.ones((1, 2)), train=True)


@pytest.mark.parametrize(
    "shape, err, msg",
    [
        ((-1, 3.0), TypeError, r"Dense\(2\): input_shape must contain only ints"),
        ((-1, "3"), TypeError, "only ints"),
        ([-1, True], TypeError, "only ints"),
        ((-1, 0), ValueError, "positive or -1"),
        ((3, -1), ValueError, r"feature dimension .* must be known"),
        ((), ValueError, r"rank >= 1"),
        (5, TypeError, "must be a tuple of ints"),
    ],
)
def test_bad_input_shapes_at_init(shape, err, msg):
    with pytest.raises(err, match=msg):
        Dense(2).init(KEY, shape)


def test_wrong_feature_dimension_names_layer_and_shapes_even_under_jit():
    _, params, state = Dense(2).init(KEY, (-1, 3))
    apply = jax.jit(lambda p, x: Dense(2).apply(p, (), x)[0])
    with pytest.raises(ValueError, match=r"Dense\(2\).*4 features.*built for 3.*expected shape \(5, 3\), got \(5, 4\)"):
        apply(params, jnp.ones((5, 4)))


def test_split_rng_and_shape_helpers():
    assert combinators.split_rng(None, 3) == (None, None, None)
    assert len(combinators.split_rng(KEY, 3)) == 3
    assert core.as_tuple("L", 2, 3, "strides") == (2, 2, 2)
    with pytest.raises(ValueError, match="L: strides must be a positive int or 2 positive ints"):
        core.as_tuple("L", (1, 0), 2, "strides")
    chex.assert_equal(core.check_shape("L", [2, 3]), (2, 3))


def test_an_int_seed_where_init_needs_a_key_says_use_jax_random_key():
    from funcnet.train import TrainState

    net = funcnet.serial(Dense(3), Dense(2))
    for call in (
        lambda: net.init(0, (-1, 4)),
        lambda: Dense(3).init(7, (-1, 4)),
        lambda: TrainState.create(net, optax.sgd(0.1), 0, (-1, 4)),
    ):
        with pytest.raises(
            TypeError,
            match=r"rng must be a jax PRNG key, got the int \d: pass "
            r"jax.random.key\(\d\)",
        ):
            call()
