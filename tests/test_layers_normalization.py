"""funcnet.layers BatchNorm and LayerNorm, against formulas and PyTorch."""

import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch
from funcnet.layers.normalization import BatchNorm, LayerNorm
from funcnet.testing import check_layer


def _np(x):
    return np.asarray(x, dtype=np.float64)


def _randn(seed, *shape):
    """float32 test data from NumPy: no jax.random program to compile per shape."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _bn_reference(x, mean, var, scale, bias, axis, eps=1e-5):
    shape = [1] * x.ndim
    shape[axis] = -1
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)


def _random_params(seed, c):
    rng = np.random.default_rng(seed)
    return {
        "scale": jnp.asarray(rng.uniform(0.5, 2.0, c), jnp.float32),
        "bias": jnp.asarray(rng.standard_normal(c), jnp.float32),
    }


@pytest.mark.parametrize("running_var", [None, "unbiased", "biased"])
def test_batchnorm_train_eval_and_running_stats_formula(running_var):
    """The default (None here) is torch's unbiased running variance."""
    momentum, c = 0.8, 3
    init, apply = BatchNorm(momentum=momentum, **({} if running_var is None else {"running_var": running_var}))
    out_shape, params, state = init(jax.random.key(0), (-1, c))
    assert out_shape == (-1, c)
    np.testing.assert_array_equal(state["mean"], np.zeros(c))
    np.testing.assert_array_equal(state["var"], np.ones(c))
    np.testing.assert_array_equal(params["scale"], np.ones(c))
    np.testing.assert_array_equal(params["bias"], np.zeros(c))
    params = _random_params(1, c)
    train_step = jax.jit(lambda p, s, x: apply(p, s, x, train=True))

    run_mean, run_var = np.zeros(c), np.ones(c)
    for step in range(3):
        # offset mean and per-feature scale, so mean/var are not trivially 0/1
        x = jnp.asarray(3.0 + _randn(10 + step, 8, c) * np.float32([0.5, 1.0, 2.0]))
        y, state = train_step(params, state, x)
        xn = _np(x)
        bmean, bvar = xn.mean(0), ((xn - xn.mean(0)) ** 2).mean(0)  # biased variance
        np.testing.assert_allclose(
            y, _bn_reference(xn, bmean, bvar, _np(params["scale"]), _np(params["bias"]), 1), rtol=1e-5, atol=1e-5
        )
        run_mean = momentum * run_mean + (1 - momentum) * bmean
        n = xn.shape[0]
        correction = 1.0 if running_var == "biased" else n / (n - 1)
        run_var = momentum * run_var + (1 - momentum) * bvar * correction
        np.testing.assert_allclose(state["mean"], run_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state["var"], run_var, rtol=1e-5, atol=1e-6)

    x = jnp.asarray(_randn(99, 5, c))
    y, eval_state = apply(params, state, x, train=False)
    assert eval_state is state
    np.testing.assert_allclose(
        y, _bn_reference(_np(x), run_mean, run_var, _np(params["scale"]), _np(params["bias"]), 1), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_batchnorm_matches_torch(shape):
    """torch momentum=0.1 is momentum=0.9 here; the running_var is torch's unbiased one."""
    c, n = shape[1], math.prod(shape) // shape[1]
    torch_bn = (torch.nn.BatchNorm1d if len(shape) < 4 else torch.nn.BatchNorm2d)(c, momentum=0.1)
    axis = 1 if len(shape) > 2 else -1
    init, apply = BatchNorm(axis=axis, momentum=0.9)
    _, params, state = init(jax.random.key(0), (-1,) + shape[1:])
    params = _random_params(1, c)
    with torch.no_grad():
        torch_bn.weight.copy_(torch.tensor(np.asarray(params["scale"])))
        torch_bn.bias.copy_(torch.tensor(np.asarray(params["bias"])))
    x = 1.0 + 2.0 * _randn(2, *shape)

    torch_bn.train()
    y_torch = torch_bn(torch.tensor(x)).detach().numpy()
    y, new_state = apply(params, state, jnp.asarray(x), train=True)
    np.testing.assert_allclose(y, y_torch, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new_state["mean"], torch_bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    # the default running variance is torch's unbiased one
    np.testing.assert_allclose(new_state["var"], torch_bn.running_var.numpy(), rtol=1e-5, atol=1e-6)
    # running_var="biased" keeps the variance used to normalise: off by n / (n - 1)
    _, biased = BatchNorm(axis=axis, momentum=0.9, running_var="biased").apply(
        params, state, jnp.asarray(x), train=True
    )
    ours = (_np(biased["var"]) - 0.9) / 0.1
    theirs = (torch_bn.running_var.numpy().astype(np.float64) - 0.9) / 0.1
    np.testing.assert_allclose(ours * n / (n - 1), theirs, rtol=1e-4)
    assert not np.allclose(ours, theirs, rtol=1e-3)  # the conventions really differ

    # eval: torch's running buffers copied into our state give torch's eval output.
    torch_bn.eval()
    x2 = _randn(3, *shape)
    y_torch = torch_bn(torch.tensor(x2)).detach().numpy()
    torch_state = {"mean": jnp.asarray(torch_bn.running_mean.numpy()), "var": jnp.asarray(torch_bn.running_var.numpy())}
    y, _ = apply(params, torch_state, jnp.asarray(x2), train=False)
    np.testing.assert_allclose(y, y_torch, rtol=1e-4, atol=1e-5)


@pytest.mark.devices(4)
def test_synced_batchnorm_pmap_equals_global_batch():
    assert jax.device_count() == 4
    c = 3
    synced = BatchNorm(axis_name="batch")
    _, params, state = synced.init(jax.random.key(0), (-1, c))
    params = _random_params(1, c)
    # different offsets per device, so per-device stats differ from global ones
    x = jnp.asarray(_randn(2, 4, 5, c) + np.arange(4, dtype=np.float32)[:, None, None])

    def run(layer):
        return jax.pmap(lambda x: layer.apply(params, state, x, train=True), axis_name="batch")(x)

    y, new_state = run(synced)
    y_ref, state_ref = BatchNorm().apply(params, state, x.reshape(20, c), train=True)
    np.testing.assert_allclose(y.reshape(20, c), y_ref, atol=1e-5, rtol=1e-5)
    for key in ("mean", "var"):
        for d in range(4):
            np.testing.assert_allclose(new_state[key][d], state_ref[key], atol=1e-5, rtol=1e-5)
    # eval mode uses the running stats and needs no pmap, even with axis_name set.
    y_eval, _ = synced.apply(params, state_ref, x[0], train=False)
    np.testing.assert_allclose(y_eval, BatchNorm().apply(params, state_ref, x[0])[0], rtol=1e-6)
    # Without axis_name, each device uses its own statistics: a different answer.
    y_local, _ = run(BatchNorm())
    assert not np.allclose(y_local.reshape(20, c), y_ref, atol=1e-2)


def test_batchnorm_channels_first_and_flags():
    init, apply = BatchNorm(axis=1, center=False, scale=False)
    out_shape, params, state = init(jax.random.key(0), (-1, 4, 3, 3))
    assert out_shape == (-1, 4, 3, 3) and params == {} and state["mean"].shape == (4,)
    x = jnp.asarray(_randn(1, 2, 4, 3, 3) * 2 + 1)
    y, _ = apply(params, state, x, train=True)
    xn = _np(x)
    mean = xn.mean(axis=(0, 2, 3))
    var = xn.var(axis=(0, 2, 3))
    np.testing.assert_allclose(y, _bn_reference(xn, mean, var, np.ones(4), np.zeros(4), 1), rtol=1e-5, atol=1e-5)


def test_batchnorm_keeps_dtypes():
    _, params, state = BatchNorm().init(jax.random.key(0), (-1, 3))
    x = jnp.asarray(_randn(1, 4, 3), jnp.bfloat16)
    y, new_state = BatchNorm().apply(params, state, x, train=True)
    assert y.dtype == jnp.bfloat16
    assert new_state["mean"].dtype == new_state["var"].dtype == jnp.float32


def test_batchnorm_errors():
    for bad in ({"momentum": 1.5}, {"momentum": -0.1}, {"epsilon": -1.0}, {"axis": 1.0}):
        with pytest.raises(ValueError, match="BatchNorm"):
            BatchNorm(**bad)
    init, apply = BatchNorm()
    with pytest.raises(ValueError, match="BatchNorm"):
        init(jax.random.key(0), (3,))  # rank 1: nothing to reduce over
    with pytest.raises(ValueError, match="feature"):
        init(jax.random.key(0), (4, -1))
    _, params, state = init(jax.random.key(0), (-1, 3))
    with pytest.raises(ValueError, match=r"BatchNorm.*4 features.*built for 3"):
        apply(params, state, jnp.ones((2, 4)), train=True)


def test_batchnorm_contract():
    check_layer(BatchNorm(axis=1), (-1, 3, 2), inputs=jnp.asarray(_randn(0, 4, 3, 2)))


@pytest.mark.parametrize("axis,normalized_shape", [(-1, (5,)), ((-2, -1), (4, 5))])
def test_layernorm_matches_torch(axis, normalized_shape):
    shape = (3, 4, 5)
    init, apply = LayerNorm(axis=axis)
    out_shape, params, state = init(jax.random.key(0), (-1,) + shape[1:])
    assert out_shape == (-1,) + shape[1:] and state == ()
    assert params["scale"].shape == params["bias"].shape == normalized_shape
    params = {"scale": jnp.asarray(_randn(1, *normalized_shape)), "bias": jnp.asarray(_randn(2, *normalized_shape))}
    x = 2.0 + 3.0 * _randn(3, *shape)
    ln = torch.nn.LayerNorm(normalized_shape)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor(np.asarray(params["scale"])))
        ln.bias.copy_(torch.tensor(np.asarray(params["bias"])))
    y_torch = ln(torch.tensor(x)).detach().numpy()
    for train in (False, True):
        y, _ = jax.jit(lambda p, x: apply(p, (), x, train=train))(params, jnp.asarray(x))
        np.testing.assert_allclose(y, y_torch, rtol=1e-4, atol=1e-5)


def test_layernorm_middle_axis_formula():
    init, apply = LayerNorm(axis=1)
    _, params, _ = init(jax.random.key(0), (-1, 4, 3))
    params = {"scale": jnp.array([1.0, 2.0, 0.5, -1.0]), "bias": jnp.array([0.0, 1.0, -1.0, 2.0])}
    x = _randn(1, 2, 4, 3)
    y, _ = apply(params, (), jnp.asarray(x))
    xn = _np(x)
    ref = (xn - xn.mean(1, keepdims=True)) / np.sqrt(xn.var(1, keepdims=True) + 1e-5)
    ref = ref * _np(params["scale"])[:, None] + _np(params["bias"])[:, None]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_layernorm_errors_and_contract():
    with pytest.raises(ValueError, match="LayerNorm"):
        LayerNorm(axis="last")
    init, apply = LayerNorm()
    _, params, _ = init(jax.random.key(0), (-1, 5))
    with pytest.raises(ValueError, match=r"LayerNorm.*built for \(5,\)"):
        apply(params, (), jnp.ones((2, 6)))
    check_layer(LayerNorm(axis=(-2, -1)), (-1, 2, 5), inputs=jnp.asarray(_randn(0, 2, 2, 5)))


def test_batchnorm_train_needs_more_than_one_value_per_channel():
    # One value per channel has variance 0: the output would be the bias alone, silently.
    init, apply = BatchNorm()
    _, params, state = init(jax.random.key(0), (-1, 3))
    for shape in ((1, 3), (0, 3)):
        with pytest.raises(
            ValueError,
            match=r"BatchNorm: expected more than 1 value per channel "
            rf"when training, got input of shape \({shape[0]}, 3\).*"
            r"drop_remainder=True.*train=False",
        ):
            apply(params, state, jnp.ones(shape), train=True)
    channels_first = BatchNorm(axis=1)
    _, p2, s2 = channels_first.init(jax.random.key(0), (-1, 2, 1))
    with pytest.raises(ValueError, match=r"BatchNorm\(axis=1\).*\(1, 2, 1\)"):
        jax.jit(lambda x: channels_first.apply(p2, s2, x, train=True))(jnp.ones((1, 2, 1)))
    apply(params, state, jnp.ones((1, 3)), train=False)  # eval mode uses the running stats
    channels_first.apply(p2, s2, jnp.ones((1, 2, 2)), train=True)  # 2 values per channel


@pytest.mark.devices(4)
def test_synced_batchnorm_takes_one_value_per_channel_per_device():
    # Synced: one example per device is fine, the statistics are over all of them.
    _, params, state = BatchNorm().init(jax.random.key(0), (-1, 3))
    synced = BatchNorm(axis_name="b")
    y, _ = jax.pmap(lambda x: synced.apply(params, state, x, train=True), axis_name="b")(
        jnp.arange(12.0).reshape(4, 1, 3)
    )
    assert np.isfinite(y).all() and np.abs(y).max() > 0.5


# --------------------------------------------------------------------------- #
# RMSNorm, GroupNorm, LayerNorm(use_bias=False) against torch
# --------------------------------------------------------------------------- #

from funcnet.layers.normalization import GroupNorm, RMSNorm  # noqa: E402

_TORCH = {np.float32: torch.float32, np.float64: torch.float64}


def _torch_parity(layer, tmod, x, dtype, tol, move=None):
    """Forward and gradients (input and params) of ``layer`` on ``x`` against ``tmod``.

    ``move=(a, b)``: torch gets ``np.moveaxis(x, a, b)`` (e.g. NHWC -> NCHW is
    ``(-1, 1)``) and its results are moved back. torch's parameters are drawn away
    from their ones/zeros init, so a dropped or misplaced scale or bias shows; they
    map by name: ``weight`` -> ``scale``, ``bias`` -> ``bias``.
    """
    a, b = move or (0, 0)
    tmod = tmod.to(_TORCH[dtype])
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in tmod.parameters():
            p.copy_(torch.rand(p.shape, dtype=_TORCH[dtype], generator=gen) + 0.5)
    x = x.astype(dtype)
    tx = torch.tensor(np.ascontiguousarray(np.moveaxis(x, a, b)), requires_grad=True)
    ty = tmod(tx)
    cot = np.random.default_rng(7).standard_normal(ty.shape).astype(dtype)
    (ty * torch.tensor(cot)).sum().backward()
    back = lambda t: np.moveaxis(t.detach().numpy(), b, a)
    names = {"weight": "scale", "bias": "bias"}
    params = {names[k]: jnp.asarray(v.detach().numpy()) for k, v in tmod.named_parameters()}
    _, init_params, _ = layer.init(jax.random.key(0), (-1,) + x.shape[1:])
    assert {k: v.shape for k, v in init_params.items()} == {k: v.shape for k, v in params.items()}

    @jax.jit
    def forward_and_grads(params, x, cot):
        y, vjp = jax.vjp(lambda p, x: layer.apply(p, (), x)[0], params, x)
        return y, vjp(cot)

    y, (gp, gx) = forward_and_grads(params, jnp.asarray(x), jnp.asarray(np.moveaxis(cot, b, a)))
    assert y.dtype == dtype and set(gp) == set(params)
    np.testing.assert_allclose(y, back(ty), rtol=tol, atol=tol)
    np.testing.assert_allclose(gx, back(tx.grad), rtol=tol, atol=tol)
    for k, v in tmod.named_parameters():
        np.testing.assert_allclose(gp[names[k]], v.grad.numpy(), rtol=tol, atol=tol)


_DTYPES = [(np.float32, 1e-5), (np.float64, 1e-10)]


@pytest.mark.parametrize("dtype, tol", _DTYPES)
def test_rmsnorm_matches_torch(dtype, tol):
    x = _randn(0, 3, 5, 8) * 3
    with jax.enable_x64(dtype == np.float64):
        _torch_parity(RMSNorm(), torch.nn.RMSNorm(8), x, dtype, tol)
        # torch's normalized_shape (5, 8) is the last two axes; axis=1 on (N, C, L) is
        # torch's RMSNorm(C) on the input moved to channels-last.
        _torch_parity(RMSNorm(axis=(-2, -1)), torch.nn.RMSNorm((5, 8)), x, dtype, tol)
        _torch_parity(RMSNorm(axis=1), torch.nn.RMSNorm(5), x, dtype, tol, move=(1, -1))


@pytest.mark.parametrize("dtype, tol", _DTYPES)
def test_groupnorm_matches_torch_nhwc_and_nchw(dtype, tol):
    x = _randn(1, 2, 4, 3, 6) * 2 + 1  # NHWC, 6 channels
    with jax.enable_x64(dtype == np.float64):
        _torch_parity(GroupNorm(3), torch.nn.GroupNorm(3, 6), x, dtype, tol, move=(-1, 1))
        _torch_parity(GroupNorm(2, axis=1), torch.nn.GroupNorm(2, 6), np.moveaxis(x, -1, 1), dtype, tol)


def test_groupnorm_groups_are_contiguous_channels():
    # Channels 0-1 hold one scale and 2-3 another: contiguous groups normalise each
    # pair to unit variance; interleaved groups (0, 2), (1, 3) would not.
    x = _randn(4, 2, 5, 4) * np.float32([1, 1, 100, 100]) + np.float32([0, 0, 50, 50])
    y, _ = GroupNorm(2, center=False, scale=False).apply({}, (), jnp.asarray(x))
    xn = _np(x).reshape(2, 5, 2, 2)
    mean, var = xn.mean((1, 3), keepdims=True), xn.var((1, 3), keepdims=True)
    np.testing.assert_allclose(y, ((xn - mean) / np.sqrt(var + 1e-5)).reshape(x.shape), rtol=1e-5, atol=1e-5)


def test_layernorm_without_bias_matches_torch():
    x = _randn(2, 4, 6) * 2 + 1
    _torch_parity(LayerNorm(use_bias=False), torch.nn.LayerNorm(6, bias=False), x, np.float32, 1e-5)
    for kwargs, keys in (
        ({"use_bias": False}, {"scale"}),
        ({"center": False}, {"scale"}),
        ({"center": False, "use_bias": False}, {"scale"}),
        ({"center": True, "use_bias": True}, {"scale", "bias"}),
        ({"use_bias": True}, {"scale", "bias"}),
        ({}, {"scale", "bias"}),
    ):
        assert set(LayerNorm(**kwargs).init(jax.random.key(0), (-1, 6))[1]) == keys, kwargs
    for kwargs in ({"center": True, "use_bias": False}, {"center": False, "use_bias": True}):
        with pytest.raises(
            ValueError,
            match=r"LayerNorm: center=.* and use_bias=.* are the "
            r"same switch.*disagree",
        ):
            LayerNorm(**kwargs)
    with pytest.raises(ValueError, match="LayerNorm: use_bias must be True or False"):
        LayerNorm(use_bias="no")


def test_rmsnorm_default_eps_is_torchs_per_dtype():
    # torch uses the eps of its compute ("opmath") dtype: float32's for bfloat16/float16/
    # float32 inputs, float64's for float64 (its docs said the input dtype's). The inputs
    # have a mean square near eps, so another eps gives another output.
    layer = RMSNorm(scale=False)
    eps32, eps64 = np.finfo(np.float32).eps, np.finfo(np.float64).eps
    for dtype, tdtype, value, eps in (
        (jnp.bfloat16, torch.bfloat16, 3e-4, eps32),
        (jnp.float16, torch.float16, 3e-4, eps32),
        (jnp.float32, torch.float32, 3e-4, eps32),
        (jnp.float64, torch.float64, 1e-8, eps64),
    ):
        with jax.enable_x64(dtype == jnp.float64):
            x = jnp.full((1, 4), value, dtype)
            y, _ = layer.apply({}, (), x)
            assert y.dtype == dtype
            xv = float(np.asarray(x, np.float64)[0, 0])  # the value after rounding to dtype
            want = xv / np.sqrt(xv**2 + eps)
            np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=4e-3, err_msg=str(dtype))
            theirs = torch.nn.RMSNorm(4, elementwise_affine=False)(torch.tensor(np.asarray(x, np.float64)).to(tdtype))
            # equal to torch's (a CPU kernel) to the last bit of the narrow dtypes on CPU; in
            # float64 within a few ulps (rsqrt's last bit is the CPU kernel's), still 1e8
            # times finer than the gap another eps would leave. On a GPU rsqrt is an
            # approximate instruction (an ulp or two of float32), which can move the rounding
            # to bfloat16/float16 by one of their ulps: 1/256 of the value, still far finer
            # than another eps (0.66 here against 1.0 without eps).
            exact = jax.default_backend() == "cpu" or dtype == jnp.float64
            rtol = (0 if dtype != jnp.float64 else 1e-14) if exact else float(jnp.finfo(dtype).eps)
            np.testing.assert_allclose(
                np.asarray(y, np.float64), theirs.double().numpy(), rtol=rtol, atol=0, err_msg=str(dtype)
            )
    # a given epsilon replaces the default (here the bfloat16 eps of torch's old docs)
    y, _ = RMSNorm(scale=False, epsilon=float(jnp.finfo(jnp.bfloat16).eps)).apply(
        {}, (), jnp.full((1, 4), 0.01, jnp.bfloat16)
    )
    np.testing.assert_allclose(np.asarray(y, np.float32), 0.01 / np.sqrt(1e-4 + 2.0**-7), rtol=1e-2)


