"""One process of the 2-process test (tests/test_distributed.py); not a test itself.

    python tests/helpers/distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz

Each process has 2 CPU devices, takes its slice of every global batch and trains
the pmap step; collectives run across both processes over gloo on 127.0.0.1.
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

from funcnet import distributed  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.distributed_setup import GLOBAL_BATCH, N_STEPS, batch, build  # noqa: E402


def main():
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                        initialization_timeout=60)
    import jax
    assert jax.process_count() == nproc and jax.device_count() == 2 * nproc, jax.devices()
    ts, step = build(axis_name="batch")
    pstep = jax.pmap(step, axis_name="batch")
    ts = distributed.replicate(ts)
    mine = distributed.process_slice(GLOBAL_BATCH)
    losses = []
    for i in range(N_STEPS):
        x, y = batch(i)
        ts, m = pstep(ts, distributed.shard((x[mine], y[mine])))
        losses.append(float(m["loss"][0]))
    host = distributed.unreplicate(ts)
    leaves = [np.asarray(l) for l in jax.tree.leaves((host.params, host.state))]
    np.savez(out, losses=np.array(losses), *leaves)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
