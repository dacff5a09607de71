"""Optimizers: optax transformations that follow PyTorch's recipes step for step.

Every constructor returns an :class:`optax.GradientTransformation`, so the usual
optax loop applies:

```
opt = funcnet.optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
opt_state = opt.init(params)
updates, opt_state = opt.update(grads, opt_state, params)
params = optax.apply_updates(params, updates)
```

``learning_rate`` may be a number or an optax schedule (a callable of the update
count, which is 0 for the first update). That matches a PyTorch LR scheduler
whose ``scheduler.step()`` is called once after every ``optimizer.step()``:
the n-th update (0-based) uses ``schedule(n)``.

The constructors also work under ``optax.inject_hyperparams`` (numeric
arguments then arrive as arrays, possibly traced, and are not range-checked).

Frozen parameters: ``jax.lax.stop_gradient`` zeroes a parameter's gradient, not
its update: ``weight_decay`` (and momentum from earlier steps) still move it,
unlike PyTorch, where ``requires_grad=False`` parameters are skipped. Freeze with
``funcnet.freeze(optimizer, mask)`` (:mod:`funcnet.params`): the optimizer never
sees the masked parameters, and they stay bit-identical.

Why not plain ``optax.sgd`` / ``optax.adam``?

* ``optax.sgd(momentum=...)`` uses ``optax.trace``: no ``dampening``, and a
  buffer that starts at zero, whereas PyTorch's first buffer is the raw
  (undamped) gradient. PyTorch also adds the L2 term ``weight_decay * p`` to
  the gradient *before* the momentum buffer.
* ``optax.adam`` has no L2 term (``optax.adamw`` decays the weights after the
  moment estimates, which is AdamW, not ``torch.optim.Adam(weight_decay=...)``).
* ``optax.rmsprop``, ``optax.adagrad`` and ``optax.radam`` put ``eps`` elsewhere
  than PyTorch and have no (or no coupled) weight decay; ``optax.adagrad`` has no
  ``lr_decay``. [Optimizers against torch and optax](../optimizers.md) lists every
  difference.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from funcnet import _checks as checks
from funcnet.core import PyTree

__all__ = [
    "sgd",
    "adam",
    "adamw",
    "radam",
    "rmsprop",
    "adagrad",
    "adadelta",
    "torch_momentum",
    "TorchMomentumState",
    "scale_by_torch_adam",
    "scale_by_torch_adagrad",
    "scale_by_torch_radam",
]


# Python and NumPy scalars are "concrete": they can decide the structure of the
# chain and be range-checked. Arrays (inject_hyperparams) never do, so init and
# update always build the same chain.
_is_python_number = checks.is_real


def _check_nonnegative(fn: str, name: str, value: Any) -> None:
    checks.hyperparameter(fn, name, value, low=0.0)


class TorchMomentumState(NamedTuple):
    """State of :func:`torch_momentum`: the update count and the momentum buffer.

    Attributes:
      count: int32 scalar, the updates made so far (0 before the first).
      trace: the momentum buffer, a pytree like the params (zeros before the first update).

    Examples:
      >>> state = torch_momentum(0.5).init({"w": jnp.zeros(2)})
      >>> int(state.count), state.trace["w"].tolist()
      (0, [0.0, 0.0])
    """

    count: jax.Array
    trace: Any


def torch_momentum(momentum: float, dampening: float = 0.0, nesterov: bool = False) -> optax.GradientTransformation:
    """Heavy-ball momentum exactly as ``torch.optim.SGD`` applies it.

    With ``g`` the incoming update and ``b`` the buffer:

    ```
    b_1 = g_1                                   (first step: no dampening)
    b_t = momentum * b_{t-1} + (1 - dampening) * g_t
    out = g_t + momentum * b_t   if nesterov else   b_t
    ```

    ``optax.trace`` differs on the first step when ``dampening != 0`` (it would
    give ``(1 - dampening) * g_1``) and has no dampening. When ``momentum`` is an
    array equal to 0 the update passes through unchanged, as in PyTorch, where a
    zero momentum means no buffer at all.

    Args:
      momentum: the buffer's decay (``torch.optim.SGD``'s ``momentum``).
      dampening: the weight ``1 - dampening`` of each new update after the first.
      nesterov: return ``g + momentum * b`` instead of ``b``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` whose state is a
      :class:`TorchMomentumState`. It scales nothing: chain it before
      ``optax.scale_by_learning_rate`` (as :func:`sgd` does).

    Examples:
      >>> tx = torch_momentum(0.5)
      >>> g = {"w": jnp.ones(2)}
      >>> state = tx.init(g)
      >>> out, state = tx.update(g, state)  # first update: the buffer is the gradient
      >>> out["w"].tolist()
      [1.0, 1.0]
      >>> out, state = tx.update(g, state)  # then 0.5 * 1 + 1
      >>> out["w"].tolist(), int(state.count)
      ([1.5, 1.5], 2)
    """

    def init_fn(params):
        return TorchMomentumState(count=jnp.zeros([], jnp.int32), trace=jax.tree.map(jnp.zeros_like, params))

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


def sgd(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
    """Stochastic gradient descent with the trajectory of ``torch.optim.SGD``.

    Per parameter ``p`` with gradient ``g`` at update ``t`` (``lr_t`` from the
    schedule when ``learning_rate`` is callable):

    ```
    g = g + weight_decay * p                    (L2, before momentum)
    b = g                                       (t = 0)
    b = momentum * b + (1 - dampening) * g      (t > 0)
    g = g + momentum * b  if nesterov  else  b  (only when momentum != 0)
    p = p - lr_t * g
    ```

    The learning rate multiplies the whole buffer (PyTorch), so changing it
    with a schedule does not rescale past gradients stored in the buffer.

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count.
      momentum: the momentum factor; 0 keeps no buffer.
      dampening: dampening of the momentum (not applied on the first update).
      nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
      weight_decay: the L2 coefficient added to the gradient as ``weight_decay * p``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: a negative ``learning_rate``/``momentum``/``weight_decay``, or
        ``nesterov=True`` without ``momentum > 0`` and ``dampening == 0``
        (PyTorch's rules).

    Examples:
      >>> opt = sgd(0.5, momentum=0.5)
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> opt_state = opt.init(params)
      >>> for _ in range(2):
      ...     grads = {"w": jnp.ones(2)}
      ...     updates, opt_state = opt.update(grads, opt_state, params)
      ...     params = optax.apply_updates(params, updates)
      >>> params["w"].tolist()  # 1 - 0.5 * 1, then - 0.5 * (0.5 * 1 + 1)
      [-0.25, 0.75]
      >>> sgd(0.1, nesterov=True)
      Traceback (most recent call last):
      ...
      ValueError: sgd: Nesterov momentum requires momentum > 0 and dampening == 0 ...
    """
    checks.learning_rate("sgd", learning_rate)
    _check_nonnegative("sgd", "momentum", momentum)
    _check_nonnegative("sgd", "weight_decay", weight_decay)
    if nesterov and _is_python_number(momentum) and _is_python_number(dampening) and (momentum <= 0 or dampening != 0):
        raise ValueError(
            "sgd: Nesterov momentum requires momentum > 0 and dampening == 0 "
            f"(as torch.optim.SGD), got momentum={momentum!r}, dampening={dampening!r}."
        )
    parts = []
    if not (_is_python_number(weight_decay) and weight_decay == 0):
        parts.append(optax.add_decayed_weights(weight_decay))
    if not (_is_python_number(momentum) and momentum == 0):
        parts.append(torch_momentum(momentum, dampening, nesterov))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
    """Adam with the semantics of ``torch.optim.Adam`` (L2 weight decay, not AdamW).

    Per parameter, at update ``t = 1, 2, ...``:

    ```
    g = g + weight_decay * p                    (L2 on the gradient)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g**2
    p = p - lr_t / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)
    ```

    ``eps`` is added to the bias-corrected ``sqrt(v_hat)``, which is where both
    PyTorch and ``optax.scale_by_adam`` (with ``eps_root=0``) put it. The chain
    is ``add_decayed_weights -> scale_by_torch_adam -> scale_by_learning_rate``:
    :func:`scale_by_torch_adam` is optax's formula with the bias corrections
    computed without cancellation, so float32 runs track torch's (which computes
    those scalars in Python double). For decoupled weight decay use :func:`adamw`.

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count.
      b1: the decay rate of the first moment estimate (the mean of the gradients).
      b2: the decay rate of the second moment estimate (the mean of their squares).
      eps: added to the bias-corrected ``sqrt(v)``.
      weight_decay: the L2 coefficient added to the gradient as ``weight_decay * p``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: negative ``learning_rate``/``eps``/``weight_decay`` or betas
        outside ``[0, 1)`` (PyTorch's checks).

    Examples:
      >>> opt = adam(0.1)
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> updates, _ = opt.update({"w": jnp.array([0.5, -3.0])}, opt.init(params), params)
      >>> np.round(optax.apply_updates(params, updates)["w"], 4)  # first step: lr * sign(g)
      Array([0.9, 2.1], dtype=float32)
    """
    checks.learning_rate("adam", learning_rate)
    _check_nonnegative("adam", "eps", eps)
    _check_nonnegative("adam", "weight_decay", weight_decay)
    for name, beta in (("b1", b1), ("b2", b2)):
        checks.hyperparameter("adam", name, beta, low=0.0, high=1.0, high_open=True)
    parts = []
    if not (_is_python_number(weight_decay) and weight_decay == 0):
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(scale_by_torch_adam(b1, b2, eps))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


# --------------------------------------------------------------------------- #
# More torch.optim recipes. Each is an optax chain; the two small transforms
# below exist only where optax's own differs from torch's formula.
# --------------------------------------------------------------------------- #


def _check_recipe(
    fn: str,
    learning_rate: Any,
    *,
    nonnegative: Optional[dict] = None,
    below_one: Optional[dict] = None,
    at_most_one: Optional[dict] = None,
) -> None:
    """PyTorch's constructor checks: ``learning_rate`` and ``nonnegative`` >= 0,
    ``below_one`` in ``[0, 1)`` (betas), ``at_most_one`` in ``[0, 1]`` (rho)."""
    checks.learning_rate(fn, learning_rate)
    for name, value in (nonnegative or {}).items():
        checks.hyperparameter(fn, name, value, low=0.0)
    for name, value in (below_one or {}).items():
        checks.hyperparameter(fn, name, value, low=0.0, high=1.0, high_open=True)
    for name, value in (at_most_one or {}).items():
        checks.hyperparameter(fn, name, value, low=0.0, high=1.0)


def _is_static_zero(value: Any) -> bool:
    return _is_python_number(value) and value == 0


def _coupled_weight_decay(weight_decay: Any) -> list:
    """``g + weight_decay * p`` before the recipe (torch's L2 ``weight_decay``)."""
    return [] if _is_static_zero(weight_decay) else [optax.add_decayed_weights(weight_decay)]


def _float_count(count: jax.Array) -> jax.Array:
    # The default float (float64 under jax_enable_x64), as torch's Python-float step math.
    return count.astype(jnp.result_type(float))


# Bias corrections and RAdam's rho_t. torch computes these step scalars in Python
# double; in float32 the textbook forms cancel: ``1 - 0.999**t`` keeps ~4 of float32's
# 7 digits at small t (and b2 itself rounds to 0.99900001), and RAdam's
# ``rho_inf - 2 t b2**t / (1 - b2**t)`` subtracts two numbers near 2000 to get one
# near t. The forms below take ``log(beta)`` in Python double when beta is a number
# (an array beta under inject_hyperparams is already rounded to the param dtype) and
# leave no difference of nearly equal numbers, so float32 runs track torch's float32
# trajectories (tests/test_optim.py: 1e-5 over 30 steps).


def _log_beta(beta: Any) -> Any:
    """``log(beta)``: Python double for a number (``-inf`` at 0), else ``jnp.log``."""
    if _is_python_number(beta):
        return math.log(beta) if beta > 0 else -math.inf
    return jnp.log(beta)


def _one_minus_power(beta: Any, t: jax.Array) -> jax.Array:
    """``1 - beta**t`` as ``-expm1(t * log(beta))``: exact to a few ulps for beta near 1."""
    return -jnp.expm1(t * _log_beta(beta))


def _langevin(z: jax.Array) -> jax.Array:
    """``coth(z) - 1/z`` for ``z >= 0`` (``z / 3`` near 0, 1 at infinity).

    The two terms cancel for small ``z``, so below 1/2 it is the Taylor series of
    ``coth`` less its ``1/z`` (the terms fall by ``(z / pi)**2``: eight are exact to
    ~1e-13 at 1/2); from 1/2 up the direct form loses at most a factor 13 to the
    cancellation, a few 1e-7 in float32 where the result is multiplied by ``t`` and
    subtracted from ``t`` (see :func:`_radam_rectification`).
    """
    small = z < 0.5
    zs = jnp.where(small, z, 0.0)
    z2 = zs * zs
    coefs = (1 / 3, -1 / 45, 2 / 945, -1 / 4725, 2 / 93555, -1382 / 638512875, 4 / 18243225, -3617 / 162820783125)
    series = coefs[-1]
    for c in coefs[-2::-1]:
        series = c + z2 * series
    zl = jnp.where(small, 1.0, z)
    return jnp.where(small, zs * series, 1.0 / jnp.tanh(zl) - 1.0 / zl)


def scale_by_torch_adagrad(initial_accumulator_value: float = 0.0, eps: float = 1e-10) -> optax.GradientTransformation:
    """Adagrad's scaling as ``torch.optim.Adagrad`` computes it (``eps`` outside the root):

    ```
    s = s + g**2                  (s starts at initial_accumulator_value)
    out = g / (sqrt(s) + eps)
    ```

    ``optax.scale_by_rss`` computes ``g / sqrt(s + eps)`` (``eps`` inside the root,
    and 0 where ``s == 0``), so it cannot give torch's trajectory; the state is
    optax's own :class:`optax.ScaleByRssState`.

    Args:
      initial_accumulator_value: the starting value of the sum of squares ``s``.
      eps: added to ``sqrt(s)``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation`; chain it with a learning rate
      (:func:`adagrad` does).

    Examples:
      >>> tx = scale_by_torch_adagrad(initial_accumulator_value=3.0)
      >>> g = {"w": jnp.array([1.0, -1.0])}
      >>> out, state = tx.update(g, tx.init(g))  # g / sqrt(3 + 1)
      >>> np.round(out["w"], 4), state.sum_of_squares["w"].tolist()
      (Array([ 0.5, -0.5], dtype=float32), [4.0, 4.0])
    """

    def init_fn(params):
        return optax.ScaleByRssState(sum_of_squares=optax.tree.full_like(params, initial_accumulator_value))

    def update_fn(updates, state, params=None):
        del params
        sums = jax.tree.map(lambda g, s: s + g * g, updates, state.sum_of_squares)
        out = jax.tree.map(lambda g, s: (g / (jnp.sqrt(s) + eps)).astype(g.dtype), updates, sums)
        return out, optax.ScaleByRssState(sum_of_squares=sums)

    return optax.GradientTransformation(init_fn, update_fn)


def _radam_rectification(count: jax.Array, b2: Any):
    """``(rectify, r_t)``: torch's ``rho_t > 5`` test and the variance rectification term.

    With ``y = -t log(b2)``, ``2 t b2**t / (1 - b2**t) = 2t / expm1(y)
    = -2 / log(b2) - t + t L(y / 2)`` (``L(z) = coth(z) - 1/z``, :func:`_langevin`), so
    ``rho_t = (rho_inf + 2 / log(b2)) + t (1 - L(y / 2))``: the first bracket is a
    constant (about ``(1 - b2) / 6``) computed once in Python double, and nothing
    left cancels.
    """
    t = _float_count(count)
    log_b2 = _log_beta(b2)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    rho_t = (rho_inf + 2.0 / log_b2) + t * (1.0 - _langevin(-0.5 * t * log_b2))
    rectify = rho_t > 5.0
    rho = jnp.where(rectify, rho_t, 5.0)  # keeps the unused branch free of NaN
    r_t = jnp.sqrt((rho - 4.0) * (rho - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho))
    return rectify, r_t


def _adam_state_init(params) -> optax.ScaleByAdamState:
    return optax.ScaleByAdamState(
        count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params), nu=optax.tree.zeros_like(params)
    )


def scale_by_torch_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """Adam's scaling as ``torch.optim.Adam`` computes it. At update ``t = 1, 2, ...``:

    ```
    m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g**2
    out = m / (1 - b1**t) / (sqrt(v) / sqrt(1 - b2**t) + eps)
    ```

    ``optax.scale_by_adam(eps_root=0)`` is the same formula, but it computes
    ``1 - b**t`` in the parameters' dtype, which in float32 keeps only a few
    digits when ``b**t`` is near 1 (``b2 = 0.999``, small ``t``); torch computes it
    in Python double. Here it is ``-expm1(t * log(b))``, accurate in float32 too.
    The state is optax's own :class:`optax.ScaleByAdamState`.

    Args:
      b1: the decay rate of the first moment estimate (the mean of the gradients).
      b2: the decay rate of the second moment estimate (the mean of their squares).
      eps: added to the bias-corrected ``sqrt(v)``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation`; chain it with a learning rate
      (:func:`adam` and :func:`adamw` do).

    Examples:
      >>> tx = scale_by_torch_adam()
      >>> g = {"w": jnp.array([0.5, -3.0])}
      >>> out, state = tx.update(g, tx.init(g))  # first update: g / |g|
      >>> np.round(out["w"], 4), int(state.count)
      (Array([ 1., -1.], dtype=float32), 1)
    """

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        count = optax.safe_increment(state.count)
        t = _float_count(count)
        bc1 = _one_minus_power(b1, t)
        root_bc2 = jnp.sqrt(_one_minus_power(b2, t))

        def scaled(m, v):
            return (m / bc1 / (jnp.sqrt(v) / root_bc2 + eps)).astype(m.dtype)

        out = jax.tree.map(scaled, mu, nu)
        return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(_adam_state_init, update_fn)


def scale_by_torch_radam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """RAdam's scaling as ``torch.optim.RAdam`` computes it. At update ``t = 1, 2, ...``:

    ```
    m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g**2
    m_hat = m / (1 - b1**t)
    rho_inf = 2 / (1 - b2) - 1 ;  rho_t = rho_inf - 2 t b2**t / (1 - b2**t)
    out = m_hat * r_t * sqrt(1 - b2**t) / (sqrt(v) + eps)   if rho_t > 5
    out = m_hat                                             otherwise
    r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
    ```

    ``optax.scale_by_radam`` differs in two places: it adds ``eps`` to the
    bias-corrected ``sqrt(v / (1 - b2**t))`` (torch adds it to ``sqrt(v)`` before
    the correction, i.e. an effective ``eps / sqrt(1 - b2**t)``), and it
    rectifies when ``rho_t >= threshold`` where torch needs ``rho_t > 5``. The
    step scalars (``1 - b**t``, ``rho_t``) are computed without cancellation (see
    :func:`_radam_rectification`), so float32 runs track torch's, which computes
    them in Python double. The state is optax's own :class:`optax.ScaleByAdamState`.

    Args:
      b1: the decay rate of the first moment estimate (the mean of the gradients).
      b2: the decay rate of the second moment estimate (the mean of their squares).
      eps: added to ``sqrt(v)`` before the bias correction.

    Returns:
      The transformation, an :class:`optax.GradientTransformation`; chain it with a learning rate
      (:func:`radam` does).

    Examples:
      >>> tx = scale_by_torch_radam()
      >>> g = {"w": jnp.array([0.5, -3.0])}
      >>> out, state = tx.update(g, tx.init(g))  # rho_t <= 5: bias-corrected momentum, g
      >>> np.round(out["w"], 4), int(state.count)
      (Array([ 0.5, -3. ], dtype=float32), 1)
    """

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        count = optax.safe_increment(state.count)
        t = _float_count(count)
        bc1 = _one_minus_power(b1, t)
        rectify, r_t = _radam_rectification(count, b2)
        root_bc2 = jnp.sqrt(_one_minus_power(b2, t))

        def scaled(m, v):
            m_hat = m / bc1
            adaptive = m_hat * r_t * root_bc2 / (jnp.sqrt(v) + eps)
            return jnp.where(rectify, adaptive, m_hat).astype(m.dtype)

        out = jax.tree.map(scaled, mu, nu)
        return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(_adam_state_init, update_fn)


def rmsprop(
    learning_rate: optax.ScalarOrSchedule,
    alpha: float = 0.99,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    centered: bool = False,
) -> optax.GradientTransformation:
    """RMSprop with the trajectory of ``torch.optim.RMSprop``.

    Per parameter (``v``, ``gbar`` and ``b`` start at zero):

    ```
    g = g + weight_decay * p                    (L2, coupled)
    v = alpha * v + (1 - alpha) * g**2
    gbar = alpha * gbar + (1 - alpha) * g       (only when centered)
    d = sqrt(v - gbar**2) + eps  if centered  else  sqrt(v) + eps
    b = momentum * b + g / d ;  p = p - lr_t * b    (momentum > 0)
    p = p - lr_t * g / d                            (momentum == 0)
    ```

    Built as ``add_decayed_weights -> scale_by_rms / scale_by_stddev
    (eps_in_sqrt=False) -> trace(momentum) -> scale_by_learning_rate``. Unlike
    ``optax.rmsprop``: ``eps`` is outside the root (optax's default is inside),
    the decay is called ``alpha`` and defaults to 0.99 (optax: ``decay=0.9``),
    there is an L2 ``weight_decay``, and the buffer holds unscaled steps that the
    current learning rate multiplies (optax scales by the learning rate before
    the trace, which differs once a schedule changes the rate).

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count.
      alpha: the decay of the running mean of squared gradients, in ``[0, 1]``.
      eps: added to the root (outside it).
      weight_decay: the L2 coefficient added to the gradient as ``weight_decay * p``.
      momentum: the momentum factor; 0 keeps no buffer.
      centered: divide by the root of the variance estimate ``v - gbar**2``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: a negative ``learning_rate``/``alpha``/``eps``/``weight_decay``/
        ``momentum`` (PyTorch's checks).

    Examples:
      >>> opt = rmsprop(0.01)
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> updates, _ = opt.update({"w": jnp.array([0.5, -3.0])}, opt.init(params), params)
      >>> np.round(optax.apply_updates(params, updates)["w"], 4)  # g / sqrt(0.01 g**2) = 10 sign(g)
      Array([0.9, 2.1], dtype=float32)
    """
    # alpha > 1 makes (1 - alpha) * g**2 negative and the square root NaN (torch only
    # checks alpha >= 0 and fails two steps later with a non-finite loss).
    _check_recipe(
        "rmsprop",
        learning_rate,
        nonnegative=dict(eps=eps, weight_decay=weight_decay, momentum=momentum),
        at_most_one=dict(alpha=alpha),
    )
    scale = optax.scale_by_stddev if centered else optax.scale_by_rms
    parts = _coupled_weight_decay(weight_decay)
    parts.append(scale(decay=alpha, eps=eps, initial_scale=0.0, eps_in_sqrt=False))
    if not _is_static_zero(momentum):
        parts.append(optax.trace(decay=momentum))  # trace(0) is the identity, as torch's momentum=0
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def adagrad(
    learning_rate: optax.ScalarOrSchedule,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    initial_accumulator_value: float = 0.0,
    eps: float = 1e-10,
) -> optax.GradientTransformation:
    """Adagrad with the trajectory of ``torch.optim.Adagrad``.

    Per parameter at update ``t = 1, 2, ...`` (``s`` starts at
    ``initial_accumulator_value``):

    ```
    g = g + weight_decay * p                    (L2, coupled)
    clr = lr_t / (1 + (t - 1) * lr_decay)
    s = s + g**2
    p = p - clr * g / (sqrt(s) + eps)
    ```

    A schedule gives ``lr_t`` (as a torch LR scheduler changes ``lr``) and
    ``lr_decay`` still divides it. Unlike ``optax.adagrad``: ``eps`` is outside
    the root and defaults to 1e-10 (optax: inside, 1e-7), the accumulator starts
    at 0 (optax: 0.1), and there are ``lr_decay`` and ``weight_decay``. See
    :func:`scale_by_torch_adagrad`.

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count.
      lr_decay: divides the learning rate by ``1 + (t - 1) * lr_decay``.
      weight_decay: the L2 coefficient added to the gradient as ``weight_decay * p``.
      initial_accumulator_value: the starting value of the sum of squares ``s``.
      eps: added to ``sqrt(s)``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: a negative ``learning_rate``/``lr_decay``/``weight_decay``/
        ``initial_accumulator_value``/``eps`` (PyTorch's checks).

    Examples:
      >>> opt = adagrad(0.1)
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> updates, _ = opt.update({"w": jnp.array([0.5, -3.0])}, opt.init(params), params)
      >>> np.round(optax.apply_updates(params, updates)["w"], 4)  # first step: lr * sign(g)
      Array([0.9, 2.1], dtype=float32)
    """
    _check_recipe(
        "adagrad",
        learning_rate,
        nonnegative=dict(
            lr_decay=lr_decay, weight_decay=weight_decay, initial_accumulator_value=initial_accumulator_value, eps=eps
        ),
    )
    parts = _coupled_weight_decay(weight_decay)
    parts.append(scale_by_torch_adagrad(initial_accumulator_value, eps))
    if not _is_static_zero(lr_decay):
        parts.append(optax.scale_by_schedule(lambda count: 1.0 / (1.0 + _float_count(count) * lr_decay)))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    mask: Optional[PyTree | Callable[[PyTree], PyTree]] = None,
) -> optax.GradientTransformation:
    """AdamW with the trajectory of ``torch.optim.AdamW`` (decoupled weight decay).

    Per parameter at update ``t = 1, 2, ...``:

    ```
    p = p - lr_t * weight_decay * p             (decoupled, before the Adam step)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g**2
    p = p - lr_t / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)
    ```

    The Adam step does not read ``p``, so decaying first (torch) equals adding
    ``weight_decay * p`` to the Adam direction before the learning rate, which
    is the chain ``scale_by_torch_adam -> add_decayed_weights -> scale_by_learning_rate``
    (``optax.adamw``'s, with :func:`scale_by_torch_adam`'s bias corrections that
    stay accurate in float32). The other difference from ``optax.adamw`` is the
    default ``weight_decay``: 0.01 here and in torch, 1e-4 in optax.

    ``mask`` (a bool pytree like the params, or a function of the params returning
    one) limits the decay to the True leaves, as two torch param groups, one with
    ``weight_decay=0``, do. nanoGPT decays only parameters of 2 or more dimensions:
    ``mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)``.

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count.
      b1: the decay rate of the first moment estimate (the mean of the gradients).
      b2: the decay rate of the second moment estimate (the mean of their squares).
      eps: added to the bias-corrected ``sqrt(v)``.
      weight_decay: the decoupled decay: each step multiplies ``p`` by
        ``1 - lr_t * weight_decay``.
      mask: which leaves decay (a bool pytree or a function of the params); None: all.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: negative ``learning_rate``/``eps``/``weight_decay`` or betas
        outside ``[0, 1)`` (PyTorch's checks).

    Examples:
      >>> opt = adamw(0.1, weight_decay=0.5)
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> grads = {"w": jnp.zeros(2)}  # no gradient: only the decay, p * (1 - 0.1 * 0.5)
      >>> updates, _ = opt.update(grads, opt.init(params), params)
      >>> np.round(optax.apply_updates(params, updates)["w"], 4)
      Array([0.95, 1.9 ], dtype=float32)
    """
    _check_recipe(
        "adamw", learning_rate, nonnegative=dict(eps=eps, weight_decay=weight_decay), below_one=dict(b1=b1, b2=b2)
    )
    parts = [scale_by_torch_adam(b1, b2, eps)]
    if not _is_static_zero(weight_decay):
        parts.append(optax.add_decayed_weights(weight_decay, mask=mask))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def radam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
    """RAdam with the trajectory of ``torch.optim.RAdam`` (coupled weight decay).

    Per parameter at update ``t``: ``g = g + weight_decay * p`` (L2, torch's
    default ``decoupled_weight_decay=False``), then ``p = p - lr_t * u`` with
    ``u`` from :func:`scale_by_torch_radam` (rectified Adam when ``rho_t > 5``,
    bias-corrected momentum ``m / (1 - b1**t)`` before that).

    Unlike ``optax.radam``: ``eps`` is added to ``sqrt(v)`` before the bias
    correction, the rectification test is strict (``rho_t > 5``), and there is a
    ``weight_decay``.

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count.
      b1: the decay rate of the first moment estimate (the mean of the gradients).
      b2: the decay rate of the second moment estimate (the mean of their squares).
      eps: added to ``sqrt(v)`` before the bias correction.
      weight_decay: the L2 coefficient added to the gradient as ``weight_decay * p``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: negative ``learning_rate``/``eps``/``weight_decay`` or betas
        outside ``[0, 1)`` (PyTorch's checks).

    Examples:
      >>> opt = radam(0.1)
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> updates, _ = opt.update({"w": jnp.array([0.5, -3.0])}, opt.init(params), params)
      >>> np.round(optax.apply_updates(params, updates)["w"], 4)  # first steps: p - lr * g
      Array([0.95, 2.3 ], dtype=float32)
    """
    _check_recipe(
        "radam", learning_rate, nonnegative=dict(eps=eps, weight_decay=weight_decay), below_one=dict(b1=b1, b2=b2)
    )
    parts = _coupled_weight_decay(weight_decay)
    parts.append(scale_by_torch_radam(b1, b2, eps))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def adadelta(
    learning_rate: optax.ScalarOrSchedule = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0.0
) -> optax.GradientTransformation:
    """Adadelta with the trajectory of ``torch.optim.Adadelta``.

    Per parameter (``v`` and ``u`` start at zero):

    ```
    g = g + weight_decay * p                    (L2, coupled)
    v = rho * v + (1 - rho) * g**2
    d = sqrt(u + eps) / sqrt(v + eps) * g
    u = rho * u + (1 - rho) * d**2
    p = p - lr_t * d
    ```

    ``optax.scale_by_adadelta`` is this formula (``u`` accumulates the step
    before the learning rate, as in torch), so the recipe is
    ``add_decayed_weights -> scale_by_adadelta -> scale_by_learning_rate``, the
    same chain as ``optax.adadelta``; only the default ``learning_rate`` differs
    (1.0 here and in torch, required in optax).

    Freezing: ``weight_decay`` moves every parameter the optimizer sees, also one
    whose gradient is zero (``jax.lax.stop_gradient``, a detached branch). To
    freeze parameters, wrap the optimizer: ``funcnet.freeze(opt, mask)`` (PyTorch's
    ``requires_grad=False``; see :mod:`funcnet.params`).

    Args:
      learning_rate: a number or an optax schedule of the update count (torch's
        default 1.0).
      rho: the decay of both running means, in ``[0, 1]``.
      eps: added inside both roots.
      weight_decay: the L2 coefficient added to the gradient as ``weight_decay * p``.

    Returns:
      The transformation, an :class:`optax.GradientTransformation` (an ``optax.chain``).

    Raises:
      ValueError: a negative ``learning_rate``/``eps``/``weight_decay`` or
        ``rho`` outside ``[0, 1]`` (PyTorch's checks).

    Examples:
      >>> opt = adadelta()
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> updates, _ = opt.update({"w": jnp.ones(2)}, opt.init(params), params)
      >>> np.round(updates["w"], 4)  # -sqrt(eps) / sqrt(0.1 + eps): small first steps
      Array([-0.0032, -0.0032], dtype=float32)
    """
    _check_recipe(
        "adadelta", learning_rate, nonnegative=dict(eps=eps, weight_decay=weight_decay), at_most_one=dict(rho=rho)
    )
    parts = _coupled_weight_decay(weight_decay)
    parts.append(optax.scale_by_adadelta(rho=rho, eps=eps))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)
