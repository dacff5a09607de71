"""examples/shakespeare_char.py (nanoGPT's character-level recipe), run briefly in-process on a
small text the test writes, split over the suite's four CPU devices; its nanoGPT random
numbers (examples/_torch_rng.py: torch's generator, nanoGPT's init and draw order) against
torch itself, and a whole run against nanoGPT's loop restated in torch."""

import importlib
import math
import os

import jax
import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.fixture
def shakespeare(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    return importlib.import_module("shakespeare_char")


def _text(n=6000, seed=0):
    """A learnable text: words from a small vocabulary, capitalised lines."""
    rng = np.random.default_rng(seed)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis"]
    lines = []
    while sum(map(len, lines)) < n:
        line = " ".join(rng.choice(words, 6))
        lines.append(line[0].upper() + line[1:] + ",")
    return "\n".join(lines)


@pytest.mark.devices(2)
def test_trains_evaluates_and_samples(shakespeare, tmp_path, capsys):
    path = tmp_path / "input.txt"
    text = _text()
    path.write_text(text)
    flags = [
        f"--data={path}",
        "--block-size=16",
        "--batch-size=8",
        "--n-layer=1",
        "--n-head=2",
        "--n-embd=16",
        "--max-iters=80",
        "--lr-decay-iters=80",
        "--warmup-iters=10",
        "--eval-interval=40",
        "--eval-iters=2",
        "--log-interval=40",
        "--dropout=0.1",
        "--learning-rate=1e-2",
        "--rng=jax",
    ]
    history, sample, ts = shakespeare.main(flags + ["--sample-tokens=40", "--devices=2"])
    out = capsys.readouterr().out
    vocab = len(set(text))
    assert [h[0] for h in history] == [0, 40, 80]
    assert history[0][2] == pytest.approx(math.log(vocab), abs=0.3)  # chance at init
    assert history[-1][2] < 0.7 * history[0][2]  # it learned
    assert "step 80: train loss" in out and "val loss" in out
    assert len(sample) == 41 and set(sample) <= set(text)
    # the batch was split over two CPU devices; the state stayed replicated
    assert ts.params["E"].sharding.is_fully_replicated and len(ts.params["E"].devices()) > 1
    # the same updates on one device, dropout included (its masks are drawn for the batch)
    one, _, _ = shakespeare.main(flags + ["--devices=1", "--sample-tokens=0"])
    np.testing.assert_allclose(np.asarray(one), np.asarray(history), rtol=1e-5)


def test_data_split_and_lr_schedule_follow_nanogpt(shakespeare):
    chars, train, val = shakespeare.encode_splits("abcabcabcd")
    assert chars == ["a", "b", "c", "d"] and len(train) == 9 and len(val) == 1
    args = shakespeare.parse_args(
        ["--learning-rate=1e-3", "--min-lr=1e-4", "--warmup-iters=100", "--lr-decay-iters=2000"]
    )
    lr = shakespeare.lr_schedule(args)

    def get_lr(it):  # nanoGPT train.py's get_lr, restated
        if it < 100:
            return 1e-3 * (it + 1) / 101
        if it > 2000:
            return 1e-4
        coeff = 0.5 * (1.0 + math.cos(math.pi * (it - 100) / 1900))
        return 1e-4 + coeff * (1e-3 - 1e-4)

    for it in (0, 50, 99, 100, 101, 1000, 1999, 2000, 2001, 2500):
        assert float(lr(it)) == pytest.approx(get_lr(it), rel=1e-5), it


def test_defaults_are_nanogpts_config(shakespeare):
    a = shakespeare.parse_args([])
    assert (a.batch_size, a.block_size, a.n_layer, a.n_head, a.n_embd, a.dropout) == (64, 256, 6, 6, 384, 0.2)
    assert (
        a.learning_rate,
        a.max_iters,
        a.lr_decay_iters,
        a.min_lr,
        a.beta2,
        a.warmup_iters,
        a.eval_interval,
        a.eval_iters,
        a.log_interval,
    ) == (1e-3, 5000, 5000, 1e-4, 0.99, 100, 250, 200, 10)
    assert shakespeare.parse_args(["--n-layer=4", "--block-size", "64"]).n_layer == 4


def test_the_recipe_follows_nanogpt_step_for_step(shakespeare):
    """The example's optimizer (AdamW with nanoGPT's decay groups, warmup + cosine schedule,
    clipping at 1.0) and funcnet's GPT, started from the weights of a PyTorch GPT built like
    nanoGPT's and fed the same batches, give torch's losses step for step (torch: AdamW with
    two param groups, clip_grad_norm_, nanoGPT's get_lr)."""
    import jax
    import jax.numpy as jnp
    from helpers.torch_ref import require_torch

    from benchmarks import gpt

    torch = require_torch()  # benchmarks.gpt builds the torch model
    from funcnet import losses
    from funcnet.train import Aux, TrainState, make_train_step

    case = dict(n_layer=2, n_head=2, n_embd=16, block=16, batch=4)
    # float32 as torch's side (on a GPU the example's default would be bfloat16)
    args = shakespeare.parse_args(
        [
            "--block-size=16",
            "--batch-size=4",
            "--n-layer=2",
            "--n-head=2",
            "--n-embd=16",
            "--dropout=0.0",
            "--dtype=float32",
            "--learning-rate=1e-2",
            "--min-lr=1e-3",
            "--warmup-iters=5",
            "--lr-decay-iters=25",
        ]
    )
    tm = gpt._torch_model(case)
    decay = [p for p in tm.parameters() if p.dim() >= 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1},
            {"params": [p for p in tm.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.99),
    )
    net, tx = shakespeare.build(args, gpt.VOCAB)
    params = gpt._funcnet_params(gpt._weights(case), case, scan=False)
    ts = TrainState.create(net, tx, jax.random.key(0), (-1, 16))
    ts = ts._replace(params=params, opt_state=tx.init(params))

    def loss_fn(p, s, batch, rng):
        logits, s = net.apply(p, s, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits.reshape(-1, gpt.VOCAB), batch[1].reshape(-1)), Aux(state=s)

    step = jax.jit(make_train_step(loss_fn, tx))
    lr = shakespeare.lr_schedule(args)
    data = np.random.default_rng(3).integers(0, gpt.VOCAB, 5000)
    rng = np.random.default_rng(4)
    for it in range(30):  # warmup, cosine decay, then min_lr
        starts = rng.integers(0, len(data) - 17, 4)
        x = np.stack([data[i : i + 16] for i in starts])
        y = np.stack([data[i + 1 : i + 17] for i in starts])
        for group in opt.param_groups:
            group["lr"] = float(lr(it))
        loss = tm(torch.tensor(x), torch.tensor(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ts, metrics = step(ts, (jnp.asarray(x, jnp.int32), jnp.asarray(y, jnp.int32)))
        np.testing.assert_allclose(float(metrics["loss"]), loss.item(), rtol=2e-5, err_msg=f"step {it}")
    np.testing.assert_allclose(ts.params["E"], tm.wte.weight.detach().numpy(), atol=2e-5)


def _nanogpt_torch(V, T, E, L, bias):
    """A torch module tree registered in the order nanoGPT's model.py registers its GPT
    (transformer: wte, wpe, drop, h[blocks: ln_1, attn(c_attn, c_proj), ln_2, mlp(c_fc,
    c_proj)], ln_f; then lm_head, tied to wte), initialised as its GPT.__init__ does."""
    from helpers.torch_ref import torch

    lin = lambda i, o: torch.nn.Linear(i, o, bias=bias)

    def block():
        b = torch.nn.Module()
        b.ln_1 = torch.nn.LayerNorm(E, bias=bias)
        b.attn = torch.nn.Module()
        b.attn.c_attn, b.attn.c_proj = lin(E, 3 * E), lin(E, E)
        b.ln_2 = torch.nn.LayerNorm(E, bias=bias)
        b.mlp = torch.nn.Module()
        b.mlp.c_fc, b.mlp.c_proj = lin(E, 4 * E), lin(4 * E, E)
        return b

    gpt = torch.nn.Module()
    gpt.transformer = torch.nn.ModuleDict(
        dict(
            wte=torch.nn.Embedding(V, E),
            wpe=torch.nn.Embedding(T, E),
            drop=torch.nn.Dropout(0.0),
            h=torch.nn.ModuleList([block() for _ in range(L)]),
            ln_f=torch.nn.LayerNorm(E, bias=bias),
        )
    )
    gpt.lm_head = torch.nn.Linear(E, V, bias=False)
    gpt.transformer.wte.weight = gpt.lm_head.weight

    def init(m):
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            torch.nn.init.zeros_(m.bias)

    gpt.apply(init)
    for name, p in gpt.named_parameters():
        if name.endswith("c_proj.weight"):
            torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))
    return gpt


def test_torch_cpu_generator_gives_torchs_numbers(shakespeare):
    """examples/_torch_rng.py against torch itself: randint exactly; normal_ to float32
    rounding, sizes with and without a tail of fewer than 16; uniform_'s word count."""
    from helpers.torch_ref import torch

    from _torch_rng import TorchCPUGenerator

    torch.manual_seed(1234)
    t_int = torch.randint(1_003_790, (37,)).numpy()
    t_normals = [torch.empty(n).normal_(0.5, 0.02).numpy() for n in (16, 160, 37, 1001)]
    torch.empty(3, 100).uniform_(-1, 1)
    t_after = torch.randint(7, (5,)).numpy()

    gen = TorchCPUGenerator(1234)
    np.testing.assert_array_equal(gen.randint(1_003_790, 37), t_int)
    for t in t_normals:
        np.testing.assert_allclose(gen.normal(t.shape, 0.02, mean=0.5), t, rtol=0, atol=1e-7)
    gen.skip_uniform(300)
    np.testing.assert_array_equal(gen.randint(7, 5), t_after)
    with pytest.raises(ValueError, match="fewer than 16"):
        gen.normal((3, 5), 1.0)
    with pytest.raises(ValueError, match=r"outside \[0, 2\*\*32\)"):
        TorchCPUGenerator(-1)


@pytest.mark.parametrize("bias", [False, True])
def test_torch_rng_starts_from_nanogpts_init(shakespeare, bias):
    """--rng=torch: the params are those nanoGPT's GPT holds after torch.manual_seed(seed),
    and the generator is left where nanoGPT's is (its next draw, the first batch, agrees).
    V * E = 156 is not a multiple of 16: torch's redrawn tail is exercised."""
    from helpers.torch_ref import torch

    from _torch_rng import TorchCPUGenerator

    V, T, E, L = 13, 8, 12, 2
    torch.manual_seed(99)
    tm = _nanogpt_torch(V, T, E, L, bias)
    t_first_batch = torch.randint(500 - T, (4,)).numpy()
    args = shakespeare.parse_args(
        [f"--block-size={T}", f"--n-embd={E}", f"--n-layer={L}", "--n-head=2", "--batch-size=4"]
        + (["--bias"] if bias else [])
    )
    gen = TorchCPUGenerator(99)
    params = shakespeare.nanogpt_params(gen, args, V)
    net, _ = shakespeare.build(args, V)
    _, init_params, _ = net.init(jax.random.key(0), (-1, T))
    assert jax.tree.structure(params) == jax.tree.structure(init_params)
    sd = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-7)
    close(params["E"], sd["transformer.wte.weight"])
    close(params["body"]["pos"]["E"], sd["transformer.wpe.weight"])
    for i, b in enumerate(params["body"]["blocks"]):
        c_attn = sd[f"transformer.h.{i}.attn.c_attn.weight"]
        for j, name in enumerate(("query", "key", "value")):
            close(b["attn"]["attn"][name]["W"], c_attn[j * E : (j + 1) * E].T)
        close(b["attn"]["attn"]["out"]["W"], sd[f"transformer.h.{i}.attn.c_proj.weight"].T)
        close(b["mlp"]["fc"]["W"], sd[f"transformer.h.{i}.mlp.c_fc.weight"].T)
        close(b["mlp"]["proj"]["W"], sd[f"transformer.h.{i}.mlp.c_proj.weight"].T)
    np.testing.assert_array_equal(gen.randint(500 - T, 4), t_first_batch)


