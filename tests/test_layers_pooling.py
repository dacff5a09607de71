"""MaxPool, AvgPool, GlobalAvgPool: PyTorch and explicit-loop references, shapes, errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import F, torch

from funcnet.layers.pooling import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, GlobalAvgPool, MaxPool, MaxUnpool
from funcnet.testing import check_layer

RNG = np.random.default_rng(0)


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _run(layer, x_last):
    """Applies a pooling layer to channels-last x and checks init's shape against apply's."""
    out_shape, params, state = layer.init(jax.random.key(0), (-1,) + x_last.shape[1:])
    assert params == () and state == ()
    y, new_state = layer.apply(params, state, jnp.asarray(x_last))
    assert new_state == ()
    assert out_shape == (-1,) + y.shape[1:]
    return np.asarray(y)


def _first(x):
    return np.moveaxis(np.asarray(x), -1, 1)


def _last(x):
    return np.moveaxis(np.asarray(x), 1, -1)


TORCH_POOL = {
    ("max", 1): F.max_pool1d,
    ("max", 2): F.max_pool2d,
    ("max", 3): F.max_pool3d,
    ("avg", 1): F.avg_pool1d,
    ("avg", 2): F.avg_pool2d,
    ("avg", 3): F.avg_pool3d,
}

# (spatial input, window, strides or None, torch padding (symmetric ints))
POOL_CASES = [
    ((9,), (3,), 2, 1),
    ((7, 8), (2, 2), None, 0),
    ((7, 8), (3, 3), 2, 1),
    ((9, 6), (3, 2), (2, 1), (1, 0)),
    ((5, 6, 4), (2, 3, 2), (1, 2, 2), (1, 1, 0)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pools_match_torch(case):
    spatial, window, strides, pad = case
    n = len(window)
    x = _randn(2, 3, *spatial)  # NC*
    xt = torch.tensor(x)
    stride_t = window if strides is None else strides
    got = _first(_run(MaxPool(window, strides, padding=pad), _last(x)))
    want = TORCH_POOL["max", n](xt, window, stride_t, pad).numpy()
    np.testing.assert_array_equal(got, want)
    for include in (True, False):
        got = _first(_run(AvgPool(window, strides, padding=pad, count_include_pad=include), _last(x)))
        want = TORCH_POOL["avg", n](xt, window, stride_t, pad, count_include_pad=include).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _loop_pool(x, window, strides, pads, op, include_pad):
    """Explicit loops over a channels-last (N, H, W, C) input with (lo, hi) pads."""
    (plh, phh), (plw, phw) = pads
    N, H, W, C = x.shape
    oh = (H + plh + phh - window[0]) // strides[0] + 1
    ow = (W + plw + phw - window[1]) // strides[1] + 1
    out = np.zeros((N, oh, ow, C), np.float64)
    for i, j in itertools.product(range(oh), range(ow)):
        rows = [r for r in range(i * strides[0] - plh, i * strides[0] - plh + window[0]) if 0 <= r < H]
        cols = [c for c in range(j * strides[1] - plw, j * strides[1] - plw + window[1]) if 0 <= c < W]
        patch = x[:, rows][:, :, cols].reshape(N, -1, C)
        if op == "max":
            out[:, i, j] = patch.max(1)
        else:
            out[:, i, j] = patch.sum(1) / (window[0] * window[1] if include_pad else patch.shape[1])
    return out


@pytest.mark.parametrize(
    "padding,pads",
    [
        ("SAME", [(0, 1), (0, 1)]),  # TF rule: out = ceil(in / s), the odd pad at the end
        ("same_lower", [(1, 0), (1, 0)]),
        ([(1, 0), (0, 2)], [(1, 0), (0, 2)]),
    ],
)
def test_pools_asymmetric_padding_match_loops(padding, pads):
    x = _randn(2, 7, 6, 3)
    window, strides = (2, 3), (2, 2)
    for layer, op, include in [
        (MaxPool(window, strides, padding), "max", None),
        (AvgPool(window, strides, padding), "avg", True),
        (AvgPool(window, strides, padding, count_include_pad=False), "avg", False),
    ]:
        got = _run(layer, x)
        np.testing.assert_allclose(got, _loop_pool(x, window, strides, pads, op, include), rtol=1e-5, atol=1e-6)


def test_global_avg_pool():
    for shape in [(2, 5, 3), (2, 4, 5, 3), (2, 2, 3, 4, 3)]:
        x = _randn(*shape)
        got = _run(GlobalAvgPool, x)
        assert got.shape == (2, 3)
        want = F.adaptive_avg_pool1d(torch.tensor(_first(x)).flatten(2), 1)[..., 0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert GlobalAvgPool.init(None, (-1, 7, 7, 16))[0] == (-1, 16)


def test_integer_inputs():
    x = np.arange(2 * 4 * 4 * 1, dtype=np.int32).reshape(2, 4, 4, 1)
    y, _ = MaxPool((2, 2)).apply((), (), jnp.asarray(x))
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(y[0, :, :, 0], [[5, 7], [13, 15]])
    y, _ = AvgPool((2, 2)).apply((), (), jnp.asarray(x))
    assert jnp.issubdtype(y.dtype, jnp.floating)
    np.testing.assert_allclose(y[0, :, :, 0], [[2.5, 4.5], [10.5, 12.5]])


def test_contract():
    check_layer(MaxPool((2, 3), strides=(2, 1), padding="SAME"), (-1, 5, 6, 2), train_modes=(False,))
    check_layer(AvgPool((3,), strides=2, padding=1, count_include_pad=False), (-1, 8, 2), train_modes=(False,))
    check_layer(GlobalAvgPool, (-1, 3, 4, 2), train_modes=(False,), grad_check=False)


def test_errors():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"MaxPool.*unknown padding 'FULL'.*'VALID', 'SAME', 'SAME_LOWER'"):
        MaxPool((2, 2), padding="FULL")
    with pytest.raises(
        ValueError,
        match=r"AvgPool.*padding 2 on spatial axis 0 is more than half "
        r"the window: window 2, so padding may be at most 1",
    ):
        AvgPool((2, 2), padding=2)
    with pytest.raises(
        ValueError,
        match=r"AvgPool.*padding \(\(2, 0\), \(0, 0\)\) must be smaller "
        r"than the window \(2, 2\)",
    ):
        AvgPool((2, 2), padding=[(2, 0), (0, 0)])
    with pytest.raises(TypeError, match=r"window_shape must be a tuple"):
        MaxPool(2)
    with pytest.raises(TypeError, match=r"window_shape must contain only ints"):
        AvgPool((2, 2.0))
    with pytest.raises(ValueError, match=r"strides must be"):
        MaxPool((2, 2), strides=(2,))
    with pytest.raises(ValueError, match=r"MaxPool\(\(2, 2\)\).*rank-4"):
        MaxPool((2, 2)).init(key, (-1, 8, 3))
    with pytest.raises(TypeError, match=r"only ints"):
        AvgPool((2, 2)).init(key, (-1, 8, None, 3))
    with pytest.raises(ValueError, match=r"input size 1 on axis 2 is too small"):
        AvgPool((2, 2)).init(key, (-1, 8, 1, 3))
    with pytest.raises(ValueError, match=r"expected a rank-4 input, got shape \(8, 8, 3\)"):
        MaxPool((2, 2)).apply((), (), jnp.ones((8, 8, 3)))
    with pytest.raises(ValueError, match=r"GlobalAvgPool.*rank >= 3"):
        GlobalAvgPool.init(key, (-1, 3))
    with pytest.raises(ValueError, match=r"GlobalAvgPool.*rank >= 3"):
        GlobalAvgPool.apply((), (), jnp.ones((2, 3)))


@pytest.mark.parametrize(
    "window, shape", [((2, 2), (3, 8, 6, 4)), ((3,), (2, 10, 3)), ((2, 3), (2, 7, 8, 3)), ((2, 2, 2), (1, 4, 5, 4, 2))]
)
def test_tiled_maxpool_fast_path_equals_reduce_window_with_ties(window, shape):
    """MaxPool with strides == window and VALID padding takes the reshape path; it must give
    reduce_window's values and gradients, ties (first maximum wins) and -inf included."""
    from jax import lax

    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, size=shape).astype(np.float32)  # many ties
    x.flat[::7] = -np.inf
    layer = MaxPool(window)
    _, params, state = layer.init(jax.random.key(0), (-1,) + shape[1:])
    dims = (1,) + window + (1,)
    ref = lambda x: lax.reduce_window(x, -np.inf, lax.max, dims, dims, "VALID")
    fast = lambda x: layer.apply(params, state, x)[0]
    np.testing.assert_array_equal(jax.jit(fast)(x), jax.jit(ref)(x))
    ct = rng.normal(size=jax.eval_shape(ref, x).shape).astype(np.float32)
    # jitted (a max and its routed cotangents round nothing, so the bits hold either way)
    vjp = lambda f: jax.jit(lambda x, ct: jax.vjp(f, x)[1](ct)[0])(x, ct)  # noqa: E731
    np.testing.assert_array_equal(vjp(fast), vjp(ref))
    # ...and really is the fast path: no select-and-scatter in the gradient.
    grad_jaxpr = str(jax.make_jaxpr(lambda x: jax.vjp(fast, x)[1](ct))(x))
    assert "select_and_scatter" not in grad_jaxpr and "reduce_window" not in grad_jaxpr
    overlapping = MaxPool(window, strides=(1,) * len(window))
    assert "reduce_window" in str(jax.make_jaxpr(lambda x: overlapping.apply((), (), x)[0])(x))


