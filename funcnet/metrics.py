"""Evaluation metrics as pure functions over explicit state, modelled on MXNet's EvalMetric.

A metric is a :class:`Metric` NamedTuple of three pure functions:

- ``init() -> state``: a pytree of running sums and counts (float32 / int32 arrays).
- ``update(state, ...) -> state``: folds one batch in. Jit-able; call it inside your
  eval/train step.
- ``compute(state) -> value``: the metric value (NaN while nothing has been counted).

Because states are plain sums, partial states **add**: the tree-sum of states
updated on disjoint batches equals the state updated on their concatenation.
That is what :func:`merge` uses under ``pmap`` (:func:`ROCAUC`, whose state is a buffer
of scores, is the one exception: see its docstring):

```
def eval_step(params, state, x, y):
    logits = apply(params, x)
    mstate = metric.update(metric.init(), logits, y)
    return metrics.merge(mstate, "batch")        # inside pmap, before compute
```

Several metrics are combined with :func:`collection` (MXNet's CompositeEvalMetric):

```
metric = metrics.collection(acc=metrics.Accuracy(), center=metrics.Mean())
s = metric.update(metric.init(), acc=(logits, labels), center=(center_loss_value,))
metric.compute(s)   # {"acc": ..., "center": ...}
```

Unlike MXNet's per-batch averages, MSE/MAE/RMSE average over elements, so results
do not depend on how the data were split into batches.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet.core import PyTree, describe_tree
from funcnet.errors import MetricStateError

__all__ = [
    "Metric",
    "MetricStateError",
    "Accuracy",
    "TopKAccuracy",
    "Mean",
    "MSE",
    "MAE",
    "RMSE",
    "ConfusionMatrix",
    "F1",
    "ROCAUC",
    "collection",
    "merge",
]


class Metric(NamedTuple):
    """A metric: ``(init, update, compute)``, each a pure function.

    Attributes:
      init: ``init() -> state``: a fresh state, a pytree of running sums and counts.
      update: ``update(state, ...) -> state``: folds one batch in; pure and jit-able (the
        arguments after ``state`` are the metric's: predictions and labels, values, ...).
      compute: ``compute(state) -> value``: the metric's value (NaN while nothing has
        been counted).

    Examples:
      >>> count = Metric(init=lambda: jnp.zeros((), jnp.int32),
      ...                update=lambda s, x: s + x.size, compute=lambda s: s)
      >>> int(count.compute(count.update(count.init(), jnp.ones((2, 3)))))
      6
    """

    init: Callable[[], Any]
    update: Callable[..., Any]
    compute: Callable[[Any], Any]


# --------------------------------------------------------------------------- #
# Argument checks (static shapes and dtypes: they fire once, at trace time).
# --------------------------------------------------------------------------- #


def _array(fn: str, x, what: str):
    try:
        return jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"{fn}: {what} must be an array, got {type(x).__name__}: {e}") from None


def _class_ids(fn: str, predictions, labels, *, need_scores: bool = False):
    """Predicted class ids of ``labels``' shape, from scores or from ids."""
    predictions = _array(fn, predictions, "predictions")
    labels = _array(fn, labels, "labels")
    _check_not_one_hot(fn, predictions, labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(
            f"{fn}: labels must be integer class ids, got dtype {labels.dtype}. "
            f"Cast them, e.g. labels.astype(jnp.int32)."
        )
    if predictions.ndim == labels.ndim + 1 and predictions.shape[:-1] == labels.shape:
        return predictions, labels, True
    if not need_scores and predictions.shape == labels.shape:
        if not jnp.issubdtype(predictions.dtype, jnp.integer):
            raise TypeError(
                f"{fn}: predictions of the labels' shape {labels.shape} must be "
                f"integer class ids, got dtype {predictions.dtype}. Pass scores "
                f"with a trailing class axis, shape {labels.shape + ('C',)}, to "
                f"take their argmax."
            )
        return predictions, labels, False
    want = f"{labels.shape + ('C',)}" + ("" if need_scores else f" (scores) or {labels.shape} (ids)")
    hint = ""
    if (
        predictions.ndim == labels.ndim + 1
        and predictions.ndim >= 3
        and predictions.shape[:1] + predictions.shape[2:] == labels.shape
    ):
        hint = (
            " The shapes fit classes on axis 1 (PyTorch's (N, C, d1, ...) layout): metrics "
            "take them last, jnp.moveaxis(predictions, 1, -1)."
        )
    raise ValueError(
        f"{fn}: predictions of shape {predictions.shape} do not fit labels of "
        f"shape {labels.shape}: expected {want}.{hint}"
    )


def _check_not_one_hot(fn: str, predictions, labels) -> None:
    """One-hot labels next to scores have the scores' shape: the usual errors would blame
    the predictions' dtype or suggest a cast. Say what the labels look like instead."""
    if not (labels.ndim >= 2 and labels.shape == predictions.shape and jnp.issubdtype(predictions.dtype, jnp.floating)):
        return
    values = checks.concrete(labels)
    advice = (
        f"pass class ids of shape {labels.shape[:-1]} instead, labels.argmax(-1) (metrics "
        f"take integer class ids, the scores' argmax is compared with them)"
    )
    if values is None:
        raise checks.ArgumentError(
            f"{fn}: labels of shape {labels.shape} have the shape of the scores. If they are "
            f"one-hot, {advice}; if the predictions are class ids, give them an integer dtype."
        )
    if np.isin(values, (0, 1)).all() and (values.sum(axis=-1) == 1).all():
        raise checks.ArgumentError(
            f"{fn}: labels of shape {labels.shape} look one-hot (a single 1 on the last axis of every row): {advice}."
        )


def _mask(fn: str, mask, shape):
    if mask is None:
        return jnp.ones(shape, bool)
    mask = _array(fn, mask, "mask")
    try:
        return jnp.broadcast_to(mask != 0, shape)
    except ValueError:
        raise ValueError(f"{fn}: mask of shape {mask.shape} does not broadcast to the labels' shape {shape}.") from None


def _fits(state, want) -> bool:
    """``state`` has ``want``'s structure and leaf shapes (extra leading axes allowed: the
    per-device states a pmapped evaluation returns compute one value per device)."""
    try:
        pairs = list(zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True))
    except ValueError:
        return False
    if jax.tree.structure(state) != jax.tree.structure(want):
        return False
    return all(
        tuple(jnp.shape(g))[len(jnp.shape(g)) - len(w.shape) :] == tuple(w.shape) and len(jnp.shape(g)) >= len(w.shape)
        for g, w in pairs
    )


