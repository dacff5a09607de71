"""funcnet.layers.Dropout: statistics, keys, eval mode, errors."""

import math
import re
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from funcnet.layers.dropout import Dropout
from funcnet.testing import check_layer


def _randn(seed, *shape):
    """float32 test data from NumPy: no jax.random program to compile per shape."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_dropout_statistics_and_scaling(rate):
    init, apply = Dropout(rate)
    shape = (200, 500)
    n = math.prod(shape)
    x = np.random.default_rng(1).uniform(1.0, 2.0, shape).astype(np.float32)  # never 0
    out_shape, params, state = init(jax.random.key(0), (-1, 500))
    assert out_shape == (-1, 500) and params == () and state == ()
    y, new_state = apply(params, state, x, rng=jax.random.key(2), train=True)
    assert new_state == ()
    y, x = np.asarray(y), np.asarray(x)
    kept = y != 0
    keep = 1.0 - rate
    # kept count ~ Binomial(n, keep): allow 5 standard deviations.
    tol = 5 * math.sqrt(keep * (1 - keep) / n)
    assert abs(kept.mean() - keep) < tol, (kept.mean(), keep, tol)
    # kept values are exactly x * float32(1 / (1 - rate)); dropped ones exactly 0.
    np.testing.assert_array_equal(y[kept], x[kept] * np.float32(1.0 / keep))
    assert y.dtype == np.float32


def test_dropout_eval_identity_and_masks_depend_on_key():
    init, apply = Dropout(0.5)
    x = jnp.asarray(_randn(0, 64, 32))
    y, _ = apply((), (), x, rng=jax.random.key(1), train=False)
    np.testing.assert_array_equal(y, x)
    y_none, _ = apply((), (), x)  # eval needs no rng
    np.testing.assert_array_equal(y_none, x)
    m1 = np.asarray(apply((), (), x, rng=jax.random.key(1), train=True)[0]) != 0
    m2 = np.asarray(apply((), (), x, rng=jax.random.key(2), train=True)[0]) != 0
    m1b = np.asarray(jax.jit(lambda x, k: apply((), (), x, rng=k, train=True)[0])(x, jax.random.key(1))) != 0
    assert (m1 != m2).mean() > 0.3  # independent masks disagree on ~half the entries
    np.testing.assert_array_equal(m1, m1b)  # same key, same mask, jit or not


def test_dropout_rate_zero_is_identity_without_rng():
    x = jnp.arange(6.0).reshape(2, 3)
    y, _ = Dropout(0.0).apply((), (), x, train=True)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, float("nan"), "0.5", True, None])
def test_dropout_bad_rate(rate):
    with pytest.raises(ValueError, match=r"Dropout.*" + re.escape(repr(rate))):
        Dropout(rate)


def test_dropout_train_needs_rng():
    with pytest.raises(ValueError, match="Dropout.*rng"):
        Dropout(0.5).apply((), (), jnp.ones((2, 3)), train=True)


def test_dropout_contract():
    check_layer(Dropout(0.3), (-1, 4, 3), inputs=jnp.asarray(_randn(0, 2, 4, 3)))


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_spatial_dropout_drops_whole_channels(rate):
    from funcnet.layers.dropout import SpatialDropout

    init, apply = SpatialDropout(rate)
    x = np.random.default_rng(1).uniform(1.0, 2.0, (64, 3, 4, 50)).astype(np.float32)  # never 0
    out_shape, params, state = init(jax.random.key(0), (-1, 3, 4, 50))
    assert out_shape == (-1, 3, 4, 50) and params == () and state == ()
    y, new_state = apply(params, state, x, rng=jax.random.key(2), train=True)
    assert new_state == () and y.dtype == np.float32
    y = np.asarray(y)
    kept = y != 0
    # One draw per (example, channel), shared by every spatial position.
    channel_kept = kept[:, :1, :1, :]
    np.testing.assert_array_equal(kept, np.broadcast_to(channel_kept, kept.shape))
    n = channel_kept.size
    keep = 1.0 - rate
    assert abs(channel_kept.mean() - keep) < 5 * math.sqrt(keep * (1 - keep) / n)
    np.testing.assert_array_equal(y[kept], x[kept] * np.float32(1.0 / keep))
    # 1-D and 3-D inputs (torch's Dropout1d / Dropout3d) too.
    for shape in [(8, 5, 6), (4, 2, 3, 2, 6)]:
        y = np.asarray(apply((), (), jnp.ones(shape), rng=jax.random.key(3), train=True)[0])
        per_channel = y.reshape(shape[0], -1, shape[-1])
        assert (per_channel == per_channel[:, :1]).all()


def test_spatial_dropout_eval_rate_zero_and_keys():
    from funcnet.layers.dropout import SpatialDropout

    x = jnp.asarray(_randn(0, 4, 3, 3, 8))
    _, apply = SpatialDropout(0.5)
    np.testing.assert_array_equal(apply((), (), x)[0], x)  # eval: identity, no rng needed
    np.testing.assert_array_equal(SpatialDropout(0.0).apply((), (), x, train=True)[0], x)
    y1 = apply((), (), x, rng=jax.random.key(1), train=True)[0]
    y1_jit = jax.jit(lambda x, k: apply((), (), x, rng=k, train=True)[0])(x, jax.random.key(1))
    np.testing.assert_array_equal(y1, y1_jit)
    y2 = apply((), (), x, rng=jax.random.key(2), train=True)[0]
    assert not np.array_equal(np.asarray(y1) != 0, np.asarray(y2) != 0)


def test_spatial_dropout_errors_and_contract():
    from funcnet.layers.dropout import SpatialDropout

    for rate in (-0.1, 1.0, "0.5", None):
        with pytest.raises(ValueError, match=r"SpatialDropout.*rate.*" + re.escape(repr(rate))):
            SpatialDropout(rate)
    with pytest.raises(ValueError, match=r"SpatialDropout.*rng"):
        SpatialDropout(0.5).apply((), (), jnp.ones((2, 3, 4)), train=True)
    with pytest.raises(
        ValueError,
        match=r"SpatialDropout\(0.5\): expected a channels-last input "
        r"\(N, \*spatial, C\).*got shape \(-1, 16\). For \(N, features\) inputs "
        r"use Dropout",
    ):
        SpatialDropout(0.5).init(jax.random.key(0), (-1, 16))
    with pytest.raises(ValueError, match=r"rank 3 to 5.*got shape \(2, 2, 2, 2, 2, 2\)"):
        SpatialDropout(0.5).apply((), (), jnp.ones((2,) * 6))
    check_layer(SpatialDropout(0.3), (-1, 4, 3), inputs=jnp.asarray(_randn(0, 2, 4, 3)))
