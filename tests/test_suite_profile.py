"""benchmarks/suite_profile.py, the plugin that splits the suite's time into JAX's tracing,
lowering and compiling per test: what it records, what it reports, and a run of it under
xdist (where the controller sees every test too, and must not count them twice)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import suite_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_recorder_counts_the_programs_a_test_compiles():
    rec = suite_profile.Recorder()
    rec.start()
    assert rec.running
    # a constant no other test uses: a new program, compiled or loaded from the run's cache
    c = float(np.random.default_rng().integers(1, 2**30))
    jax.jit(lambda x: jnp.tanh(x) * c)(jnp.ones(3)).block_until_ready()
    row = rec.stop("t::one")
    assert not rec.running and rec.rows == [row]
    assert row["test"] == "t::one" and row["wall"] > 0
    assert row["n"]["compile"] >= 1 and 0 < row["s"]["compile"] <= row["wall"]
    assert row["n"]["lower"] >= 1 and row["n"]["trace"] >= 1
    rec.start()  # the next test starts from zero
    row = rec.stop("t::two")
    assert row["n"] == {} and row["s"] == {}


def test_report_sums_and_ranks_files_and_tests():
    rows = [
        dict(test="tests/a.py::x", wall=4.0, s={"compile": 2.0, "lower": 0.5, "trace": 0.5}, n={"compile": 4}),
        dict(test="tests/a.py::y", wall=1.0, s={"compile": 0.5}, n={"compile": 1}),
        dict(test="tests/b.py::z", wall=5.0, s={"compile": 3.0, "cache hit": 0.25}, n={"compile": 5, "cache hit": 2}),
    ]
    text = suite_profile.report(rows, top=2)
    lines = text.splitlines()
    assert lines[0] == "3 tests, 10 s of test time (summed over processes); of it:"
    # 5.5 s of 10 compiling (10 programs, 550 ms each), 0.5 lowering, 0.5 tracing: 65 %
    assert "compile 6 s (10 programs, 550 ms each), lower 0 s, trace 0 s: 65% of the test time" in lines[1]
    assert "2 of the programs loaded from the compilation cache" in lines[2]
    files = lines[lines.index("files by test time (top 2): seconds, compile, lower+trace, tests") + 1 :][:2]
    assert [f.split()[-1] for f in files] == ["tests/a.py", "tests/b.py"]  # 5.0 s each: a first (stable)
    assert files[0].split()[:4] == ["5.0", "2.5", "1.0", "2"] and files[1].split()[:4] == ["5.0", "3.0", "0.0", "1"]
    tests = lines[lines.index("tests by compile time (top 2): seconds, compile, programs") + 1 :]
    assert [t.split()[-1] for t in tests] == ["tests/b.py::z", "tests/a.py::x"]
    assert suite_profile.report([]) == "no tests recorded"


def test_a_run_under_xdist_records_each_test_once(tmp_path):
    (tmp_path / "test_tiny.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def test_a():\n    assert jax.jit(lambda x: x * 3.5)(jnp.ones(2)).sum() == 7\n"
        "def test_b():\n    assert jax.jit(lambda x: x - 0.5)(jnp.ones(2)).sum() == 1\n"
        "def test_c():\n    pass\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT, FUNCNET_SUITE_PROFILE_DIR=str(tmp_path / "profile"))
    env["XLA_FLAGS"] = env.get("FUNCNET_TEST_XLA_FLAGS", "")
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "-p", "benchmarks.suite_profile"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "where the test time went" in proc.stdout and "3 tests, " in proc.stdout, proc.stdout
    files = sorted(os.listdir(tmp_path / "profile"))
    assert files and all(f.startswith("gw") for f in files), files  # none from the controller
    rows = [r for f in files for r in json.loads((tmp_path / "profile" / f).read_text())]
    assert sorted(r["test"] for r in rows) == ["test_tiny.py::test_a", "test_tiny.py::test_b", "test_tiny.py::test_c"]
    assert {r["test"].split("::")[1] for r in rows if r["n"].get("compile")} >= {"test_a", "test_b"}
