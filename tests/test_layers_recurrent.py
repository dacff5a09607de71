"""funcnet.layers RNN, LSTM and GRU, against PyTorch."""
import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.test_util import check_grads
from funcnet.combinators import serial
from funcnet.layers.recurrent import GRU, LSTM, RNN
from funcnet.testing import check_layer

def _randn(seed, *shape):
    """float32 test data from NumPy: no jax.random program to compile per shape."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


N, T, F, H = 3, 5, 4, 6


def _torch_module(kind, nonlinearity):
    if kind == "RNN":
        return torch.nn.RNN(F, H, nonlinearity=nonlinearity, batch_first=True)
    return getattr(torch.nn, kind)(F, H, batch_first=True)


def _layer(kind, nonlinearity, return_sequences):
    if kind == "RNN":
        return RNN(H, nonlinearity=nonlinearity, return_sequences=return_sequences)
    return {"LSTM": LSTM, "GRU": GRU}[kind](H, return_sequences=return_sequences)


@pytest.mark.parametrize("kind,nonlinearity,gates",
                         [("RNN", "tanh", 1), ("RNN", "relu", 1), ("LSTM", None, 4),
                          ("GRU", None, 3)])
def test_recurrent_matches_torch(kind, nonlinearity, gates):
    torch.manual_seed(0)
    module = _torch_module(kind, nonlinearity)
    # the documented layout: W_ih = weight_ih_l0.T, W_hh = weight_hh_l0.T, biases as they are
    params = {"W_ih": module.weight_ih_l0.detach().numpy().T,
              "W_hh": module.weight_hh_l0.detach().numpy().T,
              "b_ih": module.bias_ih_l0.detach().numpy(),
              "b_hh": module.bias_hh_l0.detach().numpy()}
    params = {k: jnp.asarray(v) for k, v in params.items()}
    x = _randn(1, N, T, F)
    y_torch, h_n = module(torch.tensor(x))
    if kind == "LSTM":
        h_n = h_n[0]
    y_torch, h_n = y_torch.detach().numpy(), h_n[0].detach().numpy()

    for return_sequences, want in [(True, y_torch), (False, h_n)]:
        layer = _layer(kind, nonlinearity, return_sequences)
        out_shape, ours, state = layer.init(jax.random.key(0), (-1, T, F))
        assert out_shape == ((-1, T, H) if return_sequences else (-1, H)) and state == ()
        assert jax.tree.map(jnp.shape, ours) == jax.tree.map(jnp.shape, params)
        assert params["W_ih"].shape == (F, gates * H)
        y, _ = jax.jit(lambda p, x: layer.apply(p, (), x))(params, jnp.asarray(x))
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y_torch[:, -1], h_n, rtol=1e-6)  # the two torch outputs agree


@pytest.mark.parametrize("layer", [RNN(H), LSTM(H), GRU(H)], ids=lambda l: l.name)
def test_recurrent_init_range_and_scan(layer):
    _, params, _ = layer.init(jax.random.key(0), (-1, T, F))
    bound = 1 / math.sqrt(H)
    for k, p in params.items():
        p = np.asarray(p)
        assert np.abs(p).max() <= bound, k
        assert np.abs(p).max() > 0.7 * bound, k  # spans the range, not e.g. U(0, small)
    # one lax.scan, not a Python loop over time: the program does not grow with T
    eqns = [jax.make_jaxpr(lambda x: layer.apply(params, (), x))(jnp.zeros((2, t, F))).jaxpr.eqns
            for t in (3, 30)]
    assert "scan" in [e.primitive.name for e in eqns[0]]
    assert len(eqns[0]) == len(eqns[1])


def test_recurrent_errors():
    with pytest.raises(ValueError, match="RNN.*nonlinearity.*'sigmoid'"):
        RNN(4, nonlinearity="sigmoid")
    for make in (RNN, LSTM, GRU):
        with pytest.raises(ValueError, match="hidden_size"):
            make(0)
    init, apply = LSTM(3)
    with pytest.raises(ValueError, match=r"LSTM\(3\).*rank-3"):
        init(jax.random.key(0), (-1, 4))
    _, params, _ = init(jax.random.key(0), (-1, 5, 4))
    with pytest.raises(ValueError, match=r"LSTM\(3\).*2 features.*built for 4"):
        apply(params, (), jnp.ones((2, 5, 2)))
    with pytest.raises(ValueError, match=r"LSTM\(3\).*rank-3"):
        apply(params, (), jnp.ones((5, 4)))


@pytest.mark.parametrize("layer", [RNN(3), LSTM(3, return_sequences=False), GRU(3)],
                         ids=lambda l: l.name)
def test_recurrent_contract(layer):
    check_layer(layer, (-1, 3, 2), inputs=jnp.asarray(_randn(0, 2, 3, 2)), train_modes=(False,),
                grad_check=False)


def test_recurrent_grads():
    # float64 check_grads on every param and the input, through all three cells at once
    # and jitted: one set of x64 compilations instead of three eager ones.
    stack = serial(RNN(3, nonlinearity="relu"), LSTM(4), GRU(3, return_sequences=False))
    _, params, state = stack.init(jax.random.key(0), (-1, 3, 2))
    with jax.enable_x64(True):
        params64 = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params)
        x64 = jnp.asarray(_randn(0, 2, 3, 2), jnp.float64)
        f = jax.jit(lambda p, x: stack.apply(p, state, x)[0])
        assert f(params64, x64).dtype == jnp.float64
        check_grads(f, (params64, x64), order=1, modes=["rev"])
