"""Checks ``fit`` makes before its first step.

Mistakes that would otherwise surface only after an epoch of training (at the first
evaluation or the first epoch's end) are found by tracing, never running, the step
and the evaluation: an ``eval_fn`` whose state ``metric`` cannot compute, and keys
callbacks monitor that ``fit`` will never log (public as ``funcnet.loop.LogKeys``).
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet.callbacks import Callback, LearningRateLogger, Profile
from funcnet.errors import MetricStateError
from funcnet.loop._sources import source_for
from funcnet.train import EMA, make_train_step

__all__ = ["LogKeys", "check_before_training", "check_fit_options", "first_batch", "optimizer_note"]


class LogKeys:
    """The keys of fit's epoch logs as known before training, as a callback will see them.

    ``certain``: keys that will be there (``epoch``, ``loss``, ``samples_per_s``,
    ``seconds``, the ``eval_*`` keys, keys added by earlier callbacks). ``has(key)``:
    True, False (it cannot come), or None (cannot tell: an earlier user callback may
    add keys, or the evaluation or the step could not be traced ahead of time).

    ``fit`` builds one per callback and hands it to the callback's ``check_log_keys``
    before the first step; a callback raises there for a key it needs that cannot come.

    Attributes:
      certain: a frozenset of the keys that will be in the logs.
      evaluates: whether fit evaluates after each epoch (``eval_*`` keys may come).

    Examples:
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> class Show(Callback):
      ...     log_keys = ()
      ...     def check_log_keys(self, logs):  # before the first step
      ...         print(type(logs).__name__, sorted(logs.certain))
      ...         print(logs.has("loss"), logs.has("eval_accuracy"), logs.evaluates)
      >>> _ = funcnet.fit(ts, loss_fn, opt, [np.ones((4, 2), np.float32)], callbacks=[Show()],
      ...                 progress=False)
      LogKeys ['epoch', 'loss', 'samples_per_s', 'seconds']
      True False False
    """

    def __init__(self, certain, eval_keys, step_keys, callbacks_after, open_ended=False):
        self.certain = frozenset(certain)
        self.evaluates = eval_keys is None or bool(eval_keys)
        self._eval_known = eval_keys is not None
        self._step_keys = step_keys  # () -> frozenset or None, traced when needed
        self._after = callbacks_after  # the callbacks that run later
        self._open = open_ended

    def has(self, key: str):
        """Whether the logs will hold ``key``: True, False, or None (cannot tell)."""
        if key in self.certain:
            return True
        if self._open:
            return None
        if key.startswith("eval_"):
            return False if self._eval_known else None
        step = self._step_keys()
        return None if step is None else key in step

    def added_later(self, key: str):
        """The name of a later callback that adds ``key``, if one does."""
        return next((type(cb).__name__ for cb in self._after if key in (getattr(cb, "log_keys", None) or ())), None)


def check_before_training(
    train_state, loss_fn, optimizer, train_data, eval_data, eval_fn, metric, callbacks, epochs, step_options=None
) -> None:
    """An eval_fn whose state ``metric`` cannot compute, and keys callbacks monitor that
    fit will never log, fail here, before the first step (``jax.eval_shape``: traced,
    never run). What cannot be known ahead (data that can only be read once, a step
    or evaluation that traces only under pmap, user callbacks that add keys) is let
    through, to fail where it fails today."""
    checks.non_negative_int("fit", "epochs", epochs)
    eval_keys = frozenset()
    if eval_fn is not None:
        eval_keys = _eval_keys(train_state, eval_fn, metric, eval_data)
    step_cache: list = []

    def step_keys():
        if not step_cache:
            step_cache.append(_step_metric_keys(train_state, loss_fn, optimizer, train_data, options))
        return step_cache[0]

    options = step_options or {}
    certain = {"epoch", "loss", "samples_per_s", "seconds"} | (eval_keys or set())
    if _reports_grad_norm(options):
        certain.add("grad_norm")
    open_ended = False
    for i, cb in enumerate(callbacks):
        cb_check = getattr(cb, "check_log_keys", None)
        if cb_check is not None:
            cb_check(LogKeys(certain, eval_keys, step_keys, callbacks[i + 1 :], open_ended))
        added = getattr(cb, "log_keys", None)
        if added is not None:
            certain |= set(added)
        elif getattr(type(cb), "on_epoch_end", None) is not Callback.on_epoch_end:
            open_ended = True  # a callback of its own may add any key


def first_batch(data, name: str = "train_data"):
    """A batch with the shapes of the data's batches, or None when taking one would use
    up data that can be read only once (an iterator): its data source's
    (``_sources._Source.first_batch``). A host batch's leaves are NumPy or JAX arrays
    (``_sources.host_arrays``), so a leaf NumPy cannot read fails here, before training."""
    return source_for(data).first_batch(name)


def _eval_keys(train_state, eval_fn, metric, eval_data):
    """The ``eval_*`` log keys, after checking that ``metric`` computes what eval_fn
    returns; None when eval_fn cannot be traced ahead of time."""
    batch = first_batch(eval_data, "eval_data")
    if batch is None:
        return None
    try:
        out = jax.eval_shape(lambda ts, b: eval_fn(ts.params, ts.state, b), train_state, batch)
    except Exception:  # e.g. a collective that needs pmap: the evaluation will tell
        return None
    try:
        computed = jax.eval_shape(metric.compute, out)
    except MetricStateError as e:
        raise ValueError(
            f"fit: eval_fn returns a state that metric= cannot compute: {e} Pass as "
            f"metric= the metric whose state eval_fn returns (the one whose update "
            f"it calls)."
        ) from e
    except Exception:
        return None
    return frozenset(f"eval_{k}" for k in (computed if isinstance(computed, dict) else {"metric": None}))


def _reports_grad_norm(step_options) -> bool:
    """Whether the step built with these ``make_train_step`` options reports ``grad_norm``
    (its documented default: only when ``clip_grad_norm`` computes it anyway)."""
    asked = step_options.get("grad_norm")
    return step_options.get("clip_grad_norm") is not None if asked is None else bool(asked)


def _step_metric_keys(train_state, loss_fn, optimizer, train_data, step_options):
    """The keys of the step's metrics (``loss``, ``grad_norm`` if reported, and
    ``Aux.metrics``), or None."""
    batch = first_batch(train_data)
    if batch is None:
        return None
    try:
        step = make_train_step(loss_fn, optimizer, **step_options)
        metrics = jax.eval_shape(step, train_state, batch)[1]
    except Exception:
        return None
    return frozenset(metrics)


def check_fit_options(train_state, step_options, eval_on_ema, eval_fn, callbacks, on_nonfinite) -> None:
    """Option combinations that would train without doing what they ask, refused (or, for
    a run ``on_nonfinite`` lets go on, warned about) before the first step: an EMA
    evaluation without an EMA that moves, overlapping ``Profile`` windows, and a
    learning rate that is already NaN/inf at the run's first step."""
    _check_eval_on_ema(train_state, step_options or {}, eval_on_ema, eval_fn)
    _check_profiles([cb for cb in callbacks if isinstance(cb, Profile)])
    _check_first_learning_rate(train_state, callbacks, on_nonfinite)


