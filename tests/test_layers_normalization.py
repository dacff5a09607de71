"""funcnet.layers BatchNorm and LayerNorm, against formulas and PyTorch."""
import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
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
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) \
        + bias.reshape(shape)


def _random_params(seed, c):
    rng = np.random.default_rng(seed)
    return {"scale": jnp.asarray(rng.uniform(0.5, 2.0, c), jnp.float32),
            "bias": jnp.asarray(rng.standard_normal(c), jnp.float32)}


def test_batchnorm_train_eval_and_running_stats_formula():
    momentum, c = 0.8, 3
    init, apply = BatchNorm(momentum=momentum)
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
            y, _bn_reference(xn, bmean, bvar, _np(params["scale"]), _np(params["bias"]), 1),
            rtol=1e-5, atol=1e-5)
        run_mean = momentum * run_mean + (1 - momentum) * bmean
        run_var = momentum * run_var + (1 - momentum) * bvar
        np.testing.assert_allclose(state["mean"], run_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state["var"], run_var, rtol=1e-5, atol=1e-6)

    x = jnp.asarray(_randn(99, 5, c))
    y, eval_state = apply(params, state, x, train=False)
    assert eval_state is state
    np.testing.assert_allclose(
        y, _bn_reference(_np(x), run_mean, run_var, _np(params["scale"]), _np(params["bias"]), 1),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_batchnorm_matches_torch(shape):
    """torch momentum=0.1 is momentum=0.9 here; torch's running_var is unbiased."""
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
    # Recover each side's batch variance from one update from var=1 and compare them
    # through the unbiased correction n / (n - 1).
    ours = (_np(new_state["var"]) - 0.9) / 0.1
    theirs = (torch_bn.running_var.numpy().astype(np.float64) - 0.9) / 0.1
    np.testing.assert_allclose(ours * n / (n - 1), theirs, rtol=1e-4)
    assert not np.allclose(ours, theirs, rtol=1e-3)  # the conventions really differ

    # eval: torch's running buffers copied into our state give torch's eval output.
    torch_bn.eval()
    x2 = _randn(3, *shape)
    y_torch = torch_bn(torch.tensor(x2)).detach().numpy()
    torch_state = {"mean": jnp.asarray(torch_bn.running_mean.numpy()),
                   "var": jnp.asarray(torch_bn.running_var.numpy())}
    y, _ = apply(params, torch_state, jnp.asarray(x2), train=False)
    np.testing.assert_allclose(y, y_torch, rtol=1e-4, atol=1e-5)


def test_synced_batchnorm_pmap_equals_global_batch():
    assert jax.device_count() == 4
    c = 3
    synced = BatchNorm(axis_name="batch")
    _, params, state = synced.init(jax.random.key(0), (-1, c))
    params = _random_params(1, c)
    # different offsets per device, so per-device stats differ from global ones
    x = jnp.asarray(_randn(2, 4, 5, c) + np.arange(4, dtype=np.float32)[:, None, None])

    def run(layer):
        return jax.pmap(lambda x: layer.apply(params, state, x, train=True),
                        axis_name="batch")(x)

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
    np.testing.assert_allclose(y, _bn_reference(xn, mean, var, np.ones(4), np.zeros(4), 1),
                               rtol=1e-5, atol=1e-5)


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
    params = {"scale": jnp.asarray(_randn(1, *normalized_shape)),
              "bias": jnp.asarray(_randn(2, *normalized_shape))}
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
        with pytest.raises(ValueError, match=r"BatchNorm: expected more than 1 value per channel "
                           rf"when training, got input of shape \({shape[0]}, 3\).*"
                           r"drop_remainder=True.*train=False"):
            apply(params, state, jnp.ones(shape), train=True)
    channels_first = BatchNorm(axis=1)
    _, p2, s2 = channels_first.init(jax.random.key(0), (-1, 2, 1))
    with pytest.raises(ValueError, match=r"BatchNorm\(axis=1\).*\(1, 2, 1\)"):
        jax.jit(lambda x: channels_first.apply(p2, s2, x, train=True))(jnp.ones((1, 2, 1)))
    apply(params, state, jnp.ones((1, 3)), train=False)   # eval mode uses the running stats
    channels_first.apply(p2, s2, jnp.ones((1, 2, 2)), train=True)  # 2 values per channel
    # Synced: one example per device is fine, the statistics are over all of them.
    synced = BatchNorm(axis_name="b")
    y, _ = jax.pmap(lambda x: synced.apply(params, state, x, train=True), axis_name="b")(
        jnp.arange(12.0).reshape(4, 1, 3))
    assert np.isfinite(y).all() and np.abs(y).max() > 0.5


# --------------------------------------------------------------------------- #
# RMSNorm, GroupNorm, LayerNorm(use_bias=False) against torch
# --------------------------------------------------------------------------- #

from funcnet.layers.normalization import GroupNorm, RMSNorm  # noqa: E402


def _torch_parity(layer, tmod, x, to_torch, dtype, tol, params_from):
    """Forward and gradients (input and params) of ``layer`` on ``x`` vs ``tmod`` on
    ``to_torch(x)`` (None: the same layout; "nchw": channels moved to axis 1)."""
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    tmod = tmod.to(tdtype)
    with torch.no_grad():
        for p in tmod.parameters():
            p.copy_(torch.rand(p.shape, dtype=tdtype) + 0.5)
    x = x.astype(dtype)
    back = (lambda a: a) if to_torch is None else (lambda a: np.moveaxis(a, 1, -1))
    tx = torch.tensor(x if to_torch is None else np.ascontiguousarray(np.moveaxis(x, -1, 1)),
                      requires_grad=True)
    ty = tmod(tx)
    cot = np.random.default_rng(7).standard_normal(ty.shape).astype(dtype)
    (ty * torch.tensor(cot)).sum().backward()
    params = params_from(tmod, dtype)
    f = lambda p, x: jnp.sum(layer.apply(p, (), x)[0] * jnp.asarray(back(cot)))
    y, _ = layer.apply(params, (), jnp.asarray(x))
    np.testing.assert_allclose(y, back(ty.detach().numpy()), rtol=tol, atol=tol)
    gp, gx = jax.grad(f, argnums=(0, 1))(params, jnp.asarray(x))
    np.testing.assert_allclose(gx, back(tx.grad.numpy()), rtol=tol, atol=tol)
    return gp, tmod


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-10)])
def test_rmsnorm_matches_torch(dtype, tol):
    x = _randn(0, 3, 5, 8) * 3
    with jax.enable_x64(dtype == np.float64):
        gp, tmod = _torch_parity(RMSNorm(), torch.nn.RMSNorm(8), x, None, dtype, tol,
                                 lambda m, d: {"scale": jnp.asarray(m.weight.detach().numpy())})
        np.testing.assert_allclose(gp["scale"], tmod.weight.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-10)])
