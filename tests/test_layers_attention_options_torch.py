"""torch's attention options against torch 2.13, outputs and every gradient, float32 and
float64, over random configurations: MultiHeadAttention's add_bias_kv, add_zero_attn and
returned weights (nn.MultiheadAttention), grouped-query attention (F.scaled_dot_product_
attention(enable_gqa=True)), TransformerBlock's masks (nn.TransformerEncoderLayer with
norm_first=True), and causal=True's alignment with fewer queries than keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.interop import StateDictMismatchError, load_torch_state_dict
from funcnet.layers import MultiHeadAttention, TransformerBlock, causal_mask, dot_product_attention, padding_mask

from helpers.torch_ref import F, torch

KEY = jax.random.key(0)
# (dtype, rtol, atol)
DTYPES = [(np.float32, 1e-4, 2e-5), (np.float64, 1e-10, 1e-11)]


def _tdtype(dtype):
    return torch.float64 if dtype == np.float64 else torch.float32


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _mha_pairs(mha):
    """(funcnet path, torch parameter, torch layout -> funcnet's) for every parameter."""
    E = mha.embed_dim
    pairs = []
    for i, n in enumerate(("query", "key", "value")):
        if mha._qkv_same_embed_dim:
            pairs.append(((n, "W"), mha.in_proj_weight, lambda t, i=i: t[i * E : (i + 1) * E].T))
        else:
            pairs.append(((n, "W"), getattr(mha, f"{n[0]}_proj_weight"), lambda t: t.T))
        if mha.in_proj_bias is not None:
            pairs.append(((n, "b"), mha.in_proj_bias, lambda t, i=i: t[i * E : (i + 1) * E]))
    pairs.append((("out", "W"), mha.out_proj.weight, lambda t: t.T))
    if mha.out_proj.bias is not None:
        pairs.append((("out", "b"), mha.out_proj.bias, lambda t: t))
    if mha.bias_k is not None:
        pairs += [((n,), getattr(mha, n), lambda t: t.reshape(-1)) for n in ("bias_k", "bias_v")]
    return pairs


def _from_torch(pairs, grads=False):
    tree = {}
    for path, p, conv in pairs:
        _set(tree, path, conv((p.grad if grads else p).detach().numpy()))
    return tree


def _mha_config(rng, case):
    E = int(rng.integers(1, 4)) * int(rng.integers(1, 4))
    H = int(rng.choice([h for h in range(1, E + 1) if E % h == 0]))
    cross = case % 3 == 2
    T = int(rng.integers(1, 5))
    return dict(
        E=E,
        H=H,
        B=int(rng.integers(1, 3)),
        T=T,
        S=int(rng.integers(1, 6)) if cross else T,
        cross=cross,
        kdim=int(rng.integers(1, 6)) if cross and case % 2 else None,
        bias=bool(rng.random() < 0.7),
        bias_kv=case % 3 != 2,
        zero_attn=case % 2 == 1,
        weights=case % 5 != 4,
        average=bool(rng.random() < 0.5),
        masks=(case // 2) % 3,
    )


def _mha_masks(rng, c, dtype):
    """torch's attn_mask / key_padding_mask and funcnet's mask / bias for one case: 0 none,
    1 boolean (with causal when self-attention), 2 a float attn_mask (bias=)."""
    B, T, S = c["B"], c["T"], c["S"]
    valid = rng.random((B, S)) < 0.75
    valid[:, 0] = True  # no row fully masked: torch gives NaN there, funcnet the mean
    if c["masks"] == 0:
        return dict(), dict()
    if c["masks"] == 1:
        allowed = np.array(causal_mask(T, S, offset=S - T)) if not c["cross"] else rng.random((T, S)) < 0.7
        allowed[:, 0] = True
        tmask = dict(attn_mask=torch.tensor(~allowed), key_padding_mask=torch.tensor(~valid))
        if not c["cross"]:  # funcnet's causal=True, the appended keys visible as torch's
            return tmask, dict(mask=padding_mask(jnp.asarray(valid)))
        return tmask, dict(mask=jnp.asarray(allowed) & padding_mask(jnp.asarray(valid)))
    add = rng.standard_normal((T, S)).astype(dtype)
    pad = np.where(valid, 0.0, -np.inf).astype(dtype)
    return (
        dict(attn_mask=torch.tensor(add), key_padding_mask=torch.tensor(pad)),
        dict(mask=padding_mask(jnp.asarray(valid)), bias=jnp.asarray(add)),
    )


def _run_mha_case(rng, case, dtype, rtol, atol):
    c = _mha_config(rng, case)
    E, B, T, S = c["E"], c["B"], c["T"], c["S"]
    torch.manual_seed(case)
    mha = torch.nn.MultiheadAttention(
        E,
        c["H"],
        bias=c["bias"],
        add_bias_kv=c["bias_kv"],
        add_zero_attn=c["zero_attn"],
        kdim=c["kdim"],
        vdim=c["kdim"],
        batch_first=True,
    ).to(_tdtype(dtype))
    q = rng.standard_normal((B, T, E)).astype(dtype)
    k = rng.standard_normal((B, S, c["kdim"] or E)).astype(dtype) if c["cross"] else q
    v = rng.standard_normal((B, S, c["kdim"] or E)).astype(dtype) if c["cross"] else q
    tmask, fmask = _mha_masks(rng, c, dtype)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    args = (tq, tk, tv) if c["cross"] else (tq, tq, tq)
    out, w = mha(*args, need_weights=c["weights"], average_attn_weights=c["average"], **tmask)
    g = rng.standard_normal(out.shape).astype(dtype)
    loss = (out * torch.tensor(g)).sum()
    if c["weights"]:
        gw = rng.standard_normal(w.shape).astype(dtype)
        loss = loss + (w * torch.tensor(gw)).sum()
    loss.backward()

    layer = MultiHeadAttention(
        c["H"],
        use_bias=c["bias"],
        add_bias_kv=c["bias_kv"],
        causal=c["masks"] == 1 and not c["cross"],
        add_zero_attn=c["zero_attn"],
        need_weights=c["weights"],
        average_attn_weights=c["average"],
    )
    shapes = ((B, T, E), (B, S, c["kdim"] or E), (B, S, c["kdim"] or E))
    out_shape, init_params, _ = layer.init(KEY, shapes if c["cross"] else shapes[0])
    pairs = _mha_pairs(mha)
    params = jax.tree.map(jnp.asarray, _from_torch(pairs))
    assert jax.tree.structure(params) == jax.tree.structure(init_params), c
    inputs = tuple(map(jnp.asarray, (q, k, v))) if c["cross"] else jnp.asarray(q)

    def f(p, x):
        y, _ = layer.apply(p, (), x, **fmask)
        if not c["weights"]:
            return jnp.sum(y * g), (y, None)
        return jnp.sum(y[0] * g) + jnp.sum(y[1] * gw), y

    (_, (y, wy)), (gp, gx) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, inputs)
    where = f"case {case}: {c}"
    close = lambda a, b, what: np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{where}, {what}")
    close(y, out.detach().numpy(), "output")
    if c["weights"]:
        assert out_shape[1] == tuple(w.shape), where
        close(wy, w.detach().numpy(), "weights")
    for path, leaf in jax.tree_util.tree_leaves_with_path(_from_torch(pairs, grads=True)):
        close(gp[path[0].key] if len(path) == 1 else gp[path[0].key][path[1].key], leaf, f"grad {path}")
    for got, t in zip(gx if c["cross"] else (gx,), (tq, tk, tv)):
        close(got, t.grad.numpy(), "input grad")


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_bias_kv_zero_attn_and_weights_match_torch(dtype, rtol, atol):
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == np.float64):
        for case in range(6):
            _run_mha_case(rng, case, dtype, rtol, atol)


