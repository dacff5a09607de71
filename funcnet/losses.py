"""Loss functions: small pure functions of arrays, usable under ``jit``, ``grad`` and ``pmap``.

Conventions
-----------
* **Classes are on the last axis** (``axis=-1``), the JAX / channels-last layout:
  logits of shape ``(N, C)`` or ``(N, d1, ..., C)`` with integer labels of shape
  ``(N,)`` / ``(N, d1, ...)``. PyTorch puts the classes on axis 1 (``(N, C, d1, ...)``);
  pass ``axis=1`` to use that layout unchanged. Every other semantic of
  :func:`cross_entropy` and :func:`nll_loss` is PyTorch's.
* ``reduction`` is ``"mean"`` (default), ``"sum"``, ``"sum_mean"`` or ``"none"`` (the
  per-element loss). ``"sum_mean"`` sums each example's loss over its non-batch axes and
  averages over the batch (axis 0 of the per-element loss, ``N`` examples):
  ``(1/N) * sum_n sum_i l[n, i]``. That is tinynn's MSE (sum over features
  divided by the batch size) and the per-example sum a VAE's ELBO needs. A scalar
  per-element loss has no batch axis and is rejected for ``"sum_mean"``.
* Bad inputs fail early: a wrong dtype raises ``TypeError`` and a wrong shape or rank
  ``ValueError``, at trace time. Integer labels that are concrete (not traced, i.e.
  outside ``jit``) are checked too: a class id outside ``[0, C)`` that is not
  ``ignore_index`` raises ``ValueError``.
* **Out-of-range labels under jit.** Their values cannot be checked while tracing, so
  they have a defined, loud result instead: such an element's loss is **NaN**, which
  makes a ``"mean"``/``"sum"`` NaN too (and its gradients). Negative ids are never
  wrapped around NumPy-style, and nothing is read out of bounds.

* **Precision.** bfloat16/float16 inputs are upcast to float32 inside every loss, and
  the result is float32 (float64 stays float64): a log-softmax or a mean over a batch
  in bfloat16 loses most of its digits. Gradients flow back to the inputs in their own
  dtype. There is no opt-out, on purpose: the cast fuses into the loss's elementwise
  work, and a half-precision loss value is never what training wants; cast the result
  if a lower-precision value is needed. :func:`center_loss` keeps its centers' dtype.

Center loss keeps its class centers as explicit state: :func:`center_loss_init` makes
them and :func:`center_loss` returns ``(loss, new_centers)``.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh

__all__ = [
    "cross_entropy", "nll_loss", "sigmoid_binary_cross_entropy", "mse", "mae", "huber",
    "hinge", "multiclass_hinge", "smooth_l1", "center_loss_init", "center_loss",
    "binary_cross_entropy", "kl_div", "cosine_embedding_loss", "margin_ranking_loss",
    "triplet_margin_loss", "poisson_nll_loss", "gaussian_nll_loss", "ctc_loss",
]

_REDUCTIONS = ("mean", "sum", "sum_mean", "none")


# --------------------------------------------------------------------------- #
# Argument checks. They look only at static shapes and dtypes (free under jit),
# plus label values when those are concrete.
# --------------------------------------------------------------------------- #

def _array(fn: str, x, what: str):
    if x is None or isinstance(x, (str, bytes, dict, set)):
        raise TypeError(f"{fn}: {what} must be an array, got {type(x).__name__}.")
    try:
        return jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"{fn}: {what} must be an array, got {type(x).__name__}: {e}") from None


def _float_array(fn: str, x, what: str, upcast: bool = True):
    x = _array(fn, x, what)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{fn}: {what} must have a floating dtype, got {x.dtype}. "
                        f"Cast it, e.g. {what}.astype(jnp.float32).")
    return _at_least_f32(x) if upcast else x


def _at_least_f32(x):
    """Half-precision losses are computed in float32 (see "Precision" in the module doc)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _int_labels(fn: str, labels, what: str = "labels", like=None, like_what: str = "inputs"):
    """Integer class ids. ``like`` (the scores) tells one-hot targets from ids in the
    wrong dtype: a cast would be the wrong advice for those."""
    labels = _array(fn, labels, what)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        if like is not None and labels.ndim >= 1 and labels.shape == jnp.shape(like):
            raise TypeError(f"{fn}: {what} must be integer class ids, got dtype {labels.dtype} "
                            f"of the {like_what}' shape {labels.shape}: one-hot or probability "
                            f"targets? Pass the class ids, {what}.argmax(-1) (the class axis), "
                            f"or use cross_entropy, which takes float targets.")
        raise TypeError(f"{fn}: {what} must be integer class ids, got dtype {labels.dtype}. "
                        f"Cast them, e.g. {what}.astype(jnp.int32).")
    return labels


def _check_reduction(fn: str, reduction) -> None:
    if reduction not in _REDUCTIONS:
        valid = ", ".join(repr(r) for r in _REDUCTIONS)
        raise ValueError(f"{fn}: reduction must be one of {valid}, got {reduction!r}.")


def _reduce(fn: str, loss, reduction):
    """The per-element ``loss`` reduced as the module docstring says."""
    if reduction == "mean":
        return jnp.mean(loss)
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "sum_mean":
        if loss.ndim == 0:
            raise ValueError(f"{fn}: reduction='sum_mean' averages over the batch axis (axis 0) "
                             f"but the per-element loss is a scalar. Give the inputs a leading "
                             f"batch axis, or use reduction='sum'.")
        return jnp.mean(jnp.sum(loss, axis=tuple(range(1, loss.ndim))), axis=0)
    return loss


def _same_shape(fn: str, a, b, what_a: str, what_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{fn}: {what_b} must have the shape of {what_a} {a.shape}, got "
                         f"{b.shape}. funcnet does not broadcast losses implicitly.")


_concrete = checks.concrete  # the value when known now, None while traced


def _check_label_range(fn: str, labels, num_classes: int, ignore_index=None) -> None:
    """ValueError for concrete class ids outside ``[0, num_classes)`` (except ignore_index)."""
    values = _concrete(labels)
    if values is None or values.size == 0:
        return
    bad = (values < 0) | (values >= num_classes)
    if ignore_index is not None:
        bad &= values != ignore_index
    if bad.any():
        found = np.unique(values[bad])[:8].tolist()
        skip = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
        raise ValueError(f"{fn}: labels must be class ids in [0, {num_classes}){skip}, found "
                         f"{found}. Check num_classes or the class axis.")


def _check_number(fn: str, what: str, value, **bounds):
    """``checks.real``, but a 0-d array is read when concrete and trusted when traced."""
    if isinstance(value, (jax.Array, np.ndarray)) and value.ndim == 0:
        concrete = _concrete(value)
        if concrete is None:
            return value  # traced scalar: cannot range-check, trust the caller
        value = concrete.item()
    return checks.real(fn, what, value, **bounds)


def _is_zero(value) -> bool:
    """True for a static zero; a traced value counts as non-zero (the general path)."""
    return isinstance(value, numbers.Real) and value == 0


def _class_weight(fn: str, weight, num_classes: int, dtype):
    if weight is None:
        return None
    weight = _float_array(fn, weight, "weight")
    if weight.shape != (num_classes,):
        raise ValueError(f"{fn}: weight must hold one value per class, shape ({num_classes},), "
                         f"got {weight.shape}.")
    return weight.astype(dtype)


