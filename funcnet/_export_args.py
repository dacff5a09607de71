"""Checks of the arguments :func:`funcnet.inference.export` and :func:`funcnet.onnx.to_onnx`
share: the input spec (shapes, ``-1`` for the batch, ``jax.ShapeDtypeStruct``s, nested in
tuples, lists and dicts), the dtype of plain shapes, and the file to write.

A private module of its own, not public names of :mod:`funcnet.inference`: they check
arguments of two public functions and are no API of their own, and neither public module
should reach into the other's private names (tests/test_private_imports.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import jax
import jax.export  # a submodule jax before 0.8 does not import by itself
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from funcnet import _checks as checks
from funcnet.core import PyTree

__all__ = ["BATCH", "SPEC_FORMS", "InputSpec", "check_dtype", "input_specs", "is_namedtuple", "dest_path"]

BATCH = "batch"  # the name of the symbolic batch dimension a -1 becomes

# One input's shape (-1 for the batch) or ShapeDtypeStruct, or tuples, lists and string-keyed
# dicts of those.
InputSpec = Union[Sequence[Any], jax.ShapeDtypeStruct, Mapping[str, Any]]


def check_dtype(where: str, name: str, dtype: DTypeLike) -> np.dtype:
    """``dtype`` as a canonical numeric (or bool) NumPy dtype, or an ArgumentError naming ``name``."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not (jnp.issubdtype(dt, jnp.number) or jnp.issubdtype(dt, jnp.bool_)):
        raise checks.ArgumentError(
            f"{where}: {name} must be a numeric dtype (jnp.float32, 'int32', ...), got {checks.got(dtype)}."
        )
    return jax.dtypes.canonicalize_dtype(dt)


SPEC_FORMS = "a shape like (-1, 784) (-1: the batch), a jax.ShapeDtypeStruct, or a tuple, list or dict of those"


def input_specs(where: str, input_spec: InputSpec, dtype: np.dtype) -> tuple[list, PyTree]:
    """The JSON leaf specs and the pytree of ShapeDtypeStructs (batch symbolic) to export."""
    batch = jax.export.symbolic_shape(BATCH)[0]
    specs, structs = [], []

    def bad(x, at, why=""):
        return checks.ArgumentError(f"{where}: input_spec{at} must be {SPEC_FORMS}, got {checks.got(x)}{why}.")

    def leaf(shape, dt, at):
        if any(d < 1 and d != -1 for d in shape):
            raise checks.ArgumentError(
                f"{where}: input_spec{at} dimensions must be positive, or -1 for the batch, got {tuple(shape)}."
            )
        specs.append({"path": at, "shape": [None if d == -1 else int(d) for d in shape], "dtype": dt.name})
        structs.append(jax.ShapeDtypeStruct(tuple(batch if d == -1 else int(d) for d in shape), dt))
        return len(structs) - 1

    def walk(x, at):
        # Containers are checked here, not left to jax.tree: a spec is a shape or a
        # ShapeDtypeStruct, in tuples, lists and string-keyed dicts, and nothing else.
        if isinstance(x, jax.ShapeDtypeStruct):
            if not all(checks.is_int(d) for d in x.shape):
                raise checks.ArgumentError(
                    f"{where}: input_spec{at} must have int dimensions (-1 for the batch), got "
                    f"shape {x.shape!r}; spell the batch as -1, not as a symbolic dimension."
                )
            return leaf(x.shape, check_dtype(where, f"input_spec{at}.dtype", x.dtype), at)
        if isinstance(x, (tuple, list)) and not is_namedtuple(x):
            if all(checks.is_int(d) for d in x):
                return leaf(x, dtype, at)
            if not any(isinstance(d, (tuple, list, dict, jax.ShapeDtypeStruct)) for d in x):
                if any(d is None for d in x):  # a shape, Keras-style
                    raise bad(x, at, " (the batch dimension is -1, not None)")
                raise checks.ArgumentError(
                    f"{where}: input_spec{at} must have int dimensions (-1 for the batch), got {tuple(x)!r}."
                )
            return type(x)(walk(c, f"{at}[{i}]") for i, c in enumerate(x))
        if isinstance(x, dict) and x and all(isinstance(k, str) for k in x):
            return {k: walk(c, f"{at}[{k!r}]") for k, c in x.items()}
        raise bad(x, at, " (dict keys must be strings)" if isinstance(x, dict) and x else "")

    indices = walk(input_spec, "")
    if not specs:
        raise bad(input_spec, "", " (no inputs)")
    # Leaves in jax's flattening order (dicts sorted by key), which the call checks use.
    order, tree = jax.tree.flatten(indices)
    specs = [specs[i] for i in order]
    return specs, jax.tree.unflatten(tree, [structs[i] for i in order])


def is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def dest_path(where: str, path: Any) -> Path:
    """``path`` as a ``Path`` to write: not a directory, in a directory that exists."""
    if not isinstance(path, (str, os.PathLike)):
        raise checks.ArgumentError(f"{where}: path must be a file path (str or os.PathLike), got {checks.got(path)}.")
    path = Path(os.fspath(path))
    if path.is_dir():
        raise checks.ArgumentError(
            f"{where}: path {str(path)!r} is a directory; give a file "
            f"name inside it, e.g. {str(path / 'model.export')!r}."
        )
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{where}: the directory of {str(path)!r} does not exist; create it first.")
    return path
