"""Sharding a model: where each parameter lives on a mesh, chosen by rules on its path.

funcnet's params are plain pytrees whose leaves have path names
(:func:`funcnet.paths`: ``"body/blocks/0/mlp/fc/W"``), so a sharding plan is a list
of ``(pattern, spec)`` rules: the first pattern that ``re.search`` finds in a leaf's
path gives its ``PartitionSpec``, and leaves no rule matches are replicated. A
spec is a ``PartitionSpec`` or a function ``spec(shape, mesh) -> PartitionSpec``
(how :func:`fsdp_rules` decides by size). :func:`shard_params` places a params tree,
or a whole :class:`funcnet.TrainState`: its params by the rules, each optimizer-state
subtree that mirrors the params (Adam's ``mu`` and ``nu``, momentum) and the params'
moving average (``TrainState.ema``) exactly as the params, the layer state by the
same rules on its own paths, and the rest (step counts, the rng) replicated. The step itself does not change: ``jax.jit`` of
:func:`funcnet.train.make_train_step` runs on the placed state, and XLA inserts the
collectives.

Three layouts, as PyTorch and the JAX scaling guides name them:

- **Data parallel** (replicated): every device holds everything
  (:func:`funcnet.distributed.replicate_on`).
- **FSDP / ZeRO-3** (:func:`fsdp_rules`): each large parameter, and its optimizer
  state, is split along one dimension over the data axis, so a device holds ``1/N``
  of them. At use a layer gathers the whole weight (:func:`at_use`: FSDP's
  all-gather), and the gradient comes back split (the all-gather's transpose, a
  reduce-scatter), so the update runs on ``1/N`` of the state per device.
- **Tensor parallel** (:func:`megatron_rules`, Megatron-LM's layout): on a 2-D mesh
  ``("data", "model")``, the first Dense of each pair is split by columns and the
  second by rows over ``"model"``, so the activation between them stays split and
  one reduction finishes the pair.

On a mesh whose axes are Explicit (``jax.make_mesh``'s default), array types carry
their sharding, and funcnet's layers state what they need: :func:`at_use` drops a
weight's split over an axis the batch is already split over (gathering it), and
keeps a tensor-parallel split the computation can use.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from funcnet import _checks as checks
from funcnet._mesh import at_use, data_axis, matmul_sharding, merge_last, split_last
from funcnet.params import path_str

__all__ = ["Spec", "Rules", "data_axis", "fsdp", "fsdp_rules", "megatron_rules", "param_specs",
           "shard_params", "state_shardings", "explain", "Explained", "at_use", "matmul_sharding",
           "split_last", "merge_last"]

Spec = Union[P, Callable[[Tuple[int, ...], jax.sharding.Mesh], P]]
"""A leaf's layout: a ``PartitionSpec``, or ``spec(shape, mesh) -> PartitionSpec``."""

Rules = Sequence[Tuple[str, Spec]]
"""``(pattern, spec)`` pairs; a leaf takes the spec of the first pattern ``re.search``
finds in its path."""


# --------------------------------------------------------------------------- #
# Rules
# --------------------------------------------------------------------------- #

def fsdp(axis: str = "data", min_size: int = 2 ** 14) -> Callable:
    """The FSDP spec function: a leaf of at least ``min_size`` elements is split over
    ``axis`` along its largest dimension that the axis size divides (the first such
    one on ties); smaller leaves, and leaves no dimension of which divides, stay whole.

    Replicating small leaves (biases, norm scales) costs little memory and saves a
    collective per use, which is why ZeRO-3 and FSDP wrap them with their module
    rather than splitting each.

    Args:
      axis: the mesh axis to split over.
      min_size: leaves with fewer elements stay whole.

    Returns:
      A spec function ``spec(shape, mesh) -> PartitionSpec``.

    Raises:
      ArgumentError: ``min_size`` is not a non-negative int.
      ValueError: (when the spec is used) the mesh has no axis ``axis``.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> spec = fsdp("data", min_size=16)
      >>> spec((8, 12), mesh) == P(None, "data"), spec((3, 3), mesh) == spec((3, 5), mesh) == P()
      (True, True)
    """
    min_size = checks.non_negative_int("fsdp", "min_size", min_size)

    def spec(shape, mesh):
        n = _axis_size("fsdp", mesh, axis)
        if math.prod(shape) < min_size or n == 1:
            return P()
        candidates = [d for d in range(len(shape)) if shape[d] % n == 0]
        if not candidates:
            return P()
        d = max(candidates, key=lambda i: (shape[i], -i))
        return P(*(axis if i == d else None for i in range(len(shape))))

    spec.__name__ = spec.__qualname__ = f"fsdp({axis!r}, min_size={min_size})"
    return spec


