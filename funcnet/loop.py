"""The ``fit`` loop: epochs of the pure step, evaluation, callbacks, resumption.

Everything :func:`fit` does can be written by hand with
:func:`funcnet.train.make_train_step` (the examples show both). The loop is split
into its phases -- restore, check, compile, one epoch, evaluate, end of epoch -- and
keeps its position in one small record, :class:`LoopPosition`, which is what a
checkpoint stores next to the train state and what ``resume_from`` reads back.

Where each phase lives: restoring and what a checkpoint's position means in
``funcnet._loop_resume``; the checks made before the first step (and
:class:`LogKeys`) in ``funcnet._loop_checks``; here, the placement of the state
(``_Loop``), the compiled steps, and the two epoch runners, which share nothing but
the metrics they return: ``_train_epoch`` over a host pipeline (one step per
dispatch, batches from an iterable, optionally assembled in a background thread)
and ``_train_epoch_device`` over a :class:`funcnet.data.DeviceData` (batches gathered
inside the step, several steps per dispatch).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import sys
import time
import warnings
from typing import Callable, Iterable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import _checks as checks
from funcnet import data as data_lib
from funcnet import distributed
from funcnet import precision
from funcnet import sharding
from funcnet import xla
from funcnet.callbacks import Callback
from funcnet._jaxpr import any_eqn, loss_jaxpr
from funcnet._loop_checks import (LogKeys, check_before_training, check_fit_options,
                                  first_batch, host_arrays, optimizer_note)
from funcnet._loop_position import LoopPosition
from funcnet._loop_resume import (EpochSums, check_layout, checkpoint_extras, data_layout,
                                  resume, stateful)
from funcnet.train import TrainState, make_eval_step, make_train_step

__all__ = ["fit", "FitContext", "LoopPosition", "LogKeys"]


class FitContext:
    """What callbacks see: the loop's position and a way to stop it.

    ``train_state`` is the current state on the host's default device (replicas
    are collapsed to one); reading it forces the pending steps to finish.

    Attributes:
      epoch: the epoch being trained (0-based); during ``on_epoch_end``, the next one,
        where a checkpoint taken then resumes (the hook's ``epoch`` argument is the
        epoch that ended).
      batch_in_epoch: batches of the current epoch trained on so far.
      step: global steps taken so far (counted on the host; ``host_step`` too).
      history: the epoch logs so far.
      stop_training: set it to True to end the run after the current epoch.
      run_id: the id :class:`funcnet.callbacks.Checkpoint` saves under.
      loss_was_nonfinite: True once fit has seen a NaN/inf loss.
      planned_steps: the run's last global step, when known.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> class StopAfterOne(Callback):
      ...     log_keys = ()
      ...     def on_epoch_end(self, ctx, epoch, logs):
      ...         print(epoch, ctx.epoch, ctx.step, sorted(ctx.step_metrics))
      ...         ctx.stop_training = True
      >>> data = [np.ones((4, 2), np.float32)] * 3
      >>> _, history = fit(ts, loss_fn, opt, data, epochs=5, callbacks=[StopAfterOne()],
      ...                  progress=False)
      0 1 3 ['loss']
      >>> len(history)
      1
    """

    def __init__(self, loop):
        self._loop = loop
        self.stop_training = False
        self.epoch = 0
        self.batch_in_epoch = 0
        self.history: list = []
        self.host_step = 0  # steps taken, counted on the host (reading the device would sync)
        self.run_id: Optional[str] = None  # what Checkpoint saves under (see funcnet.checkpoint.save)
        self.loss_was_nonfinite = False  # set once fit has seen a NaN/inf loss
        self._last = None  # the latest dispatch's metrics on the device, and the row to read
        self.planned_steps: Optional[int] = None  # the run's last global step, when known
        # fit sets it: train_state -> the checkpoint entries beside the train state and
        # position (the data layout, the callbacks' states) that Checkpoint saves.
        self.checkpoint_extras: Optional[Callable] = None
        self._data_layout: dict = {}  # what the position counts in (_loop_resume.data_layout)
        self._resumed = None  # what resume_from's checkpoint holds beside the state, if any
        # fit sets it: () -> whether the loss computes in float16, asked only once a loss
        # is non-finite (a trace, no device work); _batch_spec: the shapes it traces with.
        self._float16: Callable[[], bool] = lambda: False
        self._batch_spec = None
        # fit sets it: step -> what the non-finite-loss message adds when the optimizer
        # (a NaN learning rate) is the cause (_loop_checks.optimizer_note); asked once.
        self._optimizer_note: Callable[[int], str] = lambda step: ""
        # The epoch's metric sums a checkpoint carries (see EpochSums): the resumed run's
        # part of the current epoch (None in other epochs); the epoch runner's fetch of
        # its steps' metrics from an entry on, ``fetch(start) -> (host dicts, end)``; and
        # how far checkpoints have folded them in, ``(entries, steps, sums)``, so each
        # save fetches only the steps since the last one.
        self._carried: Optional[EpochSums] = None
        self._epoch_fetch: Callable = lambda start: ([], 0)
        self._epoch_folded: tuple = (0, 0, None)

    def wait(self) -> None:
        """Blocks until every step dispatched so far has finished on the device."""
        jax.block_until_ready(self._loop.state)

    @property
    def step_metrics(self) -> dict:
        """The latest step's metrics as Python floats (``loss``, ``grad_norm``, ...);
        reading them waits for that step. ``{}`` before the first step."""
        if self._last is None:
            return {}
        metrics, row = self._last
        host = jax.device_get(metrics)
        if row is not None:
            host = {k: v[row] for k, v in host.items()}
        elif self._loop.n:
            host = {k: v[0] for k, v in host.items()}   # pmap: one replica's value
        return {k: float(v) for k, v in host.items()}

    @property
    def train_state(self) -> TrainState:
        return self._loop.host_state()

    def replace_train_state(self, train_state: TrainState) -> None:
        """Continues (or ends) the run from ``train_state`` instead, placed as the
        loop's own state is (e.g. ``EarlyStopping(restore_best=True)`` at the end)."""
        self._loop.replace(train_state)

    @property
    def step(self) -> int:
        return self.host_step


