"""Embedding: a lookup table from integer ids to vectors, and its tied output head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet import initializers
from funcnet.core import Layer, as_layer, check_input, check_shape, named
from funcnet.layers.dense import linear

__all__ = ["Embedding", "TiedEmbedding"]


def Embedding(vocab_size: int, dim: int, E_init=None, padding_idx=None) -> Layer:
    """``y[..., :] = E[ids[...], :]``: integer ids of any shape ``S`` -> ``S + (dim,)``.

    As ``torch.nn.Embedding(vocab_size, dim)``: params ``{"E": (vocab_size, dim)}``
    (torch's ``weight``, copied as is), drawn from ``E_init`` (default
    ``initializers.normal(1.0)``, i.e. ``N(0, 1)`` like torch).

    ``padding_idx``, as torch's: that row starts as zeros and gets no gradient from
    the lookup (ids equal to it read the row as it is, with the gradient stopped);
    a negative value counts from the end (``vocab_size + padding_idx``).

    Inputs must have an integer dtype; anything else (floats, bool) is a TypeError
    at trace time rather than a silent cast.

    Out-of-range ids. PyTorch raises ``IndexError`` for an id outside
    ``[0, vocab_size)``; a jitted function cannot raise on values, and a plain
    ``E[ids]`` would silently read another row (negative ids wrap around NumPy
    style, ids past either end are clamped to the first/last row). Here the
    lookup is a gather with ``mode="fill", fill_value=nan`` with negative ids sent
    out of range first (a gather alone would wrap ``-1`` to the last row, NumPy
    style): every id outside ``[0, vocab_size)``, negative ones included, yields a
    row of NaN, so the mistake shows up as a NaN loss instead of a wrong but
    plausible vector. Such rows get no gradient.

    Ids whose values are known (``apply`` called outside ``jit``) are checked as
    torch does: one outside ``[0, vocab_size)`` raises ValueError.

    Ids split over Explicit mesh axes (``jax.make_mesh``) give rows split the same
    way (:func:`funcnet.distributed.gather`).
    """
    vocab_size = checks.positive_int("Embedding", "vocab_size", vocab_size)
    dim = checks.positive_int("Embedding", "dim", dim)
    name = f"Embedding({vocab_size}, {dim})"
    E_init = checks.initializer(name, "E_init", E_init) or initializers.normal(1.0)
    if padding_idx is not None:
        padding_idx = checks.integer(name, "padding_idx", padding_idx)
        if not -vocab_size <= padding_idx < vocab_size:
            raise ValueError(f"{name}: padding_idx={padding_idx} must be in [-{vocab_size}, "
                             f"{vocab_size}) (a row of the table; negative counts from the end).")
        padding_idx %= vocab_size

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0)
        E = E_init(rng, (vocab_size, dim), jnp.float32)
        if padding_idx is not None:
            E = E.at[padding_idx].set(0.0)
        return shape + (dim,), {"E": E}, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise TypeError(f"{name}: expected integer token ids, got dtype {inputs.dtype}. "
                            f"Cast them, e.g. ids.astype(jnp.int32).")
        table = params["E"]
        n = table.shape[0]
        _check_concrete_ids(name, inputs, n)
        # int32 indices unless the ids are 64-bit: `n` must fit (uint8 ids, vocab 256), and
        # uint32 ids past 2**31 wrap negative, which the range check below catches.
        ids = inputs if inputs.dtype.itemsize >= 8 else inputs.astype(jnp.int32)
        ids = jnp.where((ids >= 0) & (ids < n), ids, n)
        out = _mesh.gather(table, ids, mode="fill", fill_value=jnp.nan)
        if padding_idx is not None:  # torch: the padding row is read but never trained
            out = jnp.where((ids == padding_idx)[..., None], jax.lax.stop_gradient(out), out)
        return out, state

    return named(name, init, apply)


def _check_concrete_ids(layer: str, ids, n: int) -> None:
    """Outside jit the ids are known: an out-of-range one is an error (torch's IndexError)
    rather than the NaN rows jit gives."""
    values = checks.concrete(ids)
    if values is None or values.size == 0:
        return
    bad = (values < 0) | (values >= n)
    if bad.any():
        found = np.unique(values[bad])[:8].tolist()
        raise ValueError(f"{layer}: ids must be in [0, {n}), found {found}. Check vocab_size "
                         f"(the largest id + 1) and the tokenizer. Under jit such ids are not "
                         f"checked and give rows of NaN.")


def TiedEmbedding(vocab_size: int, dim: int, body=None, E_init=None) -> Layer:
    """Token embedding, ``body``, and an output head that reuses the embedding table.

    ::

        h = body(E[ids])              ids: integers S -> h: S + (dim,)
        logits = h @ E^T              -> S + (vocab_size,)

    One parameter used in two places (weight tying, Press & Wolf 2017; nanoGPT sets
    ``transformer.wte.weight = lm_head.weight``): params are ``{"E": (vocab_size, dim),
    "body": body's params}``, and the gradient of ``E`` is the sum of what both uses
    send it, as autodiff of the shared array gives (tested against torch's tied GPT).
    ``body`` is any layer mapping ``S + (dim,)`` to ``S + (dim,)`` (default none: the
    identity); its state is this layer's state. The lookup is :func:`Embedding`'s
    (integer ids, out-of-range ids checked outside jit, NaN rows under jit).

    The same pattern ties any parameter: write a layer whose ``init`` creates the
    shared array once and whose ``apply`` reads it twice, around the child layers it
    runs with their own ``init``/``apply``.
    """
    vocab_size = checks.positive_int("TiedEmbedding", "vocab_size", vocab_size)
    dim = checks.positive_int("TiedEmbedding", "dim", dim)
    lookup = Embedding(vocab_size, dim, E_init=E_init)
    body = None if body is None else as_layer(body, "TiedEmbedding(body=...)")
    name = f"TiedEmbedding({vocab_size}, {dim})"

    def init(rng, input_shape):
        k1, k2 = jax.random.split(rng)
        shape, emb, _ = lookup.init(k1, input_shape)
        params, state = {"E": emb["E"]}, ()
        if body is not None:
            out, params["body"], state = body.init(k2, shape)
            if tuple(out) != tuple(shape):
                raise ValueError(f"{name}: the body must keep the shape {tuple(shape)} (its "
                                 f"output feeds the tied head), but maps it to {tuple(out)}.")
        return shape[:-1] + (vocab_size,), params, state

    def apply(params, state, inputs, *, rng=None, train=False):
        h, _ = lookup.apply({"E": params["E"]}, (), inputs)
        if body is not None:
            h, state = body.apply(params["body"], state, h, rng=rng, train=train)
        # the head in h's dtype (a bf16 policy casts E too); logits as torch's lm_head
        return linear(h, params["E"].astype(h.dtype).T), state

    return named(name, init, apply)
