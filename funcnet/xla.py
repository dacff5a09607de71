"""XLA compiler options for the steps funcnet compiles, chosen per backend.

:func:`jit` is ``jax.jit`` with :func:`compiler_options`, and it tells the layers it
traces so (:func:`traced_with_options`), so they pick the kernels that are fastest
under those options. :func:`funcnet.fit` compiles a step that has a convolution on CPU
with them by default (``compiler_options="auto"``); for a hand-written loop:

```python
step = funcnet.xla.jit(make_train_step(loss_fn, optimizer), donate_argnums=0)
```

Why (CPU only; elsewhere the dict is empty): from jaxlib 0.10 XLA:CPU hands float32
convolutions, matrix products and reductions to YNNPACK, whose convolutions run on one
thread while XLA's own (Eigen) convolutions use every core. The option
``xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,
LIBRARY_FUSION_TYPE_REDUCE`` keeps YNNPACK for matrix products and reductions and gives
convolutions back to Eigen. ``python -m benchmarks.ynn_probe`` (2-core VM, 2026-11-27,
median ms, plain ``jax.jit`` / ``INDIVIDUAL_DOT`` alone / this option): a 3x3
convolution's forward and backward at (128, 28, 28, 32) -> 64 channels 455 / 172 / 183
on jax 0.10.2 and 239 / 186 / 177 on 0.12.0.1; BatchNorm's forward and backward there
37 / 117 / 22 and 17 / 52 / 13. Until 2026-11-27 funcnet set ``INDIVIDUAL_DOT`` alone,
which also took reductions from YNNPACK to XLA's slower loops (a sum over the batch and
positions 7-12x its plain time): that made BatchNorm networks slower with the option.
Whole train steps are in ``BENCHMARKS.md`` (workload 6b). A program without a
convolution compiles to the same kernels with or without it.

:func:`unsplit_fusions` is another CPU option, for small steps: XLA:CPU splits loop
fusions over the cores, which costs a step of ~0.1 ms more than it saves; it keeps each
whole, with the same bits, and :func:`split_fusions` lists what XLA split. ``fit`` races
the two compilations where it may pay (:class:`funcnet.loop.FitOptions`).

Under these options ``Conv``'s ``implementation="auto"`` takes XLA's own convolution on
CPU (its batch pieces and patch gradients are workarounds for the one-thread kernels).
Results differ from the plain programs' by float rounding (other convolution kernels),
not more.

The option is experimental in XLA, so it is used only when this jaxlib compiles with it
(checked once per process, on a one-line program), and never over your own choice: if
``XLA_FLAGS`` sets ``xla_cpu_experimental_ynn_fusion_type``, the dict is empty and your
flag applies.
"""

from __future__ import annotations

import contextvars
import functools
import os
import re
from typing import Any, Callable, Optional

import jax
import numpy as np

__all__ = ["compiler_options", "jit", "split_fusions", "traced_with_options", "unsplit_fusions"]

_YNN = "xla_cpu_experimental_ynn_fusion_type"
# YNNPACK keeps matrix products and reductions; convolutions go to XLA's Eigen kernels.
_CPU = ((_YNN, "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"),)


def compiler_options(backend: str | None = None) -> dict:
    """The compiler options funcnet uses for ``jax.jit`` on ``backend``.

    Args:
      backend: ``"cpu"``, ``"gpu"``, ``"tpu"``; default: ``jax.default_backend()``.

    Returns:
      A new dict of XLA option names to values for ``jax.jit(...,
      compiler_options=...)``: on CPU, convolutions on XLA's multi-threaded kernels
      (see the module docstring); empty on other backends, on a jaxlib that refuses
      the option, or when ``XLA_FLAGS`` already sets it.

    Examples:
      >>> opts = compiler_options()
      >>> sorted(opts) if jax.default_backend() == "cpu" else []
      ['xla_cpu_experimental_ynn_fusion_type']
      >>> f = jax.jit(lambda x: x * 2, compiler_options=opts)
      >>> f(jnp.ones(2)).tolist()
      [2.0, 2.0]
      >>> compiler_options("gpu")
      {}
    """
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu" or _YNN in os.environ.get("XLA_FLAGS", ""):
        return {}
    return dict(_CPU) if _compiles_with(_CPU) else {}


