"""Classification losses: cross-entropy, negative log-likelihood, binary cross-entropy
(on logits and on probabilities) and the KL divergence."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from funcnet import _mesh
from funcnet import _checks as checks
from funcnet.losses._args import (
    _array,
    _broadcasts_to,
    _check_index_labels,
    _check_label_range,
    _check_number,
    _class_axis,
    _class_weight,
    _concrete,
    _float_array,
    _int_labels,
    _is_zero,
    _real_array,
    _same_shape,
)
from funcnet.losses._reduction import _check_reduction, _reduce

__all__ = ["nll_loss", "cross_entropy", "sigmoid_binary_cross_entropy", "binary_cross_entropy", "kl_div"]


def _nll_from_log_probs(fn, log_probs, labels, weight, ignore_index, reduction, label_smoothing):
    """torch's nll_loss (plus cross_entropy's smoothing term), classes on the last axis.

    Per element n with target y_n (w = weight, ε = label_smoothing, C classes):

    ```
    l_n = valid_n * ((1 - ε) * (-w[y_n] log p_n[y_n]) + ε/C * Σ_c (-w[c] log p_n[c]))
    ```

    ``"mean"`` divides Σ l_n by Σ_n valid_n * w[y_n], as torch does for both terms.
    """
    num_classes = log_probs.shape[-1]
    dtype = log_probs.dtype
    valid = labels != ignore_index
    in_range = (labels >= 0) & (labels < num_classes)
    safe = jnp.where(in_range, labels, 0)
    picked = jnp.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]
    w_y = jnp.ones(labels.shape, dtype) if weight is None else _mesh.gather(weight, safe)
    # NaN marks a class id that is neither a class nor ignore_index (see the funcnet.losses docstring).
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


def nll_loss(
    inputs: ArrayLike,
    labels: ArrayLike,
    *,
    weight: Optional[ArrayLike] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    axis: int = -1,
) -> jax.Array:
    r"""Negative log-likelihood of integer labels under log-probabilities.

    Matches ``torch.nn.functional.nll_loss`` except that classes are on ``axis=-1`` by
    default (pass ``axis=1`` for torch's ``(N, C, d1, ...)`` layout). ``inputs`` are
    log-probabilities (e.g. ``jax.nn.log_softmax`` output); no log is taken here.

    .. math:

    ```
    l_n = -w_{y_n}\, x_{n, y_n} \cdot [y_n \ne \text{ignore\_index}], \qquad
    \text{mean} = \frac{\sum_n l_n}{\sum_n w_{y_n} [y_n \ne \text{ignore\_index}]}
    ```

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


def _soft_cross_entropy(fn, logits, labels, weight, ignore_index, reduction, label_smoothing, axis):
    """:func:`cross_entropy` of float (probability) targets of ``logits``' shape."""
    num_classes = logits.shape[axis]
    if labels.shape != logits.shape:
        raise ValueError(
            f"{fn}: float labels are probability targets and must have the "
            f"logits' shape {logits.shape}, got {labels.shape}. For class ids "
            f"use an integer dtype."
        )
    if ignore_index >= 0:
        raise ValueError(
            f"{fn}: ignore_index is not supported for probability (float) "
            f"labels, as in torch; got ignore_index={ignore_index}. Leave it "
            f"at the default or give the ignored rows zero targets."
        )
    targets = labels.astype(logits.dtype)
    if not _is_zero(label_smoothing):
        targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
    if weight is not None:
        shape = [1] * logits.ndim
        shape[axis] = num_classes
        targets = targets * weight.reshape(shape)
    loss = optax.losses.softmax_cross_entropy(logits, targets, axis=axis)
    return _reduce(fn, loss, reduction)


def cross_entropy(
    logits: ArrayLike,
    labels: ArrayLike,
    *,
    weight: Optional[ArrayLike] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    axis: int = -1,
) -> jax.Array:
    r"""Softmax cross-entropy, matching ``torch.nn.functional.cross_entropy``.

    The one difference from torch is the class axis: ``axis=-1`` by default
    (channels-last), ``axis=1`` gives torch's ``(N, C, d1, ...)`` layout.

    **Integer labels** (class ids, ``logits``' shape without ``axis``), with
    :math:`\log p = \text{log\_softmax}(x)`, :math:`\varepsilon` = ``label_smoothing``:

    .. math:

    ```
    l_n = [y_n \ne \text{ignore}]\Big((1-\varepsilon)(-w_{y_n}\log p_{n,y_n})
          + \frac{\varepsilon}{C}\sum_c -w_c \log p_{n,c}\Big)
    ```

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
        return _soft_cross_entropy(fn, logits, labels, weight, ignore_index, reduction, label_smoothing, axis)

    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{fn}: labels must be integer class ids or float probabilities, got dtype {labels.dtype}.")
    _check_index_labels(fn, logits, labels, axis)
    _check_label_range(fn, labels, num_classes, ignore_index)
    log_probs = jax.nn.log_softmax(jnp.moveaxis(logits, axis, -1), axis=-1)
    return _nll_from_log_probs(fn, log_probs, labels, weight, ignore_index, reduction, label_smoothing)


def sigmoid_binary_cross_entropy(
    logits: ArrayLike,
    labels: ArrayLike,
    *,
    pos_weight: Optional[ArrayLike] = None,
    weight: Optional[ArrayLike] = None,
    reduction: str = "mean",
) -> jax.Array:
    r"""Binary cross-entropy on logits, matching ``torch.nn.functional.binary_cross_entropy_with_logits``.

    .. math:

    ```
    l = -w\,\big(p\, y \log\sigma(x) + (1-y)\log(1-\sigma(x))\big)
    ```

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
    if not (
        jnp.issubdtype(labels.dtype, jnp.floating)
        or jnp.issubdtype(labels.dtype, jnp.integer)
        or labels.dtype == jnp.bool_
    ):
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
            raise ValueError(f"{fn}: {what} of shape {x.shape} does not broadcast to logits of shape {logits.shape}.")
        return x

    if pos_weight is None:
        loss = optax.losses.sigmoid_binary_cross_entropy(logits, labels)
    else:
        pos_weight = broadcastable(pos_weight, "pos_weight")
        loss = -(pos_weight * labels * jax.nn.log_sigmoid(logits) + (1.0 - labels) * jax.nn.log_sigmoid(-logits))
    if weight is not None:
        loss = loss * broadcastable(weight, "weight")
    return _reduce(fn, loss, reduction)


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


def binary_cross_entropy(
    probs: ArrayLike, labels: ArrayLike, *, weight: Optional[ArrayLike] = None, reduction: str = "mean"
) -> jax.Array:
    r"""Binary cross-entropy of probabilities, as ``torch.nn.functional.binary_cross_entropy``.

    .. math:

    ```
    l = -w\,\big(y \max(\log p, -100) + (1 - y) \max(\log(1 - p), -100)\big)
    ```

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
        raise ValueError(
            f"{fn}: probs must lie in [0, 1] (all elements of input should be "
            f"between 0 and 1), found values from {values.min()} to "
            f"{values.max()}. For scores (logits) use "
            f"sigmoid_binary_cross_entropy, or apply jax.nn.sigmoid first."
        )
    loss = _bce(probs, labels)
    if weight is not None:
        loss = loss * _broadcasts_to(fn, _real_array(fn, weight, "weight", probs.dtype), probs.shape, "weight", "probs")
    return _reduce(fn, loss, reduction)


def kl_div(inputs: ArrayLike, targets: ArrayLike, *, reduction: str = "mean", log_target: bool = False) -> jax.Array:
    r"""Kullback-Leibler divergence, as ``torch.nn.functional.kl_div``: ``inputs`` are
    log-probabilities, ``targets`` probabilities (log-probabilities with ``log_target=True``).

    .. math:

    ```
    l = y\,(\log y - x) \quad(0 \text{ where } y = 0), \qquad
    l = e^{y}\,(y - x) \quad (\texttt{log\_target=True})
    ```

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
