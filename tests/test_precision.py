"""Mixed precision: the dtype policy, float32 BatchNorm statistics, float32 losses, loss scaling."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import datasets, initializers, losses, metrics, outputs, precision, train
from funcnet.layers import GRU, LSTM, RNN, BatchNorm, Conv, ConvTranspose, Dense, Embedding, LayerNorm, Relu
from funcnet.precision import Policy, apply_policy, parse_policy
from funcnet.train import Aux, TrainState, make_train_step

BF16 = parse_policy("params=float32,compute=bfloat16")
F16 = parse_policy("params=float32,compute=float16,output=float32")


def _bf16_values(*shape, seed=0, scale=1.0, shift=0.0):
    """Random values that bfloat16 holds exactly, as float32: f32 and bf16 runs see the same input."""
    x = np.random.default_rng(seed).normal(size=shape) * scale + shift
    return jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)


def _dtypes(tree):
    return {jnp.dtype(x.dtype) for x in jax.tree.leaves(tree)}


# --------------------------------------------------------------------------- #
# Policy.
# --------------------------------------------------------------------------- #


def test_parse_policy():
    p = parse_policy("params=float32,compute=bfloat16,output=float32")
    assert p == Policy(jnp.float32, jnp.bfloat16, jnp.float32)
    assert parse_policy("p=f32, c=bf16") == Policy(jnp.float32, jnp.bfloat16, jnp.bfloat16)
    assert parse_policy("f16") == Policy(jnp.float16, jnp.float16, jnp.float16)
    assert Policy.make("f32", "bf16", "f32") == p


@pytest.mark.parametrize(
    "spec, match",
    [
        ("params=float32,compute=int8", "compute_dtype must be a floating dtype"),
        ("params=float32,compute=nonsense", "compute_dtype"),
        ("weights=float32", "cannot read 'weights=float32'"),
        ("params=f32,params=bf16", "given twice"),
        ("", "expected a string"),
    ],
)
def test_parse_policy_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_policy(spec)


def test_apply_policy_rejects_bad_arguments():
    with pytest.raises(TypeError, match="apply_policy: policy must be"):
        apply_policy(Dense(3), jnp.bfloat16)
    with pytest.raises(TypeError, match="apply_policy: expected a funcnet Layer"):
        apply_policy(Dense, BF16)


# --------------------------------------------------------------------------- #
# Every layer with params, under a bf16-compute / f32-param policy.
# --------------------------------------------------------------------------- #

LAYERS = {
    "Dense": (lambda: Dense(6), (3, 5), "float"),
    "Conv": (lambda: Conv(4, (3, 3), padding="SAME"), (2, 5, 5, 3), "float"),
    "ConvTranspose": (lambda: ConvTranspose(4, (3, 3), strides=2), (2, 4, 4, 3), "float"),
    "Embedding": (lambda: Embedding(11, 4), (2, 5), "ids"),
    "RNN": (lambda: RNN(5), (2, 4, 3), "float"),
    "LSTM": (lambda: LSTM(5), (2, 4, 3), "float"),
    "GRU": (lambda: GRU(5, return_sequences=False), (2, 4, 3), "float"),
    "LayerNorm": (lambda: LayerNorm(), (3, 8), "float"),
    "BatchNorm": (lambda: BatchNorm(), (8, 4), "float"),
}


def _input(shape, kind):
    if kind == "ids":
        return jnp.asarray(np.random.default_rng(1).integers(0, 11, size=shape), jnp.int32)
    return _bf16_values(*shape, seed=1)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_under_bf16_policy(name):
    make, shape, kind = LAYERS[name]
    x = _input(shape, kind)
    ref = make()
    mixed = apply_policy(make(), BF16)
    _, params, state = mixed.init(jax.random.key(0), shape)
    _, params32, _ = ref.init(jax.random.key(0), shape)
    assert _dtypes(params) == {jnp.dtype(jnp.float32)}
    jax.tree.map(np.testing.assert_array_equal, params, params32)  # same draw, stored in f32
    train = name == "BatchNorm"

    def total(p):  # one compile gives the output, the new state and the param gradients
        out, new_state = mixed.apply(p, state, x, train=train)
        weights = jnp.linspace(-1, 1, out.size).reshape(out.shape)
        return jnp.sum(out.astype(jnp.float32) * weights), (out, new_state)

    (_, (y, new_state)), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(params)
    y32, state32 = jax.jit(functools.partial(ref.apply, train=train))(params, state, x)
    assert y.dtype == jnp.bfloat16, f"{name} returned {y.dtype} under a bf16 compute policy"
    np.testing.assert_allclose(np.asarray(y, np.float32), y32, rtol=3e-2, atol=3e-2)
    assert _dtypes(grads) == {jnp.dtype(jnp.float32)}
    if state32 != ():
        assert _dtypes(new_state) == {jnp.dtype(jnp.float32)}
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), new_state, state32)


def test_dense_really_computes_in_bf16():
    # The product of the bf16-rounded operands, not an f32 matmul rounded afterwards.
    layer = apply_policy(Dense(4), BF16)
    _, params, _ = layer.init(jax.random.key(3), (-1, 7))
    x = jax.random.normal(jax.random.key(4), (5, 7))
    y, _ = jax.jit(layer.apply)(params, (), x)
    b = lambda a: a.astype(jnp.bfloat16)
    np.testing.assert_array_equal(y, b(x) @ b(params["W"]) + b(params["b"]))


def test_output_dtype_and_summary_name():
    net = apply_policy(funcnet.serial(Dense(5), Relu, Dense(3)), F16)
    _, params, state = net.init(jax.random.key(0), (-1, 4))
    y, _ = jax.eval_shape(net.apply, params, state, jnp.ones((2, 4)))
    assert y.dtype == jnp.float32  # output=float32 for the loss
    assert net.name == "serial@float32/float16/float32"


# --------------------------------------------------------------------------- #
# BatchNorm statistics stay float32.
# --------------------------------------------------------------------------- #


def _bn_run(x_dtype, steps=50, momentum=0.99):
    init, apply = BatchNorm(momentum=momentum)
    _, params, state = init(jax.random.key(0), (-1, 3))
    step = jax.jit(lambda s, x: apply(params, s, x, train=True)[1])
    for i in range(steps):
        x = _bf16_values(16, 3, seed=i, scale=0.5, shift=5.0)
        state = step(state, x.astype(x_dtype))
    return state


def test_batchnorm_stats_stay_float32_under_bf16_inputs():
    s16 = _bn_run(jnp.bfloat16)
    s32 = _bn_run(jnp.float32)
    assert s16["mean"].dtype == s16["var"].dtype == jnp.float32
    np.testing.assert_allclose(s16["mean"], s32["mean"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s16["var"], s32["var"], rtol=1e-6, atol=1e-6)

    # The same running average kept in bfloat16 stalls far from the truth: the bound
    # above is one that drifting statistics would fail.
    naive = jnp.zeros((3,), jnp.bfloat16)
    for i in range(50):
        x = _bf16_values(16, 3, seed=i, scale=0.5, shift=5.0)
        naive = jnp.bfloat16(0.99) * naive + jnp.bfloat16(0.01) * jnp.mean(x.astype(jnp.bfloat16), axis=0)
    assert np.max(np.abs(np.asarray(naive, np.float32) - s32["mean"])) > 1e-2


def test_batchnorm_refuses_half_precision_state():
    init, apply = BatchNorm()
    _, params, state = init(jax.random.key(0), (-1, 3))
    bad = jax.tree.map(lambda a: a.astype(jnp.bfloat16), state)
    x = jnp.ones((4, 3), jnp.bfloat16)
    for training in (True, False):
        with pytest.raises(
            TypeError,
            match=r"BatchNorm: the running statistics must be float32"
            r".*state\['mean'\] of dtype bfloat16",
        ):
            apply(params, bad, x, train=training)
    f16_var = {"mean": state["mean"], "var": state["var"].astype(jnp.float16)}
    with pytest.raises(TypeError, match=r"state\['var'\] of dtype float16"):
        apply(params, f16_var, x, train=True)


def test_layernorm_statistics_in_float32():
    # Normalising 256 values around 3 in bfloat16 arithmetic would lose the mean;
    # computed in f32, the bf16 result is the f32 result rounded once.
    x = _bf16_values(2, 256, seed=5, scale=0.1, shift=3.0)
    init, apply = LayerNorm()
    _, params, _ = init(jax.random.key(0), (-1, 256))
    y16, _ = apply(params, (), x.astype(jnp.bfloat16))
    y32, _ = apply(params, (), x)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y16, y32.astype(jnp.bfloat16))


# --------------------------------------------------------------------------- #
# Losses, output ops and metrics compute in float32.
# --------------------------------------------------------------------------- #


def _logits():
    return _bf16_values(6, 5, seed=2, scale=3.0)


LABELS = jnp.asarray([0, 4, 2, 1, 3, 2], jnp.int32)
TARGETS = _bf16_values(6, 5, seed=3)

LOSSES = {
    "cross_entropy": lambda z: losses.cross_entropy(z, LABELS, label_smoothing=0.1),
    "cross_entropy_probs": lambda z: losses.cross_entropy(z, jax.nn.softmax(TARGETS)),
    "nll_loss": lambda z: losses.nll_loss(z, LABELS, weight=jnp.arange(1.0, 6.0)),
    "sigmoid_bce": lambda z: losses.sigmoid_binary_cross_entropy(z, TARGETS > 0),
    "mse": lambda z: losses.mse(z, TARGETS),
    "mae": lambda z: losses.mae(z, TARGETS),
    "huber": lambda z: losses.huber(z, TARGETS),
    "hinge": lambda z: losses.hinge(z, (TARGETS > 0).astype(jnp.int32)),
    "multiclass_hinge": lambda z: losses.multiclass_hinge(z, LABELS),
    "smooth_l1": lambda z: jnp.sum(losses.smooth_l1(z)),
    "center_loss": lambda z: losses.center_loss(jnp.ones((5, 5)), z, LABELS)[0],
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_of_bf16_inputs_is_float32(name):
    fn = jax.jit(LOSSES[name])
    z = _logits()
    low = fn(z.astype(jnp.bfloat16))
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, fn(z), rtol=1e-6, atol=1e-6)
    g = jax.jit(jax.grad(fn))(z.astype(jnp.bfloat16))
    assert g.dtype == jnp.bfloat16  # the gradient reaches the input in its own dtype
    np.testing.assert_allclose(np.asarray(g, np.float32), jax.grad(fn)(z), rtol=1e-2, atol=1e-3)


def test_loss_reduction_none_is_float32_and_center_dtype_kept():
    z = _logits().astype(jnp.float16)
    assert losses.cross_entropy(z, LABELS, reduction="none").dtype == jnp.float32
    centers = losses.center_loss_init(5, 5, jnp.float16)
    loss, new = losses.center_loss(centers, z, LABELS)
    assert loss.dtype == jnp.float32 and new.dtype == jnp.float16


OUTPUTS = {
    "softmax_output": lambda z: outputs.softmax_output(z, LABELS),
    "linear_regression_output": lambda z: outputs.linear_regression_output(z, TARGETS),
    "logistic_regression_output": lambda z: outputs.logistic_regression_output(z, (TARGETS > 0).astype(jnp.float32)),
    "mae_regression_output": lambda z: outputs.mae_regression_output(z, TARGETS),
    "svm_output": lambda z: outputs.svm_output(z, LABELS),
    "make_loss": lambda z: outputs.make_loss(z, normalization="batch"),
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_output_op_of_bf16_data_is_float32(name):
    op = jax.jit(OUTPUTS[name])
    z = _logits()
    out = op(z.astype(jnp.bfloat16))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, op(z), rtol=1e-6, atol=1e-6)
    g = jax.jit(outputs.grad(op))(z.astype(jnp.bfloat16))
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(g, np.float32), outputs.grad(op)(z), rtol=1e-2, atol=1e-3)


def test_metrics_accumulate_in_float32_and_int():
    mean, mse, acc = metrics.Mean(), metrics.MSE(), metrics.Accuracy()
    m, e, a = mean.init(), mse.init(), acc.init()
    one, zero = jnp.ones((4,), jnp.bfloat16), jnp.zeros((4,), jnp.bfloat16)
    scores = _logits().astype(jnp.bfloat16)[:4]

    @jax.jit
    def update(states, _):
        m, e, a = states
        return (mean.update(m, one), mse.update(e, one, zero), acc.update(a, scores, LABELS[:4])), None

    # 1200 > 256: a bf16 running total would stop at 256.
    (m, e, a), _ = jax.lax.scan(update, (m, e, a), None, length=300)
    assert m["total"].dtype == e["total"].dtype == jnp.float32
    assert a["correct"].dtype == a["count"].dtype == jnp.int32
    assert float(m["total"]) == float(e["total"]) == 1200.0
    assert float(mean.compute(m)) == 1.0 and int(a["count"]) == 1200


# --------------------------------------------------------------------------- #
# Loss scaling.
# --------------------------------------------------------------------------- #


def test_update_loss_scale_rules():
    ls = precision.dynamic_loss_scale(1024.0, period=3, factor=2.0, min_scale=256.0)
    ls = precision.update_loss_scale(ls, jnp.asarray(False))
    assert float(ls.scale) == 512.0 and int(ls.good_steps) == 0
    for expected in (1, 2):
        ls = precision.update_loss_scale(ls, jnp.asarray(True))
        assert float(ls.scale) == 512.0 and int(ls.good_steps) == expected
    ls = precision.update_loss_scale(ls, jnp.asarray(True))
    assert float(ls.scale) == 1024.0 and int(ls.good_steps) == 0
    for _ in range(3):
        ls = precision.update_loss_scale(ls, jnp.asarray(False))
    assert float(ls.scale) == 256.0  # floored at min_scale

    static = precision.static_loss_scale(128.0)
    for finite in (False, True, True, False):
        static = precision.update_loss_scale(static, jnp.asarray(finite))
        assert float(static.scale) == 128.0


def test_loss_scale_helpers():
    ls = precision.static_loss_scale(8.0)
    assert precision.scale_loss(ls, jnp.float16(2.0)).dtype == jnp.float32
    assert float(precision.scale_loss(ls, jnp.float16(2.0))) == 16.0
    g = precision.unscale_grads(ls, {"a": jnp.full((2,), 16.0, jnp.float16), "b": jnp.ones(3)})
    assert g["a"].dtype == jnp.float16 and float(g["a"][0]) == 2.0 and float(g["b"][0]) == 0.125
    assert bool(precision.all_finite({"a": jnp.ones(2), "n": jnp.arange(3)}))
    assert not bool(precision.all_finite([jnp.ones(2), jnp.asarray([1.0, jnp.nan])]))
    with pytest.raises(ValueError, match="dynamic_loss_scale: factor must be a finite number > 1"):
        precision.dynamic_loss_scale(factor=1.0)
    with pytest.raises(ValueError, match="static_loss_scale: scale must be a positive"):
        precision.static_loss_scale(0.0)


def _linear_loss(params, state, batch, rng):
    return jnp.sum(params["w"] * batch), Aux(state=state)


def _linear_state(opt, loss_scale=()):
    params = {"w": jnp.ones((3,))}
    return TrainState(params, (), opt.init(params), jnp.zeros((), jnp.int32), jax.random.key(0), loss_scale=loss_scale)


def test_scaled_step_skips_non_finite_and_lowers_the_scale():
    opt = optax.adam(0.1)
    ts = _linear_state(opt, precision.dynamic_loss_scale(2.0**10, period=2))
    step = jax.jit(make_train_step(_linear_loss, opt, ema_decay=0.5, grad_norm=True))
    ts = ts._replace(ema=funcnet.train.EMA(ts.params, jnp.ones((), jnp.int32)))

    bad = jnp.asarray([1.0, jnp.inf, 0.0])
    new, m = step(ts, bad)
    assert not bool(m["grads_finite"]) and float(new.loss_scale.scale) == 2.0**9
    jax.tree.map(np.testing.assert_array_equal, (new.params, new.opt_state, new.ema), (ts.params, ts.opt_state, ts.ema))
    assert int(new.step) == 1

    good = jnp.asarray([1.0, 2.0, 3.0])
    new2, m2 = step(new, good)
    ls2 = new2.loss_scale
    assert bool(m2["grads_finite"]) and float(ls2.scale) == 2.0**9 and int(ls2.good_steps) == 1
    assert float(m2["loss"]) == pytest.approx(6.0) and float(m2["loss_scale"]) == 2.0**9
    assert float(m2["grad_norm"]) == pytest.approx(np.sqrt(14.0))  # unscaled gradients
    assert not np.allclose(new2.params["w"], ts.params["w"])
    assert not np.allclose(new2.ema.params["w"], ts.ema.params["w"])
    new3, _ = step(new2, good)
    assert float(new3.loss_scale.scale) == 2.0**10  # raised after 2 finite steps
    assert int(new3.loss_scale.good_steps) == 0


def test_loss_scale_in_create_and_with_microbatches():
    net = funcnet.serial(Dense(4), Relu, Dense(2))
    opt = optax.sgd(0.5)
    plain = TrainState.create(net, opt, jax.random.key(0), (-1, 3))
    scaled = TrainState.create(net, opt, jax.random.key(0), (-1, 3), loss_scale=precision.static_loss_scale(2.0**8))
    assert plain.loss_scale == () and float(scaled.loss_scale.scale) == 256.0

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch)
        return jnp.mean(out**2), Aux(state=state)

    x = jax.random.normal(jax.random.key(1), (8, 3))
    want, _ = jax.jit(make_train_step(loss_fn, opt))(plain, x)
    got, m = jax.jit(make_train_step(loss_fn, opt, microbatches=2))(scaled, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got.params, want.params)
    assert float(m["loss_scale"]) == 256.0 and bool(m["grads_finite"])
    with pytest.raises(ValueError, match="loss_scale must be None or a funcnet.precision.LossScale"):
        TrainState.create(net, opt, jax.random.key(0), (-1, 3), loss_scale=2.0**8)


def test_deprecated_make_scaled_train_step_warns_and_gives_the_same_step():
    opt = optax.adam(0.1)
    ls = precision.dynamic_loss_scale(2.0**10, period=2)
    with pytest.warns(DeprecationWarning, match="TrainState.create\\(..., loss_scale="):
        old = train.make_scaled_train_step(_linear_loss, opt)
    batch = jnp.asarray([1.0, 2.0, 3.0])
    new_old, ls_old, m_old = old(_linear_state(opt), ls, batch)
    # the deprecated step keeps reporting grad_norm, as it always did
    new, m = make_train_step(_linear_loss, opt, grad_norm=True)(_linear_state(opt, ls), batch)
    jax.tree.map(np.testing.assert_array_equal, (new_old.params, ls_old, m_old), (new.params, new.loss_scale, m))
    assert new_old.loss_scale == ()
    with pytest.raises(ValueError, match="pass the TrainState first and the precision.LossScale"):
        old(ls, _linear_state(opt), batch)


def _mlp_steps(policy, tiny):
    """One SGD(lr=1) step of a small MLP, plain and loss-scaled, and the initial state."""
    net = apply_policy(funcnet.serial(Dense(16), Relu, Dense(4)), policy)
    opt = optax.sgd(1.0)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0])
        return tiny * losses.cross_entropy(logits, batch[1]), Aux(state=state)

    step = jax.jit(make_train_step(loss_fn, opt))
    return step, step, ts


def test_scaled_f16_step_matches_f32_step():
    batch = (jax.random.normal(jax.random.key(1), (32, 8)), jnp.arange(32) % 4)
    tiny = 2.0**-20  # a small loss: its float16 gradients underflow unless scaled
    plain32, _, ts = _mlp_steps(Policy(), tiny)
    _, scaled16, ts16 = _mlp_steps(F16, tiny)
    delta = lambda new: np.concatenate(
        [np.ravel(a - b) for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(ts.params))]
    )  # = -grad with SGD(1)

    want = delta(plain32(ts, batch)[0])
    runs = {}
    for scale in (2.0**20, 1.0):
        new, m = scaled16(ts16._replace(loss_scale=precision.static_loss_scale(scale)), batch)
        assert bool(m["grads_finite"]) and _dtypes(new.params) == {jnp.dtype(jnp.float32)}
        runs[scale] = delta(new)
    assert np.max(np.abs(want)) > 1e-8
    np.testing.assert_allclose(runs[2.0**20], want, rtol=2e-2, atol=2e-3 * np.max(np.abs(want)))
    # Without the scale, float16 gradients of that small loss underflow: the check
    # above is one that unscaled float16 fails.
    assert np.max(np.abs(runs[1.0] - want)) > 0.1 * np.max(np.abs(want))


@pytest.mark.devices(4)
def test_scaled_step_under_pmap_agrees_across_devices():
    n = 2
    opt = optax.sgd(0.1)
    params = {"w": jnp.ones((3,))}
    ts = _linear_state(opt, precision.dynamic_loss_scale(8.0))
    rep = lambda t: jax.tree.map(lambda a: jnp.stack([a] * n), t)
    step = jax.pmap(make_train_step(_linear_loss, opt, axis_name="b"), axis_name="b", devices=jax.local_devices()[:n])
    # Only device 1 sees an inf: the averaged gradient is inf on both, both skip.
    batch = jnp.asarray([[1.0, 2.0, 3.0], [1.0, jnp.inf, 3.0]])
    new, m = step(rep(ts), batch)
    assert not np.any(np.asarray(m["grads_finite"]))
    np.testing.assert_array_equal(new.params["w"], rep(params)["w"])
    np.testing.assert_array_equal(new.loss_scale.scale, [4.0, 4.0])


# --------------------------------------------------------------------------- #
# End to end: the tinynn MNIST MLP in bfloat16 trains as well as in float32.
# --------------------------------------------------------------------------- #


def _train_mnist(policy, x, y, x_test, y_test, steps=200, batch=64):
    dense = lambda n: Dense(n, W_init=initializers.xavier_uniform(), b_init=initializers.zeros)
    net = apply_policy(funcnet.serial(dense(400), Relu, dense(100), Relu, dense(10)), policy)
    opt = optax.adam(1e-3)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 784))

    def loss_fn(params, state, b, rng):
        logits, state = net.apply(params, state, b[0], train=True)
        return losses.cross_entropy(logits, b[1]), Aux(state=state)

    step = make_train_step(loss_fn, opt)
    n_batches = x.shape[0] // batch
    xb = x[: n_batches * batch].reshape(n_batches, batch, 784)
    yb = y[: n_batches * batch].reshape(n_batches, batch)

    @jax.jit
    def train(ts):
        def body(ts, i):
            j = i % n_batches
            return step(ts, (xb[j], yb[j]))[0], None

        return jax.lax.scan(body, ts, jnp.arange(steps))[0]

    ts = train(ts)
    logits, _ = net.apply(ts.params, ts.state, x_test)
    assert _dtypes(ts.params) == {jnp.dtype(jnp.float32)}
    return float(jnp.mean(jnp.argmax(logits, -1) == y_test))


def test_mnist_mlp_bf16_matches_f32_accuracy():
    x, y = datasets.mnist.load("train", flatten=True, download=False)
    x_test, y_test = datasets.mnist.load("test", flatten=True, download=False)
    x, y = jnp.asarray(x[:9600]), jnp.asarray(y[:9600])
    x_test, y_test = jnp.asarray(x_test[:2000]), jnp.asarray(y_test[:2000])
    acc32 = _train_mnist(Policy(), x, y, x_test, y_test)
    acc16 = _train_mnist(parse_policy("params=float32,compute=bfloat16,output=float32"), x, y, x_test, y_test)
    assert acc32 > 0.85, acc32  # 200 steps on 9600 images: training works
    assert abs(acc16 - acc32) <= 0.01, (acc16, acc32)