@functools.lru_cache(maxsize=None)
def _compiles_with(options: tuple) -> bool:
    """Whether this jaxlib's CPU compiler accepts ``options`` (older ones do not know it)."""
    try:
        x = jax.device_put(np.float32(0), jax.devices("cpu")[0])  # compiled where x lives
        jax.jit(lambda v: v + 1, compiler_options=dict(options)).lower(x).compile()
    except Exception:  # an unknown option or value: XLA's errors have no common type
        return False
    return True


# XLA:CPU's pass that splits a loop fusion (elementwise work, gathers, slices) over the
# cores, and the DebugOptions field that lists passes to skip.
_SPLITTER = "cpu-parallel-task-assigner"
_DISABLED = "xla_disable_hlo_passes"


def unsplit_fusions(options: Optional[dict] = None, backend: str | None = None) -> dict:
    """``options`` plus the XLA:CPU option that runs each loop fusion on one thread.

    XLA:CPU splits a loop fusion (elementwise work, a gather, a slice, a reduction's
    outputs) into as many parts as the process has CPUs when its cost model says the
    work is large enough, and runs the parts on its thread pool; the program's dumped
    HLO marks those fusions ``outer_dimension_partitions``. The cost model counts a
    gather's whole operand as read: the 32 rows a shuffled :class:`funcnet.data.DeviceData`
    batch gathers from MNIST's 60,000 count as 188 MB, so such a gather is always
    split, and so is a small network's weight update. At a tenth of a millisecond a
    step, handing half of each to another core costs more than it saves. This option
    skips the pass that splits them (``xla_disable_hlo_passes`` gets
    ``cpu-parallel-task-assigner``, added to any passes ``options`` or ``XLA_FLAGS``
    already list, which stay skipped). Matrix products and convolutions keep their own
    threads.

    Each output element is computed by the same code either way, so the results are
    the same bit for bit (the tests compare them); only the speed differs, and in both
    directions: a ``lax.scan`` epoch of the dispatch-bound MLP (784-64-10, batch 32,
    SGD, shuffled rows) 0.65x its split time on jax 0.12.0.1 and 0.92x on 0.10.2, of the
    784-400-100-10 MLP (batch 128, Adam) 1.13x on both (2-core VM, 2026-12-02). So
    :func:`funcnet.loop.fit` does not set it blindly: with ``compiler_options="auto"`` it
    times its dispatches compiled both ways and keeps the faster (``FitOptions``).

    Args:
      options: the options to add to (default: none); not changed.
      backend: ``"cpu"``, ``"gpu"``, ``"tpu"``; default ``jax.default_backend()``. Off
        CPU the pass does not exist and ``options`` come back as they are.

    Returns:
      A new dict for ``jax.jit(..., compiler_options=...)`` or :func:`jit`'s ``options``.

    Examples:
      >>> unsplit_fusions(backend="cpu")
      {'xla_disable_hlo_passes': 'cpu-parallel-task-assigner'}
      >>> unsplit_fusions({"xla_disable_hlo_passes": "a,b"}, backend="cpu")
      {'xla_disable_hlo_passes': 'a,b,cpu-parallel-task-assigner'}
      >>> unsplit_fusions(backend="gpu")
      {}
      >>> f = jax.jit(lambda x: x * 2, compiler_options=unsplit_fusions())
      >>> f(jnp.ones(2)).tolist()
      [2.0, 2.0]
    """
    options = dict(options or {})
    if (jax.default_backend() if backend is None else backend) != "cpu":
        return options
    listed = options.get(_DISABLED) or _flag(_DISABLED) or ""
    passes = [p.strip() for p in str(listed).split(",") if p.strip()]
    options[_DISABLED] = ",".join(passes + [_SPLITTER] * (_SPLITTER not in passes))
    return options


_SPLIT = re.compile(r'%([^\s=]+) = (\w+)\[([\d,]*)\][^\n]*"outer_dimension_partitions":\["')
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s16": 2, "u16": 2, "f64": 8, "s64": 8, "u64": 8}


def split_fusions(compiled: Any) -> dict:
    """The loop fusions XLA:CPU split over the cores in ``compiled``, and their output sizes.

    Args:
      compiled: a compiled program (``jax.jit(f).lower(...).compile()``), or its
        ``as_text()``.

    Returns:
      ``{fusion name: output bytes}`` of each fusion the optimized HLO marks
      ``outer_dimension_partitions`` (empty off CPU, under :func:`unsplit_fusions`, or
      on one CPU). What :func:`funcnet.loop.fit` reads before it races the two
      compilations: it races only where the largest is small.

    Examples:
      >>> x = jnp.ones((1024, 1024))
      >>> split = split_fusions(jax.jit(lambda x: x * 2 + 1).lower(x).compile())
      >>> sorted(split.values()) in ([], [4 * 1024 * 1024])  # [] on one CPU
      True
      >>> split_fusions(jax.jit(lambda x: x * 2 + 1, compiler_options=unsplit_fusions()).lower(x).compile())
      {}
    """
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    return {
        name: _BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
        for name, dtype, dims in _SPLIT.findall(text)
    }


