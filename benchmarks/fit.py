"""Workload 6: ``funcnet.fit`` end to end against bare step loops, on workload 1's MLP
(compute-bound) and workload 2's (dispatch-bound).

Peers, all on the same weights and the same 60000 synthetic MNIST-shaped examples:

* ``fit``: ``funcnet.fit`` with everything it does for a user: shuffling and
  batching from host numpy arrays (``funcnet.data.batches``), the host-to-device copy,
  the jitted ``make_train_step`` step, per-epoch metric collection, and a tqdm progress
  bar (forced on, written to a null stream). By default fit reads each dispatch's 50
  batches at once (``Batches.stacked``: one gather, one copy) and runs them as 50 steps
  on the device while it gathers the next 50; ``fit-k1`` is one batch per dispatch.
* ``fit-device`` / ``fit-device-k1``: ``funcnet.fit`` over a ``funcnet.data.DeviceData``:
  the 60000 examples put on the device once, each shuffled batch gathered inside the
  jitted step (same seed, same batches as ``fit``), with fit's default
  ``steps_per_dispatch`` (``log_every`` = 50 steps per dispatch, a loop on the device)
  or one step per dispatch; progress bar and metrics as in ``fit``.
* ``fit-device-quiet``: ``fit-device`` with ``progress=False``: no bar, so no loss read
  between dispatches; ``fit-device`` ÷ this is what the bar costs.
* ``fit-thread``: ``fit`` as above with ``prefetch=2``: each dispatch's batches
  assembled by a background thread (``funcnet.data.background``; not fit's default on
  CPU).
* ``train-step``: a Python loop over ``jax.jit(make_train_step(...))`` on pre-built,
  already on-device batches: funcnet's step without the loop around it.
* ``jax``: the same step written by hand with jax + optax (workload 1's ``jax`` peer) on
  the same pre-built batches.
* ``jax-scan``: the hand-written step as an expert runs an epoch when the data fits on
  the device: one jitted ``lax.scan`` over the epoch's batches, pre-shuffled (epoch 0's
  order, as ``fit``'s first epoch) and stacked on the device as ``(steps, batch, ...)``;
  one dispatch per epoch, the per-step losses returned. ``fit-device / jax-scan`` is fit's
  price against the fastest loop one can write by hand. It reuses one order every epoch,
  so it does less work than ``fit``, which visits a new order each epoch.
* ``fit-device-fixed``: ``fit-device`` over the data in ``jax-scan``'s order, without
  reshuffling: the rows put on the device already in epoch 0's order and
  ``DeviceData(shuffle=False)``, so every epoch reads the same contiguous batches as
  ``jax-scan`` does. ``fit-device-fixed / jax-scan`` is fit's loop against one
  ``lax.scan`` on the same work; ``fit-device / fit-device-fixed`` is the price of a new
  order each epoch (random rows gathered from the whole data set, not one block).
* ``jax-scan-shuffle``: ``jax-scan`` that shuffles as ``fit`` does: each epoch's order
  (``data.epoch_order(n, 0, epoch)``, computed on the host as ``DeviceData``'s) is sent to
  the device, and one jitted ``lax.scan`` over the order's batches of indices gathers each
  step's rows from the device-resident data (``x[idx]`` in the scanned step): the same
  batches as ``fit-device``, as an expert would write it. (Until 2026-12-03 it gathered the
  whole epoch's rows in one gather before the scan, a slower program on XLA:CPU; runs AA
  and AB in BENCHMARKS.md used that form; runs AC and AD the one here.)
  ``jax-scan-shuffle-unsplit``: the same compiled with ``funcnet.xla.unsplit_fusions()``,
  one of the two programs fit's race chooses between. ``fit-device`` ÷ the faster of the
  two is fit against the fastest hand loop that does fit's work.
* ``step-scan-shuffle`` / ``step-scan-shuffle-unsplit``: ``jax-scan-shuffle`` (and its
  unsplit compilation) with funcnet's step in place of the hand-written one: the
  ``make_train_step`` of fit's ``loss_fn`` (``funcnet.losses.cross_entropy``, torch's
  semantics: ``ignore_index`` and out-of-range labels checked) on the ``TrainState``, whose
  step count it advances each step (until 2026-12-04 its key too: runs AE and AF). The
  same steps on the same batches as ``fit-device``, in one ``lax.scan`` an epoch: ``fit-device`` ÷ these is the price of
  fit's loop alone, and these ÷ ``jax-scan-shuffle`` that of funcnet's step against the
  hand-written one (optax's cross-entropy, no step count or key carried).
* ``pipeline``: no training, only fit's data work for an epoch: ``funcnet.data.batches``
  shuffling and gathering the host arrays, and ``jax.device_put`` of every batch.

The bare loops donate the train state's buffers to the step, as ``fit`` does (on CPU,
not donating costs fresh allocations and page faults every step, which would flatter
``fit``). ``fit-device / jax`` is fit on device-resident data against the hand-written
loop (target <= 0.95); ``fit / jax`` is the host pipeline's price; ``train-step / jax``
is the price of the TrainState step alone.

Every peer is JAX: on a GPU (``benchmarks.run --platform gpu``) the same code runs there,
data and state on the default device; each epoch's time ends on a ``block_until_ready``
of the params, so it holds the device's work, not only its dispatch.
"""

