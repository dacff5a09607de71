"""benchmarks/fit.py (workload 6): every peer runs on a tiny MLP, and the hand-written scan
peers train as one another (the same epoch-0 order, the same losses; jax-scan-unsplit the
same bits), with fit-device-fixed on jax-scan's batches."""

import numpy as np
import pytest

from benchmarks import fit, workloads

# 20 steps: the quick runs log every 10, and the fit peers check that the bar showed a rate
CASE = dict(sizes=(8, 4, 3), batch=4, opt="sgd", lr=0.1, reps=1, quick_reps=2, quick_steps=20)
CFG = {"quick": True, "threads": 1}


@pytest.mark.parametrize("peer", [p.name for p in workloads.by_name()["fit"].peers])
def test_every_peer_times_its_epochs(peer):
    row = fit.run(peer, CFG, CASE)
    assert len(row["values"]) == CASE["quick_reps"] and all(v > 0 for v in row["values"]), row
    assert row["extra"]["first_epoch_s"] > 0


def _tiny_run(seed):
    """CASE's epoch: ``(steps, batch, n, x, y)``, random rows and labels from ``seed``."""
    steps, batch = CASE["quick_steps"], CASE["batch"]
    n = steps * batch
    rng = np.random.default_rng(seed)
    return steps, batch, n, rng.random((n, 8), dtype=np.float32), rng.integers(0, 3, size=n, dtype=np.int32)


def test_the_scan_peers_and_the_hand_loop_take_the_same_steps():
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import data, xla

    steps, batch, n, x, y = _tiny_run(0)
    _, params = fit._model(fit.common.mlp_weights(CASE["sizes"], seed=0))
    tx = optax.sgd(0.1)
    update = fit._hand_update(tx)
    start = lambda: (jax.tree.map(jnp.copy, params), tx.init(params))  # the scans donate it
    scan = np.asarray(fit._scan_epoch(update, start(), x, y, steps, batch, n)())
    unsplit = fit._scan_epoch(update, start(), x, y, steps, batch, n, xla.unsplit_fusions())()
    np.testing.assert_array_equal(unsplit, scan)  # jax-scan-unsplit: the same bits
    shuffled_epoch = fit._shuffled_scan_epoch(update, start(), x, y, steps, batch, n)
    shuffled, shuffled_1 = np.asarray(shuffled_epoch()), np.asarray(shuffled_epoch())
    unsplit_epoch = fit._shuffled_scan_epoch(update, start(), x, y, steps, batch, n, xla.unsplit_fusions())
    np.testing.assert_array_equal(unsplit_epoch(), shuffled)  # jax-scan-shuffle-unsplit: the same bits
    np.testing.assert_array_equal(unsplit_epoch(), shuffled_1)
    order = data.epoch_order(n, 0, 0)
    batches = [
        (jnp.asarray(x[order][i * batch : (i + 1) * batch]), jnp.asarray(y[order][i * batch : (i + 1) * batch]))
        for i in range(steps)
    ]
    losses = []

    def step(carry, xb, yb):  # the hand loop, its losses kept
        carry, loss = update(carry, xb, yb)
        losses.append(float(loss))
        return carry, loss

    last = fit._loop_epoch(step, start(), batches, lambda c: c[0], spread=True)()
    # fit-device-fixed reads jax-scan's batches, the same in every epoch
    fixed = fit._fit_data("fit-device-fixed", x, y, batch)
    for epoch in (0, 1):
        for (xb, yb), (want_x, want_y) in zip(fixed(epoch), batches, strict=True):
            np.testing.assert_array_equal(xb, want_x)
            np.testing.assert_array_equal(yb, want_y)
    # fit-device reads them in epoch 0 only: it reshuffles
    shuffled_data = fit._fit_data("fit-device", x, y, batch)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(shuffled_data(0), batches))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(shuffled_data(1), batches))
    assert scan.shape == (steps,) and len(set(np.round(scan, 6))) > 1  # it trains
    np.testing.assert_allclose(shuffled, scan, rtol=1e-6)
    # jax-scan-shuffle's second epoch reads fit's epoch-1 order, from where its first ended
    hand_step, carry, hand = jax.jit(update), start(), []
    for epoch in (0, 1):
        order_e = data.epoch_order(n, 0, epoch)
        for i in range(steps):
            rows = order_e[i * batch : (i + 1) * batch]
            carry, loss = hand_step(carry, jnp.asarray(x[rows]), jnp.asarray(y[rows]))
            hand.append(float(loss))
    np.testing.assert_allclose(np.concatenate([shuffled, shuffled_1]), hand, rtol=1e-5)
    assert not np.allclose(shuffled_1, hand[:steps])  # epoch 1 is not epoch 0 again
    np.testing.assert_allclose(losses, scan, rtol=1e-5)
    assert float(last) == losses[-1]


@pytest.mark.parametrize("peer", ["step-scan-shuffle", "step-scan-shuffle-unsplit"])
def test_step_scan_shuffle_takes_fits_steps(peer):
    """step-scan-shuffle is fit-device without fit's loop: after two epochs (the second on
    fit's epoch-1 order) its TrainState is the one fit's defaults (a loop on the device)
    return, step count and key included."""
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import fit as funcnet_fit
    from funcnet import losses, xla
    from funcnet.train import Aux, TrainState

    steps, batch, n, x, y = _tiny_run(1)
    net, params = fit._model(fit.common.mlp_weights(CASE["sizes"], seed=0))
    tx = optax.sgd(0.1)

    def loss_fn(p, s, b, key):
        logits, s = net.apply(p, s, b[0], rng=key, train=True)
        return losses.cross_entropy(logits, b[1]), Aux(state=s)

    def start():
        p = jax.tree.map(jnp.copy, params)
        return TrainState(p, ((),) * len(p), tx.init(p), jnp.zeros((), jnp.int32), jax.random.key(0))

    options = xla.unsplit_fusions() if peer.endswith("-unsplit") else None
    one_epoch = fit._shuffled_scan_epoch(fit._funcnet_update(loss_fn, tx), start(), x, y, steps, batch, n, options)
    first, second = np.asarray(one_epoch()), np.asarray(one_epoch())
    assert first.shape == (steps,) and not np.allclose(first, second)  # it trains, on another order
    fitted, _ = funcnet_fit(start(), loss_fn, tx, fit._fit_data("fit-device", x, y, batch), epochs=2, progress=False)
    scanned = one_epoch.carry()
    assert int(fitted.step) == int(scanned.step) == 2 * steps
    np.testing.assert_array_equal(jax.random.key_data(fitted.rng), jax.random.key_data(scanned.rng))
    for got, want in zip(jax.tree.leaves(scanned.params), jax.tree.leaves(fitted.params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
