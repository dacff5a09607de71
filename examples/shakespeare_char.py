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

It prints nanoGPT's ``step N: train loss X, val loss Y`` and ``iter N: loss X, time Yms,
mfu Z%`` lines, then a sample of generated text (nanoGPT's sample.py: temperature 0.8,
top_k 200). ``mfu`` is nanoGPT's ``estimate_mfu`` (:func:`estimate_mfu`) against
``--peak-tflops`` (312, an A100's bfloat16 peak, as nanoGPT), smoothed as train.py does
(-100.00% until 5 iterations have run); on a CPU it is near 0 by construction. The train
dispatch is compiled ahead of time (``compile: X s``, printed once, so the first ``time``
is a step's; it still includes the evaluation at step 0, as train.py's) and donates its
TrainState, so that XLA can write the new state over the old one; the evaluation and the
sampler compile meanwhile on a second thread (:func:`compile_programs`).

Precision, ``--dtype`` (train.py's): ``float32``, ``bfloat16`` or ``float16``; by default
bfloat16 on an NVIDIA GPU of compute capability 8.0 or more, float16 on an older one and
float32 on a CPU (train.py's ``nullcontext`` there; :func:`default_dtype`). The low
dtypes follow train.py's ``torch.autocast`` context through ``GPT(policy=...)``
(:func:`mixed_precision`, funcnet.precision): in ``dtype`` run the matrix products --
the q/k/v and output projections, the attention scores and weighted sum, the MLP's two
products and the GELU between them (torch runs it on their ``dtype`` output), and the
tied head, whose logits are ``dtype`` as autocast's ``lm_head``'s; float32 are the
master weights (the params AdamW updates and their gradients), the embedding lookups,
the LayerNorms, the softmax, the loss and the residual stream, to which each branch's
``dtype`` output is added in float32 (torch: float32 + bfloat16 is float32). float16
scales the loss dynamically, as train.py's ``GradScaler`` (2**16 to start; a step with
inf/NaN gradients is skipped and the scale halved). One difference there: a skipped
step leaves optax's step count, and so the learning rate, where it was; train.py's
``get_lr(iter_num)`` moves on.

Attention: cuDNN's fused kernel (``jax.nn.dot_product_attention(implementation=
"cudnn")``, flash attention, as torch's ``scaled_dot_product_attention`` gives nanoGPT on
a GPU) where it applies: an NVIDIA GPU, bfloat16 or float16, a head dim that is a
multiple of 8 (at most 128) and ``--dropout=0`` (:func:`attention_path`). jax's fused
attention has no dropout on the attention weights, where nanoGPT's dropout applies too.
So nanoGPT's GPU config, with its dropout of 0.2, trains with funcnet's written-out
attention (and evaluates, without dropout, with jax.nn.dot_product_attention's XLA path);
only a ``--dropout=0`` run uses cuDNN's. On a CPU it is funcnet's written-out attention,
the faster one there. The run prints which path it takes.

None of the GPU paths (bfloat16/float16 on a GPU, cuDNN's attention, donation there,
``--steps-per-dispatch`` for a GPU) has been run on a GPU yet: their speed and mfu are
not measured. On a CPU the float32 default runs the program it ran before they existed,
with the same losses.

Random numbers: with ``--rng=torch`` (the default) the run draws nanoGPT's own. Its
``torch.manual_seed(seed)`` generator is reproduced in numpy (examples/_torch_rng.py; torch
is not needed), and the draws are taken in nanoGPT's order: the model's init (so the
initial weights are nanoGPT's to float32 rounding), then train.py's batches and its
evaluation batches. The run then follows nanoGPT's own run for that seed, and its printed
losses can be compared with nanoGPT's line by line. ``--rng=jax`` draws the init (funcnet's
GPT init, the same distributions) and the windows from ``jax.random`` instead, as funcnet
code would; its losses are another sample of the same run. Dropout's masks always come
from ``jax.random``. So with dropout (the defaults' 0.2) ``--rng=torch`` gives nanoGPT's
init and first batches only: nanoGPT's dropout draws from the same torch generator between
its batches, which is not reproduced, so its later batches are other windows; the example
says so when it starts.

Where this differs from nanoGPT, and why: clipping is optax's ``clip_by_global_norm``
(torch's ``clip_grad_norm_`` adds 1e-6 to the norm); the step is jitted (nanoGPT's
``compile=False`` on CPU is eager torch); one dispatch runs up to
``--steps-per-dispatch`` (50) steps (a ``lax.scan``; see ``steps_per_dispatch``), on one
device, or with ``--devices=N`` each batch split over N (the CPU cores as devices; the
same updates on any number of devices, up to float rounding: the dropout masks are drawn
for the whole batch; see ``make_mesh``).

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
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

if __name__ == "__main__" and "jax" not in sys.modules:
    # One CPU device per core, set before jax starts: with --devices=N each step splits
    # its batch over N of them, data-parallel, with the same updates (the default when a
    # dispatch runs one step, where it keeps the second core busy; see make_mesh).
    _flag = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax.sharding import NamedSharding, PartitionSpec

from funcnet import distributed, losses, optim, precision
from funcnet.decoding import generate
from funcnet.models import GPT
from funcnet.train import Aux, TrainState, make_train_step

from _torch_rng import TorchCPUGenerator

DTYPES = ("float32", "bfloat16", "float16")  # train.py's --dtype
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_CANDIDATES = (
    os.path.join(ROOT, "data", "shakespeare_char", "input.txt"),
    os.path.join(ROOT, "..", "shared", "data", "shakespeare_char", "input.txt"),
)


def parse_args(argv=None):
    """The flags as given; :func:`main` then refuses those no run can use
    (:func:`refuse_bad_args`)."""
    return _parser().parse_args(argv)


def refuse_bad_args(args):
    """``args``, or an exit as argparse's (its usage line, status 2) naming every flag
    of ``args`` that no run can use (:func:`check_args`)."""
    bad = check_args(args)
    if bad:
        _parser().error("; ".join(bad))
    return args


# What each count is for, so that a 0 is refused with a reason rather than giving nan
# losses (--eval-iters: a mean over no batches) or a ZeroDivisionError (the intervals).
_AT_LEAST_ONE = {
    "eval_iters": "the loss printed at each evaluation is the mean over eval_iters batches "
    "of each split, so 0 gives nan (nanoGPT's CPU run: 20)",
    "log_interval": "an iter line is printed every log_interval iterations",
    "eval_interval": "the model is evaluated every eval_interval iterations",
    "batch_size": "the windows per update",
    "block_size": "the context length",
    "n_layer": "the transformer blocks",
    "n_head": "the attention heads",
    "n_embd": "the width",
    "steps_per_dispatch": "the most updates per dispatch",
}
_AT_LEAST_ZERO = ("max_iters", "lr_decay_iters", "warmup_iters", "sample_tokens", "devices")


def check_args(args):
    """The messages for arguments no run can use (empty when all are fine)."""
    flag = lambda name: "--" + name.replace("_", "-")
    bad = [
        f"{flag(n)}={getattr(args, n)} must be at least 1: {why}"
        for n, why in _AT_LEAST_ONE.items()
        if getattr(args, n) < 1
    ]
    bad += [f"{flag(n)}={getattr(args, n)} must be at least 0" for n in _AT_LEAST_ZERO if getattr(args, n) < 0]
    if not 0.0 <= args.dropout < 1.0:
        bad.append(f"--dropout={args.dropout} must be in [0, 1): the probability of zeroing each activation")
    return bad


def check_block_size(args, splits):
    """``splits`` (:func:`encode_splits`'s), or an argument error for a ``--block-size``
    the text cannot fill: a window takes block_size + 1 characters (the inputs and their
    next-character targets) from each split, and the validation split is the text's
    last 10 %."""
    n_train, n_val = len(splits[1]), len(splits[2])
    n = min(n_train, n_val)
    if args.block_size + 1 > n:
        _parser().error(
            f"--block-size={args.block_size} is too long for the text: its "
            f"{'validation' if n == n_val else 'training'} split has {n} "
            f"characters and a window needs block_size + 1 of them. Use "
            f"--block-size={max(n - 1, 1)} or less, or a longer text (--data)."
        )
    return splits


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # nanoGPT's config/train_shakespeare_char.py, spelled with dashes
    for flag, default in (
        ("batch-size", 64),
        ("block-size", 256),
        ("n-layer", 6),
        ("n-head", 6),
        ("n-embd", 384),
        ("max-iters", 5000),
        ("lr-decay-iters", 5000),
        ("eval-iters", 200),
        ("log-interval", 10),
        ("eval-interval", 250),
        ("warmup-iters", 100),
        ("seed", 1337),
        ("sample-tokens", 500),
    ):
        p.add_argument(f"--{flag}", type=int, default=default)
    for flag, default in (
        ("dropout", 0.2),
        ("learning-rate", 1e-3),
        ("min-lr", 1e-4),
        ("beta1", 0.9),
        ("beta2", 0.99),
        ("weight-decay", 0.1),
        ("grad-clip", 1.0),
    ):
        p.add_argument(f"--{flag}", type=float, default=default)
    p.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm")
    p.add_argument(
        "--rng",
        choices=("torch", "jax"),
        default="torch",
        help="torch: nanoGPT's own random numbers for --seed (its init and batches, "
        "from torch's CPU generator reproduced in numpy); jax: jax.random",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=0,
        help="split each batch over this many devices (data parallel, the same updates); "
        "0: one when a dispatch runs several steps, else as many as divide the batch",
    )
    p.add_argument("--data", default=None, help="tinyshakespeare input.txt")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="the matrix products' dtype (train.py's --dtype; float32 master weights); "
        "default: bfloat16 on a GPU that supports it, else float16; float32 on CPU",
    )
    p.add_argument(
        "--steps-per-dispatch",
        type=int,
        default=50,
        help="at most this many updates per dispatch (see steps_per_dispatch)",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=312.0,
        help="the peak of the mfu figure, in TFLOPS (nanoGPT's: an A100's bfloat16 312)",
    )
    return p


def device_platform():
    """``(platform, capability)`` of the first device: ``"cuda"`` and its compute capability
    (a float, e.g. 8.0) for an NVIDIA GPU, which reports one; else jax's backend name
    (``"cpu"``, ``"tpu"``, ``"gpu"`` for another GPU) and None."""
    backend = jax.default_backend()
    try:
        capability = float(getattr(jax.devices()[0], "compute_capability", None))
    except (TypeError, ValueError):
        capability = None
    if backend == "gpu" and capability is not None:
        return "cuda", capability
    return backend, None


def default_dtype(platform, capability=None):
    """train.py's default ``dtype``: ``'bfloat16' if torch.cuda.is_available() and
    torch.cuda.is_bf16_supported() else 'float16'``, which is float32 on CPU (its
    ``nullcontext()`` there: no autocast). bfloat16 needs compute capability 8.0
    (Ampere); a GPU that reports none (ROCm, where torch supports bfloat16) and a TPU get
    bfloat16."""
    if platform == "cuda":
        return "bfloat16" if capability is not None and capability >= 8.0 else "float16"
    return "bfloat16" if platform in ("gpu", "tpu") else "float32"


def mixed_precision(dtype):
    """``(policy, loss_scale)`` for ``--dtype``: float32 is neither (the program is the one
    without them); bfloat16 and float16 run the matrix products in that dtype on float32
    master weights (``GPT(policy=...)``: what torch.autocast does), and float16 scales the
    loss dynamically as train.py's ``GradScaler`` (its defaults: 2**16 to start, halved on
    a step with inf/NaN gradients, which is skipped, doubled after 2000 finite ones)."""
    if dtype == "float32":
        return None, None
    policy = precision.Policy.make("float32", dtype, dtype)
    scale = precision.dynamic_loss_scale(2.0**16, period=2000) if dtype == "float16" else None
    return policy, scale


def attention_path(platform, dtype, head_dim, dropout):
    """``(implementation, what)``: ``"cudnn"`` (jax.nn.dot_product_attention's cuDNN fused
    kernel, flash attention) where it applies -- an NVIDIA GPU, bfloat16 or float16, a head
    dim that is a multiple of 8 and at most 128 (cuDNN's limit before Hopper), and no
    dropout, since jax's fused attention has no dropout on the attention weights -- else
    None (funcnet's default), and a line saying which path that is."""
    if platform == "cuda" and dtype != "float32" and head_dim % 8 == 0 and head_dim <= 128 and dropout == 0:
        return "cudnn", "cuDNN's fused kernel (jax.nn.dot_product_attention, 'cudnn')"
    if platform == "cpu":
        return None, "funcnet's written-out attention (the faster one on CPU)"
    why = (
        "dropout on the attention weights"
        if dropout
        else "float32"
        if dtype == "float32"
        else f"head dim {head_dim}"
        if platform == "cuda"
        else f"no cuDNN on {platform}"
    )
    if dropout:
        return None, (
            f"funcnet's written-out attention to train ({why}: jax's fused attention "
            "has none), jax.nn.dot_product_attention (XLA) to evaluate"
        )
    return None, f"jax.nn.dot_product_attention, XLA's ({why}: not cuDNN's)"


def load_text(path=None):
    for candidate in [path] if path else DATA_CANDIDATES:
        if candidate and os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as f:
                return f.read()
    sys.exit(
        "tinyshakespeare's input.txt was not found (looked in "
        f"{', '.join(DATA_CANDIDATES) if not path else path}); see "
        "data/shakespeare_char/README.md, or pass --data PATH."
    )


def encode_splits(text):
    """nanoGPT's prepare.py: the sorted characters as the vocabulary, first 90 % for training."""
    chars = sorted(set(text))
    lookup = np.zeros(max(map(ord, chars)) + 1, np.int32)
    lookup[[ord(c) for c in chars]] = np.arange(len(chars))
    ids = lookup[np.frombuffer(text.encode("utf-32-le"), np.uint32)]
    n = int(len(ids) * 0.9)
    return chars, jnp.asarray(ids[:n]), jnp.asarray(ids[n:])


def get_batch(data, starts, block_size):
    """The windows at ``starts``: x = data[i:i+block], y = data[i+1:i+1+block] (train.py's
    get_batch, whose starts are uniform in [0, len(data) - block))."""
    window = jax.vmap(lambda i: jax.lax.dynamic_slice_in_dim(data, i, block_size + 1))(starts)
    return window[:, :-1], window[:, 1:]


class Draws(NamedTuple):
    """Every window start of a run: ``train[it]`` for update ``it``; ``evals[e]`` for the
    e-th evaluation, ``(2, eval_iters, batch)`` (train split, then val)."""

    train: np.ndarray
    evals: np.ndarray


def nanogpt_draws(gen, args, n_train, n_val):
    """The window starts nanoGPT's train.py draws, in its order, from ``gen``
    (:class:`TorchCPUGenerator`, after the model's init): the first batch before the loop;
    then each iteration evaluates (eval_iters batches of train, then of val) when due and
    fetches the next training batch while the current one trains."""
    batch = lambda n: gen.randint(n - args.block_size, args.batch_size)
    train, evals = [batch(n_train)], []
    for it in range(args.max_iters + 1):
        if it % args.eval_interval == 0:
            evals.append([[batch(n) for _ in range(args.eval_iters)] for n in (n_train, n_val)])
        train.append(batch(n_train))
    evals = np.asarray(evals, np.int32).reshape(len(evals), 2, args.eval_iters, args.batch_size)
    return Draws(np.asarray(train[: args.max_iters], np.int32), evals)


def jax_draws(data_key, eval_key, args, n_train, n_val):
    """The same plan from ``jax.random`` (``--rng=jax``): update ``it`` draws from
    ``fold_in(data_key, it)``; the evaluation at ``it`` from ``fold_in(eval_key, it)``, split
    in two (train, val) and each half into eval_iters keys."""

    def starts(key, n):
        return jax.random.randint(key, (args.batch_size,), 0, n - args.block_size)

    def evaluation(it):
        k_tr, k_va = jax.random.split(jax.random.fold_in(eval_key, it))
        return jnp.stack(
            [
                jax.vmap(starts, (0, None))(jax.random.split(k, args.eval_iters), n)
                for k, n in ((k_tr, n_train), (k_va, n_val))
            ]
        )

    train = jax.vmap(lambda it: starts(jax.random.fold_in(data_key, it), n_train))(jnp.arange(args.max_iters))
    evals = jax.vmap(evaluation)(jnp.arange(0, args.max_iters + 1, args.eval_interval))
    return Draws(np.asarray(train, np.int32), np.asarray(evals, np.int32))


def nanogpt_params(gen, args, vocab_size):
    """The GPT params nanoGPT's ``GPT(config)`` holds after ``torch.manual_seed`` (``gen``):
    its modules draw in construction order (nn.Embedding's own N(0, 1), nn.Linear's own
    kaiming-uniform weight and bias), then ``apply(_init_weights)`` redraws every weight
    N(0, 0.02) children first (the tied table last, as lm_head), then the two ``c_proj``
    weights of each block N(0, 0.02 / sqrt(2 n_layer)). funcnet's Dense holds torch's
    weight transposed; c_attn's rows are query, key, value."""
    V, T, E, L = vocab_size, args.block_size, args.n_embd, args.n_layer
    linears = ((3 * E, E), (E, E), (4 * E, E), (E, 4 * E))  # c_attn, attn c_proj, c_fc, c_proj
    gen.normal((V, E), 1.0), gen.normal((T, E), 1.0)
    for _ in range(L):
        for out, inp in linears:
            gen.skip_uniform(out * inp + (out if args.bias else 0))
    gen.skip_uniform(V * E)  # lm_head's own init
    gen.normal((V, E), 0.02)  # wte's, overwritten: the table is lm_head's, drawn last
    wpe = gen.normal((T, E), 0.02)
    weights = [[gen.normal(shape, 0.02) for shape in linears] for _ in range(L)]
    wte = gen.normal((V, E), 0.02)
    for w in weights:
        w[1], w[3] = (gen.normal(linears[1], 0.02 / math.sqrt(2 * L)), gen.normal(linears[3], 0.02 / math.sqrt(2 * L)))
    dense = lambda w: {"W": jnp.asarray(w.T), **({"b": jnp.zeros(w.shape[0])} if args.bias else {})}
    norm = lambda: {"scale": jnp.ones(E), **({"bias": jnp.zeros(E)} if args.bias else {})}
    blocks = tuple(
        {
            "attn": {
                "norm": norm(),
                "drop": (),
                "attn": {
                    **{name: dense(c_attn[i * E : (i + 1) * E]) for i, name in enumerate(("query", "key", "value"))},
                    "out": dense(attn_proj),
                },
            },
            "mlp": {"norm": norm(), "fc": dense(c_fc), "act": (), "proj": dense(mlp_proj), "drop": ()},
        }
        for c_attn, attn_proj, c_fc, mlp_proj in weights
    )
    return {
        "E": jnp.asarray(wte),
        "body": {"pos": {"E": jnp.asarray(wpe)}, "drop": (), "blocks": blocks, "ln_f": norm()},
    }


def lr_schedule(args):
    """train.py's get_lr, as an optax schedule of the update count (0 for the first update)."""

    def schedule(it):
        it = jnp.asarray(it, jnp.float32)
        warm = args.learning_rate * (it + 1) / (args.warmup_iters + 1)
        ratio = (it - args.warmup_iters) / max(args.lr_decay_iters - args.warmup_iters, 1)
        coeff = 0.5 * (1.0 + jnp.cos(math.pi * jnp.clip(ratio, 0.0, 1.0)))
        cosine = args.min_lr + coeff * (args.learning_rate - args.min_lr)
        return jnp.where(it < args.warmup_iters, warm, jnp.where(it > args.lr_decay_iters, args.min_lr, cosine))

    return schedule


def build(args, vocab_size):
    """The GPT and the optimizer. ``--dtype`` (None: :func:`default_dtype` of this device)
    gives the GPT's precision policy (:func:`mixed_precision`), and the attention takes the
    implementation :func:`attention_path` picks."""
    platform, capability = device_platform()
    dtype = args.dtype or default_dtype(platform, capability)
    implementation, _ = attention_path(platform, dtype, args.n_embd // args.n_head, args.dropout)
    net = GPT(
        vocab_size,
        args.block_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        dropout=args.dropout,
        bias=args.bias,
        implementation=implementation,
        policy=mixed_precision(dtype)[0],
    )
    adamw = optim.adamw(
        lr_schedule(args),
        b1=args.beta1,
        b2=args.beta2,
        weight_decay=args.weight_decay,
        mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
    )
    optimizer = optax.chain(optax.clip_by_global_norm(args.grad_clip), adamw) if args.grad_clip else adamw
    return net, optimizer


def steps_per_dispatch(args, most=None):
    """How many updates one dispatch runs: the largest k <= ``most`` (default
    ``--steps-per-dispatch``, 50) that divides the eval and log intervals and max_iters, so
    that every evaluation and log line falls between dispatches (k = 50 for nanoGPT's CPU
    run, 10 with the defaults, 1 when the three share no larger divisor). One step per
    dispatch left the CPU cores idle between steps. On a GPU the best bound is not measured
    yet: the flag is there to tune it."""
    most = args.steps_per_dispatch if most is None else most
    if most < 1:
        raise SystemExit(f"--steps-per-dispatch must be at least 1, got {most}")
    g = math.gcd(args.eval_interval, args.log_interval, args.max_iters)
    return max(d for d in range(1, most + 1) if g % d == 0)


def make_mesh(args):
    """A data mesh over ``--devices`` devices (at most as many as divide the batch), or
    None for one. ``--devices=0`` (the default): one device when a dispatch runs several
    steps, every device when it runs one. Several steps per dispatch train as fast on one
    CPU device as split over two (2000 steps of nanoGPT's CPU run, 2026-11-28: 134.0 and
    155.5 s against 138.8 and 149.4 s, back to back), and compile in 4.5-5.7 s against
    7.2-8.4 s; one step per dispatch leaves the second core idle between steps."""
    n = args.devices or (jax.device_count() if steps_per_dispatch(args) == 1 else 1)
    n = max(d for d in range(1, min(n, jax.device_count()) + 1) if args.batch_size % d == 0)
    return distributed.data_mesh(n) if n > 1 else None


def start(args, net, optimizer, vocab_size, n_train, n_val):
    """The initial TrainState, every window start of the run, and the sampling key, from
    ``--seed`` and ``--rng``."""
    init_key, data_key, eval_key, sample_key = jax.random.split(jax.random.key(args.seed), 4)
    _, loss_scale = mixed_precision(args.dtype or default_dtype(*device_platform()))

    def create(params=None):
        return TrainState.create(net, optimizer, init_key, (-1, args.block_size), loss_scale=loss_scale, params=params)

    if args.rng == "jax":
        return create(), jax_draws(data_key, eval_key, args, n_train, n_val), sample_key
    gen = TorchCPUGenerator(args.seed)  # nanoGPT's init, then its batches, in its order
    # nanoGPT's init in place of funcnet's, which is then only traced (checked against
    # these params, and ~3 s of eager random draws on a CPU saved)
    ts = create(nanogpt_params(gen, args, vocab_size))
    return ts, nanogpt_draws(gen, args, n_train, n_val), sample_key


def estimate_mfu(args, n_params, dt):
    """nanoGPT's ``GPT.estimate_mfu`` (model.py, after the PaLM paper's appendix B): the
    model flops utilization of one update of ``dt`` seconds, against ``--peak-tflops``
    (nanoGPT's 312: an A100's bfloat16 peak). ``n_params`` is its ``get_num_params()``:
    every parameter but the position embeddings, the tied table once. Per token
    ``6 N + 12 L H Q T`` flops (Q the head dim, T the block size), ``T * batch_size``
    tokens per update (train.py's ``gradient_accumulation_steps`` is 1 here)."""
    L, H, Q, T = args.n_layer, args.n_head, args.n_embd // args.n_head, args.block_size
    flops_per_token = 6 * n_params + 12 * L * H * Q * T
    flops_per_iter = flops_per_token * T * args.batch_size
    return flops_per_iter / dt / (args.peak_tflops * 1e12)


def print_setup(args, ts, platform) -> int:
    """train.py's first lines (the parameter count without the position table, as nanoGPT
    counts them), the dtype and the attention path; the parameter count, for the MFU."""
    n_params = sum(x.size for x in jax.tree.leaves(ts.params)) - ts.params["body"]["pos"]["E"].size
    print(f"number of parameters: {n_params / 1e6:.2f}M")
    print(
        f"dtype: {args.dtype}"
        if args.dtype == "float32"
        else f"dtype: {args.dtype} matrix products, float32 weights, LayerNorms, softmax, loss "
        "and residual stream" + (", dynamic loss scaling" if args.dtype == "float16" else "")
    )
    print("attention: " + attention_path(platform, args.dtype, args.n_embd // args.n_head, args.dropout)[1])
    return n_params


def compile_train_steps(args, net, optimizer, ts, train_ids, draws, split):
    """``(train_steps, k)``: ``train_steps(ts, it)`` makes updates it .. it + k - 1 in one
    dispatch (a lax.scan) and gives their losses."""

    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, state = net.apply(params, state, x, rng=rng, train=True)
        return losses.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), Aux(state=state)

    step = make_train_step(loss_fn, optimizer)
    k = steps_per_dispatch(args)

    def train_steps(ts, it):
        def body(ts, i):
            batch = split(get_batch(train_ids, draws.train[it + i], args.block_size))
            ts, metrics = step(ts, batch)
            return ts, metrics["loss"]

        return jax.lax.scan(body, ts, jnp.arange(k))

    # compiled ahead of time, so the first iter line's time is a step's; the TrainState
    # donated, so that XLA can write the new one over it (a GPU's memory)
    t_compile = time.perf_counter()
    train_steps = jax.jit(train_steps, donate_argnums=0).lower(ts, 0).compile()
    print(f"compile: {time.perf_counter() - t_compile:.1f} s")
    return train_steps, k


def compile_estimate_loss(args, net, params, train_ids, val_ids, draws, split):
    """``estimate_loss(params, e)``: the mean loss over eval_iters batches of each split (the
    e-th evaluation's draws), without dropout; compiled ahead of time for ``params``'
    shapes."""

    def estimate_loss(params, e):
        def split_loss(data, starts):
            def one(starts):
                x, y = split(get_batch(data, starts, args.block_size))
                logits, _ = net.apply(params, (), x)
                return losses.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

            return jnp.mean(jax.lax.map(one, starts))

        return split_loss(train_ids, draws.evals[e, 0]), split_loss(val_ids, draws.evals[e, 1])

    return jax.jit(estimate_loss).lower(params, 0).compile()


def compile_programs(args, net, optimizer, ts, train_ids, val_ids, draws, split, sample_key):
    """``(train_steps, k, estimate_loss, sample)``, compiled ahead of time: the evaluation
    and the sampler on a second thread while this one compiles the train dispatch (XLA
    releases the GIL while it compiles; on nanoGPT's CPU run the train dispatch takes ~4 s,
    the other two ~4 s more, which would otherwise run one after the other)."""
    with ThreadPoolExecutor(1) as pool:
        side = pool.submit(
            lambda: (
                compile_estimate_loss(args, net, ts.params, train_ids, val_ids, draws, split),
                compile_sampler(args, net, ts.params, sample_key),
            )
        )
        train_steps, k = compile_train_steps(args, net, optimizer, ts, train_ids, draws, split)
        estimate_loss, sample = side.result()
    return train_steps, k, estimate_loss, sample


def train_loop(args, ts, train_steps, k, estimate_loss, n_params):
    """train.py's loop: an evaluation every eval_interval iterations, an iter line (loss,
    time per update, MFU) every log_interval; ``(ts, history)``, history's rows
    ``(iter, train loss, val loss)``."""
    history, in_flight, running_mfu = [], distributed.InFlight(), -1.0
    t_start = t0 = time.perf_counter()
    # train.py also evaluates at max_iters (then makes one more update, which changes nothing
    # it prints but its last iter line)
    for it in range(0, args.max_iters + 1, k):
        if it % args.eval_interval == 0:
            tr, va = estimate_loss(ts.params, it // args.eval_interval)
            history.append((it, float(tr), float(va)))
            print(f"step {it}: train loss {tr:.4f}, val loss {va:.4f}", flush=True)
        if it == args.max_iters:
            break
        ts, step_losses = train_steps(ts, it)
        in_flight.add(step_losses)  # not ts: the next dispatch takes it over (donated)
        if it % args.log_interval == 0:
            loss = float(step_losses[0])  # waits for the steps: the time below is honest
            now = time.perf_counter()
            done = min(args.log_interval, it + k)  # the first line comes after k updates
            dt = (now - t0) / done
            if it >= 5:  # train.py: from 5 iterations on, let the loop settle
                mfu = estimate_mfu(args, n_params, dt)
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            print(f"iter {it}: loss {loss:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%", flush=True)
            t0 = now
    in_flight.wait()
    print(f"training took {time.perf_counter() - t_start:.1f} s")
    return ts, history


def compile_sampler(args, net, params, key):
    """sample.py's sampling, compiled ahead of time for ``params``' shapes on one device:
    ``sample(params, key)`` gives ``args.sample_tokens`` ids after "\\n" (id 0), temperature
    0.8, top-k 200, each from the last ``block_size`` tokens (None for no sample)."""
    if not args.sample_tokens:
        return None

    def sample(params, key):
        prompt = jnp.zeros((1, 1), jnp.int32)  # sample.py starts from "\n", id 0
        return generate(
            net,
            params,
            (),
            prompt,
            args.sample_tokens,
            rng=key,
            temperature=0.8,
            top_k=200,
            window=args.block_size,
        )[0]

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    return jax.jit(sample).lower(shapes, key).compile()


def sample_text(sample, params, key, chars) -> str:
    """The sample (:func:`compile_sampler`) from ``params``, printed and returned ("" for
    none)."""
    if sample is None:
        return ""
    text = "".join(chars[i] for i in np.asarray(sample(jax.device_get(params), key)))
    print(text)
    return text


def main(argv=None):
    args = refuse_bad_args(parse_args(argv))
    platform, capability = device_platform()
    args.dtype = args.dtype or default_dtype(platform, capability)
    chars, train_ids, val_ids = check_block_size(args, encode_splits(load_text(args.data)))
    net, optimizer = build(args, len(chars))
    ts, draws, sample_key = start(args, net, optimizer, len(chars), len(train_ids), len(val_ids))
    if args.rng == "torch" and args.dropout > 0:
        print(
            f"note: --rng=torch with --dropout={args.dropout}: nanoGPT's init and first "
            "batches; its dropout draws from the torch generator between batches and that "
            "is not reproduced, so the later batches are not nanoGPT's",
            file=sys.stderr,
        )
    mesh = make_mesh(args)
    draws = Draws(*map(jnp.asarray, draws))
    if mesh is not None:  # the state and the text on every device, each batch split
        ts, train_ids, val_ids, draws = distributed.replicate_on(mesh, (ts, train_ids, val_ids, draws))
    split = (
        (lambda b: b)
        if mesh is None
        else (lambda b: jax.sharding.reshard(b, NamedSharding(mesh, PartitionSpec("data"))))
    )
    n_params = print_setup(args, ts, platform)
    programs = compile_programs(args, net, optimizer, ts, train_ids, val_ids, draws, split, sample_key)
    train_steps, k, estimate_loss, sample = programs
    ts, history = train_loop(args, ts, train_steps, k, estimate_loss, n_params)
    return history, sample_text(sample, ts.params, sample_key, chars), ts


if __name__ == "__main__":
    main()
