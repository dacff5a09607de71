"""Conv and ConvTranspose: PyTorch references, shapes, init distributions, errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import F, torch

from funcnet.layers.conv import Conv, ConvTranspose
from funcnet.testing import check_layer

RNG = np.random.default_rng(0)
TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
# Where the weights come from torch, init only has to give shapes: zeros skip compiling a
# random draw for every kernel shape (about half a second each on CPU).
ZEROS = dict(W_init=jax.nn.initializers.zeros, b_init=jax.nn.initializers.zeros)


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _to_last(x):  # NC* -> N*C
    return np.moveaxis(x, 1, -1)


def _to_first(x):  # N*C -> NC*
    return np.moveaxis(np.asarray(x), -1, 1)


def _torch_conv_ref(x, w, b, n, stride, pads, dilation, groups):
    """torch convolution with explicit (lo, hi) pads per spatial axis (torch pads symmetrically
    only, so asymmetric pads are applied with F.pad first)."""
    flat = [p for lo_hi in reversed(pads) for p in lo_hi]  # F.pad lists the last axis first
    xt = F.pad(torch.tensor(x), flat)
    return TORCH_CONV[n](xt, torch.tensor(w), torch.tensor(b), stride=stride, dilation=dilation, groups=groups).numpy()


def _apply_channels_last(layer, in_shape_ncx, w_torch, b, x_ncx):
    n = x_ncx.ndim - 2
    out_shape, params, _ = layer.init(jax.random.key(0), (-1,) + _to_last(x_ncx[:1]).shape[1:])
    # torch (O, I/g, *k) -> funcnet (*k, I/g, O)
    W = np.transpose(w_torch, tuple(range(2, n + 2)) + (1, 0))
    assert params["W"].shape == W.shape and params["b"].shape == b.shape
    y, state = layer.apply({"W": jnp.asarray(W), "b": jnp.asarray(b)}, (), jnp.asarray(_to_last(x_ncx)))
    assert state == ()
    assert out_shape == (-1,) + y.shape[1:]
    return _to_first(y)


# (dims, in, out, filter, stride, padding given to Conv, explicit pads, dilation, groups)
CONV_CASES = [
    (1, 3, 4, (3,), 1, "VALID", [(0, 0)], 1, 1),
    (1, 4, 6, (3,), 2, 2, [(2, 2)], 2, 2),
    (1, 2, 3, (4,), 1, [(1, 2)], [(1, 2)], 1, 1),
    (2, 3, 4, (3, 3), 1, "VALID", [(0, 0), (0, 0)], 1, 1),
    (2, 4, 6, (3, 2), (2, 1), [(1, 1), (0, 1)], [(1, 1), (0, 1)], 1, 2),
    (2, 4, 4, (3, 3), 1, 1, [(1, 1), (1, 1)], (2, 1), 4),  # depthwise, dilated
    (2, 2, 3, (2, 3), (1, 2), [2, (0, 3)], [(2, 2), (0, 3)], (1, 2), 1),
    (3, 2, 3, (2, 2, 3), (1, 2, 1), [(1, 0), (0, 0), (1, 1)], [(1, 0), (0, 0), (1, 1)], 1, 1),
    (3, 4, 2, (3, 1, 2), 2, 1, [(1, 1)] * 3, (1, 1, 2), 2),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}d-{c[3]}-s{c[4]}-g{c[8]}")
def test_conv_matches_torch(case):
    n, cin, cout, k, stride, padding, pads, dilation, groups = case
    spatial = {1: (11,), 2: (9, 8), 3: (6, 7, 6)}[n]
    x = _randn(2, cin, *spatial)
    w = _randn(cout, cin // groups, *k)
    b = _randn(cout)
    layer = Conv(cout, k, strides=stride, padding=padding, dilation=dilation, feature_group_count=groups, **ZEROS)
    y = _apply_channels_last(layer, x.shape, w, b, x)
    ref = _torch_conv_ref(x, w, b, n, stride, pads, dilation, groups)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def _same_pads(size, k_eff, s, lower):
    """TF's SAME rule: output ceil(size / s), total pad split with the odd one at the end."""
    total = max((-(-size // s) - 1) * s + k_eff - size, 0)
    small, big = total // 2, total - total // 2
    return (big, small) if lower else (small, big)


@pytest.mark.parametrize("padding", ["SAME", "same", "SAME_LOWER"])
@pytest.mark.parametrize("stride,dilation", [(1, 1), (2, 1), (3, 2)])
@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on its own copy for even kernels
def test_conv_same_padding(padding, stride, dilation):
    x, w, b = _randn(2, 3, 10, 7), _randn(5, 3, 4, 3), _randn(5)
    layer = Conv(5, (4, 3), strides=stride, padding=padding, dilation=dilation, **ZEROS)
    y = _apply_channels_last(layer, x.shape, w, b, x)
    lower = padding == "SAME_LOWER"
    pads = [_same_pads(d, dilation * (k - 1) + 1, stride, lower) for d, k in zip((10, 7), (4, 3))]
    ref = _torch_conv_ref(x, w, b, 2, stride, pads, dilation, 1)
    assert y.shape[2:] == (-(-10 // stride), -(-7 // stride))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    if stride == 1 and not lower:  # torch's own padding="same" (stride 1 only)
        torch_same = F.conv2d(
            torch.tensor(x), torch.tensor(w), torch.tensor(b), padding="same", dilation=dilation
        ).numpy()
        np.testing.assert_allclose(y, torch_same, rtol=1e-4, atol=1e-4)


def test_conv_torch_layout_dimension_numbers():
    x, w, b = _randn(2, 4, 7, 6), _randn(6, 2, 3, 2), _randn(6)
    layer = Conv(
        6, (3, 2), strides=(2, 1), padding=1, feature_group_count=2, dimension_numbers=("NCHW", "OIHW", "NCHW"), **ZEROS
    )
    out_shape, params, _ = layer.init(jax.random.key(0), (-1, 4, 7, 6))
    assert params["W"].shape == w.shape  # stored in the requested OIHW layout
    y, _ = layer.apply({"W": jnp.asarray(w), "b": jnp.asarray(b)}, (), jnp.asarray(x))
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=(2, 1), padding=1, groups=2).numpy()
    assert out_shape == (-1,) + ref.shape[1:]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_spatial_order_follows_kernel_spec():
    # lhs "NWHC" lists W before H; filter_shape and strides follow the kernel spec "HWIO".
    x = _randn(2, 3, 9, 6)  # NCHW
    w, b = _randn(4, 3, 3, 2), _randn(4)
    layer = Conv(4, (3, 2), strides=(2, 1), dimension_numbers=("NWHC", "HWIO", "NHWC"), **ZEROS)
    xl = np.transpose(x, (0, 3, 2, 1))  # NWHC
    out_shape, _, _ = layer.init(jax.random.key(0), xl.shape)
    y, _ = layer.apply({"W": jnp.asarray(np.transpose(w, (2, 3, 1, 0))), "b": jnp.asarray(b)}, (), jnp.asarray(xl))
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=(2, 1)).numpy()
    assert out_shape == y.shape
    np.testing.assert_allclose(_to_first(y), ref, rtol=1e-4, atol=1e-4)


# The contract checks (init shape == apply shape, jit invariance, float64 gradients) compile a
# lot, so they run on two layers that between them use every option; values are checked above.
@pytest.mark.parametrize(
    "layer,in_shape",
    [
        (Conv(4, (3, 3), strides=2, padding=[(1, 0), (2, 1)], dilation=(1, 2), feature_group_count=2), (-1, 7, 9, 2)),
        (ConvTranspose(3, (3,), strides=3, padding=1, output_padding=2, dilation=2), (-1, 5, 2)),
    ],
)
def test_contract(layer, in_shape):
    check_layer(layer, in_shape, train_modes=(False,))


def test_unknown_spatial_size_stays_unknown():
    shape, _, _ = Conv(4, (3, 3), strides=2, **ZEROS).init(jax.random.key(0), (-1, -1, 9, 2))
    assert shape == (-1, -1, 4, 4)
    shape, _, _ = ConvTranspose(4, (3, 3), strides=2, **ZEROS).init(jax.random.key(0), (5, 4, -1, 2))
    assert shape == (5, 9, -1, 4)


# --------------------------------------------------------------------------- #
# ConvTranspose
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "stride,padding,output_padding,dilation",
    [
        (1, 0, 0, 1),
        (2, 1, 0, 1),
        (2, 1, 1, 1),
        (3, 0, 2, 1),
        (2, 2, 1, 2),
        ((2, 3), (1, 0), (1, 2), 1),
    ],
)
def test_conv_transpose_matches_torch(stride, padding, output_padding, dilation):
    x, w, b = _randn(2, 4, 5, 6), _randn(4, 3, 3, 2), _randn(3)  # torch weight: (in, out, *k)
    layer = ConvTranspose(
        3, (3, 2), strides=stride, padding=padding, dilation=dilation, output_padding=output_padding, **ZEROS
    )
    out_shape, params, _ = layer.init(jax.random.key(0), (-1, 5, 6, 4))
    W = np.transpose(w, (2, 3, 0, 1))  # no spatial flip needed
    assert params["W"].shape == W.shape
    y, _ = layer.apply({"W": jnp.asarray(W), "b": jnp.asarray(b)}, (), jnp.asarray(_to_last(x)))
    ref = F.conv_transpose2d(
        torch.tensor(x),
        torch.tensor(w),
        torch.tensor(b),
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
    ).numpy()
    assert out_shape == (-1,) + y.shape[1:]
    np.testing.assert_allclose(_to_first(y), ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_1d_3d_torch_layout():
    x, w, b = _randn(2, 3, 6), _randn(3, 2, 4), _randn(2)
    layer = ConvTranspose(2, (4,), strides=2, padding=1, dimension_numbers=("NCH", "IOH", "NCH"))
    y, _ = layer.apply({"W": jnp.asarray(w), "b": jnp.asarray(b)}, (), jnp.asarray(x))
    ref = F.conv_transpose1d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=2, padding=1).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    x, w, b = _randn(1, 2, 3, 4, 2), _randn(2, 3, 2, 3, 2), _randn(3)
    layer = ConvTranspose(3, (2, 3, 2), strides=(2, 1, 3), padding=0)  # k < s: not "VALID"
    y, _ = layer.apply(
        {"W": jnp.asarray(np.transpose(w, (2, 3, 4, 0, 1))), "b": jnp.asarray(b)}, (), jnp.asarray(_to_last(x))
    )
    ref = F.conv_transpose3d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=(2, 1, 3)).numpy()
    np.testing.assert_allclose(_to_first(y), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_transpose_same_is_adjoint_of_conv_same(stride):
    # <ConvT(x; W), z> == <x, Conv(z; W with in/out swapped)> for SAME convs on size in * stride.
    k, cin, cout = (3, 4), 3, 2
    W = _randn(*k, cin, cout)
    x = _randn(2, 5, 4, cin)
    convt = ConvTranspose(cout, k, strides=stride, padding="SAME", use_bias=False)
    y, _ = convt.apply({"W": jnp.asarray(W)}, (), jnp.asarray(x))
    assert y.shape == (2, 5 * stride, 4 * stride, cout)
    conv = Conv(cin, k, strides=stride, padding="SAME", use_bias=False)
    Wf = jnp.asarray(np.swapaxes(W, -1, -2))
    _, vjp = jax.vjp(lambda z: conv.apply({"W": Wf}, (), z)[0], jnp.zeros(y.shape))
    np.testing.assert_allclose(y, vjp(jnp.asarray(x))[0], rtol=1e-4, atol=1e-4)


def test_conv_transpose_valid_sizes():
    # k >= s: torch's padding=0 size (i-1)*s + k; k < s: i*s (the window never covers the end).
    for k, s, expected in [(3, 2, 11), (3, 1, 7), (2, 3, 15)]:
        shape, _, _ = ConvTranspose(1, (k,), strides=s, **ZEROS).init(jax.random.key(0), (-1, 5, 1))
        assert shape == (-1, expected, 1)


# --------------------------------------------------------------------------- #
# Initialisation
# --------------------------------------------------------------------------- #


def _assert_uniform_bound(a, bound):
    a = np.abs(np.asarray(a))
    assert a.max() <= bound and a.max() > 0.9 * bound, (a.max(), bound)


def test_conv_default_init_is_torch():
    layer = Conv(64, (3, 3), feature_group_count=2, dimension_numbers=("NCHW", "OIHW", "NCHW"))
    _, params, _ = layer.init(jax.random.key(1), (-1, 8, 5, 5))
    assert params["W"].shape == (64, 4, 3, 3) and params["W"].dtype == jnp.float32
    fan_in = 3 * 3 * 4  # prod(filter) * in / groups, as nn.Conv2d
    _assert_uniform_bound(params["W"], 1 / math.sqrt(fan_in))
    _assert_uniform_bound(params["b"], 1 / math.sqrt(fan_in))
    # same distribution as a fresh torch layer: compare the bounds torch uses
    tl = torch.nn.Conv2d(8, 64, 3, groups=2)
    _assert_uniform_bound(tl.weight.detach().numpy(), 1 / math.sqrt(fan_in))


def test_conv_transpose_default_init_is_torch():
    _, params, _ = ConvTranspose(64, (3, 2)).init(jax.random.key(1), (-1, 4, 4, 5))
    fan_in = 64 * 3 * 2  # torch reads a transposed conv's fan_in from its output channels
    _assert_uniform_bound(params["W"], 1 / math.sqrt(fan_in))
    _assert_uniform_bound(params["b"], 1 / math.sqrt(fan_in))
    tl = torch.nn.ConvTranspose2d(5, 64, (3, 2))
    _assert_uniform_bound(tl.weight.detach().numpy(), 1 / math.sqrt(fan_in))


def test_w_init_gets_canonical_shape_then_layout():
    seen = []

    def W_init(key, shape, dtype):
        seen.append(shape)
        return jnp.arange(math.prod(shape), dtype=dtype).reshape(shape)

    layer = Conv(
        6,
        (3, 2),
        feature_group_count=2,
        W_init=W_init,
        b_init=jax.nn.initializers.zeros,
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )
    _, params, _ = layer.init(jax.random.key(0), (-1, 4, 5, 5))
    assert seen == [(3, 2, 2, 6)]
    canonical = np.arange(3 * 2 * 2 * 6, dtype=np.float32).reshape(3, 2, 2, 6)
    np.testing.assert_array_equal(params["W"], np.transpose(canonical, (3, 2, 0, 1)))
    np.testing.assert_array_equal(params["b"], np.zeros(6))
    _, params, _ = Conv(3, (2,), use_bias=False, W_init=ZEROS["W_init"]).init(jax.random.key(0), (-1, 4, 2))
    assert set(params) == {"W"}


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"Conv.*unknown padding 'FULL'.*'VALID', 'SAME', 'SAME_LOWER'"):
        Conv(4, (3, 3), padding="FULL")
    with pytest.raises(ValueError, match=r"ConvTranspose.*unknown padding 'SAME_LOWER'.*'VALID', 'SAME'"):
        ConvTranspose(4, (3, 3), padding="SAME_LOWER")
    with pytest.raises(TypeError, match=r"Conv.*filter_shape must contain only ints"):
        Conv(4, (3, 2.5))
    with pytest.raises(TypeError, match=r"filter_shape must be a tuple"):
        Conv(4, 3)
    with pytest.raises(ValueError, match=r"filter_shape must be 1 to 3"):
        Conv(4, (1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"out_chan must be a positive int"):
        Conv(2.0, (3,))
    with pytest.raises(ValueError, match=r"strides must be"):
        Conv(4, (3, 3), strides=(1, 0))
    with pytest.raises(ValueError, match=r"padding must be"):
        Conv(4, (3, 3), padding=[(1, 1)])
    with pytest.raises(ValueError, match=r"padding must be"):
        Conv(4, (3,), padding=[(-1, 1)])
    with pytest.raises(ValueError, match=r"feature_group_count=3 must divide out_chan=4"):
        Conv(4, (3,), feature_group_count=3)
    with pytest.raises(ValueError, match=r"dimension_numbers"):
        Conv(4, (3, 3), dimension_numbers=("NCHW", "OIHW"))
    with pytest.raises(ValueError, match=r"invalid dimension_numbers"):
        Conv(4, (3, 3), dimension_numbers=("NCHW", "OIHX", "NCHW"))
    with pytest.raises(ValueError, match=r"output_padding.*needs explicit padding"):
        ConvTranspose(4, (3,), strides=2, output_padding=1)
    with pytest.raises(ValueError, match=r"output_padding.*smaller than the stride"):
        ConvTranspose(4, (3,), strides=2, padding=1, output_padding=2)


def test_init_errors():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"Conv\(4, \(3, 3\)\).*rank-4"):
        Conv(4, (3, 3)).init(key, (-1, 8, 3))
    with pytest.raises(TypeError, match=r"only ints"):
        Conv(4, (3, 3)).init(key, (-1, 8, 8.0, 3))
    with pytest.raises(ValueError, match=r"feature_group_count=2 must divide the input channels, got 3"):
        Conv(4, (3, 3), feature_group_count=2).init(key, (-1, 8, 8, 3))
    with pytest.raises(ValueError, match=r"channel dimension"):
        Conv(4, (3, 3)).init(key, (-1, 8, 8, -1))
    with pytest.raises(ValueError, match=r"input size 2 on axis 1 is too small"):
        Conv(4, (3, 3)).init(key, (-1, 2, 8, 3))
    with pytest.raises(ValueError, match=r"input size 4 on axis 2 is too small"):
        Conv(4, (3, 3), dilation=2).init(key, (-1, 8, 4, 3))
    with pytest.raises(ValueError, match=r"ConvTranspose.*padding"):
        ConvTranspose(4, (2,), padding=3).init(key, (-1, 1, 3))


def test_apply_errors():
    key = jax.random.key(0)
    for layer in [Conv(4, (3, 3), feature_group_count=2, **ZEROS), ConvTranspose(4, (3, 3), **ZEROS)]:
        _, params, _ = layer.init(key, (-1, 8, 8, 6))
        with pytest.raises(ValueError, match=r"expected a rank-4 input, got shape \(8, 8, 6\)"):
            layer.apply(params, (), jnp.ones((8, 8, 6)))
        with pytest.raises(ValueError, match=r"input has 3 channels on axis 3 .* built for 6"):
            jax.jit(lambda x: layer.apply(params, (), x))(jnp.ones((2, 8, 8, 3)))
    _, params, _ = Conv(4, (3, 3), **ZEROS).init(key, (-1, 8, 8, 6))
    with pytest.raises(ValueError, match=r"too small"):
        Conv(4, (3, 3)).apply(params, (), jnp.ones((2, 2, 8, 6)))


def _sum_sin(layer):
    return lambda p, x: jnp.sum(jnp.sin(layer.apply(p, (), x)[0]))


def _assert_same_values_and_grads(layer, reference, params, x):
    """``layer`` and ``reference`` give the same outputs and gradients (params and input).
    Jitted: run eagerly, every op of a backward pass is a program XLA compiles alone."""
    fwd = lambda lay: jax.jit(lambda p, x: lay.apply(p, (), x)[0])(params, x)  # noqa: E731
    np.testing.assert_allclose(fwd(layer), fwd(reference), rtol=1e-5, atol=1e-5)
    grads = lambda lay: jax.jit(jax.grad(_sum_sin(lay), (0, 1)))(params, x)  # noqa: E731
    for got, want in zip(grads(layer), grads(reference)):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), got, want)


