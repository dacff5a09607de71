"""Residual's gradient summed once against XLA's fusion of it into every later block.

    python -m benchmarks.residual_probe [--rounds 20]

``funcnet.Residual`` puts an ``optimization_barrier`` on the gradient reaching its input
(``funcnet.combinators._gradient_materialized``; this probe measures that private
mechanism, so it switches it off by replacing it with the identity while it traces the
"plain" program). In one process, the train dispatch of ``examples/shakespeare_char.py``
at nanoGPT's CPU configuration (50 AdamW steps in a ``lax.scan``) is compiled both ways
from the same state, then the two run alternately, ``--rounds`` dispatches each (the
order flipped every round, so that this VM's drift falls on both). Prints the widest
fusion of each program (how many arrays it reads: the quadratic growth shows there), the
first dispatch's loss difference, and the median ms per step of each with the per-round
ratio. The wall times of whole runs beside nanoGPT are in the transformers guide.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from funcnet import combinators

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
NANOGPT_CPU = (
    "--eval-iters=20 --log-interval=100 --block-size=64 --batch-size=12 --n-layer=4 --n-head=4 "
    "--n-embd=128 --max-iters=2000 --lr-decay-iters=2000 --dropout=0.0"
).split()


def widest_fusion(compiled) -> int:
    return max(len(re.findall(r"%[\w.-]+", ops)) for ops in re.findall(r" fusion\(([^)]*)\)", compiled.as_text()))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--plain-first", action="store_true", help="compile and run the plain program first")
    a = p.parse_args(argv)
    sys.path.insert(0, EXAMPLES)
    import shakespeare_char as ex

    args = ex.refuse_bad_args(ex.parse_args(NANOGPT_CPU))
    args.dtype = args.dtype or ex.default_dtype(*ex.device_platform())
    chars, train_ids, val_ids = ex.check_block_size(args, ex.encode_splits(ex.load_text(args.data)))
    net, optimizer = ex.build(args, len(chars))
    ts, draws, _ = ex.start(args, net, optimizer, len(chars), len(train_ids), len(val_ids))
    draws = ex.Draws(*map(jnp.asarray, draws))

    barrier = combinators._gradient_materialized
    programs = {}
    order = [("barrier", barrier), ("plain", lambda x: x)][:: -1 if a.plain_first else 1]
    for name, fn in order:
        combinators._gradient_materialized = fn
        try:
            programs[name] = ex.compile_train_steps(args, net, optimizer, ts, train_ids, draws, lambda b: b)[0]
        finally:
            combinators._gradient_materialized = barrier
    print(f"jax {jax.__version__}; widest fusion (arrays read):", {n: widest_fusion(c) for n, c in programs.items()})

    states = {n: jax.tree.map(lambda x: x.copy(), ts) for n in programs}
    first = {}
    for n, run in programs.items():
        states[n], first[n] = run(states[n], 0)
    print("first dispatch, largest loss difference:", float(jnp.max(jnp.abs(first["barrier"] - first["plain"]))))
    times = {n: [] for n in programs}
    for r in range(a.rounds):
        for n in list(programs)[:: 1 if r % 2 == 0 else -1]:
            t = time.perf_counter()
            states[n], losses = programs[n](states[n], 50 * (r % 30 + 1))
            losses.block_until_ready()
            times[n].append((time.perf_counter() - t) / 50 * 1e3)
    for n, v in times.items():
        print(f"{n}: median {statistics.median(v):.2f} ms/step")
    print("barrier / plain per round:", " ".join(f"{b / p:.2f}" for b, p in zip(times["barrier"], times["plain"])))


if __name__ == "__main__":
    main()
