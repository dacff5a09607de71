"""funcnet.models.GPT against a PyTorch GPT built the way nanoGPT's model.py builds it: the
same loss and the same gradients (the tied token table above all) for copied weights; the
TransformerBlock and TiedEmbedding it is made of; Scan/Remat forms; nanoGPT's init."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import F, Module, torch

import funcnet
from funcnet import losses
from funcnet.layers import Dense, TiedEmbedding, TransformerBlock
from funcnet.models import GPT
from funcnet.testing import check_layer

KEY = jax.random.key(0)
V, BLOCK, L, H, E = 11, 8, 2, 2, 16


class TorchGPT(Module):
    """nanoGPT's architecture: tied wte/lm_head, learned wpe, pre-norm blocks with a fused
    c_attn, GELU MLP 4x, LayerNorm with optional bias."""

    def __init__(self, bias):
        super().__init__()
        self.wte = torch.nn.Embedding(V, E)
        self.wpe = torch.nn.Embedding(BLOCK, E)
        ln = lambda: torch.nn.LayerNorm(E, bias=bias)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln_1, b.ln_2 = ln(), ln()
            b.c_attn = torch.nn.Linear(E, 3 * E, bias=bias)
            b.attn_proj = torch.nn.Linear(E, E, bias=bias)
            b.c_fc = torch.nn.Linear(E, 4 * E, bias=bias)
            b.mlp_proj = torch.nn.Linear(4 * E, E, bias=bias)
            self.blocks.append(b)
        self.ln_f = ln()
        self.lm_head = torch.nn.Linear(E, V, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            q, k, v = b.c_attn(b.ln_1(x)).split(E, dim=2)
            heads = lambda t: t.view(B, T, H, E // H).transpose(1, 2)
            y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
            x = x + b.attn_proj(y.transpose(1, 2).reshape(B, T, E))
            x = x + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(x))))
        return self.lm_head(self.ln_f(x))


def _params_from_torch(tm, bias):
    t = lambda w: jnp.asarray(w.detach().numpy())
    lin = lambda m: {"W": t(m.weight).T, **({"b": t(m.bias)} if bias else {})}
    ln = lambda m: {"scale": t(m.weight), **({"bias": t(m.bias)} if bias else {})}
    blocks = []
    for b in tm.blocks:
        w = t(b.c_attn.weight)
        attn = {n: {"W": w[i * E : (i + 1) * E].T} for i, n in enumerate(("query", "key", "value"))}
        if bias:
            for i, n in enumerate(("query", "key", "value")):
                attn[n]["b"] = t(b.c_attn.bias)[i * E : (i + 1) * E]
        attn["out"] = lin(b.attn_proj)
        blocks.append(
            {
                "attn": {"norm": ln(b.ln_1), "attn": attn, "drop": ()},
                "mlp": {"norm": ln(b.ln_2), "fc": lin(b.c_fc), "act": (), "proj": lin(b.mlp_proj), "drop": ()},
            }
        )
    return {
        "E": t(tm.wte.weight),
        "body": {"pos": {"E": t(tm.wpe.weight)}, "drop": (), "blocks": tuple(blocks), "ln_f": ln(tm.ln_f)},
    }


@pytest.mark.parametrize("bias", [False, True])
def test_same_loss_and_gradients_as_torch_tied_gpt(bias):
    torch.manual_seed(0)
    tm = TorchGPT(bias)
    with torch.no_grad():  # non-trivial LayerNorm affine params
        for m in tm.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                if m.bias is not None:
                    m.bias.normal_(0, 0.1)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, V, (3, BLOCK))
    tgt = rng.integers(0, V, (3, BLOCK))
    loss_t = F.cross_entropy(tm(torch.tensor(idx)).reshape(-1, V), torch.tensor(tgt).reshape(-1))
    loss_t.backward()

    net = GPT(V, BLOCK, n_layer=L, n_head=H, n_embd=E, bias=bias)
    params = _params_from_torch(tm, bias)
    _, init_params, _ = jax.eval_shape(lambda k: net.init(k, (-1, BLOCK)), KEY)  # the tree only
    assert jax.tree.structure(init_params) == jax.tree.structure(params)

    def loss_fn(p):
        logits, _ = net.apply(p, (), jnp.asarray(idx))
        return losses.cross_entropy(logits.reshape(-1, V), jnp.asarray(tgt).reshape(-1))

    # jitted: eagerly, each op of the backward pass would be a program of its own
    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    np.testing.assert_allclose(loss, loss_t.item(), rtol=1e-5)
    # the tied table: the embedding's gradient plus the head's, as torch accumulates them
    np.testing.assert_allclose(grads["E"], tm.wte.weight.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["body"]["pos"]["E"], tm.wpe.weight.grad.numpy(), rtol=1e-4, atol=1e-6)
    b0 = tm.blocks[0]
    np.testing.assert_allclose(
        grads["body"]["blocks"][0]["attn"]["attn"]["query"]["W"],
        b0.c_attn.weight.grad.numpy()[:E].T,
        rtol=1e-4,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        grads["body"]["blocks"][1]["mlp"]["fc"]["W"], tm.blocks[1].c_fc.weight.grad.numpy().T, rtol=1e-4, atol=1e-6
    )


def test_nanogpt_init():
    n_layer = 4
    _, params, _ = GPT(V, 64, n_layer=n_layer, n_head=2, n_embd=64, bias=True).init(KEY, (-1, 64))
    flat = funcnet.paths(params)
    resid = 0.02 / math.sqrt(2 * n_layer)
    for path, leaf in flat.items():
        leaf = np.asarray(leaf)
        if path.endswith("/b") or path.endswith("ln_f/bias") or path.endswith("norm/bias"):
            np.testing.assert_array_equal(leaf, 0.0, err_msg=path)
        elif path.endswith("scale"):
            np.testing.assert_array_equal(leaf, 1.0, err_msg=path)
        elif path.endswith("out/W") or path.endswith("proj/W"):
            assert np.std(leaf) == pytest.approx(resid, rel=0.1), path
        else:
            assert np.std(leaf) == pytest.approx(0.02, rel=0.1), path
    assert "E" in flat and "body/pos/E" in flat


def test_tied_embedding_sums_both_uses_and_checks_the_body():
    layer = TiedEmbedding(5, 3)
    out_shape, params, _ = check_layer(layer, (-1, 4), inputs=jnp.array([[0, 1, 2, 4]] * 2), grad_check=False)
    assert out_shape == (-1, 4, 5) and set(params) == {"E"}
    ids = jnp.array([[1, 3]])
    E = params["E"]
    g = jax.grad(lambda E: jnp.sum(layer.apply({"E": E}, (), ids)[0] ** 2))(E)
    # by hand: logits = E[ids] @ E^T
    g_head = jax.grad(lambda W: jnp.sum((E[ids] @ W.T) ** 2))(E)
    g_emb = jax.grad(lambda T: jnp.sum((T[ids] @ E.T) ** 2))(E)
    np.testing.assert_allclose(g, g_head + g_emb, rtol=1e-6)
    with pytest.raises(ValueError, match="must keep the shape"):
        TiedEmbedding(5, 3, Dense(4)).init(KEY, (-1, 4))


def test_transformer_block_contract_and_paths():
    block = TransformerBlock(2, dropout=0.1)
    _, params, _ = check_layer(block, (-1, 4, 8), train_modes=(True,), grad_check=False)
    assert {
        "attn/norm/scale",
        "attn/norm/bias",
        "attn/attn/query/W",
        "attn/attn/query/b",
        "mlp/fc/W",
        "mlp/proj/W",
    } <= set(funcnet.paths(params))
    assert params["mlp"]["fc"]["W"].shape == (8, 32)
    _, params, _ = TransformerBlock(2, use_bias=False).init(KEY, (-1, 3, 4))
    assert not any(p.endswith("/b") or p.endswith("bias") for p in funcnet.paths(params))


def test_scan_and_remat_forms_equal_the_unrolled_gpt():
    kw = dict(n_layer=3, n_head=2, n_embd=8)
    idx = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 6)))
    plain = GPT(V, 6, **kw)
    _, params, _ = plain.init(KEY, (-1, 6))
    want, _ = jax.jit(plain.apply)(params, (), idx)
    scanned = GPT(V, 6, scan=True, remat=True, **kw)
    _, sparams, _ = scanned.init(KEY, (-1, 6))
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *params["body"]["blocks"])
    jax.tree.map(np.testing.assert_array_equal, sparams["body"]["blocks"], stacked)
    got, _ = jax.jit(scanned.apply)(sparams, (), idx)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_policy_runs_the_products_in_bfloat16_on_a_float32_stream():
    """GPT(policy=...), torch.autocast's rule: the same params (tree and arrays, float32);
    logits close to float32's, in bfloat16 (autocast's lm_head); float32 gradients; the
    decoding and scanned forms take it too. (The dtypes inside, op by op:
    tests/test_example_shakespeare.py's bfloat16 test.)"""
    kw = dict(n_layer=2, n_head=2, n_embd=16, bias=True)
    policy = "params=float32,compute=bfloat16"
    plain, mixed = GPT(V, BLOCK, **kw), GPT(V, BLOCK, policy=policy, **kw)
    _, params, _ = plain.init(KEY, (-1, BLOCK))
    _, mixed_params, _ = mixed.init(KEY, (-1, BLOCK))
    jax.tree.map(np.testing.assert_array_equal, mixed_params, params)
    idx = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, BLOCK)))
    want, _ = jax.jit(plain.apply)(params, (), idx)
    got, _ = jax.jit(mixed.apply)(params, (), idx)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(jnp.float32), want, atol=0.02)

    def loss(net, p):
        return losses.cross_entropy(net.apply(p, (), idx)[0].reshape(-1, V), idx.reshape(-1))

    g_mixed, g_plain = (jax.jit(jax.grad(functools.partial(loss, net)))(params) for net in (mixed, plain))
    assert {g.dtype for g in jax.tree.leaves(g_mixed)} == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(g_mixed["E"], g_plain["E"], atol=0.02 * np.abs(g_plain["E"]).max())

    decoder = GPT(V, BLOCK, decode=True, policy=policy, **kw)
    _, _, cache = decoder.init(KEY, (2, 1))
    first, _ = jax.jit(decoder.apply)(params, cache, idx[:, :3])
    np.testing.assert_allclose(first.astype(jnp.float32), got[:, :3].astype(jnp.float32), atol=0.02)
    scanned = GPT(V, BLOCK, scan=True, policy=policy, **kw)
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *params["body"]["blocks"])
    sparams = {**params, "body": {**params["body"], "blocks": stacked}}
    np.testing.assert_allclose(
        jax.jit(scanned.apply)(sparams, (), idx)[0].astype(jnp.float32), got.astype(jnp.float32), atol=0.02
    )
    with pytest.raises(TypeError, match="policy"):
        GPT(V, BLOCK, policy=jnp.bfloat16, **kw)
    with pytest.raises(TypeError, match="policy"):
        TransformerBlock(2, policy=3)
