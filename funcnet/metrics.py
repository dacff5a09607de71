"""Evaluation metrics as pure functions over explicit state, modelled on MXNet's EvalMetric.

A metric is a :class:`Metric` NamedTuple of three pure functions:

``init() -> state``
    A pytree of running sums and counts (float32 / int32 arrays).
``update(state, ...) -> state``
    Folds one batch in. Jit-able; call it inside your eval/train step.
``compute(state) -> value``
    The metric value (NaN while nothing has been counted).

Because states are plain sums, partial states **add**: the tree-sum of states
updated on disjoint batches equals the state updated on their concatenation.
That is what :func:`merge` uses under ``pmap``::

    def eval_step(params, state, x, y):
        logits = apply(params, x)
        mstate = metric.update(metric.init(), logits, y)
        return metrics.merge(mstate, "batch")        # inside pmap, before compute

Several metrics are combined with :func:`collection` (MXNet's CompositeEvalMetric)::

    metric = metrics.collection(acc=metrics.Accuracy(), center=metrics.Mean())
    s = metric.update(metric.init(), acc=(logits, labels), center=(center_loss_value,))
    metric.compute(s)   # {"acc": ..., "center": ...}

Unlike MXNet's per-batch averages, MSE/MAE/RMSE average over elements, so results
do not depend on how the data were split into batches.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet.core import describe_tree

__all__ = ["Metric", "MetricStateError", "Accuracy", "TopKAccuracy", "Mean", "MSE", "MAE", "RMSE",
           "ConfusionMatrix", "collection", "merge"]


class MetricStateError(ValueError):
    """A metric's ``update``/``compute`` given a state that is not its own (another
    metric's, or a collection's entries mixed up)."""


class Metric(NamedTuple):
    """A metric: ``(init, update, compute)``, each a pure function."""

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
        raise TypeError(f"{fn}: labels must be integer class ids, got dtype {labels.dtype}. "
                        f"Cast them, e.g. labels.astype(jnp.int32).")
    if predictions.ndim == labels.ndim + 1 and predictions.shape[:-1] == labels.shape:
        return predictions, labels, True
    if not need_scores and predictions.shape == labels.shape:
        if not jnp.issubdtype(predictions.dtype, jnp.integer):
            raise TypeError(f"{fn}: predictions of the labels' shape {labels.shape} must be "
                            f"integer class ids, got dtype {predictions.dtype}. Pass scores "
                            f"with a trailing class axis, shape {labels.shape + ('C',)}, to "
                            f"take their argmax.")
        return predictions, labels, False
    want = f"{labels.shape + ('C',)}" + ("" if need_scores else f" (scores) or {labels.shape} (ids)")
    hint = ""
    if predictions.ndim == labels.ndim + 1 and predictions.ndim >= 3 \
            and predictions.shape[:1] + predictions.shape[2:] == labels.shape:
        hint = (" The shapes fit classes on axis 1 (PyTorch's (N, C, d1, ...) layout): metrics "
                "take them last, jnp.moveaxis(predictions, 1, -1).")
    raise ValueError(f"{fn}: predictions of shape {predictions.shape} do not fit labels of "
                     f"shape {labels.shape}: expected {want}.{hint}")


def _check_not_one_hot(fn: str, predictions, labels) -> None:
    """One-hot labels next to scores have the scores' shape: the usual errors would blame
    the predictions' dtype or suggest a cast. Say what the labels look like instead."""
    if not (labels.ndim >= 2 and labels.shape == predictions.shape
            and jnp.issubdtype(predictions.dtype, jnp.floating)):
        return
    values = checks.concrete(labels)
    advice = (f"pass class ids of shape {labels.shape[:-1]} instead, labels.argmax(-1) (metrics "
              f"take integer class ids, the scores' argmax is compared with them)")
    if values is None:
        raise checks.ArgumentError(
            f"{fn}: labels of shape {labels.shape} have the shape of the scores. If they are "
            f"one-hot, {advice}; if the predictions are class ids, give them an integer dtype.")
    if np.isin(values, (0, 1)).all() and (values.sum(axis=-1) == 1).all():
        raise checks.ArgumentError(f"{fn}: labels of shape {labels.shape} look one-hot (a single "
                                   f"1 on the last axis of every row): {advice}.")


