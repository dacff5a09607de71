"""Checks ``fit`` makes before its first step.

Mistakes that would otherwise surface only after an epoch of training (at the first
evaluation or the first epoch's end) are found by tracing, never running, the step
and the evaluation: an ``eval_fn`` whose state ``metric`` cannot compute, and keys
callbacks monitor that ``fit`` will never log (public as ``funcnet.loop.LogKeys``).
"""

from __future__ import annotations

import jax

from funcnet import _checks as checks
from funcnet import data as data_lib
from funcnet.callbacks import Callback
from funcnet.errors import MetricStateError
from funcnet.train import make_train_step

__all__ = ["LogKeys", "check_before_training", "first_batch"]


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
        self._step_keys = step_keys          # () -> frozenset or None, traced when needed
        self._after = callbacks_after         # the callbacks that run later
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
        return next((type(cb).__name__ for cb in self._after
                     if key in (getattr(cb, "log_keys", None) or ())), None)


def check_before_training(train_state, loss_fn, optimizer, train_data, eval_data, eval_fn,
                           metric, callbacks, epochs, step_options=None) -> None:
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
            step_cache.append(_step_metric_keys(train_state, loss_fn, optimizer, train_data,
                                                options))
        return step_cache[0]

    options = step_options or {}
    certain = {"epoch", "loss", "samples_per_s", "seconds"} | (eval_keys or set())
    if _reports_grad_norm(options):
        certain.add("grad_norm")
    open_ended = False
    for i, cb in enumerate(callbacks):
        cb_check = getattr(cb, "check_log_keys", None)
        if cb_check is not None:
            cb_check(LogKeys(certain, eval_keys, step_keys, callbacks[i + 1:], open_ended))
        added = getattr(cb, "log_keys", None)
        if added is not None:
            certain |= set(added)
        elif getattr(type(cb), "on_epoch_end", None) is not Callback.on_epoch_end:
            open_ended = True  # a callback of its own may add any key


def first_batch(data):
    """A batch with the shapes of the data's batches, or None when taking one would use
    up data that can be read only once (an iterator)."""
    if isinstance(data, data_lib.DeviceData):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct((data.batch_size,) + a.shape[1:],
                                                           a.dtype), data.arrays)
    if callable(data):
        data = data(0)
    elif iter(data) is data:
        return None
    return next(iter(data), None)


def _eval_keys(train_state, eval_fn, metric, eval_data):
    """The ``eval_*`` log keys, after checking that ``metric`` computes what eval_fn
    returns; None when eval_fn cannot be traced ahead of time."""
    batch = first_batch(eval_data)
    if batch is None:
        return None
    try:
        out = jax.eval_shape(lambda ts, b: eval_fn(ts.params, ts.state, b), train_state, batch)
    except Exception:  # e.g. a collective that needs pmap: the evaluation will tell
        return None
    try:
        computed = jax.eval_shape(metric.compute, out)
    except MetricStateError as e:
        raise ValueError(f"fit: eval_fn returns a state that metric= cannot compute: {e} Pass as "
                         f"metric= the metric whose state eval_fn returns (the one whose update "
                         f"it calls).") from e
    except Exception:
        return None
    return frozenset(f"eval_{k}" for k in (computed if isinstance(computed, dict)
                                           else {"metric": None}))


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
