"""Embedding: a lookup table from integer ids to vectors, and its tied output head."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet import initializers
from funcnet.core import Layer, PyTree, as_layer, check_input, check_shape, named
from funcnet.initializers import Initializer
from funcnet.core import check_param_shapes
from funcnet.layers.dense import linear

__all__ = ["Embedding", "TiedEmbedding", "embedding_renorm"]


def _renorm_scale(rows, max_norm, norm_type):
    """torch's embedding_renorm_ factor for each row: ``max_norm / (norm + 1e-7)`` where
    the row's ``norm_type``-norm exceeds ``max_norm``, else 1."""
    a = jnp.abs(rows)
    if norm_type == 2.0:
        norm = jnp.sqrt(jnp.sum(a * a, axis=-1, keepdims=True))
    elif norm_type == 1.0:
        norm = jnp.sum(a, axis=-1, keepdims=True)
    elif norm_type == float("inf"):
        norm = jnp.max(a, axis=-1, keepdims=True)
    else:
        norm = jnp.sum(a**norm_type, axis=-1, keepdims=True) ** (1.0 / norm_type)
    return jnp.where(norm > max_norm, max_norm / (norm + 1e-7), 1.0).astype(rows.dtype)


def _check_max_norm(where, max_norm, norm_type):
    max_norm = checks.real(where, "max_norm", max_norm, low=0.0, low_open=True)
    if not (checks.is_real(norm_type) and (float(norm_type) > 0)):
        raise checks.ArgumentError(
            f"{where}: norm_type must be a positive real number (the p "
            f"of the p-norm, 2.0 as torch's default; inf allowed), got "
            f"{checks.got(norm_type)}."
        )
    return max_norm, float(norm_type)


def embedding_renorm(params: PyTree, ids: ArrayLike, max_norm: float, norm_type: float = 2.0) -> PyTree:
    """The params of an :func:`Embedding` whose rows named in ``ids`` are renormalised as
    ``torch.nn.functional.embedding(..., max_norm=, norm_type=)`` renormalises them in
    place: each such row whose ``norm_type``-norm exceeds ``max_norm`` is multiplied by
    ``max_norm / (norm + 1e-7)``; other rows are unchanged.

    torch changes its weight during the forward pass; funcnet's ``Embedding(max_norm=)``
    returns the renormalised rows but cannot change its params. To follow torch's
    training exactly, renormalise the params with this function before each step's
    forward pass (the lookup then returns the rows unchanged) and apply the optimizer's
    update to the result, as torch's optimizer updates the renormalised weight:

    ```
    params["embed"] = embedding_renorm(params["embed"], ids, max_norm=1.0)
    loss, grads = jax.value_and_grad(loss_fn)(params, ids)
    ```

    Ids outside ``[0, vocab_size)`` are ignored here.

    Args:
      params: the :func:`Embedding`'s params, ``{"E": (vocab_size, dim)}``.
      ids: integer token ids, any shape: the rows to renormalise.
      max_norm: the largest norm a row may keep (> 0).
      norm_type: the ``p`` of the p-norm (> 0, ``inf`` allowed).

    Returns:
      A copy of ``params`` with the renormalised table under ``"E"``.

    Raises:
      ArgumentError: ``max_norm`` or ``norm_type`` not a positive real number.
      TypeError: ``ids`` that are not integers.

    Examples:
      >>> params = {"E": jnp.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]])}
      >>> new = embedding_renorm(params, jnp.array([0, 1]), max_norm=1.0)
      >>> np.round(np.asarray(new["E"], np.float64), 3).tolist()  # row 2 not in ids
      [[0.6, 0.8], [0.3, 0.4], [6.0, 8.0]]
    """
    max_norm, norm_type = _check_max_norm("embedding_renorm", max_norm, norm_type)
    table = params["E"]
    ids = jnp.asarray(ids).reshape(-1)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"embedding_renorm: ids must be integer token ids, got dtype {ids.dtype}.")
    n = table.shape[0]
    ids = jnp.where((ids >= 0) & (ids < n), ids, n)
    used = jnp.zeros((n,), bool).at[ids].set(True, mode="drop")
    scale = jnp.where(used[:, None], _renorm_scale(table, max_norm, norm_type), 1.0)
    return {**params, "E": table * scale.astype(table.dtype)}


@jax.custom_vjp
def _grad_by_inverse_freq(rows, counts):
    return rows


def _freq_fwd(rows, counts):
    return rows, counts


