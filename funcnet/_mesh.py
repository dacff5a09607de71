"""Layouts on a mesh, for the code that computes: what layers, losses and metrics need to
run on arrays whose types carry a sharding (Explicit mesh axes).

Private: the public names are re-exported by :mod:`funcnet.sharding` (a weight's layout
at use, the layout of a product, head splits) and :mod:`funcnet.distributed` (the
explicit-axis helpers). Everything here is a no-op off an Explicit mesh: on one device,
inside ``jax.pmap`` / ``jax.shard_map`` and on Auto meshes, arrays carry no split in
their types and each function returns what the plain jax.numpy code would.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

__all__ = [
    "data_axis",
    "explicit_spec",
    "on_global_mesh",
    "explicit_sharding",
    "gather",
    "spec_of",
    "at_use",
    "matmul_sharding",
    "split_last",
    "merge_last",
    "split_leading",
    "merge_leading",
]


def data_axis(mesh: jax.sharding.Mesh) -> str:
    """The mesh axis batches are split over: a 1-D mesh's only axis, else ``"data"``.

    On a 2-D ``("data", "model")`` mesh a batch is split over ``"data"`` and whole
    along ``"model"`` (each tensor-parallel group sees the same examples).
    """
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        return names[0]
    if "data" in names:
        return "data"
    raise ValueError(
        f"the mesh has axes {names}: with more than one axis, name the one "
        f"batches are split over 'data' (e.g. jax.make_mesh((2, 2), "
        f"('data', 'model')))."
    )


# --------------------------------------------------------------------------- #
# Ops that need to be told their result's sharding. Under a mesh whose axes are
# Explicit (``jax.make_mesh``'s default), every array's type carries its
# sharding, and JAX refuses ops whose result layout it cannot infer: gathers
# from a table by sharded ids, scatters into a global table, reshapes that
# split an axis. These helpers give that layout and are no-ops everywhere else.
# --------------------------------------------------------------------------- #


def explicit_spec(x: jax.Array) -> Optional[tuple]:
    """``x``'s ``PartitionSpec``, one entry per axis, when ``x`` is split over Explicit mesh axes.

    None when no axis of ``x`` is split in its type: one device, the body of
    ``jax.pmap`` or ``jax.shard_map``, a mesh with Auto axes (the compiler decides
    the layout there), or a replicated value. Meant to be read while tracing.
    """
    spec = tuple(jax.typeof(x).sharding.spec)
    spec += (None,) * (np.ndim(x) - len(spec))
    return spec if any(p is not None for p in spec) else None


def on_global_mesh(x: jax.Array) -> bool:
    """Whether ``x``, being traced, is a global value the compiler may split over a mesh.

    True under ``jax.set_mesh`` with Auto or Explicit axes, and for ``x`` split over
    Explicit axes; False on one device and in the body of ``jax.pmap`` or
    ``jax.shard_map``, where values are per device. A ``jax.jit`` over arrays placed
    with a ``NamedSharding`` but no ``jax.set_mesh`` cannot be told from one device
    while tracing (False). For layers that would reorganise the batch axis, which only
    pays off where that axis is local.
    """
    mesh = jax.sharding.get_abstract_mesh()
    on_mesh = not mesh.empty and any(t != jax.sharding.AxisType.Manual for t in mesh.axis_types)
    return on_mesh or explicit_spec(x) is not None


def explicit_sharding(like: jax.Array, *spec) -> Optional[jax.sharding.NamedSharding]:
    """``NamedSharding(mesh of like, PartitionSpec(*spec))`` when ``like`` is split over Explicit
    mesh axes (see :func:`explicit_spec`), else None.

    Pass it as an op's ``out_sharding=``: None then leaves the op exactly as it is
    without a mesh.
    """
    if explicit_spec(like) is None:
        return None
    return jax.typeof(like).sharding.update(spec=jax.sharding.PartitionSpec(*spec))


def gather(table: jax.Array, indices: jax.Array, **kwargs) -> jax.Array:
    """``table[indices]`` (rows of a global table, one per index), also over Explicit mesh axes.

    Same as ``table.at[indices].get(**kwargs)``. When ``indices`` are split over
    Explicit mesh axes (e.g. a batch of labels), ``table`` is first made whole on
    every device (``jax.sharding.reshard`` to a replicated layout on that mesh) and
    the result is split as ``indices`` are, its trailing axes whole. Used by the
    embedding lookup, class weights and center loss.
    """
    spec = explicit_spec(indices)
    if spec is None:
        return table.at[indices].get(**kwargs)
    table = jax.sharding.reshard(table, explicit_sharding(indices, *(None,) * table.ndim))
    out = explicit_sharding(indices, *spec, *(None,) * (table.ndim - 1))
    return table.at[indices].get(out_sharding=out, **kwargs)


# --------------------------------------------------------------------------- #
# Using a sharded weight inside a layer
# --------------------------------------------------------------------------- #


def spec_of(x) -> Optional[tuple]:
    """:func:`explicit_spec` with each entry a tuple of axis names (``()`` for a
    dimension not split), or None when nothing about ``x`` is split in its type."""
    spec = explicit_spec(x)
    if spec is None:
        return None
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec)


def at_use(param: jax.Array, x: jax.Array, dims: Sequence[Optional[int]]) -> jax.Array:
    """``param`` resharded for an operation with ``x`` (Explicit mesh axes; a no-op
    otherwise).

    ``dims`` gives, for each dimension of ``param``, the dimension of ``x`` it lines
    up with (contracted with, or broadcast against), or None for a dimension ``x``
    does not have (a Dense kernel's output features). A split of ``param`` is kept
    where the computation can use it as it is: a lined-up dimension split exactly
    as ``x``'s is (tensor parallel: a row-parallel kernel meets features already
    split), and a new dimension split over an axis ``x`` does not use. Every other
    split is gathered (``jax.sharding.reshard``): FSDP's all-gather of a weight split
    over the data axis the batch is split over. Under ``jax.grad`` the gather's
    transpose scatters the gradient back to the param's split.
    """
    pspec = spec_of(param)
    if pspec is None:
        return param
    xspec = spec_of(x) or ((),) * np.ndim(x)
    x_axes = {a for entry in xspec for a in entry}
    keep = []
    for d, entry in enumerate(pspec):
        lined = dims[d]
        if lined is None:
            ok = not (set(entry) & x_axes)
        else:
            ok = tuple(entry) == tuple(xspec[lined])
        keep.append(entry if ok and entry else None)
    keep = tuple(e[0] if e and len(e) == 1 else e for e in keep)
    if tuple(keep) == tuple(e[0] if e and len(e) == 1 else (e or None) for e in pspec):
        return param
    return jax.sharding.reshard(param, P(*keep))


def matmul_sharding(x: jax.Array, W: jax.Array) -> Optional[NamedSharding]:
    """The layout of ``x @ W`` (``x``: ``(..., in)``, ``W``: ``(in, out)``) to state under
    Explicit mesh axes: ``x``'s leading splits and ``W``'s split of ``out``. None when
    neither is split (the product needs no telling). Stating it settles the case
    JAX will not guess: both contracted dimensions split over the same axis (a
    row-parallel kernel), whose partial products are summed over that axis.
    """
    xs, ws = spec_of(x), spec_of(W)
    if xs is None and ws is None:
        return None
    xs = xs or ((),) * np.ndim(x)
    ws = ws or ((),) * 2
    return _named_like(x if spec_of(x) is not None else W, list(xs[:-1]) + [ws[-1]])


def split_last(x: jax.Array, sizes: Sequence[int]) -> jax.Array:
    """``x.reshape(x.shape[:-1] + sizes)``, stating under Explicit mesh axes that a
    split of the last dimension goes to the first new one (heads split over the
    model axis: ``(B, T, H*D)`` to ``(B, T, H, D)``)."""
    sizes = tuple(sizes)
    spec = spec_of(x)
    if spec is None:
        return x.reshape(x.shape[:-1] + sizes)
    entries = list(spec[:-1]) + [spec[-1]] + [()] * (len(sizes) - 1)
    return jax.lax.reshape(x, x.shape[:-1] + sizes, out_sharding=_named_like(x, entries))


def merge_last(x: jax.Array, n: int) -> jax.Array:
    """``x``'s last ``n`` dimensions merged into one, stating under Explicit mesh axes
    that the first one's split becomes the merged dimension's (the inverse of
    :func:`split_last`)."""
    shape = x.shape[:-n] + (math.prod(x.shape[-n:]),)
    spec = spec_of(x)
    if spec is None:
        return x.reshape(shape)
    entries = list(spec[:-n]) + [spec[-n]]
    return jax.lax.reshape(x, shape, out_sharding=_named_like(x, entries))


def _named_like(x, entries):
    spec = P(*(e[0] if len(e) == 1 else (e or None) for e in entries))
    return jax.typeof(x).sharding.update(spec=spec)


def split_leading(x, k: int):
    """``(B, ...)`` as ``(k, B // k, ...)`` with row ``j`` of part ``i`` being row
    ``j * k + i`` of ``x``: parts that interleave, so a split of ``B`` over devices
    stays a split of each part (no rows move between devices)."""
    spec = spec_of(x)
    shape = (x.shape[0] // k, k) + tuple(x.shape[1:])
    if spec is None:
        y = x.reshape(shape)
    else:
        y = jax.lax.reshape(x, shape, out_sharding=_named_like(x, [spec[0], ()] + list(spec[1:])))
    return jax.numpy.swapaxes(y, 0, 1)


def merge_leading(y):
    """The inverse of :func:`split_leading`: ``(k, B // k, ...)`` back to ``(B, ...)``."""
    y = jax.numpy.swapaxes(y, 0, 1)
    shape = (y.shape[0] * y.shape[1],) + tuple(y.shape[2:])
    spec = spec_of(y)
    if spec is None:
        return y.reshape(shape)
    return jax.lax.reshape(y, shape, out_sharding=_named_like(y, [spec[0]] + list(spec[2:])))