def fsdp_rules(axis: str = "data", min_size: int = 2 ** 14) -> List[Tuple[str, Spec]]:
    """ZeRO-3 / FSDP as rules: every leaf through :func:`fsdp` (``[(".*", fsdp(...))]``).

    Put your own rules before these to give some leaves another layout::

        rules = [("pos/E", P())] + fsdp_rules("data")

    Args:
      axis: the mesh axis to split over.
      min_size: leaves with fewer elements stay whole.

    Returns:
      The rules, a list of one ``(pattern, spec)``.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> params = {"W": jnp.zeros((64, 8)), "b": jnp.zeros(8)}
      >>> param_specs(params, mesh, fsdp_rules("data", min_size=64)) == {"W": P("data", None),
      ...                                                                 "b": P()}
      True
    """
    return [(".*", fsdp(axis, min_size))]


def megatron_rules(column: Sequence[str] = (r"attn/attn/(query|key|value)", r"mlp/fc"),
                   row: Sequence[str] = (r"attn/attn/out", r"mlp/proj"), *,
                   axis: str = "model", fsdp_axis: Optional[str] = None) -> List[Tuple[str, Spec]]:
    """Megatron-LM tensor parallelism over ``axis`` for Dense pairs named by path prefix.

    A *column* layer's ``W`` (``(in, out)``) and ``b`` are split along ``out``
    (``P(None, axis)``, ``P(axis)``): each device computes its own slice of the
    features. A *row* layer's ``W`` is split along ``in`` (``P(axis, None)``): each
    device multiplies its slice of those features, and one sum over ``axis`` gives
    the output; its bias stays whole. The defaults name the two pairs of
    :class:`funcnet.layers.TransformerBlock` (and :func:`funcnet.models.gpt.GPT`):
    the query/key/value projections with the attention output projection (heads are
    split over ``axis``, so ``num_heads`` must be a multiple of its size), and the
    MLP's ``fc`` with its ``proj``. ``fsdp_axis`` also splits the other dimension of
    each ``W`` over that axis (2-D: FSDP over data, tensor parallel over model).

    Args:
      column: path prefixes (regular expressions) of the column-split layers.
      row: path prefixes (regular expressions) of the row-split layers.
      axis: the mesh axis to split over.
      fsdp_axis: a second mesh axis for each ``W``'s other dimension (None: none).

    Returns:
      The rules, a list of ``(pattern, spec)``.

    Examples:
      >>> mesh = jax.make_mesh((2, 2), ("data", "model"))
      >>> params = {"mlp": {"fc": {"W": jnp.zeros((4, 8)), "b": jnp.zeros(8)},
      ...                   "proj": {"W": jnp.zeros((8, 4)), "b": jnp.zeros(4)}}}
      >>> specs = param_specs(params, mesh, megatron_rules(column=["mlp/fc"], row=["mlp/proj"]))
      >>> [tuple(specs["mlp"][k]["W"]) for k in ("fc", "proj")], tuple(specs["mlp"]["proj"]["b"])
      ([(None, 'model'), ('model', None)], ())
    """
    def column_spec(shape, mesh):  # W (in, out) or b (out,)
        return P(fsdp_axis, axis) if len(shape) == 2 else P(axis)

    column_spec.__name__ = column_spec.__qualname__ = f"column({axis!r}, fsdp={fsdp_axis!r})"

    rules: List[Tuple[str, Spec]] = []
    for prefix in column:
        rules.append((rf"(^|/)({prefix})/(W|b)$", column_spec))
    for prefix in row:
        rules.append((rf"(^|/)({prefix})/W$", P(axis, fsdp_axis)))
    return rules


# --------------------------------------------------------------------------- #
# Placing a tree
# --------------------------------------------------------------------------- #