class _Loop:
    """Holds the (possibly replicated) state between steps; keeps the host out of the way.

    Three placements: one device (``n`` and ``mesh`` None), ``n`` pmap replicas, or
    on ``mesh`` with each batch split over it: as given when the state already lies
    on that mesh (sharded by :func:`funcnet.sharding.shard_params`), else whole on
    every device.
    """

    def __init__(self, train_state, n_devices, mesh=None, prefetch=2):
        self.n, self.mesh, self.prefetch = n_devices, mesh, prefetch
        # The step donates its input buffers; copying once keeps the caller's state alive.
        if mesh is not None and _lies_on(train_state, mesh):
            self.state = _copy_placed(train_state)
        elif mesh is not None:
            self.state = distributed.replicate_on(mesh, train_state)
        elif n_devices:
            self.state = distributed.replicate(train_state, n_devices)
        else:
            self.state = jax.tree.map(jnp.copy, train_state)

    def replace(self, train_state):
        if self.mesh is not None:
            self.state = jax.jit(lambda t: jax.tree.map(jnp.copy, t),
                                 out_shardings=sharding.state_shardings(self.state))(train_state)
        elif self.n:
            self.state = distributed.replicate(train_state, self.n)
        else:
            self.state = jax.tree.map(jnp.copy, train_state)

    def host_state(self):
        # A copy: the next step donates self.state's buffers, and a callback may keep this.
        return distributed.unreplicate(self.state) if self.n else jax.tree.map(jnp.copy, self.state)

    def put_batch(self, batch):
        if self.mesh is not None:
            return distributed.shard_batch(self.mesh, batch)
        if self.n:
            return distributed.shard(batch, self.n)
        # jit would store int64 values int32 cannot hold (x64 off) wrapped, without a
        # word; shard and shard_batch check the same on the other two placements.
        checks.fits_x32("fit", batch)
        return batch

    def host_batches(self, batches, convert=None):
        """A context manager over an epoch's batches (an iterable) from a host pipeline:
        assembled ``prefetch`` ahead in a background thread
        (:func:`funcnet.data.background`), on one device also copied there
        (``device_put``), so both overlap with the steps. ``prefetch=0``: iterated
        here, one at a time. ``convert`` (:func:`_converter`) is applied to each batch
        first, in the thread when there is one."""
        if not self.prefetch:
            batches = iter(batches)
            return contextlib.nullcontext(batches if convert is None else map(convert, batches))
        # The copy starts in the thread on an accelerator, where device_put is an
        # asynchronous DMA. Not on CPU: there device_put costs ~150 us of Python per
        # batch (GIL held), several times the copy jit makes of a NumPy argument.
        # pmap and mesh placements stay on this thread (put_batch): they may read the
        # thread's jax context (jax.set_mesh).
        put = (_checked_device_put if self.n is None and self.mesh is None
               and jax.default_backend() != "cpu" else None)
        if convert is not None:
            put = convert if put is None else (lambda batch: _checked_device_put(convert(batch)))
        return data_lib.background(batches, self.prefetch, transform=put)

    def put_order(self, order):
        """An epoch's index matrix (or the last batch's indices) where the step runs: whole
        on every device of the mesh, where each device picks the rows it holds."""
        if self.mesh is None:
            return jax.device_put(order)
        # Every process computes the same order and places its own devices' copies.
        whole = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_callback(order.shape, whole, lambda index: order[index])

    def first(self, tree):
        """One replica's value of a per-device result (the value itself on one device)."""
        return jax.tree.map(lambda x: x[0], tree) if self.n else tree


def _checked_device_put(batch):
    """``jax.device_put`` of a host batch after the int32 check ``put_batch`` makes:
    device_put would wrap the values as silently as jit."""
    checks.fits_x32("fit", batch)
    return jax.device_put(batch)


def _lies_on(tree, mesh) -> bool:
    """Whether every array of ``tree`` is placed on ``mesh`` (a NamedSharding over it)."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(
        isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.NamedSharding)
        and x.sharding.mesh.devices.shape == mesh.devices.shape
        and (x.sharding.mesh.devices == mesh.devices).all()
        and x.sharding.mesh.axis_names == mesh.axis_names for x in leaves)


def _copy_placed(tree):
    """A copy of ``tree`` with the same shardings (new buffers a donating step may
    consume); each process copies its own shards."""
    return jax.jit(lambda t: jax.tree.map(jnp.copy, t),
                   out_shardings=sharding.state_shardings(tree))(tree)


class _Steps(NamedTuple):
    train: Callable
    eval: Optional[Callable]
    add: Callable
    throttle: bool  # bound the pmap steps in flight (XLA:CPU collectives, see _train_epoch)
    on_device: Optional[Callable] = None      # up to k steps over a DeviceData, one dispatch
    on_device_one: Optional[Callable] = None  # one step over given rows (the last, smaller batch)
    steps_per_dispatch: int = 1
    on_stacked: Optional[Callable] = None     # up to k steps over k stacked host batches
    several_asked: bool = False               # steps_per_dispatch > 1 given explicitly


def _compile(loss_fn, optimizer, eval_fn, n_dev, mesh=None, take=None,
             steps_per_dispatch=1, state_shardings=None, step_options=None,
             eval_on_ema=False, several_asked=False, compiler_options=None) -> _Steps:
    """The jitted (one device, or a mesh) or pmapped (``n_dev`` devices) train and eval steps.

    On a mesh the steps are the one-device steps: their inputs' shardings make XLA
    partition them and insert the all-reduces, and they run with the mesh set
    (``jax.set_mesh``) so that arrays they create land on it too. ``take`` (a
    :meth:`funcnet.data.DeviceData.take`) adds the steps that gather their batches
    from a data set on the device. ``state_shardings`` (on a mesh) keeps the train
    state's layout from step to step: on Auto mesh axes the compiler would otherwise
    choose the outputs' layout, e.g. gather a sharded parameter whole.
    ``compiler_options``: XLA's options for the jitted steps (None: none, plain ``jax.jit``).
    """
    axis = "batch" if n_dev else None
    jit = functools.partial(xla.jit, options=dict(compiler_options or {}))
    step = make_train_step(loss_fn, optimizer, axis_name=axis, **(step_options or {}))

    def raw_step(state, batch):
        # fit consumes metrics only; Aux(outputs=...) arrays are for hand-written loops.
        state, metrics = step(state, batch)[:2]
        if state_shardings is not None:
            state = jax.lax.with_sharding_constraint(state, state_shardings)
        return state, metrics

    train = (jax.pmap(raw_step, axis_name=axis, donate_argnums=0) if n_dev
             else jit(raw_step, donate_argnums=0))
    evaluate = None
    if eval_fn is not None:
        raw_eval = make_eval_step(eval_fn, axis_name=axis, ema=eval_on_ema)
        evaluate = (jax.pmap(raw_eval, axis_name=axis) if n_dev else jit(raw_eval))
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
    on_device = on_device_one = on_stacked = None
    if take is not None and not n_dev:
        on_device, on_device_one = _device_steps(raw_step, take, steps_per_dispatch, jit)
    elif _stacks_host_batches(n_dev, mesh) and steps_per_dispatch > 1:
        on_stacked = _device_steps(raw_step, _take_stacked, steps_per_dispatch, jit)[0]
    if mesh is not None:
        train, evaluate, add, on_device, on_device_one = (
            None if f is None else _on_mesh(mesh, f)
            for f in (train, evaluate, add, on_device, on_device_one))
    multi = bool(n_dev) or (mesh is not None and mesh.size > 1)
    throttle = multi and jax.local_devices()[0].platform == "cpu"
    return _Steps(train, evaluate, add, throttle, on_device, on_device_one, steps_per_dispatch,
                  on_stacked, several_asked)


def _stacks_host_batches(n_dev, mesh) -> bool:
    """Whether a host pipeline may run several steps per dispatch: on one device, over
    batches :meth:`funcnet.data.Batches.stacked` reads (pmap and mesh placements split
    each batch on the host)."""
    return not n_dev and mesh is None


def _take_stacked(arrays, j):
    """Batch ``j`` of stacked batches (``Batches.stacked``), inside the jitted loop."""
    return jax.tree.map(lambda a: a[j], arrays)


def _device_steps(raw_step, take, k: int, jit=jax.jit):
    """The steps over a data set on the device, jitted (by ``jit``), donating the train state.

    ``several(state, arrays, order, pos, n) -> (state, metrics)`` runs ``n <= k`` steps
    in one dispatch, step ``j`` on the batch ``take(arrays, order[pos + j])``;
    ``metrics`` holds ``k`` rows, the first ``n`` written. ``n`` is traced (a
    ``fori_loop``), so every dispatch runs the same compiled program whatever its
    length, and a resumed run computes exactly what the uninterrupted one did. For
    ``k == 1`` it is ``several(state, arrays, order, pos)``: one step, no loop.
    ``one(state, arrays, idx)`` is one step on the rows ``idx`` (the last, smaller batch).
    """
    def one(state, arrays, idx):
        return raw_step(state, take(arrays, idx))

    def single(state, arrays, order, pos):
        state, metrics = one(state, arrays, order[pos])
        return state, jax.tree.map(lambda m: m[None], metrics)

    def several(state, arrays, order, pos, n):
        metric_shapes = jax.eval_shape(one, state, arrays, order[0])[1]
        rows = jax.tree.map(lambda m: jnp.zeros((k, *m.shape), m.dtype), metric_shapes)

        def body(j, carry):
            state, rows = carry
            state, metrics = one(state, arrays, order[pos + j])
            return state, jax.tree.map(lambda r, m: r.at[j].set(m), rows, metrics)

        return jax.lax.fori_loop(0, n, body, (state, rows))

    return (jit(single if k == 1 else several, donate_argnums=0),
            jit(one, donate_argnums=0))


def _on_mesh(mesh, fn):
    def run(*args):
        with jax.set_mesh(mesh):
            return fn(*args)
    return run


def _iterate(data, epoch):
    return iter(data(epoch) if callable(data) else data)


def _converter(name: str, epoch: int) -> Callable:
    """:func:`funcnet._loop_checks.host_arrays` for an epoch's batches, taken in order
    (on one thread), counting them for its error message: fit's host boundary, where a
    PyTorch, tf.data or grain batch becomes NumPy, once per batch."""
    count = itertools.count()
    return lambda batch: host_arrays(batch, name, next(count), epoch)


def _spec(batch):
    """A batch's shapes and dtypes, without its values (nothing kept alive)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)


