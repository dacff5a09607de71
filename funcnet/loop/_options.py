"""``fit``'s less common settings, as one record (:class:`FitOptions`), and the keywords
they replace.

``fit`` keeps as parameters what most calls pass (the data, the evaluation, callbacks,
the mesh, resuming, progress); the settings a run rarely changes, each with a default
that needs no thought, are the fields of one frozen record, checked when it is built.
The keywords ``fit`` took for them before 0.2 still work, with a ``DeprecationWarning``
that names the record's spelling (``_from_keywords``).
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import Any, Callable, Optional

from funcnet import _checks as checks

__all__ = ["FitOptions"]

_STEP_OPTIONS = ("clip_grad_norm", "microbatches", "ema_decay", "ema_start", "update", "grad_norm")
_ON_NONFINITE = ("raise", "warn", "ignore")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitOptions:
    """What a :func:`funcnet.loop.fit` run does beyond its parameters, grouped by concern.

    Every field has a default that needs no thought; give only those you change:
    ``fit(..., options=FitOptions(steps_per_dispatch=10, on_nonfinite="warn"))``. The
    record is frozen and checked when built, so a bad value fails at the line that
    wrote it; ``dataclasses.replace(options, log_every=10)`` makes a changed copy. The
    fields, by concern: what a step does (``step_options``, ``eval_on_ema``,
    ``on_nonfinite``), resuming (``missing_ok``), what is shown (``log_every``,
    ``print_fn``), and speed (``steps_per_dispatch``, ``prefetch``,
    ``compiler_options``), which changes how steps are dispatched and compiled, not
    what they compute.

    Attributes:
      step_options: keyword arguments for :func:`funcnet.train.make_train_step`:
        ``clip_grad_norm``, ``microbatches``, ``ema_decay``, ``ema_start``, ``update``,
        ``grad_norm``, e.g. ``{"clip_grad_norm": 1.0, "microbatches": 4}``, or
        ``{"grad_norm": True}`` to log the gradients' global norm. Default None: none.
      eval_on_ema: True evaluates the params' moving average (``ema_decay`` in
        ``step_options`` and a TrainState created with ``ema=True``: both are needed,
        else fit refuses before training) instead of the params. Default False.
      on_nonfinite: what a NaN/inf loss does, seen in the metrics fit fetches anyway
        (at every progress refresh and at each epoch's end; no extra sync):
        ``"raise"`` (default) stops with a ``FloatingPointError`` naming the epoch and
        step, before the epoch's end-of-epoch callbacks; ``"warn"`` warns once and
        trains on; ``"ignore"`` trains on. Either way later checkpoints are marked
        non-finite, and ``Checkpoint(keep=N)`` keeps the last finite one.
      missing_ok: with ``fit(resume_from=...)``, start from the given train state when
        the directory holds no checkpoint yet (default False: an error naming the
        path). "Resume if present", for scripts a scheduler restarts.
      log_every: steps between progress-bar refreshes (default 50). Each reads a loss
        from the device, so not every step; over a ``DeviceData`` it reads the dispatch
        before the latest, which never makes the device wait.
      print_fn: receives each epoch's summary line instead of stderr, as ``key=value``
        pairs (``epoch=1 loss=0.3125 ...``), whatever ``progress`` is; e.g. ``print``
        or ``logging.getLogger(__name__).info``. Default None: stderr.
      steps_per_dispatch: run up to this many steps per dispatch (a loop on the
        device), so the host's per-dispatch cost is paid once per ``k`` steps. The
        results are those of ``k=1`` bit for bit, except for convolutions on CPU, which
        XLA compiles differently inside the loop (float rounding, which training
        amplifies: keep ``k`` when comparing or resuming a CNN). A dispatch never
        crosses a multiple of ``k`` global steps, an epoch's end or the edge of a
        ``callbacks.Profile`` window. Over a ``DeviceData`` (one device or a mesh) the
        steps gather their batches on the device; over a host pipeline on one device
        (``train_data(epoch)`` returning :func:`funcnet.data.batches`) each dispatch's
        ``k`` batches are read at once (:meth:`funcnet.data.Batches.stacked`: one gather,
        one copy) while the device runs the previous dispatch; other iterables and a
        host pipeline on a mesh run one step per dispatch. Default None: ``log_every``
        steps, reduced to divide every ``Checkpoint``'s ``every_steps``; 1 when a
        callback has its own ``on_step_end`` (it then sees every step), when the data
        cannot be read several batches at a time, or on CPU for a step with a
        convolution (XLA:CPU runs a convolution inside a loop 40-100x slower than
        dispatched alone, jax issue #12868; on a GPU the loop is the faster). Over a
        ``DeviceData``, from the second epoch on, the default's dispatches grow to 2, 4,
        ... up to 16 times that while one lasts at most 0.1 s at the epoch before's step
        time (tqdm's redraw interval, so the bar moves as often) and still divides every
        ``every_steps``: a short step pays the dispatch's fixed cost less often, with the
        same results bit for bit (the loop's program is the same for any count). An
        explicit ``k > 1`` needs such data and ``Checkpoint(every_steps=N)`` with ``N``
        a multiple of ``k``. BENCHMARKS.md (workload 6) has the measured effect.
      prefetch: for a host pipeline, how many batches (with several steps per
        dispatch: dispatches' worth) a background thread assembles ahead
        (:func:`funcnet.data.background`; on an accelerator it also starts their copies
        to the device); the batches and results are the same bit for bit, and an
        exception from ``train_data`` carries the batch index as a note. ``0``: read on
        the calling thread, one batch at a time. Default None: 2 on an accelerator, 0
        on CPU, where the thread did not pay for itself with NumPy batching (it helps a
        pipeline that releases the GIL: file reads, decoding, large NumPy operations).
      compiler_options: XLA options for the train and evaluation steps (``jax.jit``'s
        ``compiler_options``). Default ``"auto"``: on CPU, for a step with a
        convolution, :func:`funcnet.xla.compiler_options` (convolutions on XLA's
        multi-threaded kernels; the Flax MNIST CNN's and LeNet's steps 0.83x and 0.79x
        their plain-``jax.jit`` time, workload 6b, jax 0.10.2), otherwise none; and on
        one CPU device, over a ``DeviceData``, a race: the first dispatches run the
        device loop compiled as XLA splits its loop fusions over the cores and with
        them unsplit (:func:`funcnet.xla.unsplit_fusions`), in turns and timed, and the
        rest the faster (unsplit must be 3% faster). The two compute the same bits, so
        the race changes speed only (a small MLP's epoch 0.65x on jax 0.12, a larger
        one's 1.13x: it depends on the network); it runs only where every loop fusion
        XLA splits is at most 512 KiB and the steps left would take 8 times the first
        compilation, and logs its verdict at INFO on the ``funcnet.loop`` logger. None:
        plain ``jax.jit`` always; a dict: these options (neither races). Options change
        results by float rounding (other kernels), not more.

    Raises:
      funcnet.errors.ArgumentError: a value of the wrong type or out of range, naming
        the field and what it accepts.

    Examples:
      >>> options = FitOptions(log_every=10, on_nonfinite="warn")
      >>> options.log_every, options.steps_per_dispatch
      (10, None)
    """

    step_options: Optional[dict] = None
    eval_on_ema: bool = False
    on_nonfinite: str = "raise"
    missing_ok: bool = False
    log_every: int = 50
    print_fn: Optional[Callable[[str], Any]] = None
    steps_per_dispatch: Optional[int] = None
    prefetch: Optional[int] = None
    compiler_options: Any = "auto"

    def __post_init__(self):
        where = "FitOptions"
        checked = {
            "step_options": _step_options(self.step_options),
            "eval_on_ema": checks.flag(where, "eval_on_ema", self.eval_on_ema),
            "on_nonfinite": checks.one_of(where, "on_nonfinite", self.on_nonfinite, _ON_NONFINITE),
            "missing_ok": checks.flag(where, "missing_ok", self.missing_ok),
            "log_every": checks.positive_int(where, "log_every", self.log_every),
            "print_fn": _callable_or_none("print_fn", self.print_fn),
            "steps_per_dispatch": None
            if self.steps_per_dispatch is None
            else checks.positive_int(where, "steps_per_dispatch", self.steps_per_dispatch),
            "prefetch": None if self.prefetch is None else checks.non_negative_int(where, "prefetch", self.prefetch),
            "compiler_options": _compiler_options(self.compiler_options),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def _step_options(options) -> Optional[dict]:
    """``step_options``: None, or a dict of ``make_train_step``'s options (a copy)."""
    if options is None:
        return None
    if not isinstance(options, dict) or set(options) - set(_STEP_OPTIONS):
        unknown = sorted(set(options) - set(_STEP_OPTIONS)) if isinstance(options, dict) else None
        raise checks.ArgumentError(
            f"fit: step_options must be a dict of make_train_step's options "
            f"{list(_STEP_OPTIONS)}"
            + (f"; unknown: {unknown}" if unknown else f", got {type(options).__name__}")
            + ". E.g. step_options={'clip_grad_norm': 1.0, 'microbatches': 4}."
        )
    return dict(options)


def _callable_or_none(name: str, fn):
    if fn is not None and not callable(fn):
        raise checks.ArgumentError(
            f"FitOptions: {name} must be a function taking the epoch's line "
            f"(e.g. print or logging.info) or None, got "
            f"{type(fn).__name__} {fn!r}."
        )
    return fn


def _compiler_options(options):
    """``"auto"``, None or a dict (a copy); what "auto" means is decided by fit."""
    if isinstance(options, str) and options == "auto":
        return options
    if options is None:
        return None
    if not isinstance(options, dict):
        raise TypeError(
            f"fit: compiler_options must be 'auto', a dict of XLA option names to "
            f"values (e.g. funcnet.xla.compiler_options()) or None (plain jax.jit), "
            f"got {type(options).__name__} {options!r}."
        )
    return dict(options)


_FIELDS = tuple(f.name for f in dataclasses.fields(FitOptions))
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FitOptions)}


def _from_keywords(options: Optional[FitOptions], keywords: dict):
    """``fit``'s ``options`` with its deprecated keywords folded in; returns
    ``(options, devices)``. A keyword fit never had is the ``TypeError`` Python gives,
    with the closest name; a deprecated one warns once per call, naming its new spelling,
    and is refused when ``options`` sets the same field too."""
    known = _FIELDS + ("devices",)
    for name in keywords:
        if name not in known:
            close = difflib.get_close_matches(name, known + _SIGNATURE, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"fit() got an unexpected keyword argument {name!r}.{hint}")
    if options is None:
        options = FitOptions()
    elif not isinstance(options, FitOptions):
        raise checks.ArgumentError(
            f"fit: options must be a funcnet.loop.FitOptions, got "
            f"{type(options).__name__}; e.g. "
            f"options=FitOptions(log_every=10)."
        )
    moved = {k: v for k, v in keywords.items() if k != "devices"}
    if moved:
        given = ", ".join(f"{k}={v!r}" for k, v in moved.items())
        both = [k for k in moved if getattr(options, k) != _DEFAULTS[k]]
        if both:
            raise TypeError(
                f"fit: {', '.join(both)} given both as a keyword and in "
                f"options=; pass it in the FitOptions only: "
                f"FitOptions({given}, ...)."
            )
        warnings.warn(
            f"fit({', '.join(f'{k}=...' for k in moved)}) is deprecated since funcnet "
            f"0.2: pass options=funcnet.loop.FitOptions({given}). The keywords keep "
            f"working for now.",
            DeprecationWarning,
            stacklevel=3,
        )
        options = dataclasses.replace(options, **moved)
    devices = keywords.get("devices")
    if devices is not None:
        warnings.warn(
            f"fit(devices={devices!r}) (pmap) is deprecated since funcnet 0.2: pass "
            f"mesh=funcnet.distributed.data_mesh({devices!r}), which runs the same "
            f"data-parallel step with jit over a mesh (the porting note in "
            f"docs/guides/distributed.md says what changes: a loss_fn or layer "
            f"written with axis_name for pmap drops it). Hand-written pmap loops "
            f"(make_train_step(axis_name=...)) are not deprecated.",
            DeprecationWarning,
            stacklevel=3,
        )
    return options, devices


# fit's own parameters, for the closest-name hint of a mistyped keyword.
_SIGNATURE = ("epochs", "eval_data", "eval_fn", "metric", "callbacks", "mesh", "resume_from", "progress", "options")
