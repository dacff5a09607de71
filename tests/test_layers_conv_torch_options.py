"""Conv's padding_mode and ConvTranspose's groups against torch.nn.Conv*d / ConvTranspose*d:
random configurations, weights copied from torch, the output and every gradient (input,
weight, bias), in float32 and float64; and the inputs torch refuses, refused here.

Most of the time is XLA compiling: each test's configurations run as one jitted function
(one compilation per dimension and dtype), on a few fixed input shapes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError
from funcnet.layers.conv import Conv, ConvTranspose

from helpers.torch_ref import torch

F = torch.nn.functional

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-10)]
MODES = ("reflect", "replicate", "circular")
CONFIGS = 20
# One input size per dimensionality (batch, spatial...); channels vary with the config.
SIZES = {1: (2, 7), 2: (2, 6, 5), 3: (1, 4, 5, 3)}
ZEROS = dict(W_init=jax.nn.initializers.zeros, b_init=jax.nn.initializers.zeros)
TORCH_LAYOUT = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}


def _spatial_perm(n, in_first):
    """torch's (A, B, *k) weight -> funcnet's channels-last (*k, A, B) or (*k, B, A)."""
    return tuple(range(2, n + 2)) + ((0, 1) if in_first else (1, 0))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """torch's small convolutions run several times faster on one thread than contending
    with XLA's for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _init(layer, shape):
    """``init``'s output shape and its params' shapes, traced only: running it would compile
    each new kernel shape's initializer."""
    out = []
    params = jax.eval_shape(lambda k: out.append(layer.init(k, (-1, *shape))) or out[0][1], jax.random.key(0))
    return out[0][0], params


def _check(got, want, tol, what, cfg):
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol, err_msg=f"{what}: {cfg}")


def _run_all(cases, dtype, tol):
    """``cases``: (layer, x, W, b, g, channels_first, torch_fn, cfg). All the layers' values
    and gradients of ``sum(y * g)`` in one jitted call, then each compared with torch's."""

    def loss(params_and_inputs, gs):
        # the configurations do not interact: the gradient of the sum is each one's own
        ys = [layer.apply(p, (), x)[0] for (layer, *_), (p, x) in zip(cases, params_and_inputs)]
        return sum(jnp.sum(y * g) for y, g in zip(ys, gs)), ys

    def run(args):
        grads, ys = jax.grad(loss, has_aux=True)([a[:2] for a in args], [a[2] for a in args])
        return [(y, tuple(gr)) for y, gr in zip(ys, grads)]

    def ours(x_ncx, channels_first):
        return x_ncx if channels_first else np.moveaxis(x_ncx, 1, -1)

    def theirs(a, channels_first):
        return np.asarray(a) if channels_first else np.moveaxis(np.asarray(a), -1, 1)

    args = []
    for layer, x, W, b, g, cf, _, _ in cases:
        p = {"W": jnp.asarray(W, dtype)}
        if b is not None:
            p["b"] = jnp.asarray(b, dtype)
        args.append((p, jnp.asarray(ours(x, cf), dtype), jnp.asarray(ours(g, cf), dtype)))
    results = jax.jit(run)(args)
    for (layer, x, W, b, g, cf, torch_fn, cfg), (y, (gp, gx)) in zip(cases, results):
        xt = torch.tensor(x, requires_grad=True)
        wt = torch.tensor(cfg["torch_w"], requires_grad=True)
        bt = None if b is None else torch.tensor(b, requires_grad=True)
        yt = torch_fn(xt, wt, bt)
        (yt * torch.tensor(g)).sum().backward()
        _check(theirs(y, cf), yt.detach().numpy(), tol, "output", cfg)
        _check(theirs(gx, cf), xt.grad.numpy(), tol, "input gradient", cfg)
        w_grad = gp["W"] if cf else np.transpose(np.asarray(gp["W"]), np.argsort(cfg["perm"]))
        _check(w_grad, wt.grad.numpy(), tol, "weight gradient", cfg)
        if b is not None:
            _check(gp["b"], bt.grad.numpy(), tol, "bias gradient", cfg)
        else:
            assert set(gp) == {"W"}


