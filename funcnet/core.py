"""The layer contract: a layer is a pair of pure functions.

- ``init(rng, input_shape) -> (output_shape, params, state)`` computes the output
  shape from the input shape alone (the layer is never run), draws the parameters
  from ``rng`` and builds the initial state. ``input_shape`` is a tuple of ints whose
  leading (batch) entries may be -1.
- ``apply(params, state, inputs, *, rng=None, train=False) -> (outputs, new_state)``
  runs the layer. ``params`` and ``state`` are plain pytrees (dicts and tuples of
  arrays). A layer without state has ``state == ()`` and returns it unchanged; a
  combinator's state has one entry per child, and ``()`` is accepted for a network
  whose layers are all stateless (stateful layers check their state with
  :func:`need_state`, so ``()`` reaching one names it). Layers that need randomness
  (Dropout) read ``rng``; combinators split it so every sub-layer gets an
  independent key.

This module holds the ``Layer`` NamedTuple and the small shape-checking helpers
that every layer family uses to turn bad input into an error a person can act on.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Collection, Iterator, NamedTuple, Optional, Sequence, Tuple

import jax
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet.errors import MismatchError

__all__ = [
    "Layer",
    "named",
    "as_layer",
    "InitRecord",
    "record_inits",
    "MismatchError",
    "describe_tree",
    "split_rng",
    "check_shape",
    "check_known",
    "check_input",
    "check_param_shapes",
    "normalize_axis",
    "as_tuple",
    "need_rng",
    "need_state",
    "Shape",
    "PyTree",
    "InitFn",
    "ApplyFn",
]

Shape = Tuple[int, ...]
"""A shape with its batch axis first, as ``init`` takes it; ``-1`` marks an unknown size."""
PyTree = Any
"""Any JAX pytree: nested tuples, lists and dicts of arrays (params, state, batches)."""
InitFn = Callable[[jax.Array, Shape], Tuple[Any, PyTree, PyTree]]
"""``init(rng, input_shape) -> (output_shape, params, state)``."""
ApplyFn = Callable[..., Tuple[Any, PyTree]]
"""``apply(params, state, inputs, *, rng=None, train=False) -> (outputs, new_state)``."""


class Layer(NamedTuple):
    """A layer: ``(init, apply)``. Unpacks like stax: ``init, apply = Dense(10)``.

    Attributes:
      init: ``init(rng, input_shape) -> (output_shape, params, state)``: computes the
        output shape from the input shape alone, draws the params from ``rng`` and builds
        the initial state.
      apply: runs the layer, ``apply(params, state, inputs, *, rng=None, train=False)``
        returning ``(outputs, new_state)``; ``rng`` is read by layers that need
        randomness, ``train`` switches training behaviour (dropout, batch statistics).

    Examples:
      >>> def init(rng, input_shape):
      ...     return input_shape, (), ()
      >>> def apply(params, state, x, *, rng=None, train=False):
      ...     return 2 * x, state
      >>> init_fn, apply_fn = layer = Layer(init, apply)
      >>> layer.apply((), (), jnp.ones(2))[0]
      Array([2., 2.], dtype=float32)
    """

    init: InitFn
    apply: ApplyFn

    @property
    def name(self) -> str:
        """The name shown by :func:`funcnet.summary` and in error messages."""
        return getattr(self.init, "layer_name", None) or getattr(self.init, "__qualname__", "Layer")


# --------------------------------------------------------------------------- #
# Naming and the init recorder behind funcnet.summary.
# --------------------------------------------------------------------------- #


class InitRecord(NamedTuple):
    """One row of a model summary: a layer's ``init`` call.

    Attributes:
      depth: how many named layers enclose this one (0 for the outermost).
      name: the layer's name, as :func:`named` gave it.
      input_shape: the shape its ``init`` got.
      output_shape: the shape its ``init`` returned.
      params: the params its ``init`` returned (a combinator's include its children's).
      state: the state its ``init`` returned.

    Examples:
      >>> from funcnet.layers import Dense
      >>> with record_inits() as rows:
      ...     _ = Dense(4).init(jax.random.key(0), (-1, 3))
      >>> row = rows[0]
      >>> row.depth, row.name, row.input_shape, row.output_shape
      (0, 'Dense(4)', (-1, 3), (-1, 4))
    """

    depth: int
    name: str
    input_shape: Any
    output_shape: Any
    params: PyTree
    state: PyTree


_RECORDER: contextvars.ContextVar = contextvars.ContextVar("funcnet_init_recorder", default=None)


@contextlib.contextmanager
def record_inits() -> Iterator[list[InitRecord]]:
    """Collects an :class:`InitRecord` for every named layer initialised inside.

    Used by :func:`funcnet.summary`: the table comes from running ``init`` once,
    so combinators need not describe their children.

    Yields:
      The list the :class:`InitRecord` rows are appended to, parents before their
        children, in the order ``init`` ran.

    Examples:
      >>> from funcnet.combinators import serial
      >>> from funcnet.layers import Dense, Relu
      >>> with record_inits() as rows:
      ...     _ = serial(Dense(4), Relu).init(jax.random.key(0), (-1, 3))
      >>> [(r.depth, r.name) for r in rows]
      [(0, 'serial'), (1, 'Dense(4)'), (1, 'Relu')]
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

    Args:
      name: the name :func:`funcnet.summary` and error messages show.
      init: ``init(rng, input_shape) -> (output_shape, params, state)``.
      apply: ``apply(params, state, inputs, *, rng=None, train=False) -> (outputs, state)``.

    Returns:
      The layer, a :class:`Layer`; its ``init`` checks that ``rng`` is a PRNG key.

    Examples:
      >>> double = named("Double", lambda rng, s: (s, (), ()),
      ...                lambda p, s, x, *, rng=None, train=False: (2 * x, s))
      >>> double.name, double.init(jax.random.key(0), (-1, 3))
      ('Double', ((-1, 3), (), ()))
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
    """Accepts a Layer or any ``(init, apply)`` pair; rejects everything else.

    Args:
      layer: a :class:`Layer` or an ``(init, apply)`` pair of callables.
      where: who asks, named in the error.

    Returns:
      ``layer`` as a named :class:`Layer`.

    Raises:
      TypeError: ``layer`` is not an ``(init, apply)`` pair (a hint says so when it is
        a layer constructor that was not called).

    Examples:
      >>> from funcnet.layers import Dense
      >>> layer = as_layer((lambda rng, s: (s, (), ()), lambda p, s, x, **kw: (x, s)))
      >>> isinstance(layer, Layer)
      True
      >>> as_layer(Dense, "serial")
      Traceback (most recent call last):
      TypeError: serial: expected a funcnet Layer (an (init, apply) pair), got function. It
      looks like a layer constructor: call it, e.g. Dense(...).
    """
    if isinstance(layer, Layer):
        return layer if getattr(layer.init, "layer_name", None) else named(layer.name, *layer)
    if isinstance(layer, tuple) and len(layer) == 2 and all(map(callable, layer)):
        return named(getattr(layer[0], "__qualname__", "Layer"), *layer)
    if callable(layer):
        hint = f" It looks like a layer constructor: call it, e.g. {getattr(layer, '__name__', 'Layer')}(...)."
    else:
        hint = ""
    raise TypeError(f"{where}: expected a funcnet Layer (an (init, apply) pair), got {type(layer).__name__}.{hint}")