def test_torch_rng_draws_batches_in_train_pys_order(shakespeare):
    """nanoGPT's train.py loop, restated with torch's own generator: the first batch before
    the loop; at each iteration the evaluation when due (eval_iters train windows, then val),
    then the next training batch. The example's plan holds the same starts. (The order is
    restated from train.py here; test_torch_rng_run_prints_nanogpts_losses and the CPU run's
    log beside nanoGPT's, docs/guides/transformers.md, check it end to end.)"""
    from helpers.torch_ref import torch

    from _torch_rng import TorchCPUGenerator

    args = shakespeare.parse_args(
        ["--block-size=8", "--batch-size=3", "--max-iters=7", "--eval-interval=3", "--eval-iters=2"]
    )
    n_train, n_val = 900, 100
    torch.manual_seed(5)
    get = lambda n: torch.randint(n - 8, (3,)).numpy()
    train, evals = [get(n_train)], []
    for it in range(8):
        if it % 3 == 0:
            evals.append([[get(n_train) for _ in range(2)], [get(n_val) for _ in range(2)]])
        train.append(get(n_train))
    draws = shakespeare.nanogpt_draws(TorchCPUGenerator(5), args, n_train, n_val)
    np.testing.assert_array_equal(draws.train, np.asarray(train[:7]))
    np.testing.assert_array_equal(draws.evals, np.asarray(evals))
    assert draws.evals.shape == (3, 2, 2, 3)  # evaluations at 0, 3, 6
    none = shakespeare.parse_args(["--batch-size=3", "--max-iters=7", "--eval-interval=3", "--eval-iters=0"])
    assert shakespeare.nanogpt_draws(TorchCPUGenerator(5), none, 900, 100).evals.shape == (3, 2, 0, 3)


