"""Margin losses on scores: the binary, multi-class and multi-label hinges, and the soft
(logistic) margins."""

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
    _real_array,
    _same_shape,
)
from funcnet.losses._reduction import _check_reduction, _reduce

__all__ = ["hinge", "multiclass_hinge", "soft_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss"]


def hinge(scores: ArrayLike, labels: ArrayLike, *, reduction: str = "mean") -> jax.Array:
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
            raise ValueError(f"{fn}: labels must be in {{-1, 1}} or in {{0, 1}}, found {sorted(found)[:8]}.")
    signs = jnp.where(labels > 0, 1.0, -1.0).astype(scores.dtype)
    return _reduce(fn, optax.losses.hinge_loss(scores, signs), reduction)


def multiclass_hinge(
    scores: ArrayLike,
    labels: ArrayLike,
    *,
    margin: float = 1.0,
    weight: Optional[ArrayLike] = None,
    reduction: str = "mean",
    p: int = 1,
) -> jax.Array:
    r"""Multi-class hinge loss, as ``torch.nn.functional.multi_margin_loss`` (``p``,
    ``margin``, ``weight``).

    For scores :math:`x` ``(..., C)`` (classes last) and class ids :math:`y` ``(...)``:

    .. math:

    ```
    l = \frac{1}{C}\sum_{i \ne y} w_y \max(0, \text{margin} - x_y + x_i)^p
    ```

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
        raise checks.ArgumentError(
            f"{fn}: p must be 1 or 2 (the power of each hinge term; "
            f"torch's multi_margin_loss supports only these), got "
            f"{checks.got(p)}."
        )
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


def soft_margin_loss(inputs: ArrayLike, targets: ArrayLike, *, reduction: str = "mean") -> jax.Array:
    r"""Two-class logistic loss, as ``torch.nn.functional.soft_margin_loss``.

    .. math:

    ```
    l = \log(1 + e^{-y x})
    ```

    elementwise, for targets :math:`y` (usually 1 or -1; any real value is used as given,
    as in torch) of ``inputs``' shape; ``"mean"`` averages over every element. The value
    is computed as ``softplus(-y x)``, so a large margin gives a finite loss where torch's
    ``log1p(exp(-y x))`` overflows to inf; elsewhere values and gradients are torch's.

    Args:
      inputs: float scores.
      targets: real targets of ``inputs``' shape, usually 1 or -1.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``inputs``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating, or ``targets`` not real.
      ValueError: a bad ``reduction``, or ``targets`` not of ``inputs``' shape.

    Examples:
      >>> x, y = jnp.array([0.0, 2.0, 2.0]), jnp.array([1.0, 1.0, -1.0])
      >>> print(jnp.round(soft_margin_loss(x, y, reduction="none"), 4))  # log(1 + e**(-y x))
      [0.6931 0.1269 2.1269]
    """
    fn = "funcnet.losses.soft_margin_loss"
    inputs = _float_array(fn, inputs, "inputs")
    targets = _real_array(fn, targets, "targets", inputs.dtype)
    _same_shape(fn, inputs, targets, "inputs", "targets")
    _check_reduction(fn, reduction)
    return _reduce(fn, jax.nn.softplus(-targets * inputs), reduction)


def _multilabel_targets(fn: str, inputs, targets):
    """torch's -1-terminated class lists, read: ``in_list`` (the entries before each
    list's first negative one), ``safe`` (the listed ids, 0 elsewhere), ``is_target``
    (the 0/1 mask of the listed classes) and ``valid`` (no listed id ``>= C``)."""
    targets = _int_labels(fn, targets, "targets")
    if inputs.ndim not in (1, 2):
        raise ValueError(f"{fn}: inputs must be (C,) or (N, C), classes last, got shape {inputs.shape}.")
    _same_shape(fn, inputs, targets, "inputs", "targets")
    num_classes = inputs.shape[-1]
    # torch reads each list up to its first negative entry; the rest is padding.
    in_list = jnp.cumprod(targets >= 0, axis=-1).astype(bool)
    values = _concrete(targets)
    if values is not None and values.size:
        bad = (values < -1) | (values >= num_classes)
        if bad.any():
            raise ValueError(
                f"{fn}: targets must be class ids in [0, {num_classes}) or -1, "
                f"which ends a row's list, found "
                f"{np.unique(values[bad])[:8].tolist()}. Pad each row with -1, "
                f"e.g. [3, 0, -1, -1] for classes 3 and 0."
            )
    in_range = targets < num_classes
    safe = jnp.where(in_list & in_range, targets, 0)
    hits = jax.nn.one_hot(safe, num_classes, dtype=inputs.dtype) * in_list[..., None]
    is_target = jnp.max(hits, axis=-2)
    # NaN marks a listed class id >= C, which jit cannot refuse (see the package docstring).
    valid = jnp.all(in_range | ~in_list, axis=-1)
    return in_list, safe, is_target, valid


def multilabel_margin_loss(inputs: ArrayLike, targets: ArrayLike, *, reduction: str = "mean") -> jax.Array:
    r"""Multi-label hinge loss, as ``torch.nn.functional.multilabel_margin_loss``.

    ``targets`` are torch's index lists: each row of ``inputs``' shape ``(N, C)`` (or
    ``(C,)``) lists the row's classes, ended by -1 (``[3, 0, -1, -1]``: classes 3 and 0);
    entries after the first -1 are ignored. Concrete targets outside ``[-1, C)`` raise
    ValueError, anywhere in the row, as torch refuses them; under jit a listed id
    ``>= C`` makes that row's loss NaN. With :math:`J` the listed classes (a class
    listed twice counts twice, as in torch):

    .. math:

    ```
    l = \frac1C \sum_{j \in J} \sum_{i \notin J} \max(0, 1 - (x_j - x_i))
    ```

    A hinge exactly at 0 has gradient 0, as in torch.

    Args:
      inputs: float scores ``(N, C)`` or ``(C,)``, classes last.
      targets: integer class lists of ``inputs``' shape, ended by -1.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``(N,)`` (or ``()``) with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating, or ``targets`` not integer.
      ValueError: a bad ``reduction``, inputs not 1-D or 2-D, ``targets`` not of
        ``inputs``' shape, or concrete targets outside ``[-1, C)``.

    Examples:
      >>> x = jnp.array([[0.1, 0.2, 0.4, 0.8]])
      >>> # classes 3 and 0 against 1 and 2: (0.4 + 0.6 + 1.1 + 1.3) / 4
      >>> round(float(multilabel_margin_loss(x, jnp.array([[3, 0, -1, 1]]))), 4)
      0.85
    """
    fn = "funcnet.losses.multilabel_margin_loss"
    inputs = _float_array(fn, inputs, "inputs")
    _check_reduction(fn, reduction)
    in_list, safe, is_target, valid = _multilabel_targets(fn, inputs, targets)
    listed = jnp.take_along_axis(inputs, safe, axis=-1)  # x_j, (..., C)
    z = 1.0 - listed[..., :, None] + inputs[..., None, :]  # (..., j, i)
    keep = in_list[..., :, None] & (is_target[..., None, :] == 0)
    terms = jnp.where(keep & (z > 0), z, 0.0)  # strict, as torch's: a tie has no gradient
    loss = jnp.sum(terms, axis=(-2, -1)) / inputs.shape[-1]
    return _reduce(fn, jnp.where(valid, loss, jnp.nan), reduction)


def multilabel_soft_margin_loss(
    inputs: ArrayLike, targets: ArrayLike, *, weight: Optional[ArrayLike] = None, reduction: str = "mean"
) -> jax.Array:
    r"""Multi-label one-versus-all logistic loss, as
    ``torch.nn.functional.multilabel_soft_margin_loss``.

    For scores :math:`x` ``(..., C)`` and 0/1 targets :math:`y` (or probabilities) of the
    same shape, with per-class weights :math:`w` (``weight``, broadcast to ``inputs``):

    .. math:

    ```
    l = -\frac1C \sum_c w_c \big(y_c \log\sigma(x_c) + (1 - y_c) \log\sigma(-x_c)\big)
    ```

    one value per sample (``inputs``' shape without the class axis); ``"mean"`` averages
    over the samples, as torch's does.

    Args:
      inputs: float scores ``(..., C)``, classes last.
      targets: real targets of ``inputs``' shape, 0/1 or probabilities.
      weight: optional weights that broadcast to ``inputs``, usually ``(C,)``.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``inputs``' shape without the last
      axis with ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating, or ``targets`` or ``weight`` not real.
      ValueError: a bad ``reduction``, a scalar ``inputs``, ``targets`` not of ``inputs``'
        shape, or a ``weight`` that does not broadcast to it.

    Examples:
      >>> x, y = jnp.array([[0.0, 2.0]]), jnp.array([[1.0, 0.0]])
      >>> # (log 2 + log(1 + e**2)) / 2 classes
      >>> round(float(multilabel_soft_margin_loss(x, y)), 4)
      1.41
    """
    fn = "funcnet.losses.multilabel_soft_margin_loss"
    inputs = _float_array(fn, inputs, "inputs")
    if inputs.ndim == 0:
        raise ValueError(f"{fn}: inputs must have a class axis (the last), got a scalar.")
    targets = _real_array(fn, targets, "targets", inputs.dtype)
    _same_shape(fn, inputs, targets, "inputs", "targets")
    _check_reduction(fn, reduction)
    loss = -(targets * jax.nn.log_sigmoid(inputs) + (1.0 - targets) * jax.nn.log_sigmoid(-inputs))
    if weight is not None:
        loss = loss * _broadcasts_to(
            fn, _real_array(fn, weight, "weight", inputs.dtype), inputs.shape, "weight", "inputs"
        )
    return _reduce(fn, jnp.sum(loss, axis=-1) / inputs.shape[-1], reduction)