def _class_axis(fn: str, logits, axis) -> int:
    if logits.ndim == 0:
        raise ValueError(f"{fn}: logits must have a class axis, got a scalar.")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) \
            or not -logits.ndim <= axis < logits.ndim:
        raise ValueError(f"{fn}: axis {axis!r} is out of range for logits of shape "
                         f"{logits.shape}.")
    return int(axis) % logits.ndim


def _check_index_labels(fn: str, logits, labels, axis: int, *, has_axis: bool = True) -> None:
    expected = logits.shape[:axis] + logits.shape[axis + 1:]
    if labels.shape != expected:
        hint = ""
        if labels.shape == logits.shape:
            hint = " If these are one-hot or probability targets, pass them as floats."
        elif (axis == logits.ndim - 1 and logits.ndim >= 3
              and labels.shape == logits.shape[:1] + logits.shape[2:]):
            fix = ("pass axis=1" if has_axis else
                   "move the classes last, jnp.moveaxis(scores, 1, -1)")
            hint = (f" The shapes fit classes on axis 1 (PyTorch's (N, C, d1, ...) layout): "
                    f"{fix}.")
        raise ValueError(f"{fn}: integer labels must have the logits' shape {logits.shape} "
                         f"without the class axis {axis}, i.e. {expected}, got {labels.shape}."
                         f"{hint}")


# --------------------------------------------------------------------------- #
# Classification.
# --------------------------------------------------------------------------- #

def _nll_from_log_probs(fn, log_probs, labels, weight, ignore_index, reduction, label_smoothing):
    """torch's nll_loss (plus cross_entropy's smoothing term), classes on the last axis.

    Per element n with target y_n (w = weight, ε = label_smoothing, C classes)::

        l_n = valid_n * ((1 - ε) * (-w[y_n] log p_n[y_n]) + ε/C * Σ_c (-w[c] log p_n[c]))

    ``"mean"`` divides Σ l_n by Σ_n valid_n * w[y_n], as torch does for both terms.
    """
    num_classes = log_probs.shape[-1]
    dtype = log_probs.dtype
    valid = labels != ignore_index
    in_range = (labels >= 0) & (labels < num_classes)
    safe = jnp.where(in_range, labels, 0)
    picked = jnp.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]
    w_y = jnp.ones(labels.shape, dtype) if weight is None else _mesh.gather(weight, safe)
    # NaN marks a class id that is neither a class nor ignore_index (see module doc).
    w_y = jnp.where(valid, jnp.where(in_range, w_y, jnp.nan), 0.0).astype(dtype)
    loss = jnp.where(valid, -w_y * picked, 0.0)
    if not _is_zero(label_smoothing):
        weighted = log_probs if weight is None else log_probs * weight
        smooth = jnp.where(valid, -jnp.sum(weighted, axis=-1), 0.0)
        smooth = jnp.where(in_range | ~valid, smooth, jnp.nan)
        loss = (1.0 - label_smoothing) * loss + (label_smoothing / num_classes) * smooth
    if reduction == "mean":
        return jnp.sum(loss) / jnp.sum(w_y)
    return _reduce(fn, loss, reduction)


def nll_loss(inputs, labels, *, weight=None, ignore_index: int = -100, reduction: str = "mean",
             axis: int = -1):
    r"""Negative log-likelihood of integer labels under log-probabilities.

    Matches ``torch.nn.functional.nll_loss`` except that classes are on ``axis=-1`` by
    default (pass ``axis=1`` for torch's ``(N, C, d1, ...)`` layout). ``inputs`` are
    log-probabilities (e.g. ``jax.nn.log_softmax`` output); no log is taken here.

    .. math::
        l_n = -w_{y_n}\, x_{n, y_n} \cdot [y_n \ne \text{ignore\_index}], \qquad
        \text{mean} = \frac{\sum_n l_n}{\sum_n w_{y_n} [y_n \ne \text{ignore\_index}]}

    so a weighted mean divides by the summed weights of the non-ignored targets (NaN
    when every target is ignored, as in torch). ``"sum_mean"`` is not weight-normalised:
    :math:`\frac1N \sum_n \sum_i l_{n,i}` over the ``N`` rows of ``labels``' axis 0.

    Args:
      inputs: float log-probabilities ``(..., C, ...)`` with the classes on ``axis``.
      labels: integer class ids, ``inputs``' shape without ``axis``.
      weight: optional per-class rescaling weights, shape ``(C,)``.
      ignore_index: targets with this value contribute neither loss nor weight.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.
      axis: the class axis of ``inputs``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``labels``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating, or ``labels`` not integer.
      ValueError: a bad ``reduction``, ``axis`` or ``weight`` shape, ``labels`` not of
        ``inputs``' shape without ``axis``, or concrete labels outside ``[0, C)`` that
        are not ``ignore_index``.

    Examples:
      >>> log_probs = jnp.log(jnp.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]))
      >>> labels = jnp.array([0, -100])  # the second target is ignored
      >>> print(jnp.round(nll_loss(log_probs, labels, reduction="none"), 4))
      [0.6931 0.    ]
      >>> round(float(nll_loss(log_probs, labels)), 4)  # mean over the one kept target
      0.6931
    """
    fn = "funcnet.losses.nll_loss"
    inputs = _float_array(fn, inputs, "inputs")
    labels = _int_labels(fn, labels, like=inputs)
    _check_reduction(fn, reduction)
    axis = _class_axis(fn, inputs, axis)
    _check_index_labels(fn, inputs, labels, axis)
    num_classes = inputs.shape[axis]
    weight = _class_weight(fn, weight, num_classes, inputs.dtype)
    _check_label_range(fn, labels, num_classes, ignore_index)
    log_probs = jnp.moveaxis(inputs, axis, -1)
    return _nll_from_log_probs(fn, log_probs, labels, weight, ignore_index, reduction, 0.0)