def test_global_max_pool_matches_torch():
    from funcnet.layers.pooling import GlobalMaxPool

    pool = jax.jit(lambda x: GlobalMaxPool.apply((), (), x)[0])  # one compilation per shape
    for shape in [(2, 5, 3), (2, 4, 5, 3), (2, 2, 3, 4, 3)]:
        x = _randn(*shape)
        assert GlobalMaxPool.init(None, (-1,) + shape[1:])[0] == (-1, 3)
        got = np.asarray(pool(x))
        assert got.shape == (2, 3)
        want = F.adaptive_max_pool1d(torch.tensor(_first(x)).flatten(2), 1)[..., 0].numpy()
        np.testing.assert_array_equal(got, want)
    assert GlobalMaxPool.init(None, (-1, 7, 7, 16))[0] == (-1, 16)


def test_global_max_pool_ties_nan_and_integers():
    """With ties the whole gradient goes to the first maximum in row-major order, as
    torch.nn.AdaptiveMaxPool2d(1) (jnp.max would split it); a NaN wins, as in torch."""
    from funcnet.layers.pooling import GlobalMaxPool

    rng = np.random.default_rng(1)
    x = rng.integers(-2, 3, size=(3, 4, 5, 2)).astype(np.float32)  # many ties
    x[0, :, :, 1] = 0.0  # a constant channel: every position ties
    x[1, 2, 3, 0] = np.nan
    x[2, :, :, 0] = -np.inf
    ct = rng.normal(size=(3, 2)).astype(np.float32)
    xt = torch.tensor(_first(x), requires_grad=True)
    yt = torch.nn.AdaptiveMaxPool2d(1)(xt).flatten(1)
    (yt * torch.tensor(ct)).sum().backward()

    @jax.jit
    def value_and_input_grad(x, ct):
        y, vjp = jax.vjp(lambda x: GlobalMaxPool.apply((), (), x)[0], x)
        return y, vjp(ct)[0]

    y, g = value_and_input_grad(jnp.asarray(x), ct)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(_first(g), xt.grad.numpy())
    assert np.isnan(y[1, 0]) and y[2, 0] == -np.inf
    xi = np.arange(24, dtype=np.int32).reshape(2, 3, 4, 1)
    yi, _ = GlobalMaxPool.apply((), (), jnp.asarray(xi))
    assert yi.dtype == jnp.int32
    np.testing.assert_array_equal(yi, [[11], [23]])