@pytest.mark.parametrize(
    "filt,strides,padding,dilation,shape",
    [
        ((5, 5), 1, "VALID", 1, (3, 12, 12, 1)),
        ((3, 2), (2, 1), "SAME", (1, 2), (2, 9, 8, 1)),
        ((4,), 3, [(2, 1)], 1, (3, 10, 1)),
        ((2, 3, 2), (1, 2, 1), "SAME_LOWER", (1, 1, 2), (1, 5, 6, 7, 1)),
        ((5, 5), 1, "VALID", 1, (34, 28, 28, 1)),  # LeNet's conv1 (benchmark workload 3)
    ],
)
def test_one_channel_conv_takes_the_patches_path_with_the_same_values_and_grads(
    filt, strides, padding, dilation, shape
):
    """On CPU a one-channel Conv runs XLA's forward convolution with its gradients
    through the input's patches (XLA's are slow there); it must agree with
    lax.conv_general_dilated in values and both gradients."""
    make = lambda impl: Conv(4, filt, strides, padding, dilation, implementation=impl)  # noqa: E731
    auto, xla = make("auto"), make("xla")
    _, params, _ = auto.init(jax.random.PRNGKey(0), shape)
    x = jnp.asarray(np.random.default_rng(1).normal(size=shape), jnp.float32)
    _assert_same_values_and_grads(auto, xla, params, x)
    # the patches path really ran: its forward is the one convolution, both gradients
    # are matrix products / slices (XLA's path: forward, input and filter gradient)
    jaxpr = str(jax.make_jaxpr(jax.grad(_sum_sin(auto), (0, 1)))(params, x))
    assert jaxpr.count("conv_general_dilated") == 1
    assert _conv_count(xla, params, x) == 3


