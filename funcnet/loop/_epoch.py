"""One epoch of ``fit``: the steps over a data source, then the evaluation and the
end-of-epoch callbacks.

One loop (:func:`_train_epoch`, its core :func:`_dispatch_epoch`) drives every data
source (``_sources``: a :class:`funcnet.data.DeviceData` gathered in the step,
:func:`funcnet.data.batches` read several at a time, any other host iterable): the
source plans the epoch as dispatches (``_sources._Epoch``; a host step is a dispatch of
one step), the loop runs them, calls the callbacks between them, keeps their metrics
(``_StepRecord``, ``_DispatchRecord``) and moves the progress bar (``_Bar``). What
differs between sources is in the plan's attributes, never a type test here, so a new
source needs no edit of this module. It returns ``(per-step metrics, examples seen)``.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from funcnet import distributed
from funcnet.callbacks import Callback
from funcnet.loop._metrics import _check_losses
from funcnet.loop._rows import StepRows
from funcnet.loop._sources import host_arrays

__all__: list = []

# fit's default lets a dispatch over a DeviceData grow to this many times its steps per
# dispatch (the metric rows its device loop keeps) ...
DISPATCH_GROWTH = 16
# ... while one dispatch lasts at most this long (seconds), timed over the epoch before:
# tqdm redraws a bar at most every 0.1 s (its mininterval), so the bar moves as often as
# with shorter dispatches, and each dispatch's fixed cost (the host's call, the launch,
# the loop's start) is paid less often.
DISPATCH_S = 0.1


def _iterate(data, epoch):
    return iter(data(epoch) if callable(data) else data)


def _train_epoch(run, steps, callbacks, source, epoch, skip, *, bar, log_every, on_nonfinite):
    """Runs one epoch's steps over ``source`` (``_sources._Source``); returns
    ``(per-step metrics, examples seen)``.

    ``skip`` batches at the start were trained on before the checkpoint the run
    resumed from. Metrics stay on the device until the epoch ends (no sync per step).
    Dispatches never cross a multiple of ``k`` global steps nor a callback's
    ``dispatch_edges`` (:func:`_dispatch_plan`, which the source asks for): ``k`` is
    ``steps.steps_per_dispatch``, or for a source that ``grows_dispatches`` the length
    :func:`_grown` picks from the step time of the epoch before (``run.step_s``).
    """
    t0 = time.perf_counter()
    first, k, edges = run.ctx.host_step, steps.steps_per_dispatch, _dispatch_edges(callbacks)
    if source.grows_dispatches:
        k = _grown(k, steps.dispatch_bound, _every_steps(callbacks), run.step_s)

    def cut(start, stop):
        return _dispatch_plan(first, k, start, stop, edges)

    with source.epoch(run, steps, epoch, skip, cut) as plan:
        metrics, seen = _dispatch_epoch(run, callbacks, plan, epoch, skip, bar, log_every, on_nonfinite, t0)
    if not metrics and not skip:
        _no_batches(epoch)
    return metrics, seen


def _no_batches(epoch: int):
    raise ValueError(
        f"fit: train_data gave no batches in epoch {epoch}. A generator or "
        f"iterator is used up after one epoch: pass a callable "
        f"epoch -> iterable (e.g. lambda epoch: data.batches(...))."
    )


def _dispatch_plan(host_step: int, k: int, start: int, stop: int, edges=()) -> list:
    """``(first batch, steps)`` of each dispatch over batches ``start .. stop - 1``: a
    dispatch never crosses a multiple of ``k`` global steps, nor a global step of
    ``edges`` (where a callback must run between dispatches: ``Profile``'s window)."""
    plan, i = [], start
    while i < stop:
        at = host_step + i - start  # the global step before this dispatch
        n = min([k - at % k, stop - i] + [e - at for e in edges if e > at])
        plan.append((i, n))
        i += n
    return plan


def _grown(k: int, bound: int, everies, step_s) -> int:
    """The steps per dispatch of an epoch: the longest of ``k, 2k, 4k, ...`` up to
    ``bound`` that divides every ``every_steps`` in ``everies`` (a checkpoint still
    falls between dispatches) and, at ``step_s`` seconds a step (measured over the
    epoch before; None: not yet), lasts at most ``DISPATCH_S``. The device loop's
    program is the same for every length (its count is traced), so the length changes
    the host's work only, never a bit of the results."""
    if step_s is None:
        return k
    while 2 * k <= bound and all(e % (2 * k) == 0 for e in everies) and 2 * k * step_s <= DISPATCH_S:
        k *= 2
    return k


def _every_steps(callbacks) -> list:
    """The callbacks' ``every_steps`` (``Checkpoint``, ``TensorBoardLogger``), where set."""
    return [e for e in (getattr(cb, "every_steps", None) for cb in callbacks) if e]


def _dispatch_edges(callbacks) -> tuple:
    """The global steps where a dispatch must end: callbacks' ``dispatch_edges``."""
    return tuple(sorted({int(e) for cb in callbacks for e in getattr(cb, "dispatch_edges", ())}))


def _dispatch_epoch(run, callbacks, plan, epoch, skip, bar, log_every, on_nonfinite, t0):
    """Runs the dispatches of ``plan`` (a ``_sources._Epoch``), each ``n`` steps from batch
    ``i``, then its last, smaller batch if there is one; returns ``(per-step metrics,
    examples seen)``.

    Dispatches end on multiples of ``k`` global steps (and at the epoch's end), so
    ``Checkpoint(every_steps=...)`` sees the steps it saves at; callbacks'
    ``on_step_end`` runs once per dispatch, with the step count after it. The progress
    bar reads what ``plan.lag`` says (:class:`_Bar`). ``plan.max_in_flight`` bounds the
    dispatches queued and unfinished (:class:`funcnet.distributed.InFlight`; 2 for
    multi-device steps on CPU, where many queued executions can stall XLA:CPU's
    collectives). Once the dispatches are queued, ``plan.ahead`` (if any) does the next
    epoch's host work while the device runs them, unless this was the run's last epoch.
    """
    loop, ctx = run.loop, run.ctx
    seen = 0
    record = (_StepRecord if plan.per_step else _DispatchRecord)(run)
    shown = None if bar is None else _Bar(bar, run, record, plan.lag, log_every, epoch, skip, on_nonfinite, t0)
    in_flight = distributed.InFlight(2 if loop.throttle else plan.max_in_flight, cpu_only=False)
    starters = _step_begin_callbacks(callbacks)  # usually none: no call per step then
    run.epoch_fetch = record.fetch
    dispatch, add = plan.run, record.add
    timed_from = None
    for i, n, examples, payload in plan.dispatches:
        for cb in starters:
            cb.on_step_begin(ctx, ctx.host_step + 1)  # the dispatch's first step
        loop.state, rows = dispatch(loop.state, i, n, payload)
        if timed_from is None:  # its compilation, if any, is behind us
            timed_from = (time.perf_counter(), ctx.host_step + n)
        in_flight.add(rows)
        seen += examples
        ctx.batch_in_epoch = i + n
        ctx.host_step += n
        add(rows, n, ctx.host_step)
        for cb in callbacks:
            cb.on_step_end(ctx, ctx.host_step)
        if shown is not None:
            shown.after(i + n, seen)
    steps_left = None if ctx.planned_steps is None else ctx.planned_steps - ctx.host_step - (plan.last is not None)
    if plan.ahead is not None and steps_left != 0:
        plan.ahead()  # another epoch follows (unless a callback stops the run)
    if plan.last is not None and skip <= plan.full:
        for cb in starters:
            cb.on_step_begin(ctx, ctx.host_step + 1)
        (loop.state, metrics), examples = plan.last(loop.state)
        seen += examples
        ctx.batch_in_epoch = plan.full + 1
        ctx.host_step += 1
        record.add_step(metrics, ctx.host_step)
        for cb in callbacks:
            cb.on_step_end(ctx, ctx.host_step)
    metrics = record.all()  # read back: every step has run
    if timed_from is not None and ctx.host_step > timed_from[1]:
        # From the first dispatch's return to the end, the device ran the steps after it
        # and some of the first: per step after it, at most a little over the step time.
        run.step_s = (time.perf_counter() - timed_from[0]) / (ctx.host_step - timed_from[1])
    return metrics, seen


class _StepRecord:
    """An epoch's metrics one step per entry, as the steps return them (a host
    pipeline's): no device op per step; read back at the end by the placement
    (``fetched``: on one device or a mesh, one transfer per group of steps)."""

    def __init__(self, run):
        self.run, self.entries = run, []

    def add(self, metrics, n, step):
        self.entries.append(metrics)
        self.run.last = (metrics, None)

    def add_step(self, metrics, step):
        self.add(metrics, 1, step)

    def fetch(self, start):
        """``run.epoch_fetch``: the host metrics (:class:`StepRows`) of the entries from
        ``start`` on (read as the epoch's end reads them), and the end."""
        return self.run.loop.fetched(self.entries[start:]), len(self.entries)

    def all(self) -> StepRows:
        return self.run.loop.fetched(self.entries)

    def latest(self, lag):
        """The last step's host metrics of the entry ``lag`` before the latest, and its
        global step; None when there is none."""
        if len(self.entries) <= lag:
            return None
        return (jax.device_get(self.run.loop.first(self.entries[-1 - lag])), self.run.ctx.host_step - lag)


class _DispatchRecord:
    """An epoch's metrics one dispatch per entry: ``(rows, steps in them, global step
    after)``, the rows as the device loop wrote them (``k``, the first ``n`` used)."""

    def __init__(self, run):
        self.run, self.entries = run, []

    def add(self, rows, n, step):
        self.entries.append((rows, n, step))
        self.run.last = (rows, n - 1)

    def add_step(self, metrics, step):
        self.entries.append((jax.tree.map(lambda m: m[None], metrics), 1, step))
        self.run.last = (metrics, None)

    def fetch(self, start):
        return _chunk_rows(self.entries[start:]), len(self.entries)

    def all(self) -> StepRows:
        return _chunk_rows(self.entries)

    def latest(self, lag):
        if len(self.entries) <= lag:
            return None
        rows, n, step = self.entries[-1 - lag]
        return {key: r[n - 1] for key, r in jax.device_get(rows).items()}, step


def _chunk_rows(chunks) -> StepRows:
    """The host metrics of ``(rows, steps in them, _)`` dispatches, in one transfer."""
    host = jax.device_get([rows for rows, _, _ in chunks])
    return StepRows.stacked((h, n) for h, (_, n, _) in zip(host, chunks))


class _Bar:
    """The progress bar's refreshes during an epoch, after each dispatch (``after``).

    ``lag`` 0: every ``log_every`` batches of the epoch, the latest step's metrics,
    read synchronously (one step per dispatch, where the wait is one step's). ``lag``
    1: every ``log_every`` global steps, the last step of the dispatch before the
    latest, which the device has finished (or is about to): the read does not empty its
    queue. Either way the loss read is checked for NaN/inf (``on_nonfinite``).
    """

    def __init__(self, bar, run, record, lag, log_every, epoch, skip, on_nonfinite, t0):
        self.bar, self.run, self.record, self.lag = bar, run, record, lag
        self.log_every, self.epoch, self.skip, self.on_nonfinite = log_every, epoch, skip, on_nonfinite
        self.t0 = t0
        self.next_log = (run.ctx.host_step // log_every + 1) * log_every

    def after(self, done: int, seen: int) -> None:
        """After the dispatch that ends at batch ``done`` of the epoch."""
        if self.lag == 0:
            if done % self.log_every:
                return
            moved, latest = self.log_every, self.record.latest(0)
        else:
            step = self.run.ctx.host_step
            if step < self.next_log:
                return
            self.next_log = (step // self.log_every + 1) * self.log_every
            moved, latest = done - self.skip - self.bar.n, self.record.latest(self.lag)
            if latest is None:
                self.bar.update(moved)
                return
        self._check(latest)
        # set before the update, which draws it: tqdm redraws at most every mininterval
        # (0.1 s), where set_postfix's own refresh would redraw after every dispatch
        self.bar.set_postfix(
            loss=f"{float(latest[0]['loss']):.4f}",
            samples_s=f"{seen / (time.perf_counter() - self.t0):,.0f}",
            refresh=False,
        )
        self.bar.update(moved)

    def _check(self, latest) -> None:
        metrics, step = latest
        if np.isfinite(metrics["loss"]).all():
            return  # the usual case, without the rows a report needs (~0.1 ms of host CPU)
        _check_losses(self.run, StepRows.of([metrics]), self.epoch, step, self.on_nonfinite)


def _evaluate(loop, steps, metric, eval_data, epoch) -> dict:
    """The ``eval_*`` log entries: metric states of all eval batches added, then computed."""
    total = None
    for i, batch in enumerate(_iterate(eval_data, epoch)):
        s = steps.eval(loop.state, loop.put_batch(host_arrays(batch, "eval_data", i, epoch)))
        total = s if total is None else steps.add(total, s)
    if total is None:
        return {}
    computed = metric.compute(loop.first(total))
    computed = computed if isinstance(computed, dict) else {"metric": computed}
    logs = {}
    for k, v in jax.device_get(computed).items():
        v = np.asarray(v)
        logs[f"eval_{k}"] = float(v) if v.ndim == 0 else v.tolist()
    return logs


def _end_epoch(ctx, callbacks, epoch, logs, shown, steps: int):
    ctx.batch_in_epoch = 0
    ctx.epoch = epoch + 1  # a checkpoint taken now resumes at the next epoch
    # Checkpoints save last (Callback.epoch_end_phase): the callback states they store
    # (EarlyStopping's wait) must be the epoch's final ones, or a resume would count this
    # epoch again.
    for cb in sorted(callbacks, key=lambda cb: getattr(cb, "epoch_end_phase", 0)):
        cb.on_epoch_end(ctx, epoch, logs)
    ctx.epoch = epoch
    ctx.history.append(logs)
    shown.summary(epoch, steps, logs)  # after the callbacks: with the keys they add


def _per_step_callbacks(callbacks) -> list:
    """The callbacks with an ``on_step_end`` (or ``on_step_begin``) of their own that want
    every step: not those with an ``every_steps`` attribute (``Checkpoint``,
    ``TensorBoardLogger``, ``Profile``), which only need dispatches to end on its
    multiples."""
    return [
        cb
        for cb in callbacks
        if not hasattr(cb, "every_steps")
        and (getattr(type(cb), "on_step_end", None) is not Callback.on_step_end or _step_begin_callbacks([cb]))
    ]


def _step_begin_callbacks(callbacks) -> list:
    """The callbacks with an ``on_step_begin`` of their own (``Profile``): the loop calls
    only these before each dispatch, so a run without one pays nothing per step. A
    duck-typed callback without the hook is left out."""
    return [
        cb
        for cb in callbacks
        if getattr(type(cb), "on_step_begin", Callback.on_step_begin) is not Callback.on_step_begin
    ]