def _batch_size(batch) -> int:
    return int(jax.tree.leaves(batch)[0].shape[0])


def _check_host_layout(ctx, batches, size: int, resumed_inside: bool) -> None:
    """Records what a checkpoint's loop position counts in for a host pipeline, from
    this epoch's iterable (all of it for a ``data.Batches``) and first batch
    (``size``). In the epoch a run resumes inside, refuses it when it differs from what
    the checkpoint recorded for that epoch: the batches to skip must be the saved ones.
    (Each epoch may have its own shuffle seed, so only that epoch is compared.)"""
    now = data_layout(batches)
    if int(now["batch_size"]) == -1:
        now["batch_size"] = np.int64(size)
    if resumed_inside:
        check_layout(ctx._resumed, now)
    # What this iterable cannot tell stays as recorded before.
    ctx._data_layout = {k: v if int(v) != -1 else ctx._data_layout[k] for k, v in now.items()}


def _train_epoch(loop, steps, ctx, callbacks, train_data, epoch, skip, bar, log_every,
                 on_nonfinite):
    """Runs one epoch's steps; returns ``(per-step metrics, examples seen)``.

    ``skip`` batches at the start were trained on before the checkpoint the run
    resumed from. Metrics stay on the device until the epoch ends (no sync per step).
    """
    t0 = time.perf_counter()
    step_metrics, seen = [], 0
    # At most two multi-device steps in flight on CPU, where many queued executions
    # can stall XLA:CPU's collectives (distributed.InFlight says what happens).
    in_flight = distributed.InFlight(2 if steps.throttle else None, cpu_only=False)
    source = train_data(epoch) if callable(train_data) else train_data
    if steps.on_stacked is not None and callable(train_data) and (
            isinstance(source, data_lib.Batches) and source.stackable):
        return _train_epoch_stacked(loop, steps, ctx, callbacks, source, epoch, skip, bar,
                                    log_every, on_nonfinite)
    if steps.several_asked:
        raise ValueError(f"fit: steps_per_dispatch={steps.steps_per_dispatch} needs batches it "
                         f"can read several at a time: train_data=funcnet.data.DeviceData(...), "
                         f"or a callable returning funcnet.data.batches(...) (got "
                         f"{type(source).__name__} from train_data). Other iterables run one "
                         f"step per dispatch: leave steps_per_dispatch unset.")
    starters = _step_begin_callbacks(callbacks)  # usually none: no call per step then
    ctx._epoch_fetch = lambda start: (jax.device_get(step_metrics[start:]), len(step_metrics))
    # The with block stops the background thread however the epoch ends (early stop,
    # an exception, KeyboardInterrupt).
    with loop.host_batches(source, _converter("train_data", epoch)) as batches:
        for i, batch in enumerate(batches):
            if i == 0:
                _check_host_layout(ctx, source, _batch_size(batch), skip > 0)
                ctx._batch_spec = _spec(batch)
            if i < skip:
                continue
            for cb in starters:
                cb.on_step_begin(ctx, ctx.host_step + 1)
            loop.state, metrics = steps.train(loop.state, loop.put_batch(batch))
            step_metrics.append(in_flight.add(metrics))
            ctx._last = (metrics, None)
            seen += _batch_size(batch)
            ctx.batch_in_epoch = i + 1
            ctx.host_step += 1
            for cb in callbacks:
                cb.on_step_end(ctx, ctx.host_step)
            if bar is not None and (i + 1) % log_every == 0:
                last = jax.device_get(loop.first(metrics))
                _check_losses(ctx, [last], epoch, ctx.host_step, on_nonfinite)
                bar.update(log_every)
                bar.set_postfix(loss=f"{float(last['loss']):.4f}",
                                samples_s=f"{seen / (time.perf_counter() - t0):,.0f}")
    if not step_metrics and not skip:
        _no_batches(epoch)
    if loop.n is None and loop.mesh is None:
        step_metrics = _fetch_stacked(step_metrics)
    return step_metrics, seen


def _no_batches(epoch: int):
    raise ValueError(f"fit: train_data gave no batches in epoch {epoch}. A generator or "
                     f"iterator is used up after one epoch: pass a callable "
                     f"epoch -> iterable (e.g. lambda epoch: data.batches(...)).")


_FETCH_GROUP = 64


@jax.jit
def _stack_metrics(group):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *group)


def _fetch_stacked(step_metrics: list) -> list:
    """``jax.device_get(step_metrics)`` (a list of per-step metric dicts on one device)
    in one transfer per group of ``_FETCH_GROUP`` steps, stacked on the device: on CPU
    a transfer costs ~70 us of host time, once per scalar, which was the larger part
    of the host pipeline's per-step cost. The values are the same (a stack is exact);
    the last group is padded with its last entry, so one compiled stack serves all."""
    out = []
    for start in range(0, len(step_metrics), _FETCH_GROUP):
        group = step_metrics[start:start + _FETCH_GROUP]
        rows = jax.device_get(_stack_metrics(group + group[-1:] * (_FETCH_GROUP - len(group))))
        out += [{k: v[j] for k, v in rows.items()} for j in range(len(group))]
    return out


def _train_epoch_device(loop, steps, ctx, callbacks, data, epoch, skip, bar, log_every,
                        on_nonfinite):
    """:func:`_train_epoch` over a :class:`funcnet.data.DeviceData`: batches are gathered
    inside the step, up to ``steps.steps_per_dispatch`` steps per dispatch
    (:func:`_dispatch_epoch`). The only host work per dispatch is the dispatch."""
    k = steps.steps_per_dispatch
    full, tail = data.order(epoch)
    order = loop.put_order(full)

    def run(state, i, n):
        at = (np.int32(i),) if k == 1 else (np.int32(i), np.int32(n))
        return steps.on_device(state, data.arrays, order, *at)

    def last(state):
        return steps.on_device_one(state, data.arrays, loop.put_order(tail)), len(tail)

    plan = _dispatch_plan(ctx.host_step, k, skip, len(full), _dispatch_edges(callbacks))
    return _dispatch_epoch(loop, steps, ctx, callbacks, plan, len(full), data.batch_size, run,
                           None if tail is None else last, epoch, skip, bar, log_every,
                           on_nonfinite)


