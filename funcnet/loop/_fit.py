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
from funcnet.loop._checks import check_before_training, check_fit_options, first_batch, optimizer_note
from funcnet.loop._context import _Run
from funcnet.loop._epoch import DISPATCH_GROWTH, _end_epoch, _evaluate, _every_steps, _per_step_callbacks, _train_epoch
from funcnet.loop._metrics import _check_losses, _computes_in_float16, _epoch_sums_now, _mean_metrics
from funcnet.loop._options import FitOptions, _from_keywords
from funcnet.loop._placement import _compile, _placement
from funcnet.loop._progress import _Shown
from funcnet.loop._resume import EpochSums, check_layout, checkpoint_extras, resume, stateful
from funcnet.loop._sources import placed_data, source_for
from funcnet.train import TrainState

__all__ = ["fit"]


def fit(
    train_state: TrainState,
    loss_fn: Callable,
    optimizer: optax.GradientTransformation,
    train_data,
    *,
    epochs: int = 1,
    eval_data=None,
    eval_fn: Optional[Callable] = None,
    metric=None,
    callbacks: Iterable = (),
    mesh: Optional[jax.sharding.Mesh] = None,
    resume_from=None,
    progress: Optional[bool] = None,
    options: Optional[FitOptions] = None,
    **deprecated,
) -> tuple[TrainState, list]:
    """Trains for ``epochs`` epochs; returns ``(train_state, history)``.

    The common call is ``fit(train_state, loss_fn, optimizer, train_data, epochs=N)``,
    with ``eval_data``, ``eval_fn`` and ``metric`` for an evaluation after each epoch
    and ``callbacks`` for checkpoints, logs and early stopping. Where the steps run is
    ``mesh``; ``resume_from`` continues a run; ``progress`` is what is shown. Settings
    a run rarely changes (step options, non-finite losses, dispatch and compiler
    speed, the log cadence) are one :class:`funcnet.loop.FitOptions` record.

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
        (``FitOptions.steps_per_dispatch``), so no per-step host work is left. The host
        pipeline (``lambda epoch: funcnet.data.batches(arrays, batch_size,
        shuffle=True, rng=seed, epoch=epoch)``) is for data that does not fit; for the
        same arguments both give the same batches, so the same result bit for bit.
        Batches may be NumPy, JAX, PyTorch tensors (a ``DataLoader`` too), tf.data or
        grain elements: each leaf becomes an array once, on the host. Use a seeded
        shuffle when you want resuming to reproduce the data order.
      epochs: how many epochs to train (default 1); a resumed run trains up to this
        epoch count, not this many more.
      eval_data: the evaluation batches after every epoch, as ``train_data`` is read
        (a ``DeviceData`` too). Default None: no evaluation; given, ``eval_fn`` and
        ``metric`` must be too.
      eval_fn: ``eval_fn(params, state, batch)`` returns a metric state of ``metric``;
        batch states are added. Default None.
      metric: a ``funcnet.metrics`` metric or collection; ``metric.compute`` of the
        added states gives the ``eval_*`` entries of the logs. Default None.
      callbacks: :mod:`funcnet.callbacks` instances (checkpoints, loggers, early
        stopping; default ``()``: none), called in order: put callbacks that add log
        entries (``LearningRateLogger``) before the loggers that write them. With several
        steps per dispatch, ``on_step_end`` runs once per dispatch, after its last step,
        and ``on_step_begin`` (called only on callbacks that define it) once before it.
      mesh: default None (one device, ``jax.jit``); a ``jax.sharding.Mesh``, 1-D
        (:func:`funcnet.distributed.data_mesh`) or with a ``"data"`` axis (2-D
        ``("data", "model")`` for tensor parallelism). A train state already placed on
        this mesh (:func:`funcnet.sharding.shard_params`: FSDP, tensor parallel) is kept
        as given, step after step; any other is placed whole on each device. Every
        batch is split over the data axis (:func:`funcnet.distributed.shard_batch`;
        batches already split that way, e.g. by ``shard_local_batch`` in a
        multi-process run, pass through), and the plain ``jax.jit`` step runs on them:
        XLA inserts the gradient all-reduce (and, for a sharded state, the gathers and
        reduce-scatters). The result equals one device's on the same global batches.
        A ``DeviceData`` is split over the data axis (each device holds ``1/N`` of the
        examples) and every step gathers its global batch split over the devices.
      resume_from: default None (a fresh run); a checkpoint directory written by
        ``callbacks.Checkpoint`` (npz), or a :class:`funcnet.checkpoint.Checkpointer`
        (e.g. an ``OrbaxCheckpointer``); training continues from its latest finite
        checkpoint (state, rng, epoch, the position inside the epoch, and the run id,
        so ``Checkpoint`` may keep saving into the same directory). No checkpoint there
        is an error naming the path, unless ``FitOptions(missing_ok=True)``.
      progress: what fit shows of each epoch, on stderr. By default (``None``) one
        summary line at each epoch's end, in a terminal, a notebook or a log file alike
        (``epoch 2/5: 8 steps, 0.41 s, loss=0.3125 eval_acc=0.89``: the step's metrics,
        the evaluation's and what callbacks added, as in ``history``), and while the
        epoch trains a progress bar with loss and samples/s, left in place when the
        epoch ends, when tqdm is installed and the output is interactive (stderr a
        terminal, or a Jupyter kernel: ``tqdm.auto`` draws a widget there). ``True``:
        the bar in any output; ``False``: nothing. tqdm stays optional (the
        ``examples`` and ``test`` extras): without it the line is shown and no bar
        (``progress=True`` says so once). stderr, not stdout: progress is diagnostics,
        as tqdm's bar and Python's warnings are, so a script's printed results stay
        alone on stdout. ``FitOptions`` sets the bar's cadence (``log_every``) and
        where the line goes (``print_fn``).
      options: a :class:`funcnet.loop.FitOptions` (default None: every default).
      **deprecated: the keywords of funcnet 0.1 that are now ``FitOptions`` fields
        (``step_options``, ``eval_on_ema``, ``on_nonfinite``, ``missing_ok``,
        ``log_every``, ``print_fn``, ``steps_per_dispatch``, ``prefetch``,
        ``compiler_options``) and ``devices=N`` (pmap replicas; use
        ``mesh=funcnet.distributed.data_mesh(N)``) still work, with a
        ``DeprecationWarning`` that gives the new spelling.

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
      TypeError: a keyword fit does not take (with the closest name), or a deprecated
        keyword given beside ``options``.
      funcnet.errors.ArgumentError: a bad ``epochs`` or ``FitOptions`` field;
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
    options, devices = _from_keywords(options, deprecated)
    if (eval_data is None) != (eval_fn is None) or (eval_fn is not None and metric is None):
        raise ValueError("fit: evaluation needs eval_data, eval_fn and metric together.")
    on_nonfinite, log_every = options.on_nonfinite, options.log_every
    callbacks = list(callbacks)
    source = source_for(train_data)
    layout = source.layout()
    train_state, position, run_id, resumed = resume(
        resume_from, options.missing_ok, train_state, checkpoint_extras(callbacks, layout, train_state)
    )
    check_layout(resumed, layout)
    step_options = options.step_options or {}
    check_before_training(
        train_state, loss_fn, optimizer, train_data, eval_data, eval_fn, metric, callbacks, epochs, step_options
    )
    check_fit_options(train_state, step_options, options.eval_on_ema, eval_fn, callbacks, on_nonfinite)

    placement = _placement(devices, mesh)
    source, eval_data = source.placed(placement), placed_data(eval_data, placement)
    take = source.take
    several_asked = options.steps_per_dispatch not in (None, 1)
    conv_on_cpu = functools.cache(lambda: _convolves_on_cpu(train_state, loss_fn, source))
    steps_per_dispatch = _check_dispatch(
        options.steps_per_dispatch,
        source.several_per_dispatch(placement),
        callbacks,
        log_every,
        lambda: not conv_on_cpu(),
    )
    loop = placement.hold(train_state, _prefetch(options.prefetch))
    steps = _compile(
        loss_fn,
        optimizer,
        eval_fn,
        loop,
        take,
        step_options,
        steps_per_dispatch,
        options.eval_on_ema,
        several_asked,
        _compiler_options(options.compiler_options, conv_on_cpu),
        _dispatch_bound(options.steps_per_dispatch, steps_per_dispatch),
        _race_steps(options.compiler_options, source, epochs, position),
    )
    run, resumed_sums = _run_record(
        loop, train_state, loss_fn, source, callbacks, layout, run_id, resumed, position, epochs
    )
    run.optimizer_note = lambda step: optimizer_note(optimizer, train_state, step)
    ctx = run.ctx
    shown = _Shown(progress, options.print_fn, epochs)

    try:
        for cb in callbacks:
            cb.on_train_begin(ctx)
        for epoch in range(position.epoch, epochs):
            skip = position.batch_in_epoch if epoch == position.epoch else 0
            run.carried = resumed_sums if epoch == position.epoch and skip else None
            _run_epoch(run, steps, callbacks, source, epoch, skip, shown, (metric, eval_data), options)
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


def _run_epoch(run, steps, callbacks, source, epoch, skip, shown, evaluation, options) -> None:
    """One epoch of ``fit``: its steps (from batch ``skip`` in the epoch a run resumes
    inside), the epoch's metrics, the evaluation (``(metric, eval_data)``), the
    end-of-epoch callbacks and the summary line."""
    ctx = run.ctx
    ctx.epoch = epoch
    t0 = time.perf_counter()
    bar, first = shown.bar(epoch), ctx.host_step
    run.epoch_folded = (0, 0, None)
    step_metrics, seen = _train_epoch(
        run,
        steps,
        callbacks,
        source,
        epoch,
        skip,
        bar=bar,
        log_every=options.log_every,
        on_nonfinite=options.on_nonfinite,
    )
    _check_losses(run, step_metrics, epoch, ctx.host_step, options.on_nonfinite)
    logs = {"epoch": epoch, **_mean_metrics(run, step_metrics)}
    seconds = time.perf_counter() - t0
    logs["samples_per_s"] = seen / seconds if seconds > 0 else math.nan
    if steps.eval is not None:
        logs.update(_evaluate(run.loop, steps, *evaluation, epoch))
    logs["seconds"] = time.perf_counter() - t0
    shown.close(bar, ctx.host_step - first)
    _end_epoch(ctx, callbacks, epoch, logs, shown, ctx.host_step - first)


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
                error.add_note(f"fit: {type(cb).__name__}.on_train_error also failed: {type(inner).__name__}: {inner}")


def _run_record(loop, train_state, loss_fn, source, callbacks, layout, run_id, resumed, position, epochs):
    """The run's record (``_context._Run``) and its :class:`FitContext`, with what a
    resumed checkpoint holds restored (data layout, callback states); also the resumed
    epoch's metric sums, if any. ``source``: the data source (``_sources._Source``)."""
    run = _Run(loop)
    ctx = run.ctx
    ctx.run_id = run_id
    run.data_layout = layout
    ctx.checkpoint_extras = lambda ts: checkpoint_extras(callbacks, run.data_layout, ts, _epoch_sums_now(run))
    run.batch_spec = source.batch_spec()  # None for a host pipeline: its first batch's
    run.float16 = lambda: _computes_in_float16(train_state, loss_fn, run.batch_spec)
    run.resumed = resumed
    resumed_sums = None
    if resumed is not None:
        if resumed.get("epoch_metrics") is not None:
            resumed_sums = EpochSums.from_tree(resumed["epoch_metrics"])
        run.data_layout = {k: v if int(v) != -1 else resumed["data"][k] for k, v in layout.items()}
        for key, cb in stateful(callbacks, train_state):
            cb.restore_checkpoint_state(resumed["callbacks"][key])
    ctx.host_step = int(jax.device_get(train_state.step))
    per_epoch = source.steps_per_epoch
    if per_epoch is not None:
        ctx.planned_steps = ctx.host_step + per_epoch * (epochs - position.epoch) - position.batch_in_epoch
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