from __future__ import annotations

import contextlib
import functools
import io
import time

from benchmarks import common


def _model(weights):
    import jax.numpy as jnp
    from funcnet.combinators import serial
    from funcnet.layers.activations import Relu
    from funcnet.layers.dense import Dense

    layers = []
    for i, (W, _) in enumerate(weights):
        layers += [Dense(W.shape[1])] + ([Relu] if i < len(weights) - 1 else [])
    net = serial(*layers)
    params = []
    it = iter(weights)
    for layer in layers:
        if layer is Relu:
            params.append(())
        else:
            W, b = next(it)
            params.append({"W": jnp.asarray(W), "b": jnp.asarray(b)})
    return net, tuple(params)


def _timed(one_epoch, reps):
    """A bare loop's row: the first epoch (with the compilation) apart, then ``reps`` epochs."""
    t0 = time.perf_counter()
    one_epoch()
    first = time.perf_counter() - t0
    return {"values": common.measure(one_epoch, reps), "extra": {"first_epoch_s": first}}


def _fit_data(peer, x, y, batch):
    """What the ``fit*`` peer ``peer`` trains on: the host pipeline (``data.batches``, as a
    function of the epoch), or a ``DeviceData``, reshuffled each epoch or (``fit-device-fixed``)
    already in epoch 0's order and never reshuffled, as ``jax-scan``'s batches."""
    from funcnet import data

    if not peer.startswith("fit-device"):
        return lambda e: data.batches((x, y), batch, shuffle=True, rng=0, epoch=e)
    if peer == "fit-device-fixed":
        first = data.epoch_order(len(x), 0, 0)
        return data.DeviceData((x[first], y[first]), batch, shuffle=False)
    return data.DeviceData((x, y), batch, shuffle=True, rng=0)


def _run_fit(peer, cfg, ts, loss_fn, tx, x, y, batch, reps):
    """The ``fit*`` peers: one ``funcnet.fit`` call of 1 + reps epochs, timed by a callback."""
    import importlib.util

    from funcnet import fit
    from funcnet.loop import FitOptions

    # a machine without tqdm times fit without the bar, and the row says so
    bar = common.draws_bar(peer)

    clock, sink = common.epoch_clock(), io.StringIO()
    # One fit call of 1 + reps epochs: fit compiles its step once per call, as a
    # user's run does; the first epoch (with the compilation) is reported apart.
    # fit's default on CPU is no background thread; fit-thread (host pipeline) takes one
    prefetch = 2 if peer == "fit-thread" else None
    per_dispatch = int(peer.rpartition("-k")[2]) if "-k" in peer else None
    train_data = _fit_data(peer, x, y, batch)
    with contextlib.redirect_stderr(sink):  # fit's tqdm writes to stderr
        options = FitOptions(log_every=10 if cfg["quick"] else 50, steps_per_dispatch=per_dispatch, prefetch=prefetch)
        fit(ts, loss_fn, tx, train_data, epochs=1 + reps, progress=bar, callbacks=[clock], options=options)
    assert not bar or "samples_s=" in sink.getvalue(), "the progress bar was not drawn"
    epochs = clock.epochs
    extra = {"first_epoch_s": epochs[0]}
    if importlib.util.find_spec("tqdm") is None:
        extra["progress_bar"] = "none: tqdm is not installed"
    return {"values": epochs[1:], "extra": extra}


