"""One epoch of ``fit``: the steps over a host pipeline, stacked host batches or a
:class:`funcnet.data.DeviceData`, then the evaluation and the end-of-epoch callbacks.

Three runners share the dispatch bookkeeping (:func:`_dispatch_epoch`) and return the
same thing, ``(per-step metrics, examples seen)``: ``_train_epoch`` over a host
pipeline (one step per dispatch, batches from an iterable, optionally assembled in a
background thread), ``_train_epoch_stacked`` over :func:`funcnet.data.batches` read
several at a time, and ``_train_epoch_device`` over a ``DeviceData`` (batches gathered
inside the step, several steps per dispatch).
"""

from __future__ import annotations

import itertools
import time
from typing import Callable

import jax
import numpy as np

from funcnet import data as data_lib
from funcnet import distributed
from funcnet.callbacks import Callback
from funcnet.loop._checks import host_arrays
from funcnet.loop._metrics import _check_losses
from funcnet.loop._placement import _checked_device_put
from funcnet.loop._resume import check_layout, data_layout

__all__: list = []


def _iterate(data, epoch):
    return iter(data(epoch) if callable(data) else data)


def _converter(name: str, epoch: int) -> Callable:
    """:func:`funcnet.loop._checks.host_arrays` for an epoch's batches, taken in order
    (on one thread), counting them for its error message: fit's host boundary, where a
    PyTorch, tf.data or grain batch becomes NumPy, once per batch."""
    count = itertools.count()
    return lambda batch: host_arrays(batch, name, next(count), epoch)


