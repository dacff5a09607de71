"""One process of the 2-process FSDP test (tests/test_distributed.py); not a test itself.

    python tests/helpers/fsdp_worker.py PROCESS_ID PORT CKPT_DIR OUT.npz crash|resume

Each process has 2 CPU devices; the mesh spans all 4 of both processes, and the
train state (params and Adam's moments) is split over it by ``fsdp_rules``, so each
process holds half of every large leaf. ``fit`` trains with a ``DeviceData`` and an
orbax ``Checkpoint`` every 3 steps. ``crash`` is killed (SIGKILL, by itself) at step
5, after the checkpoint of step 3 is committed; ``resume`` restarts from that
checkpoint and trains to the end, then trains a fresh state uninterrupted in the
same processes, and writes both final train states (gathered: params, Adam's count and
moments, the step and the rng's key data, named ``resumed/PATH`` and ``fresh/PATH`` by
``funcnet.paths``) to its own OUT.npz for the test to compare bit for bit.
"""

import os
import signal
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

from funcnet import distributed, sharding  # noqa: E402

EPOCHS, N, BATCH = 2, 64, 16  # 8 steps
CKPT_EVERY, KILL_AT = 3, 5


def build(jax):
    import jax.numpy as jnp
    import optax

    import funcnet
    from funcnet.layers import Dense, Relu
    from funcnet.train import Aux, TrainState

    net = funcnet.serial(Dense(32), Relu, Dense(32), Relu, Dense(4))
    opt = optax.adam(1e-2)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0])
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state)

    rng = np.random.default_rng(0)
    data = (rng.normal(size=(N, 8)).astype(np.float32), rng.normal(size=(N, 4)).astype(np.float32))
    return ts, loss_fn, opt, data


def main():
    pid, port, ckpt_dir, out, phase = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid, initialization_timeout=60
    )
    import jax
    from jax.experimental import multihost_utils

    import funcnet
    from funcnet import callbacks
    from funcnet.data import DeviceData

    ts, loss_fn, opt, arrays = build(jax)
    mesh = distributed.data_mesh()  # 4 devices, 2 per process
    rules = sharding.fsdp_rules("data", min_size=64)

    def train(directory, resume=False, extra=()):
        sharded = sharding.shard_params(ts, mesh, rules)
        halves = [x for x in jax.tree.leaves(sharded.params) if not x.sharding.is_fully_replicated]
        assert halves and all(len(x.addressable_shards) == 2 for x in halves)
        data = DeviceData(arrays, BATCH, shuffle=True, rng=0)
        ck = callbacks.Checkpoint(directory, every_steps=CKPT_EVERY, every_epochs=None, keep=None, backend="orbax")
        out_ts, _ = funcnet.fit(
            sharded,
            loss_fn,
            opt,
            data,
            epochs=EPOCHS,
            mesh=mesh,
            callbacks=[ck, *(cb(ck) for cb in extra)],
            resume_from=ck.checkpointer if resume else None,
        )
        for a, b in zip(jax.tree.leaves(out_ts), jax.tree.leaves(sharded)):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
        return gather(out_ts)

    def gather(tree):
        """Every leaf of ``tree`` whole on this process, by path (keys as key data)."""
        import jax.numpy as jnp

        flat = {
            path: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
            for path, x in funcnet.paths(tree).items()
        }
        return {path: np.asarray(x) for path, x in multihost_utils.process_allgather(flat, tiled=True).items()}

    if phase == "crash":

        class Die(callbacks.Callback):
            def __init__(self, ck):
                self.ck = ck

            def on_step_end(self, ctx, step):
                if step == KILL_AT:
                    self.ck.checkpointer.wait()  # step 3 committed (a kill mid-save is
                    os.kill(os.getpid(), signal.SIGKILL)  # tests/test_checkpoint_orbax.py's)

        train(ckpt_dir, extra=[Die])
        raise SystemExit("not killed")
    resumed = train(ckpt_dir, resume=True)
    fresh = train(ckpt_dir + "-uninterrupted")
    np.savez(out, **{f"resumed/{k}": v for k, v in resumed.items()}, **{f"fresh/{k}": v for k, v in fresh.items()})
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
