"""Autoregressive generation: sampling tokens from a language model, under ``jit``.

Two ways to feed the model, one loop (``lax.fori_loop``, no Python loop per token):

* with a cache: ``net`` is the decoding form of the model (e.g.
  ``funcnet.models.GPT(..., decode=True)``, attention layers built with
  ``cache_length``), ``state`` its fresh init state. The prompt goes in once, then
  one token per step; each step costs one token's worth of compute.
* with a window (``window=W``): ``net`` is the ordinary model; every step re-runs
  the last ``W`` tokens, as nanoGPT's ``generate`` does, so there is no length
  limit (positions never exceed ``W``) at ``W`` tokens' compute per step.

Token ``-1`` marks what could not be sampled: a row of logits holding NaN (or only
``-inf``) has no distribution, so :func:`sample_logits` returns ``-1`` for it rather
than a valid-looking id, and :func:`generate` sets every token after a ``-1`` in its row
to ``-1``. Outside ``jit`` the mistakes behind such rows (an out-of-range prompt id, a
cache already used) are errors; under ``jit``, where values are traced, they give ``-1``.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet.core import Layer, PyTree, as_layer
from funcnet.layers.attention import cache_lengths

__all__ = ["generate", "sample_logits"]

INVALID = -1  # the token of a row that could not be sampled


def sample_logits(
    rng: Optional[jax.Array], logits: ArrayLike, *, temperature: float = 1.0, top_k: Optional[int] = None
) -> jax.Array:
    """One token per row of ``logits`` ``(..., vocab)``, as nanoGPT samples.

    ``logits / temperature``, then (``top_k``) every logit below the k-th largest set
    to ``-inf``, then a draw from the softmax (``jax.random.categorical``).
    ``temperature=0`` is greedy decoding (argmax; ``rng`` may then be None).
    A row holding a NaN, or only ``-inf``, has no distribution to draw from: its token
    is ``-1``, never a valid id (NaN logits are what a network gives, under ``jit``,
    for an out-of-range id or a key/value cache run past its end).

    Args:
      rng: a PRNG key (unused, and may be None, when ``temperature=0``).
      logits: real scores ``(..., vocab)``, ``vocab >= 1``.
      temperature: a finite real ``>= 0`` (a Python or NumPy number, static under
        ``jit``): divides the logits; 0 picks the argmax.
      top_k: None (every token), or a positive int: keep only the ``top_k`` largest
        logits of each row. A ``top_k`` above the vocabulary keeps every token, as
        nanoGPT's ``min(top_k, vocab)``.

    Returns:
      Int32 token ids of shape ``logits.shape[:-1]``; ``-1`` for a row that holds a NaN
      or only ``-inf``.

    Raises:
      ArgumentError: a negative, non-finite, non-number or traced ``temperature``; a
        ``top_k`` that is not None or a positive int; ``rng`` None (or an int) when
        ``temperature > 0``; ``logits`` that are not a real array with a last axis of
        at least one entry.

    Examples:
      >>> logits = jnp.array([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
      >>> sample_logits(None, logits, temperature=0).tolist()
      [1, 0]
      >>> sample_logits(jax.random.key(0), logits, top_k=1).tolist()  # top_k=1 is greedy too
      [1, 0]
      >>> sample_logits(None, jnp.array([[jnp.nan, 1.0, 0.0]]), temperature=0).tolist()
      [-1]
    """
    where = "sample_logits"
    temperature = _temperature(where, temperature)
    top_k = _top_k(where, top_k)
    logits = _logits(where, logits)
    if temperature != 0:
        rng = _rng(where, rng, temperature)
    return _sample(rng, logits, temperature, top_k)


def _sample(rng, logits, temperature: float, top_k: Optional[int]):
    """sample_logits on validated arguments."""
    invalid = jnp.isnan(logits).any(axis=-1) | (logits == -jnp.inf).all(axis=-1)
    if temperature == 0:
        tokens = jnp.argmax(logits, axis=-1)
    else:
        logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) / temperature
        if top_k is not None:
            k = min(top_k, logits.shape[-1])
            kth = lax.top_k(logits, k)[0][..., -1:]
            logits = jnp.where(logits < kth, -jnp.inf, logits)
        tokens = jax.random.categorical(rng, logits, axis=-1)
    return jnp.where(invalid, INVALID, tokens.astype(jnp.int32))


def _temperature(where: str, value) -> float:
    if isinstance(value, jax.core.Tracer):
        raise checks.ArgumentError(
            f"{where}: temperature must be a number known when tracing, got a traced value "
            f"({value.dtype}{list(value.shape)}); under jax.jit mark it static "
            f"(static_argnames=('temperature', ...)) or close over it."
        )
    if (
        isinstance(value, (np.ndarray, jax.Array))
        and value.shape == ()
        and (jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer))
    ):
        value = value.item()  # a concrete 0-d array: its number
    if not checks.is_real(value) or not np.isfinite(float(value)) or value < 0:
        raise checks.ArgumentError(
            f"{where}: temperature must be a finite real number >= 0 (0: greedy, the argmax), "
            f"got {checks.got(value)}."
            + (
                " A negative temperature would make the least likely token the most likely."
                if checks.is_real(value) and value < 0
                else ""
            )
        )
    return float(value)


def _top_k(where: str, value) -> Optional[int]:
    if value is None:
        return None
    if not checks.is_int(value) or value < 1:
        raise checks.ArgumentError(
            f"{where}: top_k must be None (every token) or a positive int (keep the top_k most "
            f"likely tokens of each row), got {checks.got(value)}."
        )
    return int(value)


def _rng(where: str, rng, temperature: float):
    if rng is None:
        raise checks.ArgumentError(
            f"{where}: rng must be a jax PRNG key to sample at temperature={temperature:g}, got "
            f"None: pass jax.random.key(0) (or temperature=0 for greedy decoding, which "
            f"needs no key)."
        )
    return checks.prng_key(where, rng)


def _logits(where: str, logits):
    if not isinstance(logits, jax.Array):
        try:
            logits = jnp.asarray(logits)
        except (TypeError, ValueError) as e:
            raise checks.ArgumentError(
                f"{where}: logits must be a real array (..., vocab), got {checks.got(logits)}: {e}"
            ) from e
    if (
        logits.ndim == 0
        or logits.shape[-1] == 0
        or not (jnp.issubdtype(logits.dtype, jnp.floating) or jnp.issubdtype(logits.dtype, jnp.integer))
    ):
        raise checks.ArgumentError(
            f"{where}: logits must be a real array of shape (..., vocab) with vocab >= 1, got "
            f"{logits.dtype} of shape {tuple(logits.shape)}."
        )
    return logits


def generate(
    net: Layer,
    params: PyTree,
    state: PyTree,
    prompt: ArrayLike,
    max_new_tokens: int,
    *,
    rng: Optional[jax.Array],
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    window: Optional[int] = None,
) -> jax.Array:
    """``prompt`` ``(B, P)`` ints followed by ``max_new_tokens`` sampled tokens: ``(B, P + N)``.

    ``net`` maps ids ``(B, T)`` to logits ``(B, T, vocab)``. Without ``window`` it is a
    decoding network and ``state`` its fresh cache (see the module docstring); the
    cache must hold ``P + N`` positions (checked here, before anything runs). With
    ``window`` it is the ordinary network and ``state`` its usual state (run with
    ``train=False``). Sampling: :func:`sample_logits` with one key per new token,
    split from ``rng``. Pure: ``jax.jit(generate, static_argnames=("net",
    "max_new_tokens", "temperature", "top_k", "window"))`` compiles it whole.

    Only the prompt conditions the new tokens: the cache must be fresh (every position
    index 0, as ``init`` returns it; ``generate`` never changes the state passed, so keep
    that one and pass it again). The prompt's ids must lie in ``[0, vocab)``. Both are
    checked when the values are known (outside ``jit``): a ValueError. Under ``jit``
    they are traced, and the tokens that would have been sampled from them are ``-1``
    instead (every new token for a used cache, the row's new tokens for an
    out-of-range id), as is every token from a row of NaN logits on (see
    :func:`sample_logits`): never a valid-looking id.

    Args:
      net: the network, ids ``(B, T)`` -> logits ``(B, T, vocab)``.
      params: its params.
      state: its fresh decoding cache (no ``window``) or its ordinary state (``window``).
      prompt: int token ids ``(B, P)``, ``B, P >= 1``, in ``[0, vocab)``.
      max_new_tokens: how many tokens to sample, >= 1.
      rng: a PRNG key for the sampling (None is allowed with ``temperature=0``).
      temperature: as :func:`sample_logits` (0: greedy).
      top_k: as :func:`sample_logits`.
      window: re-run ``net`` on the last ``window`` tokens instead of using a cache.

    Returns:
      Int token ids ``(B, P + max_new_tokens)``, the prompt first: int32 (int64 for a
      64-bit prompt with ``jax_enable_x64`` on); ``-1`` for tokens that could not be
      sampled (see above).

    Raises:
      ArgumentError: a bad ``max_new_tokens``, ``rng``, ``temperature``, ``top_k`` or
        ``window``.
      ValueError: a prompt that is not ``(B, P)`` ints with ``B, P >= 1``; (outside
        ``jit``) prompt ids outside ``[0, vocab)``, including int64 ids that int32
        cannot hold; a ``net`` that does not return logits ``(B, T, vocab)``; a state
        with no cache (without ``window``), a cache too short for ``P +
        max_new_tokens``, or (outside ``jit``) a cache already used.

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
    where = "generate"
    net = as_layer(net, where)
    max_new_tokens = checks.positive_int(where, "max_new_tokens", max_new_tokens)
    temperature = _temperature(where, temperature)
    top_k = _top_k(where, top_k)
    rng = None if temperature == 0 and rng is None else _rng(where, rng, temperature)
    if window is not None:
        window = checks.positive_int(where, "window", window)
    prompt, dtype = _prompt(where, prompt)
    B, P = prompt.shape
    total = P + max_new_tokens

    if window is None:
        lengths = cache_lengths(state)
        if not lengths:
            raise ValueError(
                "generate: state holds no key/value cache. Pass the decoding form "
                "of the network (attention built with cache_length=..., e.g. "
                "GPT(..., decode=True)) and its init state, or give window= to "
                "re-run the ordinary network on the last tokens."
            )
        if total > min(lengths):
            raise ValueError(
                f"generate: the prompt ({P}) and max_new_tokens ({max_new_tokens}) "
                f"need {total} positions, but the cache holds {min(lengths)}. Use "
                f"fewer tokens, a larger cache_length, or window= (no limit)."
            )
        used = _used_cache(where, state)
        width = P
    else:
        used = jnp.zeros((), bool)
        width = min(window, total)
    vocab = _vocab(where, net, params, state, (B, width), dtype)
    _check_ids(where, prompt, vocab)
    prompt = jnp.asarray(prompt, dtype)
    # rows whose prompt holds an id outside [0, vocab): under jit, their tokens are -1
    bad = ((prompt < 0) | (prompt >= vocab)).any(axis=1) | used
    keys = None if rng is None else jax.random.split(rng, max_new_tokens)
    tokens = jnp.zeros((B, total), dtype).at[:, :P].set(prompt)

    def sample(i, logits):
        return _sample(None if keys is None else keys[i], logits, temperature, top_k).astype(dtype)

    if window is None:
        logits, state = net.apply(params, state, prompt)
        tokens = tokens.at[:, P].set(sample(0, logits[:, -1]))

        def step(i, carry):
            tokens, state = carry
            pos = P + i - 1  # the token fed now; its logits choose the one at pos + 1
            x = lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1)
            logits, state = net.apply(params, state, x)
            return tokens.at[:, pos + 1].set(sample(i, logits[:, 0])), state

        tokens, _ = lax.fori_loop(1, max_new_tokens, step, (tokens, state))
    else:

        def step(i, tokens):
            pos = P + i - 1  # the last known token
            start = jnp.maximum(pos + 1 - width, 0)
            x = lax.dynamic_slice_in_dim(tokens, start, width, axis=1)
            logits, _ = net.apply(params, state, x)
            # causal: the logits at pos - start read nothing past pos (later slots are still 0)
            last = lax.dynamic_index_in_dim(logits, pos - start, axis=1, keepdims=False)
            return tokens.at[:, pos + 1].set(sample(i, last))

        tokens = lax.fori_loop(0, max_new_tokens, step, tokens)
    new = tokens[:, P:]
    # a -1 and every token after it: nothing sampled from a -1 is a valid continuation
    dead = bad[:, None] | (jnp.cumsum(new == INVALID, axis=1) > 0)
    return tokens.at[:, P:].set(jnp.where(dead, jnp.asarray(INVALID, dtype), new))


def _prompt(where: str, prompt):
    """The prompt (host values left on the host, for the checks) and the tokens' dtype."""
    if not isinstance(prompt, jax.Array):
        try:
            prompt = np.asarray(prompt)
        except (TypeError, ValueError) as e:  # ragged nested lists
            raise ValueError(
                f"{where}: prompt must be integer token ids of shape (batch, length), got {type(prompt).__name__}: {e}"
            ) from e
    if prompt.ndim != 2 or not jnp.issubdtype(prompt.dtype, jnp.integer) or 0 in prompt.shape:
        raise ValueError(
            f"{where}: prompt must be integer token ids of shape (batch, length), with at least "
            f"one sequence of at least one token, got {prompt.dtype} of shape "
            f"{tuple(prompt.shape)}." + (" Add the batch axis: prompt[None]." if prompt.ndim == 1 else "")
        )
    # the tokens are signed, to hold -1, and wide enough for any vocabulary: int32, or
    # int64 for 64-bit ids under x64 (int32 without it: out-of-range ids are checked)
    wide = prompt.dtype.itemsize == 8
    return prompt, jax.dtypes.canonicalize_dtype(np.int64 if wide else np.int32)


def _vocab(where: str, net, params, state, shape, dtype) -> int:
    """The vocabulary size, from the logits' shape (traced only, nothing runs)."""
    out = jax.eval_shape(lambda p, s, x: net.apply(p, s, x), params, state, jax.ShapeDtypeStruct(shape, dtype))
    logits = out[0] if isinstance(out, (tuple, list)) and len(out) == 2 else out
    if (
        not isinstance(logits, jax.ShapeDtypeStruct)
        or len(logits.shape) != 3
        or tuple(logits.shape[:2]) != tuple(shape)
        or logits.shape[2] < 1
    ):
        got = logits.shape if isinstance(logits, jax.ShapeDtypeStruct) else logits
        raise ValueError(
            f"{where}: net must map ids (batch, length) to logits (batch, length, vocab); "
            f"given ids of shape {tuple(shape)} its apply returns {got}."
        )
    return int(logits.shape[2])


def _check_ids(where: str, prompt, vocab: int) -> None:
    known = checks.concrete(prompt)  # host values: before any conversion to int32
    if known is None:
        return
    bad = np.argwhere((known < 0) | (known >= vocab))
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"{where}: prompt must hold token ids in [0, {vocab}) (the vocabulary of the "
            f"network's logits), got {known[at]} at index {at} (ids from {known.min()} to "
            f"{known.max()}). Check the tokenizer and the model's vocab_size. Under jit such "
            f"ids are not checked: the tokens sampled after them are -1."
        )


