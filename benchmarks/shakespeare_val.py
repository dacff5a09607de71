"""The val loss of the Shakespeare run measured precisely: funcnet's model after
``examples/shakespeare_char.py``'s CPU run and nanoGPT's step-2000 checkpoint, on the same
windows of the validation split.

nanoGPT's ``val loss`` line is a 20-batch estimate (``--eval-iters=20``), which moves by a few
hundredths from one set of batches to the next; this evaluates both models on thousands of
windows instead.

    python -m benchmarks.shakespeare_val --nanogpt-dir PATH [--windows 2400]
    python -m benchmarks.shakespeare_val --nanogpt-dir PATH --trajectory 400

``--trajectory N`` instead starts funcnet's GPT from the initial weights of nanoGPT's own
model (``torch.manual_seed(1337)``, its CPU configuration), feeds both the same N batches, and
prints both losses every 40 steps: nanoGPT's loop (its ``configure_optimizers``, ``get_lr``,
``clip_grad_norm_``) against the example's.

``PATH`` is a nanoGPT checkout (karpathy/nanoGPT) in which ``train.py`` has run with its CPU
flags (``config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
--log_interval=100 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``), so that it holds
``out-shakespeare-char/ckpt.pt`` and ``data/shakespeare_char/val.bin``. Its ``model.py`` is
imported from there (it is not part of funcnet). funcnet's run is made here, on one device.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_RUN = (
    "--eval-iters=20 --log-interval=1000 --block-size=64 --batch-size=12 --n-layer=4 "
    "--n-head=4 --n-embd=128 --max-iters=2000 --lr-decay-iters=2000 --dropout=0.0 "
    "--sample-tokens=0 --devices=1"
).split()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt-dir", required=True)
    p.add_argument("--windows", type=int, default=2400)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--trajectory", type=int, default=0)
    args = p.parse_args(argv)
    if args.trajectory:
        return trajectory(args.nanogpt_dir, args.trajectory)

    import jax
    import jax.numpy as jnp
    import torch

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    sys.path.insert(0, args.nanogpt_dir)
    import shakespeare_char as sc
    from model import GPT, GPTConfig  # nanoGPT's

    from funcnet import losses

    run = CPU_RUN + [f"--seed={args.seed}"]
    history, _, ts = sc.main(run)
    val = np.fromfile(os.path.join(args.nanogpt_dir, "data", "shakespeare_char", "val.bin"), dtype=np.uint16).astype(
        np.int64
    )
    starts = np.random.default_rng(0).integers(0, len(val) - 65, args.windows)
    x = np.stack([val[i : i + 64] for i in starts])
    y = np.stack([val[i + 1 : i + 65] for i in starts])
    net, _ = sc.build(sc.parse_args(run), 65)
    loss = jax.jit(lambda p, xb, yb: losses.cross_entropy(net.apply(p, (), xb)[0].reshape(-1, 65), yb.reshape(-1)))
    chunks = [slice(i, i + 240) for i in range(0, args.windows, 240)]
    ours = np.mean([float(loss(ts.params, jnp.asarray(x[c], jnp.int32), jnp.asarray(y[c], jnp.int32))) for c in chunks])

    ck = torch.load(os.path.join(args.nanogpt_dir, "out-shakespeare-char", "ckpt.pt"), map_location="cpu")
    model = GPT(GPTConfig(**ck["model_args"]))
    model.load_state_dict(ck["model"])
    model.eval()
    with torch.no_grad():
        theirs = np.mean([model(torch.tensor(x[c]), torch.tensor(y[c]))[1].item() for c in chunks])
    print(
        f"nanoGPT checkpoint (iter {ck['iter_num']}, its 20-batch val loss "
        f"{float(ck['best_val_loss']):.4f}): val loss over {args.windows} windows {theirs:.4f}"
    )
    print(
        f"funcnet --seed={args.seed} (its 20-batch val loss {history[-1][2]:.4f}): val loss "
        f"over {args.windows} windows {ours:.4f}"
    )


def trajectory(nanogpt_dir, steps):
    import math

    import jax
    import jax.numpy as jnp
    import torch

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    sys.path.insert(0, nanogpt_dir)
    import shakespeare_char as sc
    from model import GPT, GPTConfig  # nanoGPT's

    from funcnet import losses
    from funcnet.train import Aux, TrainState, make_train_step

    args = sc.parse_args(CPU_RUN)
    torch.manual_seed(1337)
    tm = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False))
    opt = tm.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    net, tx = sc.build(args, 65)
    E = 128
    t = lambda w: jnp.asarray(w.detach().numpy())  # noqa: E731
    blocks = []
    for b in tm.transformer.h:
        w = t(b.attn.c_attn.weight)
        attn = {n: {"W": w[i * E : (i + 1) * E].T} for i, n in enumerate(("query", "key", "value"))}
        attn["out"] = {"W": t(b.attn.c_proj.weight).T}
        blocks.append(
            {
                "attn": {"norm": {"scale": t(b.ln_1.weight)}, "attn": attn, "drop": ()},
                "mlp": {
                    "norm": {"scale": t(b.ln_2.weight)},
                    "fc": {"W": t(b.mlp.c_fc.weight).T},
                    "act": (),
                    "proj": {"W": t(b.mlp.c_proj.weight).T},
                    "drop": (),
                },
            }
        )
    params = {
        "E": t(tm.transformer.wte.weight),
        "body": {
            "pos": {"E": t(tm.transformer.wpe.weight)},
            "drop": (),
            "blocks": tuple(blocks),
            "ln_f": {"scale": t(tm.transformer.ln_f.weight)},
        },
    }
    ts = TrainState.create(net, tx, jax.random.key(0), (-1, 64))
    ts = ts._replace(params=params, opt_state=tx.init(params))

    def loss_fn(p, s, batch, rng):
        logits, s = net.apply(p, s, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits.reshape(-1, 65), batch[1].reshape(-1)), Aux(state=s)

    step = jax.jit(make_train_step(loss_fn, tx))
    data = np.fromfile(os.path.join(nanogpt_dir, "data", "shakespeare_char", "train.bin"), dtype=np.uint16).astype(
        np.int64
    )
    rng = np.random.default_rng(0)

    def get_lr(it):  # nanoGPT train.py's, with its shakespeare_char CPU settings
        if it < 100:
            return 1e-3 * (it + 1) / 101
        return 1e-4 + 0.5 * (1 + math.cos(math.pi * min(1.0, (it - 100) / 1900))) * 9e-4

    worst = 0.0
    for it in range(steps):
        starts = rng.integers(0, len(data) - 64, 12)
        x = np.stack([data[i : i + 64] for i in starts])
        y = np.stack([data[i + 1 : i + 65] for i in starts])
        for group in opt.param_groups:
            group["lr"] = get_lr(it)
        _, loss = tm(torch.tensor(x), torch.tensor(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ts, m = step(ts, (jnp.asarray(x, jnp.int32), jnp.asarray(y, jnp.int32)))
        worst = max(worst, abs(loss.item() - float(m["loss"])))
        if it % 40 == 0 or it == steps - 1:
            print(f"step {it}: nanoGPT {loss.item():.5f}  funcnet {float(m['loss']):.5f}")
    print(f"largest difference over {steps} steps: {worst:.2e}")


if __name__ == "__main__":
    main()
