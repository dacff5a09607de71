"""funcnet.layers Flatten and Reshape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch
from funcnet.layers.shape import Flatten, Reshape
from funcnet.testing import check_layer

RNG = np.random.default_rng(0)


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_flatten():
    x = _randn(3, 2, 4, 5)
    out_shape, params, state = Flatten.init(jax.random.key(0), (-1, 2, 4, 5))
    assert (out_shape, params, state) == ((-1, 40), (), ())
    y, _ = Flatten.apply((), (), jnp.asarray(x))
    np.testing.assert_array_equal(y, torch.flatten(torch.tensor(x), 1).numpy())
    check_layer(Flatten, (-1, 3, 2), train_modes=(False,))


@pytest.mark.parametrize(
    "target,expected", [((4, 10), (4, 10)), ((-1, 5), (8, 5)), (40, (40,)), ((2, -1, 2), (2, 10, 2))]
)
def test_reshape(target, expected):
    x = _randn(3, 2, 4, 5)
    out_shape, _, _ = Reshape(target).init(jax.random.key(0), (-1, 2, 4, 5))
    assert out_shape == (-1,) + expected
    y, _ = Reshape(target).apply((), (), jnp.asarray(x))
    np.testing.assert_array_equal(y, x.reshape((3,) + expected))


def test_shape_errors():
    key = jax.random.key(0)
    with pytest.raises(
        ValueError,
        match=r"Reshape\(\(3, 7\)\): cannot reshape .* \(-1, 2, 4, 5\) "
        r"\(40 elements per example\)",
    ):
        Reshape((3, 7)).init(key, (-1, 2, 4, 5))
    with pytest.raises(ValueError, match=r"Reshape\(\(3, -1\)\).*a multiple of 3"):
        Reshape((3, -1)).init(key, (-1, 2, 4, 5))
    with pytest.raises(ValueError, match=r"cannot reshape"):
        Reshape((4, 10)).apply((), (), jnp.ones((2, 6, 6)))
    with pytest.raises(ValueError, match=r"at most one -1"):
        Reshape((-1, -1))
    with pytest.raises(ValueError, match=r"at most one -1"):
        Reshape((0, 4))
    with pytest.raises(TypeError, match=r"Reshape.*shape must be an int or a tuple of ints"):
        Reshape((2, 2.0))
    with pytest.raises(ValueError, match=r"Reshape.*must be known"):
        Reshape((-1,)).init(key, (-1, -1, 3))
    with pytest.raises(ValueError, match=r"Flatten.*rank >= 2"):
        Flatten.init(key, (-1,))
    with pytest.raises(ValueError, match=r"Flatten.*rank >= 2"):
        Flatten.apply((), (), jnp.ones(3))
    with pytest.raises(TypeError, match=r"Flatten.*only ints"):
        Flatten.init(key, (-1, "3"))
