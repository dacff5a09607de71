"""Center loss: MXNet's per-sample update rule, gradients, and data-parallel reduction."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import losses

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
    return [(rng.normal(size=(batch, DIM)).astype(np.float32) + 1.0,
             rng.integers(0, NUM_CLASSES - 1, size=(batch,)))  # last class never seen
            for _ in range(n)]


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
        ref_loss, ref_centers = reference_step(ref_centers, features.astype(np.float64), labels,
                                               ALPHA)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        np.testing.assert_allclose(centers, ref_centers, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(centers)[-1] == 0)  # an unseen class keeps its center
    assert np.abs(ref_centers).sum() > 1        # the reference really moved the centers


def test_gradients_features_and_centers():
    (features, labels), = batches(1, 8, seed=1)
    centers = jnp.asarray(np.random.default_rng(2).normal(size=(NUM_CLASSES, DIM)), jnp.float32)

    def objective(c, x):
        loss, new_centers = losses.center_loss(c, x, labels, alpha=ALPHA)
        return loss, new_centers

    (loss, new_centers), (g_c, g_x) = jax.jit(
        jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(centers, features)
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
        jax.test_util.check_grads(jax.jit(lambda x: losses.center_loss(c, x, y)[0]), (x,),
                                  order=1, modes=["rev"])


def test_pmap_matches_global_batch():
    devices = 4
    assert jax.device_count() >= devices
    step = jax.pmap(
        jax.value_and_grad(lambda x, c, y: losses.center_loss(c, x, y, alpha=ALPHA,
                                                              axis_name="d"), has_aux=True),
        axis_name="d", in_axes=(0, None, 0))
    centers = jnp.asarray(np.random.default_rng(4).normal(size=(NUM_CLASSES, DIM)), jnp.float32)
    ref_centers = np.asarray(centers, np.float64)
    for features, labels in batches(2, 12, seed=5):
        (loss, new), grads = step(features.reshape(devices, 3, DIM), centers,
                                  labels.reshape(devices, 3))
        new = np.asarray(new)
        for d in range(1, devices):   # every device holds the same centers and loss
            np.testing.assert_array_equal(new[d], new[0])
            assert loss[d] == loss[0]
        ref_loss, ref_centers = reference_step(ref_centers, features.astype(np.float64), labels,
                                               ALPHA)
        np.testing.assert_allclose(new[0], ref_centers, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-6)
        # Per-device-mean gradient convention: (x - c_y) / B_local.
        expected = (features - np.asarray(centers)[labels]) / 3
        np.testing.assert_allclose(np.asarray(grads).reshape(12, DIM), expected, rtol=1e-5,
                                   atol=1e-7)
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