# --------------------------------------------------------------------------- #
# Conv padding_mode
# --------------------------------------------------------------------------- #

# torch's refusals, and the words funcnet's error must use for the same reason
CONV_REASONS = [
    ("should be less than the corresponding input dimension", r"needs padding smaller than the input size"),
    ("wrapping around more than once", r"needs padding at most the input size"),
    ("Kernel size can't be greater than actual input size", r"empty|too small"),
    ("Output size is too small", r"empty|too small|larger than the output"),
    ("output padding must be smaller than either stride or dilation", r"output_padding.*smaller than"),
]


def _refused_alike(refusal, build):
    """funcnet refuses (at construction or init) what torch refused, for the same reason."""
    [pattern] = [ours for theirs, ours in CONV_REASONS if theirs in refusal]
    with pytest.raises(ValueError, match=pattern):  # ArgumentError is a ValueError
        build()


def _torch_refusal(fn):
    try:
        with torch.no_grad():
            fn()
    except RuntimeError as e:
        return str(e)
    return None


def _conv_config(rng, n, mode, dtype, refused):
    """``refused`` collects torch's refusals met on the way (each checked refused here)."""
    """A random Conv{n}d with ``padding_mode=mode``: its funcnet layer, torch's function
    (``nn.Conv*d`` itself for symmetric and "same" padding; ``F.pad`` in the mode, then a
    convolution, for funcnet's asymmetric pads), inputs and weights."""
    batch, *sizes = SIZES[n]
    groups = int(rng.choice([1, 1, 2]))
    cin, cout = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
    k = tuple(int(v) for v in rng.integers(1, 4, n))
    dilation = tuple(int(v) for v in rng.integers(1, 3, n))
    kind = rng.choice(["int", "pairs", "same"])
    stride = (1,) * n if kind == "same" else tuple(int(v) for v in rng.integers(1, 3, n))
    # torch decides: reflect wants pads below the size, circular at most the size, and
    # every mode a padded input at least the (dilated) window; what it refuses, funcnet must
    # refuse too (then a smaller window is drawn).
    while True:
        if kind == "int":
            p = int(rng.integers(0, 4))
            if rng.random() < 0.15:  # at torch's limits: the smallest size, or one more
                p = min(sizes) + int(rng.integers(0, 2))
            pads = [(p, p)] * n
        elif kind == "pairs":
            pads = [tuple(int(v) for v in rng.integers(0, 4, 2)) for _ in range(n)]
        else:
            totals = [d * (kk - 1) for d, kk in zip(dilation, k)]
            pads = [(t // 2, t - t // 2) for t in totals]
        padding = {"int": pads[0][0], "pairs": pads, "same": "SAME"}[kind]
        x1, w1 = torch.zeros(1, 1, *sizes), torch.zeros(1, 1, *k)
        if kind == "pairs":
            flat = [v for lo_hi in reversed(pads) for v in lo_hi]  # F.pad: last axis first
            refusal = _torch_refusal(
                lambda: getattr(F, f"conv{n}d")(F.pad(x1, flat, mode=mode), w1, stride=stride, dilation=dilation)
            )
        else:
            refusal = _torch_refusal(
                lambda: getattr(torch.nn, f"Conv{n}d")(
                    1,
                    1,
                    k,
                    stride=stride,
                    padding="same" if kind == "same" else padding,
                    dilation=dilation,
                    padding_mode=mode,
                    bias=False,
                )(x1)
            )
        if refusal is None:
            break
        _refused_alike(
            refusal,
            lambda: _init(
                Conv(1, k, strides=stride, padding=padding, dilation=dilation, padding_mode=mode), tuple(sizes) + (1,)
            ),
        )
        refused.append(refusal)
        dilation = (1,) * n
        k = tuple(min(kk, 2) for kk in k)
    use_bias = bool(rng.integers(0, 4))  # mostly on
    channels_first = bool(rng.integers(0, 2))
    impl = "xla"
    if not channels_first and groups == 1:
        impl = str(rng.choice(["xla", "chunked", "patches"]))
    layer = Conv(
        cout,
        k,
        strides=stride,
        padding=padding,
        dilation=dilation,
        feature_group_count=groups,
        use_bias=use_bias,
        padding_mode=mode,
        implementation=impl,
        dimension_numbers=TORCH_LAYOUT[n] if channels_first else None,
        **ZEROS,
    )
    w = rng.standard_normal((cout, cin // groups) + k).astype(dtype)
    b = rng.standard_normal(cout).astype(dtype) if use_bias else None
    x = rng.standard_normal((batch, cin, *sizes)).astype(dtype)

    if kind == "pairs":
        flat = [v for lo_hi in reversed(pads) for v in lo_hi]  # F.pad: last axis first

        def torch_fn(xt, wt, bt):
            conv = getattr(F, f"conv{n}d")
            return conv(F.pad(xt, flat, mode=mode), wt, bt, stride=stride, dilation=dilation, groups=groups)
    else:
        module = getattr(torch.nn, f"Conv{n}d")(
            cin,
            cout,
            k,
            stride=stride,
            padding="same" if kind == "same" else padding,
            dilation=dilation,
            groups=groups,
            bias=use_bias,
            padding_mode=mode,
            dtype=torch.float64 if dtype == np.float64 else torch.float32,
        )

        def torch_fn(xt, wt, bt):
            # the module's own forward (its F.pad amounts and mode), with our tensors
            weights = {"weight": wt} if bt is None else {"weight": wt, "bias": bt}
            return torch.func.functional_call(module, weights, (xt,))

    # the shape init computes (without running the layer) is checked against torch's too
    shape, params = _init(layer, x.shape[1:] if channels_first else x.shape[2:] + (cin,))
    perm = _spatial_perm(n, in_first=False)
    W = w if channels_first else np.transpose(w, perm)
    assert params["W"].shape == W.shape
    cfg = dict(
        n=n,
        mode=mode,
        k=k,
        stride=stride,
        dilation=dilation,
        padding=padding,
        groups=groups,
        cin=cin,
        cout=cout,
        bias=use_bias,
        impl=impl,
        channels_first=channels_first,
        torch_w=w,
        perm=perm,
        shape=shape,
    )
    ref_shape = torch_fn(torch.tensor(x), torch.tensor(w), None).shape
    want = (-1,) + (tuple(ref_shape[1:]) if channels_first else tuple(ref_shape[2:]) + (cout,))
    assert shape == want, cfg
    g = rng.standard_normal(tuple(ref_shape)).astype(dtype)
    return layer, x, W, b, g, channels_first, torch_fn, cfg


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on even kernels
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_conv_padding_modes_match_torch(n, dtype, tol):
    rng = np.random.default_rng(100 * n + (dtype == np.float64))
    refused = []
    with jax.enable_x64(dtype == np.float64):
        cases = [_conv_config(rng, n, mode, dtype, refused) for _ in range(CONFIGS) for mode in MODES]
        _run_all(cases, dtype, tol)
    assert len(refused) >= 1, refused


def test_padding_modes_on_every_path_and_layout():
    """Chunked batches (over 32 examples), patches, and a kernel spec whose spatial order
    differs from the input's: the pads land on the right axes in every case."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 1, 6, 5)).astype(np.float32)
    w = rng.standard_normal((3, 1, 3, 2)).astype(np.float32)
    pads = [(2, 0), (1, 3)]  # (H, W)
    flat = [1, 3, 2, 0]
    for mode in MODES:
        ref = F.conv2d(F.pad(torch.tensor(x), flat, mode=mode), torch.tensor(w)).numpy()
        for impl in ("chunked", "patches", "auto"):
            layer = Conv(3, (3, 2), padding=pads, padding_mode=mode, use_bias=False, implementation=impl)
            y, _ = layer.apply(
                {"W": jnp.asarray(np.transpose(w, (2, 3, 1, 0)))}, (), jnp.asarray(np.moveaxis(x, 1, -1))
            )
            _check(np.moveaxis(np.asarray(y), -1, 1), ref, 2e-5, impl, mode)
        if mode == "reflect":  # chunked really split the batch: one convolution per piece
            layer = Conv(3, (3, 2), padding=pads, padding_mode=mode, use_bias=False, implementation="chunked")
            jaxpr = jax.make_jaxpr(lambda x: layer.apply({"W": jnp.zeros((3, 2, 1, 3))}, (), x)[0])(
                jnp.zeros((40, 6, 5, 1))
            )
            assert str(jaxpr).count("conv_general_dilated") == 2
        # input "NWHC" lists W before H; padding follows the kernel spec "HWIO": (H, W)
        layer = Conv(
            3, (3, 2), padding=pads, padding_mode=mode, use_bias=False, dimension_numbers=("NWHC", "HWIO", "NHWC")
        )
        shape, _, _ = layer.init(jax.random.key(0), (40, 5, 6, 1))
        y, _ = layer.apply(
            {"W": jnp.asarray(np.transpose(w, (2, 3, 1, 0)))}, (), jnp.asarray(np.transpose(x, (0, 3, 2, 1)))
        )
        assert shape == y.shape == (40,) + ref.shape[2:] + (3,)
        _check(np.moveaxis(np.asarray(y), -1, 1), ref, 2e-5, "NWHC", mode)


def test_padding_mode_limits_match_torch():
    """Padding equal to the size: reflect refuses it, circular and replicate take it, and
    circular refuses one more; replicate takes any amount. Where torch runs, so do we."""
    x = np.arange(1.0, 4.0, dtype=np.float32).reshape(1, 1, 3)
    w = np.ones((1, 1, 1), np.float32)
    for mode, p in [("reflect", 2), ("circular", 3), ("replicate", 7)]:
        ref = torch.nn.Conv1d(1, 1, 1, padding=p, padding_mode=mode, bias=False)
        with torch.no_grad():
            ref.weight.copy_(torch.tensor(w))
        want = ref(torch.tensor(x)).detach().numpy()
        y, _ = Conv(1, (1,), padding=p, padding_mode=mode, use_bias=False).apply(
            {"W": jnp.ones((1, 1, 1))}, (), jnp.asarray(x.reshape(1, 3, 1))
        )
        np.testing.assert_array_equal(np.asarray(y)[..., 0], want[:, 0])


# --------------------------------------------------------------------------- #
# ConvTranspose groups
# --------------------------------------------------------------------------- #


def _transpose_config(rng, n, dtype, refused):
    batch, *sizes = SIZES[n]
    groups = int(rng.integers(2, 4))
    cin, cout = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
    k = tuple(int(v) for v in rng.integers(1, 4, n))
    stride = tuple(int(v) for v in rng.integers(1, 4, n))
    dilation = tuple(int(v) for v in rng.integers(1, 3, n))
    windows = [d * (kk - 1) + 1 for d, kk in zip(dilation, k)]
    full = [(s_in - 1) * s + w for s_in, s, w in zip(sizes, stride, windows)]
    asymmetric = bool(rng.integers(0, 3) == 0)
    if asymmetric:  # funcnet's (low, high) pairs: torch's unpadded output, cropped
        pads = [tuple(int(v) for v in rng.integers(0, min(2, (f - 1) // 2) + 1, 2)) for f in full]
        out_pad = (0,) * n
        padding = pads
    else:
        # torch decides: padding that empties the output, or output_padding not below the
        # stride or the dilation, is refused by torch, then here, and drawn again.
        while True:
            padding = int(rng.integers(0, 3 + (rng.random() < 0.3)))
            out_pad = tuple(
                max(s, d) if rng.random() < 0.1 else int(rng.integers(0, max(s, d))) for s, d in zip(stride, dilation)
            )  # sometimes torch's limit
            outs = [f - 2 * padding + o for f, o in zip(full, out_pad)]
            if min(outs) < 1 and max(o >= max(s, d) for o, s, d in zip(out_pad, stride, dilation)) == 0:
                # An empty output: torch gives a 0-sized tensor in 1-D and fails inside
                # oneDNN ("could not construct a memory descriptor") in 2-D and 3-D; funcnet
                # refuses it on purpose, naming the padding and the output size.
                with pytest.raises(ValueError, match=r"is larger than the output"):
                    _init(
                        ConvTranspose(
                            groups,
                            k,
                            strides=stride,
                            padding=padding,
                            dilation=dilation,
                            output_padding=out_pad,
                            feature_group_count=groups,
                        ),
                        tuple(sizes) + (groups,),
                    )
                refused.append("empty output")
                continue
            refusal = _torch_refusal(
                lambda: getattr(F, f"conv_transpose{n}d")(
                    torch.zeros(1, groups, *sizes),
                    torch.zeros(groups, 1, *k),
                    stride=stride,
                    padding=padding,
                    output_padding=out_pad,
                    dilation=dilation,
                    groups=groups,
                )
            )
            if refusal is None:
                break
            _refused_alike(
                refusal,
                lambda: _init(
                    ConvTranspose(
                        groups,
                        k,
                        strides=stride,
                        padding=padding,
                        dilation=dilation,
                        output_padding=out_pad,
                        feature_group_count=groups,
                    ),
                    tuple(sizes) + (groups,),
                ),
            )
            refused.append(refusal)
    use_bias = bool(rng.integers(0, 4))
    channels_first = bool(rng.integers(0, 2))
    layout = TORCH_LAYOUT[n][0], TORCH_LAYOUT[n][1].replace("OI", "IO"), TORCH_LAYOUT[n][2]
    layer = ConvTranspose(
        cout,
        k,
        strides=stride,
        padding=padding,
        dilation=dilation,
        output_padding=out_pad,
        feature_group_count=groups,
        use_bias=use_bias,
        dimension_numbers=layout if channels_first else None,
        **ZEROS,
    )
    w = rng.standard_normal((cin, cout // groups) + k).astype(dtype)  # torch: (in, out/g, *k)
    b = rng.standard_normal(cout).astype(dtype) if use_bias else None
    x = rng.standard_normal((batch, cin, *sizes)).astype(dtype)
    conv_t = getattr(F, f"conv_transpose{n}d")

    def torch_fn(xt, wt, bt):
        if not asymmetric:
            return conv_t(
                xt, wt, bt, stride=stride, padding=padding, output_padding=out_pad, dilation=dilation, groups=groups
            )
        y = conv_t(xt, wt, bt, stride=stride, dilation=dilation, groups=groups)
        crop = tuple(slice(lo, y.shape[2 + i] - hi) for i, (lo, hi) in enumerate(pads))
        return y[(slice(None), slice(None)) + crop]

    shape, params = _init(layer, x.shape[1:] if channels_first else x.shape[2:] + (cin,))
    perm = _spatial_perm(n, in_first=True)  # the documented port: w.permute(*k, 0, 1)
    W = w if channels_first else np.transpose(w, perm)
    assert params["W"].shape == W.shape and ("b" in params) == use_bias
    ref_shape = tuple(torch_fn(torch.tensor(x), torch.tensor(w), None).shape)
    want = (-1,) + (ref_shape[1:] if channels_first else ref_shape[2:] + (cout,))
    cfg = dict(
        n=n,
        k=k,
        stride=stride,
        dilation=dilation,
        padding=padding,
        output_padding=out_pad,
        groups=groups,
        cin=cin,
        cout=cout,
        bias=use_bias,
        channels_first=channels_first,
        torch_w=w,
        perm=perm,
        shape=shape,
    )
    assert shape == want, cfg
    g = rng.standard_normal(ref_shape).astype(dtype)
    return layer, x, W, b, g, channels_first, torch_fn, cfg


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_grouped_conv_transpose_matches_torch(n, dtype, tol):
    rng = np.random.default_rng(200 * n + (dtype == np.float64))
    refused = []
    with jax.enable_x64(dtype == np.float64):
        cases = [_transpose_config(rng, n, dtype, refused) for _ in range(CONFIGS if n < 3 else 8)]
        _run_all(cases, dtype, tol)
    assert len(refused) >= 1, refused


def test_grouped_conv_transpose_weight_mapping():
    """W[..., j*in/g + i, o] joins input channel j*in/g + i to output channel j*out/g + o,
    as torch's w[j*in/g + i, o]: one nonzero weight lights exactly that output channel."""
    groups, cin, cout = 3, 6, 9
    layer = ConvTranspose(cout, (1,), feature_group_count=groups, use_bias=False)
    for c_in, o in [(0, 0), (3, 2), (5, 1)]:
        w = np.zeros((cin, cout // groups, 1), np.float32)
        w[c_in, o, 0] = 1.0
        x = np.zeros((1, cin, 2), np.float32)
        x[0, c_in] = 1.0
        ref = F.conv_transpose1d(torch.tensor(x), torch.tensor(w), groups=groups).numpy()
        y, _ = layer.apply({"W": jnp.asarray(np.transpose(w, (2, 0, 1)))}, (), jnp.asarray(np.moveaxis(x, 1, -1)))
        np.testing.assert_array_equal(np.moveaxis(np.asarray(y), -1, 1), ref)
        lit = np.flatnonzero(np.asarray(y)[0, 0])
        assert lit.tolist() == [(c_in // (cin // groups)) * (cout // groups) + o]


def _assert_uniform_bound(a, bound):
    a = np.abs(np.asarray(a))
    assert a.max() <= bound and a.max() > 0.9 * bound, (a.max(), bound)


def test_grouped_conv_transpose_default_init_is_torch():
    groups, cin, cout, k = 4, 8, 64, (3, 2)
    _, params, _ = ConvTranspose(cout, k, feature_group_count=groups).init(jax.random.key(1), (-1, 5, 5, cin))
    assert params["W"].shape == k + (cin, cout // groups) and params["b"].shape == (cout,)
    tl = torch.nn.ConvTranspose2d(cin, cout, k, groups=groups)
    assert tuple(tl.weight.shape) == (cin, cout // groups) + k
    fan_in = cout // groups * math.prod(k)  # torch: weight.size(1) * receptive field
    for ours, theirs in [(params["W"], tl.weight), (params["b"], tl.bias)]:
        _assert_uniform_bound(ours, 1 / math.sqrt(fan_in))
        _assert_uniform_bound(theirs.detach().numpy(), 1 / math.sqrt(fan_in))
    # the bound is not the ungrouped one (out * prod(k)): a too-small bound would fail above
    assert np.abs(np.asarray(params["W"])).max() > 1 / math.sqrt(cout * math.prod(k))
    assert abs(float(np.std(params["W"])) * math.sqrt(3 * fan_in) - 1) < 0.05


# --------------------------------------------------------------------------- #
# Refused inputs
# --------------------------------------------------------------------------- #


def test_unknown_padding_mode_lists_the_allowed_ones():
    for bad in ("foo", "Reflect", "constant", None):
        with pytest.raises(
            ArgumentError,
            match=r"Conv\(4, \(3,\)\): padding_mode must be one of "
            r"'zeros', 'reflect', 'replicate', 'circular', "
            rf"got {bad!r}",
        ):
            Conv(4, (3,), padding_mode=bad)


def test_reflect_padding_as_large_as_the_input_is_refused_naming_both():
    key = jax.random.key(0)
    with torch.no_grad(), pytest.raises(RuntimeError, match="should be less than"):
        torch.nn.Conv2d(1, 1, 1, padding=3, padding_mode="reflect")(torch.ones(1, 1, 3, 3))
    with pytest.raises(
        ArgumentError,
        match=r"Conv\(4, \(1, 1\)\): padding_mode='reflect' needs "
        r"padding smaller than the input size.*got padding "
        r"\(3, 3\) on axis 1 of size 3",
    ):
        Conv(4, (1, 1), padding=3, padding_mode="reflect").init(key, (-1, 3, 3, 1))
    with pytest.raises(ArgumentError, match=r"padding \(0, 4\) on axis 2 of size 4"):
        Conv(4, (1, 1), padding=[(1, 1), (0, 4)], padding_mode="reflect").init(key, (-1, 5, 4, 1))
    # SAME's computed pads count too: a window of 7 pads (3, 3)
    with pytest.raises(ArgumentError, match=r"padding \(3, 3\) on axis 1 of size 3"):
        Conv(4, (7,), padding="SAME", padding_mode="reflect").init(key, (-1, 3, 1))
    # unknown at init, too small at apply
    layer = Conv(4, (3,), padding=2, padding_mode="reflect", **ZEROS)
    _, params, _ = layer.init(key, (-1, -1, 1))
    with pytest.raises(ArgumentError, match=r"padding \(2, 2\) on axis 1 of size 2"):
        layer.apply(params, (), jnp.ones((1, 2, 1)))
    layer.apply(params, (), jnp.ones((1, 3, 1)))  # 2 < 3 runs


def test_circular_padding_beyond_the_input_is_refused_naming_both():
    with torch.no_grad(), pytest.raises(RuntimeError, match="wrapping around more than once"):
        torch.nn.Conv1d(1, 1, 1, padding=4, padding_mode="circular")(torch.ones(1, 1, 3))
    with pytest.raises(
        ArgumentError,
        match=r"padding_mode='circular' needs padding at most the "
        r"input size.*got padding \(4, 4\) on axis 1 of "
        r"size 3",
    ):
        Conv(4, (1,), padding=4, padding_mode="circular").init(jax.random.key(0), (-1, 3, 1))


def test_conv_transpose_refuses_other_padding_modes_and_bad_groups():
    with pytest.raises(ValueError, match='Only "zeros" padding mode is supported'):
        torch.nn.ConvTranspose2d(1, 1, 3, padding_mode="reflect")
    with pytest.raises(
        ArgumentError,
        match=r"ConvTranspose\(4, \(3, 3\)\): padding_mode must be "
        r"'zeros', got 'reflect'.*Only \"zeros\" padding "
        r"mode is supported for ConvTranspose2d",
    ):
        ConvTranspose(4, (3, 3), padding_mode="reflect")
    ConvTranspose(4, (3, 3), padding_mode="zeros")
    with pytest.raises(ArgumentError, match=r"feature_group_count=3 must divide out_chan=4"):
        ConvTranspose(4, (3,), feature_group_count=3)
    with pytest.raises(ArgumentError, match=r"feature_group_count must be a positive int, got 0"):
        ConvTranspose(4, (3,), feature_group_count=0)
    with pytest.raises(
        ArgumentError,
        match=r"feature_group_count=2 must divide the input "
        r"channels, got 3 channels",
    ):
        ConvTranspose(4, (3,), feature_group_count=2).init(jax.random.key(0), (-1, 5, 3))
    _, params, _ = ConvTranspose(4, (3,), feature_group_count=2, **ZEROS).init(jax.random.key(0), (-1, 5, 6))
    with pytest.raises(ValueError, match=r"input has 4 channels on axis 2 .* built for 6"):
        ConvTranspose(4, (3,), feature_group_count=2).apply(params, (), jnp.ones((1, 5, 4)))
