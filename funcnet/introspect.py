"""Looking inside a network without running it: parameter counts and ``summary``."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np

from funcnet.core import InitRecord, Layer, PyTree, as_layer, record_inits

__all__ = ["count", "Summary", "summary"]


def count(tree: PyTree) -> int:
    """Number of scalars in a pytree of arrays (typed PRNG keys count as one each).

    Args:
      tree: a pytree of arrays (params, state, grads).

    Returns:
      The total number of scalars, a Python int.

    Examples:
      >>> count({"W": jnp.zeros((3, 4)), "b": jnp.zeros(4)})
      16
    """
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(tree)))


class Summary(NamedTuple):
    """What :func:`summary` found: one row per layer, the totals, and the printed table.

    Attributes:
      rows: one :class:`~funcnet.core.InitRecord` per named layer, a tuple, parents
        before their children in the order ``init`` ran.
      output_shape: the network's output shape, as its ``init`` returned it.
      total_params: the number of scalars in the network's params (:func:`count`).
      total_state: the number of scalars in the network's state.
      table: the printed table, as text (also ``str()`` of the summary).

    Examples:
      >>> from funcnet.layers import Dense
      >>> s = summary(Dense(4), (-1, 3), print_fn=None)
      >>> s.output_shape, s.total_params, s.total_state, len(s.rows)
      ((-1, 4), 16, 0, 1)
    """

    rows: tuple
    output_shape: object
    total_params: int
    total_state: int
    table: str

    def __str__(self):
        return self.table


def summary(
    layer: Layer,
    input_shape: Sequence[Any],
    *,
    rng: Optional[jax.Array] = None,
    print_fn: Optional[Callable[[str], None]] = print,
) -> Summary:
    """Tabulates every layer: name, output shape, parameter count, state count, and totals.

    Like Keras' ``model.summary()`` and MXNet's ``print_summary``. Runs ``init``
    once (shapes only matter, so any ``rng`` will do) and nothing else. Children
    of combinators are indented under them; a combinator's counts include its
    children's. Pass ``print_fn=None`` to get the table without printing it.

    Args:
      layer: the network, a :class:`~funcnet.core.Layer`.
      input_shape: the shape ``init`` gets (-1 for the batch).
      rng: the key ``init`` gets (default ``jax.random.key(0)``).
      print_fn: called with the table (default ``print``); None prints nothing.

    Returns:
      The summary, a :class:`Summary`; ``str()`` of it is the table.

    Raises:
      TypeError: ``layer`` is not a layer.

    Examples:
      >>> from funcnet.combinators import serial
      >>> from funcnet.layers import Dense, Relu
      >>> s = summary(serial(Dense(4), Relu, Dense(2)), (-1, 3))
      Layer       Output shape  Params  State
      ---------------------------------------
      serial            (?, 2)      26      0
        Dense(4)        (?, 4)      16      0
        Relu            (?, 4)       0      0
        Dense(2)        (?, 2)      10      0
      ---------------------------------------
      Total params: 26
      Total state: 0
      Input shape: (?, 3) -> output shape: (?, 2)
    """
    layer = as_layer(layer, "summary")
    rng = jax.random.key(0) if rng is None else rng
    with record_inits() as rows:
        out_shape, params, state = layer.init(rng, input_shape)
    rows = tuple(r for r in rows if isinstance(r, InitRecord))
    total_params, total_state = count(params), count(state)

    header = ("Layer", "Output shape", "Params", "State")
    body = [
        ("  " * r.depth + r.name, _fmt_shape(r.output_shape), f"{count(r.params):,}", f"{count(r.state):,}")
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "-" * len(line(header))
    table = "\n".join(
        [
            line(header),
            rule,
            *map(line, body),
            rule,
            f"Total params: {total_params:,}",
            f"Total state: {total_state:,}",
            f"Input shape: {_fmt_shape(input_shape)} -> output shape: {_fmt_shape(out_shape)}",
        ]
    )
    if print_fn is not None:
        print_fn(table)
    return Summary(rows, out_shape, total_params, total_state, table)


def _fmt_shape(shape) -> str:
    if isinstance(shape, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in shape):
        return "(" + ", ".join("?" if d == -1 else str(int(d)) for d in shape) + ")"
    return "(" + ", ".join(_fmt_shape(s) for s in shape) + ")"
