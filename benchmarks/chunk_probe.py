"""XLA:CPU convolutions on a whole batch against the same batch in pieces (CONV_NOTES.md).

    python -m benchmarks.chunk_probe            # both tables, 2 threads (all usable CPUs)
    taskset -c 1 python -m benchmarks.chunk_probe --ops   # one thread, per-op table only

``--ops``: LeNet's conv2 (128x12x12x32, 5x5x32x64, VALID) forward, input gradient and
filter gradient, each one jitted function, as one convolution and as k pieces of the
batch (``lax.conv_general_dilated`` of each slice, concatenated; for the filter
gradient the pieces' gradients summed). ``--shapes``: ``value_and_grad`` of
``0.5 * sum(conv(x, w)**2)`` with respect to both, for other shapes, whole against pieces
of 16, 32 and 64 examples. Medians in ms. Pieces must give the same values; checked.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def conv(x, w, padding="VALID"):
    sp = "HWD"[: x.ndim - 2]
    dn = ("N" + sp + "C", sp + "IO", "N" + sp + "C")
    return lax.conv_general_dilated(x, w, (1,) * (x.ndim - 2), padding, dimension_numbers=dn)


def of_size(c, padding):
    """conv over slices of c examples (the last one shorter), concatenated."""

    def f(x, w):
        n = x.shape[0]
        if n <= c:
            return conv(x, w, padding)
        return jnp.concatenate([conv(x[i : i + c], w, padding) for i in range(0, n, c)])

    return f


def median_ms(fn, *args, reps):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def ops_table(reps):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((128, 12, 12, 32), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((5, 5, 32, 64), dtype=np.float32) * 0.05)
    dy = jnp.asarray(rng.standard_normal((128, 8, 8, 64), dtype=np.float32))
    ops = {
        "forward": lambda f: lambda x, w, dy: f(x, w),
        "d/dx": lambda f: lambda x, w, dy: jax.vjp(lambda x: f(x, w), x)[1](dy)[0],
        "d/dW": lambda f: lambda x, w, dy: jax.vjp(lambda w: f(x, w), w)[1](dy)[0],
    }
    print("| conv2 op | whole batch | 2 pieces | 4 pieces | 8 pieces | 16 pieces |")
    print("|---|---|---|---|---|---|")
    for name, make in ops.items():
        row, ref = [], None
        for f in [conv] + [of_size(x.shape[0] // k, "VALID") for k in (2, 4, 8, 16)]:
            g = jax.jit(make(f))
            out = g(x, w, dy)
            if ref is None:
                ref = out
            np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-3)
            row.append(f"{median_ms(g, x, w, dy, reps=reps):.2f}")
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


SHAPES = [  # (input, kernel, padding)
    ((128, 12, 12, 32), (5, 5, 32, 64), "VALID"),
    ((256, 12, 12, 32), (5, 5, 32, 64), "VALID"),
    ((64, 12, 12, 32), (5, 5, 32, 64), "VALID"),
    ((128, 16, 16, 64), (3, 3, 64, 64), "SAME"),
    ((128, 32, 32, 3), (3, 3, 3, 32), "SAME"),
    ((128, 32, 32, 16), (3, 3, 16, 32), "SAME"),
    ((128, 32, 32, 32), (3, 3, 32, 32), "SAME"),
    ((128, 28, 28, 8), (3, 3, 8, 16), "SAME"),
    ((64, 8, 8, 256), (3, 3, 256, 256), "SAME"),
    ((128, 100, 32), (5, 32, 64), "VALID"),
    ((128, 8, 8, 8, 16), (3, 3, 3, 16, 32), "SAME"),
]


def shapes_table(reps):
    rng = np.random.default_rng(0)
    print("| input | kernel | whole batch | pieces of 16 | of 32 | of 64 |")
    print("|---|---|---|---|---|---|")
    for xs, ws, pad in SHAPES:
        x = jnp.asarray(rng.standard_normal(xs, dtype=np.float32))
        w = jnp.asarray(rng.standard_normal(ws, dtype=np.float32) * 0.05)
        row, ref = [], None
        for f in [lambda x, w, pad=pad: conv(x, w, pad)] + [of_size(c, pad) for c in (16, 32, 64)]:
            g = jax.jit(jax.value_and_grad(lambda x, w, f=f: 0.5 * jnp.sum(f(x, w) ** 2), (0, 1)))
            out = g(x, w)
            if ref is None:
                ref = out
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-2), out, ref)
            row.append(f"{median_ms(g, x, w, reps=reps):.1f}")
        print(f"| {xs} | {ws} | " + " | ".join(row) + " |", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", action="store_true", help="only the conv2 per-op table")
    p.add_argument("--shapes", action="store_true", help="only the shapes table")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument(
        "--rounds", type=int, default=1, help="repeat the tables (run-to-run noise on a shared VM is 10-30%%)"
    )
    args = p.parse_args(argv)
    both = not (args.ops or args.shapes)
    for _ in range(args.rounds):
        if args.ops or both:
            ops_table(args.reps)
        if args.shapes or both:
            shapes_table(args.reps)


if __name__ == "__main__":
    main()
