"""make_train_step(ema_start=...): where the params' moving average starts. "init" averages from
the initial params (tf.train.ExponentialMovingAverage, timm's ModelEmaV2), "zeros_debiased" is
optax.ema(decay, debias=True); the default, "first_update" (torch's AveragedModel), is unchanged
bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet.errors import ArgumentError
from funcnet.layers import Dense, Relu
from funcnet.train import Aux, TrainState, make_train_step
from funcnet.loop import FitOptions

NET = funcnet.serial(Dense(5), Relu, Dense(2))
DECAY = 0.5  # far from 1, so that where the average starts shows after 3 steps


def _loss(params, state, batch, rng):
    out, state = NET.apply(params, state, batch[0])
    return jnp.mean((out - batch[1]) ** 2), Aux(state=state)


def _run(steps=3, **options):
    """The EMA after ``steps`` steps, and the params before the first and after each."""
    ts = TrainState.create(NET, optax.sgd(0.3), jax.random.key(0), (-1, 3), ema=True)
    step = jax.jit(make_train_step(_loss, optax.sgd(0.3), ema_decay=DECAY, **options))
    seen = [ts.params]
    r = np.random.default_rng(0)
    for _ in range(steps):
        ts, _ = step(ts, (r.normal(size=(8, 3)).astype(np.float32), r.normal(size=(8, 2)).astype(np.float32)))
        seen.append(ts.params)
    return ts.ema, seen


def _close(got, want, tol=1e-6):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_ema_start_init_averages_from_the_initial_params():
    ema, seen = _run(ema_start="init")
    want = jax.tree.map(lambda p: np.asarray(p, np.float64), seen[0])  # by hand, in float64
    for p in seen[1:]:
        want = jax.tree.map(lambda e, q: e + (1 - DECAY) * (np.asarray(q, np.float64) - e), want, p)
    _close(ema.params, want)
    assert int(ema.count) == 3
    # the initial params weigh DECAY ** 3 = 1/8: not torch's first-update copy
    torch_like, _ = _run()
    W = lambda e: np.asarray(e.params[0]["W"])  # noqa: E731
    assert np.abs(W(ema) - W(torch_like)).max() > 1e-3


def test_ema_start_zeros_debiased_is_optaxs_debiased_ema():
    ema, seen = _run(ema_start="zeros_debiased")
    reference = optax.ema(DECAY, debias=True)
    state = reference.init(seen[0])
    for p in seen[1:]:
        want, state = reference.update(p, state)
    _close(ema.params, want)
    assert int(ema.count) == 3
    one, one_seen = _run(steps=1, ema_start="zeros_debiased")  # the first update copies
    _close(one.params, one_seen[1], 0.0)


def _torch_first_update(average, params, decay):
    """funcnet's EMA update before ema_start, verbatim: the default must stay this."""
    first = average.count == 0
    new = jax.tree.map(
        lambda e, p: jnp.where(first, p, e + (1.0 - decay) * (p - e)).astype(e.dtype), average.params, params
    )
    return type(average)(new, average.count + 1)


def test_default_ema_start_is_the_first_update_copy_bit_for_bit():
    default, seen = _run()
    explicit, _ = _run(ema_start="first_update")
    ts = TrainState.create(NET, optax.sgd(0.3), jax.random.key(0), (-1, 3), ema=True)
    old, update = ts.ema, jax.jit(_torch_first_update, static_argnums=2)
    for p in seen[1:]:
        old = update(old, p, DECAY)
    for a, b, c in zip(jax.tree.leaves(default), jax.tree.leaves(explicit), jax.tree.leaves(old)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_ema_start_is_checked():
    with pytest.raises(
        ArgumentError,
        match=r"ema_start must be one of 'first_update', 'init', "
        r"'zeros_debiased', got 'zeros'",
    ):
        make_train_step(_loss, optax.sgd(0.1), ema_decay=0.9, ema_start="zeros")
    with pytest.raises(ArgumentError, match=r"ema_start='init' is given without ema_decay"):
        make_train_step(_loss, optax.sgd(0.1), ema_start="init")


def test_fit_passes_ema_start_to_its_step():
    ts = TrainState.create(NET, optax.sgd(0.3), jax.random.key(0), (-1, 3), ema=True)
    r = np.random.default_rng(0)
    batches = [(r.normal(size=(8, 3)).astype(np.float32), r.normal(size=(8, 2)).astype(np.float32)) for _ in range(3)]
    fitted, _ = funcnet.fit(
        ts,
        _loss,
        optax.sgd(0.3),
        batches,
        progress=False,
        options=FitOptions(step_options={"ema_decay": DECAY, "ema_start": "init"}),
    )
    step = jax.jit(make_train_step(_loss, optax.sgd(0.3), ema_decay=DECAY, ema_start="init"))
    for b in batches:
        ts, _ = step(ts, b)
    _close(fitted.ema.params, ts.ema.params, tol=0)
