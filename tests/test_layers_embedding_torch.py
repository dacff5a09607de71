"""Embedding's torch options against torch.nn.Embedding: padding_idx, max_norm (with norm_type)
and scale_grad_by_freq, random configurations, weights copied, output, the weight's gradient
and (max_norm) the renormalised weight, float32 and float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError
from funcnet.layers.embedding import Embedding, embedding_renorm

from helpers.torch_ref import torch

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-10)]
_TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_embedding_options_match_torch(dtype, tol):
    V, D = 7, 3  # one table shape: jax compiles each operation once per shape
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == np.float64):
        padded = normed = by_freq_on = 0
        for i in range(40):
            # each option alone, then together: each on in at least 20 configurations
            padding_idx = int(rng.integers(-V, V)) if i % 4 in (0, 3) else None
            max_norm = float(rng.uniform(0.3, 2.0)) if i % 4 in (1, 3) else None
            norm_type = float(rng.choice([2.0, 1.0, 3.0, np.inf]))
            by_freq = i % 4 in (2, 3) or bool(rng.integers(2))
            cfg = dict(padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type, scale_grad_by_freq=by_freq)
            padded += padding_idx is not None
            normed += max_norm is not None
            by_freq_on += by_freq
            tm = torch.nn.Embedding(V, D, **cfg).to(_TORCH_DTYPE[dtype])
            layer = Embedding(V, D, **cfg)
            _, params, state = layer.init(jax.random.key(i), (2, 5))
            if padding_idx is not None:  # init: the padding row is zeros, as torch's
                assert not np.asarray(params["E"][padding_idx]).any()
                assert not tm.weight[padding_idx].any()
            E = (rng.standard_normal((V, D)) * 1.5).astype(dtype)
            if padding_idx is not None:
                E[padding_idx] = 0.0
            with torch.no_grad():
                tm.weight.copy_(torch.tensor(E))
            ids = rng.integers(0, V, (2, 5))  # repeats, for scale_grad_by_freq
            g = rng.standard_normal((2, 5, D)).astype(dtype)

            def loss(p):
                y, _ = layer.apply(p, state, jnp.asarray(ids))
                return jnp.sum(y * g), y

            gp, y = jax.grad(loss, has_aux=True)({"E": jnp.asarray(E)})
            yt = tm(torch.tensor(ids))
            (yt * torch.tensor(g)).sum().backward()
            np.testing.assert_allclose(y, yt.detach().numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
            np.testing.assert_allclose(gp["E"], tm.weight.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
            if max_norm is not None:
                # torch renormalised its weight in place; embedding_renorm gives the same
                renormed = embedding_renorm({"E": jnp.asarray(E)}, ids, max_norm, norm_type)
                np.testing.assert_allclose(
                    renormed["E"], tm.weight.detach().numpy(), rtol=tol, atol=tol, err_msg=str(cfg)
                )
                # and the lookup of renormalised rows is a fixed point
                y2, _ = layer.apply(renormed, state, jnp.asarray(ids))
                np.testing.assert_allclose(y2, y, rtol=tol, atol=tol, err_msg=str(cfg))
    assert min(padded, normed, by_freq_on) >= 20, (padded, normed, by_freq_on)


def test_max_norm_training_follows_torch():
    """Three SGD steps with embedding_renorm before each: torch's weights after each."""
    V, D, lr = 6, 4, 0.5
    rng = np.random.default_rng(1)
    E = (rng.standard_normal((V, D)) * 2).astype(np.float32)
    tm = torch.nn.Embedding(V, D, max_norm=1.0)
    with torch.no_grad():
        tm.weight.copy_(torch.tensor(E))
    opt = torch.optim.SGD(tm.parameters(), lr=lr)
    layer = Embedding(V, D, max_norm=1.0)

    @jax.jit
    def step_fn(params, ids):
        params = embedding_renorm(params, ids, max_norm=1.0)
        grads = jax.grad(lambda p: jnp.sum(layer.apply(p, (), ids)[0] ** 2))(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads)

    params = {"E": jnp.asarray(E)}
    for step in range(3):
        ids = rng.integers(0, V, (5,))
        opt.zero_grad()
        (tm(torch.tensor(ids)) ** 2).sum().backward()
        opt.step()
        params = step_fn(params, jnp.asarray(ids))
        np.testing.assert_allclose(
            params["E"], tm.weight.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}"
        )


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Embedding(5, 2, max_norm=0.0), "max_norm must be a finite real number in \\(0"),
        (lambda: Embedding(5, 2, max_norm=-1.0), "max_norm"),
        (lambda: Embedding(5, 2, max_norm=1.0, norm_type=0), "norm_type must be a positive real"),
        (lambda: Embedding(5, 2, scale_grad_by_freq=1), "scale_grad_by_freq must be True or False"),
        (
            lambda: embedding_renorm({"E": jnp.ones((3, 2))}, jnp.array([0]), max_norm="1"),
            "max_norm must be a real number",
        ),
    ],
)
def test_bad_options_are_refused(make, match):
    with pytest.raises(ArgumentError, match=match):
        make()
