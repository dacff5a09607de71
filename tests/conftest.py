"""Test setup: the backend and its flags, devices, one compilation cache, and the summary.

Everything here runs before anything imports jax: XLA reads ``XLA_FLAGS`` (the simulated
device count above all) once, when jax first initialises its backend.

Backend. ``JAX_PLATFORMS`` defaults to ``cpu`` with ``FUNCNET_TEST_DEVICES`` (default 4)
simulated devices. ``JAX_PLATFORMS=cuda python -m pytest`` runs the suite on one GPU: the
xdist workers share it (no pre-allocation), matmuls run at float32 precision (the parity
tolerances are written for float32 products; NVIDIA GPUs default to TF32), and the tests
marked ``devices(N)`` skip with a reason naming N where the run has fewer devices (the
CPU run has them). ``FUNCNET_TEST_DEVICES=1`` rehearses that on CPU.

Flags. LLVM's optimisation of the generated CPU code is much of what compiling the
suite's thousands of tiny programs costs, and nothing a test checks depends on it: XLA's
own (HLO) optimisations and buffer assignment are the same at level 0 (the optimised HLO
is the same text), and there is no fast-math at any level; about a third off the suite's
time on 2 cores. Only the last bits of some results move: above level 0 LLVM fuses a
product and a sum into one FMA instruction (one rounding instead of two) where the CPU
has them, so a float32 tanh layer's gradient differs from a default build's by up to
~5e-6 (with FMA off, ``--xla_cpu_max_isa=AVX``, both levels agree bit for bit). Every
tolerance here is wider, and the tests that compare two runs bit for bit run both under
these flags (subprocesses included). The older (non-MLIR) fusion emitters compile the
same fusions in about half the time again on jaxlib <= 0.10: XLA:CPU's other code
generator for the same HLO, which also differs only in where it forms FMAs (with FMA off
it agrees with a default build bit for bit, jaxlib 0.10.2). jaxlib 0.11 removed that
flag, and XLA *aborts* on a flag it does not know. So the first process of the run tries
the flags in a subprocess and keeps those this jaxlib knows; a flag of yours in
``XLA_FLAGS`` that it refuses stops the run with XLA's message (never a silent exit).
Processes the tests start get the kept flags from ``FUNCNET_TEST_XLA_FLAGS`` and add
their own device count. (``--xla_cpu_opt_preset=FAST_COMPILE``, which XLA's own CPU tests
also run under, took as long as level 0 alone here: three files paired on jaxlib 0.12.)

Compilation cache. The suite is bound by XLA compilation, and many tests compile the same
small programs. JAX's persistent compilation cache, pointed at a directory made for this
run, lets every process of it (the xdist workers and the subprocesses tests start, which
inherit the environment) load a program another one compiled: about a quarter off the
suite's time on 2 cores. The executables are XLA's own. A cache directory you set
yourself (``JAX_COMPILATION_CACHE_DIR``) is used as it is and never deleted, so a run
after it loads what it compiled (docs/contributing.md: about a third of the time).

MLIR contexts. On a jax that builds a new MLIR context for every program it lowers
(0.10.2, the Python 3.11 lane), each thread's context is reused, as jax 0.12 does itself:
about a fifth off that lane's time (``_reuse_mlir_contexts``).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

import pytest

from helpers.torch_ref import SKIP_REASON

# Tried in order; each is dropped if this jaxlib does not know it.
_SPEED_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ON_CPU = os.environ["JAX_PLATFORMS"] == "cpu"
DEVICES = int(os.environ.setdefault("FUNCNET_TEST_DEVICES", "4"))
# Workers share the accelerator: each takes memory as it needs it, not 75 % up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if not ON_CPU:
    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


def _backend_starts(xla_flags):
    """``(True, "")`` if jax starts its backend with ``xla_flags``, else ``(False, stderr)``."""
    env = dict(os.environ, XLA_FLAGS=xla_flags)
    run = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True, text=True, timeout=300
    )
    return run.returncode == 0, run.stderr


def _known_flags():
    """The speed flags this jaxlib knows, as one string; raises with XLA's words when the
    backend does not start for another reason (a flag of yours, a broken install)."""
    user = os.environ.get("XLA_FLAGS", "")
    count = f"--xla_force_host_platform_device_count={DEVICES}"
    flags = list(_SPEED_FLAGS)
    while True:
        ok, err = _backend_starts(" ".join([user, *flags, count]))
        if ok:
            return " ".join(flags)
        unknown = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", err)
        ours = [f for f in flags if unknown and f in unknown.group(1).split()]
        if not ours:
            raise pytest.UsageError(
                f"jax's backend does not start in this environment (JAX_PLATFORMS="
                f"{os.environ['JAX_PLATFORMS']}, XLA_FLAGS={user!r}), so no test can run. "
                f"XLA said:\n{err.strip()[-3000:]}"
            )
        flags = [f for f in flags if f not in ours]


# The first process of the run (pytest itself, before xdist starts its workers) decides;
# workers and subprocesses find the decision in the environment they inherit.
if "FUNCNET_TEST_XLA_FLAGS" not in os.environ:
    os.environ["FUNCNET_TEST_XLA_FLAGS"] = _known_flags()
os.environ["XLA_FLAGS"] = " ".join(
    f
    for f in (
        os.environ.get("XLA_FLAGS", ""),
        os.environ["FUNCNET_TEST_XLA_FLAGS"],
        f"--xla_force_host_platform_device_count={DEVICES}",
    )
    if f
)

_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="funcnet-tests-jax-cache-")
# Cache every program: the suite's are small and quick to compile, but there are thousands.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# One MLIR context per thread, reused up to this many lowerings (jax 0.12's own count).
_CONTEXT_REUSES = 10


def _reuse_mlir_contexts():
    """On a jax that makes a new MLIR context for every program it lowers, reuse each
    thread's context as later jax does; returns whether it did.

    jax 0.10.2 (the Python 3.11 lane) builds a fresh context, every dialect loaded, for
    each lowering: about half of its lowering time, and its lowering is as long as XLA's
    compiling in that lane (``python -m pytest -p benchmarks.suite_profile``). jax 0.12
    keeps one context per thread and reuses it ten times (``mlir._thread_local_context``);
    where jax does that itself, nothing changes here. The context only holds interned
    types and attributes: the modules lowered, and so the executables, are the same
    (tests/test_conftest.py compares them)."""
    import threading

    from jax._src.interpreters import mlir

    if hasattr(mlir, "_thread_local_context"):
        return False
    fresh, local = mlir.make_ir_context, threading.local()

    def make_ir_context():
        context, uses = getattr(local, "context", (None, _CONTEXT_REUSES))
        if uses >= _CONTEXT_REUSES:
            context, uses = fresh(), 0
        local.context = (context, uses + 1)
        return context

    make_ir_context.fresh = fresh
    mlir.make_ir_context = make_ir_context
    return True


# after XLA_FLAGS is set: importing jax reads no flag, starting its backend does
REUSES_MLIR_CONTEXTS = _reuse_mlir_contexts()


def pytest_configure(config):
    config.addinivalue_line("markers", "devices(n): needs n devices (the CPU run simulates 4); skips with fewer")


def pytest_runtest_setup(item):
    """A ``devices(n)`` test skips where the run has fewer than n devices (one GPU)."""
    marker = item.get_closest_marker("devices")
    if marker is None:
        return
    import jax

    need, have = marker.args[0], jax.device_count()
    if have < need:
        pytest.skip(
            f"needs {need} devices; this run has {have} ({jax.default_backend()}); "
            f"the CPU run simulates them (FUNCNET_TEST_DEVICES, default 4)"
        )


def pytest_terminal_summary(terminalreporter):
    """What skipped, by reason: the PyTorch parity tests as one line, then the rest."""
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons["torch" if reason.startswith(SKIP_REASON) else reason] += 1
    parity = reasons.pop("torch", 0)
    if not (parity or reasons):
        return
    terminalreporter.section("funcnet: skipped tests")
    if parity:
        why = "torch is not installed here (pip install -e '.[test,torch]' runs them)"
        terminalreporter.write_line(f"{parity} PyTorch parity tests skipped: {why}")
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"{n} skipped: {reason}")


def pytest_unconfigure(config):
    """The process that made the cache directory removes it once every worker is done."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without xdist starts too
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's default): one worker per core, at most 4.

    Each worker is a process with its own JAX, torch and compilations: past a few
    workers, start-up and memory cost more than the parallelism gains."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
