"""funcnet.testing.check_layer: it passes correct layers and catches contract violations."""

import jax
import jax.numpy as jnp
import pytest
import funcnet
from funcnet.testing import check_layer


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


@pytest.mark.parametrize(
    "layer, msg",
    [
        (_broken(init_shape_delta=1), "init's output shape"),
        (_broken(state_change=lambda s: {"s": jnp.zeros(4)}), "shape"),
        (_broken(state_change=lambda s: {"s": jnp.zeros(3, jnp.int32)}), "dtype"),
        (_broken(state_change=lambda s: {"t": s["s"]}), "structure|struct"),
        (_broken(jit_differs=True), "jit"),
        (_broken(bad_grad=True), "JVP|VJP|check|close|Not equal|tolerance"),
    ],
)
def test_check_layer_catches_contract_violations(layer, msg):
    with pytest.raises(AssertionError, match=msg):
        check_layer(layer, (-1, 3))


def test_check_layer_accepts_a_correct_custom_layer():
    check_layer(_broken(), (-1, 3))


def test_check_layer_accepts_state_that_is_a_bare_array():
    def init(rng, shape):
        return shape, (), jnp.zeros(())

    def apply(params, state, x, *, rng=None, train=False):
        return x * 2.0, state + 1.0

    check_layer(funcnet.named("Counter", init, apply), (-1, 3))
