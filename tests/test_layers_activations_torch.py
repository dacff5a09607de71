"""Activations with torch's arguments against the torch.nn modules: random arguments and
inputs with the kinks (0, +-3, min_val/max_val, threshold / beta) in them, outputs and
input gradients (and Prelu's weight gradient), float32 and float64; the arguments torch
refuses; and the layer-or-constructor design of the optional-argument names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.combinators import serial
from funcnet.errors import ArgumentError
from funcnet.layers import Dense
from funcnet.layers import activations as A
from funcnet.testing import check_layer

from helpers.torch_ref import torch

nn = torch.nn

# (dtype, rtol, atol)
DTYPES = [(np.float32, 1e-6, 2e-6), (np.float64, 1e-12, 1e-12)]
_TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}
SHAPE = (4, 5, 3)  # (N, L, C) channels-last; torch's Prelu sees (N, C, L)
CONFIGS = 20


def _inputs(rng, dtype, kinks=()):
    """Uniform in [-6, 6] with the common kinks and ``kinks`` written in."""
    x = rng.uniform(-6, 6, SHAPE)
    fixed = [0.0, -0.0, 3.0, -3.0, 6.0, -6.0, 1.0, -1.0, 20.0, -20.0, *kinks]
    x.reshape(-1)[rng.permutation(x.size)[: len(fixed)]] = fixed
    return x.astype(dtype)


def _uniform_nonzero(rng, low, high, gap):
    """A uniform draw with ``|v| >= gap``: the arguments torch divides by."""
    v = rng.uniform(low, high)
    return v if abs(v) >= gap else float(np.copysign(gap, v))


def _jax_forward_and_grads(layer, params, x, g):
    _, state = (), ()
    y, vjp = jax.vjp(lambda p, x: layer.apply(p, state, x)[0], params, jnp.asarray(x))
    gp, gx = vjp(jnp.asarray(g))
    return y, gx, gp


def _torch_forward_and_grads(module, x, g, transpose=False):
    xt = torch.tensor(x, requires_grad=True)
    inp = xt.transpose(1, 2) if transpose else xt
    yt = module(inp)
    yt = yt.transpose(1, 2) if transpose else yt
    (yt * torch.tensor(g)).sum().backward()
    return yt.detach().numpy(), xt.grad.numpy()


def _configs(rng):
    """(funcnet layer, torch module, extra kinks) per option, CONFIGS of each; the first
    of each is the bare name against torch's defaults."""
    out = []
    for i in range(CONFIGS):
        first = i == 0
        s = float(rng.choice([0.0, rng.uniform(-2, 2)]))
        out.append((A.LeakyRelu if first else A.LeakyRelu(s), nn.LeakyReLU() if first else nn.LeakyReLU(s), ()))
        a = float(rng.choice([0.0, rng.uniform(-2, 3)]))
        out.append((A.Elu if first else A.Elu(alpha=a), nn.ELU() if first else nn.ELU(alpha=a), ()))
        a = _uniform_nonzero(rng, -2, 3, 0.25)
        out.append((A.Celu if first else A.Celu(a), nn.CELU() if first else nn.CELU(a), ()))
        ap = ["none", "tanh"][i % 2]
        out.append((A.Gelu if first else A.Gelu(approximate=ap), nn.GELU() if first else nn.GELU(approximate=ap), ()))
        beta = _uniform_nonzero(rng, -3, 3, 0.1)
        thr = float(rng.uniform(-5, 25))
        kinks = (thr / beta, np.nextafter(thr / beta, np.inf), np.nextafter(thr / beta, -np.inf))
        out.append(
            (
                A.Softplus if first else A.Softplus(beta, threshold=thr),
                nn.Softplus() if first else nn.Softplus(beta, threshold=thr),
                (20.0,) if first else kinks,
            )
        )
        lo, hi = sorted(rng.uniform(-5, 5, 2))
        out.append(
            (
                A.Hardtanh if first else A.Hardtanh(min_val=lo, max_val=hi),
                nn.Hardtanh() if first else nn.Hardtanh(lo, hi),
                () if first else (lo, hi),
            )
        )
        # the argument-free ones: fresh inputs each round
        for layer, module in (
            (A.Relu, nn.ReLU()),
            (A.Relu6, nn.ReLU6()),
            (A.Selu, nn.SELU()),
            (A.Sigmoid, nn.Sigmoid()),
            (A.Tanh, nn.Tanh()),
            (A.Hardsigmoid, nn.Hardsigmoid()),
            (A.Hardswish, nn.Hardswish()),
            (A.Silu, nn.SiLU()),
            (A.Mish, nn.Mish()),
        ):
            out.append((layer, module, ()))
    # approximate="tanh" in 20 configurations ("none" in 10): 10 more, last, so that the
    # configurations above keep their random draws
    out += [(A.Gelu(approximate="tanh"), nn.GELU(approximate="tanh"), ())] * (CONFIGS // 2)
    tanh = sum(layer.name == "Gelu(approximate='tanh')" for layer, _, _ in out)
    assert tanh >= CONFIGS, tanh
    return out


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_activations_match_torch(dtype, rtol, atol):
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == np.float64):
        for layer, module, kinks in _configs(rng):
            x = _inputs(rng, dtype, kinks)
            g = rng.standard_normal(SHAPE).astype(dtype)
            y, gx, _ = _jax_forward_and_grads(layer, (), x, g)
            yt, gxt = _torch_forward_and_grads(module.to(_TORCH_DTYPE[dtype]), x, g)
            assert y.dtype == dtype, layer.name
            where = f"{layer.name} vs {module}"
            if isinstance(module, nn.CELU):
                _check_celu(x, g, y, gx, yt, gxt, module.alpha, rtol, atol, where)
                continue
            if layer.name == "Gelu(approximate='tanh')" and dtype == np.float32:
                # torch's float32 1 + tanh(.) cancels to 0 below about x = -4.5, where the
                # value is about -2e-6 (funcnet's agrees with the float64 formula there)
                x64 = x.astype(np.float64)
                exact = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
                np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-7, err_msg=where)
                np.testing.assert_allclose(y, yt, rtol=rtol, atol=1e-5, err_msg=where)
                np.testing.assert_allclose(gx, gxt, rtol=rtol, atol=1e-5, err_msg=where)
                continue
            np.testing.assert_allclose(y, yt, rtol=rtol, atol=atol, err_msg=where)
            if layer is A.Hardsigmoid and dtype == np.float64:
                # torch's backward multiplies by `1.0f / 6.0f`, a float32 constant, in
                # float64 too: off by 3e-8 relative. funcnet's is 1/6 in the input's dtype.
                np.testing.assert_allclose(gx, gxt, rtol=1e-7, err_msg=where)
                np.testing.assert_allclose(gx, np.where(gxt != 0, g / 6, 0), rtol=1e-15)
                continue
            np.testing.assert_allclose(gx, gxt, rtol=rtol, atol=atol, err_msg=where)


