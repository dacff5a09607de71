"""state=() for networks of stateless layers, and make_predict_fn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funcnet
from funcnet import FanInConcat, FanInSum, FanOut, Residual, parallel, serial
from funcnet.layers import BatchNorm, Dense, Dropout, Relu, Tanh

KEY = jax.random.key(0)
X = jnp.asarray(np.random.default_rng(0).normal(size=(3, 5)), jnp.float32)


def _same_with_empty_state(net, x):
    _, params, state = net.init(KEY, (-1, 5))
    assert jax.tree.leaves(state) == [] and state != ()  # the nested ((), ...) of init
    want, want_state = net.apply(params, state, x)
    got, got_state = net.apply(params, (), x)
    np.testing.assert_array_equal(got, want)
    assert got_state == () and want_state == state
    return params


@pytest.mark.parametrize(
    "make",
    [
        lambda: serial(Dense(4), Relu, Dense(2)),
        lambda: serial(FanOut(2), parallel(Dense(3), serial(Dense(3), Tanh)), FanInConcat()),
        lambda: serial(Dense(5), Residual(serial(Dense(5), Relu)), Residual(Tanh)),
        lambda: serial(
            serial(Dense(4), serial(Relu, Dropout(0.5))),
            serial(FanOut(2), parallel(Dense(4), Residual(Relu)), FanInSum),
            Dense(2),
        ),
        lambda: serial(encoder=serial(Dense(4), Relu), decoder=serial(Dense(3), Relu, Dense(5))),
    ],
)
def test_stateless_networks_accept_empty_state(make):
    _same_with_empty_state(make(), X)


def test_parallel_alone_accepts_empty_state():
    net = parallel(Dense(2), Relu)
    _, params, _ = net.init(KEY, ((-1, 5), (-1, 5)))
    outs, state = net.apply(params, (), (X, X))
    np.testing.assert_array_equal(outs[1], jax.nn.relu(X))
    assert state == ()


def test_empty_state_under_jit_and_grad():
    net = serial(Dense(4), Relu, Dense(1))
    _, params, _ = net.init(KEY, (-1, 5))
    g = jax.jit(jax.grad(lambda p: net.apply(p, (), X)[0].sum()))(params)
    assert jax.tree.structure(g) == jax.tree.structure(params)


def test_stateful_layer_given_empty_state_is_named():
    net = serial(Dense(4), serial(Relu, BatchNorm()), Dense(2))
    _, params, state = net.init(KEY, (-1, 5))
    net.apply(params, state, X)  # the real state works
    with pytest.raises(ValueError, match=r"BatchNorm.*state \['mean', 'var'\].*init"):
        net.apply(params, (), X)


def test_user_stateful_layer_given_empty_state_gets_a_note_naming_it():
    def init(rng, shape):
        return shape, (), {"count": jnp.zeros((), jnp.int32)}

    def apply(params, state, x, *, rng=None, train=False):
        return x, {"count": state["count"] + 1}

    net = serial(Relu, serial(Tanh, funcnet.named("Counter", init, apply)))
    _, params, _ = net.init(KEY, (-1, 5))
    with pytest.raises(TypeError) as info:
        net.apply(params, (), X)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1  # only the innermost combinator speaks
    assert "layer 1 (Counter)" in notes[0] and "state returned by init" in notes[0]


def test_make_predict_fn_is_eval_mode_with_params_bound():
    net = serial(Dense(8), BatchNorm(), Relu, Dropout(0.5), Dense(2))
    _, params, state = net.init(KEY, (-1, 5))
    _, state = net.apply(params, state, X, rng=KEY, train=True)  # non-trivial statistics
    predict = funcnet.make_predict_fn(net, params, state)
    want, _ = net.apply(params, state, X, train=False)
    # jitted against eager: the same float32 expression compiled two ways may round
    # differently in the last bit (jax 0.12: 1.5e-8 at 0.007); dropout or batch
    # statistics would be off by orders more
    np.testing.assert_allclose(predict(X), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(predict(X), predict(X))  # no dropout: deterministic


def test_make_predict_fn_defaults_to_empty_state():
    net = serial(Dense(4), Relu, Dense(2))
    _, params, _ = net.init(KEY, (-1, 5))
    predict = funcnet.make_predict_fn(net, params)
    np.testing.assert_array_equal(predict(X), net.apply(params, (), X)[0])
    assert predict(X[:1]).shape == (1, 2)


def test_make_predict_fn_without_state_for_a_stateful_net_names_the_layer():
    net = serial(Dense(4), BatchNorm())
    _, params, _ = net.init(KEY, (-1, 5))
    with pytest.raises(ValueError, match="BatchNorm"):
        funcnet.make_predict_fn(net, params)(X)


def test_make_predict_fn_reuses_one_compiled_program_per_network():
    """New params for the same network (each epoch's, say) must not compile again."""
    net = funcnet.serial(Dense(3), Relu, Dense(2))
    _, p1, _ = net.init(jax.random.key(0), (-1, 4))
    _, p2, _ = net.init(jax.random.key(1), (-1, 4))
    f1, f2 = funcnet.make_predict_fn(net, p1), funcnet.make_predict_fn(net, p2)
    assert f1.func is f2.func
    x = jnp.ones((5, 4))
    f1(x)
    f2(x)
    assert f1.func._cache_size() == 1
    assert not np.allclose(f1(x), f2(x))
