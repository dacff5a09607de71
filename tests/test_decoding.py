"""funcnet.decoding: generate with a key/value cache and with a window, under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.decoding import generate, sample_logits
from funcnet.models import GPT

KEY = jax.random.key(0)
V, BLOCK = 13, 12
KW = dict(n_layer=2, n_head=2, n_embd=8)


def _full(net, params, ids):
    """The logits of the whole prefix, the reference each decoding is checked against
    (jitted: eager, each op of the forward pass would be a program of its own)."""
    return jax.jit(net.apply)(params, (), ids)[0]


@pytest.fixture(scope="module")
def model():
    net = GPT(V, BLOCK, **KW)
    _, params, _ = net.init(KEY, (-1, BLOCK))
    return net, params


def test_cached_logits_equal_the_full_prefix(model):
    net, params = model
    dec = GPT(V, BLOCK, decode=True, **KW)
    _, dparams, cache = dec.init(KEY, (2, 1))
    jax.tree.map(np.testing.assert_array_equal, dparams, params)  # one set of params
    ids = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 9)))
    want = _full(net, params, ids)
    step = jax.jit(dec.apply)
    logits, cache = step(params, cache, ids[:, :4])
    got = [logits]
    for t in range(4, 9):
        logits, cache = step(params, cache, ids[:, t : t + 1])
        got.append(logits)
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), want, rtol=1e-5, atol=1e-5)


def test_generate_cached_and_windowed_agree_and_jit(model):
    net, params = model
    dec = GPT(V, BLOCK, decode=True, **KW)
    _, _, cache = dec.init(KEY, (2, 1))
    prompt = jnp.asarray([[1, 2, 3], [4, 5, 6]])
    run = jax.jit(generate, static_argnames=("net", "max_new_tokens", "temperature", "top_k", "window"))
    a = run(dec, params, cache, prompt, 8, rng=jax.random.key(3), top_k=5)
    b = run(net, params, (), prompt, 8, rng=jax.random.key(3), top_k=5, window=BLOCK)
    assert a.shape == (2, 11)
    np.testing.assert_array_equal(a[:, :3], prompt)
    np.testing.assert_array_equal(a, b)
    # greedy: each new token is the argmax of the full-prefix logits
    g = run(dec, params, cache, prompt, 5, rng=KEY, temperature=0)
    logits = _full(net, params, g[:, :-1])
    np.testing.assert_array_equal(g[:, 3:], jnp.argmax(logits[:, 2:], -1))


def test_windowed_generation_goes_past_the_block(model):
    net, params = model
    out = generate(net, params, (), jnp.zeros((1, 2), jnp.int32), 20, rng=KEY, window=BLOCK, temperature=0)
    assert out.shape == (1, 22)
    # the last token is the argmax over the last BLOCK tokens before it
    logits = _full(net, params, out[:, -1 - BLOCK : -1])
    assert int(out[0, -1]) == int(jnp.argmax(logits[0, -1]))


def test_sample_logits_temperature_and_top_k():
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    draws = jax.vmap(lambda k: sample_logits(k, logits, top_k=2))(jax.random.split(KEY, 4000))
    counts = np.bincount(np.asarray(draws), minlength=4) / 4000
    np.testing.assert_allclose(counts, [0, 0, 3 / 7, 4 / 7], atol=0.03)
    cold = jax.vmap(lambda k: sample_logits(k, logits, temperature=0.1))(jax.random.split(KEY, 500))
    assert (np.asarray(cold) == 3).mean() > 0.9


def test_generate_errors(model):
    net, params = model
    dec = GPT(V, BLOCK, decode=True, **KW)
    _, _, cache = dec.init(KEY, (1, 1))
    with pytest.raises(ValueError, match="need 15 positions, but the cache holds 12"):
        generate(dec, params, cache, jnp.zeros((1, 5), jnp.int32), 10, rng=KEY)
    with pytest.raises(ValueError, match="no key/value cache"):
        generate(net, params, (), jnp.zeros((1, 5), jnp.int32), 3, rng=KEY)
    with pytest.raises(ValueError, match="shape \\(batch, length\\)"):
        generate(dec, params, cache, jnp.zeros((5,), jnp.int32), 3, rng=KEY)
