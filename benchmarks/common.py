"""Shared pieces of the harness: timing, synthetic data, shared initial weights, machine and
device info.

Nothing here imports jax or torch at module level: the orchestrator (``benchmarks.run``)
imports this module, and it must not start an XLA or a PyTorch thread pool of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

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
    """Wall-clock seconds of ``reps`` calls of ``run_once``; it must block until its work is
    done. Under :class:`Turns` each call is one turn: the peer waits for it, then passes it on.
    Each call's CPU time on this thread is kept too (:func:`host_cpu_taken`)."""
    out = []
    for _ in range(reps):
        _turn_wait()
        t0, c0 = time.perf_counter(), time.thread_time()
        run_once()
        out.append(time.perf_counter() - t0)
        _host_cpu_add(time.thread_time() - c0)
        _turn_pass()
    return out


# The CPU seconds the calling thread (the peer's, which dispatches its work) spent in each
# timed repetition: what of the machine's cores the host's Python took beside XLA's
# threads. On a 2-core CPU whose XLA program splits its fusions over both cores that
# time is taken from the steps; on a GPU it runs beside them. A peer's thread keeps its own.
_HOST_CPU = threading.local()


def _host_cpu_add(seconds: float) -> None:
    if not hasattr(_HOST_CPU, "times"):
        _HOST_CPU.times = []
    _HOST_CPU.times.append(seconds)


def host_cpu_taken() -> List[float]:
    """The CPU seconds of this thread in each timed repetition since the last call
    (:func:`measure`'s calls, :func:`epoch_clock`'s epochs after the first), and forgets them."""
    times, _HOST_CPU.times = getattr(_HOST_CPU, "times", []), []
    return times


class Turns:
    """Peers of one process taking turns (``benchmarks.run --interleave``): each runs in a
    thread named after it, and at most one runs at a time. A peer holds the turn from its
    start (its compilation and warm-up) to the end of its first timed repetition
    (:func:`measure`'s call, :func:`epoch_clock`'s epoch), then passes it to the next peer
    still running, in ``names``' order; a peer that finishes leaves the rotation.

    So the peers' timed repetitions alternate one by one, as close in time as one process
    can put them: a drift of the machine that would fall between two peers' whole
    measurements (between processes here, 10-20 %) falls on all of them alike."""

    def __init__(self, names: Sequence[str]):
        self._cond = threading.Condition()
        self._live = list(names)
        self._current = self._live[0] if self._live else None

    def holds(self, name: str) -> bool:
        return name in self._live

    def wait(self, name: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._current == name)

    def passed(self, name: str) -> None:
        """``name``'s turn ends: the next live peer's begins (``name``'s again if alone)."""
        with self._cond:
            if self._current == name:
                self._current = self._live[(self._live.index(name) + 1) % len(self._live)]
                self._cond.notify_all()

    def leave(self, name: str) -> None:
        """``name`` is done: it leaves the rotation, and the turn goes on if it had it."""
        with self._cond:
            i = self._live.index(name)
            self._live.remove(name)
            if self._current == name:
                self._current = self._live[i % len(self._live)] if self._live else None
            self._cond.notify_all()


_TURNS: Optional[Turns] = None


@contextlib.contextmanager
def taking_turns(turns: Turns):
    """:func:`measure` and :func:`epoch_clock` take ``turns`` while inside (``run._child``)."""
    global _TURNS
    _TURNS = turns
    try:
        yield turns
    finally:
        _TURNS = None


def _turn_wait() -> None:
    name = threading.current_thread().name
    if _TURNS is not None and _TURNS.holds(name):
        _TURNS.wait(name)


def _turn_pass() -> None:
    name = threading.current_thread().name
    if _TURNS is not None and _TURNS.holds(name):
        _TURNS.passed(name)


