"""Upsample's modes "nearest-exact", "area" and "bicubic", and the linear modes in float64,
against torch.nn.Upsample: outputs and input gradients, float32 and float64, growing,
shrinking and same-size axes, scale factors and sizes, both align_corners."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError
from funcnet.layers import Upsample
from funcnet.testing import check_layer

from helpers.torch_ref import torch

TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}

# (spatial input, Upsample keyword arguments): integer, fractional, shrinking and per-axis
# factors and sizes; 7 at 1.1 keeps its size, 5 at 2.1 doubles.
CASES = {
    1: [
        ((5,), dict(scale_factor=1.7)),
        ((9,), dict(scale_factor=0.6)),
        ((7,), dict(scale_factor=1.1)),
        ((4,), dict(size=11)),
    ],
    2: [
        ((4, 5), dict(scale_factor=2)),
        ((7, 6), dict(scale_factor=(0.6, 1.3))),
        ((7, 7), dict(scale_factor=1.1)),
        ((5, 3), dict(scale_factor=2.1)),
        ((6, 5), dict(size=(1, 2))),
        ((8, 9), dict(size=(3, 4))),
    ],
    3: [((3, 4, 5), dict(scale_factor=(1.5, 0.7, 1.1))), ((5, 2, 4), dict(size=(2, 3, 4)))],
}
LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _cases(modes):
    for n, cases in CASES.items():
        for spatial, kwargs in cases:
            for mode, align in modes(n):
                yield spatial, kwargs, mode, align


def _torch(spatial, kwargs, mode, align, dtype):
    """torch's input x, output gradient g, output and input gradient, channels-first.

    torch's bicubic backward copies the gradient through when the output size equals the
    input size, which is not the derivative of its forward there (a scale factor such as
    1.1 that keeps 7 samples still interpolates them forward); funcnet's gradient is the
    forward's, so there the reference is the forward's adjoint, from its Jacobian."""
    rng = np.random.default_rng(zlib.crc32(repr((spatial, kwargs, mode, align)).encode()))
    x = rng.standard_normal((2, 3, *spatial)).astype(dtype)
    interpolating = mode in ("linear", "bilinear", "trilinear", "bicubic")
    up = torch.nn.Upsample(mode=mode, align_corners=align if interpolating else None, **kwargs)
    xt = torch.tensor(x, requires_grad=True)
    yt = up(xt)
    g = rng.standard_normal(tuple(yt.shape)).astype(dtype)
    (yt * torch.tensor(g)).sum().backward()
    gx = xt.grad.numpy()
    if mode == "bicubic" and tuple(yt.shape) == x.shape:
        size = int(np.prod(spatial))
        basis = torch.eye(size, dtype=xt.dtype).reshape(size, 1, *spatial)
        jacobian = up(basis).reshape(size, size).numpy()  # [input k, output j]
        gx = (g.reshape(2, 3, size) @ jacobian.T).reshape(x.shape)
    return x, g, yt.detach().numpy(), gx


def _check(cases, dtype):
    """funcnet's outputs and input gradients against torch's, channels-first data moved to
    channels-last and back; every case in one compilation (one per case is much slower)."""
    refs = [_torch(*case, dtype) for case in cases]
    layers = [Upsample(mode=mode, align_corners=align, **kwargs) for _, kwargs, mode, align in cases]
    last = lambda a: np.moveaxis(a, 1, -1)
    first = lambda a: np.moveaxis(np.asarray(a), -1, 1)

    @jax.jit
    def outputs_and_gradients(xs, gs):
        out = []
        for layer, x, g in zip(layers, xs, gs):
            y, vjp = jax.vjp(lambda x: layer.apply((), (), x)[0], x)
            out.append((y, vjp(g)[0]))
        return out

    with jax.enable_x64(dtype == np.float64):
        got = outputs_and_gradients([last(r[0]) for r in refs], [last(r[1]) for r in refs])
        shapes = [layer.init(jax.random.key(0), (-1,) + last(r[0]).shape[1:])[0] for layer, r in zip(layers, refs)]
    for layer, case, (x, g, yt, gxt), (y, gx), shape in zip(layers, cases, refs, got, shapes):
        where = f"{layer.name}, align_corners={case[3]}, {dtype.__name__}, input {x.shape}"
        assert y.dtype == dtype and shape == (-1,) + y.shape[1:], where
        np.testing.assert_allclose(first(y), yt, **TOL[dtype], err_msg=where)
        np.testing.assert_allclose(first(gx), gxt, **TOL[dtype], err_msg=where)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nearest_exact_and_area_match_torch(dtype):
    _check(list(_cases(lambda n: [("nearest-exact", False), ("area", False)])), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bicubic_matches_torch(dtype):
    cases = list(_cases(lambda n: [("bicubic", False), ("bicubic", True)] if n == 2 else []))
    assert len(cases) == 2 * len(CASES[2])
    _check(cases, dtype)


def test_linear_modes_float64_match_torch():
    """Positions and weights in float64 for float64 inputs, as torch's: float32 ones were
    1e-5 off."""
    _check(list(_cases(lambda n: [(LINEAR[n], False), (LINEAR[n], True)])), np.float64)


def test_bicubic_backward_where_torch_copies():
    """The one place funcnet's gradient is not torch's (see _torch): 7 x 7 at 1.1 keeps its
    size, torch's forward interpolates, its backward passes the gradient through as is.
    funcnet's is the derivative of the forward, which funcnet matches."""
    x, g, _, adjoint = _torch((7, 7), dict(scale_factor=1.1), "bicubic", False, np.float64)
    layer = Upsample(scale_factor=1.1, mode="bicubic")
    last = lambda a: jnp.asarray(np.moveaxis(a, 1, -1))
    with jax.enable_x64():
        gx = jax.grad(lambda x: jnp.sum(layer.apply((), (), x)[0] * last(g)))(last(x))
    gx = np.moveaxis(np.asarray(gx), -1, 1)
    np.testing.assert_allclose(gx, adjoint, rtol=1e-12, atol=1e-12)
    assert not np.allclose(gx, g, atol=0.1)