def _mask(fn: str, mask, shape):
    if mask is None:
        return jnp.ones(shape, bool)
    mask = _array(fn, mask, "mask")
    try:
        return jnp.broadcast_to(mask != 0, shape)
    except ValueError:
        raise ValueError(f"{fn}: mask of shape {mask.shape} does not broadcast to the labels' "
                         f"shape {shape}.") from None


def _fits(state, want) -> bool:
    """``state`` has ``want``'s structure and leaf shapes (extra leading axes allowed: the
    per-device states a pmapped evaluation returns compute one value per device)."""
    try:
        pairs = list(zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True))
    except ValueError:
        return False
    if jax.tree.structure(state) != jax.tree.structure(want):
        return False
    return all(tuple(jnp.shape(g))[len(jnp.shape(g)) - len(w.shape):] == tuple(w.shape)
               and len(jnp.shape(g)) >= len(w.shape) for g, w in pairs)


def _checked(name: str, init, update, compute) -> Metric:
    """The metric with ``update`` and ``compute`` checking the state they are given:
    another metric's state fails with both structures shown, not with a KeyError."""
    fn = f"funcnet.metrics.{name}"
    want: list = []

    def check(method, state):
        if not want:  # once; init builds small zero arrays, eval_shape none at all
            want.append(jax.eval_shape(init))
        if not _fits(state, want[0]):
            raise MetricStateError(f"{fn}.{method}: the state does not fit this metric: it expects "
                             f"{describe_tree(want[0])}, got {describe_tree(state)}. Pass this "
                             f"metric's init() (or what its last update returned); the state "
                             f"of another metric does not fit.")

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
        return {"correct": state["correct"] + jnp.sum(hit, dtype=jnp.int32),
                "count": state["count"] + jnp.sum(mask, dtype=jnp.int32)}

    def compute(state):
        return _ratio(state["correct"], state["count"])

    return _checked("Accuracy", init, update, compute)


def TopKAccuracy(k: int) -> Metric:
    """Fraction of samples whose label is among the ``k`` highest scores (MXNet ``TopKAccuracy``).

    ``update(state, scores, labels, mask=None)`` with ``scores`` of shape
    ``labels.shape + (C,)`` and ``k <= C``. Ties are broken toward the lower class index
    (``lax.top_k``). ``k=1`` is :func:`Accuracy`.
    """
    fn = "funcnet.metrics.TopKAccuracy"
    k = checks.positive_int(fn, "k", k)

    def init():
        return {"correct": jnp.zeros((), jnp.int32), "count": jnp.zeros((), jnp.int32)}

    def update(state, scores, labels, mask=None):
        scores, labels, _ = _class_ids(fn + ".update", scores, labels, need_scores=True)
        if scores.shape[-1] < k:
            raise ValueError(f"{fn}.update: k={k} exceeds the number of classes "
                             f"{scores.shape[-1]}.")
        _, top = lax.top_k(scores, k)
        mask = _mask(fn + ".update", mask, labels.shape)
        hit = jnp.any(top == labels[..., None], axis=-1) & mask
        return {"correct": state["correct"] + jnp.sum(hit, dtype=jnp.int32),
                "count": state["count"] + jnp.sum(mask, dtype=jnp.int32)}

    def compute(state):
        return _ratio(state["correct"], state["count"])

    return _checked("TopKAccuracy", init, update, compute)