def param_specs(tree, mesh: jax.sharding.Mesh, rules: Rules):
    """The ``PartitionSpec`` of every leaf of ``tree`` under ``rules`` (what
    :func:`shard_params` places it with), checked against ``mesh``: a tree of specs
    with ``tree``'s structure. ``tree`` may hold arrays or ``jax.ShapeDtypeStruct``
    (e.g. from ``jax.eval_shape``), so a plan can be checked before anything is
    allocated.

    Args:
      tree: params (arrays or ``jax.ShapeDtypeStruct``), or a whole TrainState.
      mesh: the mesh the specs name axes of.
      rules: ``(pattern, spec)`` pairs, the first match winning.

    Returns:
      A pytree of ``PartitionSpec`` with ``tree``'s structure.

    Raises:
      ValueError: a rule is malformed, or a spec does not fit its leaf or the mesh.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> tree = {"W": jax.ShapeDtypeStruct((8, 4), jnp.float32), "b": jnp.zeros(4)}
      >>> param_specs(tree, mesh, [("W$", P("data", None))]) == {"W": P("data", None), "b": P()}
      True
    """
    rules = _checked_rules(rules)
    used = set()
    if _is_train_state(tree):
        params = _leaf_specs(tree.params, mesh, rules, used)
        mirrors = ("opt_state", "ema")  # trees that hold a value per param
        specs = tree._replace(
            params=params,
            state=_leaf_specs(tree.state, mesh, rules, used),
            **{f: _mirror_specs(getattr(tree, f), tree.params, params)
               for f in mirrors if f in tree._fields},
            **{f: jax.tree.map(lambda _: P(), getattr(tree, f))
               for f in tree._fields if f not in ("params", "state") + mirrors})
    else:
        specs = _leaf_specs(tree, mesh, rules, used)
    for pattern, _ in rules:
        if pattern not in used:
            _warn_unmatched(pattern)
    return specs


def shard_params(tree, mesh: jax.sharding.Mesh, rules: Rules):
    """``tree`` (params, or a whole TrainState) placed on ``mesh`` by ``rules``.

    Each leaf becomes a ``jax.Array`` with ``NamedSharding(mesh, spec)``, spec from
    :func:`param_specs`: the first rule whose pattern ``re.search`` finds in the
    leaf's path (``"0/W"``, ``"body/blocks/3/mlp/fc/W"``; for a TrainState, paths are
    relative to its params, so the same rules serve both), unmatched leaves
    replicated. Always new buffers, so a donating step never consumes the caller's
    arrays; with several processes each passes the same values and places only its
    own devices' shards. A rule that matches no leaf is warned about once (a typo
    must not silently replicate everything).

    Args:
      tree: params, or a whole :class:`funcnet.TrainState`.
      mesh: the mesh to place on.
      rules: ``(pattern, spec)`` pairs, the first match winning.

    Returns:
      ``tree`` with every leaf a new ``jax.Array`` placed on ``mesh``.

    Raises:
      ValueError: as :func:`param_specs`; a 64-bit integer value that int32 cannot
        hold with x64 off (it would be stored wrapped).

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> params = shard_params({"W": jnp.zeros((8, 4)), "b": jnp.zeros(4)}, mesh,
      ...                       [("W$", P("data", None))])
      >>> params["W"].sharding.shard_shape((8, 4)), params["b"].sharding.shard_shape((4,))
      ((2, 4), (4,))
    """
    # _place copies host values to the devices as int32 when x64 is off: 2**40 would be 0.
    checks.fits_x32("shard_params", tree)
    specs = param_specs(tree, mesh, rules)
    return jax.tree.map(lambda spec, x: _place(x, NamedSharding(mesh, spec)), specs, tree,
                        is_leaf=lambda s: isinstance(s, P))


def state_shardings(tree):
    """The sharding of every array leaf of ``tree`` (None for other leaves): pass it
    as ``jax.jit(step, out_shardings=(state_shardings(ts), None))`` to keep the
    state's layout on a mesh with Auto axes, where the compiler otherwise picks
    the outputs' layout.

    Args:
      tree: a pytree (a TrainState, params) of placed arrays.

    Returns:
      A pytree of shardings (None for non-array leaves) with ``tree``'s structure.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> params = shard_params({"W": jnp.zeros((8, 4))}, mesh, [("W", P("data"))])
      >>> state_shardings(params)["W"].spec == P("data")
      True
    """
    return jax.tree.map(lambda x: x.sharding if isinstance(x, jax.Array) else None, tree)


def _place(x, sharding):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_place(jax.random.key_data(x), sharding),
                                        impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, sharding)  # a global array: reshard it where it lies
    # A host copy: a donating step would otherwise consume the caller's buffer.
    x = np.array(x, copy=True)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _is_train_state(tree) -> bool:
    return isinstance(tree, tuple) and {"params", "state", "opt_state"} <= set(
        getattr(tree, "_fields", ()))