def test_jax_rng_plan(shakespeare):
    """--rng=jax (test_trains_evaluates_and_samples runs it): windows from jax.random, in
    range, the same plan shape as torch's."""
    args = shakespeare.parse_args(
        ["--block-size=16", "--batch-size=4", "--max-iters=10", "--eval-interval=5", "--eval-iters=2"]
    )
    draws = shakespeare.jax_draws(jax.random.key(1), jax.random.key(2), args, 2000, 300)
    assert draws.train.shape == (10, 4) and draws.evals.shape == (3, 2, 2, 4)
    assert draws.train.min() >= 0 and draws.train.max() < 2000 - 16
    assert draws.evals[:, 1].max() < 300 - 16 and len(np.unique(draws.train)) > 20


def test_steps_per_dispatch_stop_at_every_log_line_and_evaluation(shakespeare):
    k = lambda flags: shakespeare.steps_per_dispatch(shakespeare.parse_args(flags))
    assert k([]) == 10  # log every 10
    assert k(["--log-interval=100", "--max-iters=2000"]) == 50  # nanoGPT's CPU run
    assert k(["--log-interval=40", "--eval-interval=40", "--max-iters=80"]) == 40
    assert k(["--log-interval=100", "--max-iters=2001"]) == 1


@pytest.mark.devices(4)
def test_devices_default_to_one_when_a_dispatch_runs_several_steps(shakespeare):
    import jax

    mesh = lambda flags: shakespeare.make_mesh(shakespeare.parse_args(["--batch-size=12"] + flags))
    assert mesh([]) is None  # 10 steps per dispatch: one device
    assert mesh(["--log-interval=100", "--max-iters=2000"]) is None  # nanoGPT's CPU run, 50
    one_step = ["--log-interval=100", "--max-iters=2001"]  # one step per dispatch: split
    assert mesh(one_step).devices.size == max(d for d in range(1, jax.device_count() + 1) if 12 % d == 0)
    assert mesh(["--devices=2"]).devices.size == 2  # asked for: split, whatever the dispatch
    assert mesh(one_step + ["--devices=1"]) is None