def _flag(name: str) -> Optional[str]:
    """The value ``XLA_FLAGS`` gives ``--name`` (the last one given), else None: a
    compiler option replaces the flag's value, so one that adds to it starts from it."""
    values = [f.split("=", 1)[1] for f in os.environ.get("XLA_FLAGS", "").split() if f.startswith(f"--{name}=")]
    return values[-1] if values else None


_TRACING: contextvars.ContextVar = contextvars.ContextVar("funcnet_xla_options", default=False)


def jit(fun: Callable, *, options: Optional[dict] = None, **jit_kwargs) -> Callable:
    """``jax.jit(fun, **jit_kwargs)`` compiled with :func:`compiler_options`, and traced
    with :func:`traced_with_options` true, so that layers choose their kernels for them.

    Args:
      fun: the function to compile (a train step, an evaluation).
      options: the options to start from instead of :func:`compiler_options` (``{}``:
        XLA's defaults, i.e. plain ``jax.jit``); ``FitOptions(compiler_options=...)`` passes its
        own here.
      **jit_kwargs: ``jax.jit``'s other arguments (``donate_argnums``, shardings, ...);
        a ``compiler_options`` given here is added to funcnet's (yours win).

    Returns:
      The jitted function (plain ``jax.jit`` where there are no options: off CPU). Its
      ``lower``, ``trace`` and ``eval_shape`` are the jitted function's. Called inside
      another trace (an outer ``jax.jit``, ``grad``, ``lax.scan``) it is the plain
      ``jax.jit(fun)``: compiler options belong to the outermost jit.

    Examples:
      >>> from funcnet.layers import Conv
      >>> init, apply = Conv(4, (3, 3))
      >>> _, params, state = init(jax.random.key(0), (-1, 8, 8, 1))
      >>> f = jit(lambda p, x: apply(p, state, x)[0])
      >>> f(params, jnp.ones((2, 8, 8, 1))).shape
      (2, 6, 6, 4)
    """
    options = {
        **(compiler_options() if options is None else options),
        **(jit_kwargs.pop("compiler_options", None) or {}),
    }
    if not options:
        return jax.jit(fun, **jit_kwargs)
    # Layers read the flag to pick kernels for XLA's multi-threaded convolutions: only
    # funcnet's CPU option puts them there, not any option a caller passes.
    conv_options = dict(_CPU).items() <= options.items()

    @functools.wraps(fun)
    def traced(*args, **kwargs):
        token = _TRACING.set(conv_options)
        try:
            return fun(*args, **kwargs)
        finally:
            _TRACING.reset(token)

    top = jax.jit(traced, compiler_options=options, **jit_kwargs)
    # Compiler options belong to the outermost jit: called inside another trace (an
    # outer jit, grad, scan), the function is an ordinary jitted function of it.
    nested = jax.jit(fun, **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        try:
            return top(*args, **kwargs)
        except ValueError as e:
            if "top-level" not in str(e):
                raise
        return nested(*args, **kwargs)

    call.lower, call.trace, call.eval_shape = top.lower, top.trace, top.eval_shape
    return call


def traced_with_options() -> bool:
    """Whether the function being traced now is compiled by :func:`jit` with funcnet's
    CPU option of :func:`compiler_options` (``FitOptions(compiler_options=
    funcnet.xla.compiler_options())`` compiles its steps so): a layer's ``"auto"`` choice
    of kernels reads it (``Conv`` takes XLA's convolution then).

    Returns:
      True inside such a trace, False elsewhere (plain ``jax.jit``, eager calls). A
      ``jax.jit``-ed helper called inside is traced once and cached by JAX for its
      argument shapes, whatever the flag: reused later under a plain ``jax.jit`` it keeps
      the kernels chosen the first time (the values are the same up to float rounding).

    Examples:
      >>> traced_with_options()
      False
      >>> seen = []
      >>> _ = jit(lambda x: seen.append(traced_with_options()) or x)(1.0)
      >>> seen == [jax.default_backend() == "cpu"]
      True
    """
    return _TRACING.get()
