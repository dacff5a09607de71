"""Workload 7: data parallelism over 4 simulated CPU devices (``jax.pmap``, and ``jax.jit`` on a
mesh) vs ``jax.jit`` on 1.

Every peer runs funcnet's own step (``funcnet.train.make_train_step``) on the workload-1 MLP
with a global batch of 512: ``pmap-4`` shards it as 4 x 128 with ``axis_name`` (gradients
``pmean``-ed); ``jit-mesh-4`` runs the plain step (no ``axis_name``) jitted on the state
replicated over a 4-device mesh and the batch split over it (``funcnet.distributed``'s
``replicate_on``/``shard_batch``), XLA inserting the all-reduce; ``jit-1`` runs all 512 on
one device. Same weights and data, so the first-step losses agree. Correctness-level only:
the simulated devices share the machine's cores and one thread pool.
"""

from __future__ import annotations

from benchmarks import common


def run(peer, cfg, case):
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import distributed, train
    from benchmarks.mlp import _funcnet

    weights = common.mlp_weights(case["sizes"], seed=0)
    params, forward = _funcnet(weights)
    tx = optax.adam(1e-3)

    def loss_fn(params, state, batch, rng):
        x, y = batch
        loss = optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y).mean()
        return loss, train.Aux(state=state)

    ts = train.TrainState(params, (), tx.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
    xs, ys = common.mnist_like_batches(case["batch"], 4, seed=1)
    if peer == "pmap-4":
        n = jax.local_device_count()
        if n != 4:
            raise RuntimeError(f"pmap-4 needs 4 devices, found {n}: XLA_FLAGS not applied")
        step = jax.pmap(train.make_train_step(loss_fn, tx, axis_name="batch"), axis_name="batch")
        ts = distributed.replicate(ts)
        place = jax.pmap(lambda t: t)  # puts each shard on its device once, outside the timing
        batches = [place(distributed.shard((jnp.asarray(x), jnp.asarray(y)), n)) for x, y in zip(xs, ys)]
        first = lambda m: float(m["loss"][0])
    elif peer == "jit-mesh-4":
        if jax.device_count() != 4:
            raise RuntimeError(f"jit-mesh-4 needs 4 devices, found {jax.device_count()}: XLA_FLAGS not applied")
        mesh = distributed.data_mesh()
        jitted = jax.jit(train.make_train_step(loss_fn, tx))

        def step(ts, batch):
            with jax.set_mesh(mesh):
                return jitted(ts, batch)

        ts = distributed.replicate_on(mesh, ts)
        batches = [distributed.shard_batch(mesh, (x, y)) for x, y in zip(xs, ys)]
        first = lambda m: float(m["loss"])
    elif peer == "jit-1":
        step = jax.jit(train.make_train_step(loss_fn, tx))
        batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in zip(xs, ys)]
        first = lambda m: float(m["loss"])
    else:
        raise ValueError(peer)
    jax.block_until_ready(batches)

    ts, m = step(ts, batches[0])
    loss_first = first(m)
    for i in range(1, 3):
        ts, m = step(ts, batches[i % len(batches)])
    jax.block_until_ready(ts)
    steps = case["steps"]

    def block():
        nonlocal ts, m
        for i in range(steps):
            ts, m = step(ts, batches[i % len(batches)])
        jax.block_until_ready((ts, m))

    values = [t / steps for t in common.measure(block, case["reps"])]
    return {"values": values, "extra": {"loss_first": loss_first, "devices": jax.local_device_count()}}