def _freq_bwd(counts, g):
    return g / counts[..., None].astype(g.dtype), None


_grad_by_inverse_freq.defvjp(_freq_fwd, _freq_bwd)


def Embedding(
    vocab_size: int,
    dim: int,
    E_init: Optional[Initializer] = None,
    padding_idx: Optional[int] = None,
    *,
    max_norm: Optional[float] = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
) -> Layer:
    """``y[..., :] = E[ids[...], :]``: integer ids of any shape ``S`` -> ``S + (dim,)``.

    As ``torch.nn.Embedding(vocab_size, dim)``: params ``{"E": (vocab_size, dim)}``
    (torch's ``weight``, copied as is), drawn from ``E_init`` (default
    ``initializers.normal(1.0)``, i.e. ``N(0, 1)`` like torch).

    ``padding_idx``, as torch's: that row starts as zeros and gets no gradient from
    the lookup (ids equal to it read the row as it is, with the gradient stopped);
    a negative value counts from the end (``vocab_size + padding_idx``).

    ``max_norm``, as torch's: each looked-up row whose ``norm_type``-norm exceeds
    ``max_norm`` is returned multiplied by ``max_norm / (norm + 1e-7)``, the output torch
    gives. The gradient with respect to ``E`` is torch's too: that of a plain lookup
    (torch renormalises under ``no_grad``), the output's gradient added into the rows.
    torch also writes the renormalised rows back into its weight; params cannot change
    in ``apply``, so use :func:`embedding_renorm` on the params before each step for
    that (see its example).

    ``scale_grad_by_freq=True``, as torch's: the gradient each occurrence of an id sends
    to its row is divided by the number of times the id occurs in ``ids`` (this call's
    batch), ``dE[i] = sum_{k: ids_k = i} g_k / count(i)``.

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

    Args:
      vocab_size: the number of rows of the table (ids lie in ``[0, vocab_size)``), a
        positive int.
      dim: the size of each embedding vector, a positive int.
      E_init: the table's initializer, ``init(key, shape, dtype)``; None for
        ``initializers.normal(1.0)``.
      padding_idx: the row that starts as zeros and gets no gradient (negative counts
        from the end), or None.
      max_norm: the largest ``norm_type``-norm a looked-up row keeps (> 0), or None for
        no renormalisation.
      norm_type: the ``p`` of the p-norm for ``max_norm`` (> 0, ``inf`` allowed).
      scale_grad_by_freq: True divides the gradient each id sends to its row by the
        id's count in the batch.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` with
      ``input_shape`` ``S`` gives ``(S + (dim,), params, state)`` with params
      ``{"E": (vocab_size, dim)}`` (float32) and state ``()``.

    Raises:
      ArgumentError: ``vocab_size`` or ``dim`` not a positive int, a bad
        ``max_norm``/``norm_type``/``scale_grad_by_freq``.
      MismatchError: at ``apply``, a table not of shape ``(vocab_size, dim)``.
      ValueError: ``padding_idx`` outside ``[-vocab_size, vocab_size)``; outside
        ``jit``, an id outside ``[0, vocab_size)``.
      TypeError: non-integer ids.

    Examples:
      >>> init, apply = Embedding(10, 3, padding_idx=0)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 4))
      >>> out_shape, params["E"].shape, params["E"][0].tolist()  # the padding row: zeros
      ((-1, 4, 3), (10, 3), [0.0, 0.0, 0.0])
      >>> apply(params, state, jnp.array([[0, 1, 2, 9]]))[0].shape
      (1, 4, 3)
      >>> apply(params, state, jnp.array([10]))
      Traceback (most recent call last):
      ValueError: Embedding(10, 3): ids must be in [0, 10), found [10]. ...
    """
    vocab_size = checks.positive_int("Embedding", "vocab_size", vocab_size)
    dim = checks.positive_int("Embedding", "dim", dim)
    name = f"Embedding({vocab_size}, {dim})"
    E_init = checks.initializer(name, "E_init", E_init) or initializers.normal(1.0)
    if padding_idx is not None:
        padding_idx = checks.integer(name, "padding_idx", padding_idx)
        if not -vocab_size <= padding_idx < vocab_size:
            raise ValueError(
                f"{name}: padding_idx={padding_idx} must be in [-{vocab_size}, "
                f"{vocab_size}) (a row of the table; negative counts from the end)."
            )
        padding_idx %= vocab_size
    if max_norm is not None:
        max_norm, norm_type = _check_max_norm(name, max_norm, norm_type)
    scale_grad_by_freq = checks.flag(name, "scale_grad_by_freq", scale_grad_by_freq)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0)
        E = E_init(rng, (vocab_size, dim), jnp.float32)
        if padding_idx is not None:
            E = E.at[padding_idx].set(0.0)
        return shape + (dim,), {"E": E}, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise TypeError(
                f"{name}: expected integer token ids, got dtype {inputs.dtype}. Cast them, e.g. ids.astype(jnp.int32)."
            )
        table = params["E"]
        # a table of another vocabulary would take its own ids as the valid ones
        check_param_shapes(name, params, {"E": (vocab_size, dim)})
        n = table.shape[0]
        _check_concrete_ids(name, inputs, n)
        # int32 indices unless the ids are 64-bit: `n` must fit (uint8 ids, vocab 256), and
        # uint32 ids past 2**31 wrap negative, which the range check below catches.
        ids = inputs if inputs.dtype.itemsize >= 8 else inputs.astype(jnp.int32)
        ids = jnp.where((ids >= 0) & (ids < n), ids, n)
        out = _mesh.gather(table, ids, mode="fill", fill_value=jnp.nan)
        if max_norm is not None:  # torch's renorm is under no_grad: the lookup's gradient
            out = out + jax.lax.stop_gradient(out * _renorm_scale(out, max_norm, norm_type) - out)
        if scale_grad_by_freq:
            counts = jnp.zeros((n + 1,), jnp.int32).at[ids].add(1)
            out = _grad_by_inverse_freq(out, counts[ids])
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
        raise ValueError(
            f"{layer}: ids must be in [0, {n}), found {found}. Check vocab_size "
            f"(the largest id + 1) and the tokenizer. Under jit such ids are not "
            f"checked and give rows of NaN."
        )