def _prefetch(prefetch) -> int:
    """``FitOptions.prefetch``, or its default for this backend."""
    if prefetch is None:
        # Measured (BENCHMARKS.md, workload 6): on CPU the thread only adds GIL hand-offs
        # to NumPy gathers that hold the GIL; on an accelerator it overlaps the copies.
        prefetch = 0 if jax.default_backend() == "cpu" else 2
    return prefetch


def _check_dispatch(
    k, several_ok: bool, callbacks, log_every: int, loop_pays: Callable[[], bool] = lambda: True
) -> int:
    """The steps per dispatch: ``k`` checked, or the default (see ``fit``).
    ``several_ok``: the placement can run several (a ``DeviceData`` on one device or a
    mesh, or a host pipeline on one device); ``loop_pays()``: whether a loop on the
    device is worth it for this step here (asked only for the default)."""
    everies = _every_steps(callbacks)
    if k is None:
        if not several_ok or _per_step_callbacks(callbacks) or not loop_pays():
            return 1
        return math.gcd(log_every, *everies)
    k = checks.positive_int("fit", "steps_per_dispatch", k)
    if k == 1:
        return k
    if not several_ok:
        raise ValueError(
            f"fit: steps_per_dispatch={k} needs train_data=funcnet.data.DeviceData"
            f"(...) on one device or a mesh, or a host pipeline of "
            f"funcnet.data.batches on one device; pmap (devices=N) and a host "
            f"pipeline on a mesh run one step per dispatch."
        )
    for cb in callbacks:
        every = getattr(cb, "every_steps", None)
        if every and every % k:
            raise ValueError(
                f"fit: {type(cb).__name__}(every_steps={every}) would fall inside a "
                f"dispatch of steps_per_dispatch={k} steps; use an every_steps "
                f"that is a multiple of {k}, or a smaller steps_per_dispatch."
            )
    return k