# --------------------------------------------------------------------------- #
# Shape and argument checks. All run in Python on static shapes, so under jit
# they cost nothing: they fire once, at trace time.
# --------------------------------------------------------------------------- #


def check_shape(
    layer: str,
    input_shape: Sequence[int],
    *,
    min_rank: int = 1,
    max_rank: int | None = None,
    rank: int | None = None,
    what: str = "input",
) -> Shape:
    """Validates an ``input_shape`` given to ``init`` and returns it as a tuple of ints.

    Entries must be ints, either positive or -1 (unknown, e.g. the batch).

    Args:
      layer: the layer's name, for the error.
      input_shape: the shape ``init`` got.
      min_rank: the smallest rank accepted.
      max_rank: the largest rank accepted (None: any).
      rank: the one rank accepted (None: any within ``min_rank``/``max_rank``).
      what: what the shape is of, for the error.

    Returns:
      ``input_shape`` as a tuple of ints.

    Raises:
      TypeError: ``input_shape`` is not a sequence of ints.
      ValueError: an entry is neither positive nor -1, or the rank is out of range.

    Examples:
      >>> check_shape("Dense", [-1, 3])
      (-1, 3)
      >>> check_shape("Conv", (-1, 3), min_rank=3)
      Traceback (most recent call last):
      ValueError: Conv: expected an input of rank >= 3, got rank 2 shape (-1, 3).
    """
    if not isinstance(input_shape, (tuple, list)):
        raise TypeError(
            f"{layer}: input_shape must be a tuple of ints, got {type(input_shape).__name__} {input_shape!r}."
        )
    if not all(checks.is_int(d) for d in input_shape):
        raise TypeError(
            f"{layer}: input_shape must contain only ints (use -1 for an unknown "
            f"batch size), got {tuple(input_shape)!r}."
        )
    shape = tuple(int(d) for d in input_shape)
    if any(d < 1 and d != -1 for d in shape):
        raise ValueError(f"{layer}: input_shape entries must be positive or -1, got {shape}.")
    if rank is not None and len(shape) != rank:
        raise ValueError(f"{layer}: expected a rank-{rank} {what} shape, got rank {len(shape)} shape {shape}.")
    if len(shape) < min_rank or (max_rank is not None and len(shape) > max_rank):
        want = f"rank {min_rank}" + (f" to {max_rank}" if max_rank not in (None, min_rank) else "")
        if max_rank is None:
            want = f"rank >= {min_rank}"
        raise ValueError(f"{layer}: expected an {what} of {want}, got rank {len(shape)} shape {shape}.")
    return shape


