"""PyTorch's pooling options against torch: MaxPool (ceil_mode, dilation, return_indices),
AvgPool (ceil_mode, count_include_pad, divisor_override), MaxUnpool, AdaptiveAvgPool and
AdaptiveMaxPool. Random configurations in 1-D, 2-D and 3-D; outputs, indices and input
gradients compared with torch's in float32 and float64 (torch NC* <-> funcnet N*C)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError
from funcnet.layers import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, MaxPool, MaxUnpool
from funcnet.testing import check_layer

from helpers.torch_ref import torch

F = torch.nn.functional

DTYPES = [(np.float32, 2e-6), (np.float64, 1e-12)]
CONFIGS = 24  # random configurations per test, each run in both dtypes
PER_OPTION = 20  # each option is on in at least this many of a test's configurations


def _first(x):
    return np.moveaxis(np.asarray(x), -1, 1)


def _last(x):
    return np.moveaxis(np.asarray(x), 1, -1)


def _inputs(rng, n, ties):
    """A small torch-layout (N, C, *spatial) input; integer values give ties."""
    sizes = rng.integers(3, [10, 7, 5][n - 1], size=n)
    shape = (2, 2, *sizes)
    if ties:
        return rng.integers(-3, 4, size=shape).astype(np.float64)
    return rng.standard_normal(shape)


def _ours(cases):
    """funcnet's outputs, input gradients (for cotangents ct) and indices for many
    ``(layer, x, ct, indices)`` cases of torch-layout arrays, in torch's layout. One jit
    for all: XLA compiles each shape, and one program is far cheaper than one per case."""
    xs = [jnp.asarray(_last(x)) for _, x, _, _ in cases]
    cts = [jnp.asarray(_last(ct)) for _, _, ct, _ in cases]

    @jax.jit
    def run(xs, cts):
        results = []
        for (layer, _, _, indices), x, ct in zip(cases, xs, cts):
            f = lambda x, layer=layer: layer.apply((), (), x)[0]
            if indices:
                y, vjp, i = jax.vjp(f, x, has_aux=True)
            else:
                (y, vjp), i = jax.vjp(f, x), None
            results.append((y, vjp(ct.astype(y.dtype))[0], i))
        return results

    results = []
    for (layer, _, _, indices), x, (y, g, i) in zip(cases, xs, run(xs, cts)):
        out_shape = layer.init(jax.random.key(0), (-1,) + x.shape[1:])[0]
        want = (-1,) + y.shape[1:]
        assert out_shape == ((want, want) if indices else want), (layer.name, out_shape, want)
        assert y.dtype == x.dtype and (i is None or i.shape == y.shape)
        results.append((_first(y), _first(g), None if i is None else _first(i)))
    return results


def _check_all(cases, torch_fns):
    """cases: (layer, x, ct, indices) in float64 and torch-layout; each is compared with
    torch in float32 and float64."""
    for dtype, tol in DTYPES:
        with jax.enable_x64(dtype == np.float64):
            typed = [(layer, x.astype(dtype), ct.astype(dtype), ind) for layer, x, ct, ind in cases]
            for ours, fn, (_, x, ct, _) in zip(_ours(typed), torch_fns, typed):
                _compare(ours, _torch(fn, x, ct), tol)


def _torch(fn, x, ct):
    xt = torch.tensor(x, requires_grad=True)
    out = fn(xt)
    y, i = out if isinstance(out, tuple) else (out, None)
    (y * torch.tensor(ct)).sum().backward()
    return y.detach().numpy(), xt.grad.numpy(), None if i is None else i.numpy()


def _compare(ours, theirs, tol):
    (y, g, i), (yt, gt, it) = ours, theirs
    assert y.shape == yt.shape, (y.shape, yt.shape)
    np.testing.assert_allclose(y, yt, rtol=tol, atol=tol)
    np.testing.assert_allclose(g, gt, rtol=tol, atol=tol)
    if it is not None:
        np.testing.assert_array_equal(i, it)


# What torch's refusals mean, and the words funcnet's error must use for the same reason.
REASONS = [
    ("pad should be", r"more than half the window: window \d+.*so padding may be at most"),
    ("padding should be at most half", r"more than half the window"),
    ("Output size is too small", r"too small for a window"),
    ("smaller than kernel size", r"is smaller than the window"),
]


def _torch_refusal(fn, x):
    """torch's error message for this configuration, or None where torch runs it."""
    try:
        fn(torch.tensor(x))
    except RuntimeError as e:
        return str(e)
    return None


