"""Dropout (inverted)."""

from __future__ import annotations


import jax
import jax.numpy as jnp

from funcnet import _checks as checks
from funcnet.core import Layer, check_input, check_shape, named, need_rng


def Dropout(rate: float) -> Layer:
    """Inverted dropout, as ``torch.nn.Dropout(p=rate)`` and ``flax.linen.Dropout``.

    With ``train=True`` every element is kept independently with probability
    ``1 - rate`` and the kept ones are multiplied by ``1 / (1 - rate)``::

        y = where(mask, x * (1 / (1 - rate)), 0),   mask ~ Bernoulli(1 - rate)

    so ``E[y] = x`` and nothing needs rescaling at evaluation time: ``train=False``
    is the identity. The mask comes from the ``rng`` passed to ``apply``; train mode
    without one raises ValueError. ``rate == 0`` is the identity in both modes and
    needs no ``rng`` (a ``Dropout(0.0)`` placeholder never costs a key). Stateless.

    Args:
      rate: drop probability, a real number in ``[0, 1)``.
    """
    rate = checks.real("Dropout", "rate (the probability of dropping an element)", rate,
                       low=0.0, high=1.0, high_open=True)
    keep = 1.0 - rate
    scale = 1.0 / keep
    name = f"Dropout({rate:g})"

    def init(rng, input_shape):
        return check_shape(name, input_shape, min_rank=0), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        if not train or rate == 0.0:
            return inputs, state
        need_rng(name, rng)
        mask = jax.random.bernoulli(rng, keep, jnp.shape(inputs))
        # A multiply, as torch does: XLA would turn `x / keep` into `x * (1/keep)` anyway.
        # The Python float is weakly typed, so the input dtype is kept.
        return jnp.where(mask, inputs * scale, jnp.zeros((), inputs.dtype)), state

    return named(name, init, apply)
