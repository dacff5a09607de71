"""funcnet.losses against PyTorch (the reference semantics) and explicit formulas."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import F, torch
from jax.test_util import check_grads

from funcnet import losses

RNG = np.random.default_rng(0)
TOL = dict(rtol=2e-5, atol=2e-6)


def t(x):
    return torch.from_numpy(np.array(x))


def close(ours, ref, **tol):
    np.testing.assert_allclose(np.asarray(ours), ref.detach().numpy(), **(tol or TOL))


# --------------------------------------------------------------------------- #
# cross_entropy / nll_loss with class ids
# --------------------------------------------------------------------------- #

N, D1, C = 6, 3, 5
LOGITS = RNG.normal(size=(N, D1, C)).astype(np.float32) * 2
LABELS = RNG.integers(0, C, size=(N, D1))
WEIGHT = RNG.uniform(0.2, 2.0, size=(C,)).astype(np.float32)


def _labels_with_ignored(ignore_index):
    labels = LABELS.copy()
    if ignore_index is not None:
        labels[0, 0] = labels[2, 1] = labels[5, 2] = ignore_index
    return labels


CE_CASES = list(itertools.product(["mean", "sum", "none"], [False, True], [None, -100, 1], [0.0, 0.3]))


@pytest.mark.parametrize("reduction,weighted,ignore_index,smoothing", CE_CASES)
def test_cross_entropy_class_ids_match_torch(reduction, weighted, ignore_index, smoothing):
    labels = _labels_with_ignored(ignore_index)
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    if ignore_index is not None:
        kw["ignore_index"] = ignore_index
    weight = WEIGHT if weighted else None
    # funcnet: classes last, (N, d1, C); torch: classes on axis 1, (N, C, d1).
    ours = losses.cross_entropy(LOGITS, labels, weight=weight, **kw)
    ref = F.cross_entropy(t(LOGITS).movedim(-1, 1), t(labels), weight=None if weight is None else t(weight), **kw)
    close(ours, ref)
    # axis=1 takes torch's layout unchanged.
    ours_ax1 = losses.cross_entropy(np.moveaxis(LOGITS, -1, 1), labels, weight=weight, axis=1, **kw)
    close(ours_ax1, ref)


@pytest.mark.parametrize("reduction,weighted,ignore_index", [(r, w, i) for r, w, i, s in CE_CASES if s == 0.0])
def test_nll_loss_matches_torch(reduction, weighted, ignore_index):
    labels = _labels_with_ignored(ignore_index)
    log_probs = np.asarray(jax.nn.log_softmax(LOGITS, axis=-1))
    kw = dict(reduction=reduction)
    if ignore_index is not None:
        kw["ignore_index"] = ignore_index
    weight = WEIGHT if weighted else None
    ours = losses.nll_loss(log_probs, labels, weight=weight, **kw)
    ref = F.nll_loss(t(log_probs).movedim(-1, 1), t(labels), weight=None if weight is None else t(weight), **kw)
    close(ours, ref)


def test_nll_loss_takes_no_log():
    # Arbitrary (non-normalised) inputs: nll is just -x[y], so the log must not be taken.
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    y = np.array([0, 2, 1, 2])
    close(losses.nll_loss(x, y, reduction="none"), torch.tensor(-x[np.arange(4), y]))


def test_cross_entropy_2d_and_1d_inputs():
    x = LOGITS[:, 0]
    y = LABELS[:, 0]
    close(
        losses.cross_entropy(x, y, weight=WEIGHT, label_smoothing=0.1),
        F.cross_entropy(t(x), t(y), weight=t(WEIGHT), label_smoothing=0.1),
    )
    close(losses.cross_entropy(x[0], y[0]), F.cross_entropy(t(x[0]), t(y[0])))


def test_all_ignored_mean_is_nan_like_torch():
    y = np.full((N, D1), -100)
    ours = losses.cross_entropy(LOGITS, y)
    ref = F.cross_entropy(t(LOGITS).movedim(-1, 1), t(y))
    assert np.isnan(float(ours)) and torch.isnan(ref)
    assert float(losses.cross_entropy(LOGITS, y, reduction="sum")) == 0.0


@pytest.mark.parametrize(
    "reduction,weighted,smoothing", list(itertools.product(["mean", "sum", "none"], [False, True], [0.0, 0.25]))
)
def test_cross_entropy_probability_targets_match_torch(reduction, weighted, smoothing):
    probs = RNG.dirichlet(np.ones(C), size=(N, D1)).astype(np.float32)
    weight = WEIGHT if weighted else None
    ours = losses.cross_entropy(LOGITS, probs, weight=weight, reduction=reduction, label_smoothing=smoothing)
    ref = F.cross_entropy(
        t(LOGITS).movedim(-1, 1),
        t(probs).movedim(-1, 1),
        weight=None if weight is None else t(weight),
        reduction=reduction,
        label_smoothing=smoothing,
    )
    close(ours, ref)
    ours_ax1 = losses.cross_entropy(
        np.moveaxis(LOGITS, -1, 1),
        np.moveaxis(probs, -1, 1),
        weight=weight,
        reduction=reduction,
        label_smoothing=smoothing,
        axis=1,
    )
    close(ours_ax1, ref)


def test_one_hot_targets_equal_class_ids():
    y = LABELS[:, 0]
    one_hot = np.eye(C, dtype=np.float32)[y]
    np.testing.assert_allclose(
        losses.cross_entropy(LOGITS[:, 0], one_hot), losses.cross_entropy(LOGITS[:, 0], y), rtol=1e-6
    )


def test_cross_entropy_grad_matches_torch():
    labels = _labels_with_ignored(1)
    g = jax.grad(lambda x: losses.cross_entropy(x, labels, weight=WEIGHT, ignore_index=1, label_smoothing=0.2))(LOGITS)
    x = t(LOGITS.copy()).movedim(-1, 1).requires_grad_()
    F.cross_entropy(x, t(labels), weight=t(WEIGHT), ignore_index=1, label_smoothing=0.2).backward()
    close(g, x.grad.movedim(1, -1))


# --------------------------------------------------------------------------- #
# Invalid labels
# --------------------------------------------------------------------------- #


def test_bad_labels_raise():
    x = LOGITS[:, 0]
    with pytest.raises(ValueError, match=r"class ids in \[0, 5\)"):
        losses.cross_entropy(x, np.array([0, 1, 5, 2, 0, 1]))
    with pytest.raises(ValueError, match=r"\[-1\]"):
        losses.nll_loss(x, np.array([0, 1, -1, 2, 0, 1]))
    with pytest.raises(ValueError, match="without the class axis"):
        losses.cross_entropy(x, np.zeros((6, 1), np.int32))
    with pytest.raises(ValueError, match="pass them as floats"):
        losses.cross_entropy(x, np.zeros((6, C), np.int32))
    with pytest.raises(ValueError, match="probability targets"):
        losses.cross_entropy(x, np.zeros((6,), np.float32))
    with pytest.raises(TypeError, match="integer class ids"):
        losses.nll_loss(x, np.zeros((6,), np.float32))
    with pytest.raises(TypeError, match="integer class ids or float"):
        losses.cross_entropy(x, np.zeros((6,), bool))
    with pytest.raises(TypeError, match="floating dtype"):
        losses.cross_entropy(np.zeros((6, C), np.int32), np.zeros((6,), np.int32))
    with pytest.raises(ValueError, match="weight must hold one value per class"):
        losses.cross_entropy(x, LABELS[:, 0], weight=np.ones(C + 1, np.float32))
    with pytest.raises(ValueError, match="reduction"):
        losses.cross_entropy(x, LABELS[:, 0], reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        losses.cross_entropy(x, LABELS[:, 0], label_smoothing=1.5)
    with pytest.raises(ValueError, match="axis"):
        losses.cross_entropy(x, LABELS[:, 0], axis=2)
    with pytest.raises(ValueError, match="ignore_index is not supported"):
        losses.cross_entropy(x, np.full((6, C), 0.2, np.float32), ignore_index=0)
    with pytest.raises(ValueError, match="class ids"):
        losses.multiclass_hinge(x, np.array([0, 1, 7, 2, 0, 1]))


def test_out_of_range_labels_under_jit_are_nan():
    x = LOGITS[:, 0]
    y = jnp.array([0, 1, 5, -1, -100, 2])
    ce = jax.jit(lambda x, y: losses.cross_entropy(x, y, reduction="none", label_smoothing=0.1))
    out = np.asarray(ce(x, y))
    assert np.isnan(out[2]) and np.isnan(out[3])  # out of range, negative not wrapped
    assert out[4] == 0.0  # ignore_index
    ref = F.cross_entropy(t(x[[0, 1, 5]]), t(np.array([0, 1, 2])), reduction="none", label_smoothing=0.1)
    close(out[[0, 1, 5]], ref)
    mean = jax.jit(lambda x, y: losses.nll_loss(x, y, weight=WEIGHT))(x, y)
    assert np.isnan(float(mean))
    mh = jax.jit(lambda x, y: losses.multiclass_hinge(x, y, reduction="none"))(x, y)
    assert np.isnan(mh[2]) and np.isnan(mh[3]) and np.isfinite(mh[0])


def test_jit_matches_eager():
    labels = _labels_with_ignored(-100)
    f = lambda x, y: losses.cross_entropy(x, y, weight=WEIGHT, label_smoothing=0.1)
    np.testing.assert_allclose(jax.jit(f)(LOGITS, labels), f(LOGITS, labels), rtol=1e-6)


# --------------------------------------------------------------------------- #
# Binary cross-entropy, regression and margin losses
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "reduction,pos,weighted", list(itertools.product(["mean", "sum", "none"], [False, True], [False, True]))
)
def test_sigmoid_bce_matches_torch(reduction, pos, weighted):
    x = RNG.normal(size=(7, 4)).astype(np.float32) * 3
    y = RNG.uniform(size=(7, 4)).astype(np.float32)
    y[:3] = np.round(y[:3])
    pw = RNG.uniform(0.5, 3, size=(4,)).astype(np.float32) if pos else None
    w = RNG.uniform(0.5, 2, size=(7, 1)).astype(np.float32) if weighted else None
    ours = losses.sigmoid_binary_cross_entropy(x, y, pos_weight=pw, weight=w, reduction=reduction)
    ref = F.binary_cross_entropy_with_logits(
        t(x), t(y), pos_weight=None if pw is None else t(pw), weight=None if w is None else t(w), reduction=reduction
    )
    close(ours, ref)


def test_sigmoid_bce_checks():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="shape"):
        losses.sigmoid_binary_cross_entropy(x, np.zeros((3,), np.float32))
    with pytest.raises(ValueError, match="pos_weight"):
        losses.sigmoid_binary_cross_entropy(x, x, pos_weight=np.ones(3, np.float32))
    # bool labels and integer weights are accepted
    close(losses.sigmoid_binary_cross_entropy(x, x > 1, pos_weight=2), torch.tensor(np.log(2.0)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses_match_torch(reduction):
    p = RNG.normal(size=(5, 3)).astype(np.float32) * 2
    y = RNG.normal(size=(5, 3)).astype(np.float32)
    close(losses.mse(p, y, reduction=reduction), F.mse_loss(t(p), t(y), reduction=reduction))
    close(losses.mae(p, y, reduction=reduction), F.l1_loss(t(p), t(y), reduction=reduction))
    for delta in (0.5, 1.0, 2.5):
        close(
            losses.huber(p, y, delta=delta, reduction=reduction),
            F.huber_loss(t(p), t(y), delta=delta, reduction=reduction),
        )
    with pytest.raises(ValueError, match="same shape|shape of predictions"):
        losses.mse(p, y[:, :1])
    with pytest.raises(ValueError, match="delta"):
        losses.huber(p, y, delta=0.0)


@pytest.mark.parametrize(
    "reduction,margin,weighted", list(itertools.product(["mean", "sum", "none"], [1.0, 0.5], [False, True]))
)
def test_multiclass_hinge_matches_torch_multi_margin(reduction, margin, weighted):
    x = RNG.normal(size=(8, C)).astype(np.float32)
    y = RNG.integers(0, C, size=(8,))
    w = WEIGHT if weighted else None
    ours = losses.multiclass_hinge(x, y, margin=margin, weight=w, reduction=reduction)
    ref = F.multi_margin_loss(t(x), t(y), p=1, margin=margin, weight=None if w is None else t(w), reduction=reduction)
    close(ours, ref)


def test_hinge_both_label_conventions():
    s = RNG.normal(size=(10,)).astype(np.float32) * 2
    signs = np.where(RNG.uniform(size=10) > 0.5, 1, -1)
    expected = np.mean([max(0.0, 1.0 - yi * si) for yi, si in zip(signs, s)])
    np.testing.assert_allclose(losses.hinge(s, signs), expected, rtol=1e-6)
    np.testing.assert_allclose(losses.hinge(s, (signs + 1) // 2), expected, rtol=1e-6)
    np.testing.assert_allclose(
        losses.hinge(s, (signs > 0).astype(np.float32), reduction="sum"), expected * 10, rtol=1e-6
    )
    with pytest.raises(ValueError, match=r"\{-1, 1\} or in \{0, 1\}"):
        losses.hinge(s, np.arange(10) % 3 - 1)
    with pytest.raises(ValueError, match=r"\{-1, 1\} or in \{0, 1\}"):
        losses.hinge(s, np.full(10, 2))


def test_smooth_l1_matches_mxnet_formula():
    x = np.array([-3.0, -1.0, -0.3, 0.0, 0.2, 0.24, 0.26, 0.9, 1.0, 2.0], np.float32)
    for sigma in (1.0, 2.0, 0.5):
        expected = [
            0.5 * (sigma * v) ** 2 if abs(v) < 1 / sigma**2 else abs(v) - 0.5 / sigma**2 for v in x.astype(np.float64)
        ]
        np.testing.assert_allclose(losses.smooth_l1(x, scalar=sigma), expected, rtol=1e-6, atol=1e-7)
    assert losses.smooth_l1(x.reshape(2, 5)).shape == (2, 5)
    with pytest.raises(ValueError, match="scalar"):
        losses.smooth_l1(x, scalar=-1.0)


# --------------------------------------------------------------------------- #
# Gradients (float64, central differences)
# --------------------------------------------------------------------------- #


def test_gradients_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        x = rng.normal(size=(4, 2, 3))
        y = rng.integers(0, 3, size=(4, 2))
        y[0, 0] = -100
        w = rng.uniform(0.5, 2, size=(3,))
        probs = rng.dirichlet(np.ones(3), size=(4, 2))
        grad = lambda f, *a: check_grads(jax.jit(f), a, order=1, modes=["rev"], atol=1e-6, rtol=1e-6)
        grad(lambda x: losses.cross_entropy(x, y, weight=w, label_smoothing=0.2), x)
        grad(lambda x: losses.cross_entropy(x, probs, weight=w, label_smoothing=0.1), x)
        grad(lambda x: losses.nll_loss(x, y, weight=w, reduction="sum"), x)
        p = rng.normal(size=(5, 3))
        target = rng.normal(size=(5, 3))  # differences are far from the kinks at 0 / ±delta
        binary = rng.uniform(size=(5, 3))
        grad(lambda p: losses.sigmoid_binary_cross_entropy(p, binary, pos_weight=w), p)
        grad(lambda p: losses.mse(p, target), p)
        grad(lambda p: losses.mae(p, target), p)
        grad(lambda p: losses.huber(p, target, delta=0.7), p)
        grad(lambda p: losses.smooth_l1(p - target, scalar=1.5).sum(), p)
        grad(lambda p: losses.hinge(p, np.sign(target)), p)
        grad(lambda p: losses.multiclass_hinge(p[:4], y[:, 0].clip(0), weight=w), p)


# --------------------------------------------------------------------------- #
# center_loss: explicit centers, against a per-sample loop reference
# --------------------------------------------------------------------------- #

NUM_CLASSES, DIM, ALPHA = 5, 3, 0.5


def reference_step(centers, features, labels, alpha):
    """Plain-loop reference: loss and MXNet's center update from the centers passed in."""
    centers = np.asarray(centers, np.float64)
    batch = len(labels)
    loss = 0.0
    for i in range(batch):
        d = features[i] - centers[labels[i]]
        loss += float(d @ d)
    loss /= 2 * batch
    new = centers.copy()
    for j in range(centers.shape[0]):
        members = [i for i in range(batch) if labels[i] == j]
        if not members:
            continue
        acc = np.zeros(centers.shape[1])
        for i in members:
            acc += features[i] - centers[j]
        new[j] = centers[j] + alpha * acc / (1 + len(members))
    return loss, new


