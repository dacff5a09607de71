"""funcnet.distributed: replicate/unreplicate/shard/process_slice, and two processes on
127.0.0.1 (gloo collectives, 2 CPU devices each) that train like one."""

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funcnet
from funcnet import distributed
from funcnet.layers import Dense
from helpers.distributed_setup import N_STEPS, batch, build

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 120


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["pmap", "mesh"])
def test_two_processes_match_single_process(tmp_path, mode):
    port = _free_port()
    outs = [tmp_path / f"p{i}.npz" for i in range(2)]
    # The mesh run also saves and restores a sharded tree with orbax from both processes.
    orbax = mode == "mesh" and importlib.util.find_spec("orbax") is not None
    extra = [str(tmp_path / "orbax")] if orbax else []
    codes, text = _run_workers(tmp_path, "distributed_worker.py", lambda i: (i, 2, port, outs[i], mode, *extra), mode)
    assert codes is not None, f"workers did not finish in {TIMEOUT_S} s\n{text}"
    assert codes == [0, 0], f"worker exit codes {codes}\n{text}"

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
    if orbax:  # one committed step, written by both processes together
        from funcnet.checkpoint import OrbaxCheckpointer

        assert OrbaxCheckpointer(tmp_path / "orbax").all_steps() == [N_STEPS]


def _run_workers(tmp_path, script, args_of, name):
    """Starts the two processes of ``script``; returns (exit codes or None, their output)."""
    env = dict(os.environ, XLA_FLAGS=os.environ.get("FUNCNET_TEST_XLA_FLAGS", ""))
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    logs = [open(tmp_path / f"{name}{i}.log", "w+") for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "helpers", script), *map(str, args_of(i))],
            env=env,
            stdout=logs[i],
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
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
        text.append(f"--- {name} process {i} output ---\n{f.read()[-3000:]}")
        f.close()
    return codes, "\n".join(text)


@pytest.mark.skipif(importlib.util.find_spec("orbax") is None, reason="needs orbax-checkpoint")
def test_two_processes_train_fsdp_are_killed_and_resume_bit_identically(tmp_path):
    """FSDP over the 4 devices of 2 processes with fit and orbax checkpoints: killed at
    step 5, restarted from step 3's checkpoint, the run ends bit for bit where an
    uninterrupted one does: params, Adam's moments and count, the step and the rng."""
    ckpt, outs = tmp_path / "ckpt", [tmp_path / f"final{i}.npz" for i in range(2)]
    port = _free_port()
    codes, text = _run_workers(tmp_path, "fsdp_worker.py", lambda i: (i, port, ckpt, outs[i], "crash"), "crash")
    assert codes is not None, f"workers did not finish in {TIMEOUT_S} s\n{text}"
    # Each process SIGKILLs itself at step 5. Process 0 hosts JAX's coordination service:
    # when it dies first, process 1's runtime aborts itself (SIGABRT, "another task died")
    # before it reaches its own kill; that is the same crash, as a real cluster sees it.
    assert codes[0] == -signal.SIGKILL, f"exit codes {codes}\n{text}"
    assert codes[1] == -signal.SIGKILL or (
        codes[1] == -signal.SIGABRT
        and re.search(r"distributed service|coordination service", text.split("process 1 output")[1])
    ), f"exit codes {codes}\n{text}"
    from funcnet.checkpoint import OrbaxCheckpointer

    assert 3 in OrbaxCheckpointer(ckpt).all_steps()
    port = _free_port()
    codes, text = _run_workers(tmp_path, "fsdp_worker.py", lambda i: (i, port, ckpt, outs[i], "resume"), "resume")
    assert codes == [0, 0], f"exit codes {codes}\n{text}"
    got = [dict(np.load(o)) for o in outs]
    paths = sorted(k[len("fresh/") :] for k in got[0] if k.startswith("fresh/"))
    assert sorted(k[len("resumed/") :] for k in got[0] if k.startswith("resumed/")) == paths
    layers = [f"{i}/{w}" for i in (0, 2, 4) for w in ("W", "b")]  # the three Dense layers
    assert paths == sorted(
        [f"params/{k}" for k in layers]
        + ["opt_state/0/count"]
        + [f"opt_state/0/{m}/{k}" for m in ("mu", "nu") for k in layers]
        + ["step", "rng"]
    )
    for r in got:
        assert r["fresh/step"] == r["fresh/opt_state/0/count"] == 8  # 2 epochs of 4 steps
        assert all(np.any(r[f"fresh/opt_state/0/{m}/{k}"] != 0) for m in ("mu", "nu") for k in layers)
        for p in paths:
            np.testing.assert_array_equal(r[f"resumed/{p}"], r[f"fresh/{p}"], err_msg=f"{p}: resumed != uninterrupted")
    for p in paths:  # and both processes hold the same state
        np.testing.assert_array_equal(got[0][f"fresh/{p}"], got[1][f"fresh/{p}"], err_msg=p)