def cross_entropy(logits, labels, *, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, axis: int = -1):
    r"""Softmax cross-entropy, matching ``torch.nn.functional.cross_entropy``.

    The one difference from torch is the class axis: ``axis=-1`` by default
    (channels-last), ``axis=1`` gives torch's ``(N, C, d1, ...)`` layout.

    **Integer labels** (class ids, ``logits``' shape without ``axis``), with
    :math:`\log p = \text{log\_softmax}(x)`, :math:`\varepsilon` = ``label_smoothing``:

    .. math::
        l_n = [y_n \ne \text{ignore}]\Big((1-\varepsilon)(-w_{y_n}\log p_{n,y_n})
              + \frac{\varepsilon}{C}\sum_c -w_c \log p_{n,c}\Big)

    and ``"mean"`` is :math:`\sum_n l_n / \sum_n w_{y_n}[y_n \ne \text{ignore}]` — torch
    divides the smoothing term by the same target-weight sum. ``"sum_mean"`` divides the
    sum by the batch size (``labels``' axis 0), not by weights.

    **Float labels** (probabilities or one-hot, ``logits``' shape): targets are first
    smoothed, :math:`t \leftarrow (1-\varepsilon)t + \varepsilon/C`, then
    :math:`l_n = -\sum_c w_c t_{n,c} \log p_{n,c}`; ``"mean"`` divides by the number
    of elements ``l_n`` (not by weights). ``ignore_index`` is not supported there:
    as in torch it must be negative (the default).

    Args:
      logits: float unnormalised scores with the classes on ``axis``.
      labels: integer class ids, or float targets of ``logits``' shape.
      weight: optional per-class weights, shape ``(C,)``.
      ignore_index: integer targets equal to this are skipped (no loss, no weight).
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.
      label_smoothing: :math:`\varepsilon \in [0, 1]`.
      axis: the class axis of ``logits``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; with ``reduction="none"`` the
      per-element loss, ``logits``' shape without ``axis``.

    Raises:
      TypeError: ``logits`` not floating, or ``labels`` neither integer nor floating.
      ValueError: a bad ``reduction``, ``axis``, ``label_smoothing`` or ``weight`` shape;
        labels of the wrong shape; concrete class ids outside ``[0, C)`` that are not
        ``ignore_index``; a non-negative ``ignore_index`` with float labels.

    Examples:
      >>> logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
      >>> round(float(cross_entropy(logits, jnp.array([0, 2]))), 4)
      0.6691
      >>> # one-hot float targets give the same loss as the class ids
      >>> round(float(cross_entropy(logits, jax.nn.one_hot(jnp.array([0, 2]), 3))), 4)
      0.6691
      >>> # torch's class-first layout, and an ignored target
      >>> round(float(cross_entropy(logits.T, jnp.array([0, 2]), axis=0)), 4)
      0.6691
      >>> print(jnp.round(cross_entropy(logits, jnp.array([0, -100]), reduction="none"), 4))
      [0.2395 0.    ]
    """
    fn = "funcnet.losses.cross_entropy"
    logits = _float_array(fn, logits, "logits")
    labels = _array(fn, labels, "labels")
    _check_reduction(fn, reduction)
    axis = _class_axis(fn, logits, axis)
    label_smoothing = _check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    num_classes = logits.shape[axis]
    weight = _class_weight(fn, weight, num_classes, logits.dtype)

    if jnp.issubdtype(labels.dtype, jnp.floating):
        if labels.shape != logits.shape:
            raise ValueError(f"{fn}: float labels are probability targets and must have the "
                             f"logits' shape {logits.shape}, got {labels.shape}. For class ids "
                             f"use an integer dtype.")
        if ignore_index >= 0:
            raise ValueError(f"{fn}: ignore_index is not supported for probability (float) "
                             f"labels, as in torch; got ignore_index={ignore_index}. Leave it "
                             f"at the default or give the ignored rows zero targets.")
        targets = labels.astype(logits.dtype)
        if not _is_zero(label_smoothing):
            targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
        if weight is not None:
            shape = [1] * logits.ndim
            shape[axis] = num_classes
            targets = targets * weight.reshape(shape)
        loss = optax.losses.softmax_cross_entropy(logits, targets, axis=axis)
        return _reduce(fn, loss, reduction)

    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{fn}: labels must be integer class ids or float probabilities, got "
                        f"dtype {labels.dtype}.")
    _check_index_labels(fn, logits, labels, axis)
    _check_label_range(fn, labels, num_classes, ignore_index)
    log_probs = jax.nn.log_softmax(jnp.moveaxis(logits, axis, -1), axis=-1)
    return _nll_from_log_probs(fn, log_probs, labels, weight, ignore_index, reduction,
                               label_smoothing)


def sigmoid_binary_cross_entropy(logits, labels, *, pos_weight=None, weight=None,
                                 reduction: str = "mean"):
    r"""Binary cross-entropy on logits, matching ``torch.nn.functional.binary_cross_entropy_with_logits``.

    .. math::
        l = -w\,\big(p\, y \log\sigma(x) + (1-y)\log(1-\sigma(x))\big)

    computed stably with ``log_sigmoid``. ``labels`` (0/1 or probabilities, any real or
    bool dtype) must have ``logits``' shape; ``weight`` (per element) and ``pos_weight``
    (per class, usually shape ``(C,)`` for the last axis) broadcast against it.
    ``"mean"`` averages over all elements, ``"sum_mean"`` sums each example's elements
    and averages over the batch (axis 0): :math:`\frac1N\sum_n\sum_i l_{n,i}`, the
    Bernoulli reconstruction term of a VAE.

    Args:
      logits: float scores.
      labels: targets of ``logits``' shape: 0/1 or probabilities, real or bool.
      pos_weight: optional weight of the positive term, broadcast to ``logits``.
      weight: optional per-element weight, broadcast to ``logits``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``logits``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``logits`` not floating, or ``labels``, ``weight`` or ``pos_weight`` not
        real.
      ValueError: a bad ``reduction``, ``labels`` not of ``logits``' shape, or a
        ``weight``/``pos_weight`` that does not broadcast to it.

    Examples:
      >>> logits, labels = jnp.array([0.0, 2.0]), jnp.array([1, 0])
      >>> print(jnp.round(sigmoid_binary_cross_entropy(logits, labels, reduction="none"), 4))
      [0.6931 2.1269]
      >>> # pos_weight scales only the positive term
      >>> print(jnp.round(sigmoid_binary_cross_entropy(logits, labels, pos_weight=jnp.array(2.0),
      ...                                              reduction="none"), 4))
      [1.3863 2.1269]
    """
    fn = "funcnet.losses.sigmoid_binary_cross_entropy"
    logits = _float_array(fn, logits, "logits")
    labels = _array(fn, labels, "labels")
    _check_reduction(fn, reduction)
    if not (jnp.issubdtype(labels.dtype, jnp.floating) or jnp.issubdtype(labels.dtype, jnp.integer)
            or labels.dtype == jnp.bool_):
        raise TypeError(f"{fn}: labels must be real or bool, got dtype {labels.dtype}.")
    _same_shape(fn, logits, labels, "logits", "labels")
    labels = labels.astype(logits.dtype)

    def broadcastable(x, what):
        x = _array(fn, x, what)
        if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
            raise TypeError(f"{fn}: {what} must be real, got dtype {x.dtype}.")
        x = x.astype(logits.dtype)
        try:
            fits = jnp.broadcast_shapes(x.shape, logits.shape) == logits.shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{fn}: {what} of shape {x.shape} does not broadcast to logits "
                             f"of shape {logits.shape}.")
        return x

    if pos_weight is None:
        loss = optax.losses.sigmoid_binary_cross_entropy(logits, labels)
    else:
        pos_weight = broadcastable(pos_weight, "pos_weight")
        loss = -(pos_weight * labels * jax.nn.log_sigmoid(logits)
                 + (1.0 - labels) * jax.nn.log_sigmoid(-logits))
    if weight is not None:
        loss = loss * broadcastable(weight, "weight")
    return _reduce(fn, loss, reduction)


# --------------------------------------------------------------------------- #
# Regression.
# --------------------------------------------------------------------------- #

def _regression_args(fn, predictions, targets, reduction):
    predictions = _float_array(fn, predictions, "predictions")
    targets = _array(fn, targets, "targets")
    if not (jnp.issubdtype(targets.dtype, jnp.floating) or jnp.issubdtype(targets.dtype, jnp.integer)):
        raise TypeError(f"{fn}: targets must be real numbers, got dtype {targets.dtype}.")
    _same_shape(fn, predictions, targets, "predictions", "targets")
    _check_reduction(fn, reduction)
    return predictions, targets.astype(predictions.dtype)


def mse(predictions, targets, *, reduction: str = "mean"):
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


def mae(predictions, targets, *, reduction: str = "mean"):
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


