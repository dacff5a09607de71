"""fit's defaults against the bare loop with funcnet's options on one of workload 6b's
networks, epochs alternated in one process.

    python -m benchmarks.family_pairs [--net lenet] [--rounds 6]

The harness (``benchmarks.run``, even with ``--same-process``) times each peer's epochs
one after another, so a drift of the machine between two peers' turns reads as a
difference between them. Here each round times three epochs of each peer, the peers'
turns alternating (the order flipped every round), in one process:

- ``fit-device``: ``funcnet.fit`` with its defaults over a shuffled ``DeviceData``
  (the harness's ``fit-device``; each round one ``fit`` call of four epochs, the first,
  which compiles, left out);
- ``jit-loop-options``: a Python loop over ``funcnet.xla.jit(make_train_step(...))`` on
  batches already on the device (the harness's ``jit-loop-options``), compiled once.

Prints the median ms per step of each and every round's ratio fit-device / jit-loop-options.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks import common, fit_nets
from benchmarks.workloads import by_name

EPOCHS = 3  # timed epochs per peer and round


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="lenet", choices=("lenet", "flax-cnn", "gpt"))
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from funcnet.train import TrainState

    case = next(c for c in by_name()["fit-nets"].cases if c["net"] == args.net)
    steps, batch = case["steps"], case["batch"]
    net, opt, in_shape, loss_fn, (x, y) = fit_nets._setup(case, steps)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, *in_shape))
    # each peer gets buffers of its own: both donate the train state they are given
    loop_epoch = fit_nets._jit_epoch(jax.tree.map(jnp.copy, ts), loss_fn, opt, x, y, batch, options=True)
    loop_epoch()  # compile

    def loop():
        return [s / steps for s in common.measure(loop_epoch, EPOCHS)]

    def fit():
        seconds, _ = fit_nets._fit("fit-device", jax.tree.map(jnp.copy, ts), loss_fn, opt, x, y, batch, EPOCHS)
        return [s / steps for s in seconds]

    peers = {"fit-device": fit, "jit-loop-options": loop}
    times = {peer: [] for peer in peers}
    ratios = []
    for r in range(args.rounds):
        got = {}
        for peer in list(peers) if r % 2 == 0 else list(peers)[::-1]:
            got[peer] = peers[peer]()
            times[peer] += got[peer]
        ratios.append(statistics.median(got["fit-device"]) / statistics.median(got["jit-loop-options"]))
    medians = ", ".join(f"{peer} {statistics.median(t) * 1e3:.2f} ms" for peer, t in times.items())
    print(f"jax {jax.__version__}, {common.cpu_info()['model']}; {args.net}, {steps} steps of {batch} per epoch")
    print(
        f"{medians} per step; fit-device / jit-loop-options per round "
        f"{' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
