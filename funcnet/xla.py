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
from typing import Callable, Optional

import jax
import numpy as np

__all__ = ["compiler_options", "jit", "traced_with_options"]

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
