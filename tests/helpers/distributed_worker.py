"""One process of the 2-process test (tests/test_distributed.py); not a test itself.

    python tests/helpers/distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz [pmap|mesh [CKPT_DIR]]

Each process has 2 CPU devices and takes its slice of every global batch. ``pmap``
trains the pmap step; ``mesh`` builds global arrays from the process-local slices
on a mesh spanning every process's devices and runs the plain jitted step (XLA
inserts the all-reduce). Collectives run across both processes over gloo on 127.0.0.1.
With ``CKPT_DIR`` (mesh only, needs orbax-checkpoint), both processes then save the
train state and a table split over all four devices with ``OrbaxCheckpointer`` and
restore them from a fresh checkpointer; each process only ever holds its own half
of the table.
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

from funcnet import distributed  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.distributed_setup import GLOBAL_BATCH, N_STEPS, batch, build  # noqa: E402


def main():
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid, initialization_timeout=60
    )
    import jax

    assert jax.process_count() == nproc and jax.device_count() == 2 * nproc, jax.devices()
    train = train_on_mesh if (sys.argv[5:] or ["pmap"])[0] == "mesh" else train_pmap
    losses, host = train(jax)
    if sys.argv[6:]:
        orbax_round_trip(jax, host, sys.argv[6])
    leaves = [np.asarray(l) for l in jax.tree.leaves((host.params, host.state))]
    np.savez(out, losses=np.array(losses), *leaves)
    jax.distributed.shutdown()


def train_pmap(jax):
    ts, step = build(axis_name="batch")
    pstep = jax.pmap(step, axis_name="batch")
    ts = distributed.replicate(ts)
    mine = distributed.process_slice(GLOBAL_BATCH)
    losses = []
    for i in range(N_STEPS):
        x, y = batch(i)
        ts, m = pstep(ts, distributed.shard((x[mine], y[mine])))
        losses.append(float(m["loss"][0]))
    return losses, distributed.unreplicate(ts)


def train_on_mesh(jax):
    ts, step = build(axis_name=None)
    mesh = distributed.data_mesh()  # all devices of both processes
    assert {d.process_index for d in mesh.devices.flat} == set(range(jax.process_count()))
    step = jax.jit(step, donate_argnums=0)
    ts = distributed.replicate_on(mesh, ts)
    mine = distributed.process_slice(GLOBAL_BATCH)
    losses = []
    for i in range(N_STEPS):
        x, y = batch(i)
        local = distributed.shard_local_batch(mesh, (x[mine], y[mine]))
        assert local[0].shape == x.shape  # global arrays, built from this process's rows
        with jax.set_mesh(mesh):
            ts, m = step(ts, local)
        losses.append(float(m["loss"]))
    return losses, ts


def orbax_round_trip(jax, ts, directory):
    """Saves a sharded tree from every process and restores it bit for bit, sharding kept."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from funcnet.checkpoint import OrbaxCheckpointer

    mesh = distributed.data_mesh()
    rows = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    table = jax.make_array_from_callback(rows.shape, NamedSharding(mesh, P("data")), lambda index: rows[index])
    mine = {tuple(s.index[0].indices(8)) for s in table.addressable_shards}
    assert len(mine) == 2 and len(table.addressable_shards) == 2  # half the rows live here
    tree = {"ts": ts, "table": table}
    ck = OrbaxCheckpointer(directory, run_id="two-processes")
    ck.save(N_STEPS, tree)
    ck.close()
    target = jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array) and not jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)
            else x
        ),
        tree,
    )
    back = OrbaxCheckpointer(directory).restore(target)
    assert back["table"].sharding == table.sharding
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
        if jax.numpy.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        for sa, sb in zip(a.addressable_shards, b.addressable_shards):
            np.testing.assert_array_equal(np.asarray(sa.data), np.asarray(sb.data))


if __name__ == "__main__":
    main()