def _train_epoch_stacked(loop, steps, ctx, callbacks, source, epoch, skip, bar, log_every,
                         on_nonfinite):
    """:func:`_train_epoch` over a host pipeline of :func:`funcnet.data.batches`: each
    dispatch's batches are read at once (:meth:`funcnet.data.Batches.stacked`, one gather
    and one copy to the device) and run as up to ``steps.steps_per_dispatch`` steps on
    the device. The next dispatch's batches are gathered while the device runs the last
    one (dispatch is asynchronous), or ``prefetch`` ahead in a background thread."""
    k, size = steps.steps_per_dispatch, source.batch_size
    full = source.full_batches - source.skip   # counted as the iteration counts them
    _check_host_layout(ctx, source, size, skip > 0)
    if source.num_batches > source.skip:
        ctx._batch_spec = _spec(source.batch(source.skip))
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
        def run(state, i, n):
            return steps.on_stacked(state, next(chunks), local, np.int32(0), np.int32(n))

        def last(state):
            batch = source.batch(source.num_batches - 1)
            return steps.train(state, loop.put_batch(batch)), _batch_size(batch)

        tail = source.num_batches > source.full_batches
        # At most 2 dispatches in flight: the host gathers the next one's batches while
        # the device runs, without queueing (and holding) a whole epoch's copies.
        out = _dispatch_epoch(loop, steps, ctx, callbacks, plan, full, size, run,
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


def _dispatch_epoch(loop, steps, ctx, callbacks, plan, full, batch_size, run, last, epoch,
                    skip, bar, log_every, on_nonfinite, max_in_flight=None):
    """Runs the ``(i, n)`` dispatches of ``plan`` (:func:`_dispatch_plan`, over batches
    ``skip .. full - 1``), each ``n`` steps from batch ``i`` (``run(state, i, n) ->
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
    t0 = time.perf_counter()
    chunks, seen = [], 0  # chunks: (metric rows, steps in them, global step after)
    next_log = (ctx.host_step // log_every + 1) * log_every
    if steps.throttle:  # see _train_epoch
        max_in_flight = 2
    in_flight = distributed.InFlight(max_in_flight, cpu_only=False)
    starters = _step_begin_callbacks(callbacks)
    ctx._epoch_fetch = lambda start: (_chunk_rows(chunks[start:]), len(chunks))
    for i, n in plan:
        for cb in starters:
            cb.on_step_begin(ctx, ctx.host_step + 1)   # the dispatch's first step
        loop.state, rows = run(loop.state, i, n)
        in_flight.add(rows)
        seen += n * batch_size
        ctx.batch_in_epoch = i + n
        ctx.host_step += n
        chunks.append((rows, n, ctx.host_step))
        ctx._last = (rows, n - 1)
        for cb in callbacks:
            cb.on_step_end(ctx, ctx.host_step)
        if bar is not None and ctx.host_step >= next_log:
            next_log = (ctx.host_step // log_every + 1) * log_every
            _refresh_bar_lagged(bar, ctx, chunks, i + n - skip, seen, t0, epoch, on_nonfinite)
    if last is not None and skip <= full:
        for cb in starters:
            cb.on_step_begin(ctx, ctx.host_step + 1)
        (loop.state, metrics), examples = last(loop.state)
        seen += examples
        ctx.batch_in_epoch = full + 1
        ctx.host_step += 1
        chunks.append((jax.tree.map(lambda m: m[None], metrics), 1, ctx.host_step))
        ctx._last = (metrics, None)
        for cb in callbacks:
            cb.on_step_end(ctx, ctx.host_step)
    return _chunk_rows(chunks), seen


def _chunk_rows(chunks) -> list:
    """The per-step metric dicts on the host of ``(rows, steps in them, _)`` dispatches."""
    host = jax.device_get([rows for rows, _, _ in chunks])
    return [{key: h[key][j] for key in h} for h, (_, n, _) in zip(host, chunks)
            for j in range(n)]


def _refresh_bar_lagged(bar, ctx, chunks, done, seen, t0, epoch, on_nonfinite):
    """Progress from the last step of the dispatch before the latest: the device has
    finished it (or is about to), so the read does not empty its queue."""
    bar.update(done - bar.n)
    if len(chunks) < 2:
        return
    rows, n, step = chunks[-2]
    last = {key: r[n - 1] for key, r in jax.device_get(rows).items()}
    _check_losses(ctx, [last], epoch, step, on_nonfinite)
    bar.set_postfix(loss=f"{float(last['loss']):.4f}",
                    samples_s=f"{seen / (time.perf_counter() - t0):,.0f}")


def _check_losses(ctx, host_metrics, epoch: int, last_step: int, on_nonfinite: str) -> None:
    """Acts on the first non-finite loss among fetched step metrics (no extra device
    sync: fit fetches them anyway). ``last_step`` is the step of the last entry."""
    if not host_metrics:  # an epoch resumed from a checkpoint taken at its last step
        return
    finite = np.isfinite(_per_step(host_metrics, "loss")).all(axis=1)
    if finite.all():
        return
    bad = int(np.argmin(finite))
    first = not ctx.loss_was_nonfinite
    ctx.loss_was_nonfinite = True  # later checkpoints are marked non-finite
    if on_nonfinite == "ignore" or (on_nonfinite == "warn" and not first):
        return  # nothing to say: the message (and its float16 trace) is not built
    step = last_step - len(host_metrics) + bad + 1
    msg = (f"fit: the loss became non-finite ({np.asarray(host_metrics[bad]['loss']).ravel()[0]})"
           f" at epoch {epoch}, step {step} (the first such step fit has seen). Checkpoints "
           f"taken from now on are marked non-finite and keep= never rotates away the last "
           f"finite one; resume_from= restores that one. Lower the learning rate or check the "
           f"data, or pass on_nonfinite='warn' or 'ignore' to train on.")
    if ctx._float16():
        # The most likely cause then, and one a learning rate cannot fix: float16 overflow.
        msg += (" The loss computes in float16, whose largest value is 65504: larger "
                "activations or inputs become inf (then NaN). Compute in bfloat16 instead "
                "(float32's range; e.g. policy 'params=float32,compute=bfloat16,"
                "output=float32'), or keep float16 with the inputs scaled to a small range "
                "and loss scaling (TrainState.create(..., loss_scale="
                "precision.dynamic_loss_scale())).")
    msg += ctx._optimizer_note(step)  # a NaN learning rate, named as such
    if on_nonfinite == "raise":
        raise FloatingPointError(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _computes_in_float16(train_state, loss_fn, batch_spec) -> bool:
    """Whether ``loss_fn`` computes anything in float16, read from its jaxpr (traced
    on the shapes, never run): a float16 policy's compute dtype is nowhere else (params
    and outputs may be float32). When it cannot be traced (a pmap collective, no batch
    seen): float16 params or a loss scale, which is for float16 training."""
    jaxpr = loss_jaxpr(train_state, loss_fn, batch_spec)
    if jaxpr is None:
        return (isinstance(train_state.loss_scale, precision.LossScale) or any(
            getattr(x, "dtype", None) == jnp.float16 for x in jax.tree.leaves(train_state.params)))
    return any_eqn(jaxpr, lambda eqn: any(getattr(v.aval, "dtype", None) == jnp.float16
                                          for v in eqn.outvars))


def _mean_metrics(ctx, host) -> dict:
    """Per-epoch means of the epoch's (fetched) step metrics ``host``, ``loss`` first: the
    mean over the steps of each step's mean (over devices under pmap), with the steps a
    resumed epoch ran before its checkpoint (:class:`funcnet._loop_resume.EpochSums`).
    The sums continue those checkpoints folded in, in step order, so they are the same
    float64 additions whether or not (and wherever) checkpoints were taken."""
    _, steps, sums = ctx._epoch_folded
    if sums is None:
        sums = _epoch_base(ctx, host)
    return sums.plus(host[steps:]).means()


def _epoch_base(ctx, host) -> EpochSums:
    """What an epoch's sums start from: the checkpoint's part of a resumed epoch, when it
    has the same metrics as this run's steps, else zeros."""
    fresh = EpochSums.of(host)
    carried = ctx._carried
    if carried is None:
        return fresh
    if host and set(carried.keys) != set(fresh.keys):
        warnings.warn(f"fit: the checkpoint resumed from logged the metrics {list(carried.keys)}"
                      f" in this epoch, this run's step gives {list(fresh.keys)}: the epoch's "
                      f"logged means cover its resumed steps only.", RuntimeWarning,
                      stacklevel=4)
        return fresh
    return carried