def _torch_logits(gpt, idx, n_head):
    """nanoGPT's GPT.forward on the module tree of _nanogpt_torch."""
    from helpers.torch_ref import F, torch

    tr = gpt.transformer
    B, T = idx.shape
    x = tr.wte(idx) + tr.wpe(torch.arange(T))
    for b in tr.h:
        q, k, v = b.attn.c_attn(b.ln_1(x)).split(x.shape[-1], dim=2)
        heads = lambda t: t.view(B, T, n_head, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + b.attn.c_proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x))))
    return gpt.lm_head(tr.ln_f(x))


@pytest.mark.parametrize("devices", [1, pytest.param(4, marks=pytest.mark.devices(4))])
def test_torch_rng_run_prints_nanogpts_losses(shakespeare, tmp_path, devices):
    """The whole example with --rng=torch, on one device and split over four,
    against nanoGPT's train.py loop restated in torch (seeded the same: its init, get_batch's
    draws in its order, estimate_loss, AdamW with its two groups, clip_grad_norm_, the
    learning rate of the example's schedule, which test_data_split_and_lr_schedule_follow_
    nanogpt checks against get_lr): the same train and val losses at every evaluation."""
    from helpers.torch_ref import F, torch

    path = tmp_path / "input.txt"
    text = _text(4000)
    path.write_text(text)
    flags = [
        "--block-size=16",
        "--batch-size=4",
        "--n-layer=2",
        "--n-head=2",
        "--n-embd=16",
        "--max-iters=30",
        "--lr-decay-iters=30",
        "--warmup-iters=5",
        "--eval-interval=10",
        "--eval-iters=3",
        "--log-interval=10",
        "--dropout=0.0",
        "--learning-rate=1e-2",
        "--min-lr=1e-3",
        "--seed=7",
        "--dtype=float32",
    ]  # torch's side is float32
    history, _, _ = shakespeare.main([f"--data={path}", "--sample-tokens=0", f"--devices={devices}"] + flags)

    args = shakespeare.parse_args(flags)
    chars, train_ids, val_ids = shakespeare.encode_splits(text)
    splits = {
        "train": torch.tensor(np.asarray(train_ids), dtype=torch.long),
        "val": torch.tensor(np.asarray(val_ids), dtype=torch.long),
    }
    torch.manual_seed(7)
    gpt = _nanogpt_torch(len(chars), 16, 16, 2, bias=False)
    params = dict(gpt.named_parameters())
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.99),
    )
    lr = shakespeare.lr_schedule(args)

    def get_batch(split):
        data = splits[split]
        ix = torch.randint(len(data) - 16, (4,))
        return (torch.stack([data[i : i + 16] for i in ix]), torch.stack([data[i + 1 : i + 17] for i in ix]))

    def loss_of(x, y):
        return F.cross_entropy(_torch_logits(gpt, x, 2).view(-1, len(chars)), y.view(-1))

    expected, (x, y) = [], get_batch("train")
    for it in range(31):
        if it % 10 == 0:
            with torch.no_grad():
                expected.append(
                    (it, *(np.mean([loss_of(*get_batch(s)).item() for _ in range(3)]) for s in ("train", "val")))
                )
        if it == 30:
            break
        for group in opt.param_groups:
            group["lr"] = float(lr(it))
        loss = loss_of(x, y)
        x, y = get_batch("train")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    np.testing.assert_allclose(np.asarray(history), np.asarray(expected), rtol=2e-5)


