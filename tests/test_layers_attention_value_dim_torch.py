"""dot_product_attention with a value head size of its own (Dv != D), as torch's
F.scaled_dot_product_attention allows: outputs and gradients against torch (masks, bias,
causal, float32 and float64), the path chosen off CPU, and the forced-jax error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.layers import dot_product_attention

from helpers.torch_ref import F, torch

# (dtype, rtol, atol)
DTYPES = [(np.float32, 2e-5, 2e-6), (np.float64, 1e-12, 1e-13)]


def _torch_sdpa(q, k, v, mask, bias, causal, scale):
    """torch's on (B, T, H, D) arrays: its layout is (B, H, T, D)."""
    qt, kt, vt = (torch.tensor(a.transpose(0, 2, 1, 3), requires_grad=True) for a in (q, k, v))
    attn = None
    if bias is not None:
        attn = torch.tensor(bias)
    if mask is not None:  # torch's boolean mask is True = attend too (for SDPA)
        attn = torch.tensor(mask) if attn is None else attn.masked_fill(~torch.tensor(mask), float("-inf"))
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn, is_causal=causal, scale=scale)
    return out, (qt, kt, vt)


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_value_head_size_matches_torch(dtype, rtol, atol):
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == np.float64):
        for case in range(6):
            B, H = (int(n) for n in rng.integers(1, 4, 2))
            T = int(rng.integers(1, 6))
            S = T if case % 3 == 0 else int(rng.integers(1, 7))
            D, Dv = int(rng.integers(2, 9)), int(rng.integers(1, 12))
            q, k = (rng.standard_normal((B, n, H, D)).astype(dtype) for n in (T, S))
            v = rng.standard_normal((B, S, H, Dv)).astype(dtype)
            causal = case % 3 == 0
            mask = rng.random((B, 1, T, S)) < 0.8 if case % 3 == 1 else None
            if mask is not None:
                mask[..., 0] = True  # no row fully masked: torch gives NaN there, jax the mean
            bias = rng.standard_normal((H, T, S)).astype(dtype) if case % 3 == 2 else None
            scale = None if case < 3 else float(rng.uniform(0.1, 1.0))
            g = rng.standard_normal((B, T, H, Dv)).astype(dtype)

            def f(q, k, v):
                return dot_product_attention(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale)

            y, vjp = jax.vjp(jax.jit(f), *map(jnp.asarray, (q, k, v)))
            grads = vjp(jnp.asarray(g))
            yt, leaves = _torch_sdpa(q, k, v, mask, bias, causal, scale)
            (yt * torch.tensor(g.transpose(0, 2, 1, 3))).sum().backward()
            where = f"case {case}: q {q.shape}, v {v.shape}"
            assert y.shape == (B, T, H, Dv) and y.dtype == dtype, where
            np.testing.assert_allclose(
                y, yt.detach().numpy().transpose(0, 2, 1, 3), rtol=rtol, atol=atol, err_msg=where
            )
            for name, got, leaf in zip("qkv", grads, leaves):
                np.testing.assert_allclose(
                    got, leaf.grad.numpy().transpose(0, 2, 1, 3), rtol=rtol, atol=atol, err_msg=f"{where}, d{name}"
                )


def _qkv(D=4, Dv=6):
    rng = np.random.default_rng(1)
    q, k = (jnp.asarray(rng.standard_normal((2, 3, 2, D)), jnp.float32) for _ in range(2))
    return q, k, jnp.asarray(rng.standard_normal((2, 3, 2, Dv)), jnp.float32)


def test_value_head_size_by_hand_and_paths(monkeypatch):
    q, k, v = _qkv()
    y = dot_product_attention(q, k, v, causal=True)
    assert y.shape == (2, 3, 2, 6)
    np.testing.assert_allclose(y[:, 0], v[:, 0], rtol=1e-6)  # the first query sees one key
    ref = dot_product_attention(q, k, v, causal=True, implementation="reference")
    np.testing.assert_array_equal(y, ref)
    # Off CPU, None picks jax's fused path, which needs Dv == D: the written-out one instead.
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    np.testing.assert_array_equal(dot_product_attention(q, k, v, causal=True), ref)


def test_forced_jax_path_refuses_own_value_head_size():
    q, k, v = _qkv()
    for impl in ("xla", "cudnn"):
        with pytest.raises(
            ValueError,
            match=rf"dot_product_attention: implementation='{impl}' "
            r"needs the values' head size to equal the queries' and keys' \(4\), "
            r"got 6\. Leave implementation=None",
        ):
            dot_product_attention(q, k, v, implementation=impl)
    q, k, v = _qkv(Dv=4)  # equal head sizes still go to jax's when forced
    np.testing.assert_allclose(
        dot_product_attention(q, k, v, implementation="xla"),
        dot_product_attention(q, k, v, implementation="reference"),
        rtol=1e-5,
        atol=1e-6,
    )
