"""Every layer, loss, MXNet output op and metric under ``jax.jit`` with a batch split over a mesh.

Two meshes over the 4 simulated CPU devices, axis ``"data"``: ``jax.make_mesh``'s
default (Explicit axes: every array's type carries its sharding, and ops whose
result layout JAX cannot infer are refused at trace time) and an Auto mesh (the
compiler picks layouts). Each case is run jitted on the split batch with the
parameters replicated, and must equal the same function run unsharded on one
device. Layers are checked forward and backward (the parameter gradients are what
data-parallel training needs), losses and output ops with their gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import combinators as C
from funcnet import layers as L
from funcnet import distributed, losses, metrics, outputs

N = 8  # global batch: two examples per device


def _randn(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ids(seed, shape, high):
    return np.random.default_rng(seed).integers(0, high, shape).astype(np.int32)


# --------------------------------------------------------------------------- #
# Cases: (replicated args, batch args, fn(*replicated, *batch) -> pytree).
# --------------------------------------------------------------------------- #


def _layer(layer, x, *, train=False, dropout_key=False):
    """Output, new state and parameter gradients of ``sum(sin(output))`` (not of a sum of
    squares: through BatchNorm that gradient is zero up to rounding). Built when a test
    first asks (:func:`_case`): eager inits at import would cost every xdist worker."""

    def build():
        _, params, state = layer.init(jax.random.key(0), x.shape)
        key = jax.random.key(1) if dropout_key else None

        def fn(params, x):
            def objective(p):
                out, new_state = layer.apply(p, state, x, rng=key, train=train)
                heads = out if isinstance(out, tuple) else (out,)
                return sum(jnp.sum(jnp.sin(h)) for h in heads), (out, new_state)

            (_, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
            return aux, grads

        return (params,), (x,), fn

    return build


def _grad_of(loss_fn, *batch, **kwargs):
    """A loss's value and its gradient with respect to the first argument."""
    return (), batch, lambda *b: jax.value_and_grad(lambda x: loss_fn(x, *b[1:], **kwargs))(b[0])


def _output_op(op, data, label, **kwargs):
    """An MXNet output op's forward and its injected gradient."""
    return (), (data, label), lambda d, y: (op(d, y, **kwargs), outputs.grad(lambda d: op(d, y, **kwargs))(d))


def _metric(metric, *batch):
    return (), batch, lambda *b: (lambda s: (s, metric.compute(s)))(metric.update(metric.init(), *b))


x2 = _randn(0, N, 5)
img1, img2, img3 = _randn(1, N, 8, 3), _randn(2, N, 6, 6, 3), _randn(3, N, 4, 4, 4, 2)
seq = _randn(4, N, 5, 3)
logits, labels = _randn(5, N, 4), _ids(6, (N,), 4)
labels_ignored = np.where(np.arange(N) % 3 == 0, -100, labels).astype(np.int32)
probs = jax.nn.softmax(_randn(7, N, 4)).astype(np.float32)
targets = _randn(8, N, 4)
weight = np.array([0.5, 1.0, 2.0, 1.5], np.float32)
centers = _randn(9, 4, 4)

