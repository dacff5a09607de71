"""What a shuffled epoch costs on the dispatch-bound MLP: rows read in a new order against
rows read in place.

    python -m benchmarks.gather_probe [--rounds 8]

Workload 6's dispatch-bound MLP (784-64-10, batch 32, SGD 0.1) on MNIST-shaped data on
the device (60000 x 784 float32, 188 MB): ``fit`` over a shuffled ``DeviceData`` gathers
each step's 32 rows by index (``x[idx]`` inside the device loop), where the fixed-order
``jax-scan`` peer slices 32 consecutive rows. The bare loops run 50 steps per dispatch in
``lax.scan``, over the epoch's 1850 full-dispatch steps. Three measurements, each of two
peers, alternated for ``--rounds`` rounds in one process (the order flipped every round):

- ``reads``: the epoch's batches only, each summed (so that XLA keeps the read), in one
  program per epoch: what the new order costs in memory traffic alone;
- ``epoch``: whole epochs of the SGD step over the same batches, as the two peers run them;
- ``fit``: ``funcnet.fit``'s own epoch (its defaults, no progress bar) over a shuffled
  ``DeviceData`` against one with ``shuffle=False`` over the same rows in place (the
  benchmark's ``fit-device-fixed``): the same cost inside fit, measured in one process,
  where the harness's peers each run in their own; and a third peer, ``scan``: the
  fixed-order epoch as the harness's ``jax-scan`` runs it, the hand-written SGD step in
  one jitted ``lax.scan`` over all 1875 batches stacked once (one dispatch an epoch),
  so ``slices / scan`` is fit's loop against the fastest loop by hand on the same rows.
  Each fit value is the last epoch of a three-epoch ``fit`` call (the first compiles;
  from the second, fit's dispatches may grow past 50 steps); fit's epochs run all 1875
  steps;
- ``step``: the share of ``slices / scan`` that is the step itself: ``scan`` again, and
  ``train_step``, ``funcnet.train.make_train_step`` (funcnet's layers, loss, TrainState
  with its step count, the step's key a ``fold_in`` of it, the metrics) in the same
  jitted ``lax.scan`` over the same stacked batches, one dispatch an epoch. What ``fit``'s ``slices / scan``
  has beyond ``train_step / scan`` is fit's loop (dispatches, the slice reads, the
  metric rows) and its epoch's host work.

``--cases`` picks some (default: all four).

Prints the median ms per epoch of each and the per-round ratio (gather / slices; for
``fit``, shuffled / in place, and in place / scan; for ``step``, train_step / scan).
The rows of one batch are 3 KB apart in place and anywhere in 188 MB shuffled, so the
shuffled reads miss the caches at every row; BENCHMARKS.md (workload 6's run R notes)
has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

N, FEATURES, BATCH, K = 60000, 784, 32, 50
STEPS = N // BATCH // K * K  # the epoch's steps in full dispatches
CASES = ("reads", "epoch", "fit", "step")


def _loss(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _sgd(p, x, y):
    loss, g = jax.value_and_grad(_loss)(p, x, y)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), loss


@jax.jit
def reads_gathered(x, idx):
    return jax.lax.scan(lambda c, i: (c + x[i].sum(), None), 0.0, idx)[0]


@jax.jit
def reads_sliced(x, starts):
    return jax.lax.scan(lambda c, s: (c + jax.lax.dynamic_slice_in_dim(x, s, BATCH).sum(), None), 0.0, starts)[0]


@jax.jit
def dispatch_gathered(p, x, y, idx):  # idx: (K, BATCH), as fit's loop reads a DeviceData
    return jax.lax.scan(lambda p, i: _sgd(p, x[i], y[i]), p, idx)


@jax.jit
def dispatch_sliced(p, x, y, starts):  # starts: (K,), as the fixed-order scan reads its batches
    def body(p, s):
        return _sgd(p, jax.lax.dynamic_slice_in_dim(x, s, BATCH), jax.lax.dynamic_slice_in_dim(y, s, BATCH))

    return jax.lax.scan(body, p, starts)


def _params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "w1": jax.random.normal(k1, (FEATURES, 64)) * 0.03,
        "b1": jnp.zeros(64),
        "w2": jax.random.normal(k2, (64, 10)) * 0.1,
        "b2": jnp.zeros(10),
    }


def _timed(fn) -> float:
    t = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t


def _scan_peer(x, y):
    """``run()`` timing one fixed-order epoch of the hand-written SGD step in one jitted
    ``lax.scan`` over all 1875 batches, stacked once (the harness's ``jax-scan``)."""
    steps = N // BATCH
    xs, ys = x[: steps * BATCH].reshape(steps, BATCH, FEATURES), y[: steps * BATCH].reshape(steps, BATCH)
    scan = jax.jit(lambda p, xs, ys: jax.lax.scan(lambda p, b: _sgd(p, *b), p, (xs, ys)), donate_argnums=0)
    carry = {"p": _params()}

    def scan_epoch():
        t = time.perf_counter()
        carry["p"], _ = scan(carry["p"], xs, ys)
        jax.block_until_ready(carry["p"])
        return time.perf_counter() - t

    return scan_epoch, (xs, ys)


def _funcnet_mlp():
    """The MLP as fit trains it here: ``(tx, loss_fn, start)``, funcnet's layers and loss."""
    import optax

    from funcnet import losses
    from funcnet.combinators import serial
    from funcnet.layers.activations import Relu
    from funcnet.layers.dense import Dense
    from funcnet.train import Aux, TrainState

    net = serial(Dense(64), Relu, Dense(10))
    tx = optax.sgd(0.1)

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits, batch[1]), Aux(state=state)

    return tx, loss_fn, TrainState.create(net, tx, jax.random.key(0), (-1, FEATURES))


