"""funcnet.checkpoint.OrbaxCheckpointer: a 4-device sharded state saved asynchronously and restored
with its shardings, SIGKILL during an async save, keep=N, run ownership, finite steps."""

import os
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from funcnet import checkpoint

pytest.importorskip("orbax.checkpoint")
from funcnet.checkpoint import OrbaxCheckpointer  # noqa: E402
from orbax.checkpoint._src.path import atomicity  # noqa: E402  (to hold a commit back)


def sharded_state(v=0.0):
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    w = jax.device_put(jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8) + v, NamedSharding(mesh, P("d", None)))
    b = jax.device_put(jnp.full((8,), v, jnp.bfloat16), NamedSharding(mesh, P()))
    return {
        "params": {"w": w, "b": b},
        "step": jnp.int32(int(v)),
        "rng": jax.random.key(7),
        "epoch": np.int64(3),
        "count": 5,
    }


def assert_same(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(x), jax.random.key_data(y))
            continue
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        if isinstance(x, jax.Array):
            assert x.sharding == y.sharding
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def held_commit(monkeypatch):
    """Holds orbax's final rename (the commit) until the event is set: proves save returned
    while the write was still in flight, without relying on timing."""
    release = threading.Event()
    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self, *args, **kwargs):
        release.wait(timeout=60)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize)
    return release


def test_async_sharded_save_and_bit_identical_restore(tmp_path, held_commit):
    state = sharded_state(1.0)
    ck = OrbaxCheckpointer(tmp_path, keep=2)
    ck.save(1, state)
    # save returned, the commit is held: the step is not there yet, and training goes on
    assert ck.latest_step() is None
    state2 = jax.tree.map(lambda x: x * 2 if isinstance(x, jax.Array) and x.dtype == jnp.float32 else x, state)
    assert float(state2["params"]["w"][1, 0]) == 2 * float(state["params"]["w"][1, 0])
    held_commit.set()
    ck.wait()
    assert ck.latest_step() == 1 and ck.all_steps() == [1]
    target = sharded_state(0.0)
    restored = ck.restore(target)
    assert_same(restored, state)
    assert restored["params"]["w"].sharding == state["params"]["w"].sharding
    ck.close()
    # a fresh checkpointer (a new process) reads it, also into abstract targets
    abstract = jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array) and not jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
            else x
        ),
        target,
    )
    again = OrbaxCheckpointer(tmp_path).restore(abstract, step=1)
    assert again["params"]["w"].sharding == state["params"]["w"].sharding
    np.testing.assert_array_equal(np.asarray(again["params"]["w"]), np.asarray(state["params"]["w"]))


def test_keep_rotation_ownership_and_finite(tmp_path):
    ck = OrbaxCheckpointer(tmp_path, keep=2, run_id="r", async_=False)
    for s in (1, 2, 3):
        ck.save(s, sharded_state(s))
    ck.wait()
    assert ck.all_steps() == [2, 3]
    bad = sharded_state(4)
    bad["params"]["w"] = bad["params"]["w"] * jnp.nan
    ck.save(4, bad)
    ck.save(5, sharded_state(5), finite=False)  # e.g. a NaN loss
    ck.save(6, bad)
    ck.wait()
    assert ck.all_steps() == [3, 5, 6] and ck.latest_step(finite_only=True) == 3
    assert [ck.info(s).finite for s in (3, 5, 6)] == [True, False, False]
    assert ck.info(6).run_id == "r"
    ck.close()
    other = OrbaxCheckpointer(tmp_path, keep=2, run_id="new")
    with pytest.raises(checkpoint.CheckpointOwnershipError) as info:
        other.save(1, sharded_state(1))
    assert str(tmp_path) in str(info.value) and "[3, 5, 6]" in str(info.value)
    other.close()
    over = OrbaxCheckpointer(tmp_path, keep=2, run_id="new", overwrite=True)
    over.save(1, sharded_state(1))
    over.wait()
    assert over.all_steps() == [1]
    over.close()


KILLED_WRITER = r"""
import os, signal, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from orbax.checkpoint._src.path import atomicity
from funcnet.checkpoint import OrbaxCheckpointer
mesh = Mesh(np.array(jax.devices()), ("d",))
def state(v):
    return {"w": jax.device_put(jnp.full((1024, 256), v, jnp.float32), NamedSharding(mesh, P("d")))}
ck = OrbaxCheckpointer(sys.argv[1], keep=2)
ck.save(1, state(1.0))
ck.wait()
async def never(self, *a, **k):  # the second save never commits: it is in flight when killed
    import time; time.sleep(3600)
atomicity.AtomicRenameTemporaryPath.finalize = never
ck.save(2, state(2.0))
# orbax makes the save's temporary directory on a thread of its own: on a loaded machine
# save() can return before it exists, and a kill then would test nothing in flight
import time
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not any(
        n.startswith("2.") and "tmp" in n for n in os.listdir(sys.argv[1])):
    time.sleep(0.02)
print("in flight", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_during_async_save_keeps_previous_step(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("FUNCNET_TEST_XLA_FLAGS", "")
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert "in flight" in proc.stdout
    assert any(n.startswith("2.") and "tmp" in n for n in os.listdir(tmp_path)), os.listdir(tmp_path)
    ck = OrbaxCheckpointer(tmp_path, keep=2)
    assert ck.all_steps() == [1]
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    target = {"w": jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=sharding)}
    restored = ck.restore(target)
    assert restored["w"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.ones((1024, 256), np.float32))
    ck.save(2, {"w": jax.device_put(jnp.full((1024, 256), 2.0), sharding)})  # the same run goes on
    ck.wait()
    assert ck.all_steps() == [1, 2]
    ck.close()