LAYERS = {
    "Dense": _layer(L.Dense(3), x2),
    "Conv1D": _layer(L.Conv(4, (3,), padding="SAME"), img1),
    "Conv2D": _layer(L.Conv(4, (3, 3), strides=2), img2),
    "Conv3D": _layer(L.Conv(2, (2, 2, 2)), img3),
    "Conv2D-one-channel": _layer(L.Conv(4, (3, 3), padding="SAME"), img2[..., :1]),  # patches
    # 72 examples: 3 chunks on one device, one convolution on the meshes
    "Conv2D-large-batch": _layer(L.Conv(4, (3, 3), padding="SAME"), _randn(7, 72, 6, 6, 3)),
    "ConvTranspose": _layer(L.ConvTranspose(2, (3, 3), strides=2, padding="SAME"), img2),
    "MaxPool": _layer(L.MaxPool((2, 2)), img2),
    "MaxPool-overlapping": _layer(L.MaxPool((3, 3), strides=1, padding=1), img2),
    "AvgPool": _layer(L.AvgPool((2, 2), padding="SAME", count_include_pad=False), img2),
    "GlobalAvgPool": _layer(L.GlobalAvgPool, img2),
    "Flatten": _layer(L.Flatten, img2),
    "Reshape": _layer(L.Reshape((-1, 18, 6)), img2),
    "Dropout-train": _layer(L.Dropout(0.5), x2, train=True, dropout_key=True),
    "BatchNorm-train": _layer(L.BatchNorm(), img2, train=True),
    "BatchNorm-eval": _layer(L.BatchNorm(), img2),
    "LayerNorm": _layer(L.LayerNorm(), x2),
    "Embedding": _layer(L.Embedding(10, 3), _ids(10, (N, 5), 10)),
    # One case for the three: each scan costs a second of compiling.
    "RNN+GRU+LSTM": _layer(C.serial(L.RNN(4), L.GRU(3), L.LSTM(4, return_sequences=False)), seq),
    "activations": _layer(
        C.serial(
            L.Relu, L.LeakyRelu(0.1), L.Elu, L.Selu, L.Gelu, L.Sigmoid, L.Tanh, L.Softplus, L.Softmax(), L.LogSoftmax()
        ),
        x2,
    ),
    "serial+parallel": _layer(C.serial(C.FanOut(2), C.parallel(L.Dense(3), L.Dense(2)), C.FanInConcat()), x2),
    "FanInSum+Residual": _layer(
        C.serial(C.FanOut(2), C.parallel(L.Dense(5), C.Identity), C.FanInSum, C.Residual(L.Dense(5))), x2
    ),
}

LOSSES = {
    "cross_entropy": _grad_of(losses.cross_entropy, logits, labels),
    "cross_entropy-weight-ignore": _grad_of(
        losses.cross_entropy, logits, labels_ignored, weight=weight, label_smoothing=0.1
    ),
    "cross_entropy-probs": _grad_of(losses.cross_entropy, logits, probs, weight=weight),
    "nll_loss-weight": _grad_of(losses.nll_loss, jax.nn.log_softmax(logits), labels_ignored, weight=weight),
    "sigmoid_bce": _grad_of(losses.sigmoid_binary_cross_entropy, logits, (targets > 0), pos_weight=weight),
    "mse": _grad_of(losses.mse, logits, targets),
    "mae": _grad_of(losses.mae, logits, targets),
    "huber": _grad_of(losses.huber, logits, targets, delta=0.5),
    "smooth_l1": _grad_of(lambda x: jnp.sum(losses.smooth_l1(x, scalar=2.0)), logits),
    "hinge": _grad_of(losses.hinge, logits, np.sign(targets)),
    "multiclass_hinge-weight": _grad_of(losses.multiclass_hinge, logits, labels, weight=weight),
    "center_loss": (
        (centers,),
        (logits, labels),
        lambda c, f, y: jax.value_and_grad(lambda f: losses.center_loss(c, f, y), has_aux=True)(f),
    ),
}

OUTPUTS = {
    "softmax_output": _output_op(
        outputs.softmax_output,
        logits,
        labels.astype(np.float32),
        normalization="valid",
        use_ignore=True,
        ignore_label=2.0,
    ),
    "softmax_output-probs": _output_op(outputs.softmax_output, logits, probs, smooth_alpha=0.0),
    "linear_regression_output": _output_op(outputs.linear_regression_output, logits, targets),
    "logistic_regression_output": _output_op(
        outputs.logistic_regression_output, logits, (targets > 0).astype(np.float32)
    ),
    "mae_regression_output": _output_op(outputs.mae_regression_output, logits, targets),
    "svm_output": _output_op(outputs.svm_output, logits, labels.astype(np.float32)),
    "make_loss+block_grad": (
        (),
        (logits, targets),
        lambda d, t: outputs.value_and_grad(
            lambda d: outputs.make_loss(jnp.sum((d - outputs.block_grad(t)) ** 2, axis=-1), normalization="batch")
        )(d),
    ),
}