def test_groupnorm_matches_torch_nhwc_and_nchw(dtype, tol):
    x = _randn(1, 2, 4, 3, 6) * 2 + 1  # NHWC, 6 channels
    with jax.enable_x64(dtype == np.float64):
        params_from = lambda m, d: {"scale": jnp.asarray(m.weight.detach().numpy()),
                                    "bias": jnp.asarray(m.bias.detach().numpy())}
        gp, tmod = _torch_parity(GroupNorm(3), torch.nn.GroupNorm(3, 6), x, "nchw", dtype,
                                 tol, params_from)
        np.testing.assert_allclose(gp["scale"], tmod.weight.grad.numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(gp["bias"], tmod.bias.grad.numpy(), rtol=tol, atol=tol)
        # axis=1 on NCHW directly
        gp, tmod = _torch_parity(GroupNorm(2, axis=1), torch.nn.GroupNorm(2, 6),
                                 np.ascontiguousarray(np.moveaxis(x, -1, 1)), None, dtype,
                                 tol, params_from)
        np.testing.assert_allclose(gp["bias"], tmod.bias.grad.numpy(), rtol=tol, atol=tol)


def test_layernorm_without_bias_matches_torch():
    x = _randn(2, 4, 6) * 2
    tmod = torch.nn.LayerNorm(6, bias=False)
    with torch.no_grad():
        tmod.weight.uniform_(0.5, 1.5)
    layer = LayerNorm(use_bias=False)
    _, params, _ = layer.init(jax.random.key(0), (-1, 6))
    assert set(params) == {"scale"}
    y, _ = layer.apply({"scale": jnp.asarray(tmod.weight.detach().numpy())}, (), jnp.asarray(x))
    np.testing.assert_allclose(y, tmod(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert set(LayerNorm(center=False).init(jax.random.key(0), (-1, 6))[1]) == {"scale"}
    with pytest.raises(ValueError, match="same switch"):
        LayerNorm(center=True, use_bias=False)


def test_rmsnorm_eps_follows_the_input_dtype_and_bf16_stays_bf16():
    x = jnp.full((1, 4), 1e-4, jnp.float32)
    layer = RMSNorm(scale=False)
    y, _ = layer.apply({}, (), x)
    want = 1e-4 / np.sqrt(1e-8 + np.finfo(np.float32).eps)  # torch: finfo(input dtype).eps
    np.testing.assert_allclose(y, want, rtol=1e-5)
    xb = jnp.asarray(_randn(3, 2, 8) * 4).astype(jnp.bfloat16)
    yb, _ = RMSNorm().apply({"scale": jnp.ones(8)}, (), xb)
    y32, _ = RMSNorm(epsilon=float(jnp.finfo(jnp.bfloat16).eps)).apply(
        {"scale": jnp.ones(8)}, (), xb.astype(jnp.float32))
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_allclose(yb.astype(jnp.float32), y32, rtol=2e-2, atol=2e-2)
    gb, _ = GroupNorm(2).apply({"scale": jnp.ones(8), "bias": jnp.zeros(8)}, (), xb)
    assert gb.dtype == jnp.bfloat16


def test_rms_and_group_norm_contract_and_errors():
    check_layer(RMSNorm(), (-1, 3, 4))
    check_layer(GroupNorm(2), (-1, 3, 3, 4))
    with pytest.raises(ValueError, match="num_groups=3 does not divide the 4 channels"):
        GroupNorm(3).init(jax.random.key(0), (-1, 5, 4))
    with pytest.raises(ValueError, match="axis 0 is the batch"):
        GroupNorm(1, axis=0).init(jax.random.key(0), (4, 5))
    with pytest.raises(ValueError, match="built for"):
        RMSNorm().apply({"scale": jnp.ones(3)}, (), jnp.ones((2, 4)))
