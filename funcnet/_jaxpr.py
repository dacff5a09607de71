"""What a loss function computes, read from its jaxpr (traced on shapes, never run): the
loop decides from it how to dispatch the steps and how to explain a NaN."""

from __future__ import annotations

from typing import Callable, Optional

import jax

__all__ = ["any_eqn", "loss_jaxpr"]


def loss_jaxpr(train_state, loss_fn: Callable, batch) -> Optional[jax.core.Jaxpr]:
    """The jaxpr of ``loss_fn(params, state, batch, rng)`` on ``train_state``'s arrays and
    ``batch`` (arrays or ``ShapeDtypeStruct``s); None when it cannot be traced outside
    the step (a pmap collective, no batch to trace with)."""
    if batch is None:
        return None
    try:
        return jax.make_jaxpr(lambda ts, b: loss_fn(ts.params, ts.state, b, ts.rng))(train_state, batch).jaxpr
    except Exception:  # whatever the user's function raises outside its step
        return None


def any_eqn(jaxpr, predicate: Callable) -> bool:
    """Whether ``predicate(eqn)`` holds for an equation of ``jaxpr`` or of a jaxpr nested
    in one (the bodies of jit, scan, cond, custom_vjp, remat ...)."""
    for eqn in jaxpr.eqns:
        if predicate(eqn):
            return True
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(inner, "eqns") and any_eqn(inner, predicate):
                    return True
    return False
