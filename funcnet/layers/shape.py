"""Shape layers: ``Flatten`` and ``Reshape``. The first axis is the batch and is kept."""

from __future__ import annotations

import math
from typing import Sequence

import jax.numpy as jnp

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet.core import Layer, check_input, check_known, check_shape, named

__all__ = ["Flatten", "Reshape"]


def _flatten_init(rng, input_shape):
    shape = check_shape("Flatten", input_shape, min_rank=2)
    check_known("Flatten", shape, range(1, len(shape)), "non-batch size")
    return (shape[0], math.prod(shape[1:])), (), ()


def _flatten_apply(params, state, inputs, *, rng=None, train=False):
    check_input("Flatten", inputs, min_rank=2)
    return inputs.reshape(inputs.shape[0], math.prod(inputs.shape[1:])), state


Flatten: Layer = named("Flatten", _flatten_init, _flatten_apply)
"""``(N, d1, ..., dk) -> (N, d1 * ... * dk)``, in row-major (C) order, as ``torch.nn.Flatten()``.

A layer value: use ``Flatten``, not ``Flatten()``.
"""


def Reshape(shape: int | Sequence[int]) -> Layer:
    """``(N, ...) -> (N, *shape)`` in row-major order, as ``x.reshape(x.shape[0], *shape)``.

    ``shape`` excludes the batch axis; at most one entry may be -1, inferred from
    the input size. The non-batch input sizes must be known at ``init``.

    Args:
      shape: the output shape without the batch axis, an int or a tuple of ints, each
        positive but at most one -1 (inferred).

    Returns:
      The layer, an ``(init, apply)`` pair without params or state:
      ``init(rng, (N, ...))`` gives ``((N, *shape), (), ())``, with the -1 resolved.

    Raises:
      TypeError: ``shape`` is not an int or a tuple of ints.
      ValueError: an entry neither positive nor -1, or two -1 entries; at ``init``,
        unknown (-1) non-batch sizes; an input whose size per example does not fit
        ``shape``.

    Examples:
      >>> init, apply = Reshape((4, 2))
      >>> init(jax.random.key(0), (-1, 8))[0]
      (-1, 4, 2)
    """
    name = f"Reshape({shape!r})"
    target = (shape,) if checks.is_int(shape) else shape
    if not isinstance(target, (tuple, list)) or not all(checks.is_int(d) for d in target):
        raise TypeError(f"{name}: shape must be an int or a tuple of ints (excluding the batch axis), got {shape!r}.")
    target = tuple(int(d) for d in target)
    if any(d < 1 and d != -1 for d in target) or target.count(-1) > 1:
        raise ValueError(f"{name}: shape entries must be positive, with at most one -1 to infer, got {target}.")

    def resolve(in_shape):
        size = math.prod(in_shape[1:])
        known = math.prod(d for d in target if d != -1)
        if (-1 in target and size % known) or (-1 not in target and size != known):
            raise ValueError(
                f"{name}: cannot reshape an input of shape {tuple(in_shape)} "
                f"({size} elements per example) to (batch, *{target}) "
                f"({'a multiple of ' if -1 in target else ''}{known} elements)."
            )
        return tuple(size // known if d == -1 else d for d in target)

    def init(rng, input_shape):
        in_shape = check_shape(name, input_shape, min_rank=1)
        check_known(name, in_shape, range(1, len(in_shape)), "non-batch size")
        return (in_shape[0],) + resolve(in_shape), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=1)
        out_shape = (inputs.shape[0],) + resolve(inputs.shape)
        # The batch axis keeps its Explicit-mesh split, which JAX cannot infer for a split axis.
        batch = (_mesh.explicit_spec(inputs) or (None,))[0]
        out = _mesh.explicit_sharding(inputs, batch, *(None,) * (len(out_shape) - 1))
        return jnp.reshape(inputs, out_shape, out_sharding=out), state

    return named(name, init, apply)
