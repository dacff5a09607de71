"""funcnet.decoding refuses, or marks with -1, what it would otherwise sample wrong (issue G3).

* a cache already used (its position past 0): an error outside jit; under jit every new
  token is -1 -- never the token 0 the NaN logits past the cache's end used to give;
* a row of logits holding NaN (or only -inf) samples as -1 in sample_logits, and generate
  makes every token after a -1 in its row -1;
* prompt ids outside [0, vocab), int64 ids int32 cannot hold included: an error outside
  jit, -1 for that row's new tokens under jit (the other rows unchanged);
* sample_logits' and generate's temperature (>= 0, 0 is greedy), top_k (None or an int
  >= 1; above the vocabulary it keeps every token, as nanoGPT) and rng are checked;
* malformed prompts, max_new_tokens, nets: errors naming the argument.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import named, serial
from funcnet.decoding import generate, sample_logits
from funcnet.errors import ArgumentError
from funcnet.layers import Dense, Embedding
from funcnet.models import GPT

KEY = jax.random.key(0)
V, BLOCK = 13, 12
KW = dict(n_layer=2, n_head=2, n_embd=8)
STATIC = ("net", "max_new_tokens", "temperature", "top_k", "window")


@pytest.fixture(scope="module")
def gpt():
    """(decoding GPT, params, its fresh cache for a batch of 2, the ordinary GPT)."""
    net = GPT(V, BLOCK, **KW)
    dec = GPT(V, BLOCK, decode=True, **KW)
    _, params, cache = dec.init(KEY, (2, 1))
    return dec, params, cache, net


@pytest.fixture(scope="module")
def run():
    return jax.jit(generate, static_argnames=STATIC)


PROMPT = jnp.asarray([[1, 2, 3], [4, 5, 6]])


# ------------------------------------------------------------------ a cache already used


def _used(dec, params, cache, times):
    """The cache after ``times`` applies of 4 tokens each."""
    step = jax.jit(dec.apply)  # as test_decoding.py's, to share its compiled program
    for _ in range(times):
        _, cache = step(params, cache, jnp.ones((2, 4), jnp.int32))
    return cache


def test_a_used_cache_is_refused_outside_jit(gpt, run):
    dec, params, cache, _ = gpt
    used = _used(dec, params, cache, 2)
    with pytest.raises(ValueError) as info:
        generate(dec, params, used, PROMPT, 3, rng=KEY)
    msg = str(info.value)
    for part in (
        "generate: the decoding cache has been used",
        "at position 8, not 0",
        "Pass the fresh state init returned",
    ):
        assert part in msg, (part, msg)
    # the fresh cache is unchanged by generate: passing it again gives the same tokens
    a = run(dec, params, cache, PROMPT, 5, rng=KEY, temperature=0)
    np.testing.assert_array_equal(a, run(dec, params, cache, PROMPT, 5, rng=KEY, temperature=0))


def test_a_used_cache_under_jit_gives_minus_one_never_token_0(gpt, run):
    dec, params, cache, _ = gpt
    used = _used(dec, params, cache, 2)
    # 8 positions used + 3 prompt + 5 new = 16 > 12: decoding runs past the cache's end
    for temperature, top_k in ((0, None), (0.8, 5)):
        out = run(dec, params, used, PROMPT, 5, rng=KEY, temperature=temperature, top_k=top_k)
        np.testing.assert_array_equal(out[:, :3], PROMPT)
        np.testing.assert_array_equal(out[:, 3:], -1)
    fresh = run(dec, params, cache, PROMPT, 5, rng=KEY, temperature=0)
    assert (np.asarray(fresh[:, 3:]) >= 0).all()
    # a used cache whose positions stay in range gives -1 as well: it would condition on
    # tokens that are not the prompt's
    once = _used(dec, params, cache, 1)
    np.testing.assert_array_equal(run(dec, params, once, PROMPT, 5, rng=KEY, temperature=0)[:, 3:], -1)


# ------------------------------------------------------------------ NaN logits


@pytest.mark.parametrize("temperature, top_k", [(0, None), (1.0, None), (0.7, 2), (2.0, 50)])
def test_rows_of_nan_or_only_minus_inf_sample_as_minus_one(temperature, top_k):
    logits = jnp.array(
        [
            [0.0, 5.0, 1.0],
            [jnp.nan, jnp.nan, jnp.nan],  # past a cache's end, an id out of range
            [1.0, jnp.nan, 9.0],  # one NaN is enough
            [-jnp.inf, -jnp.inf, -jnp.inf],
            [-jnp.inf, 2.0, -jnp.inf],
        ]
    )
    for key in jax.random.split(KEY, 20):
        got = sample_logits(key, logits, temperature=temperature, top_k=top_k)
        assert got.dtype == jnp.int32
        assert got[1:4].tolist() == [-1, -1, -1]
        assert int(got[4]) == 1 and 0 <= int(got[0]) < 3
    jitted = jax.jit(sample_logits, static_argnames=("temperature", "top_k"))
    assert jitted(KEY, logits, temperature=temperature, top_k=top_k)[1:4].tolist() == [-1] * 3


def test_a_minus_one_ends_its_row():
    # a bigram model whose logits are NaN for token 7 only: the row that samples it
    # goes on with -1, the other row is untouched
    def init(rng, shape):
        return shape + (V,), (), ()

    def apply(params, state, ids, *, rng=None, train=False):
        logits = jax.nn.one_hot((ids + 1) % V, V) * 10.0  # token t -> t + 1
        return jnp.where((ids == 7)[..., None], jnp.nan, logits), state

    succ = named("Successor", init, apply)
    out = generate(succ, (), (), jnp.array([[4], [1]]), 6, rng=KEY, temperature=0, window=4)
    assert out.tolist() == [[4, 5, 6, 7, -1, -1, -1], [1, 2, 3, 4, 5, 6, 7]]


# ------------------------------------------------------------------ prompt ids out of range


@pytest.mark.parametrize("bad, index", [(13, (1, 2)), (-1, (1, 0)), (2**40, (1, 1))])
def test_out_of_range_prompt_ids_are_refused_outside_jit(gpt, bad, index):
    dec, params, cache, net = gpt
    prompt = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    prompt[index] = bad
    for kwargs in ({"state": cache, "net": dec}, {"state": (), "net": net, "window": 4}):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"generate: prompt must hold token ids in [0, 13) (the vocabulary of the "
                f"network's logits), got {bad} at index {index}"
            ),
        ):
            generate(params=params, prompt=prompt, max_new_tokens=3, rng=KEY, **kwargs)


def test_out_of_range_prompt_ids_under_jit_give_minus_one_for_their_row(gpt, run):
    dec, params, cache, net = gpt
    cached = functools.partial(run, dec, params, cache, rng=KEY, temperature=0)
    windowed = functools.partial(run, net, params, (), rng=KEY, temperature=0, window=BLOCK)
    for gen in (cached, windowed):
        good = gen(PROMPT, 5)
        for bad in (13, 99, -1, -5):
            prompt = PROMPT.at[1, 1].set(bad)
            got = gen(prompt, 5)
            np.testing.assert_array_equal(got[:, :3], prompt)
            np.testing.assert_array_equal(got[1, 3:], -1)
            np.testing.assert_array_equal(got[0], good[0])  # the other row is unchanged


# ------------------------------------------------------------------ temperature, top_k, rng


@pytest.mark.parametrize("fn", ["sample_logits", "generate"])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"temperature": -0.5},
            (
                r"temperature must be a finite real number >= 0 \(0: greedy, the "
                r"argmax\), got -0.5 \(float\)\. A negative temperature would "
                r"make the least likely token the most likely"
            ),
        ),
        ({"temperature": float("nan")}, r"temperature must be a finite real number >= 0.*got nan"),
        ({"temperature": float("inf")}, r"temperature must be a finite real number >= 0.*got inf"),
        ({"temperature": "hot"}, r"temperature must be a finite real number >= 0.*'hot' \(str\)"),
        ({"top_k": 0}, r"top_k must be None \(every token\) or a positive int .*got 0 \(int\)"),
        ({"top_k": -3}, r"top_k must be None .*got -3 \(int\)"),
        ({"top_k": 2.0}, r"top_k must be None .*got 2.0 \(float\)"),
        ({"top_k": True}, r"top_k must be None .*got True \(bool\)"),
        ({"rng": None}, r"rng must be a jax PRNG key to sample at temperature=1, got None"),
        ({"rng": 3}, r"rng must be a jax PRNG key, got the int 3: pass jax.random.key\(3\)"),
    ],
)
def test_bad_sampling_arguments_are_refused(gpt, fn, kwargs, match):
    dec, params, cache, _ = gpt
    kwargs = {"rng": KEY, **kwargs}
    with pytest.raises(ArgumentError, match=f"{fn}: {match}"):
        if fn == "sample_logits":
            sample_logits(kwargs.pop("rng"), jnp.zeros((2, V)), **kwargs)
        else:
            generate(dec, params, cache, PROMPT, 2, **kwargs)


def test_greedy_needs_no_key_and_a_top_k_above_the_vocab_keeps_every_token(gpt, run):
    dec, params, cache, _ = gpt
    logits = jnp.array([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    assert sample_logits(None, logits, temperature=0).tolist() == [1, 0]
    for zero in (0.0, np.float32(0.0), np.int64(0), jnp.float32(0.0), jnp.asarray(0)):
        assert sample_logits(None, logits, temperature=zero).tolist() == [1, 0]
    assert sample_logits(None, logits, temperature=0, top_k=1).tolist() == [1, 0]
    keys = jax.random.split(KEY, 8)
    for k in keys:  # nanoGPT's min(top_k, vocab)
        assert int(sample_logits(k, logits[0], top_k=200)) == int(sample_logits(k, logits[0]))
    a = run(dec, params, cache, PROMPT, 5, rng=None, temperature=0)
    np.testing.assert_array_equal(a, run(dec, params, cache, PROMPT, 5, rng=KEY, temperature=0))


def test_a_traced_temperature_says_to_make_it_static(gpt):
    dec, params, cache, _ = gpt
    with pytest.raises(
        ArgumentError,
        match=r"sample_logits: temperature must be a number "
        r"known when tracing.*static_argnames",
    ):
        jax.jit(sample_logits)(KEY, jnp.zeros(3), temperature=0.5)
    jitted = jax.jit(generate, static_argnames=("net", "max_new_tokens"))
    with pytest.raises(ArgumentError, match=r"generate: temperature must be a number known"):
        jitted(dec, params, cache, PROMPT, 2, rng=KEY, temperature=0.5)


def test_bad_logits_are_refused():
    for logits, shape in ((jnp.float32(1.0), r"\(\)"), (jnp.zeros((2, 0)), r"\(2, 0\)")):
        with pytest.raises(
            ArgumentError,
            match=rf"sample_logits: logits must be a real array "
            rf"of shape \(\.\.\., vocab\) with vocab >= 1, "
            rf"got float32 of shape {shape}",
        ):
            sample_logits(KEY, logits)
    with pytest.raises(ArgumentError, match="got bool of shape"):
        sample_logits(KEY, jnp.ones((2, 3), bool))


# ------------------------------------------------------------------ prompts, lengths, nets


@pytest.mark.parametrize(
    "prompt, match",
    [
        (jnp.zeros((1, 0), jnp.int32), r"at least one token, got int32 of shape \(1, 0\)"),
        (jnp.zeros((0, 3), jnp.int32), r"got int32 of shape \(0, 3\)"),
        (jnp.array([1, 2, 3]), r"got int32 of shape \(3,\)\. Add the batch axis: prompt\[None\]"),
        (jnp.zeros((2, 3)), r"got float32 of shape \(2, 3\)"),
        (np.zeros((2, 3), bool), r"got bool of shape \(2, 3\)"),
        ([[1, 2, 3], [4]], r"got (list: setting an array element|object of shape)"),
    ],
)
def test_malformed_prompts_are_refused(gpt, prompt, match):
    _, params, _, net = gpt
    with pytest.raises(
        ValueError,
        match=r"generate: prompt must be integer token ids of shape "
        r"\(batch, length\).*" + match,
    ):
        generate(net, params, (), prompt, 2, rng=KEY, window=4)


@pytest.mark.parametrize("n", [0, -1, 2.0, True, None])
def test_max_new_tokens_must_be_a_positive_int(gpt, n):
    dec, params, cache, _ = gpt
    with pytest.raises(
        ArgumentError,
        match=r"generate: max_new_tokens must be a positive int, "
        r"got " + re.escape(repr(n)),
    ):
        generate(dec, params, cache, PROMPT, n, rng=KEY)


def test_a_narrow_prompt_dtype_does_not_wrap_the_new_tokens():
    # vocabulary 300, a bias that makes token 299 the argmax: a uint8 prompt used to give
    # uint8 tokens, 299 wrapped to 43
    net = serial(Embedding(300, 4), Dense(300))
    _, params, state = net.init(KEY, (-1, 4))
    params = (params[0], {**params[1], "b": params[1]["b"].at[299].set(100.0)})
    for dtype in (np.uint8, np.int8, np.int16, np.uint32, np.int32):
        out = generate(net, params, state, np.array([[1, 2]], dtype), 3, rng=KEY, temperature=0, window=4)
        assert out.dtype == jnp.int32
        assert out.tolist() == [[1, 2, 299, 299, 299]], dtype


def test_a_net_that_does_not_return_logits_is_refused():
    flat = named(
        "Flat",
        lambda rng, s: ((s[0], V), (), ()),
        lambda p, s, x, *, rng=None, train=False: (jnp.zeros(x.shape[:1] + (V,)), s),
    )
    with pytest.raises(
        ValueError,
        match=r"generate: net must map ids \(batch, length\) to "
        r"logits \(batch, length, vocab\); given ids of shape "
        r"\(2, 4\) its apply returns \(2, 13\)",
    ):
        generate(flat, (), (), PROMPT, 2, rng=KEY, window=4)