def _checked_rules(rules) -> List[Tuple[str, Spec]]:
    if isinstance(rules, (str, bytes)) or not isinstance(rules, (list, tuple)):
        raise TypeError(f"shard_params: rules must be a sequence of (pattern, spec) pairs, "
                        f"e.g. [(r'mlp/fc/W$', P(None, 'model'))] + fsdp_rules('data'); "
                        f"got {type(rules).__name__}.")
    out = []
    for i, rule in enumerate(rules):
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
                and (isinstance(rule[1], P) or callable(rule[1]))):
            raise TypeError(f"shard_params: rule {i} is {rule!r}; each rule is a "
                            f"(pattern, spec) pair: a regular expression and a PartitionSpec "
                            f"or a function spec(shape, mesh) -> PartitionSpec.")
        try:
            re.compile(rule[0])
        except re.error as e:
            raise ValueError(f"shard_params: rule {i}'s pattern {rule[0]!r} is not a regular "
                             f"expression: {e}.") from None
        out.append((rule[0], rule[1]))
    return out


def _leaf_specs(tree, mesh, rules, used):
    def one(path, x):
        name = path_str(path)
        shape = tuple(np.shape(x))
        for pattern, spec in rules:
            if re.search(pattern, name):
                used.add(pattern)
                if callable(spec):
                    spec = spec(shape, mesh)
                return _checked_spec(name, shape, spec, mesh, pattern)
        return P()

    return jax.tree_util.tree_map_with_path(one, tree)


