"""Autoregressive generation: sampling tokens from a language model, under ``jit``.

Two ways to feed the model, one loop (``lax.fori_loop``, no Python loop per token):

* with a cache: ``net`` is the decoding form of the model (e.g.
  ``funcnet.models.GPT(..., decode=True)``, attention layers built with
  ``cache_length``), ``state`` its fresh init state. The prompt goes in once, then
  one token per step; each step costs one token's worth of compute.
* with a window (``window=W``): ``net`` is the ordinary model; every step re-runs
  the last ``W`` tokens, as nanoGPT's ``generate`` does, so there is no length
  limit (positions never exceed ``W``) at ``W`` tokens' compute per step.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet.core import as_layer
from funcnet.layers.attention import cache_lengths

__all__ = ["generate", "sample_logits"]


def sample_logits(rng, logits, *, temperature: float = 1.0, top_k: Optional[int] = None):
    """One token per row of ``logits`` ``(..., vocab)``, as nanoGPT samples.

    ``logits / temperature``, then (``top_k``) every logit below the k-th largest set
    to ``-inf``, then a draw from the softmax (``jax.random.categorical``).
    ``temperature=0`` is greedy decoding (argmax).

    Args:
      rng: a PRNG key (unused when ``temperature=0``).
      logits: float scores ``(..., vocab)``.
      temperature: divides the logits; 0 picks the argmax.
      top_k: keep only the ``top_k`` largest logits of each row (None: all).

    Returns:
      Int token ids of shape ``logits.shape[:-1]``.

    Examples:
      >>> logits = jnp.array([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
      >>> sample_logits(None, logits, temperature=0).tolist()
      [1, 0]
      >>> sample_logits(jax.random.key(0), logits, top_k=1).tolist()  # top_k=1 is greedy too
      [1, 0]
    """
    if temperature == 0:
        return jnp.argmax(logits, axis=-1)
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) / temperature
    if top_k is not None:
        k = min(int(top_k), logits.shape[-1])
        kth = lax.top_k(logits, k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1)


def generate(net, params, state, prompt, max_new_tokens: int, *, rng, temperature: float = 1.0,
             top_k: Optional[int] = None, window: Optional[int] = None):
    """``prompt`` ``(B, P)`` ints followed by ``max_new_tokens`` sampled tokens: ``(B, P + N)``.

    ``net`` maps ids ``(B, T)`` to logits ``(B, T, vocab)``. Without ``window`` it is a
    decoding network and ``state`` its fresh cache (see the module docstring); the
    cache must hold ``P + N`` positions (checked here, before anything runs). With
    ``window`` it is the ordinary network and ``state`` its usual state (run with
    ``train=False``). Sampling: :func:`sample_logits` with one key per new token,
    split from ``rng``. Pure: ``jax.jit(generate, static_argnames=("net",
    "max_new_tokens", "temperature", "top_k", "window"))`` compiles it whole.

    Args:
      net: the network, ids ``(B, T)`` -> logits ``(B, T, vocab)``.
      params: its params.
      state: its fresh decoding cache (no ``window``) or its ordinary state (``window``).
      prompt: int token ids ``(B, P)``.
      max_new_tokens: how many tokens to sample, >= 1.
      rng: a PRNG key for the sampling.
      temperature: as :func:`sample_logits` (0: greedy).
      top_k: as :func:`sample_logits`.
      window: re-run ``net`` on the last ``window`` tokens instead of using a cache.

    Returns:
      Int token ids ``(B, P + max_new_tokens)``, the prompt first.

    Raises:
      ArgumentError: a bad ``max_new_tokens``, ``rng``, ``temperature``, ``top_k`` or
        ``window``.
      ValueError: a prompt that is not ``(B, P)`` ints, a state with no cache (without
        ``window``), or a cache too short for ``P + max_new_tokens``.

    Examples:
      A bigram model (each position's logits read only its own token), re-run on the
      last 4 tokens; a ``GPT(..., decode=True)`` and its fresh cache go without ``window``:

      >>> from funcnet.combinators import serial
      >>> from funcnet.layers import Dense, Embedding
      >>> net = serial(Embedding(11, 4), Dense(11))
      >>> _, params, state = net.init(jax.random.key(0), (-1, 4))
      >>> out = generate(net, params, state, jnp.array([[1, 2], [3, 4]]), 3,
      ...                rng=jax.random.key(1), window=4)
      >>> out.shape, out[:, :2].tolist()
      ((2, 5), [[1, 2], [3, 4]])
    """
    net = as_layer(net, "generate")
    max_new_tokens = checks.positive_int("generate", "max_new_tokens", max_new_tokens)
    rng = checks.prng_key("generate", rng)
    prompt = jnp.asarray(prompt)
    if prompt.ndim != 2 or not jnp.issubdtype(prompt.dtype, jnp.integer):
        raise ValueError(f"generate: prompt must be integer token ids of shape (batch, length), "
                         f"got {prompt.dtype} of shape {tuple(prompt.shape)}.")
    if temperature != 0:
        checks.real("generate", "temperature", temperature, low=0.0, low_open=True)
    if top_k is not None:
        checks.positive_int("generate", "top_k", top_k)
    B, P = prompt.shape
    total = P + max_new_tokens
    keys = jax.random.split(rng, max_new_tokens)
    tokens = jnp.zeros((B, total), prompt.dtype).at[:, :P].set(prompt)

    def sample(i, logits):
        return sample_logits(keys[i], logits, temperature=temperature,
                             top_k=top_k).astype(prompt.dtype)

    if window is None:
        lengths = cache_lengths(state)
        if not lengths:
            raise ValueError("generate: state holds no key/value cache. Pass the decoding form "
                             "of the network (attention built with cache_length=..., e.g. "
                             "GPT(..., decode=True)) and its init state, or give window= to "
                             "re-run the ordinary network on the last tokens.")
        if total > min(lengths):
            raise ValueError(f"generate: the prompt ({P}) and max_new_tokens ({max_new_tokens}) "
                             f"need {total} positions, but the cache holds {min(lengths)}. Use "
                             f"fewer tokens, a larger cache_length, or window= (no limit).")
        logits, state = net.apply(params, state, prompt)
        tokens = tokens.at[:, P].set(sample(0, logits[:, -1]))

        def step(i, carry):
            tokens, state = carry
            pos = P + i - 1  # the token fed now; its logits choose the one at pos + 1
            x = lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1)
            logits, state = net.apply(params, state, x)
            return tokens.at[:, pos + 1].set(sample(i, logits[:, 0])), state

        tokens, _ = lax.fori_loop(1, max_new_tokens, step, (tokens, state))
        return tokens

    window = checks.positive_int("generate", "window", window)
    width = min(window, total)

    def step(i, tokens):
        pos = P + i - 1  # the last known token
        start = jnp.maximum(pos + 1 - width, 0)
        x = lax.dynamic_slice_in_dim(tokens, start, width, axis=1)
        logits, _ = net.apply(params, state, x)
        # causal: the logits at pos - start read nothing past pos (later slots are still 0)
        last = lax.dynamic_index_in_dim(logits, pos - start, axis=1, keepdims=False)
        return tokens.at[:, pos + 1].set(sample(i, last))

    return lax.fori_loop(0, max_new_tokens, step, tokens)