def batches(n, batch, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=(batch, DIM)).astype(np.float32) + 1.0,
            rng.integers(0, NUM_CLASSES - 1, size=(batch,)),
        )  # last class never seen
        for _ in range(n)
    ]


def test_init():
    c = losses.center_loss_init(NUM_CLASSES, DIM)
    assert c.shape == (NUM_CLASSES, DIM) and c.dtype == jnp.float32 and not c.any()
    assert losses.center_loss_init(2, 4, jnp.float16).dtype == jnp.float16
    with pytest.raises(ValueError, match="num_classes"):
        losses.center_loss_init(0, 4)
    with pytest.raises(ValueError, match="feature_dim"):
        losses.center_loss_init(3, 2.0)


def test_update_matches_loop_reference_over_batches():
    step = jax.jit(functools.partial(losses.center_loss, alpha=ALPHA))
    centers = losses.center_loss_init(NUM_CLASSES, DIM)
    ref_centers = np.zeros((NUM_CLASSES, DIM))
    for features, labels in batches(4, 9):
        loss, centers = step(centers, features, labels)
        ref_loss, ref_centers = reference_step(ref_centers, features.astype(np.float64), labels, ALPHA)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        np.testing.assert_allclose(centers, ref_centers, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(centers)[-1] == 0)  # an unseen class keeps its center
    assert np.abs(ref_centers).sum() > 1  # the reference really moved the centers


