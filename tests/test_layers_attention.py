"""funcnet.layers.attention: MultiHeadAttention against torch.nn.MultiheadAttention, masks,
dropout, the key/value cache, and the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch

from funcnet.layers import MultiHeadAttention, causal_mask, dot_product_attention, padding_mask, rope
from funcnet.testing import check_layer

KEY = jax.random.key(0)


def _randn(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def params_from_torch(mha: torch.nn.MultiheadAttention, dtype=np.float32):
    """torch's MultiheadAttention weights as funcnet params: the mapping docs/porting.md gives."""
    t = lambda w: np.asarray(w.detach().numpy(), dtype)
    E = mha.embed_dim
    if mha._qkv_same_embed_dim:
        wq, wk, wv = (mha.in_proj_weight[i * E : (i + 1) * E] for i in range(3))
    else:
        wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    params = {
        "query": {"W": t(wq).T},
        "key": {"W": t(wk).T},
        "value": {"W": t(wv).T},
        "out": {"W": t(mha.out_proj.weight).T},
    }
    if mha.in_proj_bias is not None:
        for i, n in enumerate(("query", "key", "value")):
            params[n]["b"] = t(mha.in_proj_bias[i * E : (i + 1) * E])
        params["out"]["b"] = t(mha.out_proj.bias)
    return jax.tree.map(jnp.asarray, params)


def _torch_grads(mha):
    E = mha.embed_dim
    g = lambda p: p.grad.numpy().T
    if mha._qkv_same_embed_dim:
        ws = [mha.in_proj_weight.grad[i * E : (i + 1) * E].numpy().T for i in range(3)]
    else:
        ws = [g(mha.q_proj_weight), g(mha.k_proj_weight), g(mha.v_proj_weight)]
    grads = {n: {"W": w} for n, w in zip(("query", "key", "value"), ws)}
    grads["out"] = {"W": g(mha.out_proj.weight)}
    if mha.in_proj_bias is not None:
        for i, n in enumerate(("query", "key", "value")):
            grads[n]["b"] = mha.in_proj_bias.grad[i * E : (i + 1) * E].numpy()
        grads["out"]["b"] = mha.out_proj.bias.grad.numpy()
    return grads


CASES = {
    # name: (E, heads, kdim, vdim, T, S, bias, causal, padding)
    "self_bias_causal_padding": (8, 2, None, None, 5, 5, True, True, True),
    "self_no_bias": (8, 4, None, None, 4, 4, False, False, False),
    "cross_kdim_vdim_padding": (6, 3, 5, 7, 3, 4, True, False, True),
}