def test_bias_kv_init_and_loading():
    """torch's xavier_normal_ on (1, 1, E) is N(0, 1/E); the option's draws leave the
    projections' as they were; load_torch_state_dict maps bias_k/bias_v."""
    E = 256
    _, p, _ = MultiHeadAttention(4, add_bias_kv=True).init(KEY, (-1, 2, E))
    _, plain, _ = MultiHeadAttention(4).init(KEY, (-1, 2, E))
    for n in ("bias_k", "bias_v"):
        assert p[n].shape == (E,) and p[n].dtype == jnp.float32
        assert np.std(p[n]) == pytest.approx(1 / np.sqrt(E), rel=0.15)
        assert abs(np.mean(p[n])) < 0.25 / np.sqrt(E)
    assert not np.allclose(p["bias_k"], p["bias_v"])
    jax.tree.map(np.testing.assert_array_equal, {n: p[n] for n in plain}, plain)

    mha = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    layer = MultiHeadAttention(2, add_bias_kv=True)
    _, params, state = layer.init(KEY, (-1, 3, 8))
    params, _ = load_torch_state_dict(params, state, mha.state_dict())
    np.testing.assert_array_equal(params["bias_k"], mha.bias_k.detach().numpy().reshape(-1))
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    want, _ = mha(*[torch.tensor(x)] * 3, need_weights=False)
    np.testing.assert_allclose(layer.apply(params, (), jnp.asarray(x))[0], want.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(StateDictMismatchError, match="bias_k"):  # funcnet's layer has none
        load_torch_state_dict(MultiHeadAttention(2).init(KEY, (-1, 3, 8))[1], (), mha.state_dict())


def _torch_sdpa_gqa(q, k, v, mask, bias, causal):
    """torch's enable_gqa on (B, T, H, D) arrays (its layout is (B, H, T, D))."""
    qt, kt, vt = (torch.tensor(a.transpose(0, 2, 1, 3), requires_grad=True) for a in (q, k, v))
    attn = None if bias is None else torch.tensor(bias)
    if mask is not None:  # SDPA's boolean mask is True = attend
        attn = torch.tensor(mask) if attn is None else attn.masked_fill(~torch.tensor(mask), float("-inf"))
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn, is_causal=causal, enable_gqa=True)
    return out, (qt, kt, vt)


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_grouped_query_dot_product_attention_matches_torch(dtype, rtol, atol):
    rng = np.random.default_rng(1)
    with jax.enable_x64(dtype == np.float64):
        for case in range(6):
            Hk, G = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            B, T = int(rng.integers(1, 3)), int(rng.integers(1, 6))
            S = T if case % 3 == 0 else int(rng.integers(1, 7))
            D = int(rng.integers(1, 6))
            Dv = D if case % 2 else int(rng.integers(1, 6))
            q = rng.standard_normal((B, T, Hk * G, D)).astype(dtype)
            k = rng.standard_normal((B, S, Hk, D)).astype(dtype)
            v = rng.standard_normal((B, S, Hk, Dv)).astype(dtype)
            causal = case % 3 == 0  # S == T: torch's is_causal lines up the same way
            mask = rng.random((B, Hk * G, T, S)) < 0.7 if case % 3 == 1 else None
            if mask is not None:
                mask[..., 0] = True
            bias = rng.standard_normal((T, S)).astype(dtype) if case % 3 == 2 else None
            g = rng.standard_normal((B, T, Hk * G, Dv)).astype(dtype)

            def f(q, k, v):
                return dot_product_attention(q, k, v, mask=mask, bias=bias, causal=causal)

            y, vjp = jax.vjp(jax.jit(f), *map(jnp.asarray, (q, k, v)))
            grads = vjp(jnp.asarray(g))
            yt, leaves = _torch_sdpa_gqa(q, k, v, mask, bias, causal)
            (yt * torch.tensor(g.transpose(0, 2, 1, 3))).sum().backward()
            where = f"case {case}: q {q.shape}, k {k.shape}, v {v.shape}"
            np.testing.assert_allclose(
                y, yt.detach().numpy().transpose(0, 2, 1, 3), rtol=rtol, atol=atol, err_msg=where
            )
            for name, got, leaf in zip("qkv", grads, leaves):
                np.testing.assert_allclose(
                    got, leaf.grad.numpy().transpose(0, 2, 1, 3), rtol=rtol, atol=atol, err_msg=f"{where}, d{name}"
                )


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_grouped_query_multi_head_attention_matches_torch(dtype, rtol, atol):
    """num_kv_heads: funcnet's projections, then torch's SDPA with enable_gqa."""
    rng = np.random.default_rng(2)
    with jax.enable_x64(dtype == np.float64):
        for case in range(3):
            Hk, G, D = int(rng.integers(1, 3)), int(rng.integers(2, 4)), int(rng.integers(1, 4))
            H, E, B, T = Hk * G, int(rng.integers(2, 7)), 2, int(rng.integers(1, 5))
            layer = MultiHeadAttention(H, num_kv_heads=Hk, head_dim=D, causal=case % 2 == 0, use_bias=case != 1)
            _, params, _ = layer.init(KEY, (-1, T, E))
            assert params["key"]["W"].shape == (E, Hk * D), params["key"]["W"].shape
            params = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
            valid = rng.random((B, T)) < 0.7
            valid[:, 0] = True
            x = rng.standard_normal((B, T, E)).astype(dtype)
            g = rng.standard_normal((B, T, E)).astype(dtype)

            def f(p, x):
                y, _ = layer.apply(p, (), x, mask=padding_mask(jnp.asarray(valid)))
                return jnp.sum(y * g), y

            (_, y), (gp, gx) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, jnp.asarray(x))
            tp = jax.tree.map(lambda a: torch.tensor(np.asarray(a), requires_grad=True), params)
            tx = torch.tensor(x, requires_grad=True)
            proj = lambda n, h: (tx @ tp[n]["W"] + (tp[n]["b"] if "b" in tp[n] else 0)).view(B, T, h, D).transpose(1, 2)
            mask = torch.tensor(valid)[:, None, None, :]
            if case % 2 == 0:
                mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
            o = F.scaled_dot_product_attention(
                proj("query", H), proj("key", Hk), proj("value", Hk), attn_mask=mask, enable_gqa=True
            )
            o = o.transpose(1, 2).reshape(B, T, H * D) @ tp["out"]["W"]
            o = o + (tp["out"]["b"] if "b" in tp["out"] else 0)
            (o * torch.tensor(g)).sum().backward()
            where = f"case {case}: H={H}, Hk={Hk}, D={D}, E={E}, T={T}"
            np.testing.assert_allclose(y, o.detach().numpy(), rtol=rtol, atol=atol, err_msg=where)
            np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=rtol, atol=atol, err_msg=where)
            jax.tree.map(
                lambda a, t: np.testing.assert_allclose(a, t.grad.numpy(), rtol=rtol, atol=atol, err_msg=where), gp, tp
            )


