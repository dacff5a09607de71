"""PixelShuffle / PixelUnshuffle: torch.nn.PixelShuffle / PixelUnshuffle parity on the
channels-first transpose (random shapes, leading axes and factors, outputs and gradients,
float32 and float64), the channel order by hand, the inverse, shapes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError
from funcnet.layers import PixelShuffle, PixelUnshuffle
from funcnet.testing import check_layer

from helpers.torch_ref import torch

DTYPES = [np.float32, np.float64]


def _first(x):
    """(*, H, W, C) -> torch's (*, C, H, W)."""
    return np.moveaxis(np.asarray(x), -1, -3)


def _last(x):
    return np.moveaxis(np.asarray(x), -3, -1)


def _cases(rng, shuffle):
    """(lead, H, W, C, r): channels-last input sizes; 0 to 2 leading axes, r from 1 to 3."""
    for _ in range(6):
        r = int(rng.integers(1, 4))
        lead = tuple(int(d) for d in rng.integers(1, 4, rng.integers(0, 3)))
        h, w, c = (int(d) for d in rng.integers(1, 4, 3))
        yield lead, h * (1 if shuffle else r), w * (1 if shuffle else r), c * (r * r if shuffle else 1), r


def _both(layer, module, x, g):
    y, vjp = jax.vjp(lambda x: layer.apply((), (), x)[0], jnp.asarray(x))
    (gx,) = vjp(jnp.asarray(g))
    xt = torch.tensor(_first(x), requires_grad=True)
    yt = module(xt)
    (yt * torch.tensor(_first(g))).sum().backward()
    return np.asarray(y), np.asarray(gx), _last(yt.detach().numpy()), _last(xt.grad.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "unshuffle"])
def test_matches_torch(dtype, shuffle):
    rng = np.random.default_rng(1 if shuffle else 2)
    with jax.enable_x64(dtype == np.float64):
        for lead, h, w, c, r in _cases(rng, shuffle):
            layer = PixelShuffle(r) if shuffle else PixelUnshuffle(r)
            module = torch.nn.PixelShuffle(r) if shuffle else torch.nn.PixelUnshuffle(r)
            x = rng.standard_normal((*lead, h, w, c)).astype(dtype)
            out_shape = layer.init(jax.random.key(0), x.shape)[0]
            g = rng.standard_normal(out_shape).astype(dtype)
            y, gx, yt, gxt = _both(layer, module, x, g)
            where = f"{layer.name} on {x.shape}"
            assert y.dtype == dtype and y.shape == yt.shape == out_shape, where
            np.testing.assert_array_equal(y, yt, err_msg=where)  # a permutation: exact
            np.testing.assert_array_equal(gx, gxt, err_msg=where)


def test_channel_order_by_hand_and_inverse():
    """Output channel c at offset (i, j) of its 2 x 2 block reads input channel
    c * 4 + i * 2 + j: torch's order, not tf.nn.depth_to_space's (i * 2 + j) * C + c."""
    x = jnp.arange(8).reshape(1, 1, 1, 8)
    y = PixelShuffle(2).apply((), (), x)[0]
    assert y.shape == (1, 2, 2, 2) and y.dtype == x.dtype
    np.testing.assert_array_equal(y[0, :, :, 0], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(y[0, :, :, 1], [[4, 5], [6, 7]])
    z = jnp.asarray(np.random.default_rng(0).standard_normal((2, 6, 9, 4)), jnp.float32)
    back = PixelShuffle(3).apply((), (), PixelUnshuffle(3).apply((), (), z)[0])[0]
    np.testing.assert_array_equal(back, z)
    assert PixelUnshuffle(3).apply((), (), z)[0].shape == (2, 2, 3, 36)


def test_shapes_and_contract():
    key = jax.random.key(0)
    assert PixelShuffle(2).init(key, (-1, -1, 5, 12))[0] == (-1, -1, 10, 3)
    assert PixelShuffle(2).init(key, (3, 4, -1))[0] == (6, 8, -1)  # unbatched (H, W, C)
    assert PixelUnshuffle(2).init(key, (-1, 7, 4, 6, 3))[0] == (-1, 7, 2, 3, 12)
    assert PixelShuffle(1).init(key, (-1, 3, 4, 5))[0] == (-1, 3, 4, 5)
    check_layer(PixelShuffle(2), (-1, 2, 3, 8), train_modes=(False,))
    check_layer(PixelUnshuffle(2), (-1, 4, 2, 3), train_modes=(False,))
    f = jax.jit(lambda x: PixelShuffle(2).apply((), (), x)[0])
    assert f(jnp.ones((2, 3, 3, 4), jnp.bfloat16)).dtype == jnp.bfloat16


def test_errors():
    key = jax.random.key(0)
    with pytest.raises(
        ValueError,
        match=r"PixelShuffle\(2\): the input's channels \(last "
        r"axis\) must be a multiple of upscale_factor\*\*2 = 4, got 6 in shape "
        r"\(-1, 4, 4, 6\).*Conv\(4 \* C",
    ):
        PixelShuffle(2).init(key, (-1, 4, 4, 6))
    with pytest.raises(
        ValueError,
        match=r"PixelShuffle\(3\).*multiple of upscale_factor\*\*2 = "
        r"9, got 4 in shape \(2, 1, 1, 4\)",
    ):
        PixelShuffle(3).apply((), (), jnp.ones((2, 1, 1, 4)))
    with pytest.raises(
        ValueError,
        match=r"PixelUnshuffle\(2\): the input's height and width "
        r"must be multiples of downscale_factor 2, got 5 x 4 in shape "
        r"\(-1, 5, 4, 3\).*ZeroPad",
    ):
        PixelUnshuffle(2).init(key, (-1, 5, 4, 3))
    with pytest.raises(ValueError, match=r"got 4 x 3 in shape \(1, 4, 3, 1\)"):
        PixelUnshuffle(2).apply((), (), jnp.ones((1, 4, 3, 1)))
    with pytest.raises(
        ValueError,
        match=r"PixelShuffle\(2\): expected a channels-last input "
        r"\(\*, H, W, C\) of rank >= 3.*got shape \(-1, 4\)",
    ):
        PixelShuffle(2).init(key, (-1, 4))
    for bad in (0, -2, 2.0, True, None):
        with pytest.raises(
            ArgumentError,
            match=r"PixelShuffle: upscale_factor must be a "
            r"positive int",
        ):
            PixelShuffle(bad)
        with pytest.raises(
            ArgumentError,
            match=r"PixelUnshuffle: downscale_factor must be a "
            r"positive int",
        ):
            PixelUnshuffle(bad)
    # torch refuses the same inputs
    with pytest.raises(RuntimeError):
        torch.nn.PixelShuffle(2)(torch.ones(1, 6, 4, 4))
    with pytest.raises(RuntimeError):
        torch.nn.PixelUnshuffle(2)(torch.ones(1, 3, 5, 4))