_PARAMS_HINT = (
    "These params were made for another model, or another configuration of this "
    "one: pass the params this layer's init returned (re-run init), or load the "
    "checkpoint saved from this architecture."
)


def check_param_shapes(layer: str, params: PyTree, expected: dict) -> None:
    """Trace-time check that the params ``layer`` reads have the shapes it was built for.

    ``expected`` maps each param name to its shape, None standing for a size the input
    decides (a Dense kernel's rows, which :func:`funcnet.core.check_input` compares
    with the input). Without this, params of a wider or narrower layer run and give
    an output of their width, not the layer's (a ``(32, 65)`` kernel makes ``Dense(50)``
    return 65 features): ``matmul`` and broadcasting accept them. Shapes are static, so
    the check costs no step. Only names present are looked at: params that are not a
    dict, or lack a name, fail as the layer reads them, where the combinators tell
    params of another network, or params and state swapped, from the layer's own bug.

    Args:
      layer: the layer's name, for the message.
      params: the params the layer's apply was given.
      expected: param name -> the shape it was built for (None: any size on that axis).

    Raises:
      MismatchError: a param of another shape; inside a combinator it also names the
        layer's place in the network.

    Examples:
      >>> check_param_shapes("Dense", {"W": jnp.ones((4, 3)), "b": jnp.ones(3)},
      ...                    {"W": (None, 3), "b": (3,)})        # fits: no error
      >>> try:
      ...     check_param_shapes("Dense", {"W": jnp.ones((4, 5))}, {"W": (None, 3)})
      ... except MismatchError as e:
      ...     print(str(e).split(".")[0])
      Dense: params['W'] has shape (4, 5), but Dense was built for (4, 3): 5 on axis 1 where Dense has 3
    """
    if not isinstance(params, dict):
        return
    for key, want in expected.items():
        got = tuple(getattr(params[key], "shape", ())) if key in params else want
        if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
            raise _params_mismatch(layer, params, expected, key, got)


def _params_mismatch(layer, params, expected, key, got) -> MismatchError:
    def known(k):  # sizes the input decides shown as given, where the rank agrees
        want, has = expected[k], tuple(getattr(params.get(k), "shape", ()))
        return tuple(h if w is None else w for w, h in zip(want, has)) if len(has) == len(want) else want

    def text(shape):
        inner = ", ".join("?" if d is None else str(d) for d in shape)
        return f"({inner},)" if len(shape) == 1 else f"({inner})"

    want = known(key)
    if len(got) != len(want):
        where = f": rank {len(got)} where it needs rank {len(want)}"
    else:
        i = next(i for i, (w, g) in enumerate(zip(want, got)) if w is not None and w != g)
        where = f": {got[i]} on axis {i} where {layer} has {want[i]}"
    message = f"{layer}: params[{key!r}] has shape {got}, but {layer} was built for {text(want)}{where}. {_PARAMS_HINT}"
    expected_text = (
        "{"
        + ", ".join(
            f"{k!r}: {getattr(params.get(k), 'dtype', 'float32')}[{text(known(k))[1:-1].rstrip(',')}]"
            for k in sorted(expected)
        )
        + "}"
    )
    return MismatchError(
        layer, "params", layer, expected_text, describe_tree(params), hint=_PARAMS_HINT, message=message
    )