def _cache_indices(state) -> list:
    """Every decoding position in ``state``: each attention cache's ``index`` and each
    decoding position layer's (``{"index": int}``, :func:`funcnet.layers.LearnedPositions`)."""
    found = []

    def visit(node):
        if isinstance(node, dict):
            index = node.get("index")
            if (
                index is not None
                and getattr(index, "shape", None) == ()
                and (set(node) == {"index"} or {"key", "value"} <= set(node))
            ):
                found.append(index)
                return
            for v in node.values():
                visit(v)
        elif isinstance(node, (tuple, list)):
            for v in node:
                visit(v)

    visit(state)
    return found


def _used_cache(where: str, state):
    """A scalar: whether any decoding position is past 0 (an error when known)."""
    indices = _cache_indices(state)
    known = [checks.concrete(i) for i in indices]
    if all(k is not None for k in known):
        past = sorted({int(k) for k in known if int(k) != 0})
        if past:
            raise ValueError(
                f"{where}: the decoding cache has been used: it is at position {past[-1]}, "
                f"not 0, so it holds the tokens of an earlier apply, which the new tokens "
                f"would follow instead of the prompt (and run past the cache's end). Pass the "
                f"fresh state init returned: generate never changes the state it is given, "
                f"so keep that one and pass it again."
            )
        return jnp.zeros((), bool)
    return jnp.any(jnp.stack([jnp.asarray(i) != 0 for i in indices]))
