"""Callbacks for :func:`funcnet.loop.fit`: checkpoints, loggers, early stopping.

A callback overrides any of its hooks; each gets the loop's
:class:`funcnet.loop.FitContext`. Callbacks that write files do so from process 0
only, so a multi-process run writes one copy.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import warnings
from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet import checkpoint as ckpt
from funcnet import distributed
from funcnet._loop_position import LoopPosition

__all__ = [
    "Callback",
    "Checkpoint",
    "CSVLogger",
    "JSONLLogger",
    "EarlyStopping",
    "ReduceLROnPlateau",
    "LearningRateLogger",
    "TensorBoardLogger",
    "Profile",
]


class Callback:
    """Hooks called by :func:`funcnet.loop.fit`. Override what you need; all default to no-ops.

    Before training, ``fit`` calls ``check_log_keys(logs)`` with a
    :class:`funcnet.loop.LogKeys`, what the epoch logs will hold when they reach this
    callback: raise there for a key that cannot come (an epoch of training earlier
    than ``on_epoch_end`` would). ``log_keys`` lists the keys a callback adds to the
    logs; None (the default) means unknown, and a callback with its own
    ``on_epoch_end`` may then add any key, so later callbacks cannot be checked.

    ``on_step_begin(ctx, step)`` runs right before the dispatch of global step
    ``step`` (the first of its steps when a dispatch runs several), ``on_step_end``
    right after it with the step count then. ``fit`` calls ``on_step_begin`` only on
    callbacks that override it, so the hook costs nothing per step otherwise.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> class PrintEpoch(Callback):
      ...     log_keys = ()  # adds no log entries
      ...     def on_epoch_end(self, ctx, epoch, logs):
      ...         print(epoch, ctx.step, sorted(logs))
      >>> _ = funcnet.fit(ts, loss_fn, opt, data, epochs=2, callbacks=[PrintEpoch()],
      ...                 progress=False)
      0 2 ['epoch', 'loss', 'samples_per_s', 'seconds']
      1 4 ['epoch', 'loss', 'samples_per_s', 'seconds']
    """

    log_keys = None
    # At an epoch's end fit calls the callbacks in order of this phase (in the given order
    # within one): 0 for those that update logs or their own state, then 1 and 2 for the
    # checkpoints (Checkpoint(best=...), then the others), so that what a checkpoint stores
    # of the other callbacks is their state after this epoch.
    epoch_end_phase = 0

    def checkpoint_state(self, train_state):
        """This callback's state for :class:`Checkpoint` to save with the train state:
        a pytree of arrays (NumPy scalars, or trees shaped like ``train_state``) whose
        structure does not change during a run, or None (stateless, the default).
        ``fit(resume_from=...)`` hands it back to :meth:`restore_checkpoint_state`, so a
        resumed run's callbacks continue as the uninterrupted run's would have."""
        return None

    def restore_checkpoint_state(self, tree) -> None:
        """Takes back what :meth:`checkpoint_state` gave, as restored on resume."""

    def check_log_keys(self, logs): ...
    def on_train_begin(self, ctx): ...
    def on_step_begin(self, ctx, step: int): ...
    def on_step_end(self, ctx, step: int): ...
    def on_epoch_end(self, ctx, epoch: int, logs: dict): ...
    def on_train_end(self, ctx): ...

    def on_train_error(self, ctx, error: BaseException) -> None:
        """Called instead of ``on_train_end`` when ``fit`` raises after ``on_train_begin``
        (in a step, a callback, a KeyboardInterrupt), before the error propagates: to
        release what ``on_train_begin`` acquired (``Profile`` stops its trace). ``error``
        is the exception; raising here adds a note to it and does not replace it."""


class Checkpoint(Callback):
    """Saves the train state and the loop position every ``every_steps`` steps and/or
    at the end of every ``every_epochs`` epochs, keeping this run's last ``keep``.

    ``target`` is a directory or a :class:`funcnet.checkpoint.Checkpointer` (which
    brings its own ``keep``; ``keep``, ``backend`` and ``overwrite`` here are for a
    directory). With a directory, ``backend`` picks the checkpointer: ``"npz"`` (default,
    :class:`funcnet.checkpoint.NpzCheckpointer`: one file per step, written
    synchronously by process 0, no dependency) or ``"orbax"``
    (:class:`funcnet.checkpoint.OrbaxCheckpointer`: sharded state written
    asynchronously, every process writing the shards it holds of the state it is
    handed; fit hands it ``ctx.train_state``, pmap's replicas collapsed to one).
    The run's id comes from ``fit`` (the resumed checkpoint's, or a new one), so a new run refuses a
    directory of another run unless ``overwrite=True``; checkpoints taken after
    ``fit`` saw a non-finite loss are marked non-finite, and ``keep`` never rotates
    away the newest finite one. ``fit(..., resume_from=...)`` continues from the
    latest finite checkpoint with the same parameters, rng and data order as an
    uninterrupted run. Pending asynchronous writes are finished at the end of
    ``fit`` (or call ``self.checkpointer.wait()``).

    Args:
      target: a directory (a path) or a :class:`funcnet.checkpoint.Checkpointer`.
      every_steps: save after every this many global steps; None: not by steps.
      every_epochs: save at the end of every this many epochs; None: not by epochs.
      keep: how many of this run's checkpoints to keep (None: all); for a directory.
      backend: ``"npz"`` or ``"orbax"``; for a directory.
      overwrite: let a new run take over a directory holding another run's checkpoints.
      best: a log key (e.g. ``"eval_loss"``): save at an epoch's end (every
        ``every_epochs``) only when it improved on the best value so far, as Keras's
        ``ModelCheckpoint(monitor=..., save_best_only=True)``; the latest checkpoint is
        then the best one
        (``funcnet.checkpoint.restore_train_state(directory, ts)``). The best value
        is part of every checkpoint's callback states, so a resumed run compares with it.
        Use a second ``Checkpoint`` (another directory) to resume from the latest epoch.
        None (default): save every time.
      mode: ``"min"`` (default: lower is better) or ``"max"``, for ``best``.
      min_delta: the least change of ``best`` that counts as an improvement (>= 0).

    Raises:
      funcnet.errors.ArgumentError: ``every_steps``/``every_epochs`` not a positive int
        or None, or both None (nothing would be saved); ``best`` with ``every_steps``
        (the logs come once an epoch) or without ``every_epochs``.
      ValueError: ``mode`` not ``"min"``/``"max"``; when ``fit`` starts, a ``best`` key
        fit will not log.

    Examples:
      >>> import tempfile
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> directory = tempfile.mkdtemp()
      >>> _ = funcnet.fit(ts, loss_fn, opt, data, epochs=2, callbacks=[Checkpoint(directory)],
      ...                 progress=False)
      >>> sorted(os.listdir(directory))  # one per epoch, named by the global step
      ['ckpt-2.npz', 'ckpt-4.npz']
      >>> resumed, history = funcnet.fit(ts, loss_fn, opt, data, epochs=3,
      ...                                resume_from=directory, progress=False)
      >>> int(resumed.step), [logs["epoch"] for logs in history]  # only epoch 2 was left
      (6, [2])
    """

    log_keys = ()
    epoch_end_phase = 2

    def __init__(
        self,
        target: str | os.PathLike | ckpt.Checkpointer,
        *,
        every_steps: Optional[int] = None,
        every_epochs: Optional[int] = 1,
        keep: Optional[int] = 3,
        backend: str = "npz",
        overwrite: bool = False,
        best: Optional[str] = None,
        mode: str = "min",
        min_delta: float = 0.0,
    ) -> None:
        for what, every in (("every_steps", every_steps), ("every_epochs", every_epochs)):
            if every is not None:  # 0 never saved; -1 saved at every step (step % -1 == 0)
                checks.positive_int("Checkpoint", f"{what} (or None)", every)
        if every_steps is None and every_epochs is None:
            raise checks.ArgumentError(
                "Checkpoint: every_steps=None and every_epochs=None would never save; give at least one of them."
            )
        self.best = None if best is None else _Monitor("Checkpoint", best, mode, min_delta, arg="best")
        if self.best is not None and (every_steps is not None or every_epochs is None):
            raise checks.ArgumentError(
                f"Checkpoint: best={best!r} compares a value fit logs once an epoch, so it "
                f"saves at epochs' ends only; got every_steps={every_steps!r}, "
                f"every_epochs={every_epochs!r}. Use every_epochs (default 1) and no "
                f"every_steps, or a second Checkpoint for saves by steps."
            )
        self.epoch_end_phase = 2 if best is None else 1  # see Callback.epoch_end_phase
        self.every_steps, self.every_epochs, self.keep = every_steps, every_epochs, keep
        self.checkpointer = ckpt.checkpointer_for(
            target, backend=backend, keep=keep, overwrite=overwrite, where="Checkpoint"
        )

    def check_log_keys(self, logs):
        if self.best is not None:
            self.best.check_log_keys(logs)

    def checkpoint_state(self, train_state):
        return None if self.best is None else self.best.tree()

    def restore_checkpoint_state(self, tree) -> None:
        self.best.restore(tree)

    @property
    def directory(self):
        return self.checkpointer.directory

    def on_train_begin(self, ctx):
        self.checkpointer.run_id = ctx.run_id
        if self.checkpointer.every_process_saves or distributed.is_main_process():
            _check_writable("Checkpoint", os.fspath(self.checkpointer.directory), "directory", directory=True)

    def on_step_end(self, ctx, step):
        if self.every_steps and step % self.every_steps == 0:
            self._save(ctx, step)

    def on_epoch_end(self, ctx, epoch, logs):
        if self.every_epochs and (epoch + 1) % self.every_epochs == 0:
            if self.best is None or self.best.update(logs):
                self._save(ctx, ctx.step)

    def on_train_end(self, ctx):
        self.checkpointer.wait()

    def _save(self, ctx, step):
        if self.checkpointer.every_process_saves or distributed.is_main_process():
            train_state = ctx.train_state
            tree = LoopPosition.of(ctx).checkpoint_tree(train_state)
            # fit's loop adds what resuming must check and restore: the data's layout
            # and the callbacks' states (EarlyStopping's best value and wait counter).
            extras = getattr(ctx, "checkpoint_extras", None)
            if extras is not None:
                tree.update(extras(train_state))
            self.checkpointer.save(step, tree, finite=False if ctx.loss_was_nonfinite else None)


def _check_writable(where: str, path: str, name: str, directory: bool = False) -> None:
    """A writer's destination must take a write when fit starts, not fail after the first
    epoch's training (a read-only directory, a path that is a directory)."""
    if "://" in path:  # a remote store (gs://, s3://): its own client reports there
        return
    try:
        if directory:
            os.makedirs(path, exist_ok=True)
            probe = os.path.join(path, f".funcnet-write-probe-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
        else:
            with open(path, "a"):  # creates an empty file, which the writer treats as new
                pass
    except OSError as e:
        raise type(e)(
            e.errno,
            f"{where}: cannot write {name}={path!r} ({e.strerror}); fit checks "
            f"every writer's destination before training. Pass a writable "
            f"{'directory' if directory else 'file path'}.",
        ) from None


class _FileLogger(Callback):
    log_keys = ()

    def __init__(self, path):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def on_train_begin(self, ctx):
        if distributed.is_main_process():
            _check_writable(type(self).__name__, self.path, "path")


class CSVLogger(_FileLogger):
    """Appends one row per epoch to a CSV file (header written when the file is new).

    Args:
      path: the CSV file; its directory is created if missing.

    Raises:
      ValueError: (when ``fit`` starts, or at an epoch's end) the file exists and has
        no column for a key the logs will hold; use a new file or :class:`JSONLLogger`.

    Examples:
      >>> import tempfile
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
      >>> _ = funcnet.fit(ts, loss_fn, opt, data, epochs=2, callbacks=[CSVLogger(path)],
      ...                 progress=False)
      >>> lines = open(path).read().splitlines()
      >>> lines[0], len(lines)  # a header and one row per epoch
      ('epoch,loss,samples_per_s,seconds', 3)
    """

    def check_log_keys(self, logs):
        # Appending to an existing file (a resumed run): its columns must hold every key
        # fit is known to log, or the first epoch's end would fail.
        if distributed.is_main_process():
            _check_writable("CSVLogger", self.path, "path")
        if not distributed.is_main_process() or not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            return
        with open(self.path, newline="") as f:
            fields = next(csv.reader(f), [])
        missing = sorted(logs.certain - set(fields))
        if missing:
            raise ValueError(
                f"CSVLogger: {self.path} has no column for {missing}, which fit "
                f"will log (columns: {fields}). Use a new file, or JSONLLogger for "
                f"logs whose keys change."
            )

    def on_epoch_end(self, ctx, epoch, logs):
        if not distributed.is_main_process():
            return
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        if new:
            fields = list(logs)
        else:  # appending, e.g. after a resume: keep the file's columns
            with open(self.path, newline="") as f:
                fields = next(csv.reader(f))
        if set(logs) - set(fields):
            raise ValueError(
                f"CSVLogger: epoch {epoch} logs {sorted(set(logs) - set(fields))}, "
                f"which {self.path} has no column for (columns: {fields}). Use a new "
                f"file, or JSONLLogger for logs whose keys change."
            )
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            if new:
                writer.writeheader()
            writer.writerow(logs)


class JSONLLogger(_FileLogger):
    """Appends one JSON object per epoch to a file.

    Unlike :class:`CSVLogger`, the epochs' logs may have different keys.

    Args:
      path: the file; its directory is created if missing.

    Examples:
      >>> import tempfile
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> path = os.path.join(tempfile.mkdtemp(), "log.jsonl")
      >>> _ = funcnet.fit(ts, loss_fn, opt, data, epochs=2, callbacks=[JSONLLogger(path)],
      ...                 progress=False)
      >>> [(logs["epoch"], sorted(logs)) for logs in map(json.loads, open(path))]
      [(0, ['epoch', 'loss', 'samples_per_s', 'seconds']),
       (1, ['epoch', 'loss', 'samples_per_s', 'seconds'])]
    """

    def on_epoch_end(self, ctx, epoch, logs):
        if distributed.is_main_process():
            with open(self.path, "a") as f:
                f.write(json.dumps(logs) + "\n")


class _Monitor:
    """A log key watched for improvement, Keras's rule: a value is better when it is below
    ``best - min_delta`` (``mode="min"``) or above ``best + min_delta`` (``"max"``); the
    first value always is. ``EarlyStopping``, ``ReduceLROnPlateau`` and
    ``Checkpoint(best=...)`` share it; ``owner`` names the callback in errors."""

    def __init__(self, owner: str, key, mode: str, min_delta: float, arg: str = "monitor"):
        if mode not in ("min", "max"):
            raise ValueError(f"{owner}: mode must be 'min' or 'max', got {mode!r}.")
        if not isinstance(key, str):
            raise checks.ArgumentError(f"{owner}: {arg} must be a log key (a string, e.g. 'eval_loss'), got {key!r}.")
        # A negative min_delta would count a worse value as an improvement.
        checks.real(owner, "min_delta", min_delta, low=0.0)
        self.owner, self.key, self.mode, self.min_delta = owner, key, mode, min_delta
        self.arg, self.best = arg, None

    def check_log_keys(self, logs):
        """Raises when fit will not log ``key`` (see :meth:`Callback.check_log_keys`)."""
        if logs.has(self.key) is not False:
            return
        if self.key.startswith("eval_") and not logs.evaluates:
            fix = (
                "Fit has no evaluation: pass eval_data, eval_fn and metric (its compute "
                "gives the eval_* keys), or monitor a training key such as 'loss'"
            )
        elif logs.added_later(self.key):
            fix = f"{logs.added_later(self.key)} adds it after this callback: put that one first in callbacks=[...]"
        else:
            fix = "Monitor one of those"
        raise ValueError(
            f"{self.owner}: {self.arg}={self.key!r} is not a key fit will log; "
            f"the epoch logs will have {sorted(logs.certain)}. {fix}."
        )

    def update(self, logs) -> bool:
        """Whether ``logs[key]`` improved on the best so far (which it then becomes)."""
        if self.key not in logs:
            raise KeyError(f"{self.owner}: no {self.key!r} in the epoch logs; have {sorted(logs)}.")
        value = logs[self.key]
        better = self.best is None or (
            value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        )
        if better:
            self.best = value
        return better

    def tree(self) -> dict:
        # float64/int64 host scalars: the monitored value is a Python float, kept exactly.
        # No best yet is 0.0 with has_best=0, not NaN: a checkpoint holding a NaN would be
        # marked non-finite and never resumed from.
        return {
            "best": np.float64(0.0 if self.best is None else self.best),
            "has_best": np.int64(self.best is not None),
        }

    def restore(self, tree) -> None:
        self.best = float(tree["best"]) if bool(tree["has_best"]) else None


class EarlyStopping(Callback):
    """Stops when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs.

    ``restore_best=True`` keeps a copy of the train state at the best epoch and hands
    it back at the end of training, whether the run stopped early or not (Keras's
    ``restore_best_weights=True``; the copy lives where the state does, so it costs
    one more train state of device memory). ``fit`` then returns the best epoch's
    state; the history still lists every epoch run.

    ``fit`` checks before training that ``monitor`` is a key its logs will have (the
    step's metrics, ``eval_*`` from the metric's ``compute``, keys added by callbacks
    before this one); a user callback that adds keys makes unknown keys pass.

    Args:
      monitor: the log key watched, e.g. ``"eval_loss"`` or ``"loss"``.
      patience: epochs without improvement before stopping.
      mode: ``"min"`` (lower is better) or ``"max"``.
      min_delta: the least change that counts as an improvement (>= 0).
      restore_best: hand back the best epoch's train state at the end of training.

    Raises:
      ValueError: ``mode`` not ``"min"``/``"max"``; when ``fit`` starts, a ``monitor``
        fit will not log.
      funcnet.errors.ArgumentError: a ``monitor`` that is not a string, a negative
        ``patience`` or ``min_delta``.
      KeyError: (at an epoch's end) ``monitor`` missing from the logs.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> frozen = optax.sgd(0.0)  # the loss never improves
      >>> stop = EarlyStopping("loss", patience=1)
      >>> _, history = funcnet.fit(ts, loss_fn, frozen, data, epochs=10, callbacks=[stop],
      ...                          progress=False)
      >>> len(history), stop.wait  # the best epoch, then one without improvement
      (2, 1)
      >>> EarlyStopping(mode="lowest")
      Traceback (most recent call last):
      ...
      ValueError: EarlyStopping: mode must be 'min' or 'max', got 'lowest'.
    """

    log_keys = ()

    def __init__(
        self,
        monitor: str = "eval_loss",
        *,
        patience: int = 3,
        mode: str = "min",
        min_delta: float = 0.0,
        restore_best: bool = False,
    ) -> None:
        self._watch = _Monitor("EarlyStopping", monitor, mode, min_delta)
        checks.non_negative_int("EarlyStopping", "patience", patience)
        self.monitor, self.patience, self.mode, self.min_delta = monitor, patience, mode, min_delta
        self.restore_best = checks.flag("EarlyStopping", "restore_best", restore_best)
        self.wait, self.best_state, self.best_epoch = 0, None, None

    @property
    def best(self):
        """The best value of ``monitor`` so far (None before the first epoch)."""
        return self._watch.best

    def check_log_keys(self, logs):
        self._watch.check_log_keys(logs)

    def on_epoch_end(self, ctx, epoch, logs):
        if self._watch.update(logs):
            self.wait = 0
            if self.restore_best:
                self.best_state, self.best_epoch = ctx.train_state, epoch
        else:
            self.wait += 1
            if self.wait >= self.patience:
                ctx.stop_training = True

    def on_train_end(self, ctx):
        if self.restore_best and self.best_state is not None:
            ctx.replace_train_state(self.best_state)

    def checkpoint_state(self, train_state):
        tree = {
            **self._watch.tree(),
            "wait": np.int64(self.wait),
            "best_epoch": np.int64(-1 if self.best_epoch is None else self.best_epoch),
        }
        if self.restore_best:  # the best state itself (one more train state on disk)
            tree["best_state"] = train_state if self.best_state is None else self.best_state
        return tree

    def restore_checkpoint_state(self, tree) -> None:
        self._watch.restore(tree)
        self.wait = int(tree["wait"])
        self.best_epoch = int(tree["best_epoch"]) if int(tree["best_epoch"]) >= 0 else None
        if self.restore_best:
            self.best_state = tree["best_state"] if self.best_epoch is not None else None


class ReduceLROnPlateau(Callback):
    """Multiplies the learning rate by ``factor`` when ``monitor`` has not improved for
    ``patience`` epochs: Keras's ``ReduceLROnPlateau`` (its arguments, defaults and rule)
    on a value fit logs once an epoch, e.g. ``"eval_loss"``.

    At each epoch's end: during ``cooldown`` epochs after a reduction the wait stays 0;
    a value below ``best - min_delta`` (``mode="min"``) resets the wait; otherwise, out of
    cooldown, the wait grows, and at ``patience`` the rate becomes
    ``max(rate * factor, min_lr)`` (if it was above ``min_lr``), the cooldown starts and
    the wait resets.

    The rate is changed in the optimizer's state, so the step is not compiled again: build
    the optimizer with ``optax.inject_hyperparams``, which keeps its hyperparameters there
    (``optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)``; anywhere in an
    ``optax.chain``), and give the rate as a number, not a schedule (a schedule would set
    it again at the next step). ``hyperparam`` names another injected hyperparameter.
    Every injected ``hyperparam`` in the state is scaled (one per model for a TrainState
    of several models). The callback's best value, wait and cooldown are saved with
    :class:`Checkpoint` and restored on resume; the rate itself is in the optimizer state.

    Args:
      monitor: the log key watched (Keras's ``val_loss`` is ``"eval_loss"`` here).
      factor: the rate's multiplier, in (0, 1).
      patience: epochs without improvement before a reduction.
      mode: ``"min"`` (lower is better) or ``"max"``.
      min_delta: the least change that counts as an improvement (>= 0).
      cooldown: epochs after a reduction before the wait counts again.
      min_lr: the rate's floor.
      hyperparam: the injected hyperparameter to scale.

    Raises:
      ValueError: ``mode`` not ``"min"``/``"max"``; when ``fit`` starts, a ``monitor``
        fit will not log, or an optimizer state without an injected ``hyperparam``.
      funcnet.errors.ArgumentError: a ``factor`` outside (0, 1), a negative ``patience``,
        ``cooldown``, ``min_delta`` or ``min_lr``.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net = Dense(1)
      >>> opt = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
      >>> def loss_fn(params, state, x, rng):  # a constant loss: it never improves
      ...     return 0.0 * jnp.sum(params["W"]) + 1.0, funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)]
      >>> plateau = ReduceLROnPlateau("loss", factor=0.5, patience=1)
      >>> ts, _ = funcnet.fit(ts, loss_fn, opt, data, epochs=3, callbacks=[plateau],
      ...                     progress=False)
      >>> round(float(ts.opt_state.hyperparams["learning_rate"]), 6)  # halved twice
      0.025
    """

    log_keys = ()

    def __init__(
        self,
        monitor: str = "eval_loss",
        *,
        factor: float = 0.1,
        patience: int = 10,
        mode: str = "min",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
        hyperparam: str = "learning_rate",
    ) -> None:
        self._watch = _Monitor("ReduceLROnPlateau", monitor, mode, min_delta)
        self.factor = checks.real(
            "ReduceLROnPlateau",
            "factor (the rate's multiplier)",
            factor,
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
        )
        self.patience = checks.non_negative_int("ReduceLROnPlateau", "patience", patience)
        self.cooldown = checks.non_negative_int("ReduceLROnPlateau", "cooldown", cooldown)
        self.min_lr = checks.real("ReduceLROnPlateau", "min_lr", min_lr, low=0.0)
        self.hyperparam = hyperparam
        self.wait, self.cooldown_counter = 0, 0

    @property
    def best(self):
        """The best value of ``monitor`` so far (None before the first epoch)."""
        return self._watch.best

    def check_log_keys(self, logs):
        self._watch.check_log_keys(logs)

    def on_train_begin(self, ctx):
        _scale_hyperparam(ctx.train_state.opt_state, self.hyperparam, lambda v: v)

    def on_epoch_end(self, ctx, epoch, logs):
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._watch.update(logs):
            self.wait = 0
        elif self.cooldown_counter == 0:
            self.wait += 1
            if self.wait >= self.patience:
                ts = ctx.train_state
                reduce = lambda v: np.maximum(v * self.factor, self.min_lr) if v > self.min_lr else v  # noqa: E731
                ctx.replace_train_state(ts._replace(opt_state=_scale_hyperparam(ts.opt_state, self.hyperparam, reduce)))
                self.cooldown_counter, self.wait = self.cooldown, 0

    def checkpoint_state(self, train_state):
        return {**self._watch.tree(), "wait": np.int64(self.wait), "cooldown_counter": np.int64(self.cooldown_counter)}

    def restore_checkpoint_state(self, tree) -> None:
        self._watch.restore(tree)
        self.wait, self.cooldown_counter = int(tree["wait"]), int(tree["cooldown_counter"])


def _scale_hyperparam(opt_state, name: str, fn):
    """``opt_state`` with ``fn`` applied to every injected hyperparameter ``name`` (the
    ``hyperparams`` dicts of ``optax.inject_hyperparams`` states, wherever they are);
    raises when there is none."""
    found = []

    def visit(node):
        hyper = getattr(node, "hyperparams", None)
        if isinstance(hyper, dict) and name in hyper and hasattr(node, "_replace"):
            old = np.asarray(jax.device_get(hyper[name]))
            found.append(old)
            return node._replace(hyperparams={**hyper, name: jnp.asarray(fn(old), old.dtype)})
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            return type(node)(*map(visit, node))
        if isinstance(node, (tuple, list)):
            return type(node)(map(visit, node))
        if isinstance(node, dict):
            return {k: visit(v) for k, v in node.items()}
        return node

    new = visit(opt_state)
    if not found:
        raise ValueError(
            f"ReduceLROnPlateau: the optimizer's state has no injected hyperparameter "
            f"{name!r}, so the callback cannot change it without compiling the step again. "
            f"Build the optimizer with optax.inject_hyperparams, e.g. "
            f"optax.inject_hyperparams(optax.adam)({name}=1e-3), and pass that same optimizer "
            f"to TrainState.create and fit."
        )
    return new


class LearningRateLogger(Callback):
    """Adds ``"lr"``: the optax schedule's value at the current step (or a constant
    learning rate), to each epoch's logs.

    Put it before the loggers that should write ``"lr"`` in ``callbacks=[...]``.

    Args:
      schedule: the optax schedule the optimizer uses (a callable of the step), or a
        number.

    Examples:
      >>> from funcnet.layers import Dense
      >>> schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
      >>> net, opt = Dense(1), optax.sgd(schedule)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> _, history = funcnet.fit(ts, loss_fn, opt, data, epochs=2,
      ...                          callbacks=[LearningRateLogger(schedule)], progress=False)
      >>> [logs["lr"] for logs in history]  # at steps 2 and 4
      [0.5, 0.0]
    """

    log_keys = ("lr",)

    def __init__(self, schedule: Callable[[int], Any] | float) -> None:
        self.schedule = schedule

    def on_epoch_end(self, ctx, epoch, logs):
        lr = self.schedule(ctx.step) if callable(self.schedule) else self.schedule
        logs["lr"] = float(lr)


class TensorBoardLogger(Callback):
    """Writes scalars to TensorBoard event files in ``logdir``.

    Every epoch, each numeric entry of the epoch logs (``loss``, ``grad_norm`` if logged,
    ``eval_*``, ``samples_per_s``, ...) as ``epoch/<key>`` at step ``epoch`` (Keras's
    TensorBoard callback does the same per epoch); with ``every_steps=N``, the latest
    step's metrics (:attr:`funcnet.loop.FitContext.step_metrics`) as ``step/<key>``
    at the global step, every ``N`` steps (reading them waits for that step). Process
    0 writes. The writer is ``tensorboardX``'s ``SummaryWriter`` (the ``tensorboard``
    extra: ``pip install tensorboardX``), which needs neither TensorFlow nor
    TensorBoard itself; view with ``tensorboard --logdir LOGDIR``.

    Args:
      logdir: the directory of the event files (created when ``fit`` starts).
      every_steps: also write the step metrics every this many steps; None: per epoch
        only.

    Raises:
      ImportError: tensorboardX is not installed.
      funcnet.errors.ArgumentError: ``every_steps`` not a positive int or None.

    Examples:
      >>> import tempfile
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> logdir = tempfile.mkdtemp()
      >>> _ = funcnet.fit(ts, loss_fn, opt, data, callbacks=[TensorBoardLogger(logdir)],
      ...                 progress=False)
      >>> [name.split(".")[:3] for name in os.listdir(logdir)]
      [['events', 'out', 'tfevents']]
    """

    log_keys = ()

    def __init__(self, logdir: str | os.PathLike, *, every_steps: Optional[int] = None) -> None:
        if every_steps is not None:
            every_steps = checks.positive_int("TensorBoardLogger", "every_steps (or None)", every_steps)
        if importlib.util.find_spec("tensorboardX") is None:  # fail here, not mid-training
            raise ImportError(
                "TensorBoardLogger needs tensorboardX: pip install tensorboardX (or funcnet's 'tensorboard' extra)."
            )
        self.logdir, self.every_steps = str(logdir), every_steps
        self._writer = None

    def on_train_begin(self, ctx):
        if distributed.is_main_process():
            from tensorboardX import SummaryWriter

            _check_writable("TensorBoardLogger", self.logdir, "logdir", directory=True)
            self._writer = SummaryWriter(self.logdir)

    def on_step_end(self, ctx, step):
        if self._writer is not None and self.every_steps and step % self.every_steps == 0:
            for key, value in ctx.step_metrics.items():
                self._writer.add_scalar(f"step/{key}", value, step)

    def on_epoch_end(self, ctx, epoch, logs):
        if self._writer is None:
            return
        for key, value in logs.items():
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(f"epoch/{key}", float(value), epoch)
        self._writer.flush()

    def on_train_end(self, ctx):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class Profile(Callback):
    """Traces global steps ``start < step <= stop`` with ``jax.profiler`` into ``logdir``.

    The trace starts after step ``start`` and stops after step ``stop`` (waiting for
    the device to finish them), so it holds those steps; open it with TensorBoard's
    profile plugin or Perfetto (``.xplane.pb`` under ``logdir/plugins/profile``).
    Each dispatch in the window runs inside ``jax.profiler.StepTraceAnnotation("train",
    step_num=step)``, the step markers the profiler's step-time view groups by.
    With several steps per dispatch, ``fit`` ends a dispatch at ``start`` and at
    ``stop`` (``dispatch_edges``), so even a window inside one of its usual dispatches
    is traced, and the trace holds the window's dispatches, each marked with its first
    step; the other dispatches keep their size. A window that ends past the run's last
    step is warned about at the start, one the run never reached at the end. A ``fit``
    that raises inside the window stops the trace (``on_train_error``), so a later
    trace in the process can start; another trace already running in the process is
    an error naming ``jax.profiler.stop_trace``. Overlapping windows in one ``fit`` are
    refused before training.

    Args:
      logdir: the directory the trace is written to.
      steps: ``(start, stop)``, the global steps ``start < step <= stop`` traced.

    Raises:
      funcnet.errors.ArgumentError: ``steps`` not two ints with ``0 <= start < stop``.

    Examples:
      >>> import tempfile
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> data = [np.ones((4, 2), np.float32)] * 2  # two batches an epoch
      >>> logdir = tempfile.mkdtemp()
      >>> _ = funcnet.fit(ts, loss_fn, opt, data, callbacks=[Profile(logdir, steps=(0, 1))],
      ...                 progress=False)
      >>> any(name.endswith(".xplane.pb") for _, _, names in os.walk(logdir) for name in names)
      True
      >>> Profile(logdir, steps=(3, 3))
      Traceback (most recent call last):
      ...
      funcnet.errors.ArgumentError: Profile: steps must be (start, stop) with 0 <= start < stop, ...
    """

    log_keys = ()

    def __init__(self, logdir: str | os.PathLike, steps: Tuple[int, int] = (1, 3)) -> None:
        if not (
            isinstance(steps, (tuple, list))
            and len(steps) == 2
            and all(checks.is_int(s) for s in steps)
            and 0 <= steps[0] < steps[1]
        ):
            raise checks.ArgumentError(
                f"Profile: steps must be (start, stop) with 0 <= start < stop, e.g. (10, 15); got {steps!r}."
            )
        self.logdir, self.start, self.stop = str(logdir), int(steps[0]), int(steps[1])
        self.every_steps = None  # called between dispatches; fit keeps its dispatch size
        # ...except that a dispatch ends at these global steps: the trace starts and stops
        # between dispatches, and a window inside one would otherwise never start.
        self.dispatch_edges = (self.start, self.stop)
        self._on = False
        self._traced, self._first = False, 0  # whether this run traced; its first step
        self._mark = None  # the open StepTraceAnnotation of the dispatch in flight

    def on_train_begin(self, ctx):
        # Checked on every process: each writes its own host's trace into logdir.
        _check_writable("Profile", self.logdir, "logdir", directory=True)
        planned = ctx.planned_steps
        if planned is not None and self.stop > planned:
            warnings.warn(
                f"Profile: the window ends at step {self.stop}, past this run's "
                f"last step ({planned}); the trace will stop at the end of training.",
                stacklevel=2,
            )
        self._traced, self._first = False, ctx.host_step
        if ctx.host_step >= self.start and ctx.host_step < self.stop:
            self._begin()

    def _begin(self):
        try:
            jax.profiler.start_trace(self.logdir)
        except RuntimeError as e:
            raise RuntimeError(
                f"Profile(steps=({self.start}, {self.stop})): jax.profiler.start_trace failed "
                f"({e}). jax.profiler runs one trace at a time per process, and another one "
                f"is running (started by jax.profiler.start_trace or jax.profiler.trace and "
                f"never stopped). Call jax.profiler.stop_trace() before fit, or drop the "
                f"other trace."
            ) from e
        self._on = self._traced = True

    def on_step_begin(self, ctx, step):
        if self._on:
            self._mark = jax.profiler.StepTraceAnnotation("train", step_num=step)
            self._mark.__enter__()

    def on_step_end(self, ctx, step):
        if self._mark is not None:  # closed before the trace may stop below
            self._mark.__exit__(None, None, None)
            self._mark = None
        if not self._on and self.start <= step < self.stop:
            self._begin()
        elif self._on and step >= self.stop:
            self._end(ctx)

    def _end(self, ctx):
        ctx.wait()
        jax.profiler.stop_trace()
        self._on = False

    def on_train_end(self, ctx):
        if self._on:
            self._end(ctx)
        elif not self._traced:
            warnings.warn(
                f"Profile: the window steps=({self.start}, {self.stop}) holds none "
                f"of this run's steps ({self._first + 1} to {ctx.host_step}), so "
                f"nothing was traced. fit's global steps continue the train state's "
                f"step (a resumed run's too): pick a window inside the run.",
                stacklevel=2,
            )

    def on_train_error(self, ctx, error):
        """Stops the trace of a fit that raised inside the window (what it traced is
        written): a trace left running would make every later trace in the process
        fail."""
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        if self._on:
            self._on = False
            try:
                ctx.wait()  # the failure may have left no state to wait for
            except Exception:
                pass
            jax.profiler.stop_trace()