def _check_celu(x, g, y, gx, yt, gxt, alpha, rtol, atol, where):
    """CELU against torch with exp's condition number: an ulp of x / alpha is |x / alpha|
    ulps of exp(x / alpha), and x / alpha reaches 80 here (x = -20, alpha = -0.25); torch
    and funcnet may round 1 / alpha (and x / alpha) apart by one ulp."""
    cond = 1 + np.abs(np.minimum(x, 0) / alpha)

    def close(actual, desired, rtol, what):
        bad = np.abs(actual - desired) > atol + rtol * cond * np.abs(desired)
        assert not bad.any(), f"{where}, {what}: {actual[bad]} != {desired[bad]} at {x[bad]}"

    close(y, yt, rtol, "output")
    if x.dtype == np.float32:
        close(gx, gxt, rtol, "input gradient")
    else:
        # torch's CELU backward takes 1 / alpha as a float (`1.0 / alpha.toFloat()`), in
        # float64 too: 3e-8 relative, times the condition number. funcnet keeps float64:
        # it matches torch to that, and the exact derivative to float64's precision.
        close(gx, gxt, 1e-7, "input gradient vs torch")
        exact = np.where(x > 0, g, g * np.exp(np.minimum(x, 0) / alpha))
        close(gx, exact, rtol, "input gradient vs exact")


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_prelu_matches_torch(dtype, rtol, atol):
    """Weights copied; channels-last axis=-1 is torch's dim 1 after a transpose, and
    axis=1 is torch's layout as it is."""
    rng = np.random.default_rng(1)
    N, L, C = SHAPE
    with jax.enable_x64(dtype == np.float64):
        kinds = [0, 0, 0]
        for i in range(3 * CONFIGS):  # each of the three kinds in CONFIGS configurations
            kind = i % 3  # one shared slope; per channel, channels-last; channels-first
            kinds[kind] += 1
            n, axis = [(1, -1), (C, -1), (L, 1)][kind]
            init = float(rng.uniform(-1, 1))
            layer = A.Prelu if i == 0 else A.Prelu(num_parameters=n, init=init, axis=axis)
            module = nn.PReLU() if i == 0 else nn.PReLU(num_parameters=n, init=init)
            module = module.to(_TORCH_DTYPE[dtype])
            _, params, state = layer.init(jax.random.key(i), (-1, L, C))
            assert state == () and params["weight"].shape == (n,)
            np.testing.assert_allclose(params["weight"], module.weight.detach().numpy(), rtol=1e-7, err_msg="init")
            w = rng.uniform(-2, 2, n).astype(dtype)
            with torch.no_grad():
                module.weight.copy_(torch.tensor(w))
            x = _inputs(rng, dtype)
            g = rng.standard_normal(SHAPE).astype(dtype)
            y, gx, gp = _jax_forward_and_grads(layer, {"weight": jnp.asarray(w)}, x, g)
            yt, gxt = _torch_forward_and_grads(module, x, g, transpose=kind == 1)
            where = f"{layer.name}: {module}"
            assert y.dtype == dtype, where
            np.testing.assert_allclose(y, yt, rtol=rtol, atol=atol, err_msg=where)
            np.testing.assert_allclose(gx, gxt, rtol=rtol, atol=atol, err_msg=where)
            np.testing.assert_allclose(
                gp["weight"], module.weight.grad.numpy(), rtol=rtol, atol=atol * SHAPE[0] * SHAPE[1], err_msg=where
            )
        assert min(kinds) >= CONFIGS, kinds