def test_grouped_query_errors():
    q = jnp.ones((1, 2, 4, 3))
    with pytest.raises(
        ValueError,
        match=r"dot_product_attention: grouped-query attention needs "
        r"the number of query heads to be a multiple of the key/value heads .* "
        r"got 4 query heads and 3 key/value heads",
    ):
        dot_product_attention(q, jnp.ones((1, 2, 3, 3)), jnp.ones((1, 2, 3, 3)))
    with pytest.raises(
        ValueError,
        match=r"keys and values need the same number of heads, got "
        r"keys of shape \(1, 2, 2, 3\) \(2 heads\) and values of shape "
        r"\(1, 2, 1, 3\) \(1 heads\)",
    ):
        dot_product_attention(q, jnp.ones((1, 2, 2, 3)), jnp.ones((1, 2, 1, 3)))
    with pytest.raises(
        ValueError,
        match=r"MultiHeadAttention\(4\): num_kv_heads=3 does not "
        r"divide num_heads=4.* among the divisors of 4",
    ):
        MultiHeadAttention(4, num_kv_heads=3)
    with pytest.raises(
        ValueError,
        match=r"need_weights=True returns the attention weights, "
        r"which jax's fused implementation='xla' never forms",
    ):
        MultiHeadAttention(2, need_weights=True, implementation="xla")
    # forced onto jax's kernel, grouped-query gives the written-out path's values
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 3, 4, 2), (2, 3, 2, 2), (2, 3, 2, 2)))
    np.testing.assert_allclose(
        dot_product_attention(q, k, v, causal=True, implementation="xla"),
        dot_product_attention(q, k, v, causal=True, implementation="reference"),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("gqa", [False, True])
def test_decoding_with_the_options_equals_the_full_prefix(gqa):
    B, T, E = 2, 5, 8
    opts = dict(
        causal=True,
        add_bias_kv=True,
        add_zero_attn=True,
        need_weights=True,
        average_attn_weights=False,
        num_kv_heads=1 if gqa else None,
    )
    full, dec = MultiHeadAttention(2, **opts), MultiHeadAttention(2, cache_length=6, **opts)
    (_, w_shape), params, _ = full.init(KEY, (-1, T, E))
    (_, dec_w_shape), _, cache = dec.init(KEY, (B, 1, E))
    assert w_shape == (-1, 2, T, T + 2) and dec_w_shape == (B, 2, 1, 8)
    assert cache["key"].shape == (B, 6, 1 if gqa else 2, 4)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((B, T, E)), jnp.float32)
    (want, want_w), _ = full.apply(params, (), x)
    step = jax.jit(dec.apply)
    (y, w), cache = step(params, cache, x[:, :3])
    got = [y]
    for t in range(3, T):
        (y, w), cache = step(params, cache, x[:, t : t + 1])
        got.append(y)
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), want, rtol=1e-5, atol=1e-5)
    # the last query's weights: the 5 tokens, one empty cache slot, bias_k, the zero key
    np.testing.assert_allclose(w[:, :, 0, :T], want_w[:, :, -1, :T], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w[:, :, 0, T], 0.0)
    np.testing.assert_allclose(w[:, :, 0, -2:], want_w[:, :, -1, -2:], rtol=1e-5, atol=1e-6)


