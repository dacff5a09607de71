"""Workload 9: one training step of nanoGPT's character GPT (its CPU configuration).

Every peer starts from the same weights (nanoGPT's init, drawn once in NumPy) and trains on
the same random windows of a synthetic 65-symbol text, with AdamW(1e-3, betas (0.9, 0.99),
weight decay 0.1 on matrices) and gradient clipping at 1.0, so 'loss, step 1' agrees.

Peers: funcnet's ``models.GPT`` (one device; the batch split over 2 CPU devices, one step
per dispatch or as examples/shakespeare_char.py runs it; the blocks
under ``Scan``; bfloat16 compute), a hand-written JAX GPT as an expert would write it
(flattened matmuls, one fused qkv projection, heads folded into the batch), and PyTorch
running nanoGPT's architecture (eager, ``torch.compile``, bf16 autocast). The PyTorch model
is written here from nanoGPT's ``model.py`` design (MIT): fused ``c_attn``,
``F.scaled_dot_product_attention(is_causal=True)``, tied ``wte``/``lm_head``.

Every peer draws each step's windows on the host and copies them to its device (64 KB at
nanoGPT's GPU size), as nanoGPT's ``get_batch`` does. On a GPU (``cfg["device"] ==
"gpu"``) the torch peers keep the model on ``cuda`` (copies pinned and non-blocking, as
nanoGPT's), autocast to bfloat16 on ``cuda``, and synchronise before the clock is read;
the JAX peers' timings end on a loss read back from the device, which waits for the
whole step (one XLA program).
"""

from __future__ import annotations

import math
import time

import numpy as np

from benchmarks import common

VOCAB = 65


def _weights(case, seed=0):
    """nanoGPT's init as NumPy arrays, in torch's (out, in) Linear layout."""
    rng = np.random.default_rng(seed)
    E, L = case["n_embd"], case["n_layer"]
    n = lambda *s, std=0.02: (rng.standard_normal(s) * std).astype(np.float32)  # noqa: E731
    proj = 0.02 / math.sqrt(2 * L)
    return {
        "wte": n(VOCAB, E),
        "wpe": n(case["block"], E),
        "blocks": [
            dict(c_attn=n(3 * E, E), attn_proj=n(E, E, std=proj), c_fc=n(4 * E, E), mlp_proj=n(E, 4 * E, std=proj))
            for _ in range(L)
        ],
    }


def _data(case):
    return np.random.default_rng(1).integers(0, VOCAB, 200_000).astype(np.int32)


def _windows(data, case, step):
    rng = np.random.default_rng(1000 + step)
    starts = rng.integers(0, len(data) - case["block"] - 1, case["batch"])
    w = np.stack([data[i : i + case["block"] + 1] for i in starts])
    return w[:, :-1], w[:, 1:]


def _time(run_steps, first_steps, case, cfg):
    steps = case["quick_steps"] if cfg["quick"] else case["steps"]
    reps = case["quick_reps"] if cfg["quick"] else case["reps"]
    t0 = time.perf_counter()
    loss_first = run_steps(1)
    first = time.perf_counter() - t0
    run_steps(2)
    values = [t / steps for t in common.measure(lambda: run_steps(steps), reps)]
    return {"values": values, "extra": {"first_step_s": first, "loss_first": loss_first}}


# --------------------------------------------------------------------------- #
# JAX peers
# --------------------------------------------------------------------------- #


def _funcnet_params(w, case, scan):
    import jax.numpy as jnp

    E = case["n_embd"]
    blocks = []
    for b in w["blocks"]:
        qkv = b["c_attn"]
        attn = {n: {"W": jnp.asarray(qkv[i * E : (i + 1) * E].T)} for i, n in enumerate(("query", "key", "value"))}
        attn["out"] = {"W": jnp.asarray(b["attn_proj"].T)}
        blocks.append(
            {
                "attn": {"norm": {"scale": jnp.ones(E)}, "attn": attn, "drop": ()},
                "mlp": {
                    "norm": {"scale": jnp.ones(E)},
                    "fc": {"W": jnp.asarray(b["c_fc"].T)},
                    "act": (),
                    "proj": {"W": jnp.asarray(b["mlp_proj"].T)},
                    "drop": (),
                },
            }
        )
    if scan:
        import jax

        blocks = jax.tree.map(lambda *a: jnp.stack(a), *blocks)
    else:
        blocks = tuple(blocks)
    return {
        "E": jnp.asarray(w["wte"]),
        "body": {"pos": {"E": jnp.asarray(w["wpe"])}, "drop": (), "blocks": blocks, "ln_f": {"scale": jnp.ones(E)}},
    }


