"""Softmax + center loss on MNIST with a 2-D embedding: the classic center-loss figure.

An MLP maps each digit to a point in the plane; a 10-way classifier reads that
point. Training minimises the softmax loss plus ``lambda`` times the center loss
(Wen et al., 2016), whose class centers are explicit state: passed into the loss
and returned updated (MXNet's rule), never mutated. The classifier head is
``funcnet.outputs.softmax_output``, MXNet's ``SoftmaxOutput`` with its
hand-written gradient (``--head cross_entropy`` uses plain autodiff instead).

    python examples/mnist_center_loss.py                    # one CPU device
    python examples/mnist_center_loss.py --devices 4        # data parallel, one set of centers

With ``--devices N`` on a CPU-only machine, N CPU devices are simulated. ``fit`` runs
the step with ``jax.jit`` over a data mesh: each device holds a slice of the batch,
XLA sums the per-class center updates across them, and the centers stay one array,
the same as one device's (MXNet kept one copy per card, and they drifted apart; a
hand-written ``pmap`` loop gets the same with ``center_loss(..., axis_name=...)``).

Writes ``--plot`` (PNG): the 2-D test features coloured by class, centers marked.
"""

from __future__ import annotations

import argparse

from _devices import simulate_cpu_devices  # examples/_devices.py


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--center-weight", type=float, default=0.1, help="lambda")
    p.add_argument("--alpha", type=float, default=0.5, help="center learning rate")
    p.add_argument("--head", choices=["softmax_output", "cross_entropy"], default="softmax_output")
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--limit", type=int, default=None, help="use only the first N training images")
    p.add_argument("--plot", default="mnist_center_loss.png", help="PNG of the features ('' = none)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    simulate_cpu_devices(args.devices)  # before jax starts
    import jax
    import jax.numpy as jnp

    import funcnet
    from funcnet import data, datasets, distributed, losses, metrics, optim, outputs
    from funcnet.layers import Dense, Relu
    from funcnet import fit
    from funcnet.callbacks import Callback
    from funcnet.train import Aux, TrainState

    x_train, y_train = datasets.mnist.load("train", args.data_dir, flatten=True)
    x_test, y_test = datasets.mnist.load("test", args.data_dir, flatten=True)
    if args.limit:
        x_train, y_train = x_train[: args.limit], y_train[: args.limit]

    embed = funcnet.serial(Dense(256), Relu, Dense(128), Relu, Dense(2))
    net = funcnet.serial(embed, funcnet.FanOut(2), funcnet.parallel(funcnet.Identity, Dense(10)))
    optimizer = optim.adam(args.lr)
    train_state = TrainState.create(
        net, optimizer, jax.random.key(args.seed), (-1, 784), loss_state=losses.center_loss_init(10, 2)
    )
    # With --devices N, fit runs jit over a data mesh: the step sees the global batch, so
    # center_loss needs no axis_name (the centers are one array, not one per device).
    mesh = distributed.data_mesh(args.devices) if args.devices else None

    def loss_fn(params, state, batch, rng, loss_state):
        x, y = batch
        (features, logits), state = net.apply(params, state, x, rng=rng, train=True)
        closs, centers = losses.center_loss(loss_state, features, y, alpha=args.alpha)
        ce = losses.cross_entropy(logits, y)
        if args.head == "softmax_output":
            # SoftmaxOutput ignores the incoming cotangent and injects (p - onehot) / B.
            # The surrogate is 0 in value and carries exactly that gradient, so the
            # reported loss stays the cross-entropy.
            probs = jnp.sum(outputs.softmax_output(logits, y, normalization="batch"))
            softmax_term = jax.lax.stop_gradient(ce) + probs - jax.lax.stop_gradient(probs)
        else:
            softmax_term = ce
        total = softmax_term + args.center_weight * closs
        return total, Aux(state=state, loss_state=centers, metrics={"center_loss": closs})

    acc = metrics.Accuracy()

    def eval_fn(params, state, batch):
        (_, logits), _ = net.apply(params, state, batch[0])
        return acc.update(acc.init(), logits, batch[1])

    train_data = lambda epoch: data.batches(
        (x_train, y_train), args.batch_size, shuffle=True, rng=args.seed, epoch=epoch
    )
    test_data = lambda epoch: data.batches((x_test, y_test), 1000)
    print(f"{'epoch':>5}  {'loss':>7}  {'center':>7}  {'test acc':>8}  {'samples/s':>9}")

    class Report(Callback):
        def on_epoch_end(self, ctx, epoch, logs):
            print(
                f"{epoch + 1:>5}  {logs['loss']:7.4f}  {logs['center_loss']:7.4f}  "
                f"{100 * logs['eval_metric']:7.2f}%  {logs['samples_per_s']:9,.0f}",
                flush=True,
            )

    train_state, history = fit(
        train_state,
        loss_fn,
        optimizer,
        train_data,
        epochs=args.epochs,
        eval_data=test_data,
        eval_fn=eval_fn,
        metric=acc,
        mesh=mesh,
        callbacks=[Report()],
        progress=args.progress,
    )
    print(f"final test accuracy {100 * history[-1]['eval_metric']:.2f}%")

    if args.plot:
        features, _ = embed.apply(train_state.params[0], train_state.state[0], x_test)
        plot_features(jax.device_get(features), y_test, jax.device_get(train_state.loss_state), args.plot)
    return history, train_state


def plot_features(features, labels, centers, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[examples]'); no plot written.")
        return
    fig, ax = plt.subplots(figsize=(6, 6))
    for c in range(10):
        pts = features[labels == c]
        ax.scatter(pts[:, 0], pts[:, 1], s=1, alpha=0.4, color=plt.cm.tab10(c), label=str(c))
    ax.legend(markerscale=6, loc="best", fontsize=8)
    ax.scatter(centers[:, 0], centers[:, 1], s=120, marker="X", color="black")
    ax.set(
        title="MNIST test features, softmax + center loss (X: class centers)", xlabel="feature 1", ylabel="feature 2"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"feature plot written to {path}")


if __name__ == "__main__":
    main()