def huber(predictions, targets, *, delta: float = 1.0, reduction: str = "mean"):
    r"""Huber loss, matching ``torch.nn.functional.huber_loss``.

    .. math::
        l = \begin{cases} \tfrac12 (x-y)^2 & |x-y| < \delta \\
                          \delta\,(|x-y| - \tfrac12\delta) & \text{otherwise} \end{cases}

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


def smooth_l1(data, *, scalar: float = 1.0, reduction: str = "none"):
    r"""MXNet's elementwise ``smooth_l1``, with :math:`\sigma` = ``scalar``:

    .. math::
        f(x) = \begin{cases} \tfrac12 (\sigma x)^2 & |x| < 1/\sigma^2 \\
                             |x| - \tfrac{1}{2\sigma^2} & \text{otherwise} \end{cases}

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


# --------------------------------------------------------------------------- #
# Margin losses.
# --------------------------------------------------------------------------- #

def hinge(scores, labels, *, reduction: str = "mean"):
    r"""Binary hinge loss :math:`\max(0, 1 - y\,s)` (``optax.losses.hinge_loss``).

    ``labels`` have ``scores``' shape and may use either convention, ``{-1, 1}`` or
    ``{0, 1}``: any label ``> 0`` is the positive class (``y = +1``) and any label
    ``<= 0`` the negative one (``y = -1``). Concrete labels are checked: values other
    than -1, 0, 1, or a mix of -1 and 0, raise ``ValueError``.

    Args:
      scores: float scores.
      labels: labels of ``scores``' shape, in ``{-1, 1}`` or in ``{0, 1}``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``scores``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``scores`` not floating.
      ValueError: a bad ``reduction``, ``labels`` not of ``scores``' shape, or concrete
        labels outside both conventions.

    Examples:
      >>> scores = jnp.array([2.0, 0.5, -1.0])
      >>> print(hinge(scores, jnp.array([1, 1, -1]), reduction="none"))
      [0.  0.5 0. ]
      >>> print(hinge(scores, jnp.array([1, 1, 0]), reduction="none"))  # {0, 1} labels
      [0.  0.5 0. ]
    """
    fn = "funcnet.losses.hinge"
    scores = _float_array(fn, scores, "scores")
    labels = _array(fn, labels, "labels")
    _check_reduction(fn, reduction)
    _same_shape(fn, scores, labels, "scores", "labels")
    values = _concrete(labels)
    if values is not None and values.size:
        found = set(np.unique(values).tolist())
        if not found <= {-1, 0, 1} or {-1, 0} <= found:
            raise ValueError(f"{fn}: labels must be in {{-1, 1}} or in {{0, 1}}, found "
                             f"{sorted(found)[:8]}.")
    signs = jnp.where(labels > 0, 1.0, -1.0).astype(scores.dtype)
    return _reduce(fn, optax.losses.hinge_loss(scores, signs), reduction)


def multiclass_hinge(scores, labels, *, margin: float = 1.0, weight=None,
                     reduction: str = "mean", p: int = 1):
    r"""Multi-class hinge loss, as ``torch.nn.functional.multi_margin_loss`` (``p``,
    ``margin``, ``weight``).

    For scores :math:`x` ``(..., C)`` (classes last) and class ids :math:`y` ``(...)``:

    .. math::
        l = \frac{1}{C}\sum_{i \ne y} w_y \max(0, \text{margin} - x_y + x_i)^p

    ``p`` is 1 (the default) or 2 (the squared hinge), as torch allows.

    ``"mean"`` averages over samples (not weight-normalised, as torch). This sums over
    the wrong classes; ``optax.losses.multiclass_hinge_loss`` (Crammer–Singer) takes the
    max instead.

    Args:
      scores: float scores ``(..., C)``, classes on the last axis.
      labels: integer class ids ``(...)``.
      margin: the margin of every hinge term.
      weight: optional per-class weights, shape ``(C,)``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.
      p: 1 or 2, the power of each hinge term.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``labels``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``scores`` not floating, or ``labels`` not integer.
      ValueError: ``p`` not 1 or 2, a bad ``reduction`` or ``weight`` shape, ``labels``
        not of ``scores``' shape without the class axis, or concrete class ids outside
        ``[0, C)``.

    Examples:
      >>> # (max(0, 1 - 1 + 0) + max(0, 1 - 1 + 0.5)) / 3 classes
      >>> round(float(multiclass_hinge(jnp.array([[1.0, 0.0, 0.5]]), jnp.array([0]))), 4)
      0.1667
    """
    fn = "funcnet.losses.multiclass_hinge"
    if p not in (1, 2) or isinstance(p, bool):
        raise checks.ArgumentError(f"{fn}: p must be 1 or 2 (the power of each hinge term; "
                                   f"torch's multi_margin_loss supports only these), got "
                                   f"{checks.got(p)}.")
    margin = _check_number(fn, "margin", margin)  # any real, as torch's
    scores = _float_array(fn, scores, "scores")
    labels = _int_labels(fn, labels, like=scores, like_what="scores")
    _check_reduction(fn, reduction)
    axis = _class_axis(fn, scores, -1)
    _check_index_labels(fn, scores, labels, axis, has_axis=False)
    num_classes = scores.shape[-1]
    weight = _class_weight(fn, weight, num_classes, scores.dtype)
    _check_label_range(fn, labels, num_classes)
    in_range = (labels >= 0) & (labels < num_classes)
    safe = jnp.where(in_range, labels, 0)
    one_hot = jax.nn.one_hot(safe, num_classes, dtype=scores.dtype)
    target = jnp.take_along_axis(scores, safe[..., None], axis=-1)
    terms = jnp.maximum(0.0, margin - target + scores) * (1.0 - one_hot)
    if p == 2:
        terms = terms * terms
    if weight is not None:
        terms = terms * _mesh.gather(weight, safe)[..., None]
    loss = jnp.sum(terms, axis=-1) / num_classes
    loss = jnp.where(in_range, loss, jnp.nan)
    return _reduce(fn, loss, reduction)


# --------------------------------------------------------------------------- #
# torch.nn's other losses, with its arguments and reductions.
# --------------------------------------------------------------------------- #

_TORCH_REDUCTIONS = ("mean", "sum", "none")


def _check_torch_reduction(fn: str, reduction, extra=()) -> None:
    valid = _TORCH_REDUCTIONS + tuple(extra)
    if reduction not in valid:
        raise ValueError(f"{fn}: reduction must be one of {', '.join(map(repr, valid))}, got "
                         f"{reduction!r}.")


def _real_array(fn: str, x, what: str, dtype):
    x = _array(fn, x, what)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
            or x.dtype == jnp.bool_):
        raise TypeError(f"{fn}: {what} must be real numbers, got dtype {x.dtype}.")
    return x.astype(dtype)


def _broadcasts_to(fn: str, x, shape, what: str, like_what: str):
    try:
        fits = jnp.broadcast_shapes(x.shape, shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{fn}: {what} of shape {x.shape} does not broadcast to the "
                         f"{like_what}' shape {tuple(shape)}.")
    return x


def _clamped_log(x):
    """torch's ``max(log(x), -100)``: a probability of 0 costs 100 nats, not inf."""
    return jnp.maximum(jnp.log(x), -100.0)


def _clamped_log1m(x):
    return jnp.maximum(jnp.log1p(-x), -100.0)