def TiedEmbedding(
    vocab_size: int, dim: int, body: Optional[Layer] = None, E_init: Optional[Initializer] = None
) -> Layer:
    """Token embedding, ``body``, and an output head that reuses the embedding table.

    ```
    h = body(E[ids])              ids: integers S -> h: S + (dim,)
    logits = h @ E^T              -> S + (vocab_size,)
    ```

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

    Args:
      vocab_size: the number of ids, and of output logits, a positive int.
      dim: the size of each embedding vector, a positive int.
      body: a layer mapping ``S + (dim,)`` to ``S + (dim,)``, run between the lookup and
        the head; None for none (the identity).
      E_init: the table's initializer; None for ``initializers.normal(1.0)``, as
        :func:`Embedding`.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` with
      ``input_shape`` ``S`` gives ``(S + (vocab_size,), params, state)`` (the logits'
      shape) with params ``{"E": (vocab_size, dim)}``, plus ``"body"``, the body's
      params, when there is a body, and state the body's state (``()`` without one).

    Raises:
      ArgumentError: ``vocab_size`` or ``dim`` not a positive int.
      MismatchError: at ``apply``, a table not of shape ``(vocab_size, dim)``.
      ValueError: a ``body`` that changes the shape (at init); out-of-range ids
        outside ``jit``, as :func:`Embedding`.
      TypeError: non-integer ids.

    Examples:
      >>> from funcnet.layers import Dense
      >>> init, apply = TiedEmbedding(10, 4, body=Dense(4))
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 6))
      >>> out_shape, params["E"].shape, sorted(params)  # logits over the 10 ids
      ((-1, 6, 10), (10, 4), ['E', 'body'])
      >>> apply(params, state, jnp.zeros((2, 6), jnp.int32))[0].shape
      (2, 6, 10)
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
                raise ValueError(
                    f"{name}: the body must keep the shape {tuple(shape)} (its "
                    f"output feeds the tied head), but maps it to {tuple(out)}."
                )
        return shape[:-1] + (vocab_size,), params, state

    def apply(params, state, inputs, *, rng=None, train=False):
        # here, not in the lookup, so the error names this layer (the head reads E too)
        check_param_shapes(name, params, {"E": (vocab_size, dim)})
        h, _ = lookup.apply({"E": params["E"]}, (), inputs)
        if body is not None:
            h, state = body.apply(params["body"], state, h, rng=rng, train=train)
        # the head in h's dtype (a bf16 policy casts E too); logits as torch's lm_head
        return linear(h, params["E"].astype(h.dtype).T), state

    return named(name, init, apply)