def check_known(layer: str, shape: Shape, axes: Sequence[int], what: str) -> None:
    """Raises if any of ``axes`` is -1: those sizes are needed to build params.

    Args:
      layer: the layer's name, for the error.
      shape: the checked input shape.
      axes: the axes whose sizes the params need.
      what: what those axes hold, for the error.

    Returns:
      None, when every one of ``axes`` has a known size.

    Raises:
      ValueError: one of ``axes`` is -1.

    Examples:
      >>> check_known("Dense", (-1, 3), [-1], "feature size")
      >>> check_known("Dense", (2, -1), [-1], "feature size")
      Traceback (most recent call last):
      ValueError: Dense: the feature size (axis -1) of the input shape must be known ...
    """
    for ax in axes:
        if shape[ax] == -1:
            raise ValueError(
                f"{layer}: the {what} (axis {ax}) of the input shape must be known "
                f"to create parameters, got {shape}. Only batch entries may be -1."
            )


def check_input(
    layer: str,
    inputs: ArrayLike,
    *,
    rank: int | None = None,
    min_rank: int | None = None,
    axis: int | None = None,
    size: int | None = None,
    what: str = "features",
) -> None:
    """Trace-time check of an ``apply`` input against what the params expect.

    Args:
      layer: the layer's name, for the error.
      inputs: the array ``apply`` got.
      rank: the one rank accepted (None: any).
      min_rank: the smallest rank accepted (None: any).
      axis: the axis whose size the params fix.
      size: the size the params were built for on ``axis``.
      what: what ``axis`` holds, for the error.

    Returns:
      None, when ``inputs`` is what the params expect.

    Raises:
      TypeError: ``inputs`` is not an array.
      ValueError: the rank or the size on ``axis`` is not what the params expect.

    Examples:
      >>> check_input("Dense", jnp.ones((2, 3)), axis=-1, size=3)
      >>> check_input("Dense", jnp.ones((2, 5)), axis=-1, size=3)
      Traceback (most recent call last):
      ValueError: Dense: input has 5 features on axis -1 but the params were built for 3: ...
    """
    shape = getattr(inputs, "shape", None)
    if shape is None:
        raise TypeError(f"{layer}: expected an array input, got {type(inputs).__name__}.")
    if rank is not None and len(shape) != rank:
        raise ValueError(f"{layer}: expected a rank-{rank} input, got shape {tuple(shape)} (rank {len(shape)}).")
    if min_rank is not None and len(shape) < min_rank:
        raise ValueError(f"{layer}: expected an input of rank >= {min_rank}, got shape {tuple(shape)}.")
    if axis is not None and size is not None and shape[axis] != size:
        expected = list(shape)
        expected[axis] = size
        raise ValueError(
            f"{layer}: input has {shape[axis]} {what} on axis {axis} but the params "
            f"were built for {size}: expected shape {tuple(expected)}, got "
            f"{tuple(shape)}. Re-run init with the right input_shape."
        )


def normalize_axis(layer: str, axis: int, rank: int) -> int:
    """``axis`` of a rank-``rank`` input as a non-negative int.

    Args:
      layer: the layer's name, for the error.
      axis: the axis, negative counting from the end.
      rank: the input's rank.

    Returns:
      ``axis`` in ``range(rank)``.

    Raises:
      ValueError: ``axis`` is not an int in ``[-rank, rank)``.

    Examples:
      >>> normalize_axis("Softmax", -1, 3)
      2
    """
    if not checks.is_int(axis) or not -rank <= axis < rank:
        raise ValueError(f"{layer}: axis {axis!r} is out of range for a rank-{rank} input.")
    return int(axis) % rank


def as_tuple(layer: str, value: int | Sequence[int], n: int, what: str) -> Tuple[int, ...]:
    """An int or a length-``n`` sequence of positive ints, as a tuple.

    Args:
      layer: the layer's name, for the error.
      value: an int, or a sequence of ``n`` ints.
      n: the length wanted (e.g. the number of spatial axes).
      what: what ``value`` is, for the error.

    Returns:
      A tuple of ``n`` positive ints.

    Raises:
      ValueError: ``value`` is neither a positive int nor ``n`` positive ints.

    Examples:
      >>> as_tuple("Conv", 3, 2, "kernel_size"), as_tuple("Conv", (3, 1), 2, "kernel_size")
      ((3, 3), (3, 1))
    """
    if checks.is_int(value):
        value = (value,) * n
    value = tuple(value)
    if len(value) != n or not all(checks.is_int(v) and v > 0 for v in value):
        raise ValueError(f"{layer}: {what} must be a positive int or {n} positive ints, got {value!r}.")
    return tuple(int(v) for v in value)