def test_gradients_at_kinks_are_torchs():
    """The points where jax.nn's own choice differs from torch's, pinned down."""

    def grad(layer, x):
        return float(jax.grad(lambda v: layer.apply((), (), v)[0])(x))

    assert grad(A.LeakyRelu(0.2), 0.0) == pytest.approx(0.2)  # jax.nn.leaky_relu: 1
    assert grad(A.Hardtanh(-2.0, 3.0), -2.0) == 0.0  # jax.nn.hard_tanh: 1
    assert grad(A.Hardtanh(-2.0, 3.0), 3.0) == 0.0
    assert grad(A.Celu(0.5), 0.0) == 1.0
    assert grad(A.Celu(0.5), 50.0) == 1.0  # no NaN from the other branch
    assert grad(A.Softplus(2.0, 10.0), 5.0 + 1e-3) == 1.0  # above the threshold: x
    at = float(A.Softplus(2.0, 10.0).apply((), (), jnp.float32(5.0))[0])  # beta x == threshold
    assert at == pytest.approx(float(nn.Softplus(2.0, 10.0)(torch.tensor(5.0))), abs=1e-6)
    assert at != 5.0  # torch's log branch
    _, params, _ = A.Prelu.init(None, (-1, 2))
    gx, gp = jax.grad(lambda x, p: A.Prelu.apply(p, (), x)[0].sum(), argnums=(0, 1))(jnp.zeros(2), params)
    np.testing.assert_array_equal(gx, [0.25, 0.25])
    np.testing.assert_array_equal(gp["weight"], [0.0])


def test_layer_or_constructor():
    for bare, called in (
        (A.Elu, A.Elu()),
        (A.Gelu, A.Gelu()),
        (A.Softplus, A.Softplus()),
        (A.Hardtanh, A.Hardtanh()),
        (A.Celu, A.Celu()),
        (A.LeakyRelu, A.LeakyRelu()),
    ):
        assert isinstance(bare, A.Layer) and callable(bare)
        assert bare.name == called.name
        assert not callable(called), called.name  # options are set once
    assert A.Elu(alpha=0.5).name == "Elu(alpha=0.5)" and A.Elu.name == "Elu"
    assert A.Gelu(approximate="tanh").name == "Gelu(approximate='tanh')"
    assert A.Softplus(threshold=10.0).name == "Softplus(threshold=10.0)"
    assert A.Prelu(3, axis=1).name == "Prelu(num_parameters=3, axis=1)"
    assert A.Swish is A.Silu
    x = jnp.linspace(-3, 3, 7)
    np.testing.assert_array_equal(A.Elu.apply((), (), x)[0], A.Elu(1.0).apply((), (), x)[0])
    # a bare name still goes anywhere a layer goes
    net = serial(Dense(4), A.Elu, A.Gelu, A.Prelu, A.Softplus(beta=2.0))
    out_shape, params, _ = net.init(jax.random.key(0), (-1, 3))
    assert out_shape == (-1, 4) and params[3] == {"weight": params[3]["weight"]}
    assert net.apply(params, (), jnp.ones((2, 3)))[0].shape == (2, 4)