def _epoch_sums_now(ctx) -> Optional[EpochSums]:
    """What a checkpoint taken now stores of the epoch's metrics: nothing at an epoch's
    end (the position is the next epoch's start), else the sums of the steps so far,
    fetching only those since the previous checkpoint."""
    if ctx.batch_in_epoch == 0:
        return None
    start, steps, sums = ctx._epoch_folded
    host, end = ctx._epoch_fetch(start)
    if sums is None:
        sums = _epoch_base(ctx, host)
    sums = sums.plus(host)
    ctx._epoch_folded = (end, steps + len(host), sums)
    return sums


def _per_step(host, key) -> np.ndarray:
    """``(steps, values per step)``: metric ``key`` of every fetched step, in one array
    (one NumPy call per epoch rather than one per step)."""
    return np.asarray([m[key] for m in host]).reshape(len(host), -1)


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


def fit(train_state: TrainState, loss_fn: Callable, optimizer: optax.GradientTransformation,
        train_data, *, epochs: int = 1, eval_data=None, eval_fn: Optional[Callable] = None,
        metric=None, devices: Optional[int] = None, mesh=None, callbacks: Iterable = (),
        progress: Optional[bool] = None, log_every: int = 50, resume_from=None,
        missing_ok: bool = False, on_nonfinite: str = "raise",
        steps_per_dispatch: Optional[int] = None, print_fn: Optional[Callable[[str], None]] = None,
        step_options: Optional[dict] = None, eval_on_ema: bool = False,
        prefetch: Optional[int] = None, compiler_options="auto"):
    """Trains for ``epochs`` epochs; returns ``(train_state, history)``.

    The common call is ``fit(train_state, loss_fn, optimizer, train_data, epochs=N)``,
    with ``eval_data``, ``eval_fn`` and ``metric`` for an evaluation after each epoch
    and ``callbacks`` for checkpoints, logs and early stopping. The other keywords,
    by concern, each with a default that needs no thought: where the steps run
    (``devices`` for pmap, or ``mesh``); resuming (``resume_from``, ``missing_ok``);
    what a step does (``step_options``, which are ``make_train_step``'s options,
    ``eval_on_ema``, ``on_nonfinite``); what is shown (``progress``, ``log_every``,
    ``print_fn``); and speed (``steps_per_dispatch``, ``prefetch``, ``compiler_options``),
    which changes how steps are dispatched and compiled, not what they compute.

    Args:
      train_state: from :meth:`funcnet.train.TrainState.create`.
      loss_fn, optimizer: as for :func:`funcnet.train.make_train_step`. Arrays a
        loss_fn returns in ``Aux(outputs=...)`` are dropped by ``fit`` (it keeps
        metrics only); call the step from ``make_train_step`` to receive them.
      train_data: a :class:`funcnet.data.DeviceData`, or ``train_data(epoch)``
        returning an iterable of batches, or an iterable re-iterated every epoch.
        ``DeviceData(arrays, batch_size, shuffle=True, rng=seed)`` is the fast path
        when the data set fits in device memory: it is put on the device once, each
        batch is gathered inside the jitted step, and several steps run per dispatch
        (``steps_per_dispatch``), so no per-step host work is left. The host pipeline
        (``lambda epoch: funcnet.data.batches(arrays, batch_size, shuffle=True,
        rng=seed, epoch=epoch)``) is for data that does not fit; for the same
        arguments both give the same batches, so the same result bit for bit. Use
        a seeded shuffle when you want resuming to reproduce the data order.
      eval_data, eval_fn, metric: evaluation after every epoch. ``eval_fn(params,
        state, batch)`` returns a metric state of ``metric`` (a ``funcnet.metrics``
        metric or collection); batch states are added and ``metric.compute`` gives
        the ``eval_*`` entries of the logs. ``eval_data`` may be a ``DeviceData`` too.
      mesh: a ``jax.sharding.Mesh``, 1-D (:func:`funcnet.distributed.data_mesh`) or
        with a ``"data"`` axis (2-D ``("data", "model")`` for tensor parallelism).
        A train state already placed on this mesh
        (:func:`funcnet.sharding.shard_params`: FSDP, tensor parallel) is kept as
        given, step after step; any other is placed whole on each device. Every
        batch is split over the data axis (:func:`funcnet.distributed.shard_batch`;
        batches already split that way, e.g. by ``shard_local_batch`` in a
        multi-process run, pass through), and the plain ``jax.jit`` step runs on
        them: XLA inserts the gradient all-reduce (and, for a sharded state, the
        gathers and reduce-scatters). The result equals one device's on the same
        global batches. A ``DeviceData`` is split over the data axis (each device
        holds ``1/N`` of the examples) and every step gathers its global batch
        split over the devices.
      devices: ``None`` (and no ``mesh``) trains on one device with ``jax.jit``; ``N``
        replicates the state on N local devices and runs the ``jax.pmap`` step
        (gradients averaged with ``pmean``); every batch is split over the devices.
        A ``DeviceData`` works here too, but as an ordinary iterable: each batch is
        gathered on the default device, then split and sent to the others, one step
        per dispatch; ``mesh=`` is its fast multi-device path.
      callbacks: :mod:`funcnet.callbacks` instances (checkpoints, loggers, early
        stopping), called in order: put callbacks that add log entries
        (``LearningRateLogger``) before the loggers that write them. With several
        steps per dispatch, ``on_step_end`` runs once per dispatch, after its last step,
        and ``on_step_begin`` (called only on callbacks that define it) once before it.
      progress: what fit shows of each epoch, on stderr. By default (``None``) one
        summary line at each epoch's end, in a terminal, a notebook or a log file alike
        (``epoch 2/5: 8 steps, 0.41 s, loss=0.3125 eval_acc=0.89``: the step's metrics,
        the evaluation's and what callbacks added, as in ``history``), and while the
        epoch trains a progress bar with loss and samples/s, left in place when the
        epoch ends, when tqdm is installed and the output is interactive (stderr a
        terminal, or a Jupyter kernel: ``tqdm.auto`` draws a widget there). ``True``:
        the bar in any output; ``False``: nothing. tqdm stays optional (the
        ``examples`` and ``test`` extras): without it the line is shown and no bar
        (``progress=True`` says so once). stderr, not stdout: progress is
        diagnostics, as tqdm's bar and Python's warnings are, so a script's printed
        results stay alone on stdout (``python train.py > results.txt``) and the bar
        and the lines keep their order in one stream.
      log_every: steps between progress-bar refreshes (each one reads a loss from
        the device, so not every step; on a ``DeviceData`` the loss of the dispatch
        before the latest, which never makes the device wait).
      resume_from: a checkpoint directory written by ``callbacks.Checkpoint`` (npz),
        or a :class:`funcnet.checkpoint.Checkpointer` (e.g. an ``OrbaxCheckpointer``);
        training continues from its latest finite checkpoint (state, rng, epoch,
        the position inside the epoch, and the run id, so ``Checkpoint`` may keep
        saving into the same directory). No checkpoint there is an error naming
        the path, unless ``missing_ok=True``.
      missing_ok: with ``resume_from``, start from ``train_state`` when there is no
        checkpoint yet ("resume if present", for scripts restarted by a scheduler).
      on_nonfinite: what a NaN/inf loss does, seen in the metrics fit fetches anyway
        (at every progress refresh and at the end of each epoch; no extra sync):
        ``"raise"`` (default) stops with a ``FloatingPointError`` naming the epoch
        and step, before the epoch's end-of-epoch callbacks; ``"warn"`` warns once
        and trains on; ``"ignore"`` trains on. Either way later checkpoints are
        marked non-finite, and ``Checkpoint(keep=N)`` keeps the last finite one.
      steps_per_dispatch: run up to this many steps per dispatch (a loop on the
        device), so the host's per-dispatch cost is paid once per ``k`` steps; the
        results are those of ``k=1``, bit for bit (except for convolutions on CPU, which
        XLA compiles differently inside the device loop: float rounding, which training
        amplifies; keep ``k``, i.e. ``log_every``, when comparing or resuming a CNN), and a
        dispatch never crosses a multiple of ``k`` global steps, an epoch's end or the edge
        of a ``callbacks.Profile`` window. With a ``DeviceData`` (one
        device or a mesh) the steps gather their batches on the device; with a host
        pipeline on one device, ``train_data(epoch)`` returning
        :func:`funcnet.data.batches`, each dispatch's ``k`` batches are read at once
        (:meth:`funcnet.data.Batches.stacked`: one gather and one copy to the device)
        while the device runs the previous dispatch; other iterables, pmap and a host
        pipeline on a mesh run one step per dispatch. Default (None): ``log_every``
        steps, reduced to divide every ``Checkpoint``'s ``every_steps``; 1 when a
        callback has its own ``on_step_end`` (it then sees every step), the data
        cannot be read several batches at a time, or on CPU the step has a convolution
        (XLA:CPU runs convolutions inside a loop 40-100x slower than dispatched one by
        one, jax issue #12868; on a GPU the loop stays, where it is the faster). An explicit ``k > 1`` needs such
        data, ``Checkpoint(every_steps=N)`` with ``N`` a multiple of ``k``, and calls
        other callbacks' ``on_step_end`` once per dispatch. ``BENCHMARKS.md``
        (workload 6) has the measured effect.
      print_fn: if given (e.g. ``print`` or ``logging.info``), receives each epoch's
        line instead of stderr, as ``key=value`` pairs (``epoch=1 loss=0.3125 ...``),
        whatever ``progress`` is.
      step_options: keyword arguments for :func:`funcnet.train.make_train_step`:
        ``clip_grad_norm``, ``microbatches``, ``ema_decay``, ``ema_start``, ``update``,
        ``grad_norm``, e.g. ``{"clip_grad_norm": 1.0, "microbatches": 4}`` or
        ``{"grad_norm": True}`` to log the gradients' global norm.
      eval_on_ema: evaluate the params' moving average (``ema_decay`` in
        ``step_options``, a TrainState created with ``ema=True``: both are needed, else
        fit refuses before training) instead of the params.
      prefetch: for a host pipeline (``train_data`` not a ``DeviceData``), how many
        batches (or, with several steps per dispatch, dispatches' worth of batches)
        a background thread assembles ahead (:func:`funcnet.data.background`;
        on one accelerator it also starts their copies to the device), so the host's
        data work overlaps with the steps; the batches and the results are the same,
        bit for bit, and an exception from ``train_data`` is raised with the batch
        index added as a note. ``0``: ``train_data`` is iterated on the calling
        thread, one batch at a time (for an iterable that needs that thread). Default
        (None): 2 on an accelerator, 0 on CPU, where the thread did not pay for itself
        with NumPy batching (it helps a pipeline whose work releases the GIL: file
        reads, decoding, large NumPy operations).
      compiler_options: XLA options for the train and evaluation steps (``jax.jit``'s
        ``compiler_options``). Default ``"auto"``: on CPU, for a step with a convolution,
        :func:`funcnet.xla.compiler_options` (convolutions on XLA's multi-threaded
        kernels, reductions and matrix products on YNNPACK's: the Flax MNIST CNN's and
        LeNet's steps 0.83x and 0.79x their plain-``jax.jit`` time, workload 6b, jax 0.10.2);
        otherwise none, so the step is the program ``jax.jit(make_train_step(...))``
        gives a hand-written loop (``funcnet.xla.jit`` gives it the CNN's). None: plain
        ``jax.jit`` always; a dict: these options. Other options change results by float
        rounding (other kernels), not more.

    History: one dict per epoch: ``epoch``, ``loss`` (mean over the epoch's steps), the
    step's other metrics likewise (``grad_norm`` with ``step_options={"grad_norm": True}``
    or clipping), ``eval_*``, ``samples_per_s``, ``seconds``.

    Returns:
      ``(train_state, history)``: the trained :class:`funcnet.train.TrainState` (on the
      host's default device, replicas collapsed to one; the best epoch's with
      ``EarlyStopping(restore_best=True)``) and the list of epoch logs.

    Raises:
      ValueError: ``eval_data``, ``eval_fn`` and ``metric`` not given together; both
        ``devices`` and ``mesh``; a pre-flight check failing (an ``eval_fn`` whose state
        ``metric`` cannot compute, a key a callback monitors that fit will not log); an
        epoch without batches.
      funcnet.errors.ArgumentError: a bad ``epochs``, ``on_nonfinite`` or ``step_options``;
        ``eval_on_ema=True`` without an evaluation or without an EMA a step updates.
      FloatingPointError: a NaN/inf loss with ``on_nonfinite="raise"`` (naming a NaN/inf
        learning rate when the optimizer is the cause), or a learning rate already
        NaN/inf at the first step (``optax.inject_hyperparams``, ``LearningRateLogger``).
        Any exception raised while training carries the state trained so far as its
        ``.train_state``; callbacks' ``on_train_error`` runs before it propagates.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, batch, rng):
      ...     pred, state = net.apply(params, state, batch["x"])
      ...     return jnp.mean((pred - batch["y"]) ** 2), funcnet.Aux(state=state)
      >>> x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(8, 2)
      >>> data = funcnet.data.DeviceData({"x": x, "y": x.sum(1, keepdims=True)}, 4,
      ...                                shuffle=True, rng=0)
      >>> ts = TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> ts, history = fit(ts, loss_fn, opt, data, epochs=2, progress=False)
      >>> int(ts.step), sorted(history[0])
      (4, ['epoch', 'loss', 'samples_per_s', 'seconds'])
      >>> history[1]["loss"] < history[0]["loss"]
      True
    """
    if (eval_data is None) != (eval_fn is None) or (eval_fn is not None and metric is None):
        raise ValueError("fit: evaluation needs eval_data, eval_fn and metric together.")
    on_nonfinite = checks.one_of("fit", "on_nonfinite", on_nonfinite, ("raise", "warn", "ignore"))
    callbacks = list(callbacks)
    layout = data_layout(train_data)
    train_state, position, run_id, resumed = resume(
        resume_from, missing_ok, train_state, checkpoint_extras(callbacks, layout, train_state))
    check_layout(resumed, layout)
    step_options = _step_options(step_options)
    check_before_training(train_state, loss_fn, optimizer, train_data, eval_data, eval_fn,
                           metric, callbacks, epochs, step_options)
    check_fit_options(train_state, step_options, eval_on_ema, eval_fn, callbacks, on_nonfinite)

    if mesh is not None and devices is not None:
        raise ValueError(f"fit: give either devices={devices!r} (pmap) or mesh= (jit over a "
                         f"mesh), not both.")
    n_dev = distributed.local_device_count(devices) if devices else None
    train_data, eval_data = _place_device_data(train_data, mesh), _place_device_data(eval_data, mesh)
    take = train_data.take if isinstance(train_data, data_lib.DeviceData) and not n_dev else None
    log_every = checks.positive_int("fit", "log_every", log_every)
    several_asked = steps_per_dispatch not in (None, 1)
    conv_on_cpu = functools.cache(lambda: _convolves_on_cpu(train_state, loss_fn, train_data))
    steps_per_dispatch = _check_dispatch(
        steps_per_dispatch, take is not None or _stacks_host_batches(n_dev, mesh), callbacks,
        log_every, lambda: not conv_on_cpu())
    if prefetch is None:
        # Measured (BENCHMARKS.md, workload 6): on CPU the thread only adds GIL hand-offs
        # to NumPy gathers that hold the GIL; on an accelerator it overlaps the copies.
        prefetch = 0 if jax.default_backend() == "cpu" else 2
    prefetch = checks.non_negative_int("fit", "prefetch", prefetch)
    loop = _Loop(train_state, n_dev, mesh, prefetch)
    steps = _compile(loss_fn, optimizer, eval_fn, n_dev, mesh, take, steps_per_dispatch,
                     sharding.state_shardings(loop.state) if mesh is not None else None,
                     step_options, checks.flag("fit", "eval_on_ema", eval_on_ema),
                     several_asked, _compiler_options(compiler_options, conv_on_cpu))
    ctx, resumed_sums = _context(loop, train_state, loss_fn, train_data, callbacks, layout,
                                 run_id, resumed, position, epochs)
    ctx._optimizer_note = lambda step: optimizer_note(optimizer, train_state, step)
    shown = _Shown(progress, print_fn, epochs)

    try:
        for cb in callbacks:
            cb.on_train_begin(ctx)
        for epoch in range(position.epoch, epochs):
            ctx.epoch = epoch
            t0 = time.perf_counter()
            bar, first = shown.bar(epoch), ctx.host_step
            skip = position.batch_in_epoch if epoch == position.epoch else 0
            ctx._carried = resumed_sums if epoch == position.epoch and skip else None
            ctx._epoch_folded = (0, 0, None)
            run_epoch = _train_epoch_device if steps.on_device is not None else _train_epoch
            step_metrics, seen = run_epoch(loop, steps, ctx, callbacks, train_data, epoch, skip,
                                           bar, log_every, on_nonfinite)
            host_metrics = jax.device_get(step_metrics)
            _check_losses(ctx, host_metrics, epoch, ctx.host_step, on_nonfinite)
            logs = {"epoch": epoch, **_mean_metrics(ctx, host_metrics)}
            seconds = time.perf_counter() - t0
            logs["samples_per_s"] = seen / seconds if seconds > 0 else math.nan
            if steps.eval is not None:
                logs.update(_evaluate(loop, steps, metric, eval_data, epoch))
            logs["seconds"] = time.perf_counter() - t0
            shown.close(bar, ctx.host_step - first)
            _end_epoch(ctx, callbacks, epoch, logs, shown, ctx.host_step - first)
            if ctx.stop_training:
                break
        for cb in callbacks:
            cb.on_train_end(ctx)
    except BaseException as e:
        shown.abandon()
        _attach_train_state(e, loop)
        _tell_error(callbacks, ctx, e)
        raise
    return loop.host_state(), ctx.history


