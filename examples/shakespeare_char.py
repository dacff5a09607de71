"""nanoGPT's character-level Shakespeare (karpathy/nanoGPT, MIT), with funcnet.

The model, recipe and data handling follow nanoGPT's ``model.py``, ``train.py`` and
``config/train_shakespeare_char.py``: a GPT (funcnet.models.GPT) with the token table
tied to the output head, learned positions, pre-norm blocks, a GELU MLP 4x, no biases
(train.py's ``bias=False``), N(0, 0.02) init with the residual projections scaled by
1/sqrt(2 n_layer); AdamW (betas 0.9/0.99, weight decay 0.1 on parameters of >= 2
dimensions only), linear warmup over 100 steps then cosine decay to min_lr, gradients
clipped at global norm 1.0; the first 90 % of the text for training, the 65 characters
as the vocabulary, batches of random windows; every eval_interval steps the mean loss
over eval_iters batches of each split. Defaults are the config's (a GPU run); nanoGPT's
README's CPU run is::

    python examples/shakespeare_char.py --eval-iters=20 --log-interval=100 \\
        --block-size=64 --batch-size=12 --n-layer=4 --n-head=4 --n-embd=128 \\
        --max-iters=2000 --lr-decay-iters=2000 --dropout=0.0

It prints nanoGPT's ``step N: train loss X, val loss Y`` lines, then a sample of
generated text (nanoGPT's sample.py: temperature 0.8, top_k 200).

Where this differs from nanoGPT, and why: batches are drawn on the device from
``jax.random`` (not torch's generator), so the numbers are not torch's run bit for bit;
clipping is optax's ``clip_by_global_norm`` (torch's ``clip_grad_norm_`` adds 1e-6 to
the norm); the step is jitted (nanoGPT's ``compile=False`` on CPU is eager torch).

The text: tinyshakespeare's ``input.txt`` (karpathy/char-rnn, 1,115,394 bytes), read from
``--data``, else ``data/shakespeare_char/input.txt``, else
``../shared/data/shakespeare_char/input.txt``; the first ships with funcnet
(data/shakespeare_char/README.md).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

if __name__ == "__main__" and "jax" not in sys.modules:
    # One CPU device per core, set before jax starts: with --devices (default: all of them)
    # each step splits its batch over them, data-parallel. XLA:CPU leaves the second core
    # mostly idle on one device's small kernels; two devices keep both busy.
    _flag = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax.sharding import NamedSharding, PartitionSpec

from funcnet import distributed, losses, optim
from funcnet.decoding import generate
from funcnet.models import GPT
from funcnet.train import Aux, TrainState, make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_CANDIDATES = (os.path.join(ROOT, "data", "shakespeare_char", "input.txt"),
                   os.path.join(ROOT, "..", "shared", "data", "shakespeare_char", "input.txt"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # nanoGPT's config/train_shakespeare_char.py, spelled with dashes
    for flag, default in (("batch-size", 64), ("block-size", 256), ("n-layer", 6),
                          ("n-head", 6), ("n-embd", 384), ("max-iters", 5000),
                          ("lr-decay-iters", 5000), ("eval-iters", 200), ("log-interval", 10),
                          ("eval-interval", 250), ("warmup-iters", 100), ("seed", 1337),
                          ("sample-tokens", 500)):
        p.add_argument(f"--{flag}", type=int, default=default)
    for flag, default in (("dropout", 0.2), ("learning-rate", 1e-3), ("min-lr", 1e-4),
                          ("beta1", 0.9), ("beta2", 0.99), ("weight-decay", 0.1),
                          ("grad-clip", 1.0)):
        p.add_argument(f"--{flag}", type=float, default=default)
    p.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm")
    p.add_argument("--devices", type=int, default=0, help="split each batch over this many "
                   "devices (data parallel, the same updates); 0: as many as divide the batch")
    p.add_argument("--data", default=None, help="tinyshakespeare input.txt")
    return p.parse_args(argv)


def load_text(path=None):
    for candidate in ([path] if path else DATA_CANDIDATES):
        if candidate and os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as f:
                return f.read()
    sys.exit("tinyshakespeare's input.txt was not found (looked in "
             f"{', '.join(DATA_CANDIDATES) if not path else path}); see "
             "data/shakespeare_char/README.md, or pass --data PATH.")


def encode_splits(text):
    """nanoGPT's prepare.py: the sorted characters as the vocabulary, first 90 % for training."""
    chars = sorted(set(text))
    lookup = np.zeros(max(map(ord, chars)) + 1, np.int32)
    lookup[[ord(c) for c in chars]] = np.arange(len(chars))
    ids = lookup[np.frombuffer(text.encode("utf-32-le"), np.uint32)]
    n = int(len(ids) * 0.9)
    return chars, jnp.asarray(ids[:n]), jnp.asarray(ids[n:])


def get_batch(data, key, batch_size, block_size):
    """Random windows: x = data[i:i+block], y = data[i+1:i+1+block] (train.py's get_batch)."""
    starts = jax.random.randint(key, (batch_size,), 0, data.shape[0] - block_size)
    window = jax.vmap(lambda i: jax.lax.dynamic_slice_in_dim(data, i, block_size + 1))(starts)
    return window[:, :-1], window[:, 1:]


