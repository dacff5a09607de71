"""Two processes on 127.0.0.1 (gloo collectives, 2 CPU devices each) train like one."""
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from helpers.distributed_setup import N_STEPS, batch, build

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 120


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_single_process(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    outs = [tmp_path / f"p{i}.npz" for i in range(2)]
    logs = [open(tmp_path / f"p{i}.log", "w+") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "helpers", "distributed_worker.py"),
                               str(i), "2", str(port), str(outs[i])], env=env, stdout=logs[i],
                              stderr=subprocess.STDOUT) for i in range(2)]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = []
    for i, f in enumerate(logs):
        f.seek(0)
        text.append(f"--- process {i} output ---\n{f.read()[-3000:]}")
        f.close()
    assert codes is not None, f"workers did not finish in {TIMEOUT_S} s\n" + "\n".join(text)
    assert codes == [0, 0], f"worker exit codes {codes}\n" + "\n".join(text)

    ts, step = build(axis_name=None)
    step = jax.jit(step)
    ref_losses = []
    for i in range(N_STEPS):
        ts, m = step(ts, batch(i))
        ref_losses.append(float(m["loss"]))
    ref = [np.asarray(l) for l in jax.tree.leaves((ts.params, ts.state))]
    results = [np.load(o) for o in outs]
    for r in results:
        np.testing.assert_allclose(r["losses"], ref_losses, rtol=1e-5)
        got = [r[f"arr_{k}"] for k in range(len(ref))]
        for g, want in zip(got, ref):
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
    for k in range(len(ref)):  # identical on every process, bit for bit
        np.testing.assert_array_equal(results[0][f"arr_{k}"], results[1][f"arr_{k}"])
