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
    net = funcnet.serial(funcnet.FanOut(2), funcnet.parallel(_counter_layer(), Dense(3)), funcnet.FanInConcat(axis=-1))
    out_shape, params, state = check_layer(net, (-1, 3))
    assert out_shape == (-1, 6)
    x = jax.random.normal(KEY, (2, 3))
    y, new_state = net.apply(params, state, x, train=True)
    np.testing.assert_allclose(y[:, :3], x + params[1][0]["b"])
    np.testing.assert_allclose(y[:, 3:], x @ params[1][1]["W"] + params[1][1]["b"], rtol=1e-6)
    assert int(new_state[1][0]["calls"]) == 1

    summed = funcnet.serial(funcnet.FanOut(3), funcnet.parallel(Dense(4), Dense(4), Dense(4)), funcnet.FanInSum)
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


def _residual_stack(depth):
    from funcnet.layers import Gelu, LayerNorm

    net = funcnet.serial(*[funcnet.Residual(funcnet.serial(LayerNorm(), Dense(16), Gelu)) for _ in range(depth)])
    _, params, state = net.init(KEY, (-1, 16))
    return params, lambda p, x: jnp.sum(net.apply(p, state, x)[0] ** 2)


def test_residual_gradient_is_the_plain_sums_and_forward_mode_works():
    params, loss = _residual_stack(3)
    x = jax.random.normal(KEY, (4, 16))
    # the same gradient as x + f(x) written out, op by op (eager: no fusion to differ)
    with jax.disable_jit():
        got = jax.grad(loss)(params, x)

    def by_hand(p, x):
        for block in p:
            (ln, dense, _) = block
            mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
            h = (x - mu) / jnp.sqrt(var + 1e-5) * ln["scale"] + ln["bias"]
            x = x + jax.nn.gelu(h @ dense["W"] + dense["b"], approximate=False)
        return jnp.sum(x**2)

    with jax.disable_jit():
        want = jax.grad(by_hand)(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # forward mode through the gradient's barrier: jvp and a Hessian-vector product
    # (jitted: eager, each op of a second-order pass would be a program of its own)
    tangent = jax.tree.map(jnp.ones_like, params)
    jvp = jax.jit(lambda f: jax.jvp(lambda p: f(p, x), (params,), (tangent,))[1], static_argnums=0)
    np.testing.assert_allclose(jvp(loss), jvp(by_hand), rtol=1e-4)
    hvp = jax.jit(lambda f: jax.jvp(jax.grad(lambda p: f(p, x)), (params,), (tangent,))[1], static_argnums=0)
    hvp, hvp_hand = hvp(loss), hvp(by_hand)
    for a, b in zip(jax.tree.leaves(hvp), jax.tree.leaves(hvp_hand)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def _widest_fusion(depth):
    """The most arrays any fusion of the compiled gradient of ``depth`` blocks reads."""
    import re

    params, loss = _residual_stack(depth)
    hlo = jax.jit(jax.grad(loss)).lower(params, jnp.ones((8, 16))).compile().as_text()
    return max(len(re.findall(r"%[\w.-]+", m)) for m in re.findall(r" fusion\(([^)]*)\)", hlo))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's fusion (the pass this works around)")
@pytest.mark.skipif(
    tuple(int(v) for v in jax.lib.__version__.split(".")[:2]) < (0, 11),
    reason=f"jaxlib {jax.lib.__version__}'s XLA:CPU drops optimization barriers before fusion: "
    "there Residual's gradient is fused into every later block as before",
)
def test_residual_gradient_is_summed_once_not_fused_into_every_later_block():
    # Without the barrier XLA:CPU fuses each block's gradient sum into the next block's
    # backward, recomputing it there: the widest fusion grows with depth (15, 33 and 70
    # arrays for 2, 4 and 8 blocks on jaxlib 0.12) and the work with depth squared.
    assert _widest_fusion(8) == _widest_fusion(2)


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


def test_params_of_another_network_name_the_layer_and_the_keys():
    from funcnet.layers import BatchNorm, Relu

    net = funcnet.serial(Dense(3), Relu, Dense(2))
    other = funcnet.serial(BatchNorm(), Relu, Dense(2))  # as many layers: no length error
    x = jnp.ones((2, 4))
    _, params, state = net.init(KEY, (-1, 4))
    _, other_params, _ = other.init(KEY, (-1, 4))
    with pytest.raises(
        ValueError,
        match=r"serial: the params given to layer 0 \(Dense\(3\)\) do "
        r"not fit it: it expects \{'W': float32\[4, 3\], 'b': float32\[3\]\}, got "
        r"\{'bias': float32\[4\], 'scale': float32\[4\]\}.*init",
    ):
        net.apply(other_params, state, x)
    with pytest.raises(ValueError, match=r"params and state look swapped.*apply\(params, state"):
        net.apply(state, params, x)  # today: tuple indices must be...
    with pytest.raises(ValueError, match=r"apply needs this layer's state.*swapped"):
        other.apply(*reversed(other.init(KEY, (-1, 4))[1:]), x)
    # Nested: the path is the params path (funcnet.params.paths), the layer named.
    deep = funcnet.serial(Relu, funcnet.serial(encoder=Dense(3), head=Dense(2)))
    _, deep_params, _ = deep.init(KEY, (-1, 4))
    wrong = (deep_params[0], {"encoder": {"E": jnp.ones((5, 3))}, "head": deep_params[1]["head"]})
    with pytest.raises(
        ValueError,
        match=r"serial: the params given to layer 1/encoder "
        r"\(Dense\(3\)\) do not fit it",
    ):
        deep.apply(wrong, (), x)
    with pytest.raises(ValueError, match=r"layer 1 \(serial\).*encoder.*got \['a'\]"):
        deep.apply((deep_params[0], {"a": 1}), (), x)

    # A layer's own bug (a KeyError with the right params) is left as it is.
    def init(rng, shape):
        return shape, {"w": jnp.ones(())}, ()

    def apply(params, state, x, *, rng=None, train=False):
        return x * params["typo"], state

    buggy = funcnet.serial(funcnet.named("Buggy", init, apply))
    _, bp, bs = buggy.init(KEY, (-1, 4))
    with pytest.raises(KeyError, match="typo"):
        buggy.apply(bp, bs, x)