def _checked(name: str, init, update, compute) -> Metric:
    """The metric with ``update`` and ``compute`` checking the state they are given:
    another metric's state fails with both structures shown, not with a KeyError."""
    fn = f"funcnet.metrics.{name}"
    want: list = []

    def check(method, state):
        if not want:  # once; init builds small zero arrays, eval_shape none at all
            want.append(jax.eval_shape(init))
        if not _fits(state, want[0]):
            raise MetricStateError(
                f"{fn}.{method}: the state does not fit this metric: it expects "
                f"{describe_tree(want[0])}, got {describe_tree(state)}. Pass this "
                f"metric's init() (or what its last update returned); the state "
                f"of another metric does not fit."
            )

    def checked_update(state, *args, **kwargs):
        check("update", state)
        return update(state, *args, **kwargs)

    def checked_compute(state):
        check("compute", state)
        return compute(state)

    checked_update.metric_name = checked_compute.metric_name = fn
    return Metric(init, checked_update, checked_compute)


def _ratio(num, den):
    return num.astype(jnp.float32) / den.astype(jnp.float32)


def _counts_state():
    return {"total": jnp.zeros((), jnp.float32), "count": jnp.zeros((), jnp.int32)}


# --------------------------------------------------------------------------- #
# Classification metrics.
# --------------------------------------------------------------------------- #


def Accuracy() -> Metric:
    """Fraction of correct predictions (MXNet ``Accuracy``).

    ``update(state, predictions, labels, mask=None)``: ``predictions`` are scores
    (logits or probabilities) with one more, trailing, class axis than ``labels``
    — their argmax is the prediction — or integer class ids of ``labels``' shape.
    ``mask`` (broadcast to ``labels``; non-zero = counted) leaves out e.g. padding.
    State: ``{"correct", "count"}`` int32.

    Returns:
      The metric, a :class:`Metric`.

    Examples:
      >>> acc = Accuracy()
      >>> s = acc.update(acc.init(), jnp.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]]),
      ...                jnp.array([0, 1, 1]))
      >>> round(float(acc.compute(s)), 4), int(s["count"])
      (0.6667, 3)
    """
    fn = "funcnet.metrics.Accuracy.update"

    def init():
        return {"correct": jnp.zeros((), jnp.int32), "count": jnp.zeros((), jnp.int32)}

    def update(state, predictions, labels, mask=None):
        predictions, labels, scores = _class_ids(fn, predictions, labels)
        if scores:
            predictions = jnp.argmax(predictions, axis=-1)
        mask = _mask(fn, mask, labels.shape)
        hit = (predictions == labels) & mask
        return {
            "correct": state["correct"] + jnp.sum(hit, dtype=jnp.int32),
            "count": state["count"] + jnp.sum(mask, dtype=jnp.int32),
        }

    def compute(state):
        return _ratio(state["correct"], state["count"])

    return _checked("Accuracy", init, update, compute)


