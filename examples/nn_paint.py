"""tinynn's nn_paint with funcnet: a network that learns to paint one picture.

An MLP 2-30-100-100-30-3 (ReLU, sigmoid output) maps each pixel's coordinates to its
colour. As in tinynn's ``examples/nn_paint``: xavier-uniform weights, zero biases,
tinynn's MSE (half the squared error summed over R, G, B, averaged over the batch),
Adam(1e-3), batch 32. Without an
image argument it paints a built-in picture drawn in NumPy (nothing to download);
with one, any image matplotlib can read (PNG; JPEG through Pillow).

    python examples/nn_paint.py                 # the built-in picture, 100 epochs
    python examples/nn_paint.py my_photo.png --epochs 100 --size 96

Prints the mean squared error over all pixels and channels per epoch, and at the end
the PSNR of the painting; writes ``--plot`` (PNG: the target and the painting).
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import numpy as np

import funcnet
from funcnet import data, fit, initializers, losses, optim
from funcnet.callbacks import Callback
from funcnet.layers import Dense, Relu, Sigmoid
from funcnet.train import Aux, TrainState

try:
    from _plots import pyplot, save
except ImportError:  # run as a module from elsewhere
    from examples._plots import pyplot, save


def builtin_picture(size=64):
    """A small RGB picture with soft and hard edges: a sunset sky, a sun, a hill."""
    r, c = np.mgrid[0:size, 0:size] / (size - 1.0)
    img = np.stack([0.9 - 0.5 * r, 0.4 + 0.3 * r, 0.3 + 0.6 * (1 - r)], -1)
    sun = (r - 0.35) ** 2 + (c - 0.65) ** 2 < 0.12**2
    img[sun] = (1.0, 0.85, 0.2)
    hill = r > 0.7 + 0.1 * np.sin(6 * c)
    img[hill] = np.stack([0.1 + 0.2 * c, 0.5 - 0.2 * r, 0.15 + 0 * c], -1)[hill]
    return np.clip(img, 0, 1).astype(np.float32)


def load_picture(path, size):
    """The image at ``path`` as float32 RGB in [0, 1], subsampled to at most ``size`` a side."""
    try:
        from matplotlib.image import imread  # PNG itself, other formats through Pillow
    except ImportError:
        raise SystemExit(
            "reading an image needs matplotlib (pip install -e '.[examples]'); "
            "without an image argument the example paints its built-in picture."
        )
    img = np.asarray(imread(path), np.float32)
    img = img / 255.0 if img.max() > 1 else img
    img = np.repeat(img[..., None], 3, -1) if img.ndim == 2 else img[..., :3]
    step = max(1, max(img.shape[:2]) // size)  # keep it small: every pixel is an example
    return np.ascontiguousarray(img[::step, ::step])


def coordinates(h, w):
    """tinynn's inputs: each pixel's (row, column), centred and scaled by the size."""
    r, c = np.mgrid[0:h, 0:w]
    return np.stack([(r - h / 2) / h, (c - w / 2) / w], -1).reshape(-1, 2).astype(np.float32)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("image", nargs="?", default=None, help="picture to paint (default: built in)")
    p.add_argument("--epochs", type=int, default=100, help="tinynn's 100")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--size", type=int, default=64, help="longest side the image is cut to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="nn_paint.png", help="PNG ('' = none)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    target = load_picture(args.image, args.size) if args.image else builtin_picture(args.size)
    h, w, _ = target.shape
    x, y = coordinates(h, w), target.reshape(-1, 3)

    dense = lambda n: Dense(n, W_init=initializers.xavier_uniform(), b_init=initializers.zeros)
    net = funcnet.serial(dense(30), Relu, dense(100), Relu, dense(100), Relu, dense(30), Relu, dense(3), Sigmoid)
    optimizer = optim.adam(args.lr)
    ts = TrainState.create(net, optimizer, jax.random.key(args.seed), (-1, 2))

    def loss_fn(params, state, batch, rng):
        colours, state = net.apply(params, state, batch[0])
        return 0.5 * losses.mse(colours, batch[1], reduction="sum_mean"), Aux(state=state)

    errors = []

    class Report(Callback):
        def on_epoch_end(self, ctx, epoch, logs):
            painted = funcnet.make_predict_fn(net, ctx.train_state.params, ctx.train_state.state)(x)
            errors.append(float(losses.mse(painted, y)))
            print(f"epoch {epoch + 1:>4}  mse {errors[-1]:.5f}  ({logs['seconds']:.2f} s)", flush=True)

    t0 = time.perf_counter()
    ts, _ = fit(
        ts,
        loss_fn,
        optimizer,
        data.DeviceData((x, y), args.batch_size, shuffle=True, rng=args.seed),
        epochs=args.epochs,
        callbacks=[Report()],
        progress=False,
    )
    paint = funcnet.make_predict_fn(net, ts.params, ts.state)
    painting = np.asarray(paint(x)).reshape(h, w, 3)
    if errors:
        print(
            f"final mse {errors[-1]:.5f}, PSNR {10 * math.log10(1 / errors[-1]):.1f} dB "
            f"({h}x{w} picture, {len(errors)} epochs in {time.perf_counter() - t0:.1f} s)"
        )
    if args.plot:
        plt = pyplot()
        if plt is not None:
            fig, axes = plt.subplots(1, 2, figsize=(6, 3.2))
            for ax, img, title in zip(axes, (target, painting), ("target", "painting")):
                ax.imshow(img)
                ax.set(title=title, xticks=[], yticks=[])
            fig.tight_layout()
            save(fig, args.plot)
    return errors


if __name__ == "__main__":
    main()