def _block_pairs(layer):
    """(funcnet path, torch parameter, converter) of a TransformerEncoderLayer."""
    same, t = (lambda a: a), (lambda a: a.T)
    pairs = [(("attn", "attn") + path, p, conv) for path, p, conv in _mha_pairs(layer.self_attn)]
    for part, norm in (("attn", layer.norm1), ("mlp", layer.norm2)):
        pairs += [((part, "norm", "scale"), norm.weight, same), ((part, "norm", "bias"), norm.bias, same)]
    for name, lin in (("fc", layer.linear1), ("proj", layer.linear2)):
        pairs += [(("mlp", name, "W"), lin.weight, t), (("mlp", name, "b"), lin.bias, same)]
    return pairs


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_transformer_block_masks_match_torch_encoder_layer(dtype, rtol, atol):
    """torch in training mode with dropout 0: its fast path (and nested tensors) off, the
    same computation as eval mode's slow path."""
    rng = np.random.default_rng(5)
    with jax.enable_x64(dtype == np.float64):
        for case in range(3):
            H = int(rng.integers(1, 3))
            E, B, T = H * int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 6))
            torch.manual_seed(case)
            tl = (
                torch.nn.TransformerEncoderLayer(
                    E, H, dim_feedforward=2 * E, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
                )
                .to(_tdtype(dtype))
                .train()
            )
            with torch.no_grad():  # non-trivial LayerNorm affine params
                for norm in (tl.norm1, tl.norm2):
                    norm.weight.normal_()
                    norm.bias.normal_()
            valid = rng.random((B, T)) < 0.7
            valid[:, 0] = True
            allowed = rng.random((T, T)) < 0.6
            allowed[:, 0] = True
            causal = case % 3 == 0
            x = rng.standard_normal((B, T, E)).astype(dtype)
            tx = torch.tensor(x, requires_grad=True)
            cm = np.asarray(causal_mask(T))
            if causal:  # torch's is_causal is a hint that src_mask is the causal mask
                out = tl(tx, src_mask=torch.tensor(~cm), src_key_padding_mask=torch.tensor(~valid), is_causal=True)
                fmask = padding_mask(jnp.asarray(valid))
            elif case % 3 == 1:
                out = tl(tx, src_mask=torch.tensor(~allowed), src_key_padding_mask=torch.tensor(~valid))
                fmask = jnp.asarray(allowed) & padding_mask(jnp.asarray(valid))
            else:
                out = tl(tx, src_mask=torch.tensor(~allowed))
                fmask = jnp.asarray(allowed)
            g = rng.standard_normal(out.shape).astype(dtype)
            (out * torch.tensor(g)).sum().backward()

            block = TransformerBlock(H, mlp_ratio=2.0, causal=causal)
            _, init_params, state = block.init(KEY, (-1, T, E))
            params = _from_torch(_block_pairs(tl))
            params["attn"]["drop"], params["mlp"]["act"], params["mlp"]["drop"] = (), (), ()
            assert jax.tree.structure(params) == jax.tree.structure(init_params)
            params = jax.tree.map(jnp.asarray, params)

            def f(p, x):
                y, _ = block.apply(p, state, x, mask=fmask)
                return jnp.sum(y * g), y

            (_, y), (gp, gx) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, jnp.asarray(x))
            where = f"case {case}: E={E}, H={H}, B={B}, T={T}"
            np.testing.assert_allclose(y, out.detach().numpy(), rtol=rtol, atol=atol, err_msg=where)
            np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=rtol, atol=atol, err_msg=where)
            want = _from_torch(_block_pairs(tl), grads=True)
            want["attn"]["drop"], want["mlp"]["act"], want["mlp"]["drop"] = (), (), ()
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=where), gp, want)