def test_bf16_inputs_give_bf16_outputs_close_to_float32():
    x32 = jnp.asarray(_randn(3, 2, 3, 8) * 4 + 1).astype(jnp.bfloat16).astype(jnp.float32)
    rng = np.random.default_rng(4)
    ones_ish = jnp.asarray(rng.uniform(0.5, 1.5, 8), jnp.float32)
    for layer, params in (
        (RMSNorm(), {"scale": ones_ish}),
        (GroupNorm(4), {"scale": ones_ish, "bias": ones_ish - 1}),
        (LayerNorm(use_bias=False), {"scale": ones_ish}),
    ):
        y32, _ = layer.apply(params, (), x32)
        yb, _ = layer.apply(params, (), x32.astype(jnp.bfloat16))
        assert yb.dtype == jnp.bfloat16, layer.name
        # one bfloat16 rounding of the float32 result: float32 statistics, no bf16 sums
        np.testing.assert_allclose(np.asarray(yb, np.float32), y32, rtol=2**-8, atol=1e-6, err_msg=layer.name)


def test_rms_and_group_norm_contract():
    # The layers ignore `train`: one mode is enough. Their gradients are checked against
    # torch's in float64 to 1e-10 above, tighter than check_grads' finite differences
    # (which would cost ~2 s of compilation here).
    check_layer(
        RMSNorm(axis=(1, 2)), (-1, 3, 4), train_modes=(False,), grad_check=False, inputs=jnp.asarray(_randn(5, 2, 3, 4))
    )
    check_layer(
        GroupNorm(2), (-1, 3, 2, 4), train_modes=(False,), grad_check=False, inputs=jnp.asarray(_randn(6, 2, 3, 2, 4))
    )
    out_shape, params, state = GroupNorm(2, axis=1).init(jax.random.key(0), (-1, 4, -1, 3))
    assert out_shape == (-1, 4, -1, 3) and state == ()
    np.testing.assert_array_equal(params["scale"], np.ones(4))
    np.testing.assert_array_equal(params["bias"], np.zeros(4))
    assert RMSNorm(axis=(-2, -1)).init(jax.random.key(0), (-1, 3, 4))[1]["scale"].shape == (3, 4)
    assert GroupNorm(2, center=False, scale=False).init(jax.random.key(0), (-1, 4))[1] == {}
    assert RMSNorm(scale=False).init(jax.random.key(0), (-1, 4))[1] == {}