def test_default_dtype_is_train_pys(shakespeare):
    """train.py: bfloat16 where the GPU supports it (compute capability >= 8.0), else
    float16; float32 on CPU (its nullcontext: no autocast)."""
    d = shakespeare.default_dtype
    assert d("cuda", 8.0) == d("cuda", 9.0) == d("cuda", 12.1) == "bfloat16"
    assert d("cuda", 7.5) == d("cuda", 6.1) == d("cuda", None) == "float16"
    assert d("cpu") == d("cpu", 9.0) == "float32"
    if jax.default_backend() == "cpu":  # the suite's default run
        assert shakespeare.device_platform() == ("cpu", None)
    assert shakespeare.parse_args([]).dtype is None  # resolved per device
    assert shakespeare.parse_args(["--dtype=float16"]).dtype == "float16"
    with pytest.raises(SystemExit):
        shakespeare.parse_args(["--dtype=float64"])
    assert shakespeare.mixed_precision("float32") == (None, None)  # the program as before
    policy, scale = shakespeare.mixed_precision("bfloat16")
    assert (policy.param_dtype, policy.compute_dtype) == (np.float32, jax.numpy.bfloat16)
    assert scale is None
    policy, scale = shakespeare.mixed_precision("float16")
    assert policy.compute_dtype == np.float16
    assert (float(scale.scale), int(scale.period), float(scale.factor)) == (2.0**16, 2000, 2.0)


