"""LSTM(proj_size=P) against torch.nn.LSTM(proj_size=P): random configurations (1-2 layers,
one or two directions, with and without an initial state), weights loaded with
funcnet.interop.load_torch_state_dict, outputs, final (h, c) and the gradients w.r.t. the
input, the initial state and every parameter, float32 and float64; plus init, errors and the
loader without torch."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError, StateDictMismatchError
from funcnet.interop import load_torch_state_dict
from funcnet.layers.recurrent import LSTM

from helpers.torch_ref import torch

DTYPES = [(np.float32, 3e-5), (np.float64, 1e-10)]
_TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}
# (num_layers, bidirectional, initial_state); sizes are drawn per case
STRUCTURES = [(1, False, False), (1, True, True), (2, False, True), (2, True, False)]


def _case(seed):
    """A random small configuration: hidden size H, projection P < H, input features F."""
    r = np.random.default_rng(seed)
    H = int(r.integers(3, 6))
    return H, int(r.integers(1, H)), int(r.integers(2, 4)), r


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_layers,bidirectional,with_state", STRUCTURES)
@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")  # torch's own kernel choice
def test_lstm_proj_size_matches_torch_outputs_states_and_gradients(num_layers, bidirectional, with_state, dtype, tol):
    H, P, F, r = _case(10 * num_layers + 2 * bidirectional + with_state)
    N, T, D = 2, 3, 2 if bidirectional else 1
    torch.manual_seed(int(r.integers(2**31)))
    module = torch.nn.LSTM(F, H, num_layers=num_layers, bidirectional=bidirectional, batch_first=True, proj_size=P).to(
        _TORCH_DTYPE[dtype]
    )
    layer = LSTM(H, num_layers=num_layers, bidirectional=bidirectional, proj_size=P, return_state=True)
    with jax.enable_x64(dtype == np.float64):
        shape, like, state = layer.init(jax.random.key(0), (N, T, F))
        assert shape == ((N, T, D * P), ((num_layers * D, N, P), (num_layers * D, N, H)))
        like = jax.tree.map(lambda a: a.astype(dtype), like)  # the loader keeps dtypes
        params, _ = load_torch_state_dict(like, state, module.state_dict())
        x = r.standard_normal((N, T, F)).astype(dtype)
        h0 = r.standard_normal((num_layers * D, N, P)).astype(dtype)
        c0 = r.standard_normal((num_layers * D, N, H)).astype(dtype)
        gy, gh, gc = (r.standard_normal(s).astype(dtype) for s in [(N, T, D * P), h0.shape, c0.shape])

        def loss(p, x, h0, c0):
            (y, (h_n, c_n)), _ = layer.apply(p, state, x, initial_state=(h0, c0) if with_state else None)
            return jnp.sum(y * gy) + jnp.sum(h_n * gh) + jnp.sum(c_n * gc), (y, h_n, c_n)

        grads, outs = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(params, x, h0, c0)

    xt, h0t, c0t = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    yt, (hnt, cnt) = module(xt, (h0t, c0t)) if with_state else module(xt)
    ((yt * torch.tensor(gy)).sum() + (hnt * torch.tensor(gh)).sum() + (cnt * torch.tensor(gc)).sum()).backward()
    cfg = dict(H=H, P=P, F=F, num_layers=num_layers, bidirectional=bidirectional, with_state=with_state)
    for ours, theirs in zip(outs, (yt, hnt, cnt)):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
    gp, gx, gh0, gc0 = grads
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
    if with_state:
        np.testing.assert_allclose(gh0, h0t.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
        np.testing.assert_allclose(gc0, c0t.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
    # torch's weight gradients, weight_hr_l* among them, converted by the same loader
    with jax.enable_x64(dtype == np.float64):
        theirs, _ = load_torch_state_dict(like, state, {n: p.grad for n, p in module.named_parameters()})
    flat = jax.tree_util.tree_flatten_with_path(gp)[0]
    assert sum("W_hr" in jax.tree_util.keystr(path) for path, _ in flat) == num_layers * D
    for (path, a), b in zip(flat, jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{cfg} {jax.tree_util.keystr(path)}")


def test_lstm_proj_size_with_lengths_matches_packed_torch():
    H, P, F, N, T = 5, 2, 3, 3, 4
    layer = LSTM(H, num_layers=2, bidirectional=True, proj_size=P, return_state=True)
    _, like, state = layer.init(jax.random.key(0), (N, T, F))
    torch.manual_seed(1)
    module = torch.nn.LSTM(F, H, num_layers=2, bidirectional=True, batch_first=True, proj_size=P)
    params, _ = load_torch_state_dict(like, state, module.state_dict())
    x = np.random.default_rng(0).standard_normal((N, T, F)).astype(np.float32)
    lengths = np.array([4, 1, 3])
    (y, (h_n, c_n)), _ = layer.apply(params, state, x, lengths=lengths)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.tensor(x), torch.tensor(lengths), batch_first=True, enforce_sorted=False
    )
    yt, (hnt, cnt) = module(packed)
    yt, _ = torch.nn.utils.rnn.pad_packed_sequence(yt, batch_first=True, total_length=T)
    for ours, theirs in ((y, yt), (h_n, hnt), (c_n, cnt)):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=2e-5, atol=2e-5)


def test_torch_refuses_the_proj_sizes_funcnet_refuses():
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):
        torch.nn.LSTM(3, 4, proj_size=4)
    with pytest.raises(ArgumentError, match="has to be smaller than hidden_size"):
        LSTM(4, proj_size=4)


def test_proj_init_shapes_bounds_and_unprojected_entries_unchanged():
    H, P, F = 6, 2, 3
    shape, params, _ = LSTM(H, num_layers=2, bidirectional=True, proj_size=P).init(jax.random.key(0), (-1, 5, F))
    assert shape == (-1, 5, 2 * P)
    assert sorted(params) == ["l0", "l0_reverse", "l1", "l1_reverse"]
    for key, p in params.items():
        want = {
            "W_ih": ((F if key.startswith("l0") else 2 * P), 4 * H),
            "W_hh": (P, 4 * H),
            "b_ih": (4 * H,),
            "b_hh": (4 * H,),
            "W_hr": (H, P),
        }
        assert {k: v.shape for k, v in p.items()} == want
        # torch's U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for W_hr as for the rest
        assert float(jnp.abs(p["W_hr"]).max()) <= 1 / math.sqrt(H)
        assert float(jnp.abs(p["W_hr"]).max()) > 0.5 / math.sqrt(H)
    # a projection adds W_hr only: the other entries are those of the same LSTM without it
    _, plain, _ = LSTM(H).init(jax.random.key(3), (-1, 5, F))
    _, proj, _ = LSTM(H, proj_size=P).init(jax.random.key(3), (-1, 5, F))
    assert set(proj) - set(plain) == {"W_hr"}
    for k in ("W_ih", "b_ih", "b_hh"):
        np.testing.assert_array_equal(proj[k], plain[k])
    assert proj["W_hh"].shape == (P, 4 * H)


@pytest.mark.parametrize("bad", [4, 5, -1, 1.5, True, "2"])
def test_proj_size_must_be_an_int_below_hidden_size(bad):
    with pytest.raises(ArgumentError, match=r"LSTM: proj_size"):
        LSTM(4, proj_size=bad)


def test_proj_initial_state_shapes_are_named():
    layer = LSTM(4, proj_size=2)
    _, params, _ = layer.init(jax.random.key(0), (-1, 3, 2))
    x = jnp.ones((2, 3, 2))
    h0, c0 = jnp.zeros((1, 2, 2)), jnp.zeros((1, 2, 4))
    y, _ = layer.apply(params, (), x, initial_state=(h0, c0))
    assert y.shape == (2, 3, 2)
    msg = r"shapes \(1, 2, 2\) \(h_0\) and \(1, 2, 4\) \(c_0\).*got \(1, 2, 2\) for c_0"
    with pytest.raises(ValueError, match=msg):
        layer.apply(params, (), x, initial_state=(h0, h0))  # c_0 with proj_size features
    with pytest.raises(ValueError, match=r"got \(1, 2, 4\) for h_0"):
        layer.apply(params, (), x, initial_state=(c0, c0))


def test_loader_maps_weight_hr_from_numpy_and_names_a_missing_projection():
    H, P, F = 4, 3, 2
    r = np.random.default_rng(0)
    sd = {
        "weight_ih_l0": r.standard_normal((4 * H, F)),
        "weight_hh_l0": r.standard_normal((4 * H, P)),
        "bias_ih_l0": r.standard_normal(4 * H),
        "bias_hh_l0": r.standard_normal(4 * H),
        "weight_hr_l0": r.standard_normal((P, H)),
    }
    _, like, _ = LSTM(H, proj_size=P).init(jax.random.key(0), (-1, 3, F))
    params, _ = load_torch_state_dict(like, (), sd)
    np.testing.assert_array_equal(params["W_hr"], sd["weight_hr_l0"].T.astype(np.float32))
    np.testing.assert_array_equal(params["W_hh"], sd["weight_hh_l0"].T.astype(np.float32))
    # an LSTM without the projection does not take a projected module's weights
    _, plain, _ = LSTM(H).init(jax.random.key(0), (-1, 3, F))
    with pytest.raises(StateDictMismatchError, match="weight_hr_l0") as err:
        load_torch_state_dict(plain, (), sd)
    assert err.value.unexpected == ["weight_hr_l0"]
    # ... nor a plain module's a projected LSTM: the missing weight_hr is named
    with pytest.raises(StateDictMismatchError, match="weight_hr_l0") as err:
        load_torch_state_dict(like, (), {k: v for k, v in sd.items() if k != "weight_hr_l0"})
    assert err.value.missing == ["weight_hr_l0"]


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def test_proj_lstm_matches_the_equations_in_numpy():
    """Without torch too (the newest-JAX lane): h_t = (o * tanh(c_t)) @ W_hr, by hand."""
    H, P, F, N, T = 4, 2, 3, 2, 3
    layer = LSTM(H, proj_size=P, return_state=True)
    _, params, _ = layer.init(jax.random.key(1), (N, T, F))
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    r = np.random.default_rng(0)
    x = r.standard_normal((N, T, F)).astype(np.float32)
    h0, c0 = r.standard_normal((1, N, P)), r.standard_normal((1, N, H))
    (y, (h_n, c_n)), _ = layer.apply(params, (), x, initial_state=(h0, c0))
    h, c, ys = h0[0], c0[0], []
    for t in range(T):
        i, f, g, o = np.split(x[:, t] @ p["W_ih"] + p["b_ih"] + h @ p["W_hh"] + p["b_hh"], 4, -1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = (_sigmoid(o) * np.tanh(c)) @ p["W_hr"]
        ys.append(h)
    for ours, want in ((y, np.stack(ys, 1)), (h_n[0], h), (c_n[0], c)):
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
