"""Regression losses: squared, absolute, Huber and smooth-L1 errors, and the Poisson and
Gaussian negative log-likelihoods."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet.losses._args import _array, _check_number, _concrete, _float_array, _real_array, _same_shape
from funcnet.losses._reduction import _check_reduction, _reduce

__all__ = ["mse", "mae", "huber", "smooth_l1", "poisson_nll_loss", "gaussian_nll_loss"]


def _regression_args(fn, predictions, targets, reduction):
    predictions = _float_array(fn, predictions, "predictions")
    targets = _array(fn, targets, "targets")
    if not (jnp.issubdtype(targets.dtype, jnp.floating) or jnp.issubdtype(targets.dtype, jnp.integer)):
        raise TypeError(f"{fn}: targets must be real numbers, got dtype {targets.dtype}.")
    _same_shape(fn, predictions, targets, "predictions", "targets")
    _check_reduction(fn, reduction)
    return predictions, targets.astype(predictions.dtype)


def mse(predictions: ArrayLike, targets: ArrayLike, *, reduction: str = "mean") -> jax.Array:
    r"""Squared error :math:`(x - y)^2`, matching ``torch.nn.functional.mse_loss``.

    Unlike torch, shapes must be equal (no silent broadcasting). ``reduction="sum_mean"``
    is tinynn's MSE, :math:`\frac1N\sum_n\sum_i (x_{n,i} - y_{n,i})^2` for a batch of
    ``N`` (axis 0).

    Args:
      predictions: float predictions.
      targets: real targets of ``predictions``' shape.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``predictions``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``predictions`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction``, or ``targets`` not of ``predictions``' shape.

    Examples:
      >>> x, y = jnp.array([[1.0, 2.0], [0.0, 0.0]]), jnp.array([[0.0, 0.0], [0.0, 1.0]])
      >>> float(mse(x, y))  # (1 + 4 + 0 + 1) / 4 elements
      1.5
      >>> float(mse(x, y, reduction="sum_mean"))  # (1 + 4 + 0 + 1) / 2 examples
      3.0
    """
    fn = "funcnet.losses.mse"
    predictions, targets = _regression_args(fn, predictions, targets, reduction)
    return _reduce(fn, optax.losses.squared_error(predictions, targets), reduction)


def mae(predictions: ArrayLike, targets: ArrayLike, *, reduction: str = "mean") -> jax.Array:
    r"""Absolute error :math:`|x - y|`, matching ``torch.nn.functional.l1_loss``.

    Args:
      predictions: float predictions.
      targets: real targets of ``predictions``' shape.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``predictions``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``predictions`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction``, or ``targets`` not of ``predictions``' shape.

    Examples:
      >>> x, y = jnp.array([[1.0, 2.0], [0.0, 0.0]]), jnp.array([[0.0, 0.0], [0.0, 1.0]])
      >>> float(mae(x, y)), float(mae(x, y, reduction="sum"))
      (1.0, 4.0)
    """
    fn = "funcnet.losses.mae"
    predictions, targets = _regression_args(fn, predictions, targets, reduction)
    return _reduce(fn, jnp.abs(predictions - targets), reduction)


def huber(predictions: ArrayLike, targets: ArrayLike, *, delta: float = 1.0, reduction: str = "mean") -> jax.Array:
    r"""Huber loss, matching ``torch.nn.functional.huber_loss``.

    .. math:

    ```
    l = \begin{cases} \tfrac12 (x-y)^2 & |x-y| < \delta \\
                      \delta\,(|x-y| - \tfrac12\delta) & \text{otherwise} \end{cases}
    ```

    Args:
      predictions: float predictions.
      targets: real targets of ``predictions``' shape.
      delta: the threshold between the quadratic and linear parts, > 0.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``predictions``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``predictions`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction`` or ``delta``, or ``targets`` not of ``predictions``' shape.

    Examples:
      >>> print(huber(jnp.array([0.5, 3.0]), jnp.array([0.0, 0.0]), reduction="none"))
      [0.125 2.5  ]
    """
    fn = "funcnet.losses.huber"
    predictions, targets = _regression_args(fn, predictions, targets, reduction)
    delta = _check_number(fn, "delta", delta, low=0.0, low_open=True)
    return _reduce(fn, optax.losses.huber_loss(predictions, targets, delta=delta), reduction)


def smooth_l1(data: ArrayLike, *, scalar: float = 1.0, reduction: str = "none") -> jax.Array:
    r"""MXNet's elementwise ``smooth_l1``, with :math:`\sigma` = ``scalar``:

    .. math:

    ```
    f(x) = \begin{cases} \tfrac12 (\sigma x)^2 & |x| < 1/\sigma^2 \\
                         |x| - \tfrac{1}{2\sigma^2} & \text{otherwise} \end{cases}
    ```

    With ``scalar=1`` this is :func:`huber` with ``delta=1`` applied to ``data``. The
    default ``reduction="none"`` is MXNet's (the elementwise values); the other
    reductions are the module's, e.g. ``"sum_mean"`` for a per-example sum.

    Args:
      data: float input, e.g. a difference of predictions and targets.
      scalar: :math:`\sigma`, > 0.
      reduction: ``"none"`` (default), ``"mean"``, ``"sum"`` or ``"sum_mean"``.

    Returns:
      ``data``'s shape with ``reduction="none"``, else a scalar; float32 or wider.

    Raises:
      TypeError: ``data`` not floating.
      ValueError: a bad ``reduction`` or ``scalar``.

    Examples:
      >>> print(smooth_l1(jnp.array([-2.0, 0.5, 0.0])))  # |x| - 1/2, then x**2 / 2
      [1.5   0.125 0.   ]
    """
    fn = "funcnet.losses.smooth_l1"
    data = _float_array(fn, data, "data")
    _check_reduction(fn, reduction)
    scalar = _check_number(fn, "scalar", scalar, low=0.0, low_open=True)
    s2 = scalar * scalar
    loss = jnp.where(jnp.abs(data) < 1.0 / s2, 0.5 * s2 * data * data, jnp.abs(data) - 0.5 / s2)
    return _reduce(fn, loss, reduction)


def poisson_nll_loss(
    inputs: ArrayLike,
    targets: ArrayLike,
    *,
    log_input: bool = True,
    full: bool = False,
    eps: float = 1e-8,
    reduction: str = "mean",
) -> jax.Array:
    r"""Poisson negative log-likelihood, as ``torch.nn.functional.poisson_nll_loss``.

    .. math:

    ```
    l = e^{x} - y x \quad (\texttt{log\_input=True}), \qquad
    l = x - y \log(x + \text{eps}) \quad (\texttt{log\_input=False})
    ```

    ``full=True`` adds Stirling's approximation of :math:`\log y!`,
    :math:`y \log y - y + \tfrac12 \log(2\pi y)`, for targets :math:`y > 1` (0 for the
    others), as torch does.

    Args:
      inputs: float log-rates (rates with ``log_input=False``).
      targets: real counts of ``inputs``' shape.
      log_input: whether ``inputs`` are log-rates.
      full: add the Stirling term.
      eps: keeps ``log(x + eps)`` finite with ``log_input=False``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``inputs``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction``, ``log_input``, ``full`` or ``eps``, or ``targets``
        not of ``inputs``' shape.

    Examples:
      >>> # e**x - y*x: 1 - 0 and e - 2
      >>> print(jnp.round(poisson_nll_loss(jnp.array([0.0, 1.0]), jnp.array([1.0, 2.0]),
      ...                                  reduction="none"), 4))
      [1.     0.7183]
    """
    fn = "funcnet.losses.poisson_nll_loss"
    inputs = _float_array(fn, inputs, "inputs")
    targets = _real_array(fn, targets, "targets", inputs.dtype)
    _same_shape(fn, inputs, targets, "inputs", "targets")
    _check_reduction(fn, reduction)
    log_input = checks.flag(fn, "log_input", log_input)
    full = checks.flag(fn, "full", full)
    eps = checks.real(fn, "eps", eps, low=0.0)
    if log_input:
        loss = jnp.exp(inputs) - targets * inputs
    else:
        loss = inputs - targets * jnp.log(inputs + eps)
    if full:
        safe = jnp.where(targets > 1, targets, 1.0)
        stirling = safe * jnp.log(safe) - safe + 0.5 * jnp.log(2 * np.pi * safe)
        loss = loss + jnp.where(targets > 1, stirling, 0.0)
    return _reduce(fn, loss, reduction)


def gaussian_nll_loss(
    inputs: ArrayLike,
    targets: ArrayLike,
    var: ArrayLike,
    *,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> jax.Array:
    r"""Gaussian negative log-likelihood, as ``torch.nn.functional.gaussian_nll_loss``.

    .. math:

    ```
    l = \tfrac12\Big(\log \max(\sigma^2, \text{eps}) + \frac{(x - y)^2}{\max(\sigma^2,
        \text{eps})}\Big) \;(+\, \tfrac12 \log 2\pi \text{ with full=True})
    ```

    The clamp at ``eps`` is torch's: it changes the value but not the gradient's path
    (``var``'s gradient is taken at the clamped value, as if unclamped). ``var`` has
    ``inputs``' shape (heteroscedastic), or ``inputs``' shape without its last axis, or
    that shape with exactly one axis of size 1 where ``inputs`` has another size
    (homoscedastic), or is a number -- torch's rules. A negative concrete ``var`` raises
    ValueError, as in torch. ``targets`` have ``inputs``' shape.

    Args:
      inputs: float predicted means.
      targets: real targets of ``inputs``' shape.
      var: float predicted variances (shapes above), or a number.
      full: add the constant :math:`\tfrac12 \log 2\pi`.
      eps: the clamp of ``var``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``inputs``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` or ``var`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction``, ``full`` or ``eps``, mismatched shapes, a ``var``
        shape torch does not accept, or a negative concrete ``var``.

    Examples:
      >>> x, y = jnp.array([0.0, 1.0]), jnp.array([1.0, 1.0])
      >>> print(gaussian_nll_loss(x, y, 1.0, reduction="none"))  # (log 1 + (x - y)**2) / 2
      [0.5 0. ]
      >>> round(float(gaussian_nll_loss(x, y, 1.0, full=True)), 4)  # + log(2 pi) / 2
      1.1689
    """
    fn = "funcnet.losses.gaussian_nll_loss"
    inputs = _float_array(fn, inputs, "inputs")
    targets = _real_array(fn, targets, "targets", inputs.dtype)
    _same_shape(fn, inputs, targets, "inputs", "targets")
    _check_reduction(fn, reduction)
    full = checks.flag(fn, "full", full)
    eps = checks.real(fn, "eps", eps, low=0.0)
    if isinstance(var, numbers.Real) and not isinstance(var, bool):
        var = jnp.full(inputs.shape, var, inputs.dtype)
    var = _float_array(fn, var, "var")
    values = _concrete(var)
    if values is not None and (values < 0).any():
        raise ValueError(
            f"{fn}: var has negative entry/entries (found {values.min()}); it "
            f"is a variance. Pass e.g. jax.nn.softplus(raw) or exp(log_var)."
        )
    if var.shape != inputs.shape:
        if var.shape == inputs.shape[:-1]:
            var = var[..., None]
        elif not (var.ndim == inputs.ndim and sum(v for i, v in zip(inputs.shape, var.shape) if i != v) == 1):
            raise ValueError(
                f"{fn}: var is of incorrect size: shape {var.shape} for inputs of shape "
                f"{inputs.shape}. Give inputs' shape (one variance per element), inputs' "
                f"shape without the last axis {inputs.shape[:-1]}, or inputs' shape with one "
                f"axis set to 1 (one variance shared along it)."
            )
    var = var.astype(inputs.dtype)
    var = var + lax.stop_gradient(jnp.maximum(var, eps) - var)
    loss = 0.5 * (jnp.log(var) + jnp.square(inputs - targets) / var)
    if full:
        loss = loss + 0.5 * np.log(2 * np.pi)
    return _reduce(fn, loss, reduction)
