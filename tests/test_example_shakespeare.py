"""examples/shakespeare_char.py (nanoGPT's character-level recipe), run briefly in-process on a
small text the test writes, split over the suite's four CPU devices."""
import importlib
import math
import os

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


def test_trains_evaluates_and_samples(shakespeare, tmp_path, capsys):
    path = tmp_path / "input.txt"
    text = _text()
    path.write_text(text)
    history, sample, ts = shakespeare.main([
        f"--data={path}", "--block-size=16", "--batch-size=8", "--n-layer=1", "--n-head=2",
        "--n-embd=16", "--max-iters=80", "--lr-decay-iters=80", "--warmup-iters=10",
        "--eval-interval=40", "--eval-iters=2", "--log-interval=40", "--dropout=0.1",
        "--learning-rate=1e-2", "--sample-tokens=40"])
    out = capsys.readouterr().out
    vocab = len(set(text))
    assert [h[0] for h in history] == [0, 40, 80]
    assert history[0][2] == pytest.approx(math.log(vocab), abs=0.3)  # chance at init
    assert history[-1][2] < 0.7 * history[0][2]                     # it learned
    assert "step 80: train loss" in out and "val loss" in out
    assert len(sample) == 41 and set(sample) <= set(text)
    # the batch was split over the suite's CPU devices; the state stayed replicated
    assert ts.params["E"].sharding.is_fully_replicated and len(ts.params["E"].devices()) > 1


def test_data_split_and_lr_schedule_follow_nanogpt(shakespeare):
    chars, train, val = shakespeare.encode_splits("abcabcabcd")
    assert chars == ["a", "b", "c", "d"] and len(train) == 9 and len(val) == 1
    args = shakespeare.parse_args(["--learning-rate=1e-3", "--min-lr=1e-4", "--warmup-iters=100",
                                   "--lr-decay-iters=2000"])
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
    assert (a.batch_size, a.block_size, a.n_layer, a.n_head, a.n_embd, a.dropout) == (
        64, 256, 6, 6, 384, 0.2)
    assert (a.learning_rate, a.max_iters, a.lr_decay_iters, a.min_lr, a.beta2,
            a.warmup_iters, a.eval_interval, a.eval_iters, a.log_interval) == (
        1e-3, 5000, 5000, 1e-4, 0.99, 100, 250, 200, 10)
    assert shakespeare.parse_args(["--n-layer=4", "--block-size", "64"]).n_layer == 4


def test_the_recipe_follows_nanogpt_step_for_step(shakespeare):
    """The example's optimizer (AdamW with nanoGPT's decay groups, warmup + cosine schedule,
    clipping at 1.0) and funcnet's GPT, started from the weights of a PyTorch GPT built like
    nanoGPT's and fed the same batches, give torch's losses step for step (torch: AdamW with
    two param groups, clip_grad_norm_, nanoGPT's get_lr)."""
    import jax
    import jax.numpy as jnp
    import torch

    from benchmarks import gpt
    from funcnet import losses
    from funcnet.train import Aux, TrainState, make_train_step

    case = dict(n_layer=2, n_head=2, n_embd=16, block=16, batch=4)
    args = shakespeare.parse_args(["--block-size=16", "--batch-size=4", "--n-layer=2",
                                   "--n-head=2", "--n-embd=16", "--dropout=0.0",
                                   "--learning-rate=1e-2", "--min-lr=1e-3", "--warmup-iters=5",
                                   "--lr-decay-iters=25"])
    tm = gpt._torch_model(case)
    decay = [p for p in tm.parameters() if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": [p for p in tm.parameters() if p.dim() < 2],
                              "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.99))
    net, tx = shakespeare.build(args, gpt.VOCAB)
    params = gpt._funcnet_params(gpt._weights(case), case, scan=False)
    ts = TrainState.create(net, tx, jax.random.key(0), (-1, 16))
    ts = ts._replace(params=params, opt_state=tx.init(params))

    def loss_fn(p, s, batch, rng):
        logits, s = net.apply(p, s, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits.reshape(-1, gpt.VOCAB), batch[1].reshape(-1)), \
            Aux(state=s)

    step = jax.jit(make_train_step(loss_fn, tx))
    lr = shakespeare.lr_schedule(args)
    data = np.random.default_rng(3).integers(0, gpt.VOCAB, 5000)
    rng = np.random.default_rng(4)
    for it in range(30):  # warmup, cosine decay, then min_lr
        starts = rng.integers(0, len(data) - 17, 4)
        x = np.stack([data[i:i + 16] for i in starts])
        y = np.stack([data[i + 1:i + 17] for i in starts])
        for group in opt.param_groups:
            group["lr"] = float(lr(it))
        loss = tm(torch.tensor(x), torch.tensor(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ts, metrics = step(ts, (jnp.asarray(x, jnp.int32), jnp.asarray(y, jnp.int32)))
        np.testing.assert_allclose(float(metrics["loss"]), loss.item(), rtol=2e-5,
                                   err_msg=f"step {it}")
    np.testing.assert_allclose(ts.params["E"], tm.wte.weight.detach().numpy(), atol=2e-5)