def test_global_max_pool_contract_and_errors():
    from funcnet.layers.pooling import GlobalMaxPool

    check_layer(GlobalMaxPool, (-1, 3, 4, 2), train_modes=(False,))
    with pytest.raises(ValueError, match=r"GlobalMaxPool.*rank >= 3"):
        GlobalMaxPool.init(jax.random.key(0), (-1, 3))
    with pytest.raises(ValueError, match=r"GlobalMaxPool.*rank >= 3"):
        GlobalMaxPool.apply((), (), jnp.ones((2, 3)))


def test_new_pools_trace_with_a_symbolic_batch():
    # jax.export's symbolic batch (funcnet.inference.export): no NumPy work on the batch size
    b = jax.export.symbolic_shape("b")[0]
    x = jax.ShapeDtypeStruct((b, 4, 4, 3), jnp.float32)
    for layer in (
        MaxPool((2, 2), return_indices=True),
        MaxPool((2, 2), dilation=2),
        AvgPool((3, 3), 2, 1, ceil_mode=True),
        AdaptiveAvgPool((3, 3)),
        AdaptiveMaxPool((3, 2), return_indices=True),
    ):
        jax.export.export(jax.jit(lambda v, layer=layer: layer.apply((), (), v)[0]))(x)
    v = jax.ShapeDtypeStruct((b, 2, 2, 3), jnp.float32)
    i = jax.ShapeDtypeStruct((b, 2, 2, 3), jnp.int32)
    unpool = MaxUnpool((2, 2))
    exported = jax.export.export(jax.jit(lambda v, i: unpool.apply((), (), (v, i))[0]))(v, i)
    assert str(exported.out_avals[0]) == "float32[b,4,4,3]"
