"""Test setup: four simulated CPU devices, and one compilation cache for the whole run.

XLA reads the device-count flag once, when jax first initialises its backend, so it must
be set before anything imports jax.

The suite is bound by XLA compilation: many tests build the same small networks and
steps, which compile to the same programs. JAX's persistent compilation cache, pointed
at a directory made for this run, lets every process of the run (the pytest-xdist
workers, and the examples and two-process workers that tests start, which inherit the
environment) load a program another one already compiled instead of compiling it again:
about a quarter off the suite's time on 2 cores. The executables are XLA's own, so what
runs is what a user's process would compile. A cache directory you set yourself
(JAX_COMPILATION_CACHE_DIR) is used as it is and never deleted.
"""
import os
import shutil
import tempfile

# LLVM's optimisation of the generated CPU code is most of what compiling the suite's
# thousands of tiny programs costs, and nothing a test checks depends on it: XLA's own
# (HLO) optimisations, buffer assignment and float semantics are the same at level 0
# (no fast-math at any level). It takes about a third off the suite's time on 2 cores.
# The older (non-MLIR) fusion emitters compile the same fusions in about half the time
# again; they are XLA:CPU's other code generator for the same HLO, not other numerics.
# Processes the tests start get these flags from FUNCNET_TEST_XLA_FLAGS and add their
# own device count.
os.environ.setdefault("FUNCNET_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                                 "--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = " ".join(f for f in (
    os.environ.get("XLA_FLAGS", ""), os.environ["FUNCNET_TEST_XLA_FLAGS"],
    "--xla_force_host_platform_device_count=4") if f)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The first process of the run (pytest itself, before xdist starts its workers) makes the
# directory; workers and subprocesses find it in the environment they inherit.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
        prefix="funcnet-tests-jax-cache-")
# Cache every program: the suite's are small and quick to compile, but there are thousands.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
    """The process that made the cache directory removes it once every worker is done."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's default): one worker per core, at most 4.

    Each worker is a process with its own JAX, torch and compilations: past a few
    workers, start-up and memory cost more than the parallelism gains."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))