def test_gradients_features_and_centers():
    ((features, labels),) = batches(1, 8, seed=1)
    centers = jnp.asarray(np.random.default_rng(2).normal(size=(NUM_CLASSES, DIM)), jnp.float32)

    def objective(c, x):
        loss, new_centers = losses.center_loss(c, x, labels, alpha=ALPHA)
        return loss, new_centers

    (loss, new_centers), (g_c, g_x) = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(
        centers, features
    )
    expected = (features - np.asarray(centers)[labels]) / len(labels)
    np.testing.assert_allclose(g_x, expected, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(g_c) == 0.0)
    ref_loss, ref_centers = reference_step(centers, features, labels, ALPHA)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(new_centers, ref_centers, rtol=1e-5, atol=1e-6)


def test_gradient_check_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        x = rng.normal(size=(6, DIM))
        y = rng.integers(0, NUM_CLASSES, size=(6,))
        c = rng.normal(size=(NUM_CLASSES, DIM))
        jax.test_util.check_grads(jax.jit(lambda x: losses.center_loss(c, x, y)[0]), (x,), order=1, modes=["rev"])


@pytest.mark.devices(4)
def test_pmap_matches_global_batch():
    devices = 4
    assert jax.device_count() >= devices
    step = jax.pmap(
        jax.value_and_grad(lambda x, c, y: losses.center_loss(c, x, y, alpha=ALPHA, axis_name="d"), has_aux=True),
        axis_name="d",
        in_axes=(0, None, 0),
    )
    centers = jnp.asarray(np.random.default_rng(4).normal(size=(NUM_CLASSES, DIM)), jnp.float32)
    ref_centers = np.asarray(centers, np.float64)
    for features, labels in batches(2, 12, seed=5):
        (loss, new), grads = step(features.reshape(devices, 3, DIM), centers, labels.reshape(devices, 3))
        new = np.asarray(new)
        for d in range(1, devices):  # every device holds the same centers and loss
            np.testing.assert_array_equal(new[d], new[0])
            assert loss[d] == loss[0]
        ref_loss, ref_centers = reference_step(ref_centers, features.astype(np.float64), labels, ALPHA)
        np.testing.assert_allclose(new[0], ref_centers, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-6)
        # Per-device-mean gradient convention: (x - c_y) / B_local.
        expected = (features - np.asarray(centers)[labels]) / 3
        np.testing.assert_allclose(np.asarray(grads).reshape(12, DIM), expected, rtol=1e-5, atol=1e-7)
        centers = jnp.asarray(new[0])