def _run_parity(case, dtype, tol):
    E, H, kdim, vdim, T, S, bias, causal, padding = CASES[case]
    cross = kdim is not None
    torch.manual_seed(0)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    mha = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=True).to(tdtype)
    B = 2
    q = _randn(1, B, T, E, dtype=dtype)
    k = _randn(2, B, S, kdim or E, dtype=dtype) if cross else q
    v = _randn(3, B, S, vdim or E, dtype=dtype) if cross else q
    valid = np.ones((B, S), bool)
    if padding:
        valid[1, -2:] = False
    cm = np.asarray(causal_mask(T, S)) if causal else np.ones((T, S), bool)

    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out, _ = mha(
        tq,
        tk if cross else tq,
        tv if cross else tq,
        need_weights=False,
        attn_mask=torch.tensor(~cm) if causal else None,
        key_padding_mask=torch.tensor(~valid) if padding else None,
    )
    cot = _randn(4, *out.shape, dtype=dtype)
    (out * torch.tensor(cot)).sum().backward()

    layer = MultiHeadAttention(H, use_bias=bias)
    inputs = (q, k, v) if cross else q
    mask = None
    if causal or padding:
        mask = jnp.asarray(cm)[None, None] & padding_mask(jnp.asarray(valid))
    params = params_from_torch(mha, dtype)

    def f(p, x):
        y, _ = layer.apply(p, (), x, mask=mask)
        return jnp.sum(y * cot), y

    (_, y), (gp, gx) = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, jax.tree.map(jnp.asarray, inputs))
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=tol, atol=tol)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=tol), gp, _torch_grads(mha))
    if cross:
        for g, t in zip(gx, (tq, tk, tv)):
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=tol, atol=tol)
    else:
        np.testing.assert_allclose(gx, tq.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", sorted(CASES))
def test_parity_with_torch_float32(case):
    _run_parity(case, np.float32, 1e-5)


@pytest.mark.parametrize("case", ["self_bias_causal_padding", "cross_kdim_vdim_padding"])
def test_parity_with_torch_float64(case):
    with jax.enable_x64(True):
        _run_parity(case, np.float64, 1e-10)


def test_default_init_follows_torch():
    """Glorot-uniform over the packed (E, 3E) in-projection, zero biases, as torch."""
    E = 64
    _, params, _ = MultiHeadAttention(4).init(KEY, (-1, 3, E))
    bound = np.sqrt(6.0 / (E + 3 * E))
    w = np.concatenate([params[n]["W"] for n in ("query", "key", "value")], axis=1)
    assert w.shape == (E, 3 * E) and np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.95 * bound  # uniform over the whole range, not a narrower one
    assert np.std(w) == pytest.approx(bound / np.sqrt(3), rel=0.05)
    for n in ("query", "key", "value", "out"):
        np.testing.assert_array_equal(params[n]["b"], 0.0)
    assert np.abs(params["out"]["W"]).max() <= 1 / np.sqrt(E)


def test_check_layer_self_attention_and_decoding():
    check_layer(MultiHeadAttention(2, causal=True), (-1, 4, 6), train_modes=(False,))
    # cross-attention's values and gradients: the torch parity tests above
    check_layer(MultiHeadAttention(2, causal=True, cache_length=6), (2, 3, 4), train_modes=(False,), grad_check=False)


def test_fused_and_reference_paths_agree():
    q, k, v = (jnp.asarray(_randn(i, 2, 5, 2, 4)) for i in range(3))
    mask = jnp.asarray(_randn(9, 2, 1, 5, 5) > -0.5)
    for causal in (False, True):
        a = dot_product_attention(q, k, v, mask=mask, causal=causal)
        b = dot_product_attention(q, k, v, mask=mask, causal=causal, implementation="reference")
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_attention_dropout_is_unbiased_and_needs_rng():
    layer = MultiHeadAttention(2, dropout=0.5)
    _, params, _ = layer.init(KEY, (-1, 4, 4))
    x = jnp.asarray(_randn(0, 1, 4, 4))
    clean, _ = layer.apply(params, (), x)
    drop = jax.jit(jax.vmap(lambda k: layer.apply(params, (), x, rng=k, train=True)[0]))
    outs = drop(jax.random.split(KEY, 4000))
    assert not np.allclose(outs[0], clean, atol=1e-3)  # weights really dropped
    np.testing.assert_allclose(outs.mean(0), clean, atol=0.05)  # kept ones rescaled
    with pytest.raises(ValueError, match="rng"):
        layer.apply(params, (), x, train=True)


def test_rope_rotates_queries_and_keys():
    layer = MultiHeadAttention(2, rope=True, causal=True, use_bias=False)
    _, params, _ = layer.init(KEY, (-1, 5, 8))
    x = jnp.asarray(_randn(0, 2, 5, 8))
    y, _ = layer.apply(params, (), x)
    heads = lambda p: (x @ params[p]["W"]).reshape(2, 5, 2, 4)
    o = dot_product_attention(rope(heads("query")), rope(heads("key")), heads("value"), causal=True)
    np.testing.assert_allclose(y, o.reshape(2, 5, 8) @ params["out"]["W"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_rope", [False, True])
def test_cached_decoding_equals_the_full_prefix(use_rope):
    B, T, E = 2, 6, 8
    full = MultiHeadAttention(2, causal=True, rope=use_rope)
    dec = MultiHeadAttention(2, causal=True, rope=use_rope, cache_length=8)
    _, params, _ = full.init(KEY, (-1, T, E))
    _, _, cache = dec.init(KEY, (B, 1, E))
    x = jnp.asarray(_randn(0, B, T, E))
    want, _ = full.apply(params, (), x)
    step = jax.jit(dec.apply)
    y, cache = step(params, cache, x[:, :3])  # the prompt at once, then one at a time
    got = [y]
    for t in range(3, T):
        y, cache = step(params, cache, x[:, t : t + 1])
        got.append(y)
    assert int(cache["index"]) == T
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), want, rtol=1e-5, atol=1e-5)


def test_decoding_past_the_cache():
    dec = MultiHeadAttention(2, causal=True, cache_length=4)
    _, params, cache = dec.init(KEY, (1, 1, 4))
    x = jnp.ones((1, 3, 4))
    _, cache = dec.apply(params, cache, x)
    with pytest.raises(ValueError, match="past the cache.*3 positions cached and 3 more.*4"):
        dec.apply(params, cache, x)
    y, _ = jax.jit(dec.apply)(params, cache, x)  # under jit: NaN, not wrong numbers
    assert np.isnan(y).all()


def test_bad_input_errors():
    with pytest.raises(ValueError, match="num_heads=3 does not divide the model dimension 8"):
        MultiHeadAttention(3).init(KEY, (-1, 4, 8))
    layer = MultiHeadAttention(2)
    _, params, _ = layer.init(KEY, (-1, 4, 8))
    x = jnp.ones((2, 4, 8))
    with pytest.raises(
        ValueError,
        match=r"mask of shape \(3, 4\) cannot broadcast to .*"
        r"\(2, 2, 4, 4\)",
    ):
        layer.apply(params, (), x, mask=jnp.ones((3, 4), bool))
    with pytest.raises(TypeError, match="boolean with True = may attend.*bias="):
        layer.apply(params, (), x, mask=jnp.zeros((4, 4)))
    with pytest.raises(ValueError, match="query has 6 features but the params were built for 8"):
        layer.apply(params, (), jnp.ones((2, 4, 6)))
    with pytest.raises(ValueError, match="needs causal=True"):
        MultiHeadAttention(2, cache_length=4)
    with pytest.raises(ValueError, match="needs the batch size"):
        MultiHeadAttention(2, causal=True, cache_length=4).init(KEY, (-1, 1, 8))
    with pytest.raises(ValueError, match="even head dim, got head_dim=3"):
        MultiHeadAttention(2, head_dim=3, rope=True).init(KEY, (-1, 4, 8))


def test_bias_is_an_additive_mask():
    layer = MultiHeadAttention(2)
    _, params, _ = layer.init(KEY, (-1, 4, 8))
    x = jnp.asarray(_randn(0, 2, 4, 8))
    m = np.asarray(causal_mask(4))
    a, _ = layer.apply(params, (), x, mask=jnp.asarray(m))
    b, _ = layer.apply(params, (), x, bias=jnp.where(jnp.asarray(m), 0.0, -1e9))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