def need_rng(layer: str, rng: Optional[jax.Array]) -> jax.Array:
    """``rng`` itself, or an error naming ``layer`` when it is None (train mode needs one).

    Args:
      layer: the layer's name, for the error.
      rng: the key ``apply`` got.

    Returns:
      ``rng``.

    Raises:
      ValueError: ``rng`` is None.

    Examples:
      >>> need_rng("Dropout", None)
      Traceback (most recent call last):
      ValueError: Dropout: train=True needs randomness, but apply got rng=None. ...
    """
    if rng is None:
        raise ValueError(
            f"{layer}: train=True needs randomness, but apply got rng=None. Pass "
            f"apply(params, state, x, rng=jax.random.key(...), train=True)."
        )
    return rng


def need_state(layer: str, state: PyTree, keys: Collection[str]) -> None:
    """Raises unless ``state`` is the dict of ``keys`` a stateful layer keeps.

    Stateful layers call it first in ``apply``, so ``state=()`` (accepted for
    networks of stateless layers) reaching one is an error that names it.

    Args:
      layer: the layer's name, for the error.
      state: the state ``apply`` got.
      keys: the keys the layer's state holds.

    Returns:
      None, when ``state`` is a dict holding ``keys``.

    Raises:
      ValueError: ``state`` is not a dict holding ``keys``.

    Examples:
      >>> need_state("BatchNorm", {"mean": 0, "var": 1}, ["mean", "var"])
      >>> need_state("BatchNorm", (), ["mean", "var"])
      Traceback (most recent call last):
      ValueError: BatchNorm: apply needs this layer's state ['mean', 'var'], got (). ...
    """
    if not isinstance(state, dict) or not set(keys) <= set(state):
        got = sorted(state) if isinstance(state, dict) else repr(state)
        swapped = (
            " (Are params and state swapped? apply takes params first: apply(params, state, x).)"
            if isinstance(state, dict) and state
            else ""
        )
        raise ValueError(
            f"{layer}: apply needs this layer's state {sorted(keys)}, got {got}. "
            f"Pass the state returned by init (or by the last apply); state=() "
            f"is accepted only by networks whose layers are all stateless.{swapped}"
        )


def describe_tree(tree: PyTree, limit: int = 300) -> str:
    """A short picture of a params/state pytree: ``{'W': float32[4, 3], 'b': float32[3]}``.

    Args:
      tree: a pytree of arrays (dicts, tuples, lists).
      limit: the longest text returned; longer ones end in ``...``.

    Returns:
      The text: arrays as ``dtype[shape]``, other leaves as their type's name.

    Examples:
      >>> describe_tree({"W": jnp.zeros((4, 3)), "b": jnp.zeros(3)})
      "{'W': float32[4, 3], 'b': float32[3]}"
    """

    def show(t):
        if isinstance(t, dict):
            items = sorted(t.items(), key=lambda kv: str(kv[0]))
            return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in items) + "}"
        if isinstance(t, (tuple, list)):
            inner = ", ".join(show(v) for v in t)
            return (
                f"({inner},)"
                if isinstance(t, tuple) and len(t) == 1
                else (f"({inner})" if isinstance(t, tuple) else f"[{inner}]")
            )
        shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
        if shape is not None and dtype is not None:
            return f"{dtype}{list(shape)}"
        return type(t).__name__

    text = show(tree)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def split_rng(rng: Optional[jax.Array], n: int) -> Tuple[Optional[jax.Array], ...]:
    """``n`` independent keys, or ``n`` Nones when there is no key.

    Args:
      rng: a PRNG key, or None.
      n: how many keys.

    Returns:
      A tuple of ``n`` keys, or of ``n`` Nones.

    Examples:
      >>> len(split_rng(jax.random.key(0), 3)), split_rng(None, 2)
      (3, (None, None))
    """
    if rng is None:
        return (None,) * n
    return tuple(jax.random.split(rng, n))