def _assert_refused(make, x, refusal):
    """funcnet refuses (at construction, init or apply) a configuration torch refused with
    ``refusal``, and for the same reason."""
    [pattern] = [ours for theirs, ours in REASONS if theirs in refusal]
    with pytest.raises(ValueError, match=pattern):  # ArgumentError is a ValueError
        layer = make()
        layer.init(None, (-1,) + _last(x).shape[1:])
        layer.apply((), (), jnp.asarray(_last(x)))
    return refusal


def _ceil_changes(size, span, stride, pad):
    floor = (size + 2 * pad - span) // stride + 1
    ceil = (size + 2 * pad - span + stride - 1) // stride + 1
    if (ceil - 1) * stride >= size + pad:
        ceil -= 1
    return ceil != floor


def _max_config(rng, ceil=None, dilated=None):
    """A random max-pool configuration; ``ceil``/``dilated`` (some dilation > 1) forced
    when given. Pads go up to half the dilated window, beyond torch's limit (half the
    window), so that some configurations are ones torch refuses."""
    n = int(rng.integers(1, 4))
    x = _inputs(rng, n, ties=True)
    window = tuple(int(v) for v in rng.integers(1, 4, size=n))
    stride = tuple(int(v) for v in rng.integers(1, 4, size=n))
    dilation = tuple(int(v) for v in rng.integers(1, 3, size=n))
    if dilated is not None and (max(dilation) > 1) != dilated:
        dilation = (2,) + dilation[1:] if dilated else (1,) * n
    span = [(w - 1) * d + 1 for w, d in zip(window, dilation)]
    pad = tuple(int(rng.integers(0, e // 2 + 1)) for e in span)
    ceil = bool(rng.integers(2)) if ceil is None else ceil
    return n, x, window, stride, dilation, pad, ceil, span


def test_maxpool_options_match_torch():
    """ceil_mode, dilation and return_indices on integer-valued inputs (ties everywhere):
    the value, the first-max index and the gradient are torch's. Each option is on in at
    least PER_OPTION configurations (and off in some); every configuration torch refuses
    on the way is refused here too."""
    rng = np.random.default_rng(0)
    cases, fns, refused = [], [], []
    ceil_on = ceil_changed = dilated = indexed = 0
    configs = 28
    while len(cases) < configs:
        i = len(cases)  # each option off in every 7th configuration, at a different place
        n, x, window, stride, dilation, pad, ceil, span = _max_config(rng, ceil=i % 7 != 0, dilated=i % 7 != 2)
        indices = i % 7 != 4
        fn = lambda t, n=n, a=(window, stride, pad, dilation), ceil=ceil, indices=indices: getattr(F, f"max_pool{n}d")(
            t, *a, ceil_mode=ceil, return_indices=indices
        )
        make = lambda a=(window, stride, pad), d=dilation, c=ceil, r=indices: MaxPool(
            *a, dilation=d, ceil_mode=c, return_indices=r
        )
        refusal = _torch_refusal(fn, x)
        if refusal is not None:
            refused.append(_assert_refused(make, x, refusal))
            continue
        y = fn(torch.tensor(x))
        ct = rng.standard_normal((y[0] if indices else y).shape)
        cases.append((make(), x, ct, indices))
        fns.append(fn)
        ceil_on += ceil
        ceil_changed += ceil and any(_ceil_changes(d, e, s, p) for d, e, s, p in zip(x.shape[2:], span, stride, pad))
        dilated += max(dilation) > 1
        indexed += indices
    assert min(ceil_on, dilated, indexed) >= PER_OPTION and ceil_changed >= 8, (ceil_on, dilated, indexed, ceil_changed)
    # torch's pad limit ignores the dilation: pads up to half the dilated window hit it
    assert sum("half of kernel size" in r for r in refused) >= 3, refused
    _check_all(cases, fns)


def test_maxpool_indices_every_rank_and_path():
    """return_indices (the gathered path) in each rank, VALID and padded: torch's values,
    indices and gradients, and the plain path's values and gradients."""
    rng = np.random.default_rng(1)
    cases, fns = [], []
    for n, window, stride, pad in [
        (1, (3,), (2,), (1,)),
        (2, (2, 2), (2, 2), (0, 0)),
        (2, (3, 2), (1, 2), (1, 1)),
        (3, (2, 2, 2), (1, 2, 2), (1, 0, 1)),
    ]:
        x = _inputs(rng, n, ties=True)
        fn = lambda t, n=n, a=(window, stride, pad): getattr(F, f"max_pool{n}d")(t, *a, return_indices=True)
        ct = rng.standard_normal(fn(torch.tensor(x))[0].shape)
        cases += [
            (MaxPool(window, stride, pad, return_indices=True), x, ct, True),
            (MaxPool(window, stride, pad), x, ct, False),
        ]
        fns += [fn, lambda t, fn=fn: fn(t)[0]]
    _check_all(cases, fns)


def test_maxpool_nan_and_minus_inf_like_torch():
    """torch keeps the last NaN of a window; a window of -inf gives its first position."""
    x = np.array([[[1.0, np.nan, 2.0, np.nan, -np.inf, -np.inf, 0.0, 5.0]]])
    ct = np.arange(1.0, 5.0).reshape(1, 1, 4)
    fn = lambda t: F.max_pool1d(t, 2, return_indices=True)
    [(y, g, i)] = _ours([(MaxPool((2,), return_indices=True), x, ct, True)])
    yt, gt, it = _torch(fn, x, ct)
    np.testing.assert_array_equal(i, it)
    np.testing.assert_array_equal(y, yt)
    np.testing.assert_array_equal(g, gt)
    assert i[0, 0].tolist() == [1, 3, 4, 7]


def test_avgpool_options_match_torch():
    """ceil_mode with count_include_pad both ways (the divisor of a window past the padded
    end counts up to the padding's end) and divisor_override. divisor_override is on in
    every even configuration, count_include_pad=False with some padding (where it matters)
    in 20 of the odd ones, ceil_mode in 5 of 6; every configuration torch refuses on the
    way (pads over half the window, empty outputs, a 3-D input smaller than the window)
    is refused here too."""
    rng = np.random.default_rng(2)
    cases, fns, refused = [], [], []
    ceil_on = ceil_changed = overridden = excluded_padded = 0
    configs = 48
    while len(cases) < configs:
        i = len(cases)
        n = int(rng.integers(1, 4))
        x = _inputs(rng, n, ties=False)
        # windows up to 4 (3-D inputs are 3 or 4 wide) and pads up to one over torch's limit
        window = tuple(int(v) for v in rng.integers(1, 5, size=n))
        stride = tuple(int(v) for v in rng.integers(1, 4, size=n))
        pad = tuple(int(rng.integers(0, w // 2 + 1 + (rng.random() < 0.3))) for w in window)
        ceil = i % 6 != 5
        divisor = [1, 3, -2][rng.integers(3)] if i % 2 == 0 else None
        include = bool(rng.integers(2)) if i % 2 == 0 else i % 24 >= 20
        if not include and divisor is None and max(pad) == 0:  # padding, so that it matters
            a = int(np.argmax(window))
            window = window[:a] + (max(window[a], 2),) + window[a + 1 :]
            pad = pad[:a] + (1,) + pad[a + 1 :]
        if n == 1 and divisor is not None:  # avg_pool1d has no divisor_override
            fn = lambda t, a=((*window, 1), (*stride, 1), (*pad, 0), ceil, include, divisor): F.avg_pool2d(
                t[..., None], *a
            )[..., 0]
        else:
            fn = lambda t, n=n, a=(window, stride, pad, ceil, include), d=([divisor] if n > 1 else []): getattr(
                F, f"avg_pool{n}d"
            )(t, *a, *d)
        make = lambda a=(window, stride, pad, include), c=ceil, d=divisor: AvgPool(*a, ceil_mode=c, divisor_override=d)
        refusal = _torch_refusal(fn, x)
        if refusal is not None:
            refused.append(_assert_refused(make, x, refusal))
            continue
        changes = ceil and any(_ceil_changes(d, w, s, p) for d, w, s, p in zip(x.shape[2:], window, stride, pad))
        cases.append((make(), x, rng.standard_normal(fn(torch.tensor(x)).shape), False))
        fns.append(fn)
        ceil_on += ceil
        ceil_changed += changes
        overridden += divisor is not None
        excluded_padded += not include and divisor is None and max(pad) > 0
    assert min(ceil_on, overridden, excluded_padded) >= PER_OPTION and ceil_changed >= 10, (
        ceil_on,
        overridden,
        excluded_padded,
        ceil_changed,
    )
    for reason in ("pad should be", "smaller than kernel size"):
        assert sum(reason in r for r in refused) >= 2, (reason, refused)
    _check_all(cases, fns)


def test_avgpool3d_input_smaller_than_window_like_torch():
    """torch's avg_pool3d refuses an input smaller than the kernel whatever the padding;
    its 1-D and 2-D average pools and every max pool only need one window."""
    x = torch.zeros(1, 1, 8, 2, 5)
    with pytest.raises(RuntimeError, match=r"input image \(T: 8 H: 2 W: 5\) smaller than kernel"):
        F.avg_pool3d(x, (1, 3, 4), (2, 1, 1), (0, 1, 2))
    with pytest.raises(
        ArgumentError,
        match=r"AvgPool\(\(1, 3, 4\)\): input size 2 on axis 2 is "
        r"smaller than the window 3 .*avg_pool3d",
    ):
        AvgPool((1, 3, 4), (2, 1, 1), (0, 1, 2)).init(None, (-1, 8, 2, 5, 1))
    # as torch: 2-D average and 3-D max pools take it (the padding makes one window)
    assert F.avg_pool2d(x[0, :, 0], (3, 4), 1, (1, 2)).shape == (1, 2, 6)
    assert AvgPool((3, 4), 1, (1, 2)).init(None, (-1, 2, 5, 1))[0] == (-1, 2, 6, 1)
    assert F.max_pool3d(x, (1, 3, 4), (2, 1, 1), (0, 1, 2)).shape == (1, 1, 4, 2, 6)
    assert MaxPool((1, 3, 4), (2, 1, 1), (0, 1, 2)).init(None, (-1, 8, 2, 5, 1))[0] == (-1, 4, 2, 6, 1)
    # (low, high) pairs and "SAME" are not torch's spelling: one window is enough
    assert AvgPool((1, 3, 4), (2, 1, 1), ((0, 0), (1, 1), (2, 2))).init(None, (-1, 8, 2, 5, 1))[0] == (-1, 4, 2, 6, 1)


def test_maxpool_window_of_only_padding_is_refused():
    """A dilated window can skip over a small input: torch gives it -inf, an index outside
    the window and sends its gradient to another element (here the next channel's);
    funcnet refuses such a configuration."""
    xt = torch.zeros(1, 2, 1, requires_grad=True)
    y, i = F.max_pool1d(xt, 2, 2, 1, 2, return_indices=True)
    y.sum().backward()
    assert y.isinf().all() and i.flatten().tolist() == [1, 1]  # input has 1 position
    assert xt.grad.flatten().tolist() == [0.0, 1.0]  # channel 0's window's gradient
    for layer in (MaxPool((2,), 2, 1, dilation=2, return_indices=True), MaxPool((2,), 2, 1, dilation=2)):
        with pytest.raises(
            ValueError,
            match=r"MaxPool\(\(2,\)\): window 0 on axis 1 covers "
            r"only padding: input size 1, window 2 with "
            r"dilation 2 reads positions \[-1, 1\]",
        ):
            layer.init(None, (-1, 1, 2))
        with pytest.raises(ValueError, match=r"covers only padding"):
            layer.apply((), (), jnp.zeros((1, 1, 2)))
    # 2-D: the window of row 0 (rows -1 and 1 of a 1-row input) is only padding
    with pytest.raises(ValueError, match=r"window 0 on axis 1 covers only padding"):
        MaxPool((2, 1), 1, (1, 0), dilation=(2, 1)).init(None, (-1, 1, 3, 1))
    # the same window with an input it reaches runs
    assert MaxPool((2,), 2, 1, dilation=2).init(None, (-1, 2, 1))[0] == (-1, 1, 1)


def test_ceil_mode_drops_a_window_starting_in_the_right_padding():
    # size 5, window 2, stride 2, pad 1: rounding up gives 4 windows, the 4th would start
    # at padded position 6 >= 5 + 1 (in the right padding): torch drops it.
    x = np.arange(1.0, 6.0).reshape(1, 1, 5)
    for include in (True, False):
        [(y, _, _)] = _ours([(AvgPool((2,), 2, 1, include, ceil_mode=True), x, np.ones((1, 1, 3)), False)])
        np.testing.assert_allclose(y, F.avg_pool1d(torch.tensor(x), 2, 2, 1, True, include))
        assert y.shape == (1, 1, 3)
    assert MaxPool((2,), 2, 1, ceil_mode=True).init(None, (-1, 5, 1))[0] == (-1, 3, 1)
    # torch lets a ceil_mode window hang over an input smaller than the window
    assert MaxPool((3,), 2, ceil_mode=True).init(None, (-1, 2, 1))[0] == (-1, 1, 1)


def test_adaptive_pools_match_torch():
    """Output sizes larger than, dividing and not dividing the input, and None."""
    rng = np.random.default_rng(3)
    cases, fns = [], []
    kept = indexed = 0
    for config in range(CONFIGS):
        n = config % 3 + 1
        x = _inputs(rng, n, ties=True)
        out = tuple(None if rng.random() < 0.15 else int(rng.integers(1, d + 4)) for d in x.shape[2:])
        if config < 3:  # a divisor and a size larger than the input, on purpose
            out = (x.shape[2] + 2,) + tuple(1 for _ in x.shape[3:])
        indices = config % 6 != 5  # on in 20 of the 24
        # torch's 1-D pools take no None: the input's size is what None means
        out_t = tuple(d if o is None else o for d, o in zip(x.shape[2:], out)) if n == 1 else out
        fn_max = lambda t, n=n, out=out_t, i=indices: getattr(F, f"adaptive_max_pool{n}d")(t, out, return_indices=i)
        fn_avg = lambda t, n=n, out=out_t: getattr(F, f"adaptive_avg_pool{n}d")(t, out)
        ct = rng.standard_normal(fn_avg(torch.tensor(x)).shape)
        noisy = x + 0.1 * rng.standard_normal(x.shape)  # for the mean: no ties needed
        kept += None in out
        indexed += indices
        cases += [
            (AdaptiveMaxPool(out, return_indices=indices), x, ct, indices),
            (AdaptiveAvgPool(out), noisy, ct, False),
        ]
        fns += [fn_max, fn_avg]
    assert kept >= 3 and indexed >= PER_OPTION, (kept, indexed)
    _check_all(cases, fns)


def test_max_unpool_matches_torch():
    """MaxUnpool of torch's pool (its indices), with and without output_size, overlapping
    windows (indices written twice) included: output and the values' gradient."""
    rng = np.random.default_rng(4)
    configs, refused = [], []
    overlapping = sized = 0
    while len(configs) < 28:
        n, x, window, stride, _, pad, ceil, _ = _max_config(rng)
        pool = lambda t: getattr(F, f"max_pool{n}d")(t, window, stride, pad, ceil_mode=ceil, return_indices=True)
        refusal = _torch_refusal(pool, x)
        if refusal is not None:  # the pool torch refuses is refused here too
            refused.append(_assert_refused(lambda: MaxPool(window, stride, pad, ceil_mode=ceil), x, refusal))
            continue
        v, i = (a.numpy() for a in pool(torch.tensor(x)))
        default = [(d - 1) * s - 2 * p + w for d, s, p, w in zip(v.shape[2:], stride, pad, window)]
        size = None
        if len(configs) % 7:  # output_size in 24 of the 28: the pooled input's, or near default
            size = tuple(x.shape[2:])
            if not all(d - s < o < d + s for d, s, o in zip(default, stride, size)):
                size = tuple(int(d + rng.integers(0, s)) for d, s in zip(default, stride))
        args = (window, stride, pad)
        try:
            getattr(F, f"max_unpool{n}d")(torch.tensor(v), torch.tensor(i), *args, output_size=size)
        except RuntimeError as e:  # an empty output, or indices outside it: refused here too
            refused.append(str(e))
            with pytest.raises(ValueError, match=r"empty output|is outside the output"):
                layer = MaxUnpool(*args, output_size=size)
                layer.init(None, ((-1,) + _last(v).shape[1:],) * 2)
                layer.apply((), (), (jnp.asarray(_last(v)), jnp.asarray(_last(i))))
            continue
        configs.append(
            (n, MaxUnpool(*args, output_size=size), v, i, rng.standard_normal((2, 2, *(size or default))), args, size)
        )
        overlapping += any(s < w for s, w in zip(stride, window))
        sized += size is not None
    assert overlapping >= 8 and sized >= PER_OPTION, (overlapping, sized)
    assert sum("invalid max index" in r for r in refused) >= 1, refused
    for dtype, tol in DTYPES:
        with jax.enable_x64(dtype == np.float64):
            vs = [jnp.asarray(_last(c[2].astype(dtype))) for c in configs]
            idx = [jnp.asarray(_last(c[3])) for c in configs]
            cts = [jnp.asarray(_last(c[4].astype(dtype))) for c in configs]

            @jax.jit
            def run(vs, idx, cts):
                results = []
                for c, v, i, ct in zip(configs, vs, idx, cts):
                    y, vjp = jax.vjp(lambda v, layer=c[1], i=i: layer.apply((), (), (v, i))[0], v)
                    results.append((y, vjp(ct)[0]))
                return results

            for (n, layer, v, i, ct, args, size), vj, (y, g) in zip(configs, vs, run(vs, idx, cts)):
                assert layer.init(None, ((-1,) + vj.shape[1:],) * 2)[0] == (-1,) + y.shape[1:]
                vt = torch.tensor(v.astype(dtype), requires_grad=True)
                yt = getattr(F, f"max_unpool{n}d")(vt, torch.tensor(i), *args, output_size=size)
                (yt * torch.tensor(ct.astype(dtype))).sum().backward()
                np.testing.assert_allclose(_first(y), yt.detach().numpy(), rtol=tol, atol=tol)
                np.testing.assert_allclose(_first(g), vt.grad.numpy(), rtol=tol, atol=tol)


def test_pool_then_unpool_round_trip_under_jit():
    x = np.random.default_rng(5).standard_normal((2, 6, 7, 3)).astype(np.float32)
    pool = MaxPool((2, 2), return_indices=True)
    unpool = MaxUnpool((2, 2), output_size=(6, 7))

    @jax.jit
    def f(x):
        return unpool.apply((), (), pool.apply((), (), x)[0])[0]

    y = np.asarray(f(x))
    want = F.max_unpool2d(*F.max_pool2d(torch.tensor(_first(x)), 2, return_indices=True), 2, output_size=(6, 7))
    np.testing.assert_array_equal(_first(y), want.numpy())


def test_contracts():
    check_layer(MaxPool((3, 2), 2, 1, dilation=(1, 2), ceil_mode=True), (-1, 7, 8, 2), train_modes=(False,))
    check_layer(
        MaxPool((2,), 2, 1, ceil_mode=True, return_indices=True), (-1, 7, 2), train_modes=(False,), grad_check=False
    )
    check_layer(AvgPool((3, 3), 2, 1, False, ceil_mode=True), (-1, 6, 6, 2), train_modes=(False,))
    check_layer(AdaptiveAvgPool((3, None)), (-1, 5, 4, 2), train_modes=(False,))
    check_layer(AdaptiveMaxPool((2, 2, 3)), (-1, 3, 5, 4, 2), train_modes=(False,))
    idx = jnp.asarray(np.random.default_rng(6).integers(0, 16, (2, 2, 2, 3)), jnp.int32)
    values = jnp.ones((2, 2, 2, 3))
    check_layer(
        MaxUnpool((2, 2)), ((-1, 2, 2, 3), (-1, 2, 2, 3)), inputs=(values, idx), train_modes=(False,), grad_check=False
    )


def test_integer_inputs():
    x = jnp.asarray(np.arange(10, dtype=np.int32).reshape(1, 5, 2))
    y, i = MaxPool((2,), ceil_mode=True, return_indices=True).apply((), (), x)[0]
    assert y.dtype == jnp.int32 and i.dtype == jnp.int32
    assert y[0, :, 0].tolist() == [2, 6, 8] and i[0, :, 1].tolist() == [1, 3, 4]
    assert AdaptiveMaxPool((2,)).apply((), (), x)[0].dtype == jnp.int32
    assert jnp.issubdtype(AdaptiveAvgPool((2,)).apply((), (), x)[0].dtype, jnp.floating)


def test_errors():
    key = jax.random.key(0)
    # PyTorch's rule ignores the dilation: pad 2 > 3 // 2, though the window spans 5
    with pytest.raises(RuntimeError, match=r"padding should be at most half of kernel size"):
        F.max_pool1d(torch.zeros(1, 1, 11), 3, 2, 2, 2)
    with pytest.raises(RuntimeError, match=r"pad should be smaller than or equal to half"):
        F.max_pool2d(torch.zeros(1, 1, 11, 11), 3, 2, 2, 2)
    with pytest.raises(
        ArgumentError,
        match=r"MaxPool\(\(3,\)\): padding 2 on spatial axis 0 is "
        r"more than half the window: window 3 \(dilation 2 "
        r"does not count\), so padding may be at most 1",
    ):
        MaxPool((3,), 2, 2, dilation=2)
    with pytest.raises(ArgumentError, match=r"padding 2 on spatial axis 1 .* at most 1"):
        MaxPool((3, 3), 2, (0, 2), dilation=2)
    assert MaxPool((3,), 2, 1, dilation=2).init(key, (-1, 11, 1))[0] == (-1, 5, 1)
    assert tuple(F.max_pool1d(torch.zeros(1, 1, 11), 3, 2, 1, 2).shape) == (1, 1, 5)
    with pytest.raises(ArgumentError, match=r"AvgPool.*padding 2 on spatial axis 1 .* at most 1"):
        AvgPool((3, 3), padding=(1, 2))
    with pytest.raises(ArgumentError, match=r"divisor_override must be a non-zero int.*got 0"):
        AvgPool((2, 2), divisor_override=0)
    with pytest.raises(ArgumentError, match=r"divisor_override must be an int, got 1.5"):
        AvgPool((2, 2), divisor_override=1.5)
    with pytest.raises(ArgumentError, match=r"ceil_mode must be True or False, got 'yes'"):
        MaxPool((2, 2), ceil_mode="yes")
    with pytest.raises(
        ValueError,
        match=r"dilation must be a positive int or 2 positive ints, "
        r"got \(0, 1\)",
    ):
        MaxPool((2, 2), dilation=(0, 1))
    with pytest.raises(
        ValueError,
        match=r"input size 2 on axis 1 is too small for a window of "
        r"5 \(after dilation\)",
    ):
        MaxPool((3,), dilation=2).init(key, (-1, 2, 1))
    for bad in [(0, 2), (2, -1)]:
        with pytest.raises(
            ArgumentError,
            match=rf"AdaptiveAvgPool.*output_size entries must be "
            rf"positive, got {min(bad)}",
        ):
            AdaptiveAvgPool(bad)
    with pytest.raises(
        ArgumentError,
        match=r"AdaptiveMaxPool\(7\): output_size must be a tuple "
        r"of 1 to 3 entries",
    ):
        AdaptiveMaxPool(7)
    with pytest.raises(ArgumentError, match=r"AdaptiveMaxPool.*1 to 3 entries.*got \(1, 1, 1, 1\)"):
        AdaptiveMaxPool((1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool.*rank-4"):
        AdaptiveAvgPool((2, 2)).init(key, (-1, 5, 3))
    unpool = MaxUnpool((2, 2))
    with pytest.raises(
        ArgumentError,
        match=r"output_size \(7, 4\) is invalid: on spatial axis 0 "
        r"it must be between 2 and 6, exclusive",
    ):
        MaxUnpool((2, 2), output_size=(7, 4)).init(key, ((-1, 2, 2, 1),) * 2)
    with pytest.raises(ArgumentError, match=r"output_size must be None or 2 positive ints"):
        MaxUnpool((2, 2), output_size=(4, 0))
    with pytest.raises(ArgumentError, match=r"padding must be .* got the string 'SAME'"):
        MaxUnpool((2, 2), padding="SAME")
    v = jnp.ones((1, 2, 2, 1))
    with pytest.raises(
        ArgumentError,
        match=r"index 99 is outside the output's 16 spatial "
        r"positions \(4, 4\)",
    ):
        unpool.apply((), (), (v, jnp.full((1, 2, 2, 1), 99)))
    with pytest.raises(ArgumentError, match=r"index -1 is outside"):
        unpool.apply((), (), (v, jnp.full((1, 2, 2, 1), -1)))
    with pytest.raises(ArgumentError, match=r"must be a pair \(values, indices\)"):
        unpool.apply((), (), v)
    with pytest.raises(ArgumentError, match=r"indices must be integers of the values' shape"):
        unpool.apply((), (), (v, v))
    # under jit, out-of-range indices are dropped (torch would raise; jit can't)
    unpool_jit = jax.jit(lambda i: unpool.apply((), (), (v, i))[0])
    y = unpool_jit(jnp.array([0, 99, -1, 5]).reshape(v.shape))
    assert np.asarray(y).ravel().tolist() == [1.0] + [0.0] * 4 + [1.0] + [0.0] * 10