def _spec(batch):
    """A batch's shapes and dtypes, without its values (nothing kept alive)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)


def _batch_size(batch) -> int:
    return int(jax.tree.leaves(batch)[0].shape[0])


def _check_host_layout(run, batches, size: int, resumed_inside: bool) -> None:
    """Records what a checkpoint's loop position counts in for a host pipeline, from
    this epoch's iterable (all of it for a ``data.Batches``) and first batch
    (``size``). In the epoch a run resumes inside, refuses it when it differs from what
    the checkpoint recorded for that epoch: the batches to skip must be the saved ones.
    (Each epoch may have its own shuffle seed, so only that epoch is compared.)"""
    now = data_layout(batches)
    if int(now["batch_size"]) == -1:
        now["batch_size"] = np.int64(size)
    if resumed_inside:
        check_layout(run.resumed, now)
    # What this iterable cannot tell stays as recorded before.
    run.data_layout = {k: v if int(v) != -1 else run.data_layout[k] for k, v in now.items()}


def _train_epoch(run, steps, callbacks, train_data, epoch, skip, bar, log_every,
                 on_nonfinite):
    """Runs one epoch's steps; returns ``(per-step metrics, examples seen)``.

    ``skip`` batches at the start were trained on before the checkpoint the run
    resumed from. Metrics stay on the device until the epoch ends (no sync per step).
    """
    loop, ctx = run.loop, run.ctx
    t0 = time.perf_counter()
    step_metrics, seen = [], 0
    # At most two multi-device steps in flight on CPU, where many queued executions
    # can stall XLA:CPU's collectives (distributed.InFlight says what happens).
    in_flight = distributed.InFlight(2 if loop.throttle else None, cpu_only=False)
    source = train_data(epoch) if callable(train_data) else train_data
    if steps.on_stacked is not None and callable(train_data) and (
            isinstance(source, data_lib.Batches) and source.stackable):
        return _train_epoch_stacked(run, steps, callbacks, source, epoch, skip, bar,
                                    log_every, on_nonfinite)
    if steps.several_asked:
        raise ValueError(f"fit: steps_per_dispatch={steps.steps_per_dispatch} needs batches it "
                         f"can read several at a time: train_data=funcnet.data.DeviceData(...), "
                         f"or a callable returning funcnet.data.batches(...) (got "
                         f"{type(source).__name__} from train_data). Other iterables run one "
                         f"step per dispatch: leave steps_per_dispatch unset.")
    starters = _step_begin_callbacks(callbacks)  # usually none: no call per step then
    run.epoch_fetch = lambda start: (jax.device_get(step_metrics[start:]), len(step_metrics))
    # The with block stops the background thread however the epoch ends (early stop,
    # an exception, KeyboardInterrupt).
    with loop.host_batches(source, _converter("train_data", epoch)) as batches:
        for i, batch in enumerate(batches):
            if i == 0:
                _check_host_layout(run, source, _batch_size(batch), skip > 0)
                run.batch_spec = _spec(batch)
            if i < skip:
                continue
            for cb in starters:
                cb.on_step_begin(ctx, ctx.host_step + 1)
            loop.state, metrics = steps.train(loop.state, loop.put_batch(batch))
            step_metrics.append(in_flight.add(metrics))
            run.last = (metrics, None)
            seen += _batch_size(batch)
            ctx.batch_in_epoch = i + 1
            ctx.host_step += 1
            for cb in callbacks:
                cb.on_step_end(ctx, ctx.host_step)
            if bar is not None and (i + 1) % log_every == 0:
                last = jax.device_get(loop.first(metrics))
                _check_losses(run, [last], epoch, ctx.host_step, on_nonfinite)
                bar.update(log_every)
                bar.set_postfix(loss=f"{float(last['loss']):.4f}",
                                samples_s=f"{seen / (time.perf_counter() - t0):,.0f}")
    if not step_metrics and not skip:
        _no_batches(epoch)
    return loop.fetched(step_metrics), seen


def _no_batches(epoch: int):
    raise ValueError(f"fit: train_data gave no batches in epoch {epoch}. A generator or "
                     f"iterator is used up after one epoch: pass a callable "
                     f"epoch -> iterable (e.g. lambda epoch: data.batches(...)).")


def _train_epoch_device(run, steps, callbacks, data, epoch, skip, bar, log_every,
                        on_nonfinite):
    """:func:`_train_epoch` over a :class:`funcnet.data.DeviceData`: batches are gathered
    inside the step, up to ``steps.steps_per_dispatch`` steps per dispatch
    (:func:`_dispatch_epoch`). The only host work per dispatch is the dispatch."""
    loop, ctx = run.loop, run.ctx
    k = steps.steps_per_dispatch
    full, tail = data.order(epoch)
    order = loop.put_order(full)

    def dispatch(state, i, n):
        at = (np.int32(i),) if k == 1 else (np.int32(i), np.int32(n))
        return steps.on_device(state, data.arrays, order, *at)

    def last(state):
        return steps.on_device_one(state, data.arrays, loop.put_order(tail)), len(tail)

    plan = _dispatch_plan(ctx.host_step, k, skip, len(full), _dispatch_edges(callbacks))
    return _dispatch_epoch(run, steps, callbacks, plan, len(full), data.batch_size, dispatch,
                           None if tail is None else last, epoch, skip, bar, log_every,
                           on_nonfinite)


def _train_epoch_stacked(run, steps, callbacks, source, epoch, skip, bar, log_every,
                         on_nonfinite):
    """:func:`_train_epoch` over a host pipeline of :func:`funcnet.data.batches`: each
    dispatch's batches are read at once (:meth:`funcnet.data.Batches.stacked`, one gather
    and one copy to the device) and run as up to ``steps.steps_per_dispatch`` steps on
    the device. The next dispatch's batches are gathered while the device runs the last
    one (dispatch is asynchronous), or ``prefetch`` ahead in a background thread."""
    loop, ctx = run.loop, run.ctx
    k, size = steps.steps_per_dispatch, source.batch_size
    full = source.full_batches - source.skip   # counted as the iteration counts them
    _check_host_layout(run, source, size, skip > 0)
    if source.num_batches > source.skip:
        run.batch_spec = _spec(source.batch(source.skip))
    local = jax.device_put(np.arange(k, dtype=np.int32))
    plan = _dispatch_plan(ctx.host_step, k, skip, full, _dispatch_edges(callbacks))

    def stacked():  # what each dispatch runs on, in the plan's order
        for i, n in plan:
            try:
                chunk = _checked_device_put(source.stacked(source.skip + i, n, size=k))
            except Exception as e:
                e.add_note(f"fit: reading batches {i}..{i + n - 1} of epoch {epoch} "
                           f"(Batches.stacked) for one dispatch of {n} steps")
                raise
            yield chunk

    with loop.host_batches(stacked()) as chunks:
        def dispatch(state, i, n):
            return steps.on_stacked(state, next(chunks), local, np.int32(0), np.int32(n))

        def last(state):
            batch = source.batch(source.num_batches - 1)
            return steps.train(state, loop.put_batch(batch)), _batch_size(batch)

        tail = source.num_batches > source.full_batches
        # At most 2 dispatches in flight: the host gathers the next one's batches while
        # the device runs, without queueing (and holding) a whole epoch's copies.
        out = _dispatch_epoch(run, steps, callbacks, plan, full, size, dispatch,
                              last if tail else None, epoch, skip, bar, log_every,
                              on_nonfinite, max_in_flight=2)
    source.close()  # used up, as iterating it would leave it
    if not out[0] and not skip:
        _no_batches(epoch)
    return out


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


def _dispatch_edges(callbacks) -> tuple:
    """The global steps where a dispatch must end: callbacks' ``dispatch_edges``."""
    return tuple(sorted({int(e) for cb in callbacks for e in getattr(cb, "dispatch_edges", ())}))


