"""Upsample and ZeroPad: torch.nn.Upsample / ZeroPad{1,2,3}d parity, the contract, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch

from funcnet.layers.resize import Upsample, ZeroPad
from funcnet.testing import check_layer

RNG = np.random.default_rng(0)


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _first(x):
    return np.moveaxis(np.asarray(x), -1, 1)


def _last(x):
    return np.moveaxis(np.asarray(x), 1, -1)


def _run(layer, x_last):
    """Applies a layer to channels-last x and checks init's shape against apply's.

    Under jit: one compilation costs less than the eager ops' many small ones."""
    out_shape, params, state = layer.init(jax.random.key(0), (-1,) + x_last.shape[1:])
    assert params == () and state == ()
    y, new_state = jax.jit(lambda x: layer.apply(params, state, x))(jnp.asarray(x_last))
    assert new_state == ()
    assert out_shape == (-1,) + y.shape[1:]
    return np.asarray(y)


def _torch_upsample(x_first, mode, align_corners, **kwargs):
    align = align_corners if mode != "nearest" else None
    up = torch.nn.Upsample(mode=mode, align_corners=align, **kwargs)
    return up(torch.tensor(x_first)).numpy()


# (spatial input, Upsample keyword arguments): integer, non-integer and shrinking scale
# factors, per-axis factors, sizes; 7 samples at 1.1 keep their size (torch copies such an
# axis for 2 spatial axes only), 5 at 2.1 double (read as dst // 2 for 2 axes only).
CASES = {
    1: [
        ((5,), dict(scale_factor=2)),
        ((5,), dict(scale_factor=1.7)),
        ((9,), dict(scale_factor=0.5)),
        ((7,), dict(scale_factor=1.1)),
        ((5,), dict(scale_factor=2.1)),
        ((4,), dict(size=(11,))),
    ],
    2: [
        ((4, 5), dict(scale_factor=2)),
        ((4, 5), dict(scale_factor=1.5)),
        ((7, 6), dict(scale_factor=(0.6, 1.3))),
        ((7, 7), dict(scale_factor=1.1)),
        ((5, 3), dict(scale_factor=2.1)),
        ((3, 4), dict(size=7)),
        ((4, 5), dict(size=(1, 2))),
    ],
    3: [
        ((3, 4, 2), dict(scale_factor=2)),
        ((3, 4, 5), dict(scale_factor=(1.5, 0.7, 1.1))),
        ((3, 2, 4), dict(size=(5, 3, 4))),
    ],
}
LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _cases():
    for n, cases in CASES.items():
        for spatial, kwargs in cases:
            yield spatial, kwargs, "nearest", False
            yield spatial, kwargs, LINEAR[n], False
            yield spatial, kwargs, LINEAR[n], True


