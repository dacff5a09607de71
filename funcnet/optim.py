"""Optimizers: optax transformations that follow PyTorch's recipes step for step.

Every constructor returns an :class:`optax.GradientTransformation`, so the usual
optax loop applies::

    opt = funcnet.optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    opt_state = opt.init(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)

``learning_rate`` may be a number or an optax schedule (a callable of the update
count, which is 0 for the first update). That matches a PyTorch LR scheduler
whose ``scheduler.step()`` is called once after every ``optimizer.step()``:
the n-th update (0-based) uses ``schedule(n)``.

The constructors also work under ``optax.inject_hyperparams`` (numeric
arguments then arrive as arrays, possibly traced, and are not range-checked).

Why not plain ``optax.sgd`` / ``optax.adam``?

* ``optax.sgd(momentum=...)`` uses ``optax.trace``: no ``dampening``, and a
  buffer that starts at zero, whereas PyTorch's first buffer is the raw
  (undamped) gradient. PyTorch also adds the L2 term ``weight_decay * p`` to
  the gradient *before* the momentum buffer.
* ``optax.adam`` has no L2 term (``optax.adamw`` decays the weights after the
  moment estimates, which is AdamW, not ``torch.optim.Adam(weight_decay=...)``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from funcnet import _checks as checks

__all__ = ["sgd", "adam", "torch_momentum", "TorchMomentumState"]


# Python and NumPy scalars are "concrete": they can decide the structure of the
# chain and be range-checked. Arrays (inject_hyperparams) never do, so init and
# update always build the same chain.
_is_python_number = checks.is_real


def _check_nonnegative(fn: str, name: str, value: Any) -> None:
    checks.hyperparameter(fn, name, value, low=0.0)


class TorchMomentumState(NamedTuple):
    """State of :func:`torch_momentum`: the update count and the momentum buffer."""

    count: jax.Array
    trace: Any


def torch_momentum(momentum: float, dampening: float = 0.0,
                   nesterov: bool = False) -> optax.GradientTransformation:
    """Heavy-ball momentum exactly as ``torch.optim.SGD`` applies it.

    With ``g`` the incoming update and ``b`` the buffer::

        b_1 = g_1                                   (first step: no dampening)
        b_t = momentum * b_{t-1} + (1 - dampening) * g_t
        out = g_t + momentum * b_t   if nesterov else   b_t

    ``optax.trace`` differs on the first step when ``dampening != 0`` (it would
    give ``(1 - dampening) * g_1``) and has no dampening. When ``momentum`` is an
    array equal to 0 the update passes through unchanged, as in PyTorch, where a
    zero momentum means no buffer at all.
    """
    def init_fn(params):
        return TorchMomentumState(
            count=jnp.zeros([], jnp.int32),
            trace=jax.tree.map(jnp.zeros_like, params))

    def update_fn(updates, state, params=None):
        del params
        first = state.count == 0

        def new_buffer(g, b):
            return jnp.where(first, g, momentum * b + (1 - dampening) * g).astype(g.dtype)

        trace = jax.tree.map(new_buffer, updates, state.trace)
        if nesterov:
            out = jax.tree.map(lambda g, b: (g + momentum * b).astype(g.dtype), updates, trace)
        else:
            out = trace
        if not _is_python_number(momentum):
            out = jax.tree.map(lambda g, o: jnp.where(momentum == 0, g, o), updates, out)
        return out, TorchMomentumState(optax.safe_increment(state.count), trace)

    return optax.GradientTransformation(init_fn, update_fn)


def sgd(learning_rate: optax.ScalarOrSchedule, momentum: float = 0.0,
        dampening: float = 0.0, nesterov: bool = False,
        weight_decay: float = 0.0) -> optax.GradientTransformation:
    """Stochastic gradient descent with the trajectory of ``torch.optim.SGD``.

    Per parameter ``p`` with gradient ``g`` at update ``t`` (``lr_t`` from the
    schedule when ``learning_rate`` is callable)::

        g = g + weight_decay * p                    (L2, before momentum)
        b = g                                       (t = 0)
        b = momentum * b + (1 - dampening) * g      (t > 0)
        g = g + momentum * b  if nesterov  else  b  (only when momentum != 0)
        p = p - lr_t * g

    The learning rate multiplies the whole buffer (PyTorch), so changing it
    with a schedule does not rescale past gradients stored in the buffer.

    Raises:
      ValueError: a negative ``learning_rate``/``momentum``/``weight_decay``, or
        ``nesterov=True`` without ``momentum > 0`` and ``dampening == 0``
        (PyTorch's rules).
    """
    checks.learning_rate("sgd", learning_rate)
    _check_nonnegative("sgd", "momentum", momentum)
    _check_nonnegative("sgd", "weight_decay", weight_decay)
    if nesterov and _is_python_number(momentum) and _is_python_number(dampening) and (
            momentum <= 0 or dampening != 0):
        raise ValueError(
            "sgd: Nesterov momentum requires momentum > 0 and dampening == 0 "
            f"(as torch.optim.SGD), got momentum={momentum!r}, dampening={dampening!r}.")
    parts = []
    if not (_is_python_number(weight_decay) and weight_decay == 0):
        parts.append(optax.add_decayed_weights(weight_decay))
    if not (_is_python_number(momentum) and momentum == 0):
        parts.append(torch_momentum(momentum, dampening, nesterov))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def adam(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """Adam with the semantics of ``torch.optim.Adam`` (L2 weight decay, not AdamW).

    Per parameter, at update ``t = 1, 2, ...``::

        g = g + weight_decay * p                    (L2 on the gradient)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        p = p - lr_t / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)

    ``eps`` is added to the bias-corrected ``sqrt(v_hat)``, which is where both
    PyTorch and ``optax.scale_by_adam`` (with ``eps_root=0``) put it, so the
    chain ``add_decayed_weights -> scale_by_adam -> scale_by_learning_rate`` is
    the same formula. For decoupled weight decay use ``optax.adamw``.

    Raises:
      ValueError: negative ``learning_rate``/``eps``/``weight_decay`` or betas
        outside ``[0, 1)`` (PyTorch's checks).
    """
    checks.learning_rate("adam", learning_rate)
    _check_nonnegative("adam", "eps", eps)
    _check_nonnegative("adam", "weight_decay", weight_decay)
    for name, beta in (("b1", b1), ("b2", b2)):
        checks.hyperparameter("adam", name, beta, low=0.0, high=1.0, high_open=True)
    parts = []
    if not (_is_python_number(weight_decay) and weight_decay == 0):
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=0.0))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)