def _dispatch_epoch(run, steps, callbacks, plan, full, batch_size, dispatch, last, epoch,
                    skip, bar, log_every, on_nonfinite, max_in_flight=None):
    """Runs the ``(i, n)`` dispatches of ``plan`` (:func:`_dispatch_plan`, over batches
    ``skip .. full - 1``), each ``n`` steps from batch ``i`` (``dispatch(state, i, n) ->
    (state, metric rows)``), then the last, smaller batch if
    there is one (``last(state) -> ((state, metrics), examples)``); returns ``(per-step
    metrics, examples seen)``.

    Dispatches end on multiples of ``k`` global steps (and at the epoch's end), so
    ``Checkpoint(every_steps=...)`` sees the steps it saves at; callbacks'
    ``on_step_end`` runs once per dispatch, with the step count after it. The progress
    bar reads the metrics of the dispatch before the last one, which the device has
    finished, so it never waits. ``max_in_flight`` bounds the dispatches queued and
    unfinished (:class:`funcnet.distributed.InFlight`; None: no bound, except the 2 of
    multi-device steps on CPU).
    """
    loop, ctx = run.loop, run.ctx
    t0 = time.perf_counter()
    chunks, seen = [], 0  # chunks: (metric rows, steps in them, global step after)
    next_log = (ctx.host_step // log_every + 1) * log_every
    if loop.throttle:  # see _train_epoch
        max_in_flight = 2
    in_flight = distributed.InFlight(max_in_flight, cpu_only=False)
    starters = _step_begin_callbacks(callbacks)
    run.epoch_fetch = lambda start: (_chunk_rows(chunks[start:]), len(chunks))
    for i, n in plan:
        for cb in starters:
            cb.on_step_begin(ctx, ctx.host_step + 1)   # the dispatch's first step
        loop.state, rows = dispatch(loop.state, i, n)
        in_flight.add(rows)
        seen += n * batch_size
        ctx.batch_in_epoch = i + n
        ctx.host_step += n
        chunks.append((rows, n, ctx.host_step))
        run.last = (rows, n - 1)
        for cb in callbacks:
            cb.on_step_end(ctx, ctx.host_step)
        if bar is not None and ctx.host_step >= next_log:
            next_log = (ctx.host_step // log_every + 1) * log_every
            _refresh_bar_lagged(bar, run, chunks, i + n - skip, seen, t0, epoch, on_nonfinite)
    if last is not None and skip <= full:
        for cb in starters:
            cb.on_step_begin(ctx, ctx.host_step + 1)
        (loop.state, metrics), examples = last(loop.state)
        seen += examples
        ctx.batch_in_epoch = full + 1
        ctx.host_step += 1
        chunks.append((jax.tree.map(lambda m: m[None], metrics), 1, ctx.host_step))
        run.last = (metrics, None)
        for cb in callbacks:
            cb.on_step_end(ctx, ctx.host_step)
    return _chunk_rows(chunks), seen


def _chunk_rows(chunks) -> list:
    """The per-step metric dicts on the host of ``(rows, steps in them, _)`` dispatches."""
    host = jax.device_get([rows for rows, _, _ in chunks])
    return [{key: h[key][j] for key in h} for h, (_, n, _) in zip(host, chunks)
            for j in range(n)]


def _refresh_bar_lagged(bar, run, chunks, done, seen, t0, epoch, on_nonfinite):
    """Progress from the last step of the dispatch before the latest: the device has
    finished it (or is about to), so the read does not empty its queue."""
    bar.update(done - bar.n)
    if len(chunks) < 2:
        return
    rows, n, step = chunks[-2]
    last = {key: r[n - 1] for key, r in jax.device_get(rows).items()}
    _check_losses(run, [last], epoch, step, on_nonfinite)
    bar.set_postfix(loss=f"{float(last['loss']):.4f}",
                    samples_s=f"{seen / (time.perf_counter() - t0):,.0f}")


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
    return [cb for cb in callbacks if not hasattr(cb, "every_steps") and (
        getattr(type(cb), "on_step_end", None) is not Callback.on_step_end
        or _step_begin_callbacks([cb]))]


def _step_begin_callbacks(callbacks) -> list:
    """The callbacks with an ``on_step_begin`` of their own (``Profile``): the loop calls
    only these before each dispatch, so a run without one pays nothing per step. A
    duck-typed callback without the hook is left out."""
    return [cb for cb in callbacks if getattr(type(cb), "on_step_begin", Callback.on_step_begin)
            is not Callback.on_step_begin]
