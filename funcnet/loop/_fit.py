"""``fit`` and its argument handling: check the arguments, restore, place, compile, run.

``fit`` itself reads top to bottom: the checks made before the first step
(``_checks``), restoring a checkpoint (``_resume``), placing the state and compiling
the steps (``_placement``), the run record and the context callbacks see
(``_context``), then per epoch the steps (``_epoch``), the epoch's metrics
(``_metrics``), evaluation, the end-of-epoch callbacks and the summary line (``_progress``).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Callable, Iterable, Optional

import jax
import optax

from funcnet import _checks as checks
from funcnet import xla
from funcnet._jaxpr import any_eqn, loss_jaxpr
from funcnet.loop._checks import (check_before_training, check_fit_options, first_batch,
                                  optimizer_note)
from funcnet.loop._context import _Run
from funcnet.loop._epoch import _end_epoch, _evaluate, _per_step_callbacks, _train_epoch
from funcnet.loop._metrics import (_check_losses, _computes_in_float16, _epoch_sums_now,
                                   _mean_metrics)
from funcnet.loop._placement import _compile, _placement
from funcnet.loop._progress import _Shown
from funcnet.loop._resume import EpochSums, check_layout, checkpoint_extras, resume, stateful
from funcnet.loop._sources import placed_data, source_for
from funcnet.train import TrainState

__all__ = ["fit"]


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
      loss_fn: ``loss_fn(params, state, batch, rng)``, as for
        :func:`funcnet.train.make_train_step`. Arrays a loss_fn returns in
        ``Aux(outputs=...)`` are dropped by ``fit`` (it keeps metrics only); call the
        step from ``make_train_step`` to receive them.
      optimizer: the optax ``GradientTransformation`` the train state was created with,
        as for :func:`funcnet.train.make_train_step`.
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
      epochs: how many epochs to train (default 1); a resumed run trains up to this
        epoch count, not this many more.
      eval_data: the evaluation batches after every epoch, as ``train_data`` is read
        (a ``DeviceData`` too). Default None: no evaluation; given, ``eval_fn`` and
        ``metric`` must be too.
      eval_fn: ``eval_fn(params, state, batch)`` returns a metric state of ``metric``;
        batch states are added. Default None.
      metric: a ``funcnet.metrics`` metric or collection; ``metric.compute`` of the
        added states gives the ``eval_*`` entries of the logs. Default None.
      mesh: default None; a ``jax.sharding.Mesh``, 1-D
        (:func:`funcnet.distributed.data_mesh`) or with a ``"data"`` axis (2-D
        ``("data", "model")`` for tensor parallelism).
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
        stopping; default ``()``: none), called in order: put callbacks that add log entries
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
      log_every: steps between progress-bar refreshes (default 50; each one reads a
        loss from the device, so not every step; on a ``DeviceData`` the loss of the dispatch
        before the latest, which never makes the device wait).
      resume_from: default None (a fresh run); a checkpoint directory written by
        ``callbacks.Checkpoint`` (npz), or a :class:`funcnet.checkpoint.Checkpointer` (e.g. an ``OrbaxCheckpointer``);
        training continues from its latest finite checkpoint (state, rng, epoch,
        the position inside the epoch, and the run id, so ``Checkpoint`` may keep
        saving into the same directory). No checkpoint there is an error naming
        the path, unless ``missing_ok=True``.
      missing_ok: with ``resume_from``, start from ``train_state`` when there is no
        checkpoint yet (default False: an error) ("resume if present", for scripts restarted by a scheduler).
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
      print_fn: default None (stderr); if given (e.g. ``print`` or ``logging.info``),
        receives each epoch's line instead of stderr, as ``key=value`` pairs (``epoch=1 loss=0.3125 ...``),
        whatever ``progress`` is.
      step_options: default None (none); keyword arguments for
        :func:`funcnet.train.make_train_step`:
        ``clip_grad_norm``, ``microbatches``, ``ema_decay``, ``ema_start``, ``update``,
        ``grad_norm``, e.g. ``{"clip_grad_norm": 1.0, "microbatches": 4}`` or
        ``{"grad_norm": True}`` to log the gradients' global norm.
      eval_on_ema: default False; True evaluates the params' moving average (``ema_decay`` in
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
    source = source_for(train_data)
    layout = source.layout()
    train_state, position, run_id, resumed = resume(
        resume_from, missing_ok, train_state, checkpoint_extras(callbacks, layout, train_state))
    check_layout(resumed, layout)
    step_options = _step_options(step_options)
    check_before_training(train_state, loss_fn, optimizer, train_data, eval_data, eval_fn,
                           metric, callbacks, epochs, step_options)
    check_fit_options(train_state, step_options, eval_on_ema, eval_fn, callbacks, on_nonfinite)

    placement = _placement(devices, mesh)
    source, eval_data = source.placed(placement), placed_data(eval_data, placement)
    take = source.take
    log_every = checks.positive_int("fit", "log_every", log_every)
    several_asked = steps_per_dispatch not in (None, 1)
    conv_on_cpu = functools.cache(lambda: _convolves_on_cpu(train_state, loss_fn, source))
    steps_per_dispatch = _check_dispatch(
        steps_per_dispatch, source.several_per_dispatch(placement), callbacks,
        log_every, lambda: not conv_on_cpu())
    loop = placement.hold(train_state, _prefetch(prefetch))
    steps = _compile(loss_fn, optimizer, eval_fn, loop, take, step_options, steps_per_dispatch,
                     checks.flag("fit", "eval_on_ema", eval_on_ema), several_asked,
                     _compiler_options(compiler_options, conv_on_cpu))
    run, resumed_sums = _run_record(loop, train_state, loss_fn, source, callbacks, layout,
                                    run_id, resumed, position, epochs)
    run.optimizer_note = lambda step: optimizer_note(optimizer, train_state, step)
    ctx = run.ctx
    shown = _Shown(progress, print_fn, epochs)

    try:
        for cb in callbacks:
            cb.on_train_begin(ctx)
        for epoch in range(position.epoch, epochs):
            ctx.epoch = epoch
            t0 = time.perf_counter()
            bar, first = shown.bar(epoch), ctx.host_step
            skip = position.batch_in_epoch if epoch == position.epoch else 0
            run.carried = resumed_sums if epoch == position.epoch and skip else None
            run.epoch_folded = (0, 0, None)
            step_metrics, seen = _train_epoch(run, steps, callbacks, source, epoch, skip, bar=bar,
                                              log_every=log_every, on_nonfinite=on_nonfinite)
            host_metrics = jax.device_get(step_metrics)
            _check_losses(run, host_metrics, epoch, ctx.host_step, on_nonfinite)
            logs = {"epoch": epoch, **_mean_metrics(run, host_metrics)}
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


def _run_record(loop, train_state, loss_fn, source, callbacks, layout, run_id, resumed,
                position, epochs):
    """The run's record (``_context._Run``) and its :class:`FitContext`, with what a
    resumed checkpoint holds restored (data layout, callback states); also the resumed
    epoch's metric sums, if any. ``source``: the data source (``_sources._Source``)."""
    run = _Run(loop)
    ctx = run.ctx
    ctx.run_id = run_id
    run.data_layout = layout
    ctx.checkpoint_extras = lambda ts: checkpoint_extras(
        callbacks, run.data_layout, ts, _epoch_sums_now(run))
    run.batch_spec = source.batch_spec()  # None for a host pipeline: its first batch's
    run.float16 = lambda: _computes_in_float16(train_state, loss_fn, run.batch_spec)
    run.resumed = resumed
    resumed_sums = None
    if resumed is not None:
        if resumed.get("epoch_metrics") is not None:
            resumed_sums = EpochSums.from_tree(resumed["epoch_metrics"])
        run.data_layout = {k: v if int(v) != -1 else resumed["data"][k]
                           for k, v in layout.items()}
        for key, cb in stateful(callbacks, train_state):
            cb.restore_checkpoint_state(resumed["callbacks"][key])
    ctx.host_step = int(jax.device_get(train_state.step))
    per_epoch = source.steps_per_epoch
    if per_epoch is not None:
        ctx.planned_steps = ctx.host_step + per_epoch * (epochs - position.epoch) \
            - position.batch_in_epoch
    return run, resumed_sums


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


def _prefetch(prefetch) -> int:
    """``fit(prefetch=)`` checked, or its default for this backend."""
    if prefetch is None:
        # Measured (BENCHMARKS.md, workload 6): on CPU the thread only adds GIL hand-offs
        # to NumPy gathers that hold the GIL; on an accelerator it overlaps the copies.
        prefetch = 0 if jax.default_backend() == "cpu" else 2
    return checks.non_negative_int("fit", "prefetch", prefetch)


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