def _pipeline_epoch(x, y, batch):
    """fit's data work alone: shuffle-gather the host arrays and hand each batch to the
    device, with no step. fit - train-step should be about this much."""
    import jax

    from funcnet import data

    def one_epoch(epoch=[0]):
        epoch[0] += 1
        last = None
        for b in data.batches((x, y), batch, shuffle=True, rng=0, epoch=epoch[0]):
            last = jax.device_put(b)
        common.block(last)

    return one_epoch


def _hand_update(tx):
    """The step written by hand with jax + optax (workload 1's ``jax`` peer):
    ``hand_update((params, opt_state), xb, yb) -> ((params, opt_state), loss)``."""
    import jax
    import optax

    def hand_loss(p, xb, yb):
        h = xb
        for W, b in [(q["W"], q["b"]) for q in p if q][:-1]:
            h = jax.nn.relu(h @ W + b)
        last = [q for q in p if q][-1]
        return optax.softmax_cross_entropy_with_integer_labels(h @ last["W"] + last["b"], yb).mean()

    def hand_update(carry, xb, yb):
        p, o = carry
        loss, g = jax.value_and_grad(hand_loss)(p, xb, yb)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), loss

    return hand_update


def _funcnet_update(loss_fn, tx):
    """fit's step as the scans call theirs: ``update(train_state, xb, yb) -> (train_state,
    loss)``, ``make_train_step(loss_fn, tx)`` on the batch ``(xb, yb)``."""
    from funcnet.train import make_train_step

    step = make_train_step(loss_fn, tx)

    def update(ts, xb, yb):
        ts, metrics = step(ts, (xb, yb))
        return ts, metrics["loss"]

    return update


def _scan_epoch(hand_update, carry, x, y, steps, batch, n, compiler_options=None):
    """``jax-scan``: one jitted lax.scan over epoch 0's order, pre-shuffled and stacked on the
    device; the same order every epoch (``jax-scan-unsplit``: compiled with
    ``compiler_options``)."""
    import jax
    import jax.numpy as jnp

    from funcnet import data

    order = data.epoch_order(n, 0, 0)
    xs = jnp.asarray(x[order].reshape(steps, batch, -1))
    ys = jnp.asarray(y[order].reshape(steps, batch))
    common.block((xs, ys))

    @functools.partial(jax.jit, donate_argnums=0, compiler_options=compiler_options)
    def scan_epoch(carry, xs, ys):
        return jax.lax.scan(lambda c, b: hand_update(c, *b), carry, (xs, ys))

    state = {"carry": carry}

    def one_epoch():
        c, losses_ = scan_epoch(state["carry"], xs, ys)
        common.block(c[0])
        state["carry"] = c
        return losses_

    return one_epoch


def _shuffled_scan_epoch(hand_update, carry, x, y, steps, batch, n, compiler_options=None):
    """``jax-scan-shuffle``: each epoch's order (fit's) sent to the device, and one jitted
    lax.scan over its batches of indices, each step gathering its rows from the
    device-resident data (``jax-scan-shuffle-unsplit``: compiled with ``compiler_options``;
    ``step-scan-shuffle``: ``hand_update`` is funcnet's step, ``carry`` a ``TrainState``)."""
    import jax
    import jax.numpy as jnp

    from funcnet import data

    x_dev, y_dev = jnp.asarray(x), jnp.asarray(y)
    common.block((x_dev, y_dev))

    @functools.partial(jax.jit, donate_argnums=0, compiler_options=compiler_options)
    def shuffled_epoch(carry, x_all, y_all, order):
        # one gather per step, not one for the epoch: on XLA:CPU a shuffled copy of the whole
        # data set costs more than the steps' reads of their rows
        return jax.lax.scan(lambda c, i: hand_update(c, x_all[i], y_all[i]), carry, order.reshape(steps, batch))

    state = {"carry": carry, "epoch": 0}

    def one_epoch():
        order = jnp.asarray(data.epoch_order(n, 0, state["epoch"]), jnp.int32)
        c, losses_ = shuffled_epoch(state["carry"], x_dev, y_dev, order)
        common.block(c[0])
        state["carry"], state["epoch"] = c, state["epoch"] + 1
        return losses_

    one_epoch.carry = lambda: state["carry"]  # for the tests: where the epochs have got to
    # for benchmarks.key_probe, before the first epoch (which donates the carry): the program
    one_epoch.compiled = lambda: shuffled_epoch.lower(state["carry"], x_dev, y_dev, jnp.zeros(n, jnp.int32)).compile()
    return one_epoch