def lr_schedule(args):
    """train.py's get_lr, as an optax schedule of the update count (0 for the first update)."""
    def schedule(it):
        it = jnp.asarray(it, jnp.float32)
        warm = args.learning_rate * (it + 1) / (args.warmup_iters + 1)
        ratio = (it - args.warmup_iters) / max(args.lr_decay_iters - args.warmup_iters, 1)
        coeff = 0.5 * (1.0 + jnp.cos(math.pi * jnp.clip(ratio, 0.0, 1.0)))
        cosine = args.min_lr + coeff * (args.learning_rate - args.min_lr)
        return jnp.where(it < args.warmup_iters, warm,
                         jnp.where(it > args.lr_decay_iters, args.min_lr, cosine))
    return schedule


def build(args, vocab_size):
    net = GPT(vocab_size, args.block_size, n_layer=args.n_layer, n_head=args.n_head,
              n_embd=args.n_embd, dropout=args.dropout, bias=args.bias)
    adamw = optim.adamw(lr_schedule(args), b1=args.beta1, b2=args.beta2,
                        weight_decay=args.weight_decay,
                        mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    optimizer = (optax.chain(optax.clip_by_global_norm(args.grad_clip), adamw)
                 if args.grad_clip else adamw)
    return net, optimizer


def make_mesh(args):
    """A data mesh over as many devices as divide the batch (``--devices``), or None for one."""
    n = args.devices or jax.device_count()
    n = max(d for d in range(1, min(n, jax.device_count()) + 1) if args.batch_size % d == 0)
    return distributed.data_mesh(n) if n > 1 else None


def main(argv=None):
    args = parse_args(argv)
    chars, train_ids, val_ids = encode_splits(load_text(args.data))
    net, optimizer = build(args, len(chars))
    key = jax.random.key(args.seed)
    init_key, data_key, eval_key, sample_key = jax.random.split(key, 4)
    ts = TrainState.create(net, optimizer, init_key, (-1, args.block_size))
    mesh = make_mesh(args)
    if mesh is not None:  # the state and the text on every device, each batch split
        ts, train_ids, val_ids = distributed.replicate_on(mesh, (ts, train_ids, val_ids))
    split = (lambda b: b) if mesh is None else (
        lambda b: jax.sharding.reshard(b, NamedSharding(mesh, PartitionSpec("data"))))
    n_params = sum(x.size for x in jax.tree.leaves(ts.params)) - ts.params["body"]["pos"]["E"].size
    print(f"number of parameters: {n_params / 1e6:.2f}M")

    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, state = net.apply(params, state, x, rng=rng, train=True)
        return losses.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), \
            Aux(state=state)

    step = make_train_step(loss_fn, optimizer)

    @jax.jit
    def train_step(ts, key):
        return step(ts, split(get_batch(train_ids, key, args.batch_size, args.block_size)))

    @jax.jit
    def estimate_loss(params, key):
        """Mean loss over eval_iters batches of each split, without dropout."""
        def split_loss(data, key):
            def one(key):
                x, y = split(get_batch(data, key, args.batch_size, args.block_size))
                logits, _ = net.apply(params, (), x)
                return losses.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            return jnp.mean(jax.lax.map(one, jax.random.split(key, args.eval_iters)))
        k1, k2 = jax.random.split(key)
        return split_loss(train_ids, k1), split_loss(val_ids, k2)

    history = []
    t_start = t0 = time.perf_counter()
    for it in range(args.max_iters + 1):  # train.py evaluates at max_iters, then stops
        if it % args.eval_interval == 0:
            tr, va = estimate_loss(ts.params, jax.random.fold_in(eval_key, it))
            history.append((it, float(tr), float(va)))
            print(f"step {it}: train loss {tr:.4f}, val loss {va:.4f}", flush=True)
        if it == args.max_iters:
            break
        ts, metrics = train_step(ts, jax.random.fold_in(data_key, it))
        if it % args.log_interval == 0:
            loss = float(metrics["loss"])  # waits for the step: the time below is honest
            now = time.perf_counter()
            print(f"iter {it}: loss {loss:.4f}, time {(now - t0) * 1000:.2f}ms", flush=True)
            t0 = now
    print(f"training took {time.perf_counter() - t_start:.1f} s")

    sample = ""
    if args.sample_tokens:
        prompt = jnp.zeros((1, 1), jnp.int32)  # sample.py starts from "\n", id 0
        tokens = jax.jit(generate, static_argnames=("net", "max_new_tokens", "temperature",
                                                     "top_k", "window"))(
            net, jax.device_get(ts.params), (), prompt, args.sample_tokens, rng=sample_key, temperature=0.8,
            top_k=200, window=args.block_size)
        sample = "".join(chars[i] for i in np.asarray(tokens[0]))
        print(sample)
    return history, sample, ts


if __name__ == "__main__":
    main()
