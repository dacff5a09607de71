"""Inputs users get wrong in interop, attention, recurrent layers, Scan/stack_params,
micro-batches and the Shakespeare example: each works as users expect (bfloat16 and
kdim/vdim torch weights, a list initial_state, Scan over bfloat16) or fails naming what
was wrong, instead of a raw JAX/NumPy/torch error."""

import importlib
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers.torch_ref import HAVE_TORCH, torch

import funcnet
from funcnet import layers as L
from funcnet.combinators import Scan, serial, stack_params
from funcnet.interop import StateDictMismatchError, load_torch_state_dict
from funcnet.train import Aux, TrainState, make_train_step

KEY = jax.random.key(0)
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _randn(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- #
# load_torch_state_dict
# --------------------------------------------------------------------------- #


def test_bfloat16_state_dict_loads_exactly_into_float32_and_bfloat16_params():
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Linear(3, 4)).to(torch.bfloat16)
    sd = tnet.state_dict()
    want_W = sd["0.weight"].float().numpy().T
    net = funcnet.serial(L.Dense(4))
    _, params, state = net.init(KEY, (-1, 3))
    new, _ = load_torch_state_dict(params, state, sd)
    assert new[0]["W"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(new[0]["W"]), want_W)  # bf16 -> f32 is exact
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    new16, _ = load_torch_state_dict(bf16, state, sd)
    assert new16[0]["W"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(new16[0]["W"], np.float32), want_W)
    np.testing.assert_array_equal(np.asarray(new16[0]["b"], np.float32), sd["0.bias"].float().numpy())


