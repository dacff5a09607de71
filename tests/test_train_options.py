"""The step's options: gradient clipping (torch's clip_grad_norm_), micro-batch
accumulation, an EMA of the params (torch's AveragedModel), optax's extra arguments
(reduce_on_plateau), and EarlyStopping(restore_best=True)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers.torch_ref import HAVE_TORCH, torch

import funcnet
from funcnet import callbacks, data, distributed, sharding
from funcnet.layers import BatchNorm, Dense, Relu
from funcnet.train import EMA, Aux, TrainState, make_eval_step, make_train_step
from funcnet.loop import FitOptions

if HAVE_TORCH:
    torch.set_default_dtype(torch.float32)


def _mlp():
    return funcnet.serial(Dense(16), Relu, Dense(4))


def _mse(net):
    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0], rng=rng, train=True)
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state)

    return loss_fn


def _batch(seed=0, n=16):
    r = np.random.default_rng(seed)
    return r.normal(size=(n, 8)).astype(np.float32), r.normal(size=(n, 4)).astype(np.float32)


def _torch_mlp(params):
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for i, j in ((0, 0), (2, 2)):
            m[i].weight.copy_(torch.tensor(np.asarray(params[j]["W"]).T))
            m[i].bias.copy_(torch.tensor(np.asarray(params[j]["b"])))
    return m


def _torch_params(m):
    return [(l.weight.detach().numpy().T, l.bias.detach().numpy()) for l in (m[0], m[2])]


def _close(got, want, tol):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- #
# clip_grad_norm
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("max_norm", [0.05, 100.0], ids=["clipping", "not-clipping"])
def test_clip_grad_norm_is_torchs_and_grad_norm_is_reported(max_norm):
    net = _mlp()
    ts = TrainState.create(net, optax.sgd(1.0), jax.random.key(0), (-1, 8))
    x, y = _batch()
    new, metrics = jax.jit(make_train_step(_mse(net), optax.sgd(1.0), clip_grad_norm=max_norm))(ts, (x, y))
    grads = jax.tree.map(lambda a, b: a - b, ts.params, new.params)  # lr 1: the update is -g

    m = _torch_mlp(ts.params)
    torch.nn.functional.mse_loss(m(torch.tensor(x)), torch.tensor(y)).backward()
    total = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
    want = [(l.weight.grad.numpy().T, l.bias.grad.numpy()) for l in (m[0], m[2])]
    got = [(grads[0]["W"], grads[0]["b"]), (grads[2]["W"], grads[2]["b"])]
    _close(got, want, 1e-6)
    np.testing.assert_allclose(float(metrics["grad_norm"]), float(total), rtol=1e-6)
    if max_norm < 1:
        assert float(optax.tree.norm(grads)) == pytest.approx(max_norm, rel=1e-4)


def test_grad_norm_is_reported_when_asked_or_clipping():
    """grad_norm=None (default) reports it only with clipping; True always (torch's total
    norm, as clip_grad_norm_ returns it); False never, while clipping still clips."""
    net = _mlp()
    ts = TrainState.create(net, optax.sgd(1.0), jax.random.key(0), (-1, 8))
    x, y = _batch()
    m = _torch_mlp(ts.params)
    torch.nn.functional.mse_loss(m(torch.tensor(x)), torch.tensor(y)).backward()
    total = float(torch.nn.utils.clip_grad_norm_(m.parameters(), float("inf")))

    def run(**options):
        return jax.jit(make_train_step(_mse(net), optax.sgd(1.0), **options))(ts, (x, y))

    assert set(run()[1]) == {"loss"}
    np.testing.assert_allclose(float(run(grad_norm=True)[1]["grad_norm"]), total, rtol=1e-6)
    np.testing.assert_allclose(float(run(clip_grad_norm=0.05)[1]["grad_norm"]), total, rtol=1e-6)
    quiet, metrics = run(clip_grad_norm=0.05, grad_norm=False)
    assert set(metrics) == {"loss"}
    _close(quiet.params, run(clip_grad_norm=0.05)[0].params, 0.0)  # clipped all the same
    with pytest.raises(funcnet.errors.ArgumentError, match="grad_norm must be True or False"):
        make_train_step(_mse(net), optax.sgd(1.0), grad_norm=1)


def test_fit_checks_a_monitored_grad_norm_against_the_step_options():
    net = _mlp()
    ts = TrainState.create(net, optax.sgd(0.1), jax.random.key(0), (-1, 8))
    train = data.DeviceData(_batch(0, 32), 16)
    with pytest.raises(ValueError, match="monitor='grad_norm' is not a key fit will log"):
        funcnet.fit(
            ts,
            _mse(net),
            optax.sgd(0.1),
            train,
            progress=False,
            callbacks=[callbacks.EarlyStopping("grad_norm", mode="min")],
        )
    _, history = funcnet.fit(
        ts,
        _mse(net),
        optax.sgd(0.1),
        train,
        progress=False,
        callbacks=[callbacks.EarlyStopping("grad_norm", mode="min")],
        options=FitOptions(step_options={"grad_norm": True}),
    )
    assert history[0]["grad_norm"] > 0


def test_clip_grad_norm_and_ema_decay_refuse_bad_values():
    with pytest.raises(ValueError, match="clip_grad_norm=0.0 must be > 0"):
        make_train_step(_mse(_mlp()), optax.sgd(0.1), clip_grad_norm=0.0)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"ema_decay=.* must be in \(0, 1\)"):
            make_train_step(_mse(_mlp()), optax.sgd(0.1), ema_decay=bad)


# --------------------------------------------------------------------------- #
# microbatches
# --------------------------------------------------------------------------- #


def test_microbatches_equal_the_full_batch_step():
    net = _mlp()
    opt = optax.adam(1e-2)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))
    full_step = jax.jit(make_train_step(_mse(net), opt, clip_grad_norm=0.5))
    micro_step = jax.jit(make_train_step(_mse(net), opt, clip_grad_norm=0.5, microbatches=4))
    a, b = ts, ts
    for i in range(3):
        a, ma = full_step(a, _batch(i))
        b, mb = micro_step(b, _batch(i))
    _close(b.params, a.params, 1e-6)
    _close(mb, ma, 1e-6)
    assert int(b.step) == 3  # one global step per batch


@pytest.mark.parametrize("layout", ["replicated", "fsdp"])
def test_microbatches_on_a_mesh_equal_one_device(layout):
    net = _mlp()
    opt = optax.sgd(0.1, momentum=0.9)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))
    batch = _batch()
    want, _ = jax.jit(make_train_step(_mse(net), opt))(ts, batch)
    mesh = distributed.data_mesh()
    placed = (
        distributed.replicate_on(mesh, ts)
        if layout == "replicated"
        else sharding.shard_params(ts, mesh, sharding.fsdp_rules(min_size=0))
    )
    with jax.set_mesh(mesh):
        got, _ = jax.jit(make_train_step(_mse(net), opt, microbatches=2))(placed, distributed.shard_batch(mesh, batch))
    _close(got.params, want.params, 1e-6)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(placed.params)):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_microbatches_thread_batchnorm_state_and_return_outputs_in_row_order():
    net = funcnet.serial(Dense(8), BatchNorm(), Relu, Dense(4))
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))
    x, y = _batch()

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0], train=True)
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state, outputs={"out": out})

    new, _, outputs = jax.jit(make_train_step(loss_fn, opt, microbatches=2))(ts, (x, y))
    # micro-batch i holds rows i, i + 2, ...: the state after both, in order
    state = ts.state
    want_out = np.zeros((16, 4), np.float32)
    for i in range(2):
        out, state = net.apply(ts.params, state, x[i::2], train=True)
        want_out[i::2] = np.asarray(out)
    _close(new.state, state, 1e-6)
    np.testing.assert_allclose(np.asarray(outputs["out"]), want_out, rtol=1e-6, atol=1e-6)


def test_microbatches_that_do_not_divide_the_batch_are_named():
    net = _mlp()
    ts = TrainState.create(net, optax.sgd(0.1), jax.random.key(0), (-1, 8))
    step = make_train_step(_mse(net), optax.sgd(0.1), microbatches=3)
    with pytest.raises(ValueError, match="microbatches=3 must divide the batch's leading size, got 16"):
        step(ts, _batch())


# --------------------------------------------------------------------------- #
# EMA
# --------------------------------------------------------------------------- #


def test_ema_follows_torchs_averaged_model_over_50_steps():
    net = _mlp()
    decay = 0.9
    ts = TrainState.create(net, optax.sgd(0.05), jax.random.key(0), (-1, 8), ema=True)
    assert isinstance(ts.ema, EMA) and int(ts.ema.count) == 0
    step = jax.jit(make_train_step(_mse(net), optax.sgd(0.05), ema_decay=decay))

    m = _torch_mlp(ts.params)
    ema = torch.optim.swa_utils.AveragedModel(m, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(decay))
    sgd = torch.optim.SGD(m.parameters(), lr=0.05)
    for i in range(50):
        x, y = _batch(i)
        ts, _ = step(ts, (x, y))
        sgd.zero_grad()
        torch.nn.functional.mse_loss(m(torch.tensor(x)), torch.tensor(y)).backward()
        sgd.step()
        ema.update_parameters(m)
    want = _torch_params(ema.module)
    got = [(ts.ema.params[j]["W"], ts.ema.params[j]["b"]) for j in (0, 2)]
    _close(got, want, 1e-6)
    assert int(ts.ema.count) == 50
    # evaluation on the average, by a flag
    x, _ = _batch(99)
    metric = lambda params, state, b: net.apply(params, state, b[0])[0]  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(make_eval_step(metric, ema=True)(ts, (x,))),
        ema(torch.tensor(x)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_ema_needs_a_state_created_with_it():
    net = _mlp()
    ts = TrainState.create(net, optax.sgd(0.1), jax.random.key(0), (-1, 8))
    with pytest.raises(ValueError, match=r"ema=True"):
        make_train_step(_mse(net), optax.sgd(0.1), ema_decay=0.99)(ts, _batch())
    with pytest.raises(ValueError, match=r"keeps no EMA"):
        make_eval_step(lambda p, s, b: 0.0, ema=True)(ts, _batch())


# --------------------------------------------------------------------------- #
# optax extra args, fit options, restore_best
# --------------------------------------------------------------------------- #


def test_reduce_on_plateau_lowers_the_learning_rate_inside_fit():
    net = _mlp()
    opt = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(patience=2, factor=0.5))
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))

    def flat(params, state, batch, rng):  # a loss that never improves: a plateau
        return 0.0 * jnp.sum(params[0]["W"]) + 1.0, Aux(state=state)

    out, _ = funcnet.fit(ts, flat, opt, data.DeviceData(_batch(0, 64), 16), epochs=3)
    assert float(out.opt_state[1].scale) < 1.0  # it saw value= and cut the rate


def test_fit_passes_step_options_to_the_step():
    net = _mlp()
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8), ema=True)
    train = data.DeviceData(_batch(0, 64), 16)
    plain, h1 = funcnet.fit(ts, _mse(net), opt, train, epochs=2, options=FitOptions(step_options={"ema_decay": 0.5}))
    micro, h2 = funcnet.fit(
        ts, _mse(net), opt, train, epochs=2, options=FitOptions(step_options={"ema_decay": 0.5, "microbatches": 4})
    )
    _close(micro.params, plain.params, 1e-6)
    _close(micro.ema.params, plain.ema.params, 1e-6)
    assert "grad_norm" not in h1[0]  # not asked for, no clipping
    _, h3 = funcnet.fit(
        ts, _mse(net), opt, train, epochs=1, options=FitOptions(step_options={"ema_decay": 0.5, "grad_norm": True})
    )
    assert h3[0]["grad_norm"] > 0
    with pytest.raises(ValueError, match=r"unknown: \['clip'\]"):
        funcnet.fit(ts, _mse(net), opt, train, options=FitOptions(step_options={"clip": 1.0}))


def test_fit_eval_on_ema_logs_the_ema_params_metrics():
    net = _mlp()
    opt = optax.sgd(0.1)
    mse = funcnet.metrics.MSE()
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8), ema=True)
    x, y = _batch(1, 32)

    def eval_fn(params, state, batch):
        return mse.update(mse.init(), net.apply(params, state, batch[0])[0], batch[1])

    def eval_of(params):  # by hand, on the whole eval set at once
        return float(mse.compute(eval_fn(params, out.state, (x, y))))

    out, history = funcnet.fit(
        ts,
        _mse(net),
        opt,
        data.DeviceData(_batch(0, 64), 16),
        epochs=1,
        eval_data=lambda e: data.batches((x, y), 16),
        eval_fn=eval_fn,
        metric=mse,
        options=FitOptions(eval_on_ema=True, step_options={"ema_decay": 0.9}),
    )
    assert int(out.ema.count) == 4
    want, raw = eval_of(out.ema.params), eval_of(out.params)
    assert history[0]["eval_metric"] == pytest.approx(want, rel=1e-5)
    assert abs(raw - want) > 1e-3 * abs(want)  # the raw params would log another value
    _, plain = funcnet.fit(
        ts,
        _mse(net),
        opt,
        data.DeviceData(_batch(0, 64), 16),
        epochs=1,
        eval_data=lambda e: data.batches((x, y), 16),
        eval_fn=eval_fn,
        metric=mse,
        options=FitOptions(step_options={"ema_decay": 0.9}),
    )
    assert plain[0]["eval_metric"] == pytest.approx(raw, rel=1e-5)


def test_early_stopping_restores_the_best_epochs_state():
    net = _mlp()
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))
    scores = [3.0, 1.0, 2.0, 4.0, 5.0]
    seen = []

    class Score(callbacks.Callback):
        log_keys = ("score",)

        def on_epoch_end(self, ctx, epoch, logs):
            logs["score"] = scores[epoch]
            seen.append(jax.tree.map(np.asarray, ctx.train_state.params))

    stop = callbacks.EarlyStopping("score", patience=2, restore_best=True)
    out, history = funcnet.fit(
        ts, _mse(net), opt, data.DeviceData(_batch(0, 64), 16), epochs=5, callbacks=[Score(), stop]
    )
    assert len(history) == 4 and stop.best_epoch == 1
    _close(out.params, seen[1], 0)
    assert int(out.step) == 8  # epoch 1's state: 2 epochs of 4 steps