def test_attention_path_is_cudnn_only_where_it_applies(shakespeare):
    """cuDNN's fused attention needs an NVIDIA GPU, bfloat16/float16, a head dim that is a
    multiple of 8 (at most 128) and no dropout on the attention weights."""
    path = lambda *a: shakespeare.attention_path(*a)[0]
    assert path("cuda", "bfloat16", 64, 0.0) == path("cuda", "float16", 128, 0.0) == "cudnn"
    assert path("cuda", "bfloat16", 64, 0.2) is None  # nanoGPT's GPU config: dropout 0.2
    assert path("cuda", "float32", 64, 0.0) is None
    assert path("cuda", "bfloat16", 12, 0.0) is None  # not a multiple of 8
    assert path("cuda", "bfloat16", 256, 0.0) is None
    assert path("cpu", "bfloat16", 64, 0.0) is None
    assert path("gpu", "bfloat16", 64, 0.0) is None and path("tpu", "bfloat16", 64, 0.0) is None
    assert "dropout" in shakespeare.attention_path("cuda", "bfloat16", 64, 0.2)[1]
    assert "written-out" in shakespeare.attention_path("cpu", "float32", 64, 0.0)[1]
    args = shakespeare.parse_args(
        ["--n-embd=16", "--n-head=2", "--n-layer=1", "--dropout=0.0", "--block-size=8", "--dtype=bfloat16"]
    )
    net, _ = shakespeare.build(args, 11)  # on CPU: funcnet's default, which runs
    _, params, _ = net.init(jax.random.key(0), (-1, 8))
    logits, _ = jax.jit(net.apply)(params, (), jax.numpy.zeros((1, 8), jax.numpy.int32))
    assert logits.shape == (1, 8, 11)