def _optimizer():
    import jax
    import optax
    from funcnet import optim

    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optim.adamw(1e-3, b2=0.99, weight_decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
    )


def run_funcnet(peer, cfg, case):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from funcnet import distributed, losses, precision
    from funcnet.models import GPT
    from funcnet.train import Aux, TrainState, make_train_step

    scan = peer == "funcnet-scan"
    net = GPT(
        VOCAB,
        case["block"],
        n_layer=case["n_layer"],
        n_head=case["n_head"],
        n_embd=case["n_embd"],
        bias=False,
        scan=scan,
    )
    if peer == "funcnet-bf16":
        net = precision.apply_policy(net, "params=float32,compute=bfloat16,output=float32")
    opt = _optimizer()
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, case["block"]))
    ts = ts._replace(params=_funcnet_params(_weights(case), case, scan))
    ts = ts._replace(opt_state=opt.init(ts.params))

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits.reshape(-1, VOCAB), batch[1].reshape(-1)), Aux(state=state)

    put = jnp.asarray
    if peer == "funcnet-2dev":
        mesh = distributed.data_mesh(2)
        ts = distributed.replicate_on(mesh, ts)
        put = lambda a: jax.device_put(a, NamedSharding(mesh, PartitionSpec("data")))  # noqa
    data = _data(case)
    holder = {"ts": ts, "i": 0}
    if peer in ("funcnet-loop", "funcnet-2dev-loop"):
        devices = 2 if peer == "funcnet-2dev-loop" else 1
        return _time(_example_loop(ts, loss_fn, opt, data, case, holder, devices), 1, case, cfg)
    step = jax.jit(make_train_step(loss_fn, opt), donate_argnums=0)

    def run_steps(n):
        for _ in range(n):
            x, y = _windows(data, case, holder["i"])
            holder["ts"], m = step(holder["ts"], (put(x), put(y)))
            holder["i"] += 1
        return float(m["loss"])

    return _time(run_steps, 1, case, cfg)