def _step_epochs(x, y):
    """``{"train_step": run, "scan": run}``: one fixed-order epoch of
    ``make_train_step``'s step, and of the hand-written one, each in one jitted
    ``lax.scan`` over the same stacked batches."""
    from funcnet.train import make_train_step

    tx, loss_fn, start = _funcnet_mlp()
    scan_epoch, (xs, ys) = _scan_peer(x, y)
    step = make_train_step(loss_fn, tx)
    scan = jax.jit(lambda ts, xs, ys: jax.lax.scan(step, ts, (xs, ys)), donate_argnums=0)
    carry = {"ts": jax.tree.map(jnp.copy, start)}

    def step_epoch():
        t = time.perf_counter()
        carry["ts"], _ = scan(carry["ts"], xs, ys)
        jax.block_until_ready(carry["ts"])
        return time.perf_counter() - t

    return {"train_step": step_epoch, "scan": scan_epoch}


def _fit_epochs(x, y):
    """``{"gather": run, "slices": run, "scan": run}``: for the first two, ``run()``
    returns the time of the last epoch of a three-epoch ``funcnet.fit`` on this MLP
    (funcnet's layers, loss and step) over the rows shuffled, or in place; for ``scan``,
    of one epoch of the hand-written step in one ``lax.scan`` over the rows in place."""
    from benchmarks import common
    from funcnet import data, fit

    tx, loss_fn, start = _funcnet_mlp()
    sources = {
        "gather": data.DeviceData((x, y), BATCH, shuffle=True, rng=0),
        "slices": data.DeviceData((x, y), BATCH, shuffle=False),
    }

    def epoch(source):
        def run():
            clock = common.epoch_clock()
            fit(start, loss_fn, tx, source, epochs=3, progress=False, callbacks=[clock])
            return clock.epochs[2]

        return run

    scan_epoch, _ = _scan_peer(x, y)
    return {**{peer: epoch(source) for peer, source in sources.items()}, "scan": scan_epoch}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((N, FEATURES), dtype=np.float32))
    y = jax.device_put(rng.integers(0, 10, N).astype(np.int32))
    order = jax.device_put(rng.permutation(N)[: STEPS * BATCH].reshape(STEPS // K, K, BATCH).astype(np.int32))
    starts = jax.device_put((np.arange(STEPS) * BATCH).reshape(STEPS // K, K).astype(np.int32))
    p0 = _params()

    def epoch(dispatch, plan):
        def run():
            p = p0
            for d in range(STEPS // K):
                p, _ = dispatch(p, x, y, plan[d])
            return p

        return run

    builders = {
        "reads": lambda: {
            "gather": lambda: reads_gathered(x, order.reshape(STEPS, BATCH)),
            "slices": lambda: reads_sliced(x, starts.reshape(STEPS)),
        },
        "epoch": lambda: {"gather": epoch(dispatch_gathered, order), "slices": epoch(dispatch_sliced, starts)},
        "fit": lambda: _fit_epochs(x, y),
        "step": lambda: _step_epochs(x, y),
    }
    cases = {name: builders[name]() for name in CASES if name in args.cases}
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; {STEPS} steps of {BATCH} rows per epoch")
    for name, peers in cases.items():
        # fit and step time their own epochs (fit compiles in its first); the others are timed here
        timed = (lambda fn: fn()) if name in ("fit", "step") else _timed
        for fn in peers.values():
            timed(fn)  # compile and warm up
        times = {peer: [] for peer in peers}
        for r in range(args.rounds):
            for peer in list(peers) if r % 2 == 0 else list(peers)[::-1]:
                times[peer].append(timed(peers[peer]))
        medians = ", ".join(f"{peer} {statistics.median(t) * 1e3:.1f} ms" for peer, t in times.items())
        pairs = {"fit": [("gather", "slices"), ("slices", "scan")], "step": [("train_step", "scan")]}
        pairs = pairs.get(name, [("gather", "slices")])
        words = []
        for a, b in pairs:
            ratios = [x / y for x, y in zip(times[a], times[b])]
            words.append(
                f"{a} / {b} per round {' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.2f}"
            )
        print(f"{name}: {medians}; " + "; ".join(words))


if __name__ == "__main__":
    main()