def test_patches_implementation_needs_the_default_layout_and_one_group():
    with pytest.raises(ValueError, match="implementation='patches' needs"):
        Conv(4, (3, 3), dimension_numbers=("NCHW", "OIHW", "NCHW"), implementation="patches")
    with pytest.raises(ValueError, match="implementation='patches' needs"):
        Conv(4, (3, 3), feature_group_count=2, implementation="patches")
    with pytest.raises(ValueError, match="implementation must be one of"):
        Conv(4, (3, 3), implementation="im2col")
    # two input channels: 'auto' stays on XLA's convolution
    layer = Conv(4, (3, 3))
    _, params, _ = layer.init(jax.random.PRNGKey(0), (1, 5, 5, 2))
    assert "conv_general_dilated" in str(
        jax.make_jaxpr(lambda x: layer.apply(params, (), x)[0])(jnp.ones((1, 5, 5, 2)))
    )


def _conv_count(layer, params, x):
    """How many convolutions the forward and backward pass trace to (traced, not run)."""
    grad = jax.grad(lambda p, x: jnp.sum(layer.apply(p, (), x)[0]), (0, 1))
    return str(jax.make_jaxpr(grad)(params, x)).count("conv_general_dilated")


@pytest.mark.parametrize(
    "kwargs,shape,pieces",
    [
        (dict(padding="SAME"), (70, 6, 6, 3), 3),  # 32 + 32 + 6
        (dict(strides=2, dimension_numbers=("NCHW", "OIHW", "NCHW")), (64, 3, 7, 7), 2),
        (dict(feature_group_count=2, dilation=2), (33, 9, 9, 4), 2),  # 32 + 1
        (dict(implementation="chunked"), (40, 9, 3), 2),  # 1-D only when asked
    ],
)
def test_batch_chunked_conv_equals_one_convolution(kwargs, shape, pieces):
    """On CPU a 2-D Conv of a batch over 32 on small images (or any Conv with
    implementation='chunked') runs XLA's convolution 32 examples at a time: values and
    both gradients as one convolution."""
    filt = (3,) * (len(shape) - 2)
    chunked = Conv(4, filt, **{"implementation": "auto", **kwargs})
    whole = Conv(4, filt, **{**kwargs, "implementation": "xla"})
    _, params, _ = chunked.init(jax.random.key(0), shape)
    x = jnp.asarray(_randn(*shape))
    _assert_same_values_and_grads(chunked, whole, params, x)
    # forward, input gradient and filter gradient: one convolution each per piece
    assert _conv_count(chunked, params, x) == 3 * pieces
    assert _conv_count(whole, params, x) == 3


def test_auto_chunks_only_large_2d_batches_of_small_images_on_cpu_and_caps_the_pieces():
    key = jax.random.key(0)
    cases = [
        ((32, 6, 6, 3), (3, 3), 1),  # 32 examples: one convolution
        ((600, 6, 6, 3), (3, 3), 16),  # at most 16 pieces (of 38)
        ((64, 16, 16, 3), (3, 3), 2),  # 16x16 positions: chunked
        ((64, 17, 16, 3), (3, 3), 1),  # more: one convolution
        ((96, 9, 3), (3,), 1),  # 1-D and 3-D: not measured to gain, one
        ((96, 4, 4, 4, 2), (2, 2, 2), 1),
    ]
    for shape, filt, pieces in cases:
        layer = Conv(2, filt, W_init=jax.nn.initializers.zeros)
        _, params, _ = layer.init(key, shape)
        x = jax.ShapeDtypeStruct(shape, jnp.float32)
        assert _conv_count(layer, params, x) == 3 * pieces, shape
