"""Activation layers: parameter-free wrappers over ``jax.nn``.

Values (use them as is): ``Relu``, ``Elu``, ``Selu``, ``Gelu``, ``Sigmoid``,
``Tanh``, ``Softplus``. Constructors: ``LeakyRelu(negative_slope)``,
``Softmax(axis)``, ``LogSoftmax(axis)``. Each matches the ``torch.nn`` module
of the same name with its default arguments; the notes below say where the two
differ in any way. :func:`elementwise` turns any shape-preserving function into
a layer.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet.core import Layer, check_input, check_shape, named, normalize_axis

__all__ = ["Relu", "LeakyRelu", "Elu", "Selu", "Gelu", "Sigmoid", "Tanh", "Softplus", "Softmax",
           "LogSoftmax", "elementwise"]


def elementwise(name: str, fn: Callable, axis: int | None = None) -> Layer:
    """A stateless, parameter-free layer computing ``fn(inputs)``; the shape is unchanged.

    ``axis`` is for functions that work along one axis (softmax): it is checked
    against the input rank at ``init`` and at trace time.
    """

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0 if axis is None else 1)
        if axis is not None:
            normalize_axis(name, axis, len(shape))
        return shape, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        if axis is not None:
            normalize_axis(name, axis, inputs.ndim)
        return fn(inputs), state

    return named(name, init, apply)


# max(x, 0): torch.nn.ReLU.
Relu = elementwise("Relu", jax.nn.relu)
# x if x > 0 else exp(x) - 1 (alpha = 1): torch.nn.ELU().
Elu = elementwise("Elu", jax.nn.elu)
# scale * elu(x, alpha) with the self-normalising constants: torch.nn.SELU.
Selu = elementwise("Selu", jax.nn.selu)


_SQRT_HALF = 0.7071067811865476  # a Python float: weakly typed, keeps bfloat16 inputs bfloat16


def _gelu(x):
    """The exact GELU, ``x * Phi(x) = x/2 * (1 + erf(x / sqrt(2)))``: torch.nn.GELU()'s
    default (approximate="none"), in the erf form torch's CPU kernel uses. jax.nn.gelu
    defaults to the tanh approximation, and its exact form goes through erfc, which
    XLA:CPU computes at about twice the cost inside a training step (a GPT's MLP); the
    two agree to 1e-6 (float32), as both do with torch."""
    return 0.5 * x * (1.0 + lax.erf(x * _SQRT_HALF))


Gelu = elementwise("Gelu", _gelu)
# 1 / (1 + exp(-x)): torch.nn.Sigmoid.
Sigmoid = elementwise("Sigmoid", jax.nn.sigmoid)
# torch.nn.Tanh.
Tanh = elementwise("Tanh", jnp.tanh)
# log(1 + exp(x)), computed stably. torch.nn.Softplus() returns x itself above
# x = 20 (threshold); the two differ there by log1p(exp(-x)) < 2.1e-9.
Softplus = elementwise("Softplus", jax.nn.softplus)


def LeakyRelu(negative_slope: float = 0.01) -> Layer:
    """``x if x >= 0 else negative_slope * x``: ``torch.nn.LeakyReLU`` (same default 0.01)."""
    negative_slope = checks.real("LeakyRelu", "negative_slope", negative_slope)
    return elementwise(f"LeakyRelu({negative_slope})",
                       lambda x: jax.nn.leaky_relu(x, negative_slope))


def _check_axis(layer: str, axis) -> int:
    if not checks.is_int(axis):
        raise TypeError(f"{layer}: axis must be an int, got {axis!r}.")
    return int(axis)


def Softmax(axis: int = -1) -> Layer:
    """``exp(x) / sum(exp(x), axis)``: ``torch.nn.Softmax(dim=axis)``."""
    axis = _check_axis("Softmax", axis)
    return elementwise(f"Softmax(axis={axis})", lambda x: jax.nn.softmax(x, axis=axis), axis)


def LogSoftmax(axis: int = -1) -> Layer:
    """``x - logsumexp(x, axis)``: ``torch.nn.LogSoftmax(dim=axis)``."""
    axis = _check_axis("LogSoftmax", axis)
    return elementwise(f"LogSoftmax(axis={axis})", lambda x: jax.nn.log_softmax(x, axis=axis), axis)