def TopKAccuracy(k: int) -> Metric:
    """Fraction of samples whose label is among the ``k`` highest scores (MXNet ``TopKAccuracy``).

    ``update(state, scores, labels, mask=None)`` with ``scores`` of shape
    ``labels.shape + (C,)`` and ``k <= C``. Ties are broken toward the lower class index
    (``lax.top_k``). ``k=1`` is :func:`Accuracy`.

    Args:
      k: how many of the highest scores count, >= 1.

    Returns:
      The metric, a :class:`Metric`.

    Raises:
      ArgumentError: ``k`` is not a positive int; (in ``update``) ``k`` exceeds the classes.

    Examples:
      >>> top2 = TopKAccuracy(2)
      >>> scores = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])
      >>> float(top2.compute(top2.update(top2.init(), scores, jnp.array([1, 0]))))
      0.5
    """
    fn = "funcnet.metrics.TopKAccuracy"
    k = checks.positive_int(fn, "k", k)

    def init():
        return {"correct": jnp.zeros((), jnp.int32), "count": jnp.zeros((), jnp.int32)}

    def update(state, scores, labels, mask=None):
        scores, labels, _ = _class_ids(fn + ".update", scores, labels, need_scores=True)
        if scores.shape[-1] < k:
            raise ValueError(f"{fn}.update: k={k} exceeds the number of classes {scores.shape[-1]}.")
        _, top = lax.top_k(scores, k)
        mask = _mask(fn + ".update", mask, labels.shape)
        hit = jnp.any(top == labels[..., None], axis=-1) & mask
        return {
            "correct": state["correct"] + jnp.sum(hit, dtype=jnp.int32),
            "count": state["count"] + jnp.sum(mask, dtype=jnp.int32),
        }

    def compute(state):
        return _ratio(state["correct"], state["count"])

    return _checked("TopKAccuracy", init, update, compute)


def ConfusionMatrix(num_classes: int) -> Metric:
    """Counts ``m[true, predicted]`` (rows are the true class, as in sklearn).

    ``update(state, predictions, labels, mask=None)`` takes scores or class ids as
    :func:`Accuracy` does. Pairs whose label or prediction is outside
    ``[0, num_classes)`` are not counted. ``compute`` returns the int32 matrix.

    Args:
      num_classes: the number of classes, >= 1.

    Returns:
      The metric, a :class:`Metric`.

    Raises:
      ArgumentError: ``num_classes`` is not a positive int.

    Examples:
      >>> cm = ConfusionMatrix(2)
      >>> update = jax.jit(cm.update)  # as inside an eval step
      >>> cm.compute(update(cm.init(), jnp.array([0, 1, 1]), jnp.array([0, 0, 1]))).tolist()
      [[1, 1], [0, 1]]
    """
    fn = "funcnet.metrics.ConfusionMatrix"
    num_classes = checks.positive_int(fn, "num_classes", num_classes)
    n = num_classes

    def init():
        return jnp.zeros((n, n), jnp.int32)

    def update(state, predictions, labels, mask=None):
        predictions, labels, scores = _class_ids(fn + ".update", predictions, labels)
        if scores:
            if predictions.shape[-1] != n:
                raise ValueError(f"{fn}.update: scores have {predictions.shape[-1]} classes, the matrix {n}.")
            predictions = jnp.argmax(predictions, axis=-1)
        mask = _mask(fn + ".update", mask, labels.shape)
        ok = mask & (labels >= 0) & (labels < n) & (predictions >= 0) & (predictions < n)
        # Flat cell index; uncounted pairs go to cell n*n, which the scatter drops.
        cell = jnp.where(ok, labels * n + predictions, n * n).ravel()
        # A batch split over Explicit mesh axes adds into one whole matrix.
        counts = (
            jnp.zeros((n * n,), jnp.int32)
            .at[cell]
            .add(1, mode="drop", out_sharding=_mesh.explicit_sharding(cell, None))
        )
        return state + counts.reshape(n, n)

    def compute(state):
        return state

    return _checked("ConfusionMatrix", init, update, compute)


def _bincount(ids, n: int):
    """Counts of ``ids`` in ``[0, n]`` as an int32 ``(n,)`` vector: ``n``, the id given to
    uncounted entries, is dropped (negative ids would wrap: map them to ``n`` first)."""
    ids = ids.ravel()
    # A batch split over Explicit mesh axes adds into one whole vector.
    return jnp.zeros((n,), jnp.int32).at[ids].add(1, mode="drop", out_sharding=_mesh.explicit_sharding(ids, None))


_F1_AVERAGES = ("binary", "micro", "macro", "weighted", None)


def _zero_division(fn: str, value) -> float:
    if not checks.is_real(value) or not (value in (0, 1) or np.isnan(value)):
        raise checks.ArgumentError(
            f"{fn}: zero_division must be 0.0, 1.0 or float('nan') (the "
            f"value of an F1 whose denominator is 0, as scikit-learn's "
            f"zero_division), got {value!r}."
        )
    return float(value)


