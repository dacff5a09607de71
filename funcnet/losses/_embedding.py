"""Losses on pairs and triplets of embeddings: cosine embedding, hinge embedding, margin
ranking and triplet margin losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet.losses._args import _check_number, _float_array, _real_array, _same_shape, _sign_labels
from funcnet.losses._reduction import _check_reduction, _reduce

__all__ = ["cosine_embedding_loss", "margin_ranking_loss", "triplet_margin_loss", "hinge_embedding_loss"]


# torch's EPSILON, a C float: float64 inputs get float32(1e-12) = 9.9999998e-13, not 1e-12.
_COSINE_EPSILON = float(np.float32(1e-12))


def cosine_embedding_loss(
    x1: ArrayLike, x2: ArrayLike, labels: ArrayLike, *, margin: float = 0.0, reduction: str = "mean"
) -> jax.Array:
    r"""Cosine embedding loss, as ``torch.nn.functional.cosine_embedding_loss``.

    For rows ``x1``, ``x2`` of shape ``(N, D)`` (or ``(D,)``) and labels ``y`` of
    ``(N,)`` (or ``()``) in ``{1, -1}``, with torch's :math:`\epsilon` = ``float32(1e-12)``
    (a float constant, also for float64 inputs: it sets the gradient at a zero vector):

    .. math:

    ```
    \cos = \frac{\sum x_1 x_2}{\sqrt{(\sum x_1^2 + \epsilon)(\sum x_2^2 + \epsilon)}}, \qquad
    l = \begin{cases} 1 - \cos & y = 1 \\ \max(0, \cos - \text{margin}) & y = -1 \end{cases}
    ```

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
    eps = _COSINE_EPSILON
    denom = jnp.sqrt((jnp.sum(x1 * x1, -1) + eps) * (jnp.sum(x2 * x2, -1) + eps))
    cos = jnp.sum(x1 * x2, -1) / denom
    loss = jnp.where(labels == 1, 1.0 - cos, jnp.maximum(cos - margin, 0.0))
    return _reduce(fn, loss, reduction)


def margin_ranking_loss(
    x1: ArrayLike, x2: ArrayLike, labels: ArrayLike, *, margin: float = 0.0, reduction: str = "mean"
) -> jax.Array:
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
    return jnp.sum(d**p, -1) ** (1.0 / p)


def triplet_margin_loss(
    anchor: ArrayLike,
    positive: ArrayLike,
    negative: ArrayLike,
    *,
    margin: float = 1.0,
    p: float = 2.0,
    eps: float = 1e-6,
    swap: bool = False,
    reduction: str = "mean",
) -> jax.Array:
    r"""Triplet margin loss, as ``torch.nn.functional.triplet_margin_loss``.

    Rows of shape ``(N, D)`` (or ``(D,)``), with :math:`d(a, b) = \lVert a - b +
    \epsilon\rVert_p` over the last axis (torch's ``pairwise_distance``):

    .. math:

    ```
    l = \max(d(a, p) - d(a, n) + \text{margin}, 0)
    ```

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
        raise ValueError(f"{fn}: anchor, positive and negative must be (N, D) or (D,), got shape {anchor.shape}.")
    _check_reduction(fn, reduction)
    margin = checks.real(fn, "margin (torch: margin must be greater than 0)", margin, low=0.0, low_open=True)
    p = checks.real(fn, "p (the norm degree)", p, low=0.0, low_open=True)
    eps = checks.real(fn, "eps", eps, low=0.0)
    swap = checks.flag(fn, "swap", swap)
    d_pos = _pairwise_distance(anchor, positive, p, eps)
    d_neg = _pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = jnp.minimum(d_neg, _pairwise_distance(positive, negative, p, eps))
    return _reduce(fn, jnp.maximum(d_pos - d_neg + margin, 0.0), reduction)


def hinge_embedding_loss(
    inputs: ArrayLike, labels: ArrayLike, *, margin: float = 1.0, reduction: str = "mean"
) -> jax.Array:
    r"""Hinge embedding loss, as ``torch.nn.functional.hinge_embedding_loss``.

    ``inputs`` are usually distances between pairs (e.g. an L1 distance), ``labels`` 1
    for a similar pair and -1 for a dissimilar one:

    .. math:

    ```
    l = \begin{cases} x & y = 1 \\ \max(0, \text{margin} - x) & y = -1 \end{cases}
    ```

    The three arrays have one shape. Concrete labels other than 1 and -1 raise
    ValueError; under jit such a label gets both terms, as torch computes it. Where
    :math:`\text{margin} - x = 0` the gradient is taken from the linear side, as torch's
    ``clamp_min``.

    Args:
      inputs: float distances (or any scores).
      labels: 1 or -1 per element, ``inputs``' shape.
      margin: the distance beyond which a dissimilar pair costs nothing.
      reduction: ``"mean"``, ``"sum"``, ``"sum_mean"`` or ``"none"``.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``inputs``' shape with
      ``reduction="none"``.

    Raises:
      TypeError: ``inputs`` not floating.
      ValueError: a bad ``reduction`` or ``margin``, ``labels`` not of ``inputs``'
        shape, or concrete labels other than 1 and -1.

    Examples:
      >>> d, y = jnp.array([0.3, 0.3, 2.0]), jnp.array([1, -1, -1])
      >>> print(hinge_embedding_loss(d, y, reduction="none"))  # x; max(0, 1 - x)
      [0.3 0.7 0. ]
    """
    fn = "funcnet.losses.hinge_embedding_loss"
    inputs = _float_array(fn, inputs, "inputs")
    labels = _sign_labels(fn, labels, inputs.shape)
    _check_reduction(fn, reduction)
    margin = _check_number(fn, "margin", margin)  # any real, as torch's
    gap = margin - inputs
    # torch adds both terms, each masked by its own test: a label that is neither 1 nor
    # -1 (possible only under jit) pays both.
    loss = jnp.where(labels != 1, jnp.where(gap >= 0, gap, 0.0), 0.0) + jnp.where(labels != -1, inputs, 0.0)
    return _reduce(fn, loss, reduction)
