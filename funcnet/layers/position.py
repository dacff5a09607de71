"""Positional information for sequence models: sinusoidal tables, rotary embeddings (RoPE),
and learned position tables. Sequences are (batch, time, features); attention heads are
(batch, time, heads, head_dim)."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike, DTypeLike

from funcnet import _checks as checks
from funcnet import initializers
from funcnet import _mesh
from funcnet.core import Layer, check_input, check_shape, named, need_state
from funcnet.initializers import Initializer

__all__ = ["sinusoidal_table", "rope", "LearnedPositions", "SinusoidalPositions"]


def sinusoidal_table(length: int, dim: int, *, base: float = 10000.0, dtype: DTypeLike = jnp.float32) -> jax.Array:
    """``(length, dim)``: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim)).

    Args:
      length: the number of positions, a positive int.
      dim: the number of features, a positive even int.
      base: the base of the wavelengths.
      dtype: the table's dtype.

    Returns:
      The table, an array of shape ``(length, dim)`` and dtype ``dtype``.

    Raises:
      ArgumentError: ``length`` or ``dim`` not a positive int.
      ValueError: an odd ``dim``.

    Examples:
      >>> np.round(np.asarray(sinusoidal_table(2, 4), np.float64), 3).tolist()
      [[0.0, 1.0, 0.0, 1.0], [0.841, 0.54, 0.01, 1.0]]
    """
    length = checks.positive_int("sinusoidal_table", "length", length)
    dim = checks.positive_int("sinusoidal_table", "dim", dim)
    if dim % 2:
        raise ValueError(f"sinusoidal_table: dim must be even (sin/cos pairs), got {dim}.")
    inv = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv[None, :]
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(length, dim)
    return table.astype(dtype)


def rope(x: ArrayLike, positions: Optional[ArrayLike] = None, *, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding (RoPE, Su et al. 2021) on ``x`` of shape ``(..., T, H, D)``.

    Feature ``i < D/2`` is paired with ``i + D/2`` (the "rotate-half" convention of
    GPT-NeoX and Hugging Face's Llama) and the pair is rotated by the angle
    ``p * base^(-2i/D)``, ``p`` the token's position:

    ```
    y_i       = x_i cos(a) - x_{i+D/2} sin(a)
    y_{i+D/2} = x_{i+D/2} cos(a) + x_i sin(a)
    ```

    so ``<rope(q, m), rope(k, n)>`` depends on ``m - n`` only. ``positions``: ints
    broadcastable to ``x.shape[:-2]`` (``(T,)`` or ``(B, T)``), default ``arange(T)``.
    Meta's original Llama code rotates adjacent pairs ``(x_2i, x_2i+1)`` instead; the two
    agree after permuting the features by ``[0, 2, 4, ..., 1, 3, 5, ...]`` (apply it to
    the columns of the query and key projections when loading such weights; tested).
    Angles in float32; the output has ``x``'s dtype. An odd ``D`` is a ValueError.

    Args:
      x: queries or keys, ``(..., T, H, D)`` with an even ``D``.
      positions: each token's position, ints broadcastable to ``x.shape[:-2]``
        (``(T,)`` or ``(B, T)``); None for ``arange(T)``.
      base: the base of the angles.

    Returns:
      ``x`` rotated, an array of ``x``'s shape and dtype.

    Raises:
      ValueError: an odd ``D``.

    Examples:
      >>> rope(jnp.ones((1, 3, 2, 4))).shape  # (batch, time, heads, head_dim)
      (1, 3, 2, 4)
    """
    D = x.shape[-1]
    if D % 2:
        raise ValueError(
            f"rope: rotary embeddings rotate pairs of features, so the head dim (the last axis) must be even, got {D}."
        )
    T = x.shape[-3]
    pos = jnp.arange(T) if positions is None else jnp.asarray(positions)
    half = D // 2
    inv = base ** (-jnp.arange(half, dtype=jnp.float32) * 2 / D)
    ang = pos.astype(jnp.float32)[..., None] * inv  # (..., T, half)
    cos, sin = jnp.cos(ang)[..., None, :], jnp.sin(ang)[..., None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _positions_layer(name, max_length, table_fn, params_fn, decode):
    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=3)
        return shape, params_fn(rng, shape), ({"index": jnp.zeros((), jnp.int32)} if decode else ())

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, rank=3)
        T = inputs.shape[1]
        # Lined up with (positions, features) of the input: a split over the batch's
        # axis is gathered (FSDP), one that matches the features' is kept.
        table = _mesh.at_use(table_fn(params, inputs), inputs, (1, 2))
        if T > table.shape[0]:
            raise ValueError(f"{name}: sequence of length {T} but the table has {table.shape[0]} positions.")
        if not decode:
            return inputs + table[:T].astype(inputs.dtype), state
        need_state(name, state, ("index",))
        index = state["index"]
        known = checks.concrete(index)
        if known is not None and int(known) + T > table.shape[0]:
            raise ValueError(
                f"{name}: decoding past the table: position {int(known)} + {T} "
                f"tokens but max_length is {table.shape[0]}."
            )
        rows = lax.dynamic_slice_in_dim(table, index, T, axis=0)
        return inputs + rows.astype(inputs.dtype), {"index": index + T}

    return named(name, init, apply)


