"""Where the test suite's time goes: per test, JAX's tracing, lowering and XLA compiling.

    python -m pytest -p benchmarks.suite_profile     # the README's test line, profiled
    python -m benchmarks.suite_profile [--top 25]    # the last run's report, again

A pytest plugin. Every pytest process of the run (each xdist worker, or the one process
with ``-n 0``) records, for each test, its wall time and the durations JAX reports through
``jax.monitoring`` while it ran: tracing a program to a jaxpr (``trace``), lowering it to
StableHLO (``lower``), and getting its executable (``compile``: XLA compiling it, or
loading it from the persistent compilation cache; ``cache hit`` counts the loads). Each process writes
its rows to ``.suite-profile/`` (``FUNCNET_SUITE_PROFILE_DIR`` to put them elsewhere), and
the process that ran pytest prints the report at the end of the run.

What it does not see: the work of the processes a test starts (the examples run as
scripts, the two-process training); their time shows as the test's "other". The events
are JAX's own, so the split holds for whatever jaxlib runs the suite; a program compiled
on another thread while a test runs is counted in that test.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import time

import pytest

# what the report calls each event, and jax.monitoring's name for it
EVENTS = {
    "compile": "/jax/core/compile/backend_compile_duration",
    "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "trace": "/jax/core/compile/jaxpr_trace_duration",
    "cache hit": "/jax/compilation_cache/cache_retrieval_time_sec",
}
_NAMES = {event: name for name, event in EVENTS.items()}


def profile_dir() -> str:
    return os.environ.get("FUNCNET_SUITE_PROFILE_DIR", ".suite-profile")


class Recorder:
    """Sums JAX's compile-path durations between ``start()`` and ``stop(test)``."""

    def __init__(self):
        self.rows = []
        self._seconds = collections.Counter()
        self._counts = collections.Counter()
        self._listening = False
        self._t0 = None

    def _listen(self, event, duration, **_):
        name = _NAMES.get(event)
        if name is not None:
            self._seconds[name] += duration
            self._counts[name] += 1

    def start(self):
        if not self._listening:  # imported here: the suite's conftest sets XLA_FLAGS before jax loads
            import jax.monitoring

            jax.monitoring.register_event_duration_secs_listener(self._listen)
            self._listening = True
        self._seconds.clear()
        self._counts.clear()
        self._t0 = time.perf_counter()

    def stop(self, test: str) -> dict:
        row = dict(test=test, wall=time.perf_counter() - self._t0, s=dict(self._seconds), n=dict(self._counts))
        self.rows.append(row)
        self._t0 = None
        return row

    @property
    def running(self) -> bool:
        return self._t0 is not None


def report(rows: list, top: int = 25) -> str:
    """The run's totals, then the files and the tests that cost the most, as text."""
    if not rows:
        return "no tests recorded"
    total = collections.Counter()
    count = collections.Counter()
    files = collections.defaultdict(collections.Counter)
    for r in rows:
        total["wall"] += r["wall"]
        total.update(r["s"])
        count.update(r["n"])
        f = files[r["test"].split("::")[0]]
        f["wall"] += r["wall"]
        f.update(r["s"])
        f["tests"] += 1
    jax_s = total["compile"] + total["lower"] + total["trace"]
    each = 1000 * total["compile"] / max(count["compile"], 1)
    lines = [
        f"{len(rows)} tests, {total['wall']:.0f} s of test time (summed over processes); of it:",
        f"  compile {total['compile']:.0f} s ({count['compile']} programs, {each:.0f} ms each), "
        f"lower {total['lower']:.0f} s, trace {total['trace']:.0f} s: "
        f"{100 * jax_s / max(total['wall'], 1e-9):.0f}% of the test time",
        f"  ({count['cache hit']} of the programs loaded from the compilation cache, in {total['cache hit']:.0f} s)",
        "",
        f"files by test time (top {top}): seconds, compile, lower+trace, tests",
    ]
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["wall"])[:top]:
        lines.append(f"  {f['wall']:7.1f} {f['compile']:7.1f} {f['lower'] + f['trace']:7.1f} {f['tests']:5d}  {name}")
    lines.append(f"tests by compile time (top {top}): seconds, compile, programs")
    for r in sorted(rows, key=lambda r: -r["s"].get("compile", 0.0))[:top]:
        lines.append(f"  {r['wall']:7.1f} {r['s'].get('compile', 0.0):7.1f} {r['n'].get('compile', 0):5d}  {r['test']}")
    return "\n".join(lines)


def load(directory: str) -> list:
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            rows += json.load(f)
    return rows


# --------------------------------------------------------------------------- #
# pytest hooks (the module is the plugin: `-p benchmarks.suite_profile`)
# --------------------------------------------------------------------------- #

_recorder = Recorder()


def _worker(config) -> str | None:
    return getattr(config, "workerinput", {}).get("workerid")


def pytest_configure(config):
    if _worker(config) is None:  # the process that ran pytest starts from an empty folder
        shutil.rmtree(profile_dir(), ignore_errors=True)
        os.makedirs(profile_dir())


@pytest.hookimpl(tryfirst=True)  # before the fixtures' set-up, which is the test's time too
def pytest_runtest_setup(item):
    _recorder.start()  # only where the test runs: an xdist controller never sets one up


def pytest_runtest_logfinish(nodeid, location):
    if _recorder.running:
        _recorder.stop(nodeid)


def pytest_sessionfinish(session):
    if not _recorder.rows:  # an xdist controller: its workers ran the tests
        return
    name = _worker(session.config) or "main"
    with open(os.path.join(profile_dir(), f"{name}.json"), "w") as f:
        json.dump(_recorder.rows, f)


def pytest_terminal_summary(terminalreporter, config):
    if _worker(config) is None:
        terminalreporter.section("funcnet: where the test time went (benchmarks.suite_profile)")
        terminalreporter.write_line(report(load(profile_dir())))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default=profile_dir())
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    print(report(load(args.directory), args.top))


if __name__ == "__main__":
    main()
