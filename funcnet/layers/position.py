"""Positional information for sequence models: sinusoidal tables, rotary embeddings (RoPE),
and learned position tables. Sequences are (batch, time, features); attention heads are
(batch, time, heads, head_dim)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet import initializers
from funcnet.core import Layer, check_input, check_shape, named, need_state

__all__ = ["sinusoidal_table", "rope", "LearnedPositions", "SinusoidalPositions"]


def sinusoidal_table(length: int, dim: int, *, base: float = 10000.0, dtype=jnp.float32):
    """``(length, dim)``: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim))."""
    length = checks.positive_int("sinusoidal_table", "length", length)
    dim = checks.positive_int("sinusoidal_table", "dim", dim)
    if dim % 2:
        raise ValueError(f"sinusoidal_table: dim must be even (sin/cos pairs), got {dim}.")
    inv = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv[None, :]
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(length, dim)
    return table.astype(dtype)


def rope(x, positions=None, *, base: float = 10000.0):
    """Rotary position embedding on ``x`` of shape ``(..., T, H, D)``, rotate-half convention."""
    D = x.shape[-1]
    if D % 2:
        raise ValueError(f"rope: the head dim must be even, got {D}.")
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
        table = table_fn(params, inputs)
        if T > table.shape[0]:
            raise ValueError(f"{name}: sequence of length {T} but the table has "
                             f"{table.shape[0]} positions.")
        if not decode:
            return inputs + table[:T].astype(inputs.dtype), state
        need_state(name, state, ("index",))
        index = state["index"]
        known = checks.concrete(index)
        if known is not None and int(known) + T > table.shape[0]:
            raise ValueError(f"{name}: decoding past the table: position {int(known)} + {T} "
                             f"tokens but max_length is {table.shape[0]}.")
        rows = lax.dynamic_slice_in_dim(table, index, T, axis=0)
        return inputs + rows.astype(inputs.dtype), {"index": index + T}

    return named(name, init, apply)


def LearnedPositions(max_length: int, dim=None, E_init=None, *, decode: bool = False) -> Layer:
    """``x + E[0:T]``: a learned position table ``{"E": (max_length, dim)}``."""
    max_length = checks.positive_int("LearnedPositions", "max_length", max_length)
    name = f"LearnedPositions({max_length})"
    E_init = checks.initializer(name, "E_init", E_init) or initializers.normal(1.0)

    def params_fn(rng, shape):
        return {"E": E_init(rng, (max_length, dim or shape[-1]), jnp.float32)}

    return _positions_layer(name, max_length, lambda p, x: p["E"], params_fn, decode)


def SinusoidalPositions(max_length: int, *, base: float = 10000.0, decode: bool = False) -> Layer:
    """``x + sinusoidal_table(max_length, dim)[0:T]``; no params."""
    max_length = checks.positive_int("SinusoidalPositions", "max_length", max_length)
    return _positions_layer(f"SinusoidalPositions({max_length})", max_length,
                            lambda p, x: sinusoidal_table(max_length, x.shape[-1], base=base),
                            lambda rng, shape: {}, decode)
