"""Several models in one TrainState: per-model optimizers, update=, target networks, Aux.outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import distributed, losses, serial
from funcnet.layers import BatchNorm, Dense, Relu, Tanh
from funcnet.train import Aux, TrainState, copy_params, make_train_step, polyak_update

KEY = jax.random.key(0)
RNG = np.random.default_rng(0)
REAL = jnp.asarray(RNG.normal(size=(8, 6)), jnp.float32)
NOISE = jnp.asarray(RNG.normal(size=(8, 2)), jnp.float32)
G = serial(Dense(8), Relu, Dense(6), Tanh)
D = serial(Dense(8), Relu, Dense(1))  # logits


def gan_state(opt=optax.adam(1e-2)):
    opts = {"gen": opt, "disc": opt}
    return opts, TrainState.create({"gen": (G, (-1, 2)), "disc": (D, (-1, 6))}, opts, KEY)


def d_loss(params, state, batch, rng):
    real, noise = batch
    fake, _ = G.apply(params["gen"], (), noise)
    p_real, _ = D.apply(params["disc"], (), real)
    p_fake, _ = D.apply(params["disc"], (), fake)
    return (
        losses.sigmoid_binary_cross_entropy(p_real, jnp.ones_like(p_real))
        + losses.sigmoid_binary_cross_entropy(p_fake, jnp.zeros_like(p_fake))
    ), Aux(state=state)


def g_loss(params, state, batch, rng):
    fake, _ = G.apply(params["gen"], (), batch[1])
    p_fake, _ = D.apply(params["disc"], (), fake)  # through the frozen discriminator
    return losses.sigmoid_binary_cross_entropy(p_fake, jnp.ones_like(p_fake)), Aux(state=state, outputs={"fake": fake})


def _identical(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def _changed(a, b):
    assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_create_several_models():
    opts, ts = gan_state()
    assert set(ts.params) == set(ts.state) == set(ts.opt_state) == {"gen", "disc"}
    assert ts.params["gen"][0]["W"].shape == (2, 8) and ts.params["disc"][0]["W"].shape == (6, 8)
    _identical(ts.opt_state["disc"], opts["disc"].init(ts.params["disc"]))
    joint = TrainState.create({"gen": (G, (-1, 2)), "disc": (D, (-1, 6))}, optax.adam(1e-2), KEY)
    _identical(joint.params, ts.params)  # the same keys per model either way
    _identical(joint.opt_state, optax.adam(1e-2).init(ts.params))  # one joint state


def test_gan_alternation_leaves_the_frozen_model_bit_identical():
    opts, ts = gan_state()
    d_step = jax.jit(make_train_step(d_loss, opts, update="disc"))
    g_step = jax.jit(make_train_step(g_loss, opts, update="gen"))
    batch = (REAL, NOISE)
    for _ in range(2):
        before = ts
        ts, d_metrics = d_step(ts, batch)
        _identical((ts.params["gen"], ts.opt_state["gen"]), (before.params["gen"], before.opt_state["gen"]))
        _changed(ts.params["disc"], before.params["disc"])
        before = ts
        ts, g_metrics, outputs = g_step(ts, batch)
        _identical((ts.params["disc"], ts.opt_state["disc"]), (before.params["disc"], before.opt_state["disc"]))
        _changed(ts.params["gen"], before.params["gen"])
    assert int(ts.step) == 4 and set(d_metrics) == set(g_metrics) == {"loss"}
    np.testing.assert_allclose(outputs["fake"], G.apply(before.params["gen"], (), NOISE)[0], rtol=1e-6)


def test_update_equals_a_hand_written_step_on_that_model_only():
    opts, ts = gan_state(optax.sgd(0.1, momentum=0.9))
    ts2, _ = jax.jit(make_train_step(d_loss, opts, update="disc"))(ts, (REAL, NOISE))
    grads = jax.jit(jax.grad(lambda d: d_loss({**ts.params, "disc": d}, ts.state, (REAL, NOISE), None)[0]))(
        ts.params["disc"]
    )
    updates, _ = opts["disc"].update(grads, ts.opt_state["disc"], ts.params["disc"])
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
        ts2.params["disc"],
        optax.apply_updates(ts.params["disc"], updates),
    )


def _mlp_loss(net):
    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, new = net.apply(params["net"], state["net"], x, rng=rng, train=True)
        return losses.cross_entropy(logits, y), Aux(state={"net": new})

    return loss_fn


@pytest.mark.parametrize("per_model_optimizer", [True, False])
def test_dict_state_with_one_model_steps_like_the_plain_state(per_model_optimizer):
    net = serial(Dense(8), BatchNorm(), Relu, Dense(3))
    opt = optax.sgd(0.1, momentum=0.9)
    opts = {"net": opt} if per_model_optimizer else opt
    multi = TrainState.create({"net": (net, (-1, 6))}, opts, KEY)
    plain = TrainState(multi.params["net"], multi.state["net"], opt.init(multi.params["net"]), multi.step, multi.rng)

    def plain_loss(params, state, batch, rng):
        logits, new = net.apply(params, state, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits, batch[1]), Aux(state=new)

    m_step = jax.jit(make_train_step(_mlp_loss(net), opts))
    p_step = jax.jit(make_train_step(plain_loss, opt))
    y = jnp.asarray(RNG.integers(0, 3, size=8), jnp.int32)
    for _ in range(3):
        multi, m = m_step(multi, (REAL, y))
        plain, p = p_step(plain, (REAL, y))
        np.testing.assert_array_equal(m["loss"], p["loss"])
    _identical((multi.params["net"], multi.state["net"]), (plain.params, plain.state))


def test_target_network_has_no_optimizer_and_follows_by_copy_and_polyak():
    q = serial(Dense(4), Relu, Dense(2))
    ts = TrainState.create({"online": (q, (-1, 3)), "target": (q, (-1, 3))}, {"online": optax.sgd(0.1)}, KEY)
    assert set(ts.opt_state) == {"online"}
    _changed(ts.params["online"], ts.params["target"])  # initialised with different keys
    ts = copy_params(ts, "online", "target")
    _identical(ts.params["target"], ts.params["online"])
    assert ts.params["target"][0]["W"] is not ts.params["online"][0]["W"]

    def td_loss(params, state, batch, rng):
        x, r = batch
        q_next, _ = q.apply(params["target"], (), x)
        target = jax.lax.stop_gradient(r + 0.9 * q_next.max(-1))
        q_now, _ = q.apply(params["online"], (), x)
        return jnp.mean((q_now.max(-1) - target) ** 2), Aux(state=state, outputs={"q": q_now})

    step = jax.jit(make_train_step(td_loss, {"online": optax.sgd(0.1)}), donate_argnums=0)
    x, r = REAL[:, :3], jnp.ones(8)
    old_target = jax.tree.map(np.asarray, ts.params["target"])
    ts, metrics, outputs = step(ts, (x, r))  # donating a state fresh from copy_params works
    assert outputs["q"].shape == (8, 2) and set(metrics) == {"loss"}
    _identical(ts.params["target"], old_target)

    tau = 0.25
    soft = polyak_update(ts, "online", "target", tau)
    jax.tree.map(
        lambda t, o, old: np.testing.assert_allclose(t, tau * o + (1 - tau) * old, rtol=1e-6),
        soft.params["target"],
        ts.params["online"],
        old_target,
    )
    _identical(soft.params["online"], ts.params["online"])
    _identical(polyak_update(ts, "online", "target", 1.0).params["target"], ts.params["online"])


def test_copy_params_copies_layer_state_too():
    net = serial(Dense(3), BatchNorm())
    ts = TrainState.create({"a": (net, (-1, 2)), "b": (net, (-1, 2))}, {"a": optax.sgd(0.1)}, KEY)
    ts = ts._replace(state={**ts.state, "a": jax.tree.map(lambda s: s + 1.0, ts.state["a"])})
    _identical(copy_params(ts, "a", "b").state["b"], ts.state["a"])


def test_outputs_come_back_unaveraged_under_pmap():
    n = jax.local_device_count()
    net = serial(Dense(2))
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, KEY, (-1, 6))

    def loss_fn(params, state, batch, rng):
        out, _ = net.apply(params, state, batch)
        return jnp.mean(out**2), Aux(state=state, metrics={"mean_out": out.mean()}, outputs={"out": out})

    step = jax.pmap(make_train_step(loss_fn, opt, axis_name="b"), axis_name="b")
    x = REAL[: 2 * n]
    _, metrics, outputs = step(distributed.replicate(ts, n), distributed.shard(x, n))
    want, _ = net.apply(ts.params, (), x)
    np.testing.assert_allclose(outputs["out"].reshape(2 * n, 2), want, rtol=1e-6)
    np.testing.assert_allclose(metrics["mean_out"], np.full(n, want.mean()), rtol=1e-5)


def test_step_without_outputs_keeps_two_values():
    net = serial(Dense(2))
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, KEY, (-1, 6))
    out = make_train_step(lambda p, s, b, r: (jnp.sum(net.apply(p, s, b)[0]), Aux(state=s)), opt)(ts, REAL)
    assert len(out) == 2


def test_errors_name_the_models():
    opts, ts = gan_state()
    with pytest.raises(ValueError, match=r"without an optimizer: \['critic'\]"):
        make_train_step(d_loss, opts, update="critic")
    with pytest.raises(ValueError, match=r"models \['critic'\].*models are \['disc', 'gen'\]"):
        make_train_step(d_loss, optax.sgd(0.1), update="critic")(ts, (REAL, NOISE))
    joint = TrainState.create({"gen": (G, (-1, 2)), "disc": (D, (-1, 6))}, optax.sgd(0.1), KEY)
    with pytest.raises(ValueError, match="one optimizer state per model"):
        make_train_step(d_loss, optax.sgd(0.1), update="disc")(joint, (REAL, NOISE))
    with pytest.raises(ValueError, match=r"one optimizer state per model \(\['disc', 'gen'\]\)"):
        make_train_step(d_loss, optax.adam(1e-2))(ts, (REAL, NOISE))
    with pytest.raises(ValueError, match=r"optimizer names the models \['critic'\]"):
        TrainState.create({"gen": (G, (-1, 2))}, {"critic": optax.sgd(0.1)}, KEY)
    with pytest.raises(TypeError, match="leave input_shape out"):
        TrainState.create({"gen": (G, (-1, 2))}, optax.sgd(0.1), KEY, (-1, 2))
    with pytest.raises(TypeError, match=r"models\['gen'\] must be \(layer, input_shape\)"):
        TrainState.create({"gen": G}, optax.sgd(0.1), KEY)
    with pytest.raises(TypeError, match="input_shape is required"):
        TrainState.create(G, optax.sgd(0.1), KEY)
    with pytest.raises(ValueError, match="differently structured"):
        copy_params(ts, "gen", "disc")


def test_public_names():
    assert funcnet.copy_params is copy_params and funcnet.polyak_update is polyak_update


def test_update_step_under_pmap_matches_one_device():
    n = jax.local_device_count()
    opts, ts = gan_state(optax.sgd(0.1))
    real = jnp.tile(REAL, (n, 1))[: 4 * n]
    noise = jnp.tile(NOISE, (n, 1))[: 4 * n]
    one, _ = jax.jit(make_train_step(d_loss, opts, update="disc"))(ts, (real, noise))
    pstep = jax.pmap(make_train_step(d_loss, opts, update="disc", axis_name="b"), axis_name="b")
    many, _ = pstep(distributed.replicate(ts, n), distributed.shard((real, noise), n))
    many = distributed.unreplicate(many)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), many.params, one.params)
    _identical(many.params["gen"], ts.params["gen"])


def test_fit_accepts_a_loss_fn_that_returns_outputs():
    """fit drops Aux.outputs and trains exactly as with the two-value loss_fn."""
    import optax
    import numpy as np
    import jax
    import jax.numpy as jnp
    import funcnet as fn
    from funcnet import layers, losses

    net = layers.Dense(3)
    opt = optax.sgd(0.1)
    x = np.random.RandomState(0).randn(8, 4).astype(np.float32)
    y = np.arange(8) % 3

    def make_loss(with_outputs):
        def loss_fn(params, state, batch, rng):
            logits, state = net.apply(params, state, batch[0], rng=rng, train=True)
            loss = losses.cross_entropy(logits, batch[1])
            outs = {"logits": logits} if with_outputs else {}
            return loss, fn.Aux(state=state, outputs=outs)

        return loss_fn

    finals = []
    for with_outputs in (False, True):
        ts = fn.TrainState.create(net, opt, jax.random.PRNGKey(0), (-1, 4))
        ts, _ = fn.fit(ts, make_loss(with_outputs), opt, [(x, y)] * 3, epochs=1, progress=False)
        finals.append(ts.params)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), *finals)
    assert jnp.all(jnp.isfinite(finals[0]["W"]))