def _loop_epoch(step, start, batches, params_of, spread=False):
    """A Python loop of ``step(carry, batch)`` (``step(carry, xb, yb)`` if ``spread``) over
    the pre-built device batches, the carry kept across epochs; each epoch ends on
    ``params_of(carry)`` being ready. Two loops, so no per-step call is added to either."""
    state = {"carry": start}

    def one_epoch():
        c = state["carry"]
        for b in batches:
            c, out = step(c, b)
        common.block(params_of(c))
        state["carry"] = c
        return out

    def one_epoch_spread():
        c = state["carry"]
        for xb, yb in batches:
            c, out = step(c, xb, yb)
        common.block(params_of(c))
        state["carry"] = c
        return out

    return one_epoch_spread if spread else one_epoch


def run(peer, cfg, case):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from funcnet import losses, xla
    from funcnet.train import Aux, TrainState, make_train_step

    weights = common.mlp_weights(case["sizes"], seed=0)
    net, params = _model(weights)
    tx = optax.adam(case["lr"]) if case["opt"] == "adam" else optax.sgd(case["lr"])
    batch = case["batch"]
    steps = common.steps_per_epoch(batch) if not cfg["quick"] else case["quick_steps"]
    n = steps * batch
    rng = np.random.default_rng(0)
    x = rng.random((n, case["sizes"][0]), dtype=np.float32)
    y = rng.integers(0, case["sizes"][-1], size=n, dtype=np.int32)

    def loss_fn(p, s, b, key):
        logits, s = net.apply(p, s, b[0], rng=key, train=True)
        return losses.cross_entropy(logits, b[1]), Aux(state=s)

    ts = TrainState(params, ((),) * len(params), tx.init(params), jnp.zeros((), jnp.int32), jax.random.key(0))
    reps = case["quick_reps"] if cfg["quick"] else case["reps"]

    if peer.startswith("fit"):
        return _run_fit(peer, cfg, ts, loss_fn, tx, x, y, batch, reps)
    if peer == "pipeline":
        return _timed(_pipeline_epoch(x, y, batch), reps)

    batches = [
        (jnp.asarray(x[i * batch : (i + 1) * batch]), jnp.asarray(y[i * batch : (i + 1) * batch])) for i in range(steps)
    ]
    common.block(batches)
    hand_update = _hand_update(tx)
    options = xla.unsplit_fusions() if peer.endswith("-unsplit") else None  # the scans' two programs
    if peer in ("jax-scan", "jax-scan-unsplit"):
        return _timed(_scan_epoch(hand_update, (params, tx.init(params)), x, y, steps, batch, n, options), reps)
    if peer in ("jax-scan-shuffle", "jax-scan-shuffle-unsplit"):
        one_epoch = _shuffled_scan_epoch(hand_update, (params, tx.init(params)), x, y, steps, batch, n, options)
        return _timed(one_epoch, reps)
    if peer in ("step-scan-shuffle", "step-scan-shuffle-unsplit"):
        one_epoch = _shuffled_scan_epoch(_funcnet_update(loss_fn, tx), ts, x, y, steps, batch, n, options)
        return _timed(one_epoch, reps)
    if peer == "train-step":
        step = jax.jit(make_train_step(loss_fn, tx), donate_argnums=0)
        return _timed(_loop_epoch(step, ts, batches, lambda t: t.params), reps)
    if peer == "jax":
        hand_step = jax.jit(hand_update, donate_argnums=0)
        one_epoch = _loop_epoch(hand_step, (params, tx.init(params)), batches, lambda c: c[0], spread=True)
        return _timed(one_epoch, reps)
    raise ValueError(peer)
