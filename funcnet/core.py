"""The layer contract: a layer is a pair of pure functions.

``init(rng, input_shape) -> (output_shape, params, state)``
    Computes the output shape from the input shape alone (the layer is never
    run), draws the parameters from ``rng`` and builds the initial state.
    ``input_shape`` is a tuple of ints whose leading (batch) entries may be -1.

``apply(params, state, inputs, *, rng=None, train=False) -> (outputs, new_state)``
    Runs the layer. ``params`` and ``state`` are plain pytrees (dicts and tuples
    of arrays). A layer without state has ``state == ()`` and returns it
    unchanged; a combinator's state has one entry per child, and ``()`` is
    accepted for a network whose layers are all stateless (stateful layers check
    their state with :func:`need_state`, so ``()`` reaching one names it).
    Layers that need randomness (Dropout) read ``rng``; combinators split it so
    every sub-layer gets an independent key.

This module holds the ``Layer`` NamedTuple and the small shape-checking helpers
that every layer family uses to turn bad input into an error a person can act on.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, NamedTuple, Sequence, Tuple

import jax

from funcnet import _checks as checks
from funcnet.errors import MismatchError

__all__ = ["Layer", "named", "as_layer", "InitRecord", "record_inits", "MismatchError",
           "describe_tree", "split_rng", "check_shape", "check_known", "check_input",
           "normalize_axis", "as_tuple", "need_rng", "need_state", "Shape", "PyTree", "InitFn",
           "ApplyFn"]

Shape = Tuple[int, ...]
PyTree = Any
InitFn = Callable[[jax.Array, Shape], Tuple[Any, PyTree, PyTree]]
ApplyFn = Callable[..., Tuple[Any, PyTree]]


class Layer(NamedTuple):
    """A layer: ``(init, apply)``. Unpacks like stax: ``init, apply = Dense(10)``."""

    init: InitFn
    apply: ApplyFn

    @property
    def name(self) -> str:
        """The name shown by :func:`funcnet.summary` and in error messages."""
        return getattr(self.init, "layer_name", None) or getattr(
            self.init, "__qualname__", "Layer")


# --------------------------------------------------------------------------- #
# Naming and the init recorder behind funcnet.summary.
# --------------------------------------------------------------------------- #

class InitRecord(NamedTuple):
    """One row of a model summary: a layer's ``init`` call."""

    depth: int
    name: str
    input_shape: Any
    output_shape: Any
    params: PyTree
    state: PyTree


_RECORDER: contextvars.ContextVar = contextvars.ContextVar("funcnet_init_recorder", default=None)


@contextlib.contextmanager
def record_inits():
    """Collects an :class:`InitRecord` for every named layer initialised inside.

    Used by :func:`funcnet.summary`: the table comes from running ``init`` once,
    so combinators need not describe their children.
    """
    rows: list = []
    token = _RECORDER.set([rows, 0])
    try:
        yield rows
    finally:
        _RECORDER.reset(token)


def named(name: str, init: InitFn, apply: ApplyFn) -> Layer:
    """Builds a :class:`Layer` whose ``init`` is recorded under ``name``.

    Every funcnet layer constructor returns ``named(...)``; user layers may too,
    which makes them show up in :func:`funcnet.summary`.
    """

    @functools.wraps(init)
    def recorded_init(rng, input_shape):
        checks.prng_key(f"{name}.init", rng)  # an int seed fails deep in jax.random otherwise
        recorder = _RECORDER.get()
        if recorder is None:
            return init(rng, input_shape)
        rows, depth = recorder
        index = len(rows)
        rows.append(None)  # placeholder keeps parents ahead of their children
        recorder[1] = depth + 1
        try:
            out_shape, params, state = init(rng, input_shape)
        finally:
            recorder[1] = depth
        rows[index] = InitRecord(depth, name, input_shape, out_shape, params, state)
        return out_shape, params, state

    recorded_init.layer_name = name
    return Layer(recorded_init, apply)


def as_layer(layer: Any, where: str = "combinator") -> Layer:
    """Accepts a Layer or any ``(init, apply)`` pair; rejects everything else."""
    if isinstance(layer, Layer):
        return layer if getattr(layer.init, "layer_name", None) else named(layer.name, *layer)
    if isinstance(layer, tuple) and len(layer) == 2 and all(map(callable, layer)):
        return named(getattr(layer[0], "__qualname__", "Layer"), *layer)
    if callable(layer):
        hint = (f" It looks like a layer constructor: call it, e.g. {getattr(layer, '__name__', 'Layer')}(...).")
    else:
        hint = ""
    raise TypeError(f"{where}: expected a funcnet Layer (an (init, apply) pair), got "
                    f"{type(layer).__name__}.{hint}")


# --------------------------------------------------------------------------- #
# Shape and argument checks. All run in Python on static shapes, so under jit
# they cost nothing: they fire once, at trace time.
# --------------------------------------------------------------------------- #


