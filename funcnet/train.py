"""Training: the state a step carries, the pure step, and an optional ``fit`` loop.

The step is a pure function ``(train_state, batch) -> (train_state, metrics)``.
Wrap it in ``jax.jit`` (one device) or ``jax.pmap`` (``axis_name`` given; one
replica per device). :func:`fit` is a convenience on top: everything it does can
be written by hand with the step, and the examples show both.

The loss function
-----------------
``loss_fn(params, state, batch, rng) -> (loss, aux)``, where ``state`` is the
layer state (e.g. BatchNorm statistics) and ``aux`` is an :class:`Aux`:
``Aux(state=new_layer_state, loss_state=..., metrics={...})``. When the
:class:`TrainState` carries loss state (e.g. center-loss centers), it is passed
as a keyword: ``loss_fn(params, state, batch, rng, loss_state=centers)``, and the
new value must come back in ``Aux.loss_state``. ``Aux.metrics`` are scalars the
step returns next to ``"loss"`` (averaged over devices under pmap).
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import checkpoint as ckpt
from funcnet import metrics as metrics_lib
from funcnet import parallel
from funcnet.core import as_layer

__all__ = ["TrainState", "Aux", "make_train_step", "make_eval_step", "fit", "Callback",
           "Checkpoint", "CSVLogger", "JSONLLogger", "EarlyStopping", "LearningRateLogger"]


class TrainState(NamedTuple):
    """Everything a training step reads and writes; a pytree (jit/pmap/checkpoint it as is).

    Attributes:
      params: trainable parameters (what ``optax`` updates).
      state: layer state (e.g. BatchNorm running statistics), ``()`` if none.
      opt_state: the optimizer's state.
      step: number of steps taken (int32 scalar).
      rng: the key the next step splits for its randomness (dropout).
      loss_state: state kept by the loss (e.g. center-loss centers), ``()`` if none.
    """

    params: Any
    state: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    loss_state: Any = ()

    @classmethod
    def create(cls, layer, optimizer: optax.GradientTransformation, rng, input_shape, *,
               loss_state=()) -> "TrainState":
        """Initialises ``layer`` for ``input_shape`` and the optimizer on its params."""
        init_key, rng = jax.random.split(rng)
        _, params, state = as_layer(layer, "TrainState.create").init(init_key, input_shape)
        return cls(params, state, optimizer.init(params), jnp.zeros((), jnp.int32), rng, loss_state)


class Aux(NamedTuple):
    """What a loss function returns next to the loss."""

    state: Any = ()
    loss_state: Any = ()
    metrics: dict = {}


def _as_aux(aux, where) -> Aux:
    if isinstance(aux, Aux):
        return aux
    if isinstance(aux, dict) and "state" in aux and set(aux) <= set(Aux._fields):
        return Aux(**aux)
    raise TypeError(f"{where}: loss_fn must return (loss, funcnet.train.Aux(state=new_state, ...)), "
                    f"got aux of type {type(aux).__name__}. Wrap the new layer state: "
                    f"return loss, Aux(state=new_state).")


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *,
                    axis_name: Optional[str] = None) -> Callable:
    """Builds ``step(train_state, batch) -> (train_state, metrics)``, pure and unjitted.

    Per step: split ``train_state.rng``; compute ``value_and_grad`` of ``loss_fn``;
    under ``axis_name`` (inside ``jax.pmap``) ``lax.pmean`` the gradients, the
    metrics and the floating layer state, and give each device its own dropout key
    (``fold_in`` of the device index); apply the optax update. ``metrics`` is
    ``{"loss": loss, **aux.metrics}``.
    """

    def step(train_state: TrainState, batch):
        rng, key = jax.random.split(train_state.rng)
        if axis_name is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
        has_loss_state = jax.tree.structure(train_state.loss_state) != jax.tree.structure(())

        def objective(params):
            if has_loss_state:
                return loss_fn(params, train_state.state, batch, key, loss_state=train_state.loss_state)
            return loss_fn(params, train_state.state, batch, key)

        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(train_state.params)
        aux = _as_aux(aux, "make_train_step")
        if "loss" in aux.metrics:
            raise ValueError("make_train_step: Aux.metrics may not contain 'loss'; the step "
                             "reports the loss_fn's value under that name. Rename the metric.")
        metrics = {"loss": loss, **aux.metrics}
        new_state = aux.state
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
            metrics = jax.lax.pmean(metrics, axis_name)
            # Keeps replicas identical when a stateful layer or loss was not synced itself
            # (e.g. center_loss called without axis_name); a no-op for synced state.
            new_state = _pmean_floating(new_state, axis_name)
            if has_loss_state:
                aux = aux._replace(loss_state=_pmean_floating(aux.loss_state, axis_name))
        updates, opt_state = optimizer.update(grads, train_state.opt_state, train_state.params)
        params = optax.apply_updates(train_state.params, updates)
        new = TrainState(params, new_state, opt_state, train_state.step + 1, rng,
                         aux.loss_state if has_loss_state else train_state.loss_state)
        return new, metrics

    return step


def _pmean_floating(tree, axis_name):
    return jax.tree.map(
        lambda x: jax.lax.pmean(x, axis_name) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def make_eval_step(metric_fn: Callable, *, axis_name: Optional[str] = None) -> Callable:
    """Builds ``eval_step(train_state, batch) -> metric_state``.

    ``metric_fn(params, state, batch)`` returns the metric state of one batch (e.g.
    ``metric.update(metric.init(), logits, labels)`` for a ``funcnet.metrics``
    metric). States are sums and counts, so batches combine by adding them; under
    ``axis_name`` the step ``psum``-s them so every device holds the global value.
    """

    def eval_step(train_state: TrainState, batch):
        out = metric_fn(train_state.params, train_state.state, batch)
        return metrics_lib.merge(out, axis_name) if axis_name is not None else out

    return eval_step


# --------------------------------------------------------------------------- #
# fit
# --------------------------------------------------------------------------- #

class FitContext:
    """What callbacks see: the loop's position and a way to stop it.

    ``train_state`` is the current state on the host's default device (replicas
    are collapsed to one); reading it forces the pending steps to finish.
    """

    def __init__(self, loop):
        self._loop = loop
        self.stop_training = False
        self.epoch = 0
        self.batch_in_epoch = 0
        self.history: list = []
        self.host_step = 0  # steps taken, counted on the host (reading the device would sync)

    @property
    def train_state(self) -> TrainState:
        return self._loop.host_state()

    @property
    def step(self) -> int:
        return self.host_step


class Callback:
    """Hooks called by :func:`fit`. Override what you need; all default to no-ops."""

    def on_train_begin(self, ctx: FitContext): ...
    def on_step_end(self, ctx: FitContext, step: int): ...
    def on_epoch_end(self, ctx: FitContext, epoch: int, logs: dict): ...
    def on_train_end(self, ctx: FitContext): ...


class Checkpoint(Callback):
    """Saves the train state and the loop position every ``every_steps`` steps and/or
    at the end of every ``every_epochs`` epochs, keeping the last ``keep``.

    Only process 0 writes. ``fit(..., resume_from=directory)`` continues from the
    latest checkpoint with the same parameters, rng and data order as an
    uninterrupted run.
    """

    def __init__(self, directory, *, every_steps: Optional[int] = None,
                 every_epochs: Optional[int] = 1, keep: Optional[int] = 3):
        self.directory, self.every_steps, self.every_epochs, self.keep = directory, every_steps, every_epochs, keep

    def on_step_end(self, ctx, step):
        if self.every_steps and step % self.every_steps == 0:
            self._save(ctx, step)

    def on_epoch_end(self, ctx, epoch, logs):
        if self.every_epochs and (epoch + 1) % self.every_epochs == 0:
            self._save(ctx, ctx.step)

    def _save(self, ctx, step):
        if parallel.is_main_process():
            ckpt.save(self.directory, _position_tree(ctx), step, keep=self.keep)


class _FileLogger(Callback):
    def __init__(self, path):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)


class CSVLogger(_FileLogger):
    """Appends one row per epoch to a CSV file (header written when the file is new)."""

    def on_epoch_end(self, ctx, epoch, logs):
        if not parallel.is_main_process():
            return
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        if new:
            fields = list(logs)
        else:  # appending, e.g. after a resume: keep the file's columns
            with open(self.path, newline="") as f:
                fields = next(csv.reader(f))
        if set(logs) - set(fields):
            raise ValueError(f"CSVLogger: epoch {epoch} logs {sorted(set(logs) - set(fields))}, "
                             f"which {self.path} has no column for (columns: {fields}). Use a new "
                             f"file, or JSONLLogger for logs whose keys change.")
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            if new:
                writer.writeheader()
            writer.writerow(logs)


class JSONLLogger(_FileLogger):
    """Appends one JSON object per epoch to a file."""

    def on_epoch_end(self, ctx, epoch, logs):
        if parallel.is_main_process():
            with open(self.path, "a") as f:
                f.write(json.dumps(logs) + "\n")


class EarlyStopping(Callback):
    """Stops when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs."""

    def __init__(self, monitor: str = "eval_loss", *, patience: int = 3, mode: str = "min",
                 min_delta: float = 0.0):
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}.")
        self.monitor, self.patience, self.mode, self.min_delta = monitor, patience, mode, min_delta
        self.best, self.wait = None, 0

    def on_epoch_end(self, ctx, epoch, logs):
        if self.monitor not in logs:
            raise KeyError(f"EarlyStopping: no {self.monitor!r} in the epoch logs; have {sorted(logs)}.")
        value = logs[self.monitor]
        better = (self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                        else value > self.best + self.min_delta))
        if better:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                ctx.stop_training = True


class LearningRateLogger(Callback):
    """Adds ``"lr"``: the optax schedule's value at the current step (or a constant
    learning rate), to each epoch's logs."""

    def __init__(self, schedule):
        self.schedule = schedule

    def on_epoch_end(self, ctx, epoch, logs):
        lr = self.schedule(ctx.step) if callable(self.schedule) else self.schedule
        logs["lr"] = float(lr)