def _dispatch_bound(asked: Optional[int], k: int) -> int:
    """The most steps one dispatch of the device loop may run: ``k``, or for the default
    (``asked`` None, ``k > 1``) in a single process ``DISPATCH_GROWTH * k``, which the
    epoch loop uses where steps are short (``_epoch._grown``). Never with several
    processes: each times its own steps, and processes that cut their epochs into
    different dispatches would stop matching each other's collectives."""
    if asked is not None or k == 1 or jax.process_count() > 1:
        return k
    return DISPATCH_GROWTH * k


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
    return jaxpr is not None and any_eqn(jaxpr, lambda eqn: eqn.primitive.name == "conv_general_dilated")


def _race_steps(options, source, epochs: int, position) -> Optional[int]:
    """The steps left to train where fit races XLA:CPU's loop fusions split against
    unsplit (``compiler_options="auto"`` on CPU, the epochs' steps known ahead: a
    ``DeviceData``), else None: XLA's default."""
    per_epoch = source.steps_per_epoch
    if not isinstance(options, str) or jax.default_backend() != "cpu" or per_epoch is None:
        return None
    return per_epoch * (epochs - position.epoch) - position.batch_in_epoch


def _compiler_options(options, conv_on_cpu: Callable[[], bool]) -> dict:
    """``FitOptions.compiler_options`` (checked there) made concrete: ``"auto"`` is
    funcnet's options for a step with a convolution on CPU, else none."""
    if isinstance(options, str):  # "auto"
        return xla.compiler_options() if conv_on_cpu() else {}
    return dict(options or {})
