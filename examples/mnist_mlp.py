"""The tinynn MNIST experiment, reproduced with funcnet.

784-400-100-10 MLP, ReLU, softmax cross-entropy, Adam(lr=1e-3), batch 128,
20 epochs, xavier-uniform weights and zero biases (tinynn's defaults). tinynn
reports 98.19% test accuracy after 20 epochs (TensorFlow 98.11%).

    python examples/mnist_mlp.py                   # the full run
    python examples/mnist_mlp.py --epochs 2        # a quick look
    python examples/mnist_mlp.py --checkpoint-dir runs/mlp --resume   # continue a run

Prints one row per epoch (epoch, loss, test accuracy, seconds) and writes the
training curves to ``--plot`` (PNG; needs matplotlib, the ``examples`` extra).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

import funcnet
from funcnet import data, datasets, initializers, losses, metrics, optim
from funcnet.layers import Dense, Relu
from funcnet import fit
from funcnet.callbacks import Callback, Checkpoint
from funcnet.train import Aux, TrainState


def build_mlp():
    dense = lambda n: Dense(n, W_init=initializers.xavier_uniform(), b_init=initializers.zeros)
    return funcnet.serial(dense(400), Relu, dense(100), Relu, dense(10))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--data-dir",
        default=None,
        help="directory with the MNIST idx files (default: $FUNCNET_DATA_DIR, then the copy shipped in data/mnist)",
    )
    p.add_argument("--checkpoint-dir", default=None, help="save a checkpoint after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir's latest")
    p.add_argument("--plot", default="mnist_mlp_curves.png", help="PNG of the curves ('' = none)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.resume and not args.checkpoint_dir:
        sys.exit("--resume needs --checkpoint-dir")
    x_train, y_train = datasets.mnist.load("train", args.data_dir, flatten=True)
    x_test, y_test = datasets.mnist.load("test", args.data_dir, flatten=True)

    net = build_mlp()
    optimizer = optim.adam(args.lr)  # torch.optim.Adam semantics, as tinynn's Adam
    train_state = TrainState.create(net, optimizer, jax.random.key(args.seed), (-1, 784))

    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, state = net.apply(params, state, x, rng=rng, train=True)
        return losses.cross_entropy(logits, y), Aux(state=state)

    accuracy = metrics.Accuracy()

    def eval_fn(params, state, batch):
        x, y = batch
        logits, _ = net.apply(params, state, x)
        return accuracy.update(accuracy.init(), logits, y)

    # The 60000 images live on the device; fit gathers each shuffled batch in its step.
    train_data = data.DeviceData((x_train, y_train), args.batch_size, shuffle=True, rng=args.seed)
    test_data = lambda epoch: data.batches((x_test, y_test), 1000, drop_remainder=False)

    rows = []

    def report(line_logs):
        rows.append(line_logs)
        print(
            f"{line_logs['epoch'] + 1:>5}  {line_logs['loss']:.4f}  "
            f"{100 * line_logs['eval_metric']:8.2f}%  {line_logs['seconds']:7.2f}",
            flush=True,
        )

    class Report(Callback):
        def on_epoch_end(self, ctx, epoch, logs):
            report(logs)

    callbacks = [Report()]
    if args.checkpoint_dir:
        callbacks.append(Checkpoint(args.checkpoint_dir, every_epochs=1, keep=2))
    print(f"{'epoch':>5}  {'loss':>6}  {'test acc':>9}  {'seconds':>7}")
    t0 = time.perf_counter()
    train_state, history = fit(
        train_state,
        loss_fn,
        optimizer,
        train_data,
        epochs=args.epochs,
        eval_data=test_data,
        eval_fn=eval_fn,
        metric=accuracy,
        callbacks=callbacks,
        progress=args.progress,
        resume_from=args.checkpoint_dir if args.resume else None,
    )
    total = time.perf_counter() - t0
    if history:
        print(f"final test accuracy {100 * history[-1]['eval_metric']:.2f}% ({len(history)} epochs in {total:.1f} s)")
    if args.plot and rows:
        plot_curves(rows, args.plot)
    return history


def plot_curves(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[examples]'); no plot written.")
        return
    epochs = [r["epoch"] + 1 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [r["loss"] for r in rows], marker="o")
    a.set(xlabel="epoch", ylabel="training loss", title="loss")
    b.plot(epochs, [100 * r["eval_metric"] for r in rows], marker="o", color="C1")
    b.axhline(98.19, ls="--", color="grey", label="tinynn 98.19%")
    b.set(xlabel="epoch", ylabel="test accuracy (%)", title="test accuracy")
    b.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"curves written to {path}")


if __name__ == "__main__":
    main()
