"""RNN/LSTM/GRU with bias=False (and True) against torch.nn.RNN/LSTM/GRU: random configurations,
weights loaded with funcnet.interop.load_torch_state_dict, outputs and every gradient, float32 and
float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import StateDictMismatchError
from funcnet.interop import load_torch_state_dict
from funcnet.layers.recurrent import GRU, LSTM, RNN

from helpers.torch_ref import torch

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-10)]
_TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}


def _pair(kind, H, F, num_layers, bidirectional, bias, nonlinearity="tanh"):
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, bias=bias)
    if kind == "RNN":
        ours = RNN(H, nonlinearity, **kw)
        theirs = torch.nn.RNN(F, H, nonlinearity=nonlinearity, batch_first=True, **kw)
    else:
        ours = {"LSTM": LSTM, "GRU": GRU}[kind](H, **kw)
        theirs = getattr(torch.nn, kind)(F, H, batch_first=True, **kw)
    return ours, theirs


# (kind, nonlinearity, num_layers, bidirectional): each compiled once, for K random weight
# sets and inputs at a time (vmapped), so 4 x 5 = 20 configurations per dtype
STRUCTURES = [("RNN", "tanh", 1, False), ("RNN", "relu", 1, True), ("LSTM", None, 2, True), ("GRU", None, 2, False)]
K = 5


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_recurrent_bias_false_matches_torch(dtype, tol):
    rng = np.random.default_rng(0)
    N, T, F, H = 2, 3, 3, 2
    with jax.enable_x64(dtype == np.float64):
        for kind, nonlinearity, num_layers, bidirectional in STRUCTURES:
            cfg = dict(
                kind=kind, nonlinearity=nonlinearity, num_layers=num_layers, bidirectional=bidirectional, bias=False
            )
            ours, _ = _pair(kind, H, F, num_layers, bidirectional, False, nonlinearity or "tanh")
            _, like, state = ours.init(jax.random.key(0), (N, T, F))
            like = jax.tree.map(lambda a: a.astype(dtype), like)  # the loader keeps dtypes
            assert not any("b_" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(like)[0])
            modules, params, xs, gs = [], [], [], []
            for _ in range(K):
                torch.manual_seed(int(rng.integers(2**31)))
                _, m = _pair(kind, H, F, num_layers, bidirectional, False, nonlinearity or "tanh")
                m = m.to(_TORCH_DTYPE[dtype])
                p, _ = load_torch_state_dict(like, state, m.state_dict())
                modules.append(m)
                params.append(jax.tree.map(lambda a: np.asarray(a, dtype), p))
                xs.append(rng.standard_normal((N, T, F)).astype(dtype))
                gs.append(rng.standard_normal((N, T, (2 if bidirectional else 1) * H)).astype(dtype))

            def loss(p, x, g):
                y, _ = ours.apply(p, state, x)
                return jnp.sum(y * g), y

            stacked = jax.tree.map(lambda *a: np.stack(a), *params)
            (gp, gx), y = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1), has_aux=True)))(
                stacked, np.stack(xs), np.stack(gs)
            )
            for k, m in enumerate(modules):
                xt = torch.tensor(xs[k], requires_grad=True)
                yt, _ = m(xt)
                (yt * torch.tensor(gs[k])).sum().backward()
                np.testing.assert_allclose(y[k], yt.detach().numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
                np.testing.assert_allclose(gx[k], xt.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
                # torch's weight gradients, converted by the same loader, are ours
                theirs, _ = load_torch_state_dict(like, state, {n: p.grad for n, p in m.named_parameters()})
                for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(gp)[0], jax.tree.leaves(theirs)):
                    np.testing.assert_allclose(
                        a[k], b, rtol=tol, atol=tol, err_msg=f"{cfg} {jax.tree_util.keystr(path)}"
                    )


def test_bias_false_has_no_bias_params_and_loader_names_mismatch():
    _, params, _ = LSTM(4, bias=False).init(jax.random.key(0), (2, 3, 5))
    assert set(params) == {"W_ih", "W_hh"}
    _, stacked, _ = GRU(4, bias=False, num_layers=2, bidirectional=True).init(jax.random.key(0), (2, 3, 5))
    assert all(set(p) == {"W_ih", "W_hh"} for p in stacked.values())
    # a torch LSTM with biases does not load into a bias-free one: its leftovers are named
    with pytest.raises(StateDictMismatchError, match="bias_ih_l0"):
        load_torch_state_dict(params, (), torch.nn.LSTM(5, 4, batch_first=True).state_dict())
    # ... nor a bias-free torch LSTM into one with biases
    _, with_bias, _ = LSTM(4).init(jax.random.key(0), (2, 3, 5))
    with pytest.raises(StateDictMismatchError, match="bias_ih_l0"):
        load_torch_state_dict(with_bias, (), torch.nn.LSTM(5, 4, bias=False).state_dict())


@pytest.mark.parametrize("make", [lambda: RNN(3, bias=0), lambda: LSTM(3, bias="no"), lambda: GRU(3, bias=None)])
def test_bias_must_be_a_bool(make):
    with pytest.raises(ValueError, match="bias must be True or False"):
        make()