def test_mfu_is_nanogpts_estimate(shakespeare):
    """nanoGPT's GPT.estimate_mfu, by hand, for its shakespeare_char config: N =
    get_num_params() (no position embeddings; the tied table once)."""
    args = shakespeare.parse_args([])  # 6 layers, 6 heads, 384 wide, block 256, batch 64
    V, E, L, T = 65, 384, 6, 256
    N = V * E + L * (2 * E + 4 * E * E + 8 * E * E) + E  # bias=False: LayerNorm weights only
    flops_per_token = 6 * N + 12 * L * 6 * (E // 6) * T
    mfu = flops_per_token * T * 64 / 0.25 / 312e12  # an update of 250 ms
    assert shakespeare.estimate_mfu(args, N, 0.25) == pytest.approx(mfu, rel=1e-12)
    assert N == 10_646_784  # nanoGPT prints "number of parameters: 10.65M"
    net, _ = shakespeare.build(args, V)
    params = jax.eval_shape(lambda key: net.init(key, (-1, T))[1], jax.random.key(0))
    counted = sum(x.size for x in jax.tree.leaves(params)) - params["body"]["pos"]["E"].size
    assert counted == N
    half = shakespeare.parse_args(["--peak-tflops=156"])
    assert shakespeare.estimate_mfu(half, N, 0.25) == pytest.approx(2 * mfu, rel=1e-12)


def _tiny(path, *extra):
    return [
        f"--data={path}",
        "--block-size=16",
        "--batch-size=8",
        "--n-layer=2",
        "--n-head=2",
        "--n-embd=16",
        "--max-iters=20",
        "--lr-decay-iters=20",
        "--warmup-iters=5",
        "--eval-interval=10",
        "--eval-iters=2",
        "--log-interval=10",
        "--dropout=0.0",
        "--learning-rate=1e-2",
        "--sample-tokens=0",
        "--devices=1",
        *extra,
    ]


def _eqns(jaxpr):
    """Every equation of a jaxpr, those of the jaxprs inside it too."""
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def test_bfloat16_trains_with_bf16_products_on_a_float32_stream(shakespeare, tmp_path, capsys):
    """--dtype=bfloat16: the losses close to float32's; the params float32; in the forward
    every matrix product takes bfloat16 operands (projections, attention scores and sum,
    the tied head), while the LayerNorms, the softmax and the residual stream are float32
    (torch.autocast's rule, not apply_policy over the whole model)."""
    import jax.numpy as jnp

    path = tmp_path / "input.txt"
    text = _text(3000)
    path.write_text(text)
    f32, _, _ = shakespeare.main(_tiny(path, "--dtype=float32"))
    bf16, _, ts = shakespeare.main(_tiny(path, "--dtype=bfloat16"))
    out = capsys.readouterr().out
    assert "dtype: bfloat16 matrix products, float32 weights" in out
    assert np.all(np.isfinite(bf16)) and bf16[-1][2] < 0.8 * bf16[0][2]  # it learned
    np.testing.assert_allclose(np.asarray(bf16), np.asarray(f32), atol=5e-3)  # 2e-4 seen
    assert {x.dtype for x in jax.tree.leaves(ts.params)} == {np.dtype("float32")}
    assert ts.loss_scale == ()  # bfloat16 needs no scaling

    net, _ = shakespeare.build(shakespeare.parse_args(_tiny(path, "--dtype=bfloat16")), len(set(text)))
    ids = jnp.zeros((3, 16), jnp.int32)
    params = ts.params  # the trained ones
    jaxpr = jax.make_jaxpr(lambda p: net.apply(p, (), ids))(params).jaxpr
    eqns = list(_eqns(jaxpr))
    dtypes = lambda e: {str(v.aval.dtype) for v in e.invars}
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    fused = shakespeare.attention_path(shakespeare.device_platform()[0], "bfloat16", 8, 0.0)[0]
    # per block: qkv, scores and weighted sum (unless cuDNN's kernel), out, fc, proj; the head
    assert len(dots) == (4 if fused else 6) * 2 + 1
    assert all(dtypes(e) == {"bfloat16"} for e in dots)
    norms = [e for e in eqns if e.primitive.name == "rsqrt"]
    assert len(norms) == 2 * 2 + 1 and all(dtypes(e) == {"float32"} for e in norms)
    softmax = [e for e in eqns if e.primitive.name == "exp"]
    assert softmax and all(dtypes(e) == {"float32"} for e in softmax)
    stream = [e for e in eqns if e.primitive.name == "add" and e.outvars[0].aval.shape == (3, 16, 16)]
    assert len(stream) == 1 + 2 * 2  # embeddings + positions, two residual adds per block
    assert all(str(e.outvars[0].aval.dtype) == "float32" for e in stream)
    assert net.apply(params, (), ids)[0].dtype == jnp.bfloat16  # autocast's lm_head


def test_float16_scales_the_loss(shakespeare, tmp_path):
    """--dtype=float16: the TrainState holds a dynamic loss scale (train.py's GradScaler)."""
    from funcnet.precision import LossScale

    path = tmp_path / "input.txt"
    path.write_text(_text(3000))
    history, _, ts = shakespeare.main(_tiny(path, "--dtype=float16"))
    f32, _, _ = shakespeare.main(_tiny(path, "--dtype=float32"))
    np.testing.assert_allclose(np.asarray(history), np.asarray(f32), atol=5e-3)
    assert isinstance(ts.loss_scale, LossScale)
    assert float(ts.loss_scale.scale) <= 2.0**16 and int(ts.loss_scale.period) == 2000
    assert np.all(np.isfinite(history)) and history[-1][2] < 0.8 * history[0][2]
    assert {x.dtype for x in jax.tree.leaves(ts.params)} == {np.dtype("float32")}


def test_prints_compile_time_and_mfu(shakespeare, tmp_path, capsys):
    """The compile line once; every iter line keeps its loss and time and adds nanoGPT's
    running mfu: -100.00% until 5 iterations have run, then the estimate, smoothed as
    train.py does (a tiny --peak-tflops makes the CPU's figure large enough to check)."""
    import re

    path = tmp_path / "input.txt"
    text = _text(3000)
    path.write_text(text)
    flags = _tiny(path, "--steps-per-dispatch=5", "--max-iters=30", "--lr-decay-iters=30", "--peak-tflops=1e-6")
    shakespeare.main(flags)
    out = capsys.readouterr().out
    assert len(re.findall(r"^compile: \d+\.\d s$", out, re.M)) == 1
    lines = re.findall(r"^iter (\d+): loss \d+\.\d{4}, time (\d+\.\d{2})ms, mfu (-?\d+\.\d{2})%$", out, re.M)
    assert [int(it) for it, *_ in lines] == [0, 10, 20]
    args = shakespeare.parse_args(flags)
    net, _ = shakespeare.build(args, len(set(text)))
    params = jax.eval_shape(lambda key: net.init(key, (-1, 16))[1], jax.random.key(0))
    n = sum(x.size for x in jax.tree.leaves(params)) - params["body"]["pos"]["E"].size
    mfu = [100 * shakespeare.estimate_mfu(args, n, float(ms) / 1000) for _, ms, _ in lines]
    running = [-100.0, mfu[1], 0.9 * mfu[1] + 0.1 * mfu[2]]
    np.testing.assert_allclose([float(m) for *_, m in lines], running, rtol=0.03)  # ms rounded
    platform, capability = shakespeare.device_platform()
    dtype = shakespeare.default_dtype(platform, capability)
    assert "attention: " + shakespeare.attention_path(platform, dtype, 8, 0.0)[1] in out


def test_steps_per_dispatch_flag(shakespeare):
    k = lambda flags: shakespeare.steps_per_dispatch(shakespeare.parse_args(flags))
    assert shakespeare.parse_args([]).steps_per_dispatch == 50
    cpu_run = ["--log-interval=100", "--max-iters=2000"]  # eval, log, max_iters: gcd 50
    assert k(cpu_run + ["--steps-per-dispatch=20"]) == 10
    assert k(cpu_run + ["--steps-per-dispatch=30"]) == 25
    assert k(cpu_run + ["--steps-per-dispatch=100"]) == 50
    assert k(["--steps-per-dispatch=1"]) == 1
    with pytest.raises(SystemExit):
        k(["--steps-per-dispatch=0"])