_BCE_EPSILON = float(np.float32(1e-12))  # torch's, a float constant even for float64


@jax.custom_vjp
def _bce(p, y):
    return -(y * _clamped_log(p) + (1.0 - y) * _clamped_log1m(p))


def _bce_fwd(p, y):
    return _bce(p, y), (p, y)


def _bce_bwd(res, g):
    # torch's derivatives: (p - y) / max(p (1 - p), 1e-12) for the input, finite at p = 0
    # and p = 1 where the clamped logs' own derivatives are not; log(1 - p) - log(p),
    # unclamped (infinite at p = 0 or 1), for the labels
    p, y = res
    dp = g * (p - y) / jnp.maximum((1.0 - p) * p, _BCE_EPSILON)
    dy = g * (jnp.log1p(-p) - jnp.log(p))
    return dp, dy


_bce.defvjp(_bce_fwd, _bce_bwd)


def binary_cross_entropy(probs, labels, *, weight=None, reduction: str = "mean"):
    r"""Binary cross-entropy of probabilities, as ``torch.nn.functional.binary_cross_entropy``.

    .. math::
        l = -w\,\big(y \max(\log p, -100) + (1 - y) \max(\log(1 - p), -100)\big)

    The logs are clamped at -100 as torch clamps them, so ``p = 0`` or ``1`` gives a finite
    loss (100 per element) rather than inf; the gradient is torch's,
    :math:`w (p - y) / \max(p(1-p), 10^{-12})` (finite there too; the labels' gradient,
    :math:`w (\log(1-p) - \log p)`, is not clamped, as in torch). Prefer
    :func:`sigmoid_binary_cross_entropy` on logits: it is exact where this one clamps.
    ``labels`` (0/1 or probabilities) have ``probs``' shape; ``weight`` broadcasts to it.
    Concrete ``probs`` outside ``[0, 1]`` raise ValueError (torch's "all elements of input
    should be between 0 and 1"); under jit such values give NaN (the log of a negative
    number).

    Args:
      probs: float probabilities in ``[0, 1]``.
      labels: real targets of ``probs``' shape, 0/1 or probabilities.
      weight: optional per-element weight, broadcast to ``probs``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``probs``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``probs`` not floating, or ``labels`` or ``weight`` not real.
      ValueError: a bad ``reduction``, ``labels`` not of ``probs``' shape, a ``weight``
        that does not broadcast to it, or concrete ``probs`` outside ``[0, 1]``.

    Examples:
      >>> probs, labels = jnp.array([0.5, 0.0]), jnp.array([1.0, 1.0])
      >>> print(jnp.round(binary_cross_entropy(probs, labels, reduction="none"), 4))
      [  0.6931 100.    ]
      >>> # torch's clamped gradient: finite even at p = 0
      >>> g = jax.grad(lambda p: binary_cross_entropy(p, labels, reduction="sum"))(probs)
      >>> round(float(g[0]), 4), bool(jnp.isfinite(g).all())
      (-2.0, True)
    """
    fn = "funcnet.losses.binary_cross_entropy"
    probs = _float_array(fn, probs, "probs")
    labels = _real_array(fn, labels, "labels", probs.dtype)
    _check_reduction(fn, reduction)
    _same_shape(fn, probs, labels, "probs", "labels")
    values = _concrete(probs)
    if values is not None and values.size and not ((values >= 0) & (values <= 1)).all():
        raise ValueError(f"{fn}: probs must lie in [0, 1] (all elements of input should be "
                         f"between 0 and 1), found values from {values.min()} to "
                         f"{values.max()}. For scores (logits) use "
                         f"sigmoid_binary_cross_entropy, or apply jax.nn.sigmoid first.")
    loss = _bce(probs, labels)
    if weight is not None:
        loss = loss * _broadcasts_to(fn, _real_array(fn, weight, "weight", probs.dtype),
                                     probs.shape, "weight", "probs")
    return _reduce(fn, loss, reduction)


def kl_div(inputs, targets, *, reduction: str = "mean", log_target: bool = False):
    r"""Kullback-Leibler divergence, as ``torch.nn.functional.kl_div``: ``inputs`` are
    log-probabilities, ``targets`` probabilities (log-probabilities with ``log_target=True``).

    .. math::
        l = y\,(\log y - x) \quad(0 \text{ where } y = 0), \qquad
        l = e^{y}\,(y - x) \quad (\texttt{log\_target=True})

    ``reduction="batchmean"`` is :math:`\sum l / N` with ``N`` the size of axis 0, the
    mathematical KL divergence of a batch of distributions (torch recommends it);
    ``"mean"`` divides by the number of elements as torch's does; ``"sum"``, ``"none"``
    and ``"sum_mean"`` as the other losses. Shapes must be equal.

    Args:
      inputs: float log-probabilities.
      targets: real probabilities of ``inputs``' shape (log-probabilities with
        ``log_target=True``).
      reduction: ``"mean"``, ``"batchmean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.
      log_target: whether ``targets`` are log-probabilities.

    Returns:
      The reduced divergence, a float32 (or float64) scalar; ``inputs``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction`` or ``log_target``, or ``targets`` not of
        ``inputs``' shape.

    Examples:
      >>> log_q = jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.1]]))
      >>> p = jnp.array([[0.5, 0.5], [0.5, 0.5]])
      >>> round(float(kl_div(log_q, p, reduction="batchmean")), 4)  # KL(p || q) per row
      0.2554
      >>> round(float(kl_div(log_q, p)), 4)  # torch's "mean": over the 4 elements
      0.1277
      >>> round(float(kl_div(log_q, jnp.log(p), reduction="batchmean", log_target=True)), 4)
      0.2554
    """
    fn = "funcnet.losses.kl_div"
    inputs = _float_array(fn, inputs, "inputs")
    targets = _real_array(fn, targets, "targets", inputs.dtype)
    _same_shape(fn, inputs, targets, "inputs", "targets")
    log_target = checks.flag(fn, "log_target", log_target)
    if reduction != "batchmean":
        _check_reduction(fn, reduction)
    if log_target:
        loss = jnp.exp(targets) * (targets - inputs)
    else:
        loss = jax.scipy.special.xlogy(targets, targets) - targets * inputs
    if reduction == "batchmean":
        return jnp.sum(loss) / inputs.shape[0] if inputs.ndim else jnp.sum(loss)
    return _reduce(fn, loss, reduction)


def _sign_labels(fn: str, labels, shape, what: str = "labels"):
    labels = _array(fn, labels, what)
    if labels.shape != tuple(shape):
        raise ValueError(f"{fn}: {what} must have shape {tuple(shape)}, got {labels.shape}.")
    values = _concrete(labels)
    if values is not None and values.size and not np.isin(values, (-1, 1)).all():
        found = np.unique(values[~np.isin(values, (-1, 1))])[:8].tolist()
        raise ValueError(f"{fn}: {what} must be 1 or -1, found {found}. Map {{0, 1}} labels "
                         f"with 2 * y - 1.")
    return labels