def check_shape(layer: str, input_shape, *, min_rank: int = 1, max_rank: int | None = None,
                rank: int | None = None, what: str = "input") -> Shape:
    """Validates an ``input_shape`` given to ``init`` and returns it as a tuple of ints.

    Entries must be ints, either positive or -1 (unknown, e.g. the batch).
    """
    if not isinstance(input_shape, (tuple, list)):
        raise TypeError(f"{layer}: input_shape must be a tuple of ints, got "
                        f"{type(input_shape).__name__} {input_shape!r}.")
    if not all(checks.is_int(d) for d in input_shape):
        raise TypeError(f"{layer}: input_shape must contain only ints (use -1 for an unknown "
                        f"batch size), got {tuple(input_shape)!r}.")
    shape = tuple(int(d) for d in input_shape)
    if any(d < 1 and d != -1 for d in shape):
        raise ValueError(f"{layer}: input_shape entries must be positive or -1, got {shape}.")
    if rank is not None and len(shape) != rank:
        raise ValueError(f"{layer}: expected a rank-{rank} {what} shape, got rank {len(shape)} "
                         f"shape {shape}.")
    if len(shape) < min_rank or (max_rank is not None and len(shape) > max_rank):
        want = f"rank {min_rank}" + (f" to {max_rank}" if max_rank not in (None, min_rank) else "")
        if max_rank is None:
            want = f"rank >= {min_rank}"
        raise ValueError(f"{layer}: expected an {what} of {want}, got rank {len(shape)} shape {shape}.")
    return shape


def check_known(layer: str, shape: Shape, axes: Sequence[int], what: str) -> None:
    """Raises if any of ``axes`` is -1: those sizes are needed to build params."""
    for ax in axes:
        if shape[ax] == -1:
            raise ValueError(f"{layer}: the {what} (axis {ax}) of the input shape must be known "
                             f"to create parameters, got {shape}. Only batch entries may be -1.")


def check_input(layer: str, inputs, *, rank: int | None = None, min_rank: int | None = None,
                axis: int | None = None, size: int | None = None, what: str = "features") -> None:
    """Trace-time check of an ``apply`` input against what the params expect."""
    shape = getattr(inputs, "shape", None)
    if shape is None:
        raise TypeError(f"{layer}: expected an array input, got {type(inputs).__name__}.")
    if rank is not None and len(shape) != rank:
        raise ValueError(f"{layer}: expected a rank-{rank} input, got shape {tuple(shape)} "
                         f"(rank {len(shape)}).")
    if min_rank is not None and len(shape) < min_rank:
        raise ValueError(f"{layer}: expected an input of rank >= {min_rank}, got shape "
                         f"{tuple(shape)}.")
    if axis is not None and size is not None and shape[axis] != size:
        expected = list(shape)
        expected[axis] = size
        raise ValueError(f"{layer}: input has {shape[axis]} {what} on axis {axis} but the params "
                         f"were built for {size}: expected shape {tuple(expected)}, got "
                         f"{tuple(shape)}. Re-run init with the right input_shape.")


def normalize_axis(layer: str, axis: int, rank: int) -> int:
    if not checks.is_int(axis) or not -rank <= axis < rank:
        raise ValueError(f"{layer}: axis {axis!r} is out of range for a rank-{rank} input.")
    return int(axis) % rank


def as_tuple(layer: str, value, n: int, what: str) -> Tuple[int, ...]:
    """An int or a length-``n`` sequence of positive ints, as a tuple."""
    if checks.is_int(value):
        value = (value,) * n
    value = tuple(value)
    if len(value) != n or not all(checks.is_int(v) and v > 0 for v in value):
        raise ValueError(f"{layer}: {what} must be a positive int or {n} positive ints, "
                         f"got {value!r}.")
    return tuple(int(v) for v in value)


def need_rng(layer: str, rng) -> jax.Array:
    if rng is None:
        raise ValueError(f"{layer}: train=True needs randomness, but apply got rng=None. Pass "
                         f"apply(params, state, x, rng=jax.random.key(...), train=True).")
    return rng


def need_state(layer: str, state, keys) -> None:
    """Raises unless ``state`` is the dict of ``keys`` a stateful layer keeps.

    Stateful layers call it first in ``apply``, so ``state=()`` (accepted for
    networks of stateless layers) reaching one is an error that names it.
    """
    if not isinstance(state, dict) or not set(keys) <= set(state):
        got = sorted(state) if isinstance(state, dict) else repr(state)
        swapped = (" (Are params and state swapped? apply takes params first: "
                   "apply(params, state, x).)" if isinstance(state, dict) and state else "")
        raise ValueError(f"{layer}: apply needs this layer's state {sorted(keys)}, got {got}. "
                         f"Pass the state returned by init (or by the last apply); state=() "
                         f"is accepted only by networks whose layers are all stateless.{swapped}")


def describe_tree(tree, limit: int = 300) -> str:
    """A short picture of a params/state pytree: ``{'W': float32[4, 3], 'b': float32[3]}``."""
    def show(t):
        if isinstance(t, dict):
            items = sorted(t.items(), key=lambda kv: str(kv[0]))
            return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in items) + "}"
        if isinstance(t, (tuple, list)):
            inner = ", ".join(show(v) for v in t)
            return f"({inner},)" if isinstance(t, tuple) and len(t) == 1 else (
                f"({inner})" if isinstance(t, tuple) else f"[{inner}]")
        shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
        if shape is not None and dtype is not None:
            return f"{dtype}{list(shape)}"
        return type(t).__name__
    text = show(tree)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def split_rng(rng, n: int):
    """``n`` independent keys, or ``n`` Nones when there is no key."""
    if rng is None:
        return (None,) * n
    return tuple(jax.random.split(rng, n))

