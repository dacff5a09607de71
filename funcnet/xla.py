"""XLA compiler options for the steps funcnet compiles, chosen per backend.

:func:`jit` is ``jax.jit`` with :func:`compiler_options`, and it tells the layers it
traces so (:func:`traced_with_options`), so they pick the kernels that are fastest
under those options. Use it for a hand-written loop, or pass the options to
:func:`funcnet.fit` (``compiler_options=funcnet.xla.compiler_options()``), where the
network measured faster with them::

    step = funcnet.xla.jit(make_train_step(loss_fn, optimizer), donate_argnums=0)

``fit`` compiles with plain ``jax.jit`` by default: the options help some networks and
slow others, and by how much depends on the jaxlib. ``fit``'s step time with them over
without (benchmark workload 6b, ``BENCHMARKS.md``, 2-core VM, 2026-11-27): LeNet 0.81x
on jax 0.10.2 and 1.03x on 0.12.0.1; the Flax MNIST CNN (3x3 SAME convolutions,
BatchNorm, average pooling) 1.16x and 1.32x; nanoGPT's CPU GPT 1.17x and 1.16x.

Why (CPU only; elsewhere the dict is empty): from jaxlib 0.10 XLA:CPU hands float32
convolutions to YNNPACK, whose convolutions run on one thread, while its own (Eigen)
convolutions use every core. Keeping YNNPACK for the matrix products only
(``xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``) made
the LeNet step of benchmark workload 3 0.81-0.82x its time in paired runs on a 2-core
VM (conv2's forward 13.3 -> 4.7 ms, its filter gradient 24.0 -> 6.1 ms;
``benchmarks/CONV_NOTES.md``, 2026-11-25), and left the MLPs' steps unchanged within
noise. Under these options ``Conv``'s ``implementation="auto"`` takes XLA's own
convolution on CPU (its batch pieces and patch gradients were workarounds for the
one-thread kernels: with the options they were 1.15x slower on workload 3). Results
differ from the default programs' by float rounding (other convolution kernels), not more.

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
_CPU = ((_YNN, "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)


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
        XLA's defaults, i.e. plain ``jax.jit``); ``fit(compiler_options=...)`` passes its
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
    options = {**(compiler_options() if options is None else options),
               **(jit_kwargs.pop("compiler_options", None) or {})}
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
    CPU option of :func:`compiler_options` (``fit(compiler_options=
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