@pytest.mark.devices(4)
def test_replicate_puts_one_copy_per_device_and_unreplicate_inverts():
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.int32(3), "key": jax.random.key(1)}
    rep = distributed.replicate(tree)
    assert rep["w"].shape == (4, 2, 3) and rep["step"].shape == (4,)
    assert {d for d in rep["w"].sharding.device_set} == set(jax.local_devices())
    back = distributed.unreplicate(rep)
    np.testing.assert_array_equal(back["w"], tree["w"])
    np.testing.assert_array_equal(jax.random.key_data(back["key"]), jax.random.key_data(tree["key"]))
    assert distributed.replicate(tree, 2)["w"].shape == (2, 2, 3)


@pytest.mark.devices(4)
def test_shard_splits_leading_axis_and_explains_bad_sizes():
    x, y = np.arange(24.0).reshape(8, 3), np.arange(8)
    sx, sy = distributed.shard((x, y))
    assert sx.shape == (4, 2, 3) and sy.shape == (4, 2)
    np.testing.assert_array_equal(sx.reshape(8, 3), x)
    with pytest.raises(
        ValueError,
        match=r"a batch of 10 examples cannot be split evenly over 4 "
        r"devices.*multiple of 4 \(e.g. 8\)",
    ):
        distributed.shard(np.zeros((10, 2)))
    with pytest.raises(ValueError, match="asked for 8 devices but this process has 4"):
        distributed.shard(x, 8)


def test_process_slice_partitions_the_global_batch():
    parts = [distributed.process_slice(12, i, 3) for i in range(3)]
    assert [(s.start, s.stop) for s in parts] == [(0, 4), (4, 8), (8, 12)]
    assert distributed.process_slice(8) == slice(0, 8)  # one process here
    with pytest.raises(ValueError, match="cannot be split evenly over 3 processes"):
        distributed.process_slice(10, 0, 3)
    assert distributed.is_main_process()


def test_funcnet_parallel_is_the_combinator_and_device_helpers_live_in_distributed():
    assert funcnet.parallel is funcnet.combinators.parallel
    layer = funcnet.parallel(Dense(2), Dense(3))
    assert isinstance(layer, funcnet.Layer)
    shapes, _, _ = layer.init(jax.random.key(0), ((-1, 4), (-1, 4)))
    assert shapes == ((-1, 2), (-1, 3))
    for name in distributed.__all__:
        assert callable(getattr(funcnet.distributed, name))


@pytest.mark.devices(4)
def test_mesh_helpers_place_state_whole_and_split_batches():
    mesh = distributed.data_mesh()
    assert mesh.axis_names == ("data",) and mesh.size == 4
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
    assert distributed.data_mesh(2, "d", explicit=False).axis_types == (jax.sharding.AxisType.Auto,)
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "key": jax.random.key(1)}
    rep = distributed.replicate_on(mesh, tree)
    assert rep["w"].sharding.is_fully_replicated and len(rep["w"].sharding.device_set) == 4
    np.testing.assert_array_equal(rep["w"], tree["w"])
    np.testing.assert_array_equal(jax.random.key_data(rep["key"]), jax.random.key_data(tree["key"]))
    own = tree["w"].unsafe_buffer_pointer()  # new buffers: a donating step spares the input
    assert all(s.data.unsafe_buffer_pointer() != own for s in rep["w"].addressable_shards)
    x, y = np.arange(16.0).reshape(8, 2), np.arange(8)
    bx, by = distributed.shard_batch(mesh, (x, y))
    assert bx.sharding.spec == jax.sharding.PartitionSpec("data")
    assert [s.data.shape for s in bx.addressable_shards] == [(2, 2)] * 4
    np.testing.assert_array_equal(bx, x)
    assert distributed.shard_batch(mesh, (bx,))[0] is bx  # already split: passed through
    (lx,) = distributed.shard_local_batch(mesh, (x,))  # one process: its part is the batch
    np.testing.assert_array_equal(lx, x)
    assert lx.sharding == bx.sharding
    with pytest.raises(ValueError, match="batch of 6 examples cannot be split evenly over 4"):
        distributed.shard_batch(mesh, (x[:6],))
    with pytest.raises(ValueError, match=r"same leading \(batch\) size.*\(4,\), \(8,\)"):
        distributed.shard_batch(mesh, (x, y[:4]))
    with pytest.raises(ValueError, match="asked for 9 devices"):
        distributed.data_mesh(9)


@pytest.mark.devices(4)
def test_shard_refuses_leaves_of_different_leading_sizes():
    # Each would be split on its own: images and labels of different examples, silently.
    with pytest.raises(
        ValueError,
        match=r"shard: every leaf of the batch needs the same leading "
        r"\(batch\) size, got \[0\]: 8, \[1\]: 4",
    ):
        distributed.shard((np.zeros((8, 2)), np.zeros(4)), 4)
    with pytest.raises(ValueError, match=r"\['y'\]: 12"):
        distributed.shard({"x": np.zeros((8, 2)), "y": np.zeros(12)}, 4)