@pytest.mark.parametrize("spatial, kwargs, mode, align", list(_cases()), ids=str)
def test_upsample_matches_torch(spatial, kwargs, mode, align):
    x = _randn(2, 3, *spatial)  # NC*
    want = _torch_upsample(x, mode, align, **kwargs)
    got = _first(_run(Upsample(mode=mode, align_corners=align, **kwargs), _last(x)))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_upsample_nearest_torch_quirks_by_rank():
    """torch's nearest copies a same-size axis and halves a doubled one only for 2 spatial
    axes; with 1 or 3 it applies floor(dst / scale_factor) (in float32) everywhere."""
    ramp = np.arange(7, dtype=np.float32)
    y1 = _run(Upsample(scale_factor=1.1), ramp.reshape(1, 7, 1))
    np.testing.assert_array_equal(y1[0, :, 0], [0, 0, 1, 2, 3, 4, 5])
    y2 = _run(Upsample(scale_factor=1.1), np.broadcast_to(ramp[None, :, None, None], (1, 7, 7, 1)))
    np.testing.assert_array_equal(y2[0, :, 0, 0], ramp)
    y2 = _run(Upsample(scale_factor=2.1), np.broadcast_to(ramp[None, :5, None, None], (1, 5, 1, 1)))
    np.testing.assert_array_equal(y2[0, :, 0, 0], np.arange(10) // 2)
    # By hand: 2x nearest repeats each sample twice.
    y = _run(Upsample(scale_factor=2), np.array([1.0, 2.0, 3.0], np.float32).reshape(1, 3, 1))
    np.testing.assert_array_equal(y[0, :, 0], [1, 1, 2, 2, 3, 3])


def test_upsample_linear_by_hand():
    x = np.array([0.0, 1.0, 3.0], np.float32).reshape(1, 3, 1)
    # align_corners=True: src = dst * (3 - 1) / (5 - 1) = 0, .5, 1, 1.5, 2.
    y = _run(Upsample(size=5, mode="linear", align_corners=True), x)
    np.testing.assert_allclose(y[0, :, 0], [0, 0.5, 1, 2, 3])
    # align_corners=False, x2: src = (dst + .5) / 2 - .5 = 0 (clamped), .25, .75, 1.25, 1.75, 2.25.
    y = _run(Upsample(scale_factor=2, mode="linear"), x)
    np.testing.assert_allclose(y[0, :, 0], [0, 0.25, 0.75, 1.5, 2.5, 3], rtol=1e-6)


def test_upsample_shapes_dtypes_and_jit():
    key = jax.random.key(0)
    assert Upsample(scale_factor=2).init(key, (-1, -1, 5, 3))[0] == (-1, -1, 10, 3)
    assert Upsample(size=(4, 6)).init(key, (-1, -1, -1, 3))[0] == (-1, 4, 6, 3)
    trilinear = Upsample(scale_factor=0.5, mode="trilinear")
    assert trilinear.init(key, (2, 5, 4, 3, 1))[0] == (2, 2, 2, 1, 1)
    xi = np.arange(12, dtype=np.int32).reshape(1, 3, 4, 1)
    y = Upsample(scale_factor=2).apply((), (), jnp.asarray(xi))[0]
    assert y.dtype == jnp.int32 and y.shape == (1, 6, 8, 1)
    y = Upsample(scale_factor=2, mode="bilinear").apply((), (), jnp.asarray(xi))[0]
    assert jnp.issubdtype(y.dtype, jnp.floating)
    np.testing.assert_allclose(y, _run(Upsample(scale_factor=2, mode="bilinear"), xi.astype(np.float32)), rtol=1e-6)
    x = jnp.asarray(_randn(2, 4, 5, 3))
    layer = Upsample(scale_factor=1.5, mode="bilinear")
    np.testing.assert_allclose(
        jax.jit(lambda x: layer.apply((), (), x)[0])(x), layer.apply((), (), x)[0], rtol=1e-6, atol=1e-6
    )


def test_upsample_gradient_matches_torch():
    x = _randn(2, 3, 4, 5)
    ct = _randn(2, 3, 7, 9)
    xt = torch.tensor(x, requires_grad=True)
    up = torch.nn.Upsample(size=(7, 9), mode="bilinear", align_corners=False)
    (up(xt) * torch.tensor(ct)).sum().backward()
    layer = Upsample(size=(7, 9), mode="bilinear")
    g = jax.grad(lambda x: jnp.sum(layer.apply((), (), x)[0] * _last(ct)))(jnp.asarray(_last(x)))
    np.testing.assert_allclose(_first(g), xt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_upsample_contract():
    check_layer(Upsample(scale_factor=2), (-1, 3, 4, 2), train_modes=(False,))
    check_layer(Upsample(size=(5, 7), mode="bilinear", align_corners=True), (-1, 3, 4, 2), train_modes=(False,))


def test_upsample_errors():
    key = jax.random.key(0)
    with pytest.raises(
        ValueError,
        match=r"Upsample.*exactly one of scale_factor .* or size .*"
        r"got both",
    ):
        Upsample(scale_factor=2, size=(4, 4))
    with pytest.raises(ValueError, match=r"Upsample.*exactly one of scale_factor.*got neither"):
        Upsample()
    with pytest.raises(
        ValueError,
        match=r"Upsample.*mode must be one of 'nearest', "
        r"'nearest-exact', 'area', 'linear', 'bilinear', 'trilinear', 'bicubic', "
        r"got 'cubic'",
    ):
        Upsample(scale_factor=2, mode="cubic")
    with pytest.raises(ValueError, match=r"align_corners=True is only for the interpolating"):
        Upsample(scale_factor=2, align_corners=True)
    with pytest.raises(TypeError, match=r"align_corners must be True or False"):
        Upsample(scale_factor=2, mode="bilinear", align_corners=None)
    for bad in (0, -2, float("nan"), "2", (2, 0), (), (1, 2, 3, 4)):
        with pytest.raises(ValueError, match=r"scale_factor must be a positive number"):
            Upsample(scale_factor=bad)
    with pytest.raises(ValueError, match=r"size must be a positive int"):
        Upsample(size=(4, 2.5))
    with pytest.raises(
        ValueError,
        match=r"mode 'bilinear' interpolates 2 spatial axes, but "
        r"scale_factor has 3 entries",
    ):
        Upsample(scale_factor=(2, 2, 2), mode="bilinear")
    # Wrong rank, at init and at apply, with the layout and the right mode named.
    with pytest.raises(
        ValueError,
        match=r"Upsample.*expected a rank-4 input \(N, H, W, C\) "
        r"\(channels last\), got shape \(-1, 8, 3\). For a rank-3 input use "
        r"mode='linear'",
    ):
        Upsample(scale_factor=2, mode="bilinear").init(key, (-1, 8, 3))
    with pytest.raises(
        ValueError,
        match=r"expected a rank-4 input.*got shape \(2, 8, 8, 8, 3\)"
        r".*mode='trilinear'",
    ):
        Upsample(scale_factor=2, mode="bilinear").apply((), (), jnp.ones((2, 8, 8, 8, 3)))
    with pytest.raises(
        ValueError,
        match=r"Upsample.*1 to 3 spatial axes \(rank 3 to 5.*got "
        r"shape \(-1, 3\)",
    ):
        Upsample(scale_factor=2).init(key, (-1, 3))
    with pytest.raises(ValueError, match=r"1 to 3 spatial axes.*got shape \(2, 3\)"):
        Upsample(scale_factor=2).apply((), (), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"expected a rank-4 input.*got shape \(-1, 4, 3\)"):
        Upsample(size=(4, 4)).init(key, (-1, 4, 3))
    with pytest.raises(
        ValueError,
        match=r"input size 1 on axis 2 times scale_factor 0.5 is "
        r"below 1",
    ):
        Upsample(scale_factor=0.5).init(key, (-1, 4, 1, 3))
    with pytest.raises(TypeError, match=r"expected an array input"):
        Upsample(scale_factor=2).apply((), (), [[1.0]])


@pytest.mark.parametrize(
    "padding, torch_pad, spatial",
    [
        (1, 1, (3,)),
        ((2, 0), (2, 0), (4,)),  # (left, right) on (N, L, C)
        (((1, 3),), (1, 3), (4,)),
        (2, 2, (3, 4)),
        ((1, 2), (2, 2, 1, 1), (3, 4)),  # (pad_h, pad_w)
        (((0, 1), (3, 2)), (3, 2, 0, 1), (3, 4)),  # ((top, bottom), (left, right))
        (1, 1, (2, 3, 2)),
        (((1, 0), 2, (0, 1)), (0, 1, 2, 2, 1, 0), (2, 3, 2)),
    ],
)
def test_zero_pad_matches_torch(padding, torch_pad, spatial):
    x = _randn(2, 3, *spatial)
    pad = {1: torch.nn.ZeroPad1d, 2: torch.nn.ZeroPad2d, 3: torch.nn.ZeroPad3d}[len(spatial)]
    want = pad(torch_pad)(torch.tensor(x)).numpy()
    got = _first(_run(ZeroPad(padding), _last(x)))
    np.testing.assert_array_equal(got, want)


def test_zero_pad_shapes_and_contract():
    key = jax.random.key(0)
    assert ZeroPad(((1, 2), (0, 3))).init(key, (-1, -1, 5, 2))[0] == (-1, -1, 8, 2)
    assert ZeroPad((1, 2)).init(key, (4, 5, 2))[0] == (4, 8, 2)
    y = ZeroPad(1).apply((), (), jnp.ones((1, 1, 1, 1), jnp.int32))[0]
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(y[0, :, :, 0], [[0, 0, 0], [0, 1, 0], [0, 0, 0]])
    check_layer(ZeroPad(((1, 0), (2, 1))), (-1, 3, 2, 2), train_modes=(False,))


def test_zero_pad_errors():
    key = jax.random.key(0)
    for bad in (-1, (1, -1), ((1, 2, 3), 0), 1.5, "same", True, (), ((1, 2),) * 4):
        with pytest.raises(ValueError, match=r"ZeroPad.*padding must be a non-negative int"):
            ZeroPad(bad)
    with pytest.raises(
        ValueError,
        match=r"flat 4-tuple is ambiguous.*ZeroPad2d's \(left, right, "
        r"top, bottom\) is \(\(top, bottom\), \(left, right\)\) here",
    ):
        ZeroPad((1, 2, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"padding has 2 entries, one per spatial axis, so it "
        r"expects a rank-4 input \(N, H, W, C\).*got shape \(-1, 2, 3, 4, 5\)",
    ):
        ZeroPad(((1, 1), (0, 0))).init(key, (-1, 2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"expects a rank-4 input.*or a rank-3 input \(N, L, C\)"):
        ZeroPad((1, 2)).apply((), (), jnp.ones((2, 3, 4, 5, 6)))
    with pytest.raises(
        ValueError,
        match=r"padding has 3 entries.*rank-5.*got shape "
        r"\(-1, 4, 5, 3\)",
    ):
        ZeroPad((1, 1, 1)).init(key, (-1, 4, 5, 3))
    with pytest.raises(ValueError, match=r"ZeroPad\(1\).*1 to 3 spatial axes.*got shape \(-1, 3\)"):
        ZeroPad(1).init(key, (-1, 3))