def ConfusionMatrix(num_classes: int) -> Metric:
    """Counts ``m[true, predicted]`` (rows are the true class, as in sklearn).

    ``update(state, predictions, labels, mask=None)`` takes scores or class ids as
    :func:`Accuracy` does. Pairs whose label or prediction is outside
    ``[0, num_classes)`` are not counted. ``compute`` returns the int32 matrix.
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
                raise ValueError(f"{fn}.update: scores have {predictions.shape[-1]} classes, "
                                 f"the matrix {n}.")
            predictions = jnp.argmax(predictions, axis=-1)
        mask = _mask(fn + ".update", mask, labels.shape)
        ok = mask & (labels >= 0) & (labels < n) & (predictions >= 0) & (predictions < n)
        # Flat cell index; uncounted pairs go to cell n*n, which the scatter drops.
        cell = jnp.where(ok, labels * n + predictions, n * n).ravel()
        # A batch split over Explicit mesh axes adds into one whole matrix.
        counts = jnp.zeros((n * n,), jnp.int32).at[cell].add(
            1, mode="drop", out_sharding=_mesh.explicit_sharding(cell, None))
        return state + counts.reshape(n, n)

    def compute(state):
        return state

    return _checked("ConfusionMatrix", init, update, compute)


# --------------------------------------------------------------------------- #
# Averages.
# --------------------------------------------------------------------------- #

def Mean() -> Metric:
    """(Weighted) running mean of values, e.g. a loss (MXNet ``Loss``).

    ``update(state, values, weights=None)``: adds ``sum(values * weights)`` and
    ``sum(weights)`` (weights broadcast to ``values``; default 1 per element).
    State: ``{"total", "weight"}`` float32.
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
                raise ValueError(f"{fn}: weights of shape {weights.shape} do not broadcast "
                                 f"to values of shape {values.shape}.") from None
        return {"total": state["total"] + jnp.sum(values * weights),
                "weight": state["weight"] + jnp.sum(weights)}

    def compute(state):
        return state["total"] / state["weight"]

    return _checked("Mean", init, update, compute)


def _error_metric(name: str, elementwise, finish) -> Metric:
    fn = f"funcnet.metrics.{name}.update"

    def update(state, predictions, labels, mask=None):
        predictions = _array(fn, predictions, "predictions")
        labels = _array(fn, labels, "labels")
        if predictions.shape != labels.shape:
            raise ValueError(f"{fn}: predictions {predictions.shape} and labels "
                             f"{labels.shape} must have the same shape.")
        mask = _mask(fn, mask, labels.shape)
        err = elementwise(predictions.astype(jnp.float32) - labels.astype(jnp.float32))
        return {"total": state["total"] + jnp.sum(jnp.where(mask, err, 0.0)),
                "count": state["count"] + jnp.sum(mask, dtype=jnp.int32)}

    def compute(state):
        return finish(_ratio(state["total"], state["count"]))

    return _checked(name, _counts_state, update, compute)


def MSE() -> Metric:
    """Mean squared error over all (unmasked) elements.

    ``update(state, predictions, labels, mask=None)``, equal shapes.
    """
    return _error_metric("MSE", jnp.square, lambda m: m)


def MAE() -> Metric:
    """Mean absolute error over all (unmasked) elements."""
    return _error_metric("MAE", jnp.abs, lambda m: m)


def RMSE() -> Metric:
    """Root of the mean squared error over all elements (not a mean of per-batch roots)."""
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
            raise MetricStateError(f"{fn}.{method}: the state does not fit this collection: it "
                             f"expects a dict of {sorted(metrics)}, got {describe_tree(state)}. "
                             f"Pass this collection's init() (or what its last update "
                             f"returned).")
        if not want:
            want.append(jax.eval_shape(init))
        for name in names:
            if not _fits(state[name], want[0][name]):
                what = getattr(metrics[name].update, "metric_name", "a user metric")
                raise MetricStateError(f"{fn}.{method}: state[{name!r}] does not fit metric {name!r} "
                                 f"({what}): it expects {describe_tree(want[0][name])}, got "
                                 f"{describe_tree(state[name])}. Are two metrics' states "
                                 f"swapped? Pass this collection's init() (or what its last "
                                 f"update returned).")

    def update(state, **args):
        unknown = sorted(set(args) - set(metrics))
        if unknown:
            raise ValueError(f"{fn}.update: no metric named {unknown}; the collection has "
                             f"{sorted(metrics)}.")
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


def merge(state, axis_name):
    """Sums a metric state over the devices of a ``pmap`` axis (``lax.psum`` of the tree).

    Call it inside ``pmap`` on each device's partial state, then ``compute``: every
    device then holds the state of the whole (global) batch.
    """
    return lax.psum(state, axis_name)  # psum takes the whole tree