def summary(values: Sequence[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def median_ci(values: Sequence[float], confidence: float = 0.95):
    """``(median, low, high)``: the median of ``values`` and a distribution-free confidence
    interval for it, the order statistics ``x_(j)`` and ``x_(n+1-j)`` of the sorted values
    with the largest ``j`` for which ``P(Binomial(n, 1/2) < j) <= (1 - confidence) / 2``
    (the sign-test interval: each value falls below the true median with probability 1/2,
    whatever the distribution). ``low``/``high`` are None where ``n`` is too small for the
    confidence (fewer than 6 values at 95%)."""
    xs = sorted(values)
    n = len(xs)
    tail, below, j = (1 - confidence) / 2, 0.0, 0
    while j < n and below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    if j == 0:
        return statistics.median(xs), None, None
    return statistics.median(xs), xs[j - 1], xs[n - j]


def median_ci_text(ratios: Sequence[float]) -> str:
    """``median [low, high] (n)`` of ``ratios`` (:func:`median_ci`), as the tables print it."""
    median, low, high = median_ci(ratios)
    interval = f"[{low:.3f}, {high:.3f}]" if low is not None else "[too few pairs]"
    return f"{median:.3f} {interval} ({len(ratios)})"


def paired_ratios(ref_rounds: Sequence[Sequence[float]], peer_rounds: Sequence[Sequence[float]]) -> List[float]:
    """``ref ÷ peer`` turn by turn: each round's ``i``-th repetition of the one against the
    other's (``--interleave``, where the two ran one after the other, seconds apart), over
    the rounds both completed. Pairing takes out the machine's drift between turns, which
    pooled medians keep; a round where either failed (None) is left out."""
    return [
        a / b
        for ref, peer in zip(ref_rounds, peer_rounds)
        if ref is not None and peer is not None
        for a, b in zip(ref, peer)
        if b > 0
    ]


def draws_bar(peer: str) -> bool:
    """Whether a ``fit`` peer draws its tqdm bar: the bar is part of what fit costs a user,
    so every one does but ``fit-device-quiet`` (which prices it), where tqdm is installed
    (the GPU machines here may lack it)."""
    return peer != "fit-device-quiet" and importlib.util.find_spec("tqdm") is not None


def block(tree):
    """``jax.block_until_ready`` on a pytree (imported lazily: children only)."""
    import jax

    return jax.block_until_ready(tree)


def torch_device(cfg) -> str:
    """The torch device of a peer: ``"cuda"`` in a ``--platform gpu`` run, else ``"cpu"``."""
    return "cuda" if cfg.get("device") == "gpu" else "cpu"


def torch_sync(device: str) -> None:
    """Waits for the work queued on ``device``: CUDA kernels run asynchronously, so a clock
    read without this would time the launches, not the work."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def torch_autocast(peer: str, device: str):
    """A context factory: bfloat16 autocast on ``device`` for the ``*-bf16`` torch peers,
    else nothing (float32)."""
    if not peer.endswith("-bf16"):
        return contextlib.nullcontext
    import torch

    return lambda: torch.autocast(device, dtype=torch.bfloat16)


# --------------------------------------------------------------------------- #
# Data and weights shared by every peer
# --------------------------------------------------------------------------- #


def steps_per_epoch(batch: int) -> int:
    return MNIST_TRAIN // batch


def mnist_like_batches(batch: int, n_batches: int, seed: int = 0, image: bool = False, classes: int = 10):
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
    return [
        (torch_default_uniform(rng, (i, o), i), torch_default_uniform(rng, (o,), i))
        for i, o in zip(sizes[:-1], sizes[1:])
    ]


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
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "isa": isa,
        "platform": platform.platform(),
    }


def cpu_ticks(stat: str = "/proc/stat") -> Optional[tuple]:
    """``(steal, total)``: the machine's CPU time so far, in clock ticks, from the first
    line of ``/proc/stat`` (None where there is none: not Linux)."""
    try:
        with open(stat) as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
    # already counted in user and nice, so the total stops at steal.
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def steal_percent(before: Optional[tuple], after: Optional[tuple]) -> Optional[float]:
    """The share of CPU time the hypervisor gave other guests between two
    :func:`cpu_ticks` readings, in percent: on a shared VM, time the peer waited
    without running, which slows whatever ran then (None without both readings)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


# Listed only where installed: the CUDA builds of jax and the libraries the GPU peers load.
GPU_PACKAGES = (
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "nvidia-cudnn-cu13",
    "nvidia-cudnn-cu12",
    "nvidia-cublas-cu12",
    "triton",
)


def package_versions() -> Dict[str, str]:
    """Versions from package metadata: no package is imported."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("funcnet", "jax", "jaxlib", "optax", "flax", "dm-haiku", "equinox", "torch", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    for name in GPU_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


# --------------------------------------------------------------------------- #
# Device probes: what jax and torch see, each in a child process of its own (the
# orchestrator imports neither, and jax and torch never share a process here).
# --------------------------------------------------------------------------- #

PROBE_TAG = "BENCHMARK_PROBE_JSON:"


def _cuda_version(v) -> str:
    """CUDA's integer versions (12080) as "12.8"."""
    return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v > 0 else str(v)


def _cudnn_version(v) -> str:
    """cuDNN's integer versions (90300: 9.3.0; 8 and older: 8902 = 8.9.2) as a string."""
    if not isinstance(v, int) or v <= 0:
        return str(v)
    if v >= 10000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def probe_jax() -> Dict[str, object]:
    """What jax runs on: backend, devices, float32 matmul precision, CUDA/cuDNN versions."""
    import jax
    import jaxlib
    from jax._src import lib as jax_lib

    devices = jax.devices()
    out = {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "device_count": len(devices),
        "device_kind": devices[0].device_kind,
        "platform": devices[0].platform,
        # None: XLA's default, which on NVIDIA GPUs from Ampere on is TF32 for float32 dots
        "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
    }
    if getattr(devices[0], "compute_capability", None):  # GPU devices only
        out["compute_capability"] = str(devices[0].compute_capability)
    versions = getattr(jax_lib, "cuda_versions", None)
    if versions is not None:
        for name in ("cuda_runtime", "cuda_driver", "cudnn", "cublas"):
            fn = getattr(versions, f"{name}_get_version", None)
            with contextlib.suppress(Exception):
                out[f"{name}_version"] = (_cudnn_version if name == "cudnn" else _cuda_version)(fn())
    with contextlib.suppress(Exception):
        out["environment_info"] = jax.print_environment_info(return_string=True)
    return out


def probe_torch() -> Dict[str, object]:
    """What torch sees: version, CUDA and cuDNN builds, the GPU, its TF32 defaults."""
    import torch

    out = {
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_build": torch.version.cuda,
        "cudnn_version": None,
    }
    with contextlib.suppress(Exception):
        v = torch.backends.cudnn.version()  # None on a CPU build
        out["cudnn_version"] = _cudnn_version(v) if v else None
    if out["cuda_available"]:
        out["device_name"] = torch.cuda.get_device_name(0)
        out["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        out["device_count"] = torch.cuda.device_count()
    out.update(torch_f32_settings())
    return out


def torch_f32_settings() -> Dict[str, object]:
    """torch's float32 matmul/conv settings: TF32 or full float32 on NVIDIA GPUs. Each read
    on its own: newer torch deprecates the ``allow_tf32`` flags for ``fp32_precision`` and
    may refuse a read that mixes the two APIs, which is then recorded, not raised."""
    import torch

    reads = {
        "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
        "matmul.allow_tf32": lambda: bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": lambda: bool(torch.backends.cudnn.allow_tf32),
        "matmul.fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
    }
    out = {}
    for key, read in reads.items():
        try:
            out[key] = read()
        except AttributeError:  # an older torch without the newer API
            continue
        except Exception as e:  # noqa: BLE001
            out[key] = f"unreadable ({type(e).__name__}: {e})"[:200]
    return out


def _probe_main(kind: str) -> None:
    """Child side of :func:`device_probe`: one probe's dict on a tagged line."""
    try:
        out = {"jax": probe_jax, "torch": probe_torch}[kind]()
    except Exception as e:  # noqa: BLE001 - a missing torch or a failed backend is the answer
        out = {"error": f"{type(e).__name__}: {e}"}
    print(PROBE_TAG + json.dumps(out, default=str), flush=True)


def device_probe(platform_name: str, timeout: float = 120, env: Optional[Dict[str, str]] = None) -> Dict[str, Dict]:
    """``{"jax": {...}, "torch": {...}}``: each probe run in a fresh child process with
    ``JAX_PLATFORMS`` for ``platform_name`` ("cuda" for "gpu"); a failure is its ``error``."""
    env = dict(os.environ if env is None else env)
    env["JAX_PLATFORMS"] = "cuda" if platform_name == "gpu" else "cpu"
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {}
    for kind in ("jax", "torch"):
        cmd = [sys.executable, "-c", f"from benchmarks import common; common._probe_main({kind!r})"]
        try:
            proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            out[kind] = {"error": f"timed out after {timeout:.0f} s"}
            continue
        line = next((l for l in proc.stdout.splitlines() if l.startswith(PROBE_TAG)), None)
        out[kind] = (
            json.loads(line[len(PROBE_TAG) :])
            if line
            else {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][-300:]}
        )
    return out


def device_summary(probe: Dict[str, Dict]) -> Dict[str, str]:
    """Short strings for a report: the device as jax and torch name it, and CUDA/cuDNN."""
    j, t = probe.get("jax", {}), probe.get("torch", {})
    if "error" in j:
        jax_dev = f"jax: unavailable ({j['error']})"
    else:
        jax_dev = (
            f"jax: {j.get('device_kind')} x{j.get('device_count')} "
            f"(backend {j.get('backend')}"
            + (f", compute capability {j['compute_capability']}" if "compute_capability" in j else "")
            + ")"
        )
    if "error" in t:
        torch_dev = f"torch: unavailable ({t['error']})"
    elif t.get("cuda_available"):
        torch_dev = f"torch: {t.get('device_name')} (compute capability {t.get('compute_capability')})"
    else:
        torch_dev = "torch: no CUDA device (CPU)"
    cuda = []
    if "cuda_runtime_version" in j or "cudnn_version" in j:
        cuda.append(
            f"jax: CUDA runtime {j.get('cuda_runtime_version', '?')}, driver "
            f"{j.get('cuda_driver_version', '?')}, cuDNN {j.get('cudnn_version', '?')}"
        )
    if t.get("cuda_build") or t.get("cudnn_version"):
        cuda.append(f"torch: CUDA {t.get('cuda_build') or 'none (CPU build)'}, cuDNN {t.get('cudnn_version')}")
    return {"device": "; ".join((jax_dev, torch_dev)), "cuda": "; ".join(cuda) or "n/a (no CUDA build found)"}


def epoch_clock():
    """A ``funcnet.fit`` callback whose ``epochs`` are the wall seconds of each epoch, loop
    included, to its end with the params ready (and whose epochs after the first keep this
    thread's CPU time, :func:`host_cpu_taken`). Under :class:`Turns` each epoch is one
    turn: at its end the peer passes the turn and waits for the next, unclocked."""
    from funcnet.callbacks import Callback

    class EpochClock(Callback):
        def __init__(self):
            self.epochs, self._start, self._cpu = [], None, None

        def on_train_begin(self, ctx):
            self._start, self._cpu = time.perf_counter(), time.thread_time()

        def on_epoch_end(self, ctx, epoch, logs):
            block(ctx.train_state.params)
            self.epochs.append(time.perf_counter() - self._start)
            if len(self.epochs) > 1:  # the first, with the compilation, is reported apart
                _host_cpu_add(time.thread_time() - self._cpu)
            _turn_pass()
            _turn_wait()
            self._start, self._cpu = time.perf_counter(), time.thread_time()

    return EpochClock()


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


def torch_step(model, opt, autocast=contextlib.nullcontext):
    """The PyTorch peers' shared eager step: zero grads, CE forward (under ``autocast()``),
    backward, optimizer step."""
    from torch import nn

    loss_fn = nn.CrossEntropyLoss()

    def step(carry, x, y):
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return carry, loss.detach()

    return step
