"""funcnet.layers activations, against PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import F, torch
from funcnet.layers import activations as A
from funcnet.testing import check_layer

RNG = np.random.default_rng(0)


def _randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


ACTIVATIONS = [
    (A.Relu, F.relu),
    (A.Elu, F.elu),
    (A.Selu, F.selu),
    (A.Gelu, F.gelu),  # torch's default is the exact erf form
    (A.Sigmoid, torch.sigmoid),
    (A.Tanh, torch.tanh),
    (A.Softplus, F.softplus),
    (A.LeakyRelu(), F.leaky_relu),  # both default to 0.01
    (A.LeakyRelu(0.2), lambda x: F.leaky_relu(x, 0.2)),
    (A.Softmax(), lambda x: F.softmax(x, dim=-1)),
    (A.Softmax(axis=1), lambda x: F.softmax(x, dim=1)),
    (A.LogSoftmax(), lambda x: F.log_softmax(x, dim=-1)),
    (A.LogSoftmax(axis=-2), lambda x: F.log_softmax(x, dim=-2)),
]


@pytest.mark.parametrize("layer,ref", ACTIVATIONS, ids=lambda v: getattr(v, "name", ""))
def test_activations_match_torch(layer, ref):
    x = 4 * _randn(2, 3, 5)
    x[0, 0, :3] = [-30.0, 0.0, 30.0]  # tails and the kink
    out_shape, params, state = layer.init(jax.random.key(0), (-1, 3, 5))
    assert (out_shape, params, state) == ((-1, 3, 5), (), ())
    y, new_state = layer.apply((), (), jnp.asarray(x))
    assert new_state == () and y.shape == x.shape and y.dtype == jnp.float32
    np.testing.assert_allclose(y, ref(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_gelu_is_exact_not_tanh():
    x = jnp.linspace(-4, 4, 101)
    y, _ = A.Gelu.apply((), (), x)
    exact = F.gelu(torch.tensor(np.asarray(x)), approximate="none").numpy()
    tanh = F.gelu(torch.tensor(np.asarray(x)), approximate="tanh").numpy()
    np.testing.assert_allclose(y, exact, rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(y) - tanh).max() > 1e-4  # the two really differ


def test_activation_contract():
    # one stacked check: compiling is the cost, and all share the same code path
    check_layer(A.LeakyRelu(0.1), (-1, 4), train_modes=(False, True))
    check_layer(A.Gelu, (-1, 4), train_modes=(False,))
    check_layer(A.LogSoftmax(axis=1), (-1, 3, 2), train_modes=(False,))


def test_elementwise_and_names():
    layer = A.elementwise("Square", jnp.square)
    assert layer.name == "Square"
    assert layer.init(None, (-1, 2)) == ((-1, 2), (), ())
    np.testing.assert_array_equal(layer.apply((), (), jnp.arange(3.0))[0], [0.0, 1.0, 4.0])
    assert A.Relu.name == "Relu" and A.Softmax(1).name == "Softmax(axis=1)"
    assert A.Tanh.init(None, ()) == ((), (), ())  # scalars are fine elementwise


def test_activation_errors():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"Softmax\(axis=2\): axis 2 is out of range for a rank-2"):
        A.Softmax(axis=2).init(key, (-1, 4))
    with pytest.raises(ValueError, match=r"LogSoftmax\(axis=-3\).*rank-2"):
        A.LogSoftmax(axis=-3).apply((), (), jnp.ones((2, 3)))
    with pytest.raises(TypeError, match=r"Softmax: axis must be an int"):
        A.Softmax(axis=1.0)
    with pytest.raises(TypeError, match=r"LeakyRelu: negative_slope must be a real number"):
        A.LeakyRelu("0.1")
    with pytest.raises(TypeError, match=r"Relu.*only ints"):
        A.Relu.init(key, (-1, 2.5))
    with pytest.raises(TypeError, match=r"Relu: expected an array input"):
        A.Relu.apply((), (), [1.0, 2.0])
