"""Workload 5: ``funcnet.losses.center_loss`` (vectorised, jitted) vs a per-sample Python loop.

One call computes the center loss of a batch and the updated centers,
``L = 1/(2B) sum_i ||x_i - c_{y_i}||^2`` and
``c_j <- c_j + alpha * sum_{i: y_i = j} (x_i - c_j) / (1 + n_j)``.
The loop is the per-sample formulation in NumPy: for each sample, add its squared distance
to the loss and its difference to its class's accumulator, then update the centers. Both
peers start from the same centers and batch; loss and a checksum of the new centers must
agree.
"""

from __future__ import annotations

import numpy as np

from benchmarks import common

ALPHA = 0.5


def _inputs(case):
    rng = np.random.default_rng(0)
    b, c, d = case["batch"], case["classes"], case["dim"]
    centers = rng.standard_normal((c, d)).astype(np.float32)
    feats = rng.standard_normal((b, d)).astype(np.float32)
    labels = rng.integers(0, c, size=(b,)).astype(np.int32)
    return centers, feats, labels


def python_loop(centers, feats, labels, alpha=ALPHA):
    loss = 0.0
    delta = np.zeros_like(centers)
    counts = np.zeros(centers.shape[0], centers.dtype)
    for i in range(feats.shape[0]):
        k = labels[i]
        diff = feats[i] - centers[k]
        loss += float(diff @ diff)
        delta[k] += diff
        counts[k] += 1
    new = centers + alpha * delta / (1.0 + counts)[:, None]
    return loss / (2 * feats.shape[0]), new


def run(peer, cfg, case):
    centers, feats, labels = _inputs(case)
    if peer == "python-loop":

        def call():
            return python_loop(centers, feats, labels)

        loss, new = call()
    elif peer == "funcnet":
        import jax
        import jax.numpy as jnp
        from funcnet import losses

        fn = jax.jit(lambda c, f, l: losses.center_loss(c, f, l, alpha=ALPHA))
        c, f, l = jnp.asarray(centers), jnp.asarray(feats), jnp.asarray(labels)

        def call():
            return jax.block_until_ready(fn(c, f, l))

        loss, new = call()
    else:
        raise ValueError(peer)
    reps = case["reps"]
    inner = 20 if peer == "funcnet" else 3  # several calls per timed rep: short calls

    def block():
        for _ in range(inner):
            call()

    call()
    values = [t / inner for t in common.measure(block, reps)]
    return {"values": values, "extra": {"loss": float(loss), "centers_sum": float(np.asarray(new, np.float64).sum())}}
