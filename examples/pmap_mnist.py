"""Data-parallel MNIST with ``jax.pmap``: the step written out by hand, no ``fit``.

One machine, N devices (GPUs, or simulated CPU devices):

    python examples/pmap_mnist.py --devices 4

Several processes (one per host, or one per GPU), with JAX's own runtime. Start
the same command on every process; process 0's address is the coordinator:

    FUNCNET_COORDINATOR=10.0.0.1:1234 FUNCNET_NUM_PROCESSES=2 FUNCNET_PROCESS_ID=0 \\
        python examples/pmap_mnist.py --distributed          # on host 0
    FUNCNET_COORDINATOR=10.0.0.1:1234 FUNCNET_NUM_PROCESSES=2 FUNCNET_PROCESS_ID=1 \\
        python examples/pmap_mnist.py --distributed          # on host 1

(On a SLURM or Open MPI cluster the three variables can be left out:
``jax.distributed`` reads the cluster's own.) Every process builds the same
global batch from the same seed, keeps its slice (``distributed.process_slice``),
and splits that over its local devices; ``pmean`` then averages gradients over
all devices of all processes, so the parameters stay identical everywhere.
Only process 0 prints and would write checkpoints.

Coming from MXNet: ``kvstore.push(grads)``, ``kvstore.pull(weights)`` and the
updater are the ``lax.pmean`` inside ``make_train_step(..., axis_name=...)`` and the
optax update that follows it: one all-reduce in the compiled step.
"""

from __future__ import annotations

import argparse
import time

from _devices import simulate_cpu_devices  # examples/_devices.py


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=None, help="local devices (default: all)")
    p.add_argument("--distributed", action="store_true", help="start jax.distributed first")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512, help="global batch size")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    simulate_cpu_devices(args.devices)  # before jax starts
    import jax

    from funcnet import data, datasets, distributed, losses
    from funcnet.layers import Dense, Relu
    from funcnet.optim import adam
    from funcnet.train import Aux, TrainState, make_train_step
    import funcnet

    if args.distributed:
        distributed.initialize()
    n_local = distributed.local_device_count(args.devices)
    n_total = n_local * jax.process_count()
    main_process = distributed.is_main_process()

    x_train, y_train = datasets.mnist.load("train", args.data_dir, flatten=True)
    x_test, y_test = datasets.mnist.load("test", args.data_dir, flatten=True)
    net = funcnet.serial(Dense(400), Relu, Dense(100), Relu, Dense(10))
    optimizer = adam(args.lr)

    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, state = net.apply(params, state, x, rng=rng, train=True)
        return losses.cross_entropy(logits, y), Aux(state=state)

    step = jax.pmap(
        make_train_step(loss_fn, optimizer, axis_name="batch"),
        axis_name="batch",
        devices=jax.local_devices()[:n_local],
        donate_argnums=0,
    )
    ts = distributed.replicate(TrainState.create(net, optimizer, jax.random.key(args.seed), (-1, 784)), n_local)
    mine = distributed.process_slice(args.batch_size)
    if main_process:
        print(
            f"{jax.process_count()} process(es), {n_total} device(s) "
            f"({jax.local_devices()[0].platform}), global batch {args.batch_size}, "
            f"{args.batch_size // n_total} per device"
        )

    for epoch in range(args.epochs):
        it = data.prefetch_to_device(
            (
                (x[mine], y[mine])
                for x, y in data.batches((x_train, y_train), args.batch_size, shuffle=True, rng=args.seed, epoch=epoch)
            ),
            size=2,
            transform=lambda b: distributed.shard(b, n_local),
        )
        t0, n, m = time.perf_counter(), 0, None
        # At most two steps in flight on CPU: XLA:CPU's collectives can stall when many
        # multi-device executions are queued (see distributed.InFlight); no-op on GPU.
        in_flight = distributed.InFlight()
        for batch in it:
            ts, m = step(ts, batch)
            in_flight.add(m)
            n += args.batch_size
        loss = float(m["loss"][0])  # waits for the last step
        seconds = time.perf_counter() - t0
        params = distributed.unreplicate(ts.params)
        logits, _ = net.apply(params, distributed.unreplicate(ts.state), x_test)
        acc = float((logits.argmax(-1) == y_test).mean())
        if main_process:
            print(
                f"epoch {epoch + 1}: loss {loss:.4f}  test acc {100 * acc:.2f}%  "
                f"{n / seconds:,.0f} samples/s in all, {n / seconds / n_total:,.0f} per device "
                f"({seconds:.2f} s, first epoch includes compilation)"
            )
    if args.distributed:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
