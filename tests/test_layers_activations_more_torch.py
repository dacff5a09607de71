"""Glu, LogSigmoid, Softsign, Tanhshrink and Threshold against their torch.nn modules:
random shapes, arguments and inputs (kinks written in), outputs and input gradients,
float32 and float64; Glu's shapes and its odd-size error; Threshold's NaN and ties."""

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
ROUNDS = 4


def _shape(rng, even_axis=None):
    """A random shape of rank 1 to 4, sizes 1 to 5; ``even_axis`` gets an even size."""
    shape = [int(d) for d in rng.integers(1, 6, rng.integers(1, 5))]
    if even_axis is not None:
        ax = even_axis % len(shape) if -len(shape) <= even_axis < len(shape) else -1
        shape[ax] = 2 * int(rng.integers(1, 4))
    return tuple(shape)


def _inputs(rng, shape, dtype, kinks=()):
    """Uniform in [-8, 8] with 0, -0, +-20 and ``kinks`` written in where there is room."""
    x = rng.uniform(-8, 8, shape)
    fixed = [0.0, -0.0, 20.0, -20.0, *kinks][: x.size]
    x.reshape(-1)[rng.permutation(x.size)[: len(fixed)]] = fixed
    return x.astype(dtype)


def _torch(module, x, g):
    xt = torch.tensor(x, requires_grad=True)
    yt = module(xt)
    (yt * torch.tensor(g)).sum().backward()
    return yt.detach().numpy(), xt.grad.numpy()


def _configs(rng):
    """(funcnet layer, torch module, kinks, axis to keep even or None), ROUNDS of each."""
    for i in range(ROUNDS):
        yield A.LogSigmoid, nn.LogSigmoid(), (), None
        yield A.Softsign, nn.Softsign(), (), None
        yield A.Tanhshrink, nn.Tanhshrink(), (1e-3, -1e-3), None
        t, v = (float(a) for a in rng.uniform(-5, 5, 2))
        yield (A.Threshold(t, v), nn.Threshold(t, v), (t, np.nextafter(t, np.inf), np.nextafter(t, -np.inf)), None)
        axis = -1 if i == 0 else int(rng.integers(-3, 3))
        yield (A.Glu if i == 0 else A.Glu(axis=axis), nn.GLU() if i == 0 else nn.GLU(dim=axis), (), axis)


def _cases(rng, dtype):
    """(layer, module, x, g): a random shape for each configuration."""
    for layer, module, kinks, axis in _configs(rng):
        shape = _shape(rng, axis)
        if axis is not None and not -len(shape) <= axis < len(shape):
            layer, module = A.Glu, nn.GLU()  # no such axis at this rank: torch's default
        out_shape = layer.init(jax.random.key(0), shape)[0]
        yield (layer, module, _inputs(rng, shape, dtype, kinks), rng.standard_normal(out_shape).astype(dtype))


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_activations_match_torch(dtype, rtol, atol):
    rng = np.random.default_rng(0)
    cases = list(_cases(rng, dtype))

    @jax.jit
    def outputs_and_gradients(xs, gs):  # every layer in one compilation: fast
        out = []
        for (layer, _, _, _), x, g in zip(cases, xs, gs):
            y, vjp = jax.vjp(lambda x: layer.apply((), (), x)[0], x)
            out.append((y, vjp(g)[0]))
        return out

    with jax.enable_x64(dtype == np.float64):
        got = outputs_and_gradients([c[2] for c in cases], [c[3] for c in cases])
    for (layer, module, x, g), (y, gx) in zip(cases, got):
        yt, gxt = _torch(module, x, g)
        where = f"{layer.name} vs {module} on {x.shape}"
        assert y.dtype == dtype and y.shape == yt.shape == g.shape, where
        np.testing.assert_allclose(y, yt, rtol=rtol, atol=atol, err_msg=where)
        np.testing.assert_allclose(gx, gxt, rtol=rtol, atol=atol, err_msg=where)
    names = {layer.name.split("(")[0] for layer, *_ in cases}
    assert names == {"LogSigmoid", "Softsign", "Tanhshrink", "Threshold", "Glu"}


