"""What a training step's PRNG key costs inside a device loop on XLA:CPU.

    python -m benchmarks.key_probe [--rounds 10]

Workload 6's dispatch-bound MLP (784-64-10, batch 32, SGD) on 60000 MNIST-shaped rows on
the device, one jitted ``lax.scan`` an epoch, each step gathering its shuffled rows (the
``jax-scan-shuffle`` peer's program), with the hand-written step alone and with a key
carried beside it five ways:

- ``none``: no key (the harness's hand step);
- ``count``: a step count carried, no key;
- ``split``: the key split every step and the half carried on, the other half unused
  (``make_train_step`` until 2026-12-04);
- ``fold``: step ``n``'s key ``jax.random.fold_in(key, n)``, unused (``make_train_step``
  since then): XLA drops it;
- ``split-drawn`` / ``fold-drawn``: the same with the step's key drawn from (one uniform
  number added to the loss times zero), so that neither is dropped: what a network with
  dropout pays for its key either way.

jax lowers threefry on CPU as a ``fori_loop`` of five trips (``jax._src.random``'s CPU
lowering rule), so a key made inside the step is a loop inside the device loop. Each peer
is compiled as XLA:CPU does by default and with :func:`funcnet.xla.unsplit_fusions`;
epochs of all peers alternate for ``--rounds`` rounds in one process. Prints, per
compilation and peer, the median ms per epoch and the fusions in the compiled program.
BENCHMARKS.md (workload 6, runs AF-AI) has the figures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common
from benchmarks.fit import _hand_update, _model, _shuffled_scan_epoch
from funcnet import xla

N, FEATURES, BATCH = 60000, 784, 32
PEERS = ("none", "count", "split", "fold", "split-drawn", "fold-drawn")


def _step(peer, hand_update):
    """``step((params, opt_state, key, count), x, y) -> (carry, loss)``: the harness's hand
    step, ``hand_update``, with ``peer``'s key beside it."""

    def step(carry, x, y):
        p, o, key, count = carry
        (p, o), loss = hand_update((p, o), x, y)
        drawn = None
        if peer.startswith("split"):
            key, drawn = jax.random.split(key)
        elif peer.startswith("fold"):
            drawn = jax.random.fold_in(key, count)
        if peer.endswith("-drawn"):
            loss = loss + 0.0 * jax.random.uniform(drawn)
        return (p, o, key, count if peer == "none" else count + 1), loss

    return step


def _epochs(x, y, peers, options):
    """``{peer: one_epoch() -> seconds}``: the harness's ``jax-scan-shuffle`` epoch of each
    peer's step (compiled with ``options``), the carry kept across calls;
    ``one_epoch.fusions``: the fusions of its compiled program."""
    n = x.shape[0]
    tx = optax.sgd(0.01)
    hand_update = _hand_update(tx)
    out = {}
    for peer in peers:
        _, params = _model(common.mlp_weights((FEATURES, 64, 10), seed=0))  # each peer donates its own
        carry = (params, tx.init(params), jax.random.key(0), jnp.zeros((), jnp.int32))
        scan = _shuffled_scan_epoch(_step(peer, hand_update), carry, x, y, n // BATCH, BATCH, n, options)

        def one_epoch(scan=scan):
            t = time.perf_counter()
            scan()
            return time.perf_counter() - t

        one_epoch.fusions = len(re.findall(r"= \S+ fusion\(", scan.compiled().as_text()))
        out[peer] = one_epoch
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.random((N, FEATURES), dtype=np.float32)
    y = rng.integers(0, 10, N, dtype=np.int32)
    for name, options in (("split", None), ("unsplit", xla.unsplit_fusions())):
        epochs = _epochs(x, y, PEERS, options)
        for one_epoch in epochs.values():
            one_epoch()  # compiles
        times = {peer: [] for peer in PEERS}
        for _ in range(args.rounds):
            for peer, one_epoch in epochs.items():
                times[peer].append(one_epoch())
        for peer in PEERS:
            median = statistics.median(times[peer]) * 1e3
            print(f"{name:7s} {peer:11s} {median:7.1f} ms/epoch  fusions {epochs[peer].fusions}", flush=True)


if __name__ == "__main__":
    main()
