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
    m1b = np.asarray(jax.jit(lambda x, k: apply((), (), x, rng=k, train=True)[0])(
        x, jax.random.key(1))) != 0
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