def _position_tree(ctx):
    return {"train_state": ctx.train_state, "epoch": np.int64(ctx.epoch),
            "batch_in_epoch": np.int64(ctx.batch_in_epoch)}


class _Loop:
    """Holds the (possibly replicated) state between steps; keeps the host out of the way."""

    def __init__(self, train_state, n_devices):
        self.n = n_devices
        # The step donates its input buffers; copying once keeps the caller's state alive.
        self.state = (parallel.replicate(train_state, n_devices) if n_devices
                      else jax.tree.map(jnp.copy, train_state))

    def host_state(self):
        # A copy: the next step donates self.state's buffers, and a callback may keep this.
        return parallel.unreplicate(self.state) if self.n else jax.tree.map(jnp.copy, self.state)

    def put_batch(self, batch):
        return parallel.shard(batch, self.n) if self.n else batch


def _iterate(data, epoch):
    return iter(data(epoch) if callable(data) else data)


def _batch_size(batch) -> int:
    return int(jax.tree.leaves(batch)[0].shape[0])


def fit(train_state: TrainState, loss_fn: Callable, optimizer: optax.GradientTransformation,
        train_data, *, epochs: int = 1, eval_data=None, eval_fn: Optional[Callable] = None,
        metric=None, devices: Optional[int] = None, callbacks: Iterable[Callback] = (),
        progress: Optional[bool] = None, log_every: int = 50, resume_from=None,
        print_fn: Optional[Callable[[str], None]] = None):
    """Trains for ``epochs`` epochs; returns ``(train_state, history)``.

    Args:
      train_state: from :meth:`TrainState.create`.
      loss_fn, optimizer: as for :func:`make_train_step`.
      train_data: ``train_data(epoch)`` returning an iterable of batches, or an
        iterable re-iterated every epoch. Use the callable form with a seeded
        shuffle (``funcnet.data.batches(..., rng=seed, epoch=epoch)``) when you want
        resuming to reproduce the data order.
      eval_data, eval_fn, metric: evaluation after every epoch. ``eval_fn(params,
        state, batch)`` returns a metric state of ``metric`` (a ``funcnet.metrics``
        metric or collection); batch states are added and ``metric.compute`` gives
        the ``eval_*`` entries of the logs.
      devices: ``None`` trains on one device with ``jax.jit``; ``N`` replicates the
        state on N local devices and runs the ``jax.pmap`` step (gradients averaged
        with ``pmean``); every batch is split over the devices.
      callbacks: :class:`Callback` instances (checkpoints, loggers, early stopping),
        called in order: put callbacks that add log entries (:class:`LearningRateLogger`)
        before the loggers that write them.
      progress: a tqdm progress bar with loss and samples/s. ``None``: on when
        stderr is a terminal and tqdm is installed; ``False``: off.
      log_every: steps between progress-bar refreshes (each one waits for the
        device, so not every step).
      resume_from: a checkpoint directory written by :class:`Checkpoint`; when it
        holds a checkpoint, training continues from it (state, rng, epoch, and the
        position inside the epoch).
      print_fn: if given (e.g. ``print``), receives one summary line per epoch.

    History: one dict per epoch: ``epoch``, ``loss`` (mean over the epoch's steps),
    the step's other metrics, ``eval_*``, ``samples_per_s``, ``seconds``.
    """
    if (eval_data is None) != (eval_fn is None) or (eval_fn is not None and metric is None):
        raise ValueError("fit: evaluation needs eval_data, eval_fn and metric together.")
    callbacks = list(callbacks)
    start_epoch, skip = 0, 0
    if resume_from is not None and ckpt.latest_step(resume_from) is not None:
        target = {"train_state": jax.device_get(train_state), "epoch": np.int64(0),
                  "batch_in_epoch": np.int64(0)}
        restored = ckpt.restore(resume_from, target=target)
        train_state = restored["train_state"]
        start_epoch, skip = int(restored["epoch"]), int(restored["batch_in_epoch"])

    n_dev = parallel.local_device_count(devices) if devices else None
    throttle = bool(n_dev) and jax.local_devices()[0].platform == "cpu"
    axis = "batch" if n_dev else None
    raw_step = make_train_step(loss_fn, optimizer, axis_name=axis)
    step_fn = (jax.pmap(raw_step, axis_name=axis, donate_argnums=0) if n_dev
               else jax.jit(raw_step, donate_argnums=0))
    if eval_fn is not None:
        raw_eval = make_eval_step(eval_fn, axis_name=axis)
        eval_step = jax.pmap(raw_eval, axis_name=axis) if n_dev else jax.jit(raw_eval)
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))

    loop = _Loop(train_state, n_dev)
    ctx = FitContext(loop)
    ctx.host_step = int(jax.device_get(train_state.step))
    bar_factory = _progress_factory(progress)
    for cb in callbacks:
        cb.on_train_begin(ctx)

    for epoch in range(start_epoch, epochs):
        ctx.epoch = epoch
        t0 = time.perf_counter()
        step_metrics, seen = [], 0
        bar = bar_factory(epoch, epochs)
        for i, batch in enumerate(_iterate(train_data, epoch)):
            if epoch == start_epoch and i < skip:
                continue  # already trained on before the checkpoint we resumed from
            loop.state, metrics = step_fn(loop.state, loop.put_batch(batch))
            if throttle and step_metrics:
                # At most two pmap steps in flight: with many multi-device executions
                # queued, XLA:CPU's collectives can deadlock (seen with 4 simulated
                # devices on 2 cores). GPUs order executions per stream; no need there.
                jax.block_until_ready(step_metrics[-1])
            step_metrics.append(metrics)
            seen += _batch_size(batch)
            ctx.batch_in_epoch = i + 1
            ctx.host_step += 1
            for cb in callbacks:
                cb.on_step_end(ctx, ctx.host_step)
            if bar is not None and (i + 1) % log_every == 0:
                last = jax.device_get(_first(metrics) if n_dev else metrics)
                bar.update(log_every)
                bar.set_postfix(loss=f"{float(last['loss']):.4f}",
                                samples_s=f"{seen / (time.perf_counter() - t0):,.0f}")
        if not step_metrics and not (epoch == start_epoch and skip):
            raise ValueError(f"fit: train_data gave no batches in epoch {epoch}. A generator or "
                             f"iterator is used up after one epoch: pass a callable "
                             f"epoch -> iterable (e.g. lambda epoch: data.batches(...)).")
        skip = 0
        logs = {"epoch": epoch}
        if step_metrics:
            host = jax.device_get(step_metrics)
            for k in ["loss"] + [k for k in host[0] if k != "loss"]:
                logs[k] = float(np.mean([np.mean(m[k]) for m in host]))
        seconds = time.perf_counter() - t0
        logs["samples_per_s"] = seen / seconds if seconds > 0 else math.nan
        if eval_fn is not None:
            total = None
            for batch in _iterate(eval_data, epoch):
                s = eval_step(loop.state, loop.put_batch(batch))
                total = s if total is None else add(total, s)
            if total is not None:
                computed = metric.compute(_first(total) if n_dev else total)
                computed = computed if isinstance(computed, dict) else {"metric": computed}
                for k, v in jax.device_get(computed).items():
                    v = np.asarray(v)
                    logs[f"eval_{k}"] = float(v) if v.ndim == 0 else v.tolist()
        logs["seconds"] = time.perf_counter() - t0
        ctx.batch_in_epoch = 0
        ctx.epoch = epoch + 1  # a checkpoint taken now resumes at the next epoch
        for cb in callbacks:
            cb.on_epoch_end(ctx, epoch, logs)
        ctx.epoch = epoch
        ctx.history.append(logs)
        if bar is not None:
            bar.close()
        if print_fn is not None:
            print_fn(" ".join(f"{k}={_fmt(v)}" for k, v in logs.items()))
        if ctx.stop_training:
            break
    for cb in callbacks:
        cb.on_train_end(ctx)
    return loop.host_state(), ctx.history


def _first(tree):
    return jax.tree.map(lambda x: x[0], tree)


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _progress_factory(progress):
    """Returns ``make(epoch, epochs) -> bar or None``; tqdm is optional."""
    if progress is False:
        return lambda epoch, epochs: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            print("fit: progress=True but tqdm is not installed (pip install tqdm); "
                  "continuing without a progress bar.", file=sys.stderr)
        return lambda epoch, epochs: None
    if progress is None and not sys.stderr.isatty():
        return lambda epoch, epochs: None
    return lambda epoch, epochs: tqdm(desc=f"epoch {epoch + 1}/{epochs}", unit="step",
                                      leave=False, dynamic_ncols=True)
