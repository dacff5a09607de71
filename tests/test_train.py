"""The pure train step, the fit loop, callbacks and bit-identical resumption."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import data, losses, metrics, train
from funcnet.layers import BatchNorm, Dense, Dropout, Relu
from funcnet.train import Aux, TrainState, fit, make_eval_step, make_train_step

KEY = jax.random.key(0)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(256, 8)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32) + 2 * (X[:, 2] > 0).astype(np.int32)


def mlp(dropout=0.0):
    layers = [Dense(16), Relu] + ([Dropout(dropout)] if dropout else []) + [Dense(4)]
    return funcnet.serial(*layers)


def make_loss(net):
    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, state = net.apply(params, state, x, rng=rng, train=True)
        return losses.cross_entropy(logits, y), Aux(state=state, metrics={"acc": jnp.mean(
            jnp.argmax(logits, -1) == y)})
    return loss_fn


def test_step_equals_the_same_step_written_by_hand():
    net = mlp()
    opt = optax.adam(1e-2)
    ts = TrainState.create(net, opt, KEY, (-1, 8))
    step = jax.jit(make_train_step(make_loss(net), opt))

    params, opt_state = ts.params, ts.opt_state

    @jax.jit
    def hand(params, opt_state, x, y):
        def f(p):
            logits, _ = net.apply(p, ts.state, x, train=True)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))
        loss, g = jax.value_and_grad(f)(params)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, loss

    for i in range(5):
        batch = (X[32 * i:32 * i + 32], Y[32 * i:32 * i + 32])
        ts, m = step(ts, batch)
        params, opt_state, loss = hand(params, opt_state, *batch)
        np.testing.assert_allclose(m["loss"], loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ts.params, params)
    assert int(ts.step) == 5 and set(m) == {"loss", "acc"}


def test_step_advances_rng_and_dropout_sees_fresh_keys():
    net = mlp(dropout=0.5)
    opt = optax.sgd(0.0)  # params frozen: only the rng changes the loss
    ts = TrainState.create(net, opt, KEY, (-1, 8))
    step = jax.jit(make_train_step(make_loss(net), opt))
    batch = (X[:32], Y[:32])
    ts1, m1 = step(ts, batch)
    ts2, m2 = step(ts1, batch)
    assert not np.array_equal(jax.random.key_data(ts1.rng), jax.random.key_data(ts2.rng))
    assert float(m1["loss"]) != float(m2["loss"])
    _, m1_again = step(ts, batch)
    assert float(m1_again["loss"]) == float(m1["loss"])  # pure: same input, same output


def test_loss_state_is_threaded_for_center_loss():
    net = Dense(2)
    opt = optax.sgd(0.1)
    centers = losses.center_loss_init(4, 2)
    ts = TrainState.create(net, opt, KEY, (-1, 8), loss_state=centers)

    def loss_fn(params, state, batch, rng, loss_state):
        x, y = batch
        feats, state = net.apply(params, state, x)
        closs, new_centers = losses.center_loss(loss_state, feats, y, alpha=0.5)
        return closs, Aux(state=state, loss_state=new_centers)

    step = jax.jit(make_train_step(loss_fn, opt))
    batch = (X[:64], Y[:64])
    feats, _ = net.apply(ts.params, ts.state, batch[0])
    _, want = losses.center_loss(centers, feats, batch[1], alpha=0.5)
    ts2, _ = step(ts, batch)
    np.testing.assert_allclose(ts2.loss_state, want, rtol=1e-6)
    assert not np.allclose(ts2.loss_state, 0)


def test_loss_fn_must_return_aux():
    net = Dense(4)
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, KEY, (-1, 8))
    bad = make_train_step(lambda p, s, b, r: (jnp.sum(net.apply(p, s, b[0])[0]), s), opt)
    with pytest.raises(TypeError, match="Aux"):
        bad(ts, (X[:4], Y[:4]))


def _global_vs_pmap(net, loss_fn_factory, n_steps=4, lr=0.05):
    n = jax.device_count()
    opt = optax.sgd(lr, momentum=0.9)
    ts = TrainState.create(net(None), opt, KEY, (-1, 8))
    single = jax.jit(make_train_step(loss_fn_factory(net(None)), opt))
    multi = jax.pmap(make_train_step(loss_fn_factory(net("batch")), opt, axis_name="batch"),
                     axis_name="batch")
    ts_s, ts_m = ts, funcnet.parallel.replicate(ts)
    for i in range(n_steps):
        batch = (X[64 * i:64 * i + 64], Y[64 * i:64 * i + 64])
        ts_s, m_s = single(ts_s, batch)
        ts_m, m_m = multi(ts_m, funcnet.parallel.shard(batch, n))
        np.testing.assert_allclose(m_m["loss"], np.full(n, m_s["loss"]), rtol=1e-5)
    for leaf in jax.tree.leaves((ts_m.params, ts_m.state)):  # replicas identical
        np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[0], b, rtol=1e-5, atol=1e-6),
                 (ts_m.params, ts_m.state), (ts_s.params, ts_s.state))
    return ts_s, ts_m


def test_pmap_step_with_synced_batchnorm_equals_global_batch():
    assert jax.device_count() == 4
    net = lambda axis: funcnet.serial(Dense(16), BatchNorm(axis_name=axis), Relu, Dense(4))
    ts_s, _ = _global_vs_pmap(net, make_loss)
    assert not np.allclose(ts_s.state[1]["mean"], 0)  # the running stats did move


def test_pmap_step_with_synced_center_loss_equals_global_batch():
    def net(axis):
        return Dense(2)

    def run(axis):
        opt = optax.sgd(0.05)
        ts = TrainState.create(Dense(2), opt, KEY, (-1, 8), loss_state=losses.center_loss_init(4, 2))

        def loss_fn(params, state, batch, rng, loss_state):
            x, y = batch
            f, state = Dense(2).apply(params, state, x)
            closs, c = losses.center_loss(loss_state, f, y, alpha=0.5, axis_name=axis)
            return closs, Aux(state=state, loss_state=c)
        return ts, make_train_step(loss_fn, opt, axis_name=axis)

    ts, step_s = run(None)
    _, step_m = run("batch")
    step_s, step_m = jax.jit(step_s), jax.pmap(step_m, axis_name="batch")
    ts_s, ts_m = ts, funcnet.parallel.replicate(ts)
    for i in range(4):
        batch = (X[64 * i:64 * i + 64], Y[64 * i:64 * i + 64])
        ts_s, _ = step_s(ts_s, batch)
        ts_m, _ = step_m(ts_m, funcnet.parallel.shard(batch, 4))
    np.testing.assert_allclose(ts_m.loss_state, np.broadcast_to(ts_s.loss_state, ts_m.loss_state.shape),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ts_m.params["W"][0], ts_s.params["W"], rtol=1e-5, atol=1e-6)


def test_eval_step_sums_metric_states_across_devices():
    net = mlp()
    ts = TrainState.create(net, optax.sgd(0.1), KEY, (-1, 8))
    acc = metrics.Accuracy()

    def metric_fn(params, state, batch):
        logits, _ = net.apply(params, state, batch[0])
        return acc.update(acc.init(), logits, batch[1])

    single = jax.jit(make_eval_step(metric_fn))(ts, (X, Y))
    multi = jax.pmap(make_eval_step(metric_fn, axis_name="b"), axis_name="b")(
        funcnet.parallel.replicate(ts), funcnet.parallel.shard((X, Y), 4))
    jax.tree.map(lambda m, s: np.testing.assert_allclose(m[0], s), multi, single)
    logits, _ = net.apply(ts.params, ts.state, X)
    assert float(acc.compute(single)) == pytest.approx(float(np.mean(np.argmax(logits, -1) == Y)))


# --------------------------------------------------------------------------- #
# fit
# --------------------------------------------------------------------------- #

def _fit_setup(dropout=0.2):
    net = mlp(dropout)
    opt = optax.adam(1e-2)
    ts = TrainState.create(net, opt, KEY, (-1, 8))
    acc = metrics.collection(acc=metrics.Accuracy(), loss=metrics.Mean())

    def eval_fn(params, state, batch):
        logits, _ = net.apply(params, state, batch[0])
        return acc.update(acc.init(), acc=(logits, batch[1]),
                          loss=losses.cross_entropy(logits, batch[1], reduction="none"))

    train_data = lambda epoch: data.batches((X, Y), 32, shuffle=True, rng=7, epoch=epoch)
    eval_data = lambda epoch: data.batches((X, Y), 64)
    kw = dict(eval_data=eval_data, eval_fn=eval_fn, metric=acc, progress=False)
    return ts, make_loss(net), opt, train_data, kw


def test_fit_trains_logs_and_evaluates(tmp_path):
    ts, loss_fn, opt, train_data, kw = _fit_setup()
    sched = optax.exponential_decay(1e-2, 8, 0.5)
    cbs = [train.LearningRateLogger(sched), train.CSVLogger(tmp_path / "h.csv"),
           train.JSONLLogger(tmp_path / "h.jsonl")]
    lines = []
    ts2, history = fit(ts, loss_fn, opt, train_data, epochs=3, callbacks=cbs, print_fn=lines.append, **kw)
    assert [h["epoch"] for h in history] == [0, 1, 2] and len(lines) == 3
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["eval_acc"] > 0.6
    assert int(ts2.step) == 3 * (256 // 32)
    assert history[0]["lr"] == pytest.approx(float(sched(8)))
    rows = (tmp_path / "h.csv").read_text().strip().splitlines()
    assert len(rows) == 4 and rows[0].startswith("epoch,loss,acc")
    js = [json.loads(l) for l in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert [j["epoch"] for j in js] == [0, 1, 2]
    # The logged eval loss is the real mean loss over the eval set.
    logits, _ = mlp(0.2).apply(ts2.params, ts2.state, X)
    assert js[-1]["eval_loss"] == pytest.approx(float(losses.cross_entropy(logits, Y)), rel=1e-5)


def test_early_stopping_stops():
    ts, loss_fn, opt, train_data, kw = _fit_setup()
    stop = train.EarlyStopping("eval_acc", patience=1, mode="max", min_delta=10.0)
    _, history = fit(ts, loss_fn, opt, train_data, epochs=10, callbacks=[stop], **kw)
    assert len(history) == 2


def _params_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("every", ["epoch", "steps"])
def test_resume_is_bit_identical(tmp_path, every):
    ts, loss_fn, opt, train_data, kw = _fit_setup(dropout=0.3)
    full, _ = fit(ts, loss_fn, opt, train_data, epochs=3, **kw)

    class Crash(Exception):
        pass

    class CrashAt(train.Callback):
        def on_step_end(self, ctx, step):
            if step == 13:  # mid-epoch 1
                raise Crash

    saver = (train.Checkpoint(tmp_path, every_epochs=1) if every == "epoch"
             else train.Checkpoint(tmp_path, every_steps=5, every_epochs=None))
    with pytest.raises(Crash):
        fit(ts, loss_fn, opt, train_data, epochs=3, callbacks=[saver, CrashAt()], **kw)
    resumed, history = fit(ts, loss_fn, opt, train_data, epochs=3, resume_from=tmp_path, **kw)
    assert int(resumed.step) == int(full.step)
    _params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
    np.testing.assert_array_equal(jax.random.key_data(resumed.rng), jax.random.key_data(full.rng))
    assert history[0]["epoch"] == 1


def test_fit_on_four_devices_matches_one(tmp_path):
    ts, loss_fn, opt, train_data, kw = _fit_setup(dropout=0.0)
    one, h1 = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    four, h4 = fit(ts, loss_fn, opt, train_data, epochs=2, devices=4, **kw)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), four.params, one.params)
    assert h4[-1]["eval_acc"] == pytest.approx(h1[-1]["eval_acc"])
    with pytest.raises(ValueError, match="cannot be split evenly over 4 devices"):
        fit(ts, loss_fn, opt, lambda e: data.batches((X, Y), 30), epochs=1, devices=4, progress=False)


def test_fit_argument_errors():
    ts, loss_fn, opt, train_data, kw = _fit_setup()
    with pytest.raises(ValueError, match="eval_data, eval_fn and metric together"):
        fit(ts, loss_fn, opt, train_data, eval_data=kw["eval_data"])
    with pytest.raises(ValueError, match="asked for 64 devices"):
        fit(ts, loss_fn, opt, train_data, devices=64)
    once = iter(list(train_data(0)))
    with pytest.raises(ValueError, match="gave no batches in epoch 1.*callable"):
        fit(ts, loss_fn, opt, once, epochs=2, progress=False)


def test_each_device_gets_its_own_dropout_key():
    net = Dense(2)
    opt = optax.sgd(0.0)
    ts = TrainState.create(net, opt, KEY, (-1, 8))

    def loss_fn(params, state, batch, rng):
        y, _ = net.apply(params, (), batch[0])
        # Integer state is not averaged across devices, so it shows each device's key.
        return jnp.mean(y), Aux(state=jax.random.randint(rng, (), 0, 2 ** 30))

    ts = ts._replace(state=jnp.int32(0))
    step = jax.pmap(make_train_step(loss_fn, opt, axis_name="b"), axis_name="b")
    out, _ = step(funcnet.parallel.replicate(ts), funcnet.parallel.shard((X[:8], Y[:8])))
    assert len(set(np.asarray(out.state).tolist())) == 4
    # ...while the carried rng stays identical on every replica.
    kd = np.asarray(jax.random.key_data(out.rng))
    np.testing.assert_array_equal(kd, np.broadcast_to(kd[0], kd.shape))


def test_progress_bar_shows_loss_and_throughput(capsys):
    ts, loss_fn, opt, train_data, kw = _fit_setup()
    kw["progress"] = True
    fit(ts, loss_fn, opt, train_data, epochs=1, log_every=2, **kw)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "loss=" in err and "samples_s=" in err


def test_unsynced_loss_state_is_averaged_so_replicas_never_drift():
    """center_loss without axis_name under pmap: each device would update other centers."""
    opt = optax.sgd(0.0)
    ts = TrainState.create(Dense(2), opt, KEY, (-1, 8), loss_state=losses.center_loss_init(4, 2))

    def loss_fn(params, state, batch, rng, loss_state):
        f, state = Dense(2).apply(params, state, batch[0])
        closs, c = losses.center_loss(loss_state, f, batch[1])  # no axis_name
        return closs, Aux(state=state, loss_state=c)

    step = jax.pmap(make_train_step(loss_fn, opt, axis_name="b"), axis_name="b")
    y = np.repeat(np.arange(4, dtype=np.int32), 4)  # device i sees only class i
    out, _ = step(funcnet.parallel.replicate(ts), funcnet.parallel.shard((X[:16], y)))
    c = np.asarray(out.loss_state)
    np.testing.assert_array_equal(c, np.broadcast_to(c[0], c.shape))
    assert np.all(np.abs(c[0]).sum(-1) > 0)  # every class moved


def test_callbacks_may_keep_the_train_state_they_see():
    ts, loss_fn, opt, train_data, kw = _fit_setup()
    kept = []

    class Keep(train.Callback):
        def on_step_end(self, ctx, step):
            if step == 2:
                kept.append(ctx.train_state)

    fit(ts, loss_fn, opt, train_data, epochs=1, callbacks=[Keep()], progress=False)
    assert int(kept[0].step) == 2 and np.isfinite(np.asarray(kept[0].params[0]["W"])).all()


def test_metrics_may_not_shadow_the_loss():
    ts = TrainState.create(Dense(4), optax.sgd(0.1), KEY, (-1, 8))
    bad = make_train_step(lambda p, s, b, r: (jnp.float32(0), Aux(state=s, metrics={"loss": 1.0})),
                          optax.sgd(0.1))
    with pytest.raises(ValueError, match="may not contain 'loss'"):
        bad(ts, (X[:4], Y[:4]))


def test_csv_logger_keeps_its_columns_and_refuses_new_ones(tmp_path):
    log = train.CSVLogger(tmp_path / "h.csv")
    log.on_epoch_end(None, 0, {"epoch": 0, "loss": 1.0})
    log2 = train.CSVLogger(tmp_path / "h.csv")  # e.g. after a resume
    log2.on_epoch_end(None, 1, {"loss": 0.5, "epoch": 1})
    assert (tmp_path / "h.csv").read_text().splitlines() == ["epoch,loss", "0,1.0", "1,0.5"]
    with pytest.raises(ValueError, match=r"CSVLogger: epoch 2 logs \['lr'\].*JSONLLogger"):
        log2.on_epoch_end(None, 2, {"epoch": 2, "loss": 0.4, "lr": 0.1})
