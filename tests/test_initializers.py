"""Initializers against torch.nn.init: same distribution family, bounds and variance."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch

from funcnet import initializers as fi

KEY = jax.random.key(0)


def _torch_sample(fn, shape_out_in, **kw):
    w = torch.empty(*shape_out_in)
    fn(w, **kw)
    return w.numpy()


@pytest.mark.parametrize("shape", [(300, 200), (5, 5, 16, 32)])
def test_torch_default_is_uniform_one_over_sqrt_fan_in(shape):
    fan_in = int(np.prod(shape[:-1]))
    w = np.asarray(fi.torch_default()(KEY, shape, jnp.float32))
    bound = 1 / math.sqrt(fan_in)
    assert w.max() <= bound and w.min() >= -bound
    np.testing.assert_allclose(w.var(), bound**2 / 3, rtol=0.05)
    # torch: nn.Linear / nn.Conv2d reset_parameters uses kaiming_uniform_(a=sqrt(5)).
    torch_shape = (shape[-1], shape[-2]) + tuple(shape[:-2])
    t = _torch_sample(torch.nn.init.kaiming_uniform_, torch_shape, a=math.sqrt(5))
    np.testing.assert_allclose(np.abs(t).max(), bound, rtol=0.02)
    np.testing.assert_allclose(t.var(), w.var(), rtol=0.08)


def test_torch_default_bias():
    b = np.asarray(fi.torch_default_bias(400)(KEY, (10000,), jnp.float32))
    assert np.abs(b).max() <= 1 / 20
    np.testing.assert_allclose(b.var(), (1 / 20) ** 2 / 3, rtol=0.05)


@pytest.mark.parametrize("slope, nonlin", [(0.0, "relu"), (0.2, "leaky_relu"), (0.0, "leaky_relu")])
@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
def test_kaiming_matches_torch_variance(slope, nonlin, mode):
    shape = (400, 300)  # (in, out); torch's weight is (out, in)
    fan = 400 if mode == "fan_in" else 300
    gain = math.sqrt(2.0) if nonlin == "relu" else math.sqrt(2.0 / (1 + slope**2))
    std = gain / math.sqrt(fan)
    u = np.asarray(fi.kaiming_uniform(slope, mode, nonlin)(KEY, shape))
    n = np.asarray(fi.kaiming_normal(slope, mode, nonlin)(KEY, shape))
    assert np.abs(u).max() <= math.sqrt(3) * std
    np.testing.assert_allclose(u.std(), std, rtol=0.03)
    np.testing.assert_allclose(n.std(), std, rtol=0.03)
    assert np.abs(n).max() > 3 * std  # not truncated, as torch
    tu = _torch_sample(torch.nn.init.kaiming_uniform_, (300, 400), a=slope, mode=mode, nonlinearity=nonlin)
    tn = _torch_sample(torch.nn.init.kaiming_normal_, (300, 400), a=slope, mode=mode, nonlinearity=nonlin)
    np.testing.assert_allclose(u.std(), tu.std(), rtol=0.04)
    np.testing.assert_allclose(n.std(), tn.std(), rtol=0.04)


def test_xavier_uniform_is_tinynn_and_torch():
    w = np.asarray(fi.xavier_uniform()(KEY, (784, 400)))
    bound = math.sqrt(6 / (784 + 400))
    assert np.abs(w).max() <= bound
    np.testing.assert_allclose(np.abs(w).max(), bound, rtol=0.01)
    t = _torch_sample(torch.nn.init.xavier_uniform_, (400, 784))
    np.testing.assert_allclose(w.std(), t.std(), rtol=0.03)
    np.testing.assert_array_equal(w, np.asarray(jax.nn.initializers.glorot_uniform()(KEY, (784, 400))))


def test_calculate_gain_matches_torch():
    for name in ["linear", "sigmoid", "tanh", "relu", "selu", "conv2d"]:
        assert fi.calculate_gain(name) == pytest.approx(torch.nn.init.calculate_gain(name))
    assert fi.calculate_gain("leaky_relu", 0.3) == pytest.approx(torch.nn.init.calculate_gain("leaky_relu", 0.3))
    with pytest.raises(ValueError, match="unknown nonlinearity"):
        fi.calculate_gain("swish")