def test_new_modes_by_hand():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0], np.float32).reshape(1, 5, 1)
    # nearest-exact at 5 -> 3: floor((dst + .5) * 5 / 3) = 0, 2, 4; nearest reads 0, 1, 3.
    y = Upsample(size=3, mode="nearest-exact").apply((), (), jnp.asarray(x))[0]
    np.testing.assert_array_equal(y[0, :, 0], [0, 2, 4])
    y = Upsample(size=3).apply((), (), jnp.asarray(x))[0]
    np.testing.assert_array_equal(y[0, :, 0], [0, 1, 3])
    # area at 5 -> 2: the means of x[0:3] and x[2:5].
    y = Upsample(size=2, mode="area").apply((), (), jnp.asarray(x))[0]
    np.testing.assert_allclose(y[0, :, 0], [1.0, 3.0])
    # bicubic keeps a linear ramp linear away from the edges (the Keys kernel reproduces
    # linear functions); at the edges the clamped taps bend it.
    ramp = np.broadcast_to(np.arange(8.0, dtype=np.float32)[None, :, None, None], (1, 8, 3, 1))
    y = Upsample(size=(15, 3), mode="bicubic", align_corners=True).apply((), (), ramp)[0]
    np.testing.assert_allclose(y[0, 2:-2, 1, 0], np.arange(2, 13) / 2, atol=1e-5)
    # and it overshoots a step, as torch's does (no clamping)
    step = np.array([0.0, 0.0, 1.0, 1.0], np.float32).reshape(1, 4, 1, 1)
    y = Upsample(scale_factor=(4, 1), mode="bicubic").apply((), (), step)[0]
    assert float(y.min()) < 0 and float(y.max()) > 1


def test_new_modes_dtypes_shapes_and_contract():
    key = jax.random.key(0)
    xi = jnp.arange(12, dtype=jnp.int32).reshape(1, 3, 4, 1)
    assert Upsample(scale_factor=2, mode="nearest-exact").apply((), (), xi)[0].dtype == jnp.int32
    for mode in ("area", "bicubic"):
        y = Upsample(scale_factor=2, mode=mode).apply((), (), xi)[0]
        assert jnp.issubdtype(y.dtype, jnp.floating) and y.shape == (1, 6, 8, 1), mode
    assert Upsample(scale_factor=0.5, mode="area").init(key, (-1, 5, 4, 3, 2))[0] == (-1, 2, 2, 1, 2)
    assert Upsample(size=(4, 6), mode="bicubic").init(key, (-1, -1, -1, 3))[0] == (-1, 4, 6, 3)
    check_layer(Upsample(scale_factor=1.5, mode="bicubic", align_corners=True), (-1, 3, 4, 2), train_modes=(False,))


def test_new_modes_errors():
    key = jax.random.key(0)
    for mode in ("nearest-exact", "area"):
        with pytest.raises(
            ArgumentError,
            match=rf"align_corners=True is only for the "
            rf"interpolating modes 'linear', 'bilinear', 'trilinear', "
            rf"'bicubic'; {mode} has no corners to align",
        ):
            Upsample(scale_factor=2, mode=mode, align_corners=True)
    with pytest.raises(
        ArgumentError,
        match=r"mode must be one of 'nearest', 'nearest-exact', "
        r"'area', 'linear', 'bilinear', 'trilinear', 'bicubic', got 'cubic'",
    ):
        Upsample(scale_factor=2, mode="cubic")
    with pytest.raises(
        ArgumentError,
        match=r"mode 'bicubic' interpolates 2 spatial axes, but "
        r"size has 3 entries",
    ):
        Upsample(size=(2, 2, 2), mode="bicubic")
    with pytest.raises(
        ValueError,
        match=r"expected a rank-4 input \(N, H, W, C\) \(channels "
        r"last\), got shape \(-1, 4, 4, 4, 3\). torch's bicubic is 2-D only "
        r"too. For a rank-5 input use mode='trilinear'",
    ):
        Upsample(scale_factor=2, mode="bicubic").init(key, (-1, 4, 4, 4, 3))
    with pytest.raises(ValueError, match=r"1 to 3 spatial axes.*got shape \(2, 3\)"):
        Upsample(scale_factor=2, mode="area").apply((), (), jnp.ones((2, 3)))
    with pytest.raises(
        ValueError,
        match=r"input size 1 on axis 1 times scale_factor 0.5 is "
        r"below 1",
    ):
        Upsample(scale_factor=0.5, mode="area").init(key, (-1, 1, 3))