def test_bad_inputs():
    c = losses.center_loss_init(NUM_CLASSES, DIM)
    x = np.zeros((4, DIM), np.float32)
    y = np.array([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"class ids in \[0, 5\)"):
        losses.center_loss(c, x, np.array([0, 1, 5, 3]))
    with pytest.raises(ValueError, match="features must be"):
        losses.center_loss(c, np.zeros((4, DIM + 1), np.float32), y)
    with pytest.raises(ValueError, match="labels must be"):
        losses.center_loss(c, x, y[:3])
    with pytest.raises(ValueError, match="centers must be"):
        losses.center_loss(c[0], x, y)
    with pytest.raises(TypeError, match="integer"):
        losses.center_loss(c, x, y.astype(np.float32))
    with pytest.raises(ValueError, match="alpha"):
        losses.center_loss(c, x, y, alpha=-0.1)


def test_out_of_range_under_jit():
    c = losses.center_loss_init(NUM_CLASSES, DIM)
    x = np.ones((3, DIM), np.float32)
    loss, new = jax.jit(losses.center_loss)(c, x, jnp.array([0, 9, -1]))
    assert np.isnan(float(loss))
    # Only the valid sample moves its center: 0.5 * 1 / (1 + 1).
    np.testing.assert_allclose(new[0], np.full(DIM, 0.25))
    assert np.all(np.asarray(new)[1:] == 0) and np.all(np.isfinite(new))


# reduction="sum_mean": sum over each example's non-batch axes, mean over axis 0
# --------------------------------------------------------------------------- #

SM_SHAPE = (4, 3, 2)  # two non-batch axes, so "sum over them" is not a plain sum


def _sum_mean(elementwise):
    e = np.asarray(elementwise, np.float64)
    return e.reshape(e.shape[0], -1).sum(axis=1).mean()


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def _sm_inputs():
    rng = np.random.default_rng(7)
    p = rng.normal(size=SM_SHAPE).astype(np.float32) * 2
    y = rng.normal(size=SM_SHAPE).astype(np.float32)
    return p, y, (p - y).astype(np.float64)


def test_sum_mean_regression_losses_equal_the_formula():
    p, y, d = _sm_inputs()
    huber = lambda d, k: np.where(np.abs(d) < k, 0.5 * d * d, k * (np.abs(d) - 0.5 * k))  # noqa: E731
    cases = {
        "mse": (losses.mse(p, y, reduction="sum_mean"), d**2),
        "mae": (losses.mae(p, y, reduction="sum_mean"), np.abs(d)),
        "huber": (losses.huber(p, y, delta=0.7, reduction="sum_mean"), huber(d, 0.7)),
    }
    for sigma in (1.0, 2.0):
        s2 = sigma * sigma
        mx = np.where(np.abs(d) < 1 / s2, 0.5 * s2 * d * d, np.abs(d) - 0.5 / s2)
        cases[f"smooth_l1-{sigma}"] = (losses.smooth_l1(p - y, scalar=sigma, reduction="sum_mean"), mx)
    for name, (ours, elementwise) in cases.items():
        assert ours.shape == (), name
        np.testing.assert_allclose(ours, _sum_mean(elementwise), rtol=1e-5, err_msg=name)


def test_sum_mean_binary_losses_equal_the_formula():
    rng = np.random.default_rng(8)
    x = rng.normal(size=SM_SHAPE).astype(np.float32) * 3
    y = rng.uniform(size=SM_SHAPE).astype(np.float32)
    pw = rng.uniform(0.5, 3, size=(2,)).astype(np.float32)
    w = rng.uniform(0.5, 2, size=(4, 1, 1)).astype(np.float32)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    bce = -(pw * y64 * _log_sigmoid(x64) + (1 - y64) * _log_sigmoid(-x64)) * w
    ours = losses.sigmoid_binary_cross_entropy(x, y, pos_weight=pw, weight=w, reduction="sum_mean")
    np.testing.assert_allclose(ours, _sum_mean(bce), rtol=1e-5)
    plain = -(y64 * _log_sigmoid(x64) + (1 - y64) * _log_sigmoid(-x64))
    np.testing.assert_allclose(
        losses.sigmoid_binary_cross_entropy(x, y, reduction="sum_mean"), _sum_mean(plain), rtol=1e-5
    )
    signs = np.where(y > 0.5, 1, -1)
    np.testing.assert_allclose(
        losses.hinge(x, signs, reduction="sum_mean"), _sum_mean(np.maximum(0.0, 1.0 - signs * x64)), rtol=1e-5
    )


def test_sum_mean_classification_losses_equal_the_formula():
    labels = _labels_with_ignored(1)
    x_torch = t(LOGITS).permute(0, 2, 1)  # torch's (N, C, d1) layout
    per_element = F.cross_entropy(
        x_torch, t(labels), weight=t(WEIGHT), ignore_index=1, label_smoothing=0.3, reduction="none"
    ).numpy()
    ours = losses.cross_entropy(
        LOGITS, labels, weight=WEIGHT, ignore_index=1, label_smoothing=0.3, reduction="sum_mean"
    )
    np.testing.assert_allclose(ours, _sum_mean(per_element), rtol=1e-5)
    log_p = np.asarray(jax.nn.log_softmax(LOGITS, axis=-1))
    per_element = F.nll_loss(t(log_p).permute(0, 2, 1), t(labels), ignore_index=1, reduction="none").numpy()
    np.testing.assert_allclose(
        losses.nll_loss(log_p, labels, ignore_index=1, reduction="sum_mean"), _sum_mean(per_element), rtol=1e-5
    )
    probs = np.asarray(jax.nn.softmax(RNG.normal(size=LOGITS.shape), axis=-1), np.float32)
    per_element = -(probs * log_p).sum(axis=-1)
    np.testing.assert_allclose(
        losses.cross_entropy(LOGITS, probs, reduction="sum_mean"), _sum_mean(per_element), rtol=1e-5
    )
    scores = LOGITS[:, 0]
    per_example = F.multi_margin_loss(t(scores), t(LABELS[:, 0]), reduction="none").numpy()
    np.testing.assert_allclose(
        losses.multiclass_hinge(scores, LABELS[:, 0], reduction="sum_mean"), _sum_mean(per_example), rtol=1e-5
    )


def test_sum_mean_shapes():
    p, y, _ = _sm_inputs()
    assert losses.mse(p, y, reduction="none").shape == SM_SHAPE
    assert losses.mse(p, y, reduction="sum_mean").shape == ()
    assert losses.smooth_l1(p).shape == SM_SHAPE  # MXNet's default stays elementwise
    # One value per example: "sum_mean" is the mean.
    np.testing.assert_allclose(
        losses.mae(p[:, 0, 0], y[:, 0, 0], reduction="sum_mean"), losses.mae(p[:, 0, 0], y[:, 0, 0]), rtol=1e-6
    )
    # It is N times smaller than "sum" and D times larger than "mean" (D = 6 per example).
    total = losses.huber(p, y, reduction="sum")
    np.testing.assert_allclose(losses.huber(p, y, reduction="sum_mean"), total / 4, rtol=1e-6)
    np.testing.assert_allclose(losses.huber(p, y, reduction="sum_mean"), losses.huber(p, y) * 6, rtol=1e-6)
    jitted = jax.jit(lambda p, y: losses.mse(p, y, reduction="sum_mean"))(p, y)
    np.testing.assert_allclose(jitted, losses.mse(p, y, reduction="sum_mean"), rtol=1e-6)


def test_sum_mean_needs_a_batch_axis():
    with pytest.raises(ValueError, match=r"funcnet.losses.mse: reduction='sum_mean'.*batch"):
        losses.mse(np.float32(1.0), np.float32(0.0), reduction="sum_mean")
    with pytest.raises(ValueError, match=r"funcnet.losses.cross_entropy: reduction='sum_mean'"):
        losses.cross_entropy(LOGITS[0, 0], np.int32(1), reduction="sum_mean")


@pytest.mark.parametrize(
    "call",
    [
        lambda r: losses.mse(np.ones(3, np.float32), np.ones(3, np.float32), reduction=r),
        lambda r: losses.smooth_l1(np.ones(3, np.float32), reduction=r),
        lambda r: losses.sigmoid_binary_cross_entropy(np.ones(3, np.float32), np.ones(3), reduction=r),
        lambda r: losses.cross_entropy(LOGITS, LABELS, reduction=r),
    ],
    ids=["mse", "smooth_l1", "bce", "cross_entropy"],
)
def test_unknown_reduction_lists_the_valid_ones(call):
    with pytest.raises(
        ValueError,
        match=r"reduction must be one of 'mean', 'sum', 'sum_mean', 'none', "
        r"got 'batchmean'",
    ):
        call("batchmean")


def test_sum_mean_gradient_is_the_formulas():
    p, y, _ = _sm_inputs()
    grad = jax.grad(lambda p: losses.mse(p, y, reduction="sum_mean"))(jnp.asarray(p))
    # d/dp (1/N) sum_n sum_i (p - y)^2 = 2 (p - y) / N, N = 4 examples
    np.testing.assert_allclose(grad, 2 * (p - y) / SM_SHAPE[0], rtol=1e-5, atol=1e-7)


def test_one_hot_labels_and_torch_layout_get_the_right_hint():
    logits = jnp.zeros((4, 3))
    one_hot = jax.nn.one_hot(jnp.array([0, 2, 1, 0]), 3)
    with pytest.raises(
        TypeError,
        match=r"nll_loss: labels must be integer class ids, got dtype "
        r"float32 of the inputs' shape \(4, 3\): one-hot.*argmax\(-1\)",
    ):
        losses.nll_loss(jax.nn.log_softmax(logits), one_hot)
    # Classes on axis 1, torch's (N, C, d1) layout: the shapes fit axis=1 only.
    torch_logits, labels = jnp.zeros((2, 3, 5)), jnp.zeros((2, 5), jnp.int32)
    for loss in (losses.cross_entropy, losses.nll_loss):
        with pytest.raises(
            ValueError,
            match=r"fit classes on axis 1 \(PyTorch's \(N, C, d1, "
            r"...\) layout\): pass axis=1",
        ):
            loss(torch_logits, labels)
        loss(torch_logits, labels, axis=1)
    with pytest.raises(ValueError, match=r"multiclass_hinge.*axis 1.*jnp.moveaxis\(scores, 1, -1\)"):
        losses.multiclass_hinge(torch_logits, labels)


def test_multiclass_hinge_checks_its_margin():
    scores, labels = jnp.zeros((2, 3)), jnp.array([0, 2])
    for bad in ("1", None, float("nan")):
        with pytest.raises(ValueError, match="multiclass_hinge: margin"):
            losses.multiclass_hinge(scores, labels, margin=bad)
    # any real margin, as torch's multi_margin_loss (a negative one included)
    np.testing.assert_allclose(losses.multiclass_hinge(scores, labels, margin=-0.5), 0.0)
