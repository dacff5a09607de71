"""tinynn's GAN on MNIST (``--model mlp``, the default, or ``--model cnn``), with funcnet.

The generator and the discriminator are two models in one TrainState, each with its
own Adam (tinynn's settings: lr 7.5e-4 for G, 2e-4 for D, beta1 0.5, batch 128,
noise of size 50, LeakyReLU slope 0.2, N(0, 0.02) weights for the MLPs and
xavier-uniform ones for the CNNs, zero biases). Each
iteration is two pure steps: ``update="disc"`` trains the discriminator on real and
generated images with the generator frozen, then ``update="gen"`` trains the
generator to fool the frozen discriminator. Images are the 70000 MNIST digits
(train and test, as tinynn uses them).

    python examples/mnist_dcgan.py --epochs 5
    python examples/mnist_dcgan.py --model cnn --epochs 2

Prints per epoch the mean D and G losses and D's mean output on real digits, D(x),
and on generated ones, D(G(z)) (0.5 and 0.5 when D can no longer tell them apart);
writes ``--plot`` (PNG: 64 samples from a fixed noise batch).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import funcnet
from funcnet import data, datasets, initializers, losses, optim
from funcnet.layers import Conv, ConvTranspose, Dense, Flatten, LeakyRelu, MaxPool, Reshape, Sigmoid
from funcnet.train import Aux, TrainState, make_train_step

try:
    from _plots import image_rows
except ImportError:  # run as a module from elsewhere
    from examples._plots import image_rows

NOISE = 50


def nets(model):
    """(generator, discriminator, image shape) as in tinynn's examples/dcgan."""
    lrelu = LeakyRelu(0.2)  # tinynn's LeakyReLU slope (torch's default is 0.01)
    zero = initializers.zeros  # tinynn's default bias (funcnet's is PyTorch's)
    if model == "mlp":
        w = dict(W_init=initializers.normal(0.02), b_init=zero)
        G = funcnet.serial(Dense(100, **w), lrelu, Dense(300, **w), lrelu, Dense(784, **w), Sigmoid)
        D = funcnet.serial(Dense(300, **w), lrelu, Dense(100, **w), lrelu, Dense(1, **w))
        return G, D, (784,)
    # tinynn's "SAME" transposed conv stuffs zeros after every input pixel and pads
    # (2, 2): that is padding (2, 1) here, not funcnet's "SAME" (docs/porting.md).
    # tinynn's default init; it reads a conv kernel's fans its own way (docs/porting.md)
    w = dict(W_init=initializers.xavier_uniform(), b_init=zero)
    up = dict(strides=2, padding=((2, 1), (2, 1)), **w)
    G = funcnet.serial(
        Dense(7 * 7 * 16, **w),
        Reshape((7, 7, 16)),
        ConvTranspose(6, (5, 5), **up),
        lrelu,
        ConvTranspose(1, (5, 5), **up),
        Sigmoid,
    )
    D = funcnet.serial(
        Conv(6, (5, 5), padding="SAME", **w),
        lrelu,
        MaxPool((2, 2)),
        Conv(16, (5, 5), padding="SAME", **w),
        lrelu,
        MaxPool((2, 2)),
        Flatten,
        Dense(120, **w),
        lrelu,
        Dense(84, **w),
        lrelu,
        Dense(1, **w),
    )
    return G, D, (28, 28, 1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr-g", type=float, default=7.5e-4)
    p.add_argument("--lr-d", type=float, default=2e-4)
    p.add_argument("--beta1", type=float, default=0.5)
    p.add_argument("--limit", type=int, default=None, help="train on the first N images only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--plot", default="mnist_dcgan.png", help="PNG of samples ('' = none)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    G, D, image_shape = nets(args.model)
    flat = args.model == "mlp"
    images = np.concatenate([datasets.mnist.load(s, args.data_dir, flatten=flat)[0] for s in ("train", "test")])[
        : args.limit
    ]
    opts = {"gen": optim.adam(args.lr_g, b1=args.beta1), "disc": optim.adam(args.lr_d, b1=args.beta1)}
    gan = TrainState.create({"gen": (G, (-1, NOISE)), "disc": (D, (-1, *image_shape))}, opts, jax.random.key(args.seed))

    def generate(params, rng, n):
        return G.apply(params["gen"], (), jax.random.normal(rng, (n, NOISE)))[0]

    def bce(logits, target):
        return losses.sigmoid_binary_cross_entropy(logits, jnp.full_like(logits, target))

    def d_loss(params, state, real, rng):
        fake = generate(params, rng, real.shape[0])  # the generator is frozen in this step
        real_logits, _ = D.apply(params["disc"], (), real)
        fake_logits, _ = D.apply(params["disc"], (), fake)
        loss = bce(real_logits, 1.0) + bce(fake_logits, 0.0)
        return loss, Aux(
            state=state,
            metrics={"D(x)": jax.nn.sigmoid(real_logits).mean(), "D(G(z))": jax.nn.sigmoid(fake_logits).mean()},
        )

    def g_loss(params, state, real, rng):
        fake = generate(params, rng, real.shape[0])
        return bce(D.apply(params["disc"], (), fake)[0], 1.0), Aux(state=state)

    d_step = jax.jit(make_train_step(d_loss, opts, update="disc"), donate_argnums=0)
    g_step = jax.jit(make_train_step(g_loss, opts, update="gen"), donate_argnums=0)
    train_data = data.DeviceData(images, args.batch_size, shuffle=True, rng=args.seed)
    fixed = jax.random.key(args.seed + 1)

    t0 = time.perf_counter()
    history = []
    for epoch in range(args.epochs):
        totals = {}
        for real in train_data(epoch):
            gan, d_metrics = d_step(gan, real)
            gan, g_metrics = g_step(gan, real)
            logs = {
                "D loss": d_metrics["loss"],
                "G loss": g_metrics["loss"],
                "D(x)": d_metrics["D(x)"],
                "D(G(z))": d_metrics["D(G(z))"],
            }
            totals = {k: totals.get(k, 0.0) + v for k, v in logs.items()}  # on the device
        history.append({k: float(v) / train_data.num_batches for k, v in totals.items()})
        print(
            f"epoch {epoch + 1:>3}  "
            + "  ".join(f"{k} {v:.3f}" for k, v in history[-1].items())
            + f"  ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    if history:
        last = history[-1]
        print(
            f"final D loss {last['D loss']:.3f}, G loss {last['G loss']:.3f}, D(x) "
            f"{last['D(x)']:.3f}, D(G(z)) {last['D(G(z))']:.3f} ({args.model}, {args.epochs} "
            f"epochs, {time.perf_counter() - t0:.0f} s)"
        )

    sample = funcnet.make_predict_fn(G, gan.params["gen"])  # G in eval mode, jitted
    samples = np.asarray(sample(jax.random.normal(fixed, (64, NOISE)))).reshape(64, -1)
    if args.plot:
        image_rows(args.plot, [samples[i * 16 : (i + 1) * 16] for i in range(4)], ["samples"] + [""] * 3)
    return history, samples


if __name__ == "__main__":
    main()
