"""The reductions every loss of :mod:`funcnet.losses` shares (private to the package).

The package's modules import these underscore names from here and from ``_args``; no
module reaches into another's private names.
"""

from __future__ import annotations

import jax.numpy as jnp

# Nothing here is public: the losses are exported by funcnet.losses alone.
__all__: list[str] = []

_REDUCTIONS = ("mean", "sum", "sum_mean", "none")


def _check_reduction(fn: str, reduction) -> None:
    if reduction not in _REDUCTIONS:
        valid = ", ".join(repr(r) for r in _REDUCTIONS)
        raise ValueError(f"{fn}: reduction must be one of {valid}, got {reduction!r}.")


def _reduce(fn: str, loss, reduction):
    """The per-element ``loss`` reduced as the package docstring (funcnet.losses) says."""
    if reduction == "mean":
        return jnp.mean(loss)
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "sum_mean":
        if loss.ndim == 0:
            raise ValueError(
                f"{fn}: reduction='sum_mean' averages over the batch axis (axis 0) "
                f"but the per-element loss is a scalar. Give the inputs a leading "
                f"batch axis, or use reduction='sum'."
            )
        return jnp.mean(jnp.sum(loss, axis=tuple(range(1, loss.ndim))), axis=0)
    return loss


_TORCH_REDUCTIONS = ("mean", "sum", "none")


def _check_torch_reduction(fn: str, reduction, extra=()) -> None:
    valid = _TORCH_REDUCTIONS + tuple(extra)
    if reduction not in valid:
        raise ValueError(f"{fn}: reduction must be one of {', '.join(map(repr, valid))}, got {reduction!r}.")
