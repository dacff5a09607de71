"""The pure train and eval steps: one device, pmap, loss state, dropout keys."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import losses, metrics
from funcnet.layers import BatchNorm, Dense, Relu
from funcnet.train import Aux, TrainState, make_eval_step, make_train_step
from helpers.training import KEY, X, Y, make_loss, mlp


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
        batch = (X[32 * i : 32 * i + 32], Y[32 * i : 32 * i + 32])
        ts, m = step(ts, batch)
        params, opt_state, loss = hand(params, opt_state, *batch)
        np.testing.assert_allclose(m["loss"], loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ts.params, params)
    assert int(ts.step) == 5 and set(m) == {"loss", "acc"}


def test_step_n_draws_from_fold_in_of_the_runs_key_and_n_so_dropout_sees_fresh_keys():
    net = mlp(dropout=0.5)
    opt = optax.sgd(0.0)  # params frozen: only the key changes the loss
    ts = TrainState.create(net, opt, KEY, (-1, 8))
    loss_fn = make_loss(net)
    step = jax.jit(make_train_step(loss_fn, opt))
    batch = (X[:32], Y[:32])
    ts1, m1 = step(ts, batch)
    ts2, m2 = step(ts1, batch)
    assert (int(ts1.step), int(ts2.step)) == (1, 2)
    for t in (ts1, ts2):  # the run's key is kept; the step count moves the draws on
        np.testing.assert_array_equal(jax.random.key_data(t.rng), jax.random.key_data(ts.rng))
    for n, m in enumerate((m1, m2)):
        by_hand = jax.jit(loss_fn)(ts.params, ts.state, batch, jax.random.fold_in(ts.rng, n))[0]
        assert float(m["loss"]) == float(by_hand)
    assert float(m1["loss"]) != float(m2["loss"])
    _, m1_again = step(ts, batch)
    assert float(m1_again["loss"]) == float(m1["loss"])  # pure: same input, same output


def test_a_network_that_draws_nothing_computes_no_key():
    """The compiled step of a network without dropout holds no threefry hash (on CPU jax
    lowers one as a loop: inside fit's device loop, a loop in the loop); the same step
    with dropout does (the ops keep their jax names in the compiled program)."""

    def compiled(dropout):
        net, opt = mlp(dropout=dropout), optax.sgd(0.1)
        ts = TrainState.create(net, opt, KEY, (-1, 8))
        step = jax.jit(make_train_step(make_loss(net), opt))
        return step.lower(ts, (X[:32], Y[:32])).compile().as_text()

    assert "threefry" not in compiled(0.0)
    assert "threefry" in compiled(0.5)


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
    loss_only = make_train_step(lambda p, s, b, r: jnp.sum(net.apply(p, s, b[0])[0]), opt)
    with pytest.raises(
        TypeError,
        match=r"must return \(loss, Aux\(...\)\), got an array of "
        r"shape \(\) alone \(the loss without its Aux\?\).*loss, Aux\(state=state\)",
    ):
        jax.jit(loss_only)(ts, (X[:4], Y[:4]))


def _global_vs_pmap(net, loss_fn_factory, n_steps=4, lr=0.05):
    n = jax.device_count()
    opt = optax.sgd(lr, momentum=0.9)
    ts = TrainState.create(net(None), opt, KEY, (-1, 8))
    single = jax.jit(make_train_step(loss_fn_factory(net(None)), opt))
    multi = jax.pmap(make_train_step(loss_fn_factory(net("batch")), opt, axis_name="batch"), axis_name="batch")
    ts_s, ts_m = ts, funcnet.distributed.replicate(ts)
    for i in range(n_steps):
        batch = (X[64 * i : 64 * i + 64], Y[64 * i : 64 * i + 64])
        ts_s, m_s = single(ts_s, batch)
        ts_m, m_m = multi(ts_m, funcnet.distributed.shard(batch, n))
        np.testing.assert_allclose(m_m["loss"], np.full(n, m_s["loss"]), rtol=1e-5)
    for leaf in jax.tree.leaves((ts_m.params, ts_m.state)):  # replicas identical
        np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a[0], b, rtol=1e-5, atol=1e-6),
        (ts_m.params, ts_m.state),
        (ts_s.params, ts_s.state),
    )
    return ts_s, ts_m


@pytest.mark.devices(4)
def test_pmap_step_with_synced_batchnorm_equals_global_batch():
    assert jax.device_count() == 4
    net = lambda axis: funcnet.serial(Dense(16), BatchNorm(axis_name=axis), Relu, Dense(4))
    ts_s, _ = _global_vs_pmap(net, make_loss)
    assert not np.allclose(ts_s.state[1]["mean"], 0)  # the running stats did move


@pytest.mark.devices(4)
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
    ts_s, ts_m = ts, funcnet.distributed.replicate(ts)
    for i in range(4):
        batch = (X[64 * i : 64 * i + 64], Y[64 * i : 64 * i + 64])
        ts_s, _ = step_s(ts_s, batch)
        ts_m, _ = step_m(ts_m, funcnet.distributed.shard(batch, 4))
    np.testing.assert_allclose(
        ts_m.loss_state, np.broadcast_to(ts_s.loss_state, ts_m.loss_state.shape), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(ts_m.params["W"][0], ts_s.params["W"], rtol=1e-5, atol=1e-6)


@pytest.mark.devices(4)
def test_eval_step_sums_metric_states_across_devices():
    net = mlp()
    ts = TrainState.create(net, optax.sgd(0.1), KEY, (-1, 8))
    acc = metrics.Accuracy()

    def metric_fn(params, state, batch):
        logits, _ = net.apply(params, state, batch[0])
        return acc.update(acc.init(), logits, batch[1])

    single = jax.jit(make_eval_step(metric_fn))(ts, (X, Y))
    multi = jax.pmap(make_eval_step(metric_fn, axis_name="b"), axis_name="b")(
        funcnet.distributed.replicate(ts), funcnet.distributed.shard((X, Y), 4)
    )
    jax.tree.map(lambda m, s: np.testing.assert_allclose(m[0], s), multi, single)
    logits, _ = net.apply(ts.params, ts.state, X)
    assert float(acc.compute(single)) == pytest.approx(float(np.mean(np.argmax(logits, -1) == Y)))


@pytest.mark.devices(4)
def test_each_device_gets_its_own_dropout_key():
    net = Dense(2)
    opt = optax.sgd(0.0)
    ts = TrainState.create(net, opt, KEY, (-1, 8))

    def loss_fn(params, state, batch, rng):
        y, _ = net.apply(params, (), batch[0])
        # Integer state is not averaged across devices, so it shows each device's key.
        return jnp.mean(y), Aux(state=jax.random.randint(rng, (), 0, 2**30))

    ts = ts._replace(state=jnp.int32(0))
    step = jax.pmap(make_train_step(loss_fn, opt, axis_name="b"), axis_name="b")
    out, _ = step(funcnet.distributed.replicate(ts), funcnet.distributed.shard((X[:8], Y[:8])))
    assert len(set(np.asarray(out.state).tolist())) == 4
    # ...while the carried rng stays identical on every replica.
    kd = np.asarray(jax.random.key_data(out.rng))
    np.testing.assert_array_equal(kd, np.broadcast_to(kd[0], kd.shape))


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
    out, _ = step(funcnet.distributed.replicate(ts), funcnet.distributed.shard((X[:16], y)))
    c = np.asarray(out.loss_state)
    np.testing.assert_array_equal(c, np.broadcast_to(c[0], c.shape))
    assert np.all(np.abs(c[0]).sum(-1) > 0)  # every class moved


def test_metrics_may_not_shadow_the_loss():
    ts = TrainState.create(Dense(4), optax.sgd(0.1), KEY, (-1, 8))
    bad = make_train_step(lambda p, s, b, r: (jnp.float32(0), Aux(state=s, metrics={"loss": 1.0})), optax.sgd(0.1))
    with pytest.raises(ValueError, match="may not contain 'loss'"):
        bad(ts, (X[:4], Y[:4]))


def test_train_state_of_another_optimizer_is_named_before_optax_fails():
    net = Dense(4)
    ts = TrainState.create(net, optax.adam(1e-2), KEY, (-1, 8))
    loss_fn = make_loss(net)
    with pytest.raises(
        ValueError,
        match=r"make_train_step: the TrainState's opt_state was made "
        r"by another optimizer: it holds \(ScaleByAdamState, EmptyState\), this "
        r"optimizer's init gives \(TraceState, EmptyState\).*the same optimizer",
    ):
        make_train_step(loss_fn, optax.sgd(0.1, momentum=0.9))(ts, (X[:4], Y[:4]))
    from funcnet import fit

    with pytest.raises(ValueError, match=r"opt_state was made by another optimizer"):
        fit(ts, loss_fn, optax.sgd(0.1, momentum=0.9), [(X[:4], Y[:4])], progress=False)
    # Per model: the optimizer that does not fit is named.
    models = {"a": (net, (-1, 8)), "b": (net, (-1, 8))}
    two = TrainState.create(models, {"a": optax.adam(1e-2), "b": optax.sgd(0.1)}, KEY)
    two_loss = lambda p, s, b, r: (
        jnp.sum(net.apply(p["a"], (), b[0])[0])  # noqa: E731
        + jnp.sum(net.apply(p["b"], (), b[0])[0]),
        Aux(state=s),
    )
    with pytest.raises(ValueError, match=r"opt_state\['b'\] was made by another optimizer"):
        make_train_step(two_loss, {"a": optax.adam(1e-2), "b": optax.adam(1e-2)})(two, (X[:4],))