def F1(
    average: Optional[str] = "binary",
    num_classes: Optional[int] = None,
    *,
    threshold: float = 0.5,
    zero_division: float = 0.0,
) -> Metric:
    """F1 score, ``2 tp / (2 tp + fp + fn)``, as scikit-learn's ``f1_score(y_true, y_pred,
    average=average)``.

    ``update(state, predictions, labels, mask=None)``; ``mask`` (broadcast to
    ``labels``; non-zero = counted) leaves out e.g. padding. The state holds counts,
    so batches and devices add exactly (:func:`merge`).

    ``average="binary"`` (the default, as in sklearn): class 1 is the positive class
    (sklearn's ``pos_label=1``). ``labels`` are 0/1 ints or bools; ``predictions``
    are 0/1 ids or bools of ``labels``' shape, floating scores of ``labels``' shape
    (positive where ``score > threshold``: ``threshold=0.5`` for probabilities, pass
    ``0.0`` for logits), or two-class scores of shape ``labels.shape + (2,)`` (their
    argmax). Pairs whose label or predicted id is not 0 or 1 are not counted.
    State: ``{"tp", "fp", "fn", "count"}`` int32 scalars.

    Multi-class, ``num_classes=C`` required; ``predictions`` are scores with a
    trailing class axis of size ``C`` (their argmax) or integer ids of ``labels``'
    shape, as for :func:`Accuracy`. Pairs with a label or predicted id outside
    ``[0, C)`` are not counted (as :func:`ConfusionMatrix`). Per class ``k``,
    ``f1_k = 2 tp_k / (2 tp_k + fp_k + fn_k)``, and:

    * ``"micro"``: F1 of the counts summed over classes (for single-label data,
      the accuracy);
    * ``"macro"``: the unweighted mean of ``f1_k`` over the classes that occur among
      the counted labels or predictions, as sklearn with ``labels=None`` (a class
      seen in neither is left out, not counted as 0);
    * ``"weighted"``: the mean of ``f1_k`` weighted by each class's number of true
      labels (support);
    * ``None``: the ``(C,)`` vector of ``f1_k`` (sklearn's ``average=None,
      labels=range(C)``; a class seen in neither gets ``zero_division``).

    State: ``{"tp", "fp", "fn"}``, int32 ``(C,)`` vectors.

    ``zero_division`` (0.0, 1.0 or NaN) is the F1 of a class whose denominator is 0
    (never predicted and never the label), as sklearn's argument (its ``"warn"``
    default gives 0.0, without the warning here). ``compute`` is NaN while nothing
    has been counted. Use :func:`ConfusionMatrix` for precision and recall per class.

    Args:
      average: ``"binary"``, ``"micro"``, ``"macro"``, ``"weighted"`` or None.
      num_classes: the number of classes (needed unless ``average="binary"``).
      threshold: the score above which a binary floating prediction is positive.
      zero_division: the F1 of a class with a zero denominator (0.0, 1.0 or NaN).

    Returns:
      The metric, a :class:`Metric`.

    Raises:
      ArgumentError: an unknown ``average``, a missing or contradicting ``num_classes``,
        or a bad ``threshold``/``zero_division``.

    Examples:
      >>> f1 = F1()
      >>> s = jax.jit(f1.update)(f1.init(), jnp.array([1, 1, 0, 0]), jnp.array([1, 0, 1, 0]))
      >>> float(jax.jit(f1.compute)(s))  # tp=1, fp=1, fn=1
      0.5
      >>> f1 = F1("macro", num_classes=3)
      >>> s = jax.jit(f1.update)(f1.init(), jnp.array([0, 1, 2]), jnp.array([0, 1, 2]))
      >>> float(jax.jit(f1.compute)(s))
      1.0
    """
    fn = "funcnet.metrics.F1"
    checks.one_of(fn, "average", average, _F1_AVERAGES)
    zero_division = _zero_division(fn, zero_division)
    threshold = checks.real(fn, "threshold", threshold)
    if average == "binary":
        if num_classes not in (None, 2):
            raise checks.ArgumentError(
                f"{fn}: average='binary' is the F1 of class 1 among 2 classes, got "
                f"num_classes={num_classes!r}. For {num_classes} classes pass "
                f"average='macro', 'micro', 'weighted' or None."
            )
        return _binary_f1(fn, threshold, zero_division)
    if num_classes is None:
        raise checks.ArgumentError(
            f"{fn}: average={average!r} needs the number of classes, e.g. F1({average!r}, num_classes=10)."
        )
    n = checks.positive_int(fn, "num_classes", num_classes)

    def init():
        return {k: jnp.zeros((n,), jnp.int32) for k in ("tp", "fp", "fn")}

    def update(state, predictions, labels, mask=None):
        predictions, labels, scores = _class_ids(fn + ".update", predictions, labels)
        if scores:
            if predictions.shape[-1] != n:
                raise ValueError(
                    f"{fn}.update: scores have {predictions.shape[-1]} classes, the metric num_classes={n}."
                )
            predictions = jnp.argmax(predictions, axis=-1)
        mask = _mask(fn + ".update", mask, labels.shape)
        ok = mask & (labels >= 0) & (labels < n) & (predictions >= 0) & (predictions < n)
        hit = ok & (predictions == labels)
        miss = ok & (predictions != labels)
        return {
            "tp": state["tp"] + _bincount(jnp.where(hit, labels, n), n),
            "fp": state["fp"] + _bincount(jnp.where(miss, predictions, n), n),
            "fn": state["fn"] + _bincount(jnp.where(miss, labels, n), n),
        }

    def compute(state):
        tp, fp, fn_ = (state[k].astype(jnp.float32) for k in ("tp", "fp", "fn"))
        denom = 2 * tp + fp + fn_
        present = denom > 0
        per_class = jnp.where(present, 2 * tp / jnp.where(present, denom, 1), zero_division)
        counted = jnp.sum(tp + fn_, axis=-1)
        if average is None:
            value = per_class
            counted = counted[..., None]
        elif average == "micro":
            value = _ratio(2 * jnp.sum(tp, axis=-1), jnp.sum(denom, axis=-1))
        else:
            weights = present.astype(jnp.float32) if average == "macro" else tp + fn_
            value = jnp.sum(jnp.where(present, per_class, 0.0) * weights, axis=-1) / jnp.sum(weights, axis=-1)
        return jnp.where(counted > 0, value, jnp.nan)

    return _checked("F1", init, update, compute)