def _check_eval_on_ema(train_state, step_options, eval_on_ema, eval_fn) -> None:
    """``eval_on_ema=True`` evaluates ``train_state.ema.params``: without an EMA the
    evaluation fails after the first epoch, and with an EMA no step updates (no
    ``ema_decay``) every epoch would log the metrics of the initial params."""
    if not eval_on_ema:
        return
    if eval_fn is None:
        raise checks.ArgumentError(
            "fit: eval_on_ema=True but no evaluation is asked for (eval_data, eval_fn and "
            "metric are None), so it would do nothing. Pass them, or drop eval_on_ema."
        )
    has_ema = isinstance(train_state.ema, EMA)
    decay = step_options.get("ema_decay")
    if has_ema and decay is not None:
        return
    missing = " and ".join(
        ([] if has_ema else ["create the TrainState with TrainState.create(..., ema=True)"])
        + (
            []
            if decay is not None
            else ["pass step_options={'ema_decay': 0.999} (any decay in (0, 1)) in fit's FitOptions"]
        )
    )
    what = (
        "the TrainState keeps no EMA (train_state.ema is ())"
        if not has_ema
        else "step_options has no ema_decay, so no step updates the EMA and every epoch "
        "would evaluate the initial params"
    )
    raise checks.ArgumentError(
        f"fit: eval_on_ema=True evaluates the params' moving average, "
        f"but {what}. To evaluate an EMA, {missing}; or drop "
        f"eval_on_ema to evaluate the params."
    )


def _check_profiles(profiles) -> None:
    """Two ``Profile`` windows of one run that overlap would start a second trace while
    the first runs, which ``jax.profiler`` refuses mid-run. Windows that touch (one
    stops where the next starts) work when the earlier is listed first: callbacks run
    in order, so it stops its trace before the next one starts."""
    for i, a in enumerate(profiles):
        for b in profiles[i + 1 :]:
            if a.start < b.stop and b.start < a.stop:
                raise ValueError(
                    f"fit: Profile(steps=({a.start}, {a.stop})) and Profile(steps=({b.start}, "
                    f"{b.stop})) overlap; jax.profiler runs one trace at a time. Use one "
                    f"Profile over both windows, steps=({min(a.start, b.start)}, "
                    f"{max(a.stop, b.stop)}), or windows that do not overlap."
                )
            if b.stop == a.start:
                raise ValueError(
                    f"fit: Profile(steps=({b.start}, {b.stop})) ends where the earlier-listed "
                    f"Profile(steps=({a.start}, {a.stop})) starts; callbacks run in order, so "
                    f"the second would start its trace before the first stops. List "
                    f"Profile(steps=({b.start}, {b.stop})) first."
                )