def test_prelu_contract():
    check_layer(A.Prelu(num_parameters=4, init=0.1), (-1, 3, 4), train_modes=(False,))
    check_layer(A.Prelu, (-1, 2), train_modes=(False,))


# (call, the message's pattern, the torch call that refuses the same value or None)
BAD = [
    (lambda: A.Elu("1"), r"Elu: alpha must be a real number, got '1'", None),
    (lambda: A.Elu(alpha=float("nan")), r"Elu: alpha must be a finite real.*nan", None),
    (lambda: A.Celu(0.0), r"Celu: alpha must not be 0.*got 0\.0", lambda: nn.CELU(0.0)(torch.ones(2))),
    (
        lambda: A.Gelu("foo"),
        r"Gelu: approximate must be one of 'none', 'tanh', got 'foo'",
        lambda: nn.GELU("foo")(torch.ones(2)),
    ),
    (lambda: A.Gelu(True), r"Gelu: approximate must be 'none' or 'tanh'.*got True.*'tanh'", None),
    (lambda: A.Softplus(beta=0), r"Softplus: beta must not be 0.*got 0\.0", None),
    (lambda: A.Softplus(threshold=float("inf")), r"Softplus: threshold must be a finite.*inf", None),
    (
        lambda: A.Hardtanh(1.0, 1.0),
        r"Hardtanh: max_val \(1\.0\) must be greater than "
        r"min_val \(1\.0\)",
        lambda: nn.Hardtanh(1.0, 1.0),
    ),
    (
        lambda: A.Hardtanh(min_val=2, max_val=1),
        r"max_val \(1\.0\) must be greater than "
        r"min_val \(2\.0\).*Hardtanh\(min_val=1\.0, max_val=2\.0\)",
        lambda: nn.Hardtanh(2, 1),
    ),
    (lambda: A.LeakyRelu(None), r"LeakyRelu: negative_slope must be a real number, got None", None),
    (lambda: A.Prelu(0), r"Prelu: num_parameters must be a positive int, got 0", None),
    (lambda: A.Prelu(2.0), r"Prelu: num_parameters must be a positive int, got 2\.0", None),
    (lambda: A.Prelu(init="0.25"), r"Prelu: init must be a real number, got '0\.25'", None),
    (lambda: A.Prelu(axis=1.0), r"Prelu: axis must be an int .*got 1\.0", None),
    (
        lambda: A.Prelu(4).init(jax.random.key(0), (-1, 5, 3)),
        r"Prelu\(num_parameters=4\): num_parameters \(4\) must be 1 or the channel count, the "
        r"input's size on axis -1 \(3\).*Prelu\(num_parameters=3\)",
        lambda: nn.PReLU(4)(torch.ones(2, 3, 5)),
    ),
    (
        lambda: A.Prelu(3).init(jax.random.key(0), (-1,)),
        r"Prelu\(num_parameters=3\): "
        r"expected an input of rank >= 2",
        None,
    ),
    (
        lambda: A.Prelu(3).apply({"weight": jnp.ones(3)}, (), jnp.ones((2, 4))),
        r"Prelu\(num_parameters=3\): input has 4 channels on axis 1 but the params were built "
        r"for 3",
        lambda: nn.PReLU(3)(torch.ones(2, 4)),
    ),
    (
        lambda: A.Prelu(3).apply({"weight": jnp.ones(1)}, (), jnp.ones((2, 3))),
        r"Prelu\(num_parameters=3\).*expects \{'weight': shape \(3,\)\}",
        None,
    ),
]


@pytest.mark.parametrize("call,pattern,torch_call", BAD)
def test_bad_arguments(call, pattern, torch_call):
    with pytest.raises(ValueError, match=pattern):  # ArgumentError and MismatchError both
        call()
    if torch_call is not None:  # torch refuses the same value
        with pytest.raises((RuntimeError, AssertionError, ValueError)):
            torch_call()


def test_bad_argument_is_argument_error():
    with pytest.raises(ArgumentError):
        A.Hardtanh(0.0, -1.0)