def _binary_f1(fn: str, threshold: float, zero_division: float) -> Metric:
    def init():
        return {k: jnp.zeros((), jnp.int32) for k in ("tp", "fp", "fn", "count")}

    def update(state, predictions, labels, mask=None):
        where = fn + ".update"
        predictions, labels = _binary_labels(where, predictions, labels, extra=(2,))
        if predictions.shape == labels.shape + (2,):
            predictions = jnp.argmax(predictions, axis=-1)
        elif jnp.issubdtype(predictions.dtype, jnp.floating):
            predictions = predictions > threshold
        predictions = predictions.astype(jnp.int32)
        mask = _mask(where, mask, labels.shape)
        ok = mask & ((labels == 0) | (labels == 1)) & ((predictions == 0) | (predictions == 1))
        pos, true = ok & (predictions == 1), labels == 1

        def count(x):
            return jnp.sum(x, dtype=jnp.int32)

        return {
            "tp": state["tp"] + count(pos & true),
            "fp": state["fp"] + count(pos & ~true),
            "fn": state["fn"] + count(ok & (predictions == 0) & true),
            "count": state["count"] + count(ok),
        }

    def compute(state):
        tp, fp, fn_ = (state[k].astype(jnp.float32) for k in ("tp", "fp", "fn"))
        denom = 2 * tp + fp + fn_
        value = jnp.where(denom > 0, 2 * tp / jnp.where(denom > 0, denom, 1), zero_division)
        return jnp.where(state["count"] > 0, value, jnp.nan)

    return _checked("F1", init, update, compute)


def _binary_labels(fn: str, predictions, labels, extra=()):
    """Arrays for a binary metric: 0/1 (or bool) labels, predictions of their shape (or
    with the trailing axis ``extra``, when given)."""
    # No one-hot check: 0/1 labels with the scores' shape are the usual binary input.
    predictions = _array(fn, predictions, "predictions")
    labels = _array(fn, labels, "labels")
    if not (jnp.issubdtype(labels.dtype, jnp.integer) or labels.dtype == jnp.bool_):
        raise TypeError(
            f"{fn}: labels must be 0/1 integers or bools, got dtype {labels.dtype}. "
            f"Cast them, e.g. labels.astype(jnp.int32)."
        )
    if predictions.shape == labels.shape or (extra and predictions.shape == labels.shape + extra):
        return predictions, labels.astype(jnp.int32)
    want = f"{labels.shape}" + (f" or {labels.shape + extra}" if extra else "")
    hint = ""
    if not extra and predictions.shape == labels.shape + (2,):
        hint = " For two-class scores or probabilities pass the positive class's column, predictions[..., 1]."
    raise ValueError(
        f"{fn}: predictions of shape {predictions.shape} do not fit labels of "
        f"shape {labels.shape}: expected {want}.{hint}"
    )