def cosine_embedding_loss(x1, x2, labels, *, margin: float = 0.0, reduction: str = "mean"):
    r"""Cosine embedding loss, as ``torch.nn.functional.cosine_embedding_loss``.

    For rows ``x1``, ``x2`` of shape ``(N, D)`` (or ``(D,)``) and labels ``y`` of
    ``(N,)`` (or ``()``) in ``{1, -1}``, with torch's :math:`\epsilon = 10^{-12}`:

    .. math::
        \cos = \frac{\sum x_1 x_2}{\sqrt{(\sum x_1^2 + \epsilon)(\sum x_2^2 + \epsilon)}}, \qquad
        l = \begin{cases} 1 - \cos & y = 1 \\ \max(0, \cos - \text{margin}) & y = -1 \end{cases}

    Concrete labels other than 1 and -1 raise ValueError (torch gives them a loss of 0).

    Args:
      x1: float rows ``(N, D)`` or ``(D,)``.
      x2: float rows of ``x1``'s shape.
      labels: 1 (similar) or -1 (dissimilar), shape ``(N,)`` or ``()``.
      margin: the cosine below which a dissimilar pair costs nothing.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``labels``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``x1`` or ``x2`` not floating.
      ValueError: a bad ``reduction`` or ``margin``, mismatched shapes, inputs not 1-D
        or 2-D, or concrete labels other than 1 and -1.

    Examples:
      >>> x1, x2 = jnp.array([[1.0, 0.0], [1.0, 0.0]]), jnp.array([[1.0, 1.0], [1.0, 1.0]])
      >>> # cos = 0.7071: 1 - cos for a similar pair, cos - margin for a dissimilar one
      >>> print(jnp.round(cosine_embedding_loss(x1, x2, jnp.array([1, -1]), reduction="none"), 4))
      [0.2929 0.7071]
    """
    fn = "funcnet.losses.cosine_embedding_loss"
    x1 = _float_array(fn, x1, "x1")
    x2 = _float_array(fn, x2, "x2")
    _same_shape(fn, x1, x2, "x1", "x2")
    if x1.ndim not in (1, 2):
        raise ValueError(f"{fn}: x1 and x2 must be (N, D) or (D,), got shape {x1.shape}.")
    labels = _sign_labels(fn, labels, x1.shape[:-1])
    _check_reduction(fn, reduction)
    margin = _check_number(fn, "margin", margin)
    dtype = jnp.promote_types(x1.dtype, x2.dtype)
    x1, x2 = x1.astype(dtype), x2.astype(dtype)
    eps = 1e-12
    denom = jnp.sqrt((jnp.sum(x1 * x1, -1) + eps) * (jnp.sum(x2 * x2, -1) + eps))
    cos = jnp.sum(x1 * x2, -1) / denom
    loss = jnp.where(labels == 1, 1.0 - cos, jnp.maximum(cos - margin, 0.0))
    return _reduce(fn, loss, reduction)


def margin_ranking_loss(x1, x2, labels, *, margin: float = 0.0, reduction: str = "mean"):
    r"""Margin ranking loss, as ``torch.nn.functional.margin_ranking_loss``:
    :math:`l = \max(0, -y (x_1 - x_2) + \text{margin})`, ``y = 1`` when ``x1`` should
    rank higher and ``-1`` when ``x2`` should. The three arrays have one shape.

    Args:
      x1: float scores.
      x2: float scores of ``x1``'s shape.
      labels: 1 or -1 per pair, ``x1``'s shape.
      margin: how far apart the scores must be to cost nothing.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``x1``'s shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``x1`` or ``x2`` not floating, or ``labels`` not real.
      ValueError: a bad ``reduction`` or ``margin``, or mismatched shapes.

    Examples:
      >>> x1, x2, y = jnp.array([1.0, 2.0]), jnp.array([2.0, 1.0]), jnp.array([1.0, 1.0])
      >>> print(margin_ranking_loss(x1, x2, y, reduction="none"))  # x1 should rank higher
      [1. 0.]
      >>> float(margin_ranking_loss(x1, x2, y))
      0.5
    """
    fn = "funcnet.losses.margin_ranking_loss"
    x1 = _float_array(fn, x1, "x1")
    x2 = _float_array(fn, x2, "x2")
    _same_shape(fn, x1, x2, "x1", "x2")
    labels = _real_array(fn, labels, "labels", x1.dtype)
    _same_shape(fn, x1, labels, "x1", "labels")
    _check_reduction(fn, reduction)
    margin = _check_number(fn, "margin", margin)
    return _reduce(fn, jnp.maximum(-labels * (x1 - x2) + margin, 0.0), reduction)


def _pairwise_distance(a, b, p, eps):
    """torch's ``pairwise_distance``: ``||a - b + eps||_p`` over the last axis."""
    d = jnp.abs(a - b + eps)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, -1))
    if p == 1:
        return jnp.sum(d, -1)
    return jnp.sum(d ** p, -1) ** (1.0 / p)


def triplet_margin_loss(anchor, positive, negative, *, margin: float = 1.0, p: float = 2.0,
                        eps: float = 1e-6, swap: bool = False, reduction: str = "mean"):
    r"""Triplet margin loss, as ``torch.nn.functional.triplet_margin_loss``.

    Rows of shape ``(N, D)`` (or ``(D,)``), with :math:`d(a, b) = \lVert a - b +
    \epsilon\rVert_p` over the last axis (torch's ``pairwise_distance``):

    .. math::
        l = \max(d(a, p) - d(a, n) + \text{margin}, 0)

    ``swap=True`` (the distance swap of Balntas et al. 2016) uses
    :math:`\min(d(a, n), d(p, n))` for the negative distance. ``margin`` must be > 0 and
    ``p`` > 0, as torch requires.

    Args:
      anchor: float rows ``(N, D)`` or ``(D,)``.
      positive: float rows of ``anchor``'s shape, to be near it.
      negative: float rows of ``anchor``'s shape, to be far from it.
      margin: the required gap between the distances, > 0.
      p: the norm degree, > 0.
      eps: added to the differences, as torch's ``pairwise_distance`` does.
      swap: use the distance swap.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``(N,)`` (or ``()``) with
      ``reduction="none"``.

    Raises:
      TypeError: an input not floating.
      ValueError: mismatched shapes, inputs not 1-D or 2-D, a bad ``reduction``,
        ``margin``, ``p``, ``eps`` or ``swap``.

    Examples:
      >>> a, pos, neg = jnp.array([[0.0, 0.0]]), jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 1.5]])
      >>> round(float(triplet_margin_loss(a, pos, neg)), 4)  # 1 - 1.5 + margin 1
      0.5
    """
    fn = "funcnet.losses.triplet_margin_loss"
    anchor = _float_array(fn, anchor, "anchor")
    positive = _float_array(fn, positive, "positive")
    negative = _float_array(fn, negative, "negative")
    _same_shape(fn, anchor, positive, "anchor", "positive")
    _same_shape(fn, anchor, negative, "anchor", "negative")
    if anchor.ndim not in (1, 2):
        raise ValueError(f"{fn}: anchor, positive and negative must be (N, D) or (D,), got "
                         f"shape {anchor.shape}.")
    _check_reduction(fn, reduction)
    margin = checks.real(fn, "margin (torch: margin must be greater than 0)", margin, low=0.0,
                         low_open=True)
    p = checks.real(fn, "p (the norm degree)", p, low=0.0, low_open=True)
    eps = checks.real(fn, "eps", eps, low=0.0)
    swap = checks.flag(fn, "swap", swap)
    d_pos = _pairwise_distance(anchor, positive, p, eps)
    d_neg = _pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = jnp.minimum(d_neg, _pairwise_distance(positive, negative, p, eps))
    return _reduce(fn, jnp.maximum(d_pos - d_neg + margin, 0.0), reduction)


