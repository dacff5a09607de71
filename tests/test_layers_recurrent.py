"""funcnet.layers RNN, LSTM and GRU, against PyTorch."""

import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch
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


@pytest.mark.parametrize(
    "kind,nonlinearity,gates", [("RNN", "tanh", 1), ("RNN", "relu", 1), ("LSTM", None, 4), ("GRU", None, 3)]
)
def test_recurrent_matches_torch(kind, nonlinearity, gates):
    torch.manual_seed(0)
    module = _torch_module(kind, nonlinearity)
    # the documented layout: W_ih = weight_ih_l0.T, W_hh = weight_hh_l0.T, biases as they are
    params = {
        "W_ih": module.weight_ih_l0.detach().numpy().T,
        "W_hh": module.weight_hh_l0.detach().numpy().T,
        "b_ih": module.bias_ih_l0.detach().numpy(),
        "b_hh": module.bias_hh_l0.detach().numpy(),
    }
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
    eqns = [jax.make_jaxpr(lambda x: layer.apply(params, (), x))(jnp.zeros((2, t, F))).jaxpr.eqns for t in (3, 30)]
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


@pytest.mark.parametrize("layer", [RNN(3), LSTM(3, return_sequences=False), GRU(3)], ids=lambda l: l.name)
def test_recurrent_contract(layer):
    check_layer(layer, (-1, 3, 2), inputs=jnp.asarray(_randn(0, 2, 3, 2)), train_modes=(False,), grad_check=False)


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


# --------------------------------------------------------------------------- #
# torch's full recurrent layers: layers, directions, initial state, lengths
# --------------------------------------------------------------------------- #


def _load_torch(params, module, num_layers, dirs):
    with torch.no_grad():
        for k in range(num_layers):
            for d in range(dirs):
                sfx = f"l{k}" + ("_reverse" if d else "")
                p = params[sfx]
                getattr(module, f"weight_ih_{sfx}").copy_(torch.tensor(np.asarray(p["W_ih"]).T))
                getattr(module, f"weight_hh_{sfx}").copy_(torch.tensor(np.asarray(p["W_hh"]).T))
                getattr(module, f"bias_ih_{sfx}").copy_(torch.tensor(np.asarray(p["b_ih"])))
                getattr(module, f"bias_hh_{sfx}").copy_(torch.tensor(np.asarray(p["b_hh"])))


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_two_layer_bidirectional_with_lengths_and_initial_state_match_torch(kind):
    from funcnet import layers as L

    N, T, F, H = 3, 5, 4, 6
    layer = getattr(L, kind)(H, num_layers=2, bidirectional=True, return_state=True)
    shape, params, _ = layer.init(jax.random.key(0), (-1, T, F))
    carries = 2 if kind == "LSTM" else 1
    assert shape[0] == (-1, T, 2 * H)
    r = np.random.default_rng(0)
    x = r.normal(size=(N, T, F)).astype(np.float32)
    lengths = np.array([5, 2, 4])
    h0 = [r.normal(size=(4, N, H)).astype(np.float32) for _ in range(carries)]
    init_state = tuple(h0) if carries == 2 else h0[0]
    (out, final), _ = jax.jit(lambda p, x, l, s: layer.apply(p, (), x, lengths=l, initial_state=s))(
        params, x, lengths, init_state
    )

    module = getattr(torch.nn, kind)(F, H, num_layers=2, bidirectional=True, batch_first=True)
    _load_torch(params, module, 2, 2)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.tensor(x), torch.tensor(lengths), batch_first=True, enforce_sorted=False
    )
    state_in = tuple(torch.tensor(h) for h in h0) if carries == 2 else torch.tensor(h0[0])
    t_out, t_final = module(packed, state_in)
    t_out, _ = torch.nn.utils.rnn.pad_packed_sequence(t_out, batch_first=True, total_length=T)
    np.testing.assert_allclose(np.asarray(out), t_out.detach().numpy(), rtol=1e-5, atol=1e-5)
    finals = final if carries == 2 else (final,)
    t_finals = t_final if carries == 2 else (t_final,)
    for a, b in zip(finals, t_finals):
        np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert not np.asarray(out)[1, 2:].any()  # padded steps output zeros


def test_full_recurrent_layer_contract_dropout_and_bad_input():
    from funcnet import layers as L
    from funcnet.testing import check_layer

    layer = L.GRU(4, num_layers=2, bidirectional=True, dropout=0.5)
    check_layer(layer, (-1, 3, 2), train_modes=(False,))
    _, params, _ = layer.init(jax.random.key(0), (-1, 3, 2))
    x = jnp.ones((2, 3, 2))
    a, _ = layer.apply(params, (), x, rng=jax.random.key(1), train=True)
    b, _ = layer.apply(params, (), x, rng=jax.random.key(2), train=True)
    c, _ = layer.apply(params, (), x)
    assert not np.allclose(a, b) and a.shape == c.shape == (2, 3, 8)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 3\].*from 1 to 4"):
        layer.apply(params, (), x, lengths=np.array([1, 4]))
    with pytest.raises(ValueError, match=r"lengths must be 2 integers"):
        layer.apply(params, (), x, lengths=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"initial_state arrays must have shape \(4, 2, 4\)"):
        layer.apply(params, (), x, initial_state=jnp.zeros((2, 2, 4)))
    with pytest.raises(ValueError, match="dropout=1.0 must be in"):
        L.LSTM(4, num_layers=2, dropout=1.0)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_two_layer_bidirectional_without_lengths_or_initial_state_match_torch(kind):
    from funcnet import layers as L

    N, T, F, H = 3, 5, 4, 6
    layer = getattr(L, kind)(H, num_layers=2, bidirectional=True, return_state=True)
    _, params, _ = layer.init(jax.random.key(0), (-1, T, F))
    x = np.random.default_rng(1).normal(size=(N, T, F)).astype(np.float32)
    out, final = jax.jit(lambda p, x: layer.apply(p, (), x)[0])(params, x)
    module = getattr(torch.nn, kind)(F, H, num_layers=2, bidirectional=True, batch_first=True)
    _load_torch(params, module, 2, 2)
    t_out, t_final = module(torch.tensor(x))  # zero initial state, full sequences
    np.testing.assert_allclose(np.asarray(out), t_out.detach().numpy(), rtol=1e-5, atol=1e-5)
    pairs = zip(final, t_final) if kind == "LSTM" else [(final, t_final)]
    for a, b in pairs:
        np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_lengths_out_of_range_are_refused_when_known_and_clipped_under_jit():
    from funcnet import layers as L
    from funcnet.errors import ArgumentError

    layer = L.GRU(3, bidirectional=True)
    _, params, _ = layer.init(jax.random.key(0), (-1, 4, 2))
    x = jnp.asarray(_randn(2, 2, 4, 2))
    with pytest.raises(
        ArgumentError,
        match=r"GRU\(3\): lengths must lie in \[0, 4\] \(the "
        r"sequence length\), got -2 at index 1",
    ):
        layer.apply(params, (), x, lengths=np.array([3, -2]))
    with pytest.raises(ValueError, match=r"got 6 at index 0"):
        layer.apply(params, (), x, lengths=np.array([6, 1]))
    # under jit the values are unknown: -2 acts as 0 and 6 as 4 (the reverse direction
    # no longer reads past the sequence's end, which gave NaN)
    f = jax.jit(lambda lengths: layer.apply(params, (), x, lengths=lengths)[0])
    clipped = np.asarray(f(np.array([-2, 6])))
    assert np.isfinite(clipped).all()
    np.testing.assert_array_equal(clipped, np.asarray(f(np.array([0, 4]))))