def test_glu_by_hand_and_shapes():
    """a * sigmoid(b), the first half gated by the second, on the axis chosen."""
    x = jnp.array([[1.0, -2.0, 0.0, 40.0], [3.0, 4.0, -40.0, 0.0]])
    np.testing.assert_allclose(A.Glu.apply((), (), x)[0], [[0.5, -2.0], [0.0, 2.0]], atol=1e-7)
    y = A.Glu(axis=0).apply((), (), x)[0]
    np.testing.assert_allclose(y, x[:1] * jax.nn.sigmoid(x[1:]), rtol=1e-7)
    key = jax.random.key(0)
    assert A.Glu.init(key, (-1, 5, 8))[0] == (-1, 5, 4)
    assert A.Glu(axis=1).init(key, (-1, 6, 3))[0] == (-1, 3, 3)
    assert A.Glu(axis=1).init(key, (2, -1, 3))[0] == (2, -1, 3)
    net = serial(Dense(6), A.Glu, Dense(2))
    out_shape, params, _ = net.init(key, (-1, 4))
    assert out_shape == (-1, 2) and params[2]["W"].shape == (3, 2)
    check_layer(A.Glu(axis=-2), (-1, 4, 3), train_modes=(False,))
    assert A.Glu.name == "Glu" and A.Glu(axis=2).name == "Glu(axis=2)"
    assert not callable(A.Glu(axis=1))


def test_glu_odd_size_is_refused_as_in_torch():
    with pytest.raises(
        ValueError,
        match=r"Glu: the input's size on axis -1 must be even.*"
        r"got 5 in shape \(-1, 5\).*Dense\(2 \* k\)",
    ):
        A.Glu.init(jax.random.key(0), (-1, 5))
    with pytest.raises(
        ValueError,
        match=r"Glu\(axis=0\): the input's size on axis 0 must be "
        r"even.*got 3 in shape \(3, 2\)",
    ):
        A.Glu(axis=0).apply((), (), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"Glu\(axis=2\): axis 2 is out of range for a rank-2"):
        A.Glu(axis=2).init(jax.random.key(0), (-1, 4))
    with pytest.raises(ArgumentError, match=r"Glu: axis must be an int, got 1\.0"):
        A.Glu(1.0)
    with pytest.raises(RuntimeError, match="even"):
        nn.GLU()(torch.ones(2, 5))


def test_threshold_ties_nan_and_arguments():
    layer = A.Threshold(1.0, -7.0)
    assert layer.name == "Threshold(threshold=1.0, value=-7.0)"
    x = jnp.array([1.0, np.nextafter(np.float32(1), np.float32(2)), np.nan, -np.inf, np.inf])
    y, vjp = jax.vjp(lambda x: layer.apply((), (), x)[0], x)
    np.testing.assert_array_equal(y, [-7.0, x[1], np.nan, -7.0, np.inf])
    (g,) = vjp(jnp.arange(1.0, 6.0))
    np.testing.assert_array_equal(g, [0.0, 2.0, 3.0, 0.0, 5.0])  # 0 at the tie; NaN passes
    for bad, pattern in (
        ("1", r"threshold must be a real number, got '1'"),
        (float("nan"), r"threshold must be a finite real number"),
    ):
        with pytest.raises(ArgumentError, match="Threshold: " + pattern):
            A.Threshold(bad, 0.0)
    with pytest.raises(ArgumentError, match=r"Threshold: value must be a real number, got None"):
        A.Threshold(0.0, None)
    with pytest.raises(TypeError):
        A.Threshold(0.5)  # both required, as torch.nn.Threshold's
    xt = torch.tensor(np.asarray(x), requires_grad=True)
    yt = nn.Threshold(1.0, -7.0)(xt)
    yt.backward(torch.arange(1.0, 6.0))
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(g, xt.grad.numpy())


def test_parameter_free_ones_are_layers():
    for layer in (A.LogSigmoid, A.Softsign, A.Tanhshrink, A.Threshold(0.0, 1.0)):
        assert layer.init(jax.random.key(0), (-1, 3))[0] == (-1, 3)
    # far tails stay finite where the naive formula would give log(0) or 0 - 0 noise
    y = A.LogSigmoid.apply((), (), jnp.array([-200.0, 200.0]))[0]
    np.testing.assert_allclose(y, [-200.0, 0.0], atol=1e-30)
    assert float(jax.grad(lambda x: A.Softsign.apply((), (), x)[0])(0.0)) == 1.0