METRICS = {
    "Accuracy": _metric(metrics.Accuracy(), logits, labels),
    "TopKAccuracy": _metric(metrics.TopKAccuracy(2), logits, labels),
    "ConfusionMatrix": _metric(metrics.ConfusionMatrix(4), logits, labels),
    "Mean": _metric(metrics.Mean(), targets, np.abs(targets)),
    "MSE": _metric(metrics.MSE(), logits, targets),
    "MAE": _metric(metrics.MAE(), logits, targets),
    "RMSE": _metric(metrics.RMSE(), logits, targets),
    "collection": (
        (),
        (logits, labels, targets),
        lambda p, y, t: (lambda m: m.compute(m.update(m.init(), acc=(p, y), err=(p, t))))(
            metrics.collection(acc=metrics.Accuracy(), err=metrics.MSE())
        ),
    ),
}

CASES = {
    f"{group}:{name}": case
    for group, cases in (("layer", LAYERS), ("loss", LOSSES), ("output", OUTPUTS), ("metric", METRICS))
    for name, case in cases.items()
}


@functools.cache
def _case(name):
    """``CASES[name]`` as (replicated args, batch args, fn), a layer's built once."""
    case = CASES[name]
    return case() if callable(case) else case


MESHES = {"explicit": (AxisType.Explicit,), "auto": (AxisType.Auto,)}


# These programs are tiny and compile-bound: XLA's backend optimisations would cost more
# time than they save.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _run(fn, *args):
    return jax.jit(fn).lower(*args).compile(_FAST_COMPILE)(*args)


@functools.cache
def _one_device(case):
    replicated, batch, fn = _case(case)
    return _run(fn, *replicated, *batch)


@pytest.mark.parametrize("mesh_kind", list(MESHES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.devices(4)
def test_batch_sharded_jit_equals_one_device(case, mesh_kind):
    replicated, batch, fn = _case(case)
    mesh = jax.make_mesh((4,), ("data",), axis_types=MESHES[mesh_kind])
    put = lambda tree, spec: jax.device_put(tree, NamedSharding(mesh, spec))
    with jax.set_mesh(mesh):
        sharded = _run(fn, *put(replicated, P()), *put(batch, P("data")))
    expected = _one_device(case)
    assert jax.tree.structure(sharded) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(expected)):
        want = np.asarray(want)
        # Split sums add their terms in another order: f32 rounding of the leaf's magnitude.
        scale = float(np.nanmax(np.abs(want), initial=1.0)) if want.dtype.kind == "f" else 0.0
        np.testing.assert_allclose(
            np.asarray(got), want, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{case} on the {mesh_kind} mesh"
        )


@pytest.mark.devices(4)
def test_conv_chunks_the_batch_only_where_it_is_local():
    """Conv's batch chunks (CPU, 2-D, over 32 examples) would slice across devices on a
    global mesh, so there it is one convolution; in shard_map and pmap bodies the batch
    is the device's own and is chunked."""
    layer = L.Conv(4, (3, 3))
    _, params, _ = layer.init(jax.random.key(0), (-1, 6, 6, 3))
    count = lambda f, *a: str(jax.make_jaxpr(f)(*a)).count("conv_general_dilated")  # noqa: E731
    apply = lambda x: layer.apply(params, (), x)[0]  # noqa: E731
    x = jnp.zeros((4 * 40, 6, 6, 3))
    assert count(apply, x) == 5  # 160 examples: 5 chunks of 32
    for kind in MESHES.values():
        mesh = jax.make_mesh((4,), ("data",), axis_types=kind)
        split = jax.device_put(x, NamedSharding(mesh, P("data")))
        with jax.set_mesh(mesh):
            assert distributed.on_global_mesh(x)
            assert count(apply, split) == 1
            local = jax.shard_map(apply, in_specs=P("data"), out_specs=P("data"))
            assert count(local, split) == 2  # 40 examples per device: 32 + 8
    assert not distributed.on_global_mesh(x)
    assert count(jax.pmap(apply), x.reshape(4, 40, 6, 6, 3)) == 2
    # jit over split inputs without jax.set_mesh cannot be told from one device while
    # tracing: it chunks, and the compiler's resharding keeps the values.
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    x = jnp.asarray(_randn(8, 160, 6, 6, 3))
    split = jax.device_put(x, NamedSharding(mesh, P("data")))
    assert count(apply, split) == 5
    np.testing.assert_allclose(jax.jit(apply)(split), jax.jit(apply)(x), rtol=1e-5, atol=1e-5)
