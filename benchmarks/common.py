"""Shared pieces of the harness: timing, synthetic data, shared initial weights, machine info.

Nothing here imports jax or torch at module level: the orchestrator (``benchmarks.run``)
imports this module, and it must not start an XLA or a PyTorch thread pool of its own.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from typing import Callable, Dict, List, Sequence

import numpy as np

MNIST_TRAIN = 60000
IMAGE = (28, 28, 1)
PIXELS = 28 * 28
# A pool of distinct batches is cycled through an "epoch": the step count is the real
# one (60000 // batch), the memory is bounded. Timing does not depend on the values.
BATCH_POOL = 32


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #

def measure(run_once: Callable[[], object], reps: int) -> List[float]:
    """Wall-clock seconds of ``reps`` calls of ``run_once``; it must block until its work is done."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run_once()
        out.append(time.perf_counter() - t0)
    return out


def summary(values: Sequence[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def block(tree):
    """``jax.block_until_ready`` on a pytree (imported lazily: children only)."""
    import jax
    return jax.block_until_ready(tree)


# --------------------------------------------------------------------------- #
# Data and weights shared by every peer
# --------------------------------------------------------------------------- #

def steps_per_epoch(batch: int) -> int:
    return MNIST_TRAIN // batch


def mnist_like_batches(batch: int, n_batches: int, seed: int = 0, image: bool = False,
                       classes: int = 10):
    """``n_batches`` synthetic MNIST-shaped batches: pixels ``U[0, 1)``, labels uniform.

    Returns ``xs`` of shape ``(n, batch, 784)`` (or ``(n, batch, 28, 28, 1)`` when
    ``image``) float32 and ``ys`` of shape ``(n, batch)`` int32.
    """
    rng = np.random.default_rng(seed)
    shape = (n_batches, batch) + (IMAGE if image else (PIXELS,))
    xs = rng.random(shape, dtype=np.float32)
    ys = rng.integers(0, classes, size=(n_batches, batch), dtype=np.int32)
    return xs, ys


def torch_default_uniform(rng: np.random.Generator, shape, fan_in: int) -> np.ndarray:
    """``U(±1/sqrt(fan_in))``: PyTorch's nn.Linear/nn.Conv2d default, funcnet's Dense/Conv default."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def mlp_weights(sizes: Sequence[int], seed: int = 0):
    """``[(W (in, out), b (out,)), ...]`` for the MLP ``sizes[0] -> ... -> sizes[-1]``.

    Every peer loads exactly these arrays (transposed where its layout differs), so all
    peers start from the same point and their first-step losses must agree.
    """
    rng = np.random.default_rng(seed)
    return [(torch_default_uniform(rng, (i, o), i), torch_default_uniform(rng, (o,), i))
            for i, o in zip(sizes[:-1], sizes[1:])]


# --------------------------------------------------------------------------- #
# Machine and versions
# --------------------------------------------------------------------------- #

def cpu_info() -> Dict[str, object]:
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return {"model": model, "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "isa": isa, "platform": platform.platform()}


def package_versions() -> Dict[str, str]:
    """Versions from package metadata: no package is imported."""
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in ("funcnet", "jax", "jaxlib", "optax", "flax", "dm-haiku", "equinox", "torch", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def jax_step(params, forward, tx, jit=None):
    """The JAX peers' shared step: mean softmax CE, ``value_and_grad``, optax update, one
    ``jit`` (default ``jax.jit``; the funcnet peers pass ``funcnet.xla.jit``, which ``fit``
    compiles with and its docs tell a hand-written loop to use).

    Returns ``(carry, step)`` with ``step(carry, x, y) -> (carry, loss)``; no donation.
    """
    import jax
    import optax

    def loss_fn(params, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y).mean()

    def step(carry, x, y):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return (params, tx.init(params)), (jit or jax.jit)(step)


def torch_step(model, opt):
    """The PyTorch peers' shared eager step: zero grads, CE forward, backward, optimizer step."""
    from torch import nn
    loss_fn = nn.CrossEntropyLoss()

    def step(carry, x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return carry, loss.detach()

    return step
