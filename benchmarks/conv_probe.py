"""Workload 3 investigation: where does the LeNet step spend its time on XLA:CPU vs PyTorch?

    python -m benchmarks.conv_probe [--reps 15] [--batch 128] [--only jax|torch]

Times forward, input-gradient and filter-gradient of the two convolutions and the
forward+backward of the two max-pools at workload 3's shapes (batch 128, VALID 5x5
convs), for several JAX formulations and for PyTorch. Run it under different
``XLA_FLAGS`` to compare XLA:CPU options. Prints medians in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SHAPES = {"conv1": ((28, 28, 1), 32), "conv2": ((12, 12, 32), 64)}


def _median_ms(fn, reps):
    fn()
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(out)


def probe_jax(batch, reps):
    import jax
    import jax.numpy as jnp
    from jax import lax

    from benchmarks import cnn

    rows = []
    rng = np.random.default_rng(0)
    for name, ((h, w, c), o) in SHAPES.items():
        x = jnp.asarray(rng.random((batch, h, w, c), dtype=np.float32))
        W = jnp.asarray(rng.standard_normal((5, 5, c, o), dtype=np.float32) * 0.1)
        convs = {
            "xla-nhwc": lambda x, W: lax.conv_general_dilated(
                x, W, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
            ),
            "xla-nchw": None,
            "im2col-slices": lambda x, W: cnn.im2col_conv(x, W),
            "rows": lambda x, W: cnn.rows_conv(x, W),
            "im2col-patches": lambda x, W: cnn.patches_conv(x, W),
            "im2col-custom_vjp": lambda x, W: cnn.conv_im2col_vjp(x, W),
        }
        for variant, f in convs.items():
            if variant == "xla-nchw":
                xin = jnp.transpose(x, (0, 3, 1, 2))
                Win = jnp.transpose(W, (3, 2, 0, 1))
                f = lambda x, W: lax.conv_general_dilated(
                    x, W, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")
                )
            else:
                xin, Win = x, W
            y = jax.jit(f)(xin, Win)
            dy = jnp.ones_like(y)
            fwd = jax.jit(f)
            dx = jax.jit(lambda x, W, dy: jax.vjp(lambda x: f(x, W), x)[1](dy)[0])
            dw = jax.jit(lambda x, W, dy: jax.vjp(lambda W: f(x, W), W)[1](dy)[0])
            rows.append(
                (
                    name,
                    variant,
                    _median_ms(lambda: fwd(xin, Win).block_until_ready(), reps),
                    _median_ms(lambda: dx(xin, Win, dy).block_until_ready(), reps),
                    _median_ms(lambda: dw(xin, Win, dy).block_until_ready(), reps),
                )
            )
    for name, (h, c) in {"pool1": (24, 32), "pool2": (8, 64)}.items():
        x = jnp.asarray(rng.random((batch, h, h, c), dtype=np.float32))
        for variant, f in {
            "reduce_window": cnn.maxpool_reduce_window,
            "reshape-max": cnn.maxpool_reshape,
            "reshape-firstmax": cnn.maxpool_reshape_first,
        }.items():
            fwd = jax.jit(f)
            y = fwd(x)
            dy = jnp.ones_like(y)
            bwd = jax.jit(lambda x, dy: jax.vjp(f, x)[1](dy)[0])
            rows.append(
                (
                    name,
                    variant,
                    _median_ms(lambda: fwd(x).block_until_ready(), reps),
                    _median_ms(lambda: bwd(x, dy).block_until_ready(), reps),
                    float("nan"),
                )
            )
    return rows


def probe_torch(batch, reps):
    import torch
    import torch.nn.functional as F

    rows = []
    rng = np.random.default_rng(0)
    for name, ((h, w, c), o) in SHAPES.items():
        x = torch.from_numpy(rng.random((batch, c, h, w), dtype=np.float32))
        W = torch.from_numpy(rng.standard_normal((o, c, 5, 5), dtype=np.float32) * 0.1)
        y = F.conv2d(x, W)
        dy = torch.ones_like(y)

        def back(mask):
            return torch.ops.aten.convolution_backward(dy, x, W, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, mask)

        with torch.no_grad():
            rows.append(
                (
                    name,
                    "torch-nchw",
                    _median_ms(lambda: F.conv2d(x, W), reps),
                    _median_ms(lambda: back([True, False, False]), reps),
                    _median_ms(lambda: back([False, True, False]), reps),
                )
            )
    for name, (h, c) in {"pool1": (24, 32), "pool2": (8, 64)}.items():
        x = torch.from_numpy(rng.random((batch, c, h, h), dtype=np.float32)).requires_grad_()

        def fb():
            y = F.max_pool2d(x, 2)
            y.backward(torch.ones_like(y))

        with torch.no_grad():
            f = _median_ms(lambda: F.max_pool2d(x, 2), reps)
        rows.append((name, "torch max_pool2d", f, _median_ms(fb, reps) - f, float("nan")))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--only", choices=("jax", "torch"), default=None)
    args = parser.parse_args(argv)
    rows = []
    if args.only in (None, "jax"):
        rows += probe_jax(args.batch, args.reps)
    if args.only in (None, "torch"):
        rows += probe_torch(args.batch, args.reps)
    print(f"{'op':6s} {'variant':20s} {'fwd ms':>8s} {'d/dx ms':>8s} {'d/dW ms':>8s}")
    for r in rows:
        print(f"{r[0]:6s} {r[1]:20s} {r[2]:8.2f} {r[3]:8.2f} {r[4]:8.2f}")


if __name__ == "__main__":
    main()
