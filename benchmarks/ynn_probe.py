"""Which YNNPACK fusion types pay on XLA:CPU: the pieces of a CNN step under each.

    python -m benchmarks.ynn_probe [--reps 20]

Times, on the Flax MNIST CNN's first activation shape (128, 28, 28, 32): a sum over
the batch and positions (BatchNorm's statistics), the variance, BatchNorm's forward and
backward in training mode, and a 3x3 SAME convolution's forward and backward, each under
plain ``jax.jit`` and under ``xla_cpu_experimental_ynn_fusion_type`` set to each of
``INDIVIDUAL_DOT`` (funcnet's option until 2026-11-27) and ``INDIVIDUAL_DOT,REDUCE``
(since). Prints the median milliseconds; the values are what ``funcnet.xla``'s docstring
and ``benchmarks/CONV_NOTES.md`` quote.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

FUSION = "xla_cpu_experimental_ynn_fusion_type"
MODES = {
    "plain": None,
    "dot": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
    "dot+reduce": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE",
}


def _cases():
    import jax
    import jax.numpy as jnp

    from funcnet.layers import BatchNorm, Conv

    shape = (128, 28, 28, 32)
    x = jnp.asarray(np.random.default_rng(0).random(shape, dtype=np.float32))
    bn_init, bn_apply = BatchNorm()
    _, bn_p, bn_s = bn_init(jax.random.key(0), shape)
    conv_init, conv_apply = Conv(64, (3, 3), padding="SAME", implementation="xla")
    _, conv_p, conv_s = conv_init(jax.random.key(1), shape)

    def bn_loss(p, x):
        return jnp.sum(bn_apply(p, bn_s, x, train=True)[0] ** 2)

    def conv_loss(p, x):
        return jnp.sum(conv_apply(p, conv_s, x)[0] ** 2)

    return {
        "sum over (N, H, W)": (lambda x: jnp.sum(x, axis=(0, 1, 2)), (x,)),
        "variance over (N, H, W)": (lambda x: jnp.var(x, axis=(0, 1, 2)), (x,)),
        "BatchNorm forward+backward": (jax.grad(bn_loss, argnums=(0, 1)), (bn_p, x)),
        "conv3x3 32->64 forward+backward": (jax.grad(conv_loss, argnums=(0, 1)), (conv_p, x)),
    }


def _median_ms(f, args, reps):
    import jax

    jax.block_until_ready(f(*args))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        out.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(out)


def main(argv=None):
    import jax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, median ms of {args.reps}")
    print(f"{'':34s}" + "".join(f"{m:>12s}" for m in MODES))
    for name, (fn, fargs) in _cases().items():
        row = []
        for value in MODES.values():
            opts = {} if value is None else {FUSION: value}
            row.append(_median_ms(jax.jit(fn, compiler_options=opts), fargs, args.reps))
        print(f"{name:34s}" + "".join(f"{v:12.2f}" for v in row), flush=True)


if __name__ == "__main__":
    main()