def test_rms_and_group_norm_errors():
    key = jax.random.key(0)
    with pytest.raises(
        ValueError,
        match=r"GroupNorm\(3\): num_groups=3 does not divide the 4 "
        r"channels on axis 2 of shape \(-1, 5, 4\)",
    ):
        GroupNorm(3).init(key, (-1, 5, 4))
    with pytest.raises(
        ValueError,
        match=r"GroupNorm\(4, axis=1\): num_groups=4 does not divide "
        r"the 6 channels on axis 1",
    ):
        GroupNorm(4, axis=1).apply({}, (), jnp.ones((2, 6, 3)))
    with pytest.raises(
        ValueError,
        match=r"GroupNorm\(1\): expected an input of rank >= 2, got "
        r"rank 1",
    ):
        GroupNorm(1).init(key, (4,))
    with pytest.raises(ValueError, match=r"GroupNorm\(1\): expected an input of rank >= 2"):
        GroupNorm(1).apply({}, (), jnp.ones(4))
    with pytest.raises(ValueError, match="axis 0 is the batch"):
        GroupNorm(1, axis=0).init(key, (4, 5))
    with pytest.raises(ValueError, match="channel dimension"):
        GroupNorm(1).init(key, (2, -1))
    _, params, _ = GroupNorm(2).init(key, (-1, 4))
    with pytest.raises(
        ValueError,
        match=r"GroupNorm\(2\): the input has 6 channels on axis 1 "
        r"but params\['scale'\] was built for 4",
    ):
        GroupNorm(2).apply(params, (), jnp.ones((2, 6)))
    for bad in (
        {"num_groups": 0},
        {"num_groups": 2.0},
        {"num_groups": 2, "epsilon": -1.0},
        {"num_groups": 2, "axis": "channels"},
        {"num_groups": 2, "center": 1},
    ):
        with pytest.raises(ValueError, match="GroupNorm"):
            GroupNorm(**bad)
    for bad in ({"epsilon": -1e-6}, {"axis": ()}, {"scale": "yes"}):
        with pytest.raises(ValueError, match="RMSNorm"):
            RMSNorm(**bad)
    with pytest.raises(ValueError, match=r"RMSNorm\(axis=\(-2, -1\)\): expected an input of rank >= 2"):
        RMSNorm(axis=(-2, -1)).init(key, (4,))
    with pytest.raises(
        ValueError,
        match=r"RMSNorm.*\(4,\) on the normalised axes.*built for "
        r"\(3,\)",
    ):
        RMSNorm().apply({"scale": jnp.ones(3)}, (), jnp.ones((2, 4)))