def poisson_nll_loss(inputs, targets, *, log_input: bool = True, full: bool = False,
                     eps: float = 1e-8, reduction: str = "mean"):
    r"""Poisson negative log-likelihood, as ``torch.nn.functional.poisson_nll_loss``.

    .. math::
        l = e^{x} - y x \quad (\texttt{log\_input=True}), \qquad
        l = x - y \log(x + \text{eps}) \quad (\texttt{log\_input=False})

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


def gaussian_nll_loss(inputs, targets, var, *, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean"):
    r"""Gaussian negative log-likelihood, as ``torch.nn.functional.gaussian_nll_loss``.

    .. math::
        l = \tfrac12\Big(\log \max(\sigma^2, \text{eps}) + \frac{(x - y)^2}{\max(\sigma^2,
            \text{eps})}\Big) \;(+\, \tfrac12 \log 2\pi \text{ with full=True})

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
        raise ValueError(f"{fn}: var has negative entry/entries (found {values.min()}); it "
                         f"is a variance. Pass e.g. jax.nn.softplus(raw) or exp(log_var).")
    if var.shape != inputs.shape:
        if var.shape == inputs.shape[:-1]:
            var = var[..., None]
        elif not (var.ndim == inputs.ndim and sum(
                v for i, v in zip(inputs.shape, var.shape) if i != v) == 1):
            raise ValueError(
                f"{fn}: var is of incorrect size: shape {var.shape} for inputs of shape "
                f"{inputs.shape}. Give inputs' shape (one variance per element), inputs' "
                f"shape without the last axis {inputs.shape[:-1]}, or inputs' shape with one "
                f"axis set to 1 (one variance shared along it).")
    var = var.astype(inputs.dtype)
    var = var + lax.stop_gradient(jnp.maximum(var, eps) - var)
    loss = 0.5 * (jnp.log(var) + jnp.square(inputs - targets) / var)
    if full:
        loss = loss + 0.5 * np.log(2 * np.pi)
    return _reduce(fn, loss, reduction)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, *, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False):
    r"""Connectionist temporal classification loss, as ``torch.nn.CTCLoss``, computed by
    ``optax.ctc_loss``.

    Batch first: ``log_probs`` ``(N, T, C)`` are per-frame log-probabilities
    (``jax.nn.log_softmax`` output; torch's ``(T, N, C)`` is
    ``jnp.swapaxes(log_probs, 0, 1)``), ``targets`` ``(N, S)`` padded integer labels (not
    ``blank``; torch's concatenated 1-D form is not accepted), ``input_lengths`` and
    ``target_lengths`` ``(N,)`` the valid frames and labels of each sequence. Per
    sequence, :math:`l_n = -\log \sum_{\pi \in B^{-1}(y_n)} \prod_t p_{t, \pi_t}`;
    ``"mean"`` is torch's: :math:`\frac1N \sum_n l_n / \max(|y_n|, 1)`; ``"sum"`` and
    ``"none"`` (shape ``(N,)``) as usual.

    A target that no alignment of its input length can produce (shorter than the target
    plus its repeated neighbours) has an infinite loss, as in torch;
    ``zero_infinity=True`` makes such losses, and their gradients, 0. The gradient with
    respect to ``log_probs`` is torch's (``exp(log_probs) - posteriors``: optax
    normalises the input once more, which for log-probabilities changes the value by
    nothing and the gradient exactly as torch's formula does), so gradients through a
    ``log_softmax`` are those of torch.

    Args:
      log_probs: float per-frame log-probabilities ``(N, T, C)``.
      targets: integer padded labels ``(N, S)``.
      input_lengths: integer valid frames per sequence ``(N,)``, each in ``[0, T]``.
      target_lengths: integer valid labels per sequence ``(N,)``, each in ``[0, S]``.
      blank: the class id of the blank, in ``[0, C)``.
      reduction: ``"mean"``, ``"sum"`` or ``"none"`` (torch's).
      zero_infinity: make the infinite losses of impossible targets (and their
        gradients) 0.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``(N,)`` with ``reduction="none"``.

    Raises:
      TypeError: ``log_probs`` not floating, or ``targets`` or a lengths array not integer.
      ValueError: shapes other than those above, a ``blank`` outside ``[0, C)``, a bad
        ``reduction``, or concrete lengths or targets (within ``target_lengths``) out of
        range or equal to ``blank``.

    Examples:
      >>> log_probs = jnp.log(jnp.full((1, 2, 2), 0.5))  # 2 frames, classes {blank, 1}
      >>> # "1" is read off 3 of the 4 paths: -log(0.75)
      >>> round(float(ctc_loss(log_probs, jnp.array([[1]]), jnp.array([2]), jnp.array([1]))), 4)
      0.2877
      >>> # "1 1" needs a blank between the repeats, 3 frames: impossible in 2
      >>> print(ctc_loss(log_probs, jnp.array([[1, 1]]), jnp.array([2]), jnp.array([2]),
      ...                reduction="none"))
      [inf]
    """
    fn = "funcnet.losses.ctc_loss"
    log_probs = _float_array(fn, log_probs, "log_probs")
    if log_probs.ndim != 3:
        raise ValueError(f"{fn}: log_probs must be (N, T, C), batch first, got shape "
                         f"{log_probs.shape}. From torch's (T, N, C) layout: "
                         f"jnp.swapaxes(log_probs, 0, 1).")
    N, T, C = log_probs.shape
    targets = _int_labels(fn, targets, "targets")
    if targets.ndim != 2 or targets.shape[0] != N:
        raise ValueError(f"{fn}: targets must be padded labels of shape ({N}, S), got "
                         f"{targets.shape}.")
    lengths = []
    for what, x, most in (("input_lengths", input_lengths, T),
                          ("target_lengths", target_lengths, targets.shape[1])):
        x = _int_labels(fn, x, what)
        if x.shape != (N,):
            raise ValueError(f"{fn}: {what} must have shape ({N},), one per sequence, got "
                             f"{x.shape}.")
        v = _concrete(x)
        if v is not None and v.size and (v.min() < 0 or v.max() > most):
            raise ValueError(f"{fn}: {what} must lie in [0, {most}], found values from "
                             f"{v.min()} to {v.max()}.")
        lengths.append(x)
    input_lengths, target_lengths = lengths
    blank = checks.integer(fn, "blank", blank)
    if not 0 <= blank < C:
        raise ValueError(f"{fn}: blank must be in label range: blank={blank} but log_probs "
                         f"has {C} classes. Give the index of the blank class, in [0, {C}).")
    _check_torch_reduction(fn, reduction)
    zero_infinity = checks.flag(fn, "zero_infinity", zero_infinity)
    S = targets.shape[1]
    in_target = jnp.arange(S)[None, :] < target_lengths[:, None]
    v = _concrete(targets)
    mask = _concrete(in_target)
    if v is not None and mask is not None and v.size:
        bad = mask & ((v < 0) | (v >= C) | (v == blank))
        if bad.any():
            raise ValueError(f"{fn}: targets must be class ids in [0, {C}) other than "
                             f"blank={blank}, found {np.unique(v[bad])[:8].tolist()} within "
                             f"target_lengths.")
    frame_pad = (jnp.arange(T)[None, :] >= input_lengths[:, None]).astype(log_probs.dtype)
    label_pad = (~in_target).astype(log_probs.dtype)
    safe_targets = jnp.where(in_target, targets, 0)
    nll = optax.ctc_loss(log_probs, frame_pad, safe_targets, label_pad, blank_id=blank)
    # optax's log-space zero is a finite -1e5: detect impossible alignments as torch's inf
    repeats = jnp.sum(in_target[:, 1:] & (safe_targets[:, 1:] == safe_targets[:, :-1]), axis=1)
    feasible = input_lengths >= target_lengths + repeats
    nll = jnp.where(feasible, nll, 0.0 if zero_infinity else jnp.inf)
    if reduction == "mean":
        return jnp.mean(nll / jnp.maximum(target_lengths, 1).astype(nll.dtype))
    if reduction == "sum":
        return jnp.sum(nll)
    return nll