def _tell_error(callbacks, ctx, error: BaseException) -> None:
    """Calls each callback's ``on_train_error`` (e.g. ``Profile`` stops its trace, which
    left running would fail every later trace in the process); a failure there becomes
    a note on ``error``, which stays the one raised."""
    for cb in callbacks:
        hook = getattr(cb, "on_train_error", None)
        if hook is None:
            continue
        try:
            hook(ctx, error)
        except Exception as inner:
            if hasattr(error, "add_note"):
                error.add_note(f"fit: {type(cb).__name__}.on_train_error also failed: "
                               f"{type(inner).__name__}: {inner}")


def _context(loop, train_state, loss_fn, train_data, callbacks, layout, run_id, resumed,
             position, epochs):
    """The run's :class:`FitContext`, with what a resumed checkpoint holds restored (data
    layout, callback states); also the resumed epoch's metric sums, if any."""
    ctx = FitContext(loop)
    ctx.run_id = run_id
    ctx._data_layout = layout
    ctx.checkpoint_extras = lambda ts: checkpoint_extras(
        callbacks, ctx._data_layout, ts, _epoch_sums_now(ctx))
    if isinstance(train_data, data_lib.DeviceData):
        ctx._batch_spec = first_batch(train_data)  # a host pipeline's: its first batch's
    ctx._float16 = lambda: _computes_in_float16(train_state, loss_fn, ctx._batch_spec)
    ctx._resumed = resumed
    resumed_sums = None
    if resumed is not None:
        if resumed.get("epoch_metrics") is not None:
            resumed_sums = EpochSums.from_tree(resumed["epoch_metrics"])
        ctx._data_layout = {k: v if int(v) != -1 else resumed["data"][k]
                            for k, v in layout.items()}
        for key, cb in stateful(callbacks, train_state):
            cb.restore_checkpoint_state(resumed["callbacks"][key])
    ctx.host_step = int(jax.device_get(train_state.step))
    if isinstance(train_data, data_lib.DeviceData):
        full, tail = train_data.order(0)
        per_epoch = len(full) + (tail is not None)
        ctx.planned_steps = ctx.host_step + per_epoch * (epochs - position.epoch) \
            - position.batch_in_epoch
    return ctx, resumed_sums


