"""The val loss of the Shakespeare run measured precisely: funcnet's model after
``examples/shakespeare_char.py``'s CPU run and nanoGPT's step-2000 checkpoint, on the same
windows of the validation split.

nanoGPT's ``val loss`` line is a 20-batch estimate (``--eval-iters=20``), which moves by a few
hundredths from one set of batches to the next; this evaluates both models on thousands of
windows instead.

    python -m benchmarks.shakespeare_val --nanogpt-dir PATH [--windows 2400]

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
CPU_RUN = ("--eval-iters=20 --log-interval=1000 --block-size=64 --batch-size=12 --n-layer=4 "
           "--n-head=4 --n-embd=128 --max-iters=2000 --lr-decay-iters=2000 --dropout=0.0 "
           "--sample-tokens=0 --devices=1").split()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt-dir", required=True)
    p.add_argument("--windows", type=int, default=2400)
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args(argv)

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
    val = np.fromfile(os.path.join(args.nanogpt_dir, "data", "shakespeare_char", "val.bin"),
                      dtype=np.uint16).astype(np.int64)
    starts = np.random.default_rng(0).integers(0, len(val) - 65, args.windows)
    x = np.stack([val[i:i + 64] for i in starts])
    y = np.stack([val[i + 1:i + 65] for i in starts])
    net, _ = sc.build(sc.parse_args(run), 65)
    loss = jax.jit(lambda p, xb, yb: losses.cross_entropy(
        net.apply(p, (), xb)[0].reshape(-1, 65), yb.reshape(-1)))
    chunks = [slice(i, i + 240) for i in range(0, args.windows, 240)]
    ours = np.mean([float(loss(ts.params, jnp.asarray(x[c], jnp.int32),
                               jnp.asarray(y[c], jnp.int32))) for c in chunks])

    ck = torch.load(os.path.join(args.nanogpt_dir, "out-shakespeare-char", "ckpt.pt"),
                    map_location="cpu")
    model = GPT(GPTConfig(**ck["model_args"]))
    model.load_state_dict(ck["model"])
    model.eval()
    with torch.no_grad():
        theirs = np.mean([model(torch.tensor(x[c]), torch.tensor(y[c]))[1].item()
                          for c in chunks])
    print(f"nanoGPT checkpoint (iter {ck['iter_num']}, its 20-batch val loss "
          f"{float(ck['best_val_loss']):.4f}): val loss over {args.windows} windows {theirs:.4f}")
    print(f"funcnet --seed={args.seed} (its 20-batch val loss {history[-1][2]:.4f}): val loss "
          f"over {args.windows} windows {ours:.4f}")


if __name__ == "__main__":
    main()