# --------------------------------------------------------------------------- #
# Center loss (Wen et al. 2016), centers as explicit state.
# --------------------------------------------------------------------------- #

def center_loss_init(num_classes: int, feature_dim: int, dtype=jnp.float32):
    """Initial class centers: zeros of shape ``(num_classes, feature_dim)``.

    Args:
      num_classes: the number of classes, a positive int.
      feature_dim: the size of each feature vector, a positive int.
      dtype: the centers' dtype.

    Returns:
      The centers, zeros of shape ``(num_classes, feature_dim)``.

    Raises:
      ArgumentError: ``num_classes`` or ``feature_dim`` is not a positive int.

    Examples:
      >>> centers = center_loss_init(3, 2)
      >>> centers.shape, centers.dtype
      ((3, 2), dtype('float32'))
    """
    for what, n in (("num_classes", num_classes), ("feature_dim", feature_dim)):
        checks.positive_int("center_loss_init", what, n)
    return jnp.zeros((int(num_classes), int(feature_dim)), dtype)


def center_loss(centers, features, labels, *, alpha: float = 0.5, axis_name=None):
    r"""Center loss and the updated centers: ``(loss, new_centers)``.

    With :math:`B` samples :math:`x_i` of classes :math:`y_i` and centers :math:`c`
    (held under ``stop_gradient``):

    .. math::
        L = \frac{1}{2B}\sum_i \lVert x_i - c_{y_i}\rVert^2, \qquad
        \frac{\partial L}{\partial x_i} = \frac{x_i - c_{y_i}}{B},

    and the centers follow MXNet's center-loss rule, computed from the centers passed in:

    .. math::
        c_j \leftarrow c_j + \alpha\,\frac{\sum_{i: y_i = j} (x_i - c_j)}{1 + n_j},

    :math:`n_j` the number of samples of class :math:`j`. ``centers`` never receive a
    gradient (and ``new_centers`` carry none): they are state, not parameters. Use it
    inside ``jax.value_and_grad(loss_fn, has_aux=True)`` returning the new centers as aux.

    **Data parallel** (``axis_name`` set, inside ``pmap``): the per-class sums, counts
    and squared distances are ``psum``-ed, so every device returns the same
    ``new_centers`` and the same ``loss``, both equal to the single-device result on the
    global batch. Each device's gradient w.r.t. its own features is
    :math:`(x_i - c_{y_i})/B_\text{local}`: the usual per-device-mean convention, so
    ``lax.pmean`` of the parameter gradients (as for any local-mean loss) gives the
    gradient of the global-batch loss.

    Labels out of ``[0, num_classes)`` raise ``ValueError`` when concrete; under jit
    they make the loss NaN and are left out of the center update.

    Args:
      centers: ``(num_classes, feature_dim)`` from :func:`center_loss_init` or a previous call.
      features: ``(B, feature_dim)`` float features.
      labels: ``(B,)`` integer class ids.
      alpha: center learning rate.
      axis_name: the ``pmap`` axis to reduce over, or None on one device.

    Returns:
      ``(loss, new_centers)``: the scalar loss (float32 or wider) and the updated centers,
      ``centers``' shape and dtype, without gradient.

    Raises:
      TypeError: ``centers`` or ``features`` not floating, or ``labels`` not integer.
      ValueError: shapes other than those above, a bad ``alpha``, or concrete labels
        outside ``[0, num_classes)``.

    Examples:
      >>> centers = center_loss_init(2, 2)
      >>> features, labels = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.array([0, 1])
      >>> loss, new_centers = center_loss(centers, features, labels)
      >>> float(loss)  # (1 + 4) / (2 * 2)
      1.25
      >>> new_centers.tolist()  # each center moves alpha * diff / (1 + n_j)
      [[0.25, 0.0], [0.0, 0.5]]
    """
    fn = "funcnet.losses.center_loss"
    centers = _float_array(fn, centers, "centers", upcast=False)  # new_centers keep its dtype
    features = _float_array(fn, features, "features")
    labels = _int_labels(fn, labels)
    if centers.ndim != 2:
        raise ValueError(f"{fn}: centers must be (num_classes, feature_dim), got shape "
                         f"{centers.shape}. Make them with center_loss_init.")
    num_classes, dim = centers.shape
    if features.ndim != 2 or features.shape[1] != dim:
        raise ValueError(f"{fn}: features must be (batch, {dim}) to match centers "
                         f"{centers.shape}, got {features.shape}.")
    if labels.shape != features.shape[:1]:
        raise ValueError(f"{fn}: labels must be ({features.shape[0]},), one class id per "
                         f"feature row, got {labels.shape}.")
    alpha = _check_number(fn, "alpha", alpha, low=0.0)
    _check_label_range(fn, labels, num_classes)

    batch = features.shape[0]
    in_range = (labels >= 0) & (labels < num_classes)
    # Invalid ids go to segment `num_classes`, which the scatter-add below drops.
    segments = jnp.where(in_range, labels, num_classes)
    c = lax.stop_gradient(centers)
    diff = features - _mesh.gather(c, jnp.where(in_range, labels, 0))
    sq = jnp.where(in_range, jnp.sum(diff * diff, axis=-1), jnp.nan)
    local = jnp.sum(sq) / (2 * batch)

    # Per-class sums of a batch split over Explicit mesh axes are whole on every device.
    # (A scatter-add, as segment_sum computes it; segment_sum takes out_sharding only
    # from jax 0.10.1.) Segment num_classes, the invalid ids, is dropped.
    delta = jnp.zeros((num_classes, diff.shape[-1]), diff.dtype).at[segments].add(
        lax.stop_gradient(diff), mode="drop",
        out_sharding=_mesh.explicit_sharding(features, None, None))
    counts = jnp.zeros((num_classes,), centers.dtype).at[segments].add(
        1, mode="drop", out_sharding=_mesh.explicit_sharding(features, None))
    if axis_name is None:
        loss = local
    else:
        delta = lax.psum(delta, axis_name)
        counts = lax.psum(counts, axis_name)
        total = lax.psum(lax.stop_gradient(jnp.sum(sq)), axis_name)
        global_batch = lax.psum(jnp.asarray(batch, sq.dtype), axis_name)
        # The value is the global-batch loss; the gradient is that of the local mean
        # (see docstring), independent of how psum happens to be transposed.
        loss = local + lax.stop_gradient(total / (2 * global_batch) - local)
    new_centers = c + alpha * delta / (1.0 + counts)[:, None]
    return loss, lax.stop_gradient(new_centers.astype(centers.dtype))