def _attach_train_state(error: BaseException, loop) -> None:
    """Keeps the trained state reachable when fit fails after training started (a
    callback writing to a full disk, a KeyboardInterrupt, a non-finite loss): the
    exception gets ``train_state``, the latest state on the host, so the epochs
    already trained are not lost with the failure."""
    try:
        error.train_state = loop.host_state()
    except Exception:  # the failure may have left no readable state (e.g. donated buffers)
        return
    if hasattr(error, "add_note"):
        error.add_note("fit: the state trained so far is on this exception as .train_state.")


_STEP_OPTIONS = ("clip_grad_norm", "microbatches", "ema_decay", "ema_start", "update", "grad_norm")


def _step_options(options) -> dict:
    """``fit(step_options=...)``: the keyword arguments of ``make_train_step`` it passes on."""
    if options is None:
        return {}
    if not isinstance(options, dict) or set(options) - set(_STEP_OPTIONS):
        unknown = sorted(set(options) - set(_STEP_OPTIONS)) if isinstance(options, dict) else None
        raise checks.ArgumentError(
            f"fit: step_options must be a dict of make_train_step's options "
            f"{list(_STEP_OPTIONS)}" + (f"; unknown: {unknown}" if unknown else
                                        f", got {type(options).__name__}") +
            ". E.g. step_options={'clip_grad_norm': 1.0, 'microbatches': 4}.")
    return dict(options)