def test_transformer_block_bias_and_mask_errors():
    block = TransformerBlock(2, causal=False)
    _, params, state = block.init(KEY, (-1, 4, 8))
    x = jnp.asarray(np.random.default_rng(6).standard_normal((2, 4, 8)), jnp.float32)
    m = causal_mask(4)
    a, _ = block.apply(params, state, x, mask=m)
    b, _ = block.apply(params, state, x, bias=jnp.where(m, 0.0, -1e9))
    c, _ = TransformerBlock(2).apply(params, state, x)  # causal=True
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    assert not np.allclose(a, block.apply(params, state, x)[0], atol=1e-3)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) cannot broadcast"):
        block.apply(params, state, x, mask=jnp.ones((3, 4), bool))
    with pytest.raises(TypeError, match="boolean with True = may attend"):
        block.apply(params, state, x, mask=jnp.zeros((4, 4)))


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
def test_causal_with_fewer_queries_than_keys_is_torchs_explicit_mask(dtype, rtol, atol):
    """causal=True lines up the last query with the last key (a cache's alignment): torch's
    attn_mask=ones(T, S).tril(S - T). torch's is_causal=True lines up the first ones:
    mask=causal_mask(T, S) here."""
    rng = np.random.default_rng(7)
    with jax.enable_x64(dtype == np.float64):
        for T, S in ((2, 5), (3, 4), (1, 6)):
            q, k, v = (rng.standard_normal((1, n, 2, 3)).astype(dtype) for n in (T, S, S))
            t = lambda a: torch.tensor(a.transpose(0, 2, 1, 3))
            ours = dot_product_attention(*map(jnp.asarray, (q, k, v)), causal=True)
            tril = torch.ones(T, S, dtype=torch.bool).tril(S - T)
            theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=tril)
            np.testing.assert_allclose(ours, theirs.numpy().transpose(0, 2, 1, 3), rtol=rtol, atol=atol)
            first = dot_product_attention(*map(jnp.asarray, (q, k, v)), mask=causal_mask(T, S))
            theirs = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True)
            np.testing.assert_allclose(first, theirs.numpy().transpose(0, 2, 1, 3), rtol=rtol, atol=atol)
            if T > 1:
                assert not np.allclose(ours, first)