def test_multihead_attention_with_kdim_and_vdim_gives_torchs_outputs():
    torch.manual_seed(0)
    tmha = torch.nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True).eval()
    sd = tmha.state_dict()
    assert "q_proj_weight" in sd and "in_proj_weight" not in sd  # torch's separate layout
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 4, 6), torch.randn(2, 4, 5)
    want = tmha(q, k, v, need_weights=False)[0].detach().numpy()
    net = L.MultiHeadAttention(2)
    _, params, state = net.init(KEY, ((-1, 3, 8), (-1, 4, 6), (-1, 4, 5)))
    new_p, new_s = load_torch_state_dict(params, state, sd)
    got, _ = net.apply(new_p, new_s, tuple(jnp.asarray(t.numpy()) for t in (q, k, v)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # the separate weights inside a model, out_proj included, pair up as one module
    wrapped = {f"attn.{key}": value for key, value in sd.items()}
    net2 = funcnet.serial(attn=L.MultiHeadAttention(2))
    _, p2, s2 = net2.init(KEY, ((-1, 3, 8), (-1, 4, 6), (-1, 4, 5)))
    p2, _ = load_torch_state_dict(p2, s2, wrapped)
    np.testing.assert_array_equal(np.asarray(p2["attn"]["out"]["W"]), sd["out_proj.weight"].numpy().T)


def test_a_module_or_a_meta_tensor_instead_of_a_state_dict_is_named():
    net = funcnet.serial(L.Dense(2))
    _, params, state = net.init(KEY, (-1, 3))

    class Module:  # what a torch module offers here
        def state_dict(self):
            return {}

    with pytest.raises(
        TypeError,
        match=r"state_dict must be a mapping .* got a Module; the "
        r"module itself: pass module.state_dict\(\)",
    ):
        load_torch_state_dict(params, state, Module())
    with pytest.raises(TypeError, match=r"got a list; pass module.state_dict\(\)"):
        load_torch_state_dict(params, state, [np.ones((2, 3))])
    meta = {"0.weight": torch.empty(2, 3, device="meta"), "0.bias": torch.empty(2)}
    with pytest.raises(StateDictMismatchError, match=r"torch's '0.weight' is a meta tensor"):
        load_torch_state_dict(params, state, meta)


# --------------------------------------------------------------------------- #
# MultiHeadAttention's decoding cache
# --------------------------------------------------------------------------- #


def test_a_cache_fed_another_batch_size_names_both_sizes():
    layer = L.MultiHeadAttention(2, causal=True, cache_length=4)
    _, params, cache = layer.init(KEY, (2, 1, 8))
    layer.apply(params, cache, jnp.ones((2, 1, 8)))  # the batch it was made for
    for batch in (3, 1):  # more rows than the cache: raw; fewer: would fill part of it
        with pytest.raises(
            ValueError,
            match=rf"cache was made for a batch of 2 but the input "
            rf"has a batch of {batch}.*make a new one .*"
            rf"init\(rng, \({batch}, 1, features\)\)",
        ):
            jax.jit(layer.apply)(params, cache, jnp.ones((batch, 1, 8)))


def test_another_layers_cache_is_named():
    layer = L.MultiHeadAttention(2, causal=True, cache_length=4)
    _, params, _ = layer.init(KEY, (2, 1, 8))
    _, _, other = L.MultiHeadAttention(4, causal=True, cache_length=4).init(KEY, (2, 1, 8))
    with pytest.raises(
        ValueError,
        match=r"holds 4 heads of 2 but this layer computes 2 heads "
        r"of 4: it is another layer's cache",
    ):
        layer.apply(params, other, jnp.ones((2, 1, 8)))


# --------------------------------------------------------------------------- #
# LSTM's initial_state and empty sequences
# --------------------------------------------------------------------------- #


def test_lstm_takes_initial_state_as_a_list_like_torch():
    layer = L.LSTM(3, return_state=True)
    _, params, _ = layer.init(KEY, (-1, 4, 2))
    x = jnp.asarray(_randn(0, 2, 4, 2))
    h0, c0 = jnp.asarray(_randn(1, 1, 2, 3)), jnp.asarray(_randn(2, 1, 2, 3))
    want, _ = layer.apply(params, (), x, initial_state=(h0, c0))
    got, _ = layer.apply(params, (), x, initial_state=[h0, c0])
    jax.tree.map(np.testing.assert_array_equal, got, want)
    if HAVE_TORCH:  # torch's LSTM takes the list too, with the same meaning
        module = torch.nn.LSTM(2, 3, batch_first=True)
        t_h0, t_c0 = torch.tensor(np.asarray(h0)), torch.tensor(np.asarray(c0))
        with torch.no_grad():
            np.testing.assert_array_equal(
                module(torch.tensor(np.asarray(x)), [t_h0, t_c0])[0],
                module(torch.tensor(np.asarray(x)), (t_h0, t_c0))[0],
            )


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_an_empty_sequence_is_refused_as_torch_does(kind):
    layer = getattr(L, kind)(3)
    _, params, _ = layer.init(KEY, (-1, 4, 2))
    with pytest.raises(
        ValueError,
        match=r"\(3\): the input has no time steps \(shape "
        r"\(2, 0, 2\)",
    ):
        jax.jit(layer.apply)(params, (), jnp.ones((2, 0, 2)))
    if HAVE_TORCH:
        module = getattr(torch.nn, kind)(2, 3, batch_first=True)
        with pytest.raises(RuntimeError):
            module(torch.ones(2, 0, 2))


# --------------------------------------------------------------------------- #
# stack_params and Scan
# --------------------------------------------------------------------------- #


def test_stack_params_of_different_widths_names_the_path_and_both_shapes():
    _, a, _ = serial(L.Dense(4), L.Dense(3)).init(KEY, (-1, 2))
    _, b, _ = serial(L.Dense(4), L.Dense(5)).init(KEY, (-1, 2))
    with pytest.raises(
        ValueError,
        match=r"'1/W' has shape \(4, 5\) in tree 2 and \(4, 3\) "
        r"in tree 0",
    ):
        stack_params([a, a, b])


@pytest.mark.parametrize("layer", [L.Dense(4), serial(L.Gelu(), L.Dense(4))])
def test_scan_over_bfloat16_inputs_gives_serials_result(layer):
    scan, chain = Scan(layer, 3), serial(*[layer] * 3)
    _, params, state = chain.init(KEY, (-1, 4))
    x = jnp.asarray(_randn(0, 2, 4)).astype(jnp.bfloat16)
    want, _ = jax.jit(chain.apply)(params, state, x)  # both jitted: XLA's bfloat16 rounding
    got, new_state = jax.jit(scan.apply)(stack_params(params), stack_params(state), x)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    assert jax.tree.structure(new_state) == jax.tree.structure(stack_params(state))


def test_scan_over_bfloat16_threads_a_stateful_layers_state():
    layer = serial(L.Dense(4), L.BatchNorm())
    scan, chain = Scan(layer, 2), serial(layer, layer)
    _, params, state = chain.init(KEY, (-1, 4))
    x = jnp.asarray(_randn(0, 6, 4)).astype(jnp.bfloat16)
    want, want_state = chain.apply(params, state, x, train=True)
    got, got_state = scan.apply(stack_params(params), stack_params(state), x, train=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got_state, stack_params(want_state)
    )


# --------------------------------------------------------------------------- #
# make_train_step(microbatches=)
# --------------------------------------------------------------------------- #


def _micro_step(k):
    net = L.Dense(1)
    ts = TrainState.create(net, optax.sgd(0.1), KEY, (-1, 3))

    def loss_fn(params, state, batch, rng):
        y, state = net.apply(params, state, batch["x"])
        return jnp.mean((y[:, 0] - batch["y"]) ** 2), Aux(state=state)

    return ts, make_train_step(loss_fn, optax.sgd(0.1), microbatches=k)


def test_microbatch_leaves_without_a_batch_axis_are_named():
    ts, step = _micro_step(2)
    x = jnp.ones((4, 3))
    with pytest.raises(
        ValueError,
        match=r"microbatches=2 cuts every batch leaf .* but "
        r"batch\['y'\] is a scalar \(shape \(\)\)",
    ):
        step(ts, {"x": x, "y": jnp.float32(1.0)})
    ts, step = _micro_step(3)
    with pytest.raises(
        ValueError,
        match=r"microbatches=3 must divide the batch's leading "
        r"size, got 4 for batch\['x'\] of shape \(4, 3\)",
    ):
        step(ts, {"x": x, "y": jnp.ones(4)})


def test_microbatch_leaves_of_different_batch_sizes_are_named():
    ts, step = _micro_step(2)
    with pytest.raises(
        ValueError,
        match=r"same leading \(batch\) size, got batch\['x'\] of "
        r"shape \(4, 3\) and batch\['y'\] of shape \(8,\)",
    ):
        step(ts, {"x": jnp.ones((4, 3)), "y": jnp.ones(8)})


# --------------------------------------------------------------------------- #
# examples/shakespeare_char.py's arguments
# --------------------------------------------------------------------------- #


@pytest.fixture
def shakespeare(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    return importlib.import_module("shakespeare_char")


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--eval-iters=0", r"--eval-iters=0 must be at least 1: .* so 0 gives nan"),
        ("--log-interval=0", r"--log-interval=0 must be at least 1: an iter line is printed"),
        ("--eval-interval=0", r"--eval-interval=0 must be at least 1"),
        ("--batch-size=-2", r"--batch-size=-2 must be at least 1"),
        ("--max-iters=-1", r"--max-iters=-1 must be at least 0"),
        ("--dropout=1.0", r"--dropout=1.0 must be in \[0, 1\)"),
    ],
)
def test_example_refuses_unusable_counts_at_argument_parsing(shakespeare, capsys, flag, message):
    assert re.search(message, "; ".join(shakespeare.check_args(shakespeare.parse_args([flag]))))
    with pytest.raises(SystemExit) as exit_:  # before jax starts or the text is read
        shakespeare.main([flag, "--data=/nonexistent/input.txt"])
    assert exit_.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err
    assert "usage:" in err and re.search(message, err), err


def test_example_refuses_a_block_size_longer_than_the_text(shakespeare, tmp_path, capsys):
    path = tmp_path / "input.txt"
    path.write_text("to be or not to be, that is the question\n" * 5)  # 210 chars, val 21
    with pytest.raises(SystemExit) as exit_:
        shakespeare.main([f"--data={path}", "--block-size=64", "--sample-tokens=0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        "--block-size=64 is too long for the text: its validation split has 21 characters" in err
        and "--block-size=20 or less" in err
    ), err