def _place_device_data(data, mesh):
    """A :class:`funcnet.data.DeviceData` placed where the steps run: split over ``mesh``,
    or whole on the default device (one device, pmap); anything else as it is."""
    return data.placed(mesh) if isinstance(data, data_lib.DeviceData) else data


def _check_dispatch(k, several_ok: bool, callbacks, log_every: int,
                    loop_pays: Callable[[], bool] = lambda: True) -> int:
    """The steps per dispatch: ``k`` checked, or the default (see ``fit``).
    ``several_ok``: the placement can run several (a ``DeviceData`` on one device or a
    mesh, or a host pipeline on one device); ``loop_pays()``: whether a loop on the
    device is worth it for this step here (asked only for the default)."""
    everies = [e for e in (getattr(cb, "every_steps", None) for cb in callbacks) if e]
    if k is None:
        if not several_ok or _per_step_callbacks(callbacks) or not loop_pays():
            return 1
        return math.gcd(log_every, *everies)
    k = checks.positive_int("fit", "steps_per_dispatch", k)
    if k == 1:
        return k
    if not several_ok:
        raise ValueError(f"fit: steps_per_dispatch={k} needs train_data=funcnet.data.DeviceData"
                         f"(...) on one device or a mesh, or a host pipeline of "
                         f"funcnet.data.batches on one device; pmap (devices=N) and a host "
                         f"pipeline on a mesh run one step per dispatch.")
    for cb in callbacks:
        every = getattr(cb, "every_steps", None)
        if every and every % k:
            raise ValueError(f"fit: {type(cb).__name__}(every_steps={every}) would fall inside a "
                             f"dispatch of steps_per_dispatch={k} steps; use an every_steps "
                             f"that is a multiple of {k}, or a smaller steps_per_dispatch.")
    return k


def _convolves_on_cpu(train_state, loss_fn, train_data) -> bool:
    """Whether the step runs a convolution on XLA:CPU, where fit's defaults differ for it:

    * one step per dispatch instead of a loop on the device: XLA:CPU runs a convolution
      inside a loop far slower than in a dispatch of its own (jax issue #12868): the
      gradient of one 3x3 convolution, (128, 14, 14, 32) -> 64 channels, 37 ms per
      dispatch and 1,591 ms per step in a ``lax.scan`` (jax 0.10.2; 19 vs 1,454 ms on
      0.12), while a CNN step's dispatch costs microseconds against its milliseconds of
      work. On a GPU the loop pays (LeNet on an H200: 0.24 ms a step in the loop, 0.54 ms
      dispatched).
    * :func:`funcnet.xla.compiler_options`, which move convolutions to XLA's
      multi-threaded kernels (that module has the figures).

    A step that cannot be traced ahead (no batch to trace with) counts as without."""
    if jax.default_backend() != "cpu":
        return False
    jaxpr = loss_jaxpr(train_state, loss_fn, first_batch(train_data))
    return jaxpr is not None and any_eqn(
        jaxpr, lambda eqn: eqn.primitive.name == "conv_general_dilated")


def _compiler_options(options, conv_on_cpu: Callable[[], bool]) -> dict:
    """``fit``'s ``compiler_options`` checked: ``"auto"`` (funcnet's options for a step
    with a convolution on CPU, else none), None (plain ``jax.jit``) or a dict."""
    if isinstance(options, str) and options == "auto":
        return xla.compiler_options() if conv_on_cpu() else {}
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"fit: compiler_options must be 'auto', a dict of XLA option names to "
                        f"values (e.g. funcnet.xla.compiler_options()) or None (plain jax.jit), "
                        f"got {type(options).__name__} {options!r}.")
    return dict(options)


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


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class _Shown:
    """What fit shows of each epoch (``fit``'s ``progress`` and ``print_fn``): a tqdm
    bar while it trains, left in place when it ends, and one summary line after it."""

    def __init__(self, progress, print_fn, epochs: int):
        self.epochs, self.print_fn = epochs, print_fn
        self.line = progress is not False
        self.tqdm = _tqdm(progress)
        self.open = None

    def bar(self, epoch: int):
        if self.tqdm is not None:
            self.open = self.tqdm(desc=f"epoch {epoch + 1}/{self.epochs}", unit="step",
                                  leave=True, dynamic_ncols=True)
        return self.open

    def close(self, bar, steps: int) -> None:
        """Closes an epoch's bar at the epoch's step count: the runners move it every
        ``log_every`` steps only, so the last ones would be missing from the bar left."""
        if bar is not None:
            bar.update(max(steps - bar.n, 0))
        self.abandon()

    def abandon(self) -> None:
        """Closes the bar where it stands (fit failed mid-epoch): one left open would push
        every later bar of the process a line down (tqdm's ``position``)."""
        if self.open is not None:
            self.open.close()
            self.open = None

    def summary(self, epoch: int, steps: int, logs: dict) -> None:
        if self.print_fn is not None:  # the caller's line, in the caller's format
            self.print_fn(" ".join(f"{k}={_fmt(v)}" for k, v in logs.items()))
        elif self.line and sys.stderr is not None:  # None: pythonw, no console at all
            print(_summary_line(epoch, self.epochs, steps, logs), file=sys.stderr, flush=True)


_NOT_IN_LINE = ("epoch", "samples_per_s", "seconds")


def _summary_line(epoch: int, epochs: int, steps: int, logs: dict) -> str:
    """``epoch 2/5: 8 steps, 0.41 s, loss=0.3125 acc=0.91 eval_acc=0.89``: the epoch's
    logs in their order (the step's metrics, ``eval_*``, then what callbacks added),
    as Keras's ``fit`` prints one line per epoch when its output is not a terminal."""
    values = " ".join(f"{k}={_fmt(v)}" for k, v in logs.items() if k not in _NOT_IN_LINE)
    return (f"epoch {epoch + 1}/{epochs}: {steps} step{'s' * (steps != 1)}, "
            f"{logs.get('seconds', math.nan):.2f} s, {values}")


def _tqdm(progress):
    """tqdm's bar class (``tqdm.auto``: a widget in a notebook) when fit draws a bar:
    tqdm installed, and ``progress=True`` or (None) output where a bar redraws."""
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            print("fit: progress=True but tqdm is not installed (pip install tqdm); showing "
                  "one summary line per epoch without a progress bar.", file=sys.stderr)
        return None
    return tqdm if progress or _interactive() else None


def _interactive() -> bool:
    """Whether a bar can redraw in place: stderr is a terminal, or fit runs in a Jupyter
    kernel, whose stderr is a pipe but where ``tqdm.auto`` draws a widget (tqdm's own
    test, in ``tqdm.autonotebook``). In a log file a bar is a line per refresh."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and isatty():
        return True
    ipython = sys.modules.get("IPython")  # a kernel has imported it; fit never does
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
