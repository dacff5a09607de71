"""tinynn's denoising autoencoder on MNIST, with funcnet.

Encoder 784-256-ReLU-64, decoder ReLU-256-Tanh-784-Tanh (tinynn's ``examples/dae``),
inputs corrupted with Gaussian noise N(0.3, 0.2), trained to give back the clean
image: tinynn's MSE (half the squared error summed over the pixels, averaged over
the batch), Adam(1e-3), batch 128, tinynn's xavier-uniform weights and zero biases
(funcnet's own default is PyTorch's). The two networks live in one TrainState; the
step draws the noise from its own key and hands the noisy inputs and the
reconstructions back through ``Aux(outputs=...)`` for the picture.

    python examples/mnist_autoencoder.py --epochs 5

Prints the training loss per epoch and the test reconstruction error; writes
``--plot`` (PNG: noisy test inputs, reconstructions, clean images).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import funcnet
from funcnet import data, datasets, initializers, losses, optim
from funcnet.layers import Dense, Relu, Tanh
from funcnet.train import Aux, TrainState, make_train_step

try:
    from _plots import image_rows
except ImportError:  # run as a module from elsewhere
    from examples._plots import image_rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--noise-mean", type=float, default=0.3)
    p.add_argument("--noise-std", type=float, default=0.2)
    p.add_argument("--limit", type=int, default=None, help="train on the first N images only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--plot", default="mnist_autoencoder.png", help="PNG ('' = none)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    x_train, _ = datasets.mnist.load("train", args.data_dir, flatten=True)
    x_test, _ = datasets.mnist.load("test", args.data_dir, flatten=True)
    x_train = x_train[: args.limit]

    dense = lambda n: Dense(n, W_init=initializers.xavier_uniform(), b_init=initializers.zeros)
    encoder = funcnet.serial(dense(256), Relu, dense(64))
    decoder = funcnet.serial(Relu, dense(256), Tanh, dense(784), Tanh)
    optimizer = optim.adam(args.lr)  # one Adam over both nets = tinynn's two Adams
    ts = TrainState.create(
        {"encoder": (encoder, (-1, 784)), "decoder": (decoder, (-1, 64))}, optimizer, jax.random.key(args.seed)
    )

    def reconstruct(params, x):
        code, _ = encoder.apply(params["encoder"], (), x)
        return decoder.apply(params["decoder"], (), code)[0]

    def loss_fn(params, state, clean, rng):
        noisy = clean + args.noise_mean + args.noise_std * jax.random.normal(rng, clean.shape)
        recon = reconstruct(params, noisy)
        loss = 0.5 * losses.mse(recon, clean, reduction="sum_mean")
        return loss, Aux(state=state, outputs={"noisy": noisy[:12], "recon": recon[:12]})

    step = jax.jit(make_train_step(loss_fn, optimizer), donate_argnums=0)
    train_data = data.DeviceData(x_train, args.batch_size, shuffle=True, rng=args.seed)

    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        total = 0.0
        for batch in train_data(epoch):
            ts, metrics, outputs = step(ts, batch)
            total += metrics["loss"]  # stays on the device until printed
        print(
            f"epoch {epoch + 1:>3}  loss {float(total) / train_data.num_batches:.3f}  "
            f"({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )

    # Test: corrupt the test images the same way, measure how close the output is to the
    # clean image (tinynn's loss), against the error of the noisy input itself.
    noisy = x_test + args.noise_mean + args.noise_std * jax.random.normal(jax.random.key(args.seed + 1), x_test.shape)
    recon = jax.jit(reconstruct)(ts.params, noisy)
    err = float(0.5 * losses.mse(recon, x_test, reduction="sum_mean"))
    base = float(0.5 * losses.mse(jnp.clip(noisy, 0, 1), x_test, reduction="sum_mean"))
    print(f"test reconstruction error {err:.2f} (the noisy input itself: {base:.2f})")
    if args.plot:
        # the last training step's own noisy inputs, handed back by the step, then test images
        image_rows(
            args.plot,
            [outputs["noisy"], outputs["recon"], noisy[:12], recon[:12], x_test[:12]],
            ["train: noisy", "train: output", "test: noisy", "test: output", "test: clean"],
        )
    return err, base, outputs


if __name__ == "__main__":
    main()