def ROCAUC(capacity: Optional[int] = None) -> Metric:
    """Area under the ROC curve of a binary classifier, as scikit-learn's ``roc_auc_score``.

    ``update(state, scores, labels, mask=None)``: ``scores`` (higher means class 1:
    a probability, a logit, any real score) and ``labels`` (0/1 ints or bools) of
    the same shape; ``mask`` (broadcast to ``labels``; non-zero = counted) leaves
    out e.g. padding, and so are labels other than 0 and 1. ``compute`` gives:

    ```
    AUC = (#{(p, q): s_p > s_q} + 0.5 * #{(p, q): s_p == s_q}) / (P * Q)
    ```

    over the pairs of a positive ``p`` and a negative ``q`` (P and Q of them): the
    probability that a random positive outscores a random negative, ties counting
    one half. That is the area under sklearn's ROC curve, ties included (tied scores
    make one diagonal step of the curve). It is NaN while only one class has been
    seen (sklearn raises), when a counted score is NaN, and after an overflow.

    **Why a buffer.** The AUC is a statistic of ranks: where one batch's scores fall
    among another's changes it, so no fixed set of per-batch sums gives it exactly.
    A histogram of scores over fixed thresholds (Keras' ``AUC(num_thresholds=200)``,
    torchmetrics' ``thresholds=``) adds across batches but is only exact when every
    score is one of its thresholds; elsewhere pairs that fall in one bin count as
    ties. This metric keeps the concatenation instead: the state is a fixed-size
    buffer of the scores and labels seen, ``{"scores": float32[capacity],
    "labels": int8[capacity], "count": int32[]}`` (label -1: an empty or uncounted
    slot), filled by ``lax.dynamic_update_slice``, so ``update`` keeps static
    shapes and jit-compiles once, and ``compute`` sorts the buffer and counts the
    pairs exactly in int32 (only the few partial sums of the pair count, and the
    final ratio, are float32).
    ``capacity`` is the most examples (every element of each batch, masked ones
    included) one evaluation may add: e.g. the size of the evaluation set. Going
    past it raises in ``update`` when the state is concrete (not under ``jit``);
    under ``jit`` the state records it and ``compute`` returns NaN.

    Unlike the other metrics' states, buffers do not add: do not :func:`merge`
    (``psum``) them. Under ``pmap``, gather the per-device states instead, e.g.
    ``jax.lax.all_gather(state, axis_name)``: ``compute`` pools the buffers of a
    state with extra leading axes (one per device), giving the AUC of all of them.

    Args:
      capacity: the most examples one evaluation adds (required).

    Returns:
      The metric, a :class:`Metric`.

    Raises:
      ArgumentError: ``capacity`` is missing or not a positive int.

    Examples:
      >>> auc = ROCAUC(capacity=8)
      >>> s = jax.jit(auc.update)(auc.init(), jnp.array([0.1, 0.4, 0.35, 0.8]),
      ...                         jnp.array([0, 0, 1, 1]))
      >>> float(jax.jit(auc.compute)(s))  # sklearn's roc_auc_score gives 0.75 too
      0.75
    """
    fn = "funcnet.metrics.ROCAUC"
    if capacity is None:
        raise checks.ArgumentError(
            f"{fn}: capacity is required: the most examples one evaluation adds (the buffer "
            f"of scores keeps them all, to rank them exactly), e.g. "
            f"ROCAUC(capacity=len(eval_labels))."
        )
    cap = checks.positive_int(fn, "capacity", capacity)

    def init():
        return {
            "scores": jnp.zeros((cap,), jnp.float32),
            "labels": jnp.full((cap,), -1, jnp.int8),
            "count": jnp.zeros((), jnp.int32),
        }

    def update(state, scores, labels, mask=None):
        where = fn + ".update"
        scores, labels = _binary_labels(where, scores, labels)
        if not (
            jnp.issubdtype(scores.dtype, jnp.floating)
            or jnp.issubdtype(scores.dtype, jnp.integer)
            or scores.dtype == jnp.bool_
        ):
            raise TypeError(f"{where}: scores must be real numbers, got dtype {scores.dtype}.")
        mask = _mask(where, mask, labels.shape)
        n = labels.size
        if n > cap:
            raise ValueError(
                f"{where}: a batch of {n} examples does not fit the buffer of "
                f"capacity={cap}. Make the capacity at least the number of "
                f"examples one evaluation adds."
            )
        seen = checks.concrete(state["count"])
        if seen is not None and seen.ndim == 0 and int(seen) + n > cap:
            raise ValueError(
                f"{where}: {int(seen)} examples seen plus this batch of {n} "
                f"exceed capacity={cap}. Make the capacity at least the number "
                f"of examples one evaluation adds, or start from init()."
            )
        counted = mask & ((labels == 0) | (labels == 1))
        new_labels = jnp.where(counted, labels, -1).astype(jnp.int8).ravel()
        start = jnp.minimum(state["count"], cap - n)  # past capacity compute gives NaN anyway
        return {
            "scores": lax.dynamic_update_slice(state["scores"], scores.astype(jnp.float32).ravel(), (start,)),
            "labels": lax.dynamic_update_slice(state["labels"], new_labels, (start,)),
            "count": state["count"] + n,
        }

    def compute(state):
        scores = jnp.reshape(state["scores"], (-1,))
        labels = jnp.reshape(state["labels"], (-1,))
        overflow = jnp.any(state["count"] > cap)
        pos, neg = labels == 1, labels == 0
        order = jnp.argsort(scores)
        ranked = scores[order]
        # negatives_below[i]: negatives among the i lowest scores.
        negatives_below = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(neg[order], dtype=jnp.int32)])
        # Each score's tie group in the sorted order: [lo, hi).
        index = jnp.arange(ranked.shape[0], dtype=jnp.int32)
        differs = ranked[1:] != ranked[:-1]
        lo = lax.cummax(jnp.where(jnp.concatenate([jnp.ones((1,), bool), differs]), index, 0))
        hi = lax.cummin(
            jnp.where(jnp.concatenate([differs, jnp.ones((1,), bool)]), index + 1, ranked.shape[0]), reverse=True
        )
        below, tied = negatives_below[lo], negatives_below[hi] - negatives_below[lo]
        # Twice each positive's wins (ties count 1): ints, summed exactly in chunks small
        # enough for int32; only the chunk sums are added in float32.
        twice = jnp.where(pos[order], 2 * below + tied, 0)
        size = twice.shape[0]
        chunk = max(1, min(size, (2**31 - 1) // max(1, 2 * size)))
        twice = jnp.pad(twice, (0, -size % chunk)).reshape(-1, chunk)
        wins = jnp.sum(jnp.sum(twice, axis=1, dtype=jnp.int32).astype(jnp.float32))
        n_pos = jnp.sum(pos, dtype=jnp.int32).astype(jnp.float32)
        n_neg = jnp.sum(neg, dtype=jnp.int32).astype(jnp.float32)
        auc = wins / (2 * n_pos * n_neg)
        bad = overflow | jnp.any(jnp.isnan(scores) & (pos | neg)) | (n_pos == 0) | (n_neg == 0)
        return jnp.where(bad, jnp.nan, auc)

    return _checked("ROCAUC", init, update, compute)


# --------------------------------------------------------------------------- #
# Averages.
# --------------------------------------------------------------------------- #


def Mean() -> Metric:
    """(Weighted) running mean of values, e.g. a loss (MXNet ``Loss``).

    ``update(state, values, weights=None)``: adds ``sum(values * weights)`` and
    ``sum(weights)`` (weights broadcast to ``values``; default 1 per element).
    State: ``{"total", "weight"}`` float32.

    Returns:
      The metric, a :class:`Metric`.

    Examples:
      >>> mean = Mean()
      >>> s = mean.update(mean.init(), jnp.array([1.0, 2.0, 3.0]))
      >>> s = mean.update(s, jnp.array([10.0]), weights=jnp.array([3.0]))
      >>> float(mean.compute(s))  # (1 + 2 + 3 + 30) / 6
      6.0
    """
    fn = "funcnet.metrics.Mean.update"

    def init():
        return {"total": jnp.zeros((), jnp.float32), "weight": jnp.zeros((), jnp.float32)}

    def update(state, values, weights=None):
        values = _array(fn, values, "values").astype(jnp.float32)
        if weights is None:
            weights = jnp.ones(values.shape, jnp.float32)
        else:
            weights = _array(fn, weights, "weights").astype(jnp.float32)
            try:
                weights = jnp.broadcast_to(weights, values.shape)
            except ValueError:
                raise ValueError(
                    f"{fn}: weights of shape {weights.shape} do not broadcast to values of shape {values.shape}."
                ) from None
        return {"total": state["total"] + jnp.sum(values * weights), "weight": state["weight"] + jnp.sum(weights)}

    def compute(state):
        return state["total"] / state["weight"]

    return _checked("Mean", init, update, compute)


def _error_metric(name: str, elementwise, finish) -> Metric:
    fn = f"funcnet.metrics.{name}.update"

    def update(state, predictions, labels, mask=None):
        predictions = _array(fn, predictions, "predictions")
        labels = _array(fn, labels, "labels")
        if predictions.shape != labels.shape:
            raise ValueError(
                f"{fn}: predictions {predictions.shape} and labels {labels.shape} must have the same shape."
            )
        mask = _mask(fn, mask, labels.shape)
        err = elementwise(predictions.astype(jnp.float32) - labels.astype(jnp.float32))
        return {
            "total": state["total"] + jnp.sum(jnp.where(mask, err, 0.0)),
            "count": state["count"] + jnp.sum(mask, dtype=jnp.int32),
        }

    def compute(state):
        return finish(_ratio(state["total"], state["count"]))

    return _checked(name, _counts_state, update, compute)


def MSE() -> Metric:
    """Mean squared error over all (unmasked) elements.

    ``update(state, predictions, labels, mask=None)``, equal shapes.

    Returns:
      The metric, a :class:`Metric`.

    Examples:
      >>> mse = MSE()
      >>> float(mse.compute(mse.update(mse.init(), jnp.array([1.0, 2.0]), jnp.array([1.0, 4.0]))))
      2.0
    """
    return _error_metric("MSE", jnp.square, lambda m: m)


def MAE() -> Metric:
    """Mean absolute error over all (unmasked) elements.

    Returns:
      The metric, a :class:`Metric`.

    Examples:
      >>> mae = MAE()
      >>> float(mae.compute(mae.update(mae.init(), jnp.array([1.0, 2.0]), jnp.array([1.0, 4.0]))))
      1.0
    """
    return _error_metric("MAE", jnp.abs, lambda m: m)


def RMSE() -> Metric:
    """Root of the mean squared error over all elements (not a mean of per-batch roots).

    Returns:
      The metric, a :class:`Metric`.

    Examples:
      >>> rmse = RMSE()
      >>> s = rmse.update(rmse.init(), jnp.array([0.0, 0.0]), jnp.array([3.0, 4.0]))
      >>> round(float(rmse.compute(s)), 4)  # sqrt((9 + 16) / 2)
      3.5355
    """
    return _error_metric("RMSE", jnp.square, jnp.sqrt)


# --------------------------------------------------------------------------- #
# Combining metrics and devices.
# --------------------------------------------------------------------------- #


def collection(**metrics: Metric) -> Metric:
    """Several named metrics as one (MXNet ``CompositeEvalMetric``).

    The state is a dict by name. ``update(state, name=args, ...)`` passes ``args`` to
    that metric's ``update``: a tuple as positional arguments, a dict as keyword
    arguments, anything else as the single argument (``loss=value`` for a
    :func:`Mean`). Metrics not named in a call keep their state. ``compute``
    returns a dict by name.

    Args:
      **metrics: the metrics, by name.

    Returns:
      The metric, a :class:`Metric` whose state and ``compute`` are dicts by name.

    Raises:
      ValueError: no metric given.
      TypeError: a value that is not a :class:`Metric`.

    Examples:
      >>> metric = collection(acc=Accuracy(), loss=Mean())
      >>> s = metric.update(metric.init(), acc=(jnp.array([0, 1]), jnp.array([0, 0])),
      ...                   loss=jnp.array([0.5, 1.5]))
      >>> {k: float(v) for k, v in metric.compute(s).items()}
      {'acc': 0.5, 'loss': 1.0}
    """
    fn = "funcnet.metrics.collection"
    if not metrics:
        raise ValueError(f"{fn}: give at least one metric, e.g. collection(acc=Accuracy()).")
    for name, m in metrics.items():
        if not isinstance(m, Metric):
            hint = " Call the constructor, e.g. Accuracy()." if callable(m) else ""
            raise TypeError(f"{fn}: {name}= must be a Metric, got {type(m).__name__}.{hint}")

    def init():
        return {name: m.init() for name, m in metrics.items()}

    want: list = []

    def check(method, state, names):
        """The collection's keys, then each named metric's own state, so that a state
        mix-up names the entry rather than failing inside one metric."""
        if not isinstance(state, dict) or set(state) != set(metrics):
            raise MetricStateError(
                f"{fn}.{method}: the state does not fit this collection: it "
                f"expects a dict of {sorted(metrics)}, got {describe_tree(state)}. "
                f"Pass this collection's init() (or what its last update "
                f"returned)."
            )
        if not want:
            want.append(jax.eval_shape(init))
        for name in names:
            if not _fits(state[name], want[0][name]):
                what = getattr(metrics[name].update, "metric_name", "a user metric")
                raise MetricStateError(
                    f"{fn}.{method}: state[{name!r}] does not fit metric {name!r} "
                    f"({what}): it expects {describe_tree(want[0][name])}, got "
                    f"{describe_tree(state[name])}. Are two metrics' states "
                    f"swapped? Pass this collection's init() (or what its last "
                    f"update returned)."
                )

    def update(state, **args):
        unknown = sorted(set(args) - set(metrics))
        if unknown:
            raise ValueError(f"{fn}.update: no metric named {unknown}; the collection has {sorted(metrics)}.")
        check("update", state, args)
        new = dict(state)
        for name, a in args.items():
            if isinstance(a, tuple):
                new[name] = metrics[name].update(state[name], *a)
            elif isinstance(a, dict):
                new[name] = metrics[name].update(state[name], **a)
            else:
                new[name] = metrics[name].update(state[name], a)
        return new

    def compute(state):
        check("compute", state, metrics)
        return {name: m.compute(state[name]) for name, m in metrics.items()}

    update.metric_name = compute.metric_name = fn
    return Metric(init, update, compute)


def merge(state: PyTree, axis_name: Hashable) -> PyTree:
    """Sums a metric state over the devices of a ``pmap`` axis (``lax.psum`` of the tree).

    Call it inside ``pmap`` on each device's partial state, then ``compute``: every
    device then holds the state of the whole (global) batch.

    Args:
      state: a metric state (its sums and counts add).
      axis_name: the mapped axis to sum over.

    Returns:
      The state summed over ``axis_name``, the same on every device.

    Examples:
      >>> acc = Accuracy()
      >>> def per_device(pred, label):  # each device's part of the batch
      ...     return merge(acc.update(acc.init(), pred, label), "devices")
      >>> pred, label = jnp.array([[0, 1], [1, 1]]), jnp.array([[0, 1], [0, 1]])
      >>> s = jax.jit(jax.vmap(per_device, axis_name="devices"))(pred, label)
      >>> s["correct"].tolist(), s["count"].tolist()
      ([3, 3], [4, 4])
    """
    return lax.psum(state, axis_name)  # psum takes the whole tree