def _example_loop(ts, loss_fn, opt, data, case, holder, devices, k=10):
    """examples/shakespeare_char.py's loop: ``k`` steps per dispatch in a lax.scan over
    windows staged on the device(s), each batch split over them (the example gathers its
    windows on the devices instead, and runs 50 steps per dispatch on nanoGPT's CPU run)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from funcnet import distributed
    from funcnet.train import make_train_step

    mesh = distributed.data_mesh(devices)
    holder["ts"] = distributed.replicate_on(mesh, ts)
    step = make_train_step(loss_fn, opt)

    @jax.jit
    def steps(ts, xs, ys):
        def body(ts, batch):
            ts, metrics = step(ts, batch)
            return ts, metrics["loss"]

        return jax.lax.scan(body, ts, (xs, ys))

    stage = NamedSharding(mesh, P(None, "data"))
    # the k-step program is compiled here, outside the timings; the 1-step program the
    # first call compiles is what 'compile + 1st step' reports, as for the other peers
    blank = jax.device_put(np.zeros((k, case["batch"], case["block"]), np.int32), stage)
    jax.block_until_ready(steps(jax.tree.map(lambda a: a.copy(), holder["ts"]), blank, blank))

    def run_steps(n):
        size = min(k, n)
        assert n % size == 0, f"{n} steps in dispatches of {size}"
        for _ in range(n // size):
            x, y = zip(*(_windows(data, case, holder["i"] + j) for j in range(size)))
            holder["ts"], losses = steps(
                holder["ts"], jax.device_put(np.stack(x), stage), jax.device_put(np.stack(y), stage)
            )
            holder["i"] += size
        return float(losses[0])

    return run_steps


def run_jax(peer, cfg, case):
    """A GPT written directly in jax.numpy, the way an expert would for XLA:CPU."""
    import jax
    import jax.numpy as jnp
    import optax

    w = _weights(case)
    B, T, E, H = case["batch"], case["block"], case["n_embd"], case["n_head"]
    D = E // H
    params = {
        "wte": jnp.asarray(w["wte"]),
        "wpe": jnp.asarray(w["wpe"]),
        "lnf": jnp.ones(E),
        "blocks": [
            dict(
                ln1=jnp.ones(E),
                ln2=jnp.ones(E),
                qkv=jnp.asarray(b["c_attn"].T),
                proj=jnp.asarray(b["attn_proj"].T),
                fc=jnp.asarray(b["c_fc"].T),
                out=jnp.asarray(b["mlp_proj"].T),
            )
            for b in w["blocks"]
        ],
    }
    mask = jnp.tril(jnp.ones((T, T), bool))

    def ln(x, g):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g

    def forward(p, idx):
        x = (p["wte"][idx] + p["wpe"][:T]).reshape(B * T, E)
        for b in p["blocks"]:
            qkv = (ln(x, b["ln1"]) @ b["qkv"]).reshape(B, T, 3, H, D)
            qkv = qkv.transpose(2, 0, 3, 1, 4).reshape(3, B * H, T, D)
            s = jnp.einsum("ntd,nsd->nts", qkv[0], qkv[1]) / math.sqrt(D)
            a = jax.nn.softmax(jnp.where(mask, s, -1e30), -1)
            y = jnp.einsum("nts,nsd->ntd", a, qkv[2]).reshape(B, H, T, D)
            x = x + y.transpose(0, 2, 1, 3).reshape(B * T, E) @ b["proj"]
            h = ln(x, b["ln2"]) @ b["fc"]
            x = x + (0.5 * h * (1 + jax.lax.erf(h / math.sqrt(2)))) @ b["out"]
        return ln(x, p["lnf"]) @ p["wte"].T

    def loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(forward(p, x), y.reshape(-1)).mean()

    tx = _optimizer()

    @jax.jit
    def step(p, o, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, l

    data = _data(case)
    holder = {"p": params, "o": tx.init(params), "i": 0}

    def run_steps(n):
        for _ in range(n):
            x, y = _windows(data, case, holder["i"])
            holder["p"], holder["o"], l = step(holder["p"], holder["o"], jnp.asarray(x), jnp.asarray(y))
            holder["i"] += 1
        return float(l)

    return _time(run_steps, 1, case, cfg)


# --------------------------------------------------------------------------- #
# PyTorch peers
# --------------------------------------------------------------------------- #


def _torch_model(case):
    import torch
    import torch.nn.functional as F
    from torch import nn

    E, H, T = case["n_embd"], case["n_head"], case["block"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(E, bias=False), nn.LayerNorm(E, bias=False)
            self.c_attn = nn.Linear(E, 3 * E, bias=False)
            self.attn_proj = nn.Linear(E, E, bias=False)
            self.c_fc = nn.Linear(E, 4 * E, bias=False)
            self.mlp_proj = nn.Linear(4 * E, E, bias=False)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.c_attn(self.ln_1(x)).split(E, dim=2)
            heads = lambda t: t.view(B, T, H, E // H).transpose(1, 2)  # noqa: E731
            y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, E))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, E), nn.Embedding(T, E)
            self.blocks = nn.ModuleList([Block() for _ in range(case["n_layer"])])
            self.ln_f = nn.LayerNorm(E, bias=False)
            self.lm_head = nn.Linear(E, VOCAB, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    model = GPT()
    w = _weights(case)
    with torch.no_grad():
        model.wte.weight.copy_(torch.tensor(w["wte"]))
        model.wpe.weight.copy_(torch.tensor(w["wpe"]))
        for b, wb in zip(model.blocks, w["blocks"]):
            for name in ("c_attn", "attn_proj", "c_fc", "mlp_proj"):
                getattr(b, name).weight.copy_(torch.tensor(wb[name]))
    return model


def run_torch(peer, cfg, case):
    import torch

    device = common.torch_device(cfg)
    model = _torch_model(case).to(device)  # before the optimizer takes its parameters
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99)
    )
    forward = torch.compile(model) if peer == "torch-compile" else model
    autocast = common.torch_autocast(peer, device)
    data = _data(case)
    holder = {"i": 0}

    def put(a):
        t = torch.from_numpy(a).long()
        return t.pin_memory().to(device, non_blocking=True) if device == "cuda" else t

    def run_steps(n):
        for _ in range(n):
            x, y = _windows(data, case, holder["i"])
            with autocast():
                loss = forward(put(x), put(y))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            holder["i"] += 1
        common.torch_sync(device)
        return float(loss.detach())

    return _time(run_steps, 1, case, cfg)
