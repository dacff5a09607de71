"""MNIST with the train state sharded over devices: FSDP, or tensor parallel on a 2-D mesh.

A wide MLP (784-2048-2048-10, Adam) trained with ``fit(..., mesh=mesh)`` on a train
state placed by rules (``funcnet.sharding``):

    python examples/sharded_mnist.py --layout fsdp --devices 4     # ZeRO-3 / FSDP
    python examples/sharded_mnist.py --layout 2d --devices 4       # data x model (Megatron)
    python examples/sharded_mnist.py --layout replicated           # data parallel, for comparison

``fsdp`` splits every large leaf (and Adam's moments with it) over the ``data`` axis;
``2d`` makes a ``("data", "model")`` mesh with 2 devices along ``model``, splits the
first Dense by columns and the second by rows over ``model`` (the activation between
them stays split), and the rest FSDP over ``data``. It prints where each leaf lives
and how much of the state each device holds, then one row per epoch. On a CPU-only
machine the devices are simulated (``--devices``, default 4). The accuracy is the
same whatever the layout: the layout decides where the numbers live, not what they are.
"""

from __future__ import annotations

import argparse

from _devices import simulate_cpu_devices  # examples/_devices.py


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", choices=["fsdp", "2d", "replicated"], default="fsdp")
    p.add_argument("--devices", type=int, default=4, help="devices to use (simulated on CPU)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--train-size", type=int, default=None, help="use the first N training images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    simulate_cpu_devices(args.devices)  # before jax starts
    import jax

    import funcnet
    from funcnet import data, datasets, distributed, losses, metrics, optim, sharding
    from funcnet.layers import Dense, Relu
    from funcnet.train import Aux, TrainState

    x_train, y_train = datasets.mnist.load("train", args.data_dir, flatten=True)
    x_test, y_test = datasets.mnist.load("test", args.data_dir, flatten=True)
    if args.train_size:
        x_train, y_train = x_train[: args.train_size], y_train[: args.train_size]

    net = funcnet.serial(Dense(args.width), Relu, Dense(args.width), Relu, Dense(10))
    optimizer = optim.adam(1e-3)
    ts = TrainState.create(net, optimizer, jax.random.key(args.seed), (-1, 784))

    devices = jax.devices()[: args.devices]
    if args.layout == "2d":
        mesh = jax.make_mesh((len(devices) // 2, 2), ("data", "model"), devices=devices)
        rules = sharding.megatron_rules(column=["0"], row=["2"], fsdp_axis="data") + sharding.fsdp_rules("data")
    else:
        mesh = distributed.data_mesh(devices)
        rules = sharding.fsdp_rules("data") if args.layout == "fsdp" else []
    ts = sharding.shard_params(ts, mesh, rules) if rules else distributed.replicate_on(mesh, ts)
    placed = sharding.state_shardings(ts)
    sharding.explain(ts.params)
    held = sharding.explain(ts, print_fn=None)
    print(
        f"layout {args.layout} on mesh {dict(mesh.shape)}: params + Adam state "
        f"{held.bytes_total / 2**20:.1f} MiB in all, {held.bytes_per_device / 2**20:.1f} MiB "
        f"on the fullest device"
    )

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0])
        return losses.cross_entropy(logits, batch[1]), Aux(state=state)

    accuracy = metrics.Accuracy()

    def eval_fn(params, state, batch):
        logits, _ = net.apply(params, state, batch[0])
        return accuracy.update(accuracy.init(), logits, batch[1])

    train = data.DeviceData((x_train, y_train), args.batch_size, shuffle=True, rng=args.seed)
    test = lambda epoch: data.batches((x_test, y_test), 1000)  # noqa: E731
    ts, history = funcnet.fit(
        ts, loss_fn, optimizer, train, epochs=args.epochs, mesh=mesh, eval_data=test, eval_fn=eval_fn, metric=accuracy
    )
    for logs in history:
        print(
            f"epoch {logs['epoch'] + 1}: loss {logs['loss']:.4f}, test accuracy "
            f"{100 * logs['eval_metric']:.2f}%, {logs['seconds']:.1f} s"
        )
    kept = all(a.sharding.is_equivalent_to(b, a.ndim) for a, b in zip(jax.tree.leaves(ts), jax.tree.leaves(placed)))
    print(f"the trained params are still laid out as placed: {kept}")
    return history


if __name__ == "__main__":
    main()