def LearnedPositions(
    max_length: int, dim: Optional[int] = None, E_init: Optional[Initializer] = None, *, decode: bool = False
) -> Layer:
    """``x + E[0:T]`` on ``(B, T, dim)``: a learned position table, nanoGPT's ``wpe``.

    params ``{"E": (max_length, dim)}``, torch ``nn.Embedding``'s ``weight`` layout
    (nanoGPT's ``wpe.weight`` copies as is); ``E_init`` defaults to ``N(0, 1)`` like
    ``nn.Embedding``; ``dim`` defaults to the input's last axis. A sequence longer
    than ``max_length`` is a ValueError naming both lengths.

    ``decode=True`` is the decoding form (see :func:`funcnet.generate`): state
    ``{"index": int32}`` (0 at init), each apply adds ``E[index : index + T]`` and
    returns ``index + T``. Outside ``jit`` going past ``max_length`` is a ValueError;
    under ``jit`` ``lax.dynamic_slice`` clamps the start, so keep decoding within the
    table (``generate`` checks the length before it runs).

    Args:
      max_length: the number of positions in the table, a positive int.
      dim: the number of features; None for the input's last axis.
      E_init: the table's initializer; None for ``N(0, 1)``, as ``nn.Embedding``.
      decode: True for the decoding form, which keeps the next position in its state.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, (B, T, dim))`` gives
      ``((B, T, dim), params, state)`` with params ``{"E": (max_length, dim)}``
      (float32) and state ``()``, or ``{"index": int32}`` (0) with ``decode=True``.

    Raises:
      ArgumentError: ``max_length`` not a positive int, or ``E_init`` not an
        initializer.
      ValueError: an input not of rank 3; a sequence longer than ``max_length`` (with
        ``decode=True``, outside ``jit``: decoding past it).

    Examples:
      >>> init, apply = LearnedPositions(16)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 5, 8))
      >>> params["E"].shape, apply(params, state, jnp.zeros((2, 5, 8)))[0].shape
      ((16, 8), (2, 5, 8))
    """
    max_length = checks.positive_int("LearnedPositions", "max_length", max_length)
    name = f"LearnedPositions({max_length})"
    E_init = checks.initializer(name, "E_init", E_init) or initializers.normal(1.0)

    def params_fn(rng, shape):
        return {"E": E_init(rng, (max_length, dim or shape[-1]), jnp.float32)}

    return _positions_layer(name, max_length, lambda p, x: p["E"], params_fn, decode)


def SinusoidalPositions(max_length: int, *, base: float = 10000.0, decode: bool = False) -> Layer:
    """``x + sinusoidal_table(max_length, dim)[0:T]``: fixed positions, no params.

    ``decode=True`` as :func:`LearnedPositions`.

    Args:
      max_length: the number of positions in the table, a positive int.
      base: the base of the wavelengths, as :func:`sinusoidal_table`'s.
      decode: True for the decoding form, as :func:`LearnedPositions`'s.

    Returns:
      The layer, an ``(init, apply)`` pair without params: ``init(rng, (B, T, dim))``
      gives ``((B, T, dim), (), state)`` with state ``()``, or ``{"index": int32}`` (0)
      with ``decode=True``.

    Raises:
      ArgumentError: ``max_length`` not a positive int.
      ValueError: an odd feature dimension; a sequence longer than ``max_length``
        (with ``decode=True``, outside ``jit``: decoding past it).

    Examples:
      >>> init, apply = SinusoidalPositions(16)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 3, 4))
      >>> out_shape, params, state
      ((-1, 3, 4), (), ())
      >>> y, _ = apply(params, state, jnp.zeros((1, 3, 4)))
      >>> np.round(np.asarray(y[0], np.float64), 3).tolist()  # sinusoidal_table(16, 4)[:3]
      [[0.0, 1.0, 0.0, 1.0], [0.841, 0.54, 0.01, 1.0], [0.909, -0.416, 0.02, 1.0]]
    """
    max_length = checks.positive_int("SinusoidalPositions", "max_length", max_length)
    return _positions_layer(
        f"SinusoidalPositions({max_length})",
        max_length,
        lambda p, x: sinusoidal_table(max_length, x.shape[-1], base=base),
        lambda rng, shape: (),
        decode,
    )