def test_int64_values_that_int32_cannot_hold_are_refused_not_wrapped():
    # With x64 off JAX stores int64 as int32: 2**40 would silently become 0.
    assert not jax.config.jax_enable_x64
    big = {"count": np.int64(2**40)}
    with pytest.raises(
        ValueError,
        match=r"replicate: \['count'\] holds 1099511627776, which "
        r"int32 cannot hold.*jax_enable_x64",
    ):
        distributed.replicate(big)
    mesh = distributed.data_mesh()
    with pytest.raises(ValueError, match=r"replicate_on: \['count'\]"):
        distributed.replicate_on(mesh, big)
    ids = np.array([0, 1, 2, -(2**35)], np.int64)
    with pytest.raises(ValueError, match=r"shard_batch: \[1\] holds -34359738368"):
        distributed.shard_batch(mesh, (np.zeros(4), ids))
    with pytest.raises(ValueError, match=r"shard: \[1\] holds -34359738368"):
        distributed.shard((np.zeros(4), ids))
    with pytest.raises(ValueError, match=r"shard_local_batch: \[1\] holds -34359738368"):
        distributed.shard_local_batch(mesh, (np.zeros(4), ids))
    # int64 values that fit are fine (NumPy's default integer dtype), and round-trip.
    small = {"count": np.int64(2**31 - 1), "labels": np.arange(8)}
    back = distributed.unreplicate(distributed.replicate(small))
    assert int(back["count"]) == 2**31 - 1
    distributed.shard_batch(mesh, (np.arange(8),))


@pytest.mark.devices(4)
def test_unreplicate_refuses_trees_that_were_never_replicated():
    rep = distributed.replicate({"w": jnp.ones(3)})
    np.testing.assert_array_equal(distributed.unreplicate(rep)["w"], np.ones(3))
    out = jax.pmap(lambda x: x * 2)(jnp.ones((4, 3)))  # a pmap output is per-device too
    np.testing.assert_array_equal(distributed.unreplicate(out), 2 * np.ones(3))
    host = jax.device_get(rep)  # a host copy of replicas
    np.testing.assert_array_equal(distributed.unreplicate(host)["w"], np.ones(3))
    with pytest.raises(
        ValueError,
        match=r"unreplicate: \['w'\] is not split one row per device"
        r".*shape \(10,\) on 1 device.*replicate\(\) or a pmapped",
    ):
        distributed.unreplicate({"w": jnp.arange(10.0)})
    mesh_copy = distributed.replicate_on(distributed.data_mesh(), {"w": jnp.ones((4, 3))})
    with pytest.raises(ValueError, match=r"whole on every device.*replicate_on.*as it is"):
        distributed.unreplicate(mesh_copy)
    with pytest.raises(ValueError, match=r"unreplicate: \['b'\] has no leading replica axis"):
        distributed.unreplicate({"a": np.ones((4, 3)), "b": np.float32(1.0)})
    with pytest.raises(ValueError, match=r"leading sizes.*\['a'\]: 4.*\['b'\]: 3"):
        distributed.unreplicate({"a": np.ones((4, 3)), "b": np.ones(3)})


@pytest.mark.parametrize(
    "var,value", [("FUNCNET_NUM_PROCESSES", "two"), ("FUNCNET_PROCESS_ID", "1.5"), ("FUNCNET_COORDINATOR", "localhost")]
)
def test_initialize_names_a_bad_environment_variable(monkeypatch, var, value):
    for v in ("FUNCNET_NUM_PROCESSES", "FUNCNET_PROCESS_ID", "FUNCNET_COORDINATOR"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, value)
    # Checked before jax.distributed is touched: nothing is started.
    with pytest.raises(ValueError, match=rf"initialize: the environment variable {var}={value!r}"):
        distributed.initialize()


class _FakeStep:
    """Outputs of a step dispatched but not finished until someone blocks on them."""

    def __init__(self, log, i):
        self.log, self.i = log, i

    def block_until_ready(self):
        self.log.append(self.i)
        return self


def test_in_flight_never_lets_more_than_k_steps_run_unfinished():
    for k in (1, 2, 3):
        waited, in_flight_at_dispatch = [], []
        in_flight = distributed.InFlight(k, cpu_only=False)
        for i in range(10):
            # Dispatching step i: steps 0..i are dispatched, `waited` are known finished.
            in_flight_at_dispatch.append(i + 1 - len(waited))
            assert in_flight.add({"loss": _FakeStep(waited, i)})["loss"].i == i
        assert max(in_flight_at_dispatch) == k  # bounded, and no tighter than asked
        assert waited == list(range(10 - (k - 1)))  # always the oldest step first
        in_flight.wait()
        assert waited == list(range(10))
    unbounded = distributed.InFlight(None)
    waited = []
    for i in range(5):
        unbounded.add(_FakeStep(waited, i))
    assert waited == []
    # cpu_only (the default): bounded here, on CPU devices.
    assert distributed.InFlight().max_in_flight == 2
    with pytest.raises(ValueError, match="max_in_flight"):
        distributed.InFlight(0)