def _check_first_learning_rate(train_state, callbacks, on_nonfinite) -> None:
    """A learning rate that is NaN/inf at the run's first step turns the params to NaN on
    that step, and fit would report a non-finite loss a step later without naming the
    rate. Looked at where it is cheap: the hyperparameters ``optax.inject_hyperparams``
    keeps in the optimizer state (the schedule's value at the state's count), and the
    schedule a ``LearningRateLogger`` was given."""
    step = int(jax.device_get(train_state.step))
    bad = [f"{name} = {value}" for name, value in _hyperparams(train_state.opt_state) if not math.isfinite(value)]
    for cb in callbacks:
        schedule = getattr(cb, "schedule", None) if isinstance(cb, LearningRateLogger) else None
        if schedule is not None:
            value = _scalar(schedule(step) if callable(schedule) else schedule)
            if value is not None and not math.isfinite(value):
                bad.append(f"LearningRateLogger's schedule({step}) = {value}")
    if not bad or on_nonfinite == "ignore":
        return
    msg = (
        f"fit: the learning rate is not finite at the run's first step (step {step}): "
        f"{'; '.join(bad)}. The first update would turn every parameter to NaN. Check the "
        f"schedule's value at step {step} (e.g. a warmup over 0 steps divides by zero)."
    )
    if on_nonfinite == "raise":
        raise FloatingPointError(msg + " (options=FitOptions(on_nonfinite='warn') trains on anyway.)")
    warnings.warn(msg, RuntimeWarning, stacklevel=4)


def _scalar(value):
    """A float of a scalar (Python, NumPy, JAX), or None for anything else."""
    try:
        arr = np.asarray(jax.device_get(value))
    except Exception:
        return None
    return float(arr) if arr.ndim == 0 and arr.dtype.kind in "iuf" else None


def _hyperparams(opt_state) -> list:
    """``(path, value)`` of each scalar float hyperparameter ``optax.inject_hyperparams``
    keeps in ``opt_state`` (under a ``hyperparams`` field), e.g. ``('.hyperparams
    ['learning_rate']', 0.001)``."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        names = [str(getattr(k, "name", getattr(k, "key", ""))) for k in path]
        if "hyperparams" in names and np.ndim(leaf) == 0:
            value = _scalar(leaf)
            if value is not None and np.asarray(leaf).dtype.kind == "f":
                found.append((jax.tree_util.keystr(path), value))
    return found


def optimizer_note(optimizer, train_state, step: int) -> str:
    """What fit's non-finite-loss message adds when the optimizer, not the loss, is the
    cause: the update ``optimizer`` makes from ``train_state`` (the state fit started
    from) for gradients of ones is NaN/inf at the optimizer count of the run's first
    update or of the update before ``step`` (the first non-finite loss), which only a
    NaN/inf hyperparameter does (a learning-rate schedule, most often). Traced and run
    once, only after a non-finite loss; '' when finite, or when it cannot be computed."""
    try:
        params = train_state.params
        grads = jax.tree.map(
            lambda p: jnp.ones_like(p) if jnp.issubdtype(jnp.result_type(p), jnp.inexact) else jnp.zeros_like(p), params
        )
        update = jax.jit(lambda state: optimizer.update(grads, state, params)[0])
        first = int(jax.device_get(train_state.step))
        for count in sorted({first, max(first, step - 2)}):
            state = jax.tree.map(lambda x: _with_count(x, count), train_state.opt_state)
            leaves = jax.tree.leaves(jax.device_get(update(state)))
            if not all(np.isfinite(np.asarray(x)).all() for x in leaves if np.asarray(x).dtype.kind in "fc"):
                return (
                    f" The optimizer itself makes a non-finite update for finite "
                    f"gradients at step {count + 1} (optimizer count {count}): its "
                    f"learning rate (schedule) or another hyperparameter is NaN/inf "
                    f"there. Check the schedule's value at {count}, e.g. "
                    f"schedule({count}) (a warmup over 0 steps divides by zero)."
                )
    except Exception:  # a diagnostic only: an optimizer it cannot probe adds nothing
        return ""
    return ""


def _with_count(x, count: int):
    """An optimizer state's integer scalar (optax's update counts) set to ``count``."""
    if np.ndim(x) == 0 and jnp.issubdtype(jnp.result_type(x), jnp.integer):
        return jnp.asarray(count, jnp.result_type(x))
    return x