def _checked_spec(name, shape, spec, mesh, pattern) -> P:
    if not isinstance(spec, P):
        raise TypeError(f"shard_params: the rule {pattern!r} gave {spec!r} for {name!r}; a "
                        f"spec function must return a PartitionSpec.")
    if len(spec) > len(shape):
        raise ValueError(f"shard_params: the rule {pattern!r} gives {name!r} (shape {shape}) "
                         f"the spec {spec}, which names {len(spec)} dimensions; the leaf has "
                         f"{len(shape)}. Narrow the pattern (e.g. end it with '/W$').")
    for dim, entry in enumerate(spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for axis in axes:
            if axis not in mesh.shape:
                raise ValueError(f"shard_params: the rule {pattern!r} splits {name!r} over the "
                                 f"axis {axis!r}, which the mesh does not have (its axes: "
                                 f"{dict(mesh.shape)}). Name one of those axes.")
        n = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % n:
            raise ValueError(f"shard_params: {name!r} has shape {shape}, and its dimension "
                             f"{dim} ({shape[dim]}) cannot be split evenly over "
                             f"{(axes[0] if len(axes) == 1 else axes)!r} (size "
                             f"{n}), as the rule {pattern!r} asks ({spec}). Choose sizes the "
                             f"axis divides, a rule that leaves this leaf whole, or "
                             f"fsdp_rules(), which replicates what it cannot split.")
    return spec


_WARNED: set = set()


def _warn_unmatched(pattern: str) -> None:
    if pattern in _WARNED:
        return
    _WARNED.add(pattern)
    warnings.warn(f"shard_params: the rule pattern {pattern!r} matches no leaf path, so it "
                  f"places nothing (a typo?). See the paths with funcnet.paths(params).",
                  stacklevel=4)


def _mirror_specs(opt_state, params, specs):
    """Specs for the optimizer state: a subtree with the params' structure (optax's
    ``mu``, ``nu``, ``trace``; optax's ``MaskedNode`` standing in for masked-out
    leaves) takes the params' specs leaf for leaf; everything else is replicated."""
    shapes = {tuple(np.shape(x)) for x in jax.tree.leaves(params) if np.ndim(x)}
    mirrored, loose = [], []

    def visit(node):
        matched = _match(node, params, specs)
        if matched is not None:
            mirrored.append(True)
            return matched
        children, treedef = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        if treedef.num_nodes == 1:  # a leaf (or an empty node)
            if np.ndim(node) and tuple(np.shape(node)) in shapes:
                loose.append(tuple(np.shape(node)))
            return jax.tree.map(lambda _: P(), node)
        return treedef.unflatten([visit(c) for c in children])

    out = visit(opt_state)
    if loose and not mirrored:
        raise ValueError(f"shard_params: the optimizer state holds arrays shaped like params "
                         f"({sorted(set(loose))[:3]}), but no part of it has the params' "
                         f"structure, so which param each belongs to is unknown and it would "
                         f"stay whole on every device. Use an optax optimizer whose state "
                         f"mirrors the params (sgd, adam, adamw, ...), or place the state's "
                         f"fields yourself with param_specs(train_state.params, ...).")
    return out


def _match(node, params, specs):
    """``specs`` laid over ``node`` when ``node`` has the params' structure: at each
    param's place a leaf of its shape, or a subtree without leaves (optax's
    ``MaskedNode`` where a mask left the param out)."""
    treedef = jax.tree.structure(params)
    if treedef.num_leaves == 0:
        return None
    try:
        subtrees = treedef.flatten_up_to(node)
    except (ValueError, TypeError):
        return None
    for p, sub in zip(jax.tree.leaves(params), subtrees):
        leaves = jax.tree.leaves(sub)
        if leaves and (len(leaves) != 1 or np.shape(leaves[0]) != np.shape(p)
                       or not hasattr(leaves[0], "shape")):
            return None
    return treedef.unflatten([jax.tree.map(lambda _, s=s: s, sub)
                              for s, sub in zip(treedef.flatten_up_to(specs), subtrees)])


# --------------------------------------------------------------------------- #
# Reading a placement
# --------------------------------------------------------------------------- #

class Explained(NamedTuple):
    """What :func:`explain` found: one row per array leaf, and totals in bytes.

    Attributes:
      rows: one ``(path, shape, dtype, spec, bytes per device)`` tuple per array leaf, in
        leaf order; ``spec`` is the ``PartitionSpec`` as text (``"host"`` for an array
        not placed on a device) and the bytes are those of one shard.
      bytes_total: the bytes of the whole tree, counted once (as one copy).
      bytes_per_device: the most bytes any one device holds.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> params = shard_params({"W": jnp.zeros((8, 4))}, mesh, [("W", P("data"))])
      >>> out = explain(params, print_fn=None)
      >>> out.rows, out.bytes_total, out.bytes_per_device
      ([('W', (8, 4), 'float32', "P('data')", 32)], 128, 32)
    """
    rows: List[Tuple[str, Tuple[int, ...], str, str, int]]  # path, shape, dtype, spec, bytes/device
    bytes_total: int       # the whole tree, as one copy
    bytes_per_device: int  # the most any one device holds

    def __str__(self):
        lines = [f"{'path':<44} {'shape':<18} {'dtype':<9} {'spec':<24} {'per device':>12}"]
        for path, shape, dtype, spec, nbytes in self.rows:
            lines.append(f"{path:<44} {str(shape):<18} {dtype:<9} {spec:<24} {_human(nbytes):>12}")
        lines.append(f"total {_human(self.bytes_total)}; per device at most "
                     f"{_human(self.bytes_per_device)}")
        return "\n".join(lines)


def _spec_text(spec) -> str:
    """``P('data', None)``, whatever jax version's repr of a PartitionSpec (older ones
    spell it ``PartitionSpec(...)``)."""
    return "P(" + ", ".join(repr(entry) for entry in spec) + ")"


def explain(tree, *, print_fn: Optional[Callable[[str], None]] = print) -> Explained:
    """Each array leaf's path, shape, dtype, ``PartitionSpec`` and bytes per device.

    Bytes are read from the arrays' shards as placed (``sharding.shard_shape``), so
    the totals are what the devices hold: ``bytes_per_device`` is the largest sum
    over one device. Printed with ``print_fn`` (None: only returned).

    Args:
      tree: a pytree of arrays (params, a TrainState), placed or not.
      print_fn: called with the table (default ``print``); None prints nothing.

    Returns:
      The explanation, an :class:`Explained`; ``str()`` of it is the table.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> params = shard_params({"W": jnp.zeros((8, 4)), "b": jnp.zeros(4)}, mesh,
      ...                       [("W", P("data"))])
      >>> _ = explain(params)
      path       shape    dtype     spec        per device
      W          (8, 4)   float32   P('data')         32 B
      b          (4,)     float32   P()               16 B
      total 144 B; per device at most 48 B
    """
    rows, per_device, total = [], {}, 0
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            continue
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        itemsize = np.dtype(x.dtype).itemsize
        total += int(np.prod(x.shape)) * itemsize
        sharding = getattr(x, "sharding", None)
        if sharding is None:
            shard, spec, devices = tuple(x.shape), "host", ()
        else:
            shard = tuple(sharding.shard_shape(x.shape))
            spec = (_spec_text(sharding.spec) if hasattr(sharding, "spec")
                    else type(sharding).__name__)
            devices = sharding.device_set
        nbytes = int(np.prod(shard)) * itemsize
        for d in devices:
            per_device[d] = per_device.get(d, 0) + nbytes
        rows.append((path_str(path), tuple(x.shape), str(x.dtype), spec, nbytes))
    most = max(per_device.values(), default=sum(r[-1] for r in rows))
    out = Explained(rows, total, most)
    if print_fn is not None:
        print_fn(str(out))
    return out


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _axis_size(where, mesh, axis) -> int:
    if axis not in mesh.shape:
        raise ValueError(f"{where}: the mesh has no axis {axis!r} (its axes: "
                         f"{dict(mesh.shape)}). Pass axis= one of them.")
    return mesh.shape[axis]
