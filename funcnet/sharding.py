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
same rules on its own paths, and the rest (step counts, the rng) replicated. The step
itself does not change: ``jax.jit`` of
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
from funcnet.core import PyTree
from funcnet.params import path_str

__all__ = [
    "Spec",
    "Rules",
    "data_axis",
    "fsdp",
    "fsdp_rules",
    "megatron_rules",
    "param_specs",
    "shard_params",
    "state_shardings",
    "explain",
    "Explained",
    "at_use",
    "matmul_sharding",
    "split_last",
    "merge_last",
]

Spec = Union[P, Callable[[Tuple[int, ...], jax.sharding.Mesh], P]]
"""A leaf's layout: a ``PartitionSpec``, or ``spec(shape, mesh) -> PartitionSpec``."""

Rules = Sequence[Tuple[str, Spec]]
"""``(pattern, spec)`` pairs; a leaf takes the spec of the first pattern ``re.search``
finds in its path."""


# --------------------------------------------------------------------------- #
# Rules
# --------------------------------------------------------------------------- #


def fsdp(axis: str = "data", min_size: int = 2**14) -> Callable:
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


def fsdp_rules(axis: str = "data", min_size: int = 2**14) -> List[Tuple[str, Spec]]:
    """ZeRO-3 / FSDP as rules: every leaf through :func:`fsdp` (``[(".*", fsdp(...))]``).

    Put your own rules before these to give some leaves another layout:

    ```
    rules = [("pos/E", P())] + fsdp_rules("data")
    ```

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


_HEADS = (r"attn/attn/(query|key|value)", r"attn/attn/out")


def megatron_rules(
    column: Sequence[str] = (r"attn/attn/(query|key|value)", r"mlp/fc"),
    row: Sequence[str] = (r"attn/attn/out", r"mlp/proj"),
    *,
    axis: str = "model",
    fsdp_axis: Optional[str] = None,
    num_heads: Optional[int] = None,
    heads: Sequence[str] = _HEADS,
) -> List[Tuple[str, Spec]]:
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

    A split dimension the axis size does not divide is an error naming the leaf. The
    number of heads cannot be read from a ``(E, H * D)`` kernel, so pass ``num_heads``
    to have it checked too: with 3 heads of 4 on a ``model`` axis of 2, the 12 columns
    split evenly but a device would hold half a head, which the attention's reshape to
    ``(H, D)`` then fails on (or gathers) at the step's compilation.

    Args:
      column: path prefixes (regular expressions) of the column-split layers.
      row: path prefixes (regular expressions) of the row-split layers.
      axis: the mesh axis to split over.
      fsdp_axis: a second mesh axis for each ``W``'s other dimension (None: none); not
        ``axis`` itself.
      num_heads: the attention layers' number of heads, checked to be a multiple of the
        axis size when the rules are used (None: not checked).
      heads: the prefixes among ``column`` and ``row`` whose split dimension holds the
        heads (the defaults' attention projections).

    Returns:
      The rules, a list of ``(pattern, spec)``.

    Raises:
      ArgumentError: ``fsdp_axis`` equal to ``axis`` (an axis splits one dimension only),
        or a ``num_heads`` that is not a positive int.
      ValueError: (when the rules are used) ``num_heads`` that the size of ``axis`` does
        not divide, naming the leaf, its shape, the spec and the mesh's axis sizes.

    Examples:
      >>> mesh = jax.make_mesh((2, 2), ("data", "model"))
      >>> params = {"mlp": {"fc": {"W": jnp.zeros((4, 8)), "b": jnp.zeros(8)},
      ...                   "proj": {"W": jnp.zeros((8, 4)), "b": jnp.zeros(4)}}}
      >>> specs = param_specs(params, mesh, megatron_rules(column=["mlp/fc"], row=["mlp/proj"]))
      >>> [tuple(specs["mlp"][k]["W"]) for k in ("fc", "proj")], tuple(specs["mlp"]["proj"]["b"])
      ([(None, 'model'), ('model', None)], ())
    """
    if fsdp_axis is not None and fsdp_axis == axis:
        raise checks.ArgumentError(
            f"megatron_rules: fsdp_axis={fsdp_axis!r} is the tensor-parallel axis too; a mesh "
            f"axis splits one dimension only. Name the data axis, e.g. axis='model', "
            f"fsdp_axis='data' on jax.make_mesh((2, 2), ('data', 'model'))."
        )
    if num_heads is not None:
        num_heads = checks.positive_int("megatron_rules", "num_heads", num_heads)
    rules: List[Tuple[str, Spec]] = []
    for prefix in column:
        rules.append(
            (rf"(^|/)({prefix})/(W|b)$", _column_spec(axis, fsdp_axis, num_heads if prefix in heads else None))
        )
    for prefix in row:
        rule = P(axis, fsdp_axis)
        rules.append(
            (
                rf"(^|/)({prefix})/W$",
                rule if num_heads is None or prefix not in heads else _heads_checked(rule, axis, num_heads, 0),
            )
        )
    return rules


def _column_spec(axis, fsdp_axis, num_heads):
    def column_spec(shape, mesh):  # W (in, out) or b (out,)
        spec = P(fsdp_axis, axis) if len(shape) == 2 else P(axis)
        if num_heads is not None:
            _check_heads(shape, spec, mesh, axis, num_heads, len(shape) - 1)
        return spec

    column_spec.__name__ = column_spec.__qualname__ = f"column({axis!r}, fsdp={fsdp_axis!r})"
    return column_spec


def _heads_checked(spec, axis, num_heads, dim):
    def row_spec(shape, mesh):
        _check_heads(shape, spec, mesh, axis, num_heads, dim)
        return spec

    row_spec.__name__ = row_spec.__qualname__ = f"row({axis!r})"
    return row_spec


def _check_heads(shape, spec, mesh, axis, num_heads, dim) -> None:
    """``num_heads`` heads laid along ``shape[dim]`` must split whole over ``axis``."""
    n = _axis_size("megatron_rules", mesh, axis)
    if num_heads % n:
        raise ValueError(
            f"the spec {_spec_text(spec)} splits dimension {dim} ({shape[dim]}: "
            f"num_heads={num_heads} heads of {shape[dim] // num_heads}) over {axis!r} of size "
            f"{n} (mesh axes: {dict(mesh.shape)}), which does not divide {num_heads} heads: "
            f"a device would hold part of a head. Use a number of heads that {n} divides, "
            f"or a {axis!r} axis whose size divides {num_heads}."
        )


# --------------------------------------------------------------------------- #
# Placing a tree
# --------------------------------------------------------------------------- #


def param_specs(tree: PyTree, mesh: jax.sharding.Mesh, rules: Rules) -> PyTree:
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
      ValueError: a rule is malformed, or a spec does not fit its leaf or the mesh: more
        dimensions than the leaf, an axis the mesh lacks or named twice, an entry that
        is not an axis name, a dimension the axis size does not divide, or (with
        ``megatron_rules(num_heads=)``) heads the axis size does not divide; each
        error names the leaf's path and shape, the spec and the mesh's axis sizes.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> tree = {"W": jax.ShapeDtypeStruct((8, 4), jnp.float32), "b": jnp.zeros(4)}
      >>> param_specs(tree, mesh, [("W$", P("data", None))]) == {"W": P("data", None), "b": P()}
      True
    """
    rules = _checked_rules(rules)
    used = _RuleUse(set(), {})
    if _is_train_state(tree):
        params = _leaf_specs(tree.params, mesh, rules, used)
        mirrors = ("opt_state", "ema")  # trees that hold a value per param
        specs = tree._replace(
            params=params,
            state=_leaf_specs(tree.state, mesh, rules, used),
            **{f: _mirror_specs(getattr(tree, f), tree.params, params) for f in mirrors if f in tree._fields},
            **{
                f: jax.tree.map(lambda _: P(), getattr(tree, f))
                for f in tree._fields
                if f not in ("params", "state") + mirrors
            },
        )
    else:
        specs = _leaf_specs(tree, mesh, rules, used)
    for i in range(len(rules)):
        if i not in used.placed:
            _warn_unmatched(rules, i, used.shadowed.get(i))
    return specs


def shard_params(tree: PyTree, mesh: jax.sharding.Mesh, rules: Rules) -> PyTree:
    """``tree`` (params, or a whole TrainState) placed on ``mesh`` by ``rules``.

    Each leaf becomes a ``jax.Array`` with ``NamedSharding(mesh, spec)``, spec from
    :func:`param_specs`: the first rule whose pattern ``re.search`` finds in the
    leaf's path (``"0/W"``, ``"body/blocks/3/mlp/fc/W"``; for a TrainState, paths are
    relative to its params, so the same rules serve both), unmatched leaves
    replicated. Always new buffers, so a donating step never consumes the caller's
    arrays; with several processes each passes the same values and places only its
    own devices' shards. A rule that matches no leaf is warned about once (a typo
    must not silently replicate everything), and so is a rule shadowed by an earlier
    one (every leaf it matches takes the earlier rule's spec; the warning names it).

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
    return jax.tree.map(
        lambda spec, x: _place(x, NamedSharding(mesh, spec)), specs, tree, is_leaf=lambda s: isinstance(s, P)
    )


def state_shardings(tree: PyTree) -> PyTree:
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
        return jax.random.wrap_key_data(_place(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, sharding)  # a global array: reshard it where it lies
    # A host copy: a donating step would otherwise consume the caller's buffer.
    x = np.array(x, copy=True)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _is_train_state(tree) -> bool:
    return isinstance(tree, tuple) and {"params", "state", "opt_state"} <= set(getattr(tree, "_fields", ()))


def _checked_rules(rules) -> List[Tuple[str, Spec]]:
    if isinstance(rules, (str, bytes)) or not isinstance(rules, (list, tuple)):
        hint = (
            " For a dict {pattern: spec}, pass list(rules.items()) (the first match wins, so the order matters)."
            if isinstance(rules, dict)
            else ""
        )
        raise TypeError(
            f"shard_params: rules must be a sequence of (pattern, spec) pairs, "
            f"e.g. [(r'mlp/fc/W$', P(None, 'model'))] + fsdp_rules('data'); "
            f"got {type(rules).__name__}.{hint}"
        )
    out = []
    for i, rule in enumerate(rules):
        if not (
            isinstance(rule, (tuple, list))
            and len(rule) == 2
            and isinstance(rule[0], str)
            and (isinstance(rule[1], P) or callable(rule[1]))
        ):
            raise TypeError(
                f"shard_params: rule {i} is {rule!r}; each rule is a "
                f"(pattern, spec) pair: a regular expression and a PartitionSpec "
                f"or a function spec(shape, mesh) -> PartitionSpec."
            )
        try:
            re.compile(rule[0])
        except re.error as e:
            raise ValueError(
                f"shard_params: rule {i}'s pattern {rule[0]!r} is not a regular expression: {e}."
            ) from None
        out.append((rule[0], rule[1]))
    return out


class _RuleUse(NamedTuple):
    placed: set  # the indices of the rules that gave some leaf its spec
    shadowed: dict  # rule index -> (index of an earlier rule that took a leaf it matches, path)


def _leaf_specs(tree, mesh, rules, used: _RuleUse):
    """Each leaf's spec, recording in ``used`` which rules placed a leaf and which only
    matched leaves an earlier rule took (what the warning about a shadowed rule names)."""

    def one(path, x):
        name = path_str(path)
        shape = tuple(np.shape(x))
        matches = [i for i, (pattern, _) in enumerate(rules) if re.search(pattern, name)]
        if not matches:
            return P()
        for i in matches[1:]:
            used.shadowed.setdefault(i, (matches[0], name))
        used.placed.add(matches[0])
        pattern, spec = rules[matches[0]]
        if callable(spec):
            spec = _called_spec(name, shape, spec, mesh, pattern)
        return _checked_spec(name, shape, spec, mesh, pattern)

    return jax.tree_util.tree_map_with_path(one, tree)


def _called_spec(name, shape, spec, mesh, pattern):
    try:
        return spec(shape, mesh)
    except ValueError as e:  # a spec function knows the shape, not the path: add it
        raise ValueError(f"shard_params: the rule {pattern!r} for {name!r} (shape {shape}): {e}") from None


def _checked_spec(name, shape, spec, mesh, pattern) -> P:
    if not isinstance(spec, P):
        raise TypeError(
            f"shard_params: the rule {pattern!r} gave {spec!r} for {name!r}; a "
            f"spec function must return a PartitionSpec."
        )
    if len(spec) > len(shape):
        raise ValueError(
            f"shard_params: the rule {pattern!r} gives {name!r} (shape {shape}) "
            f"the spec {spec}, which names {len(spec)} dimensions; the leaf has "
            f"{len(shape)}. Narrow the pattern (e.g. end it with '/W$')."
        )
    seen = {}  # mesh axis -> the dimension it already splits
    for dim, entry in enumerate(spec):
        axes = _spec_axes(name, spec, pattern, entry)
        for axis in axes:
            if axis in seen:
                # jax refuses it only when the array is placed, naming neither rule nor leaf
                raise ValueError(
                    f"shard_params: the rule {pattern!r} gives {name!r} (shape {shape}) the "
                    f"spec {_spec_text(spec)}, which names the mesh axis {axis!r} twice (for "
                    f"dimensions {seen[axis]} and {dim}); an axis can split one dimension "
                    f"only (mesh axes: {dict(mesh.shape)}). Split the other dimension over "
                    f"another axis, or leave it None."
                )
            seen[axis] = dim
            if axis not in mesh.shape:
                raise ValueError(
                    f"shard_params: the rule {pattern!r} splits {name!r} over the "
                    f"axis {axis!r}, which the mesh does not have (its axes: "
                    f"{dict(mesh.shape)}). Name one of those axes."
                )
        n = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % n:
            raise ValueError(
                f"shard_params: {name!r} has shape {shape}, and its dimension "
                f"{dim} ({shape[dim]}) cannot be split evenly over "
                f"{(axes[0] if len(axes) == 1 else axes)!r} (size "
                f"{n}), as the rule {pattern!r} asks ({spec}). Choose sizes the "
                f"axis divides, a rule that leaves this leaf whole, or "
                f"fsdp_rules(), which replicates what it cannot split."
            )
    return spec


def _spec_axes(name, spec, pattern, entry) -> tuple:
    """The mesh axes one entry of a spec names: None, an axis name, or a tuple of them."""
    axes = (
        ()
        if entry is None
        else (entry,)
        if isinstance(entry, str)
        else tuple(entry)
        if isinstance(entry, (tuple, list))
        else None
    )
    if axes is None or not all(isinstance(a, str) for a in axes):
        # P(1) is easily meant as "split dimension 1": jax takes it, then fails placing it
        raise ValueError(
            f"shard_params: the rule {pattern!r} gives {name!r} the spec "
            f"{_spec_text(spec)}, whose entry {entry!r} is not a mesh axis: the "
            f"i-th entry of a PartitionSpec names the axis (None, an axis name, "
            f"or a tuple of names) that splits dimension i; e.g. P(None, 'model') "
            f"splits dimension 1 over 'model'."
        )
    return axes


_WARNED: set = set()


def _warn_unmatched(rules, i: int, shadow) -> None:
    """Warns (once per rule) that rule ``i`` places nothing: it matches no leaf (a typo?),
    or every leaf it matches is placed by an earlier rule (``shadow``: that rule's index
    and one such path), which only reordering the rules fixes."""
    pattern = rules[i][0]
    key = (pattern, None if shadow is None else rules[shadow[0]][0])
    if key in _WARNED:
        return
    _WARNED.add(key)
    if shadow is None:
        text = (
            f"shard_params: the rule pattern {pattern!r} matches no leaf path, so it "
            f"places nothing (a typo?). See the paths with funcnet.paths(params)."
        )
    else:
        earlier, path = shadow
        text = (
            f"shard_params: the rule {i} pattern {pattern!r} is shadowed by the earlier "
            f"rule {earlier} {rules[earlier][0]!r}: every leaf it matches (e.g. "
            f"{path!r}) takes that rule's spec first, so it places nothing. Put it before "
            f"rule {earlier}, or narrow that rule's pattern."
        )
    warnings.warn(text, stacklevel=4)


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
        raise ValueError(
            f"shard_params: the optimizer state holds arrays shaped like params "
            f"({sorted(set(loose))[:3]}), but no part of it has the params' "
            f"structure, so which param each belongs to is unknown and it would "
            f"stay whole on every device. Use an optax optimizer whose state "
            f"mirrors the params (sgd, adam, adamw, ...), or place the state's "
            f"fields yourself with param_specs(train_state.params, ...)."
        )
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
        if leaves and (len(leaves) != 1 or np.shape(leaves[0]) != np.shape(p) or not hasattr(leaves[0], "shape")):
            return None
    return treedef.unflatten(
        [jax.tree.map(lambda _, s=s: s, sub) for s, sub in zip(treedef.flatten_up_to(specs), subtrees)]
    )


# --------------------------------------------------------------------------- #
# Reading a placement
# --------------------------------------------------------------------------- #


class Explained(NamedTuple):
    """What :func:`explain` found: one row per array leaf, and totals in bytes.

    Attributes:
      rows: one ``(path, shape, dtype, spec, bytes per device)`` tuple per array leaf, in
        leaf order; ``spec`` is the ``PartitionSpec`` as text (``"host"`` for an array
        not placed on a device) and the bytes are those of one shard.
      bytes_total: the bytes of the whole tree, counted once (as one copy): a leaf
        whole on every device (``replicate_on``, ``P()``) counts once, and so does a
        leaf of :func:`funcnet.distributed.replicate` or ``jax.pmap``, whose leading
        axis holds one copy per device.
      bytes_per_device: the most bytes any one device holds.

    Examples:
      >>> mesh = jax.make_mesh((4,), ("data",))
      >>> params = shard_params({"W": jnp.zeros((8, 4))}, mesh, [("W", P("data"))])
      >>> out = explain(params, print_fn=None)
      >>> out.rows, out.bytes_total, out.bytes_per_device
      ([('W', (8, 4), 'float32', "P('data')", 32)], 128, 32)
    """

    rows: List[Tuple[str, Tuple[int, ...], str, str, int]]  # path, shape, dtype, spec, bytes/device
    bytes_total: int  # the whole tree, as one copy
    bytes_per_device: int  # the most any one device holds

    def __str__(self):
        lines = [f"{'path':<44} {'shape':<18} {'dtype':<9} {'spec':<24} {'per device':>12}"]
        for path, shape, dtype, spec, nbytes in self.rows:
            lines.append(f"{path:<44} {str(shape):<18} {dtype:<9} {spec:<24} {_human(nbytes):>12}")
        lines.append(f"total {_human(self.bytes_total)}; per device at most {_human(self.bytes_per_device)}")
        return "\n".join(lines)


def _spec_text(spec) -> str:
    """``P('data', None)``, whatever jax version's repr of a PartitionSpec (older ones
    spell it ``PartitionSpec(...)``)."""
    return "P(" + ", ".join(repr(entry) for entry in spec) + ")"


def explain(tree: PyTree, *, print_fn: Optional[Callable[[str], None]] = print) -> Explained:
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
        sharding = getattr(x, "sharding", None)
        total += int(np.prod(x.shape)) * itemsize // _copies(x, sharding)
        if sharding is None:
            shard, spec, devices = tuple(x.shape), "host", ()
        else:
            shard = tuple(sharding.shard_shape(x.shape))
            spec = _spec_text(sharding.spec) if hasattr(sharding, "spec") else type(sharding).__name__
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


def _copies(x, sharding) -> int:
    """How many copies of one value ``x`` holds along its leading axis: one per device
    for a leaf of ``distributed.replicate`` (a 1-D mesh over the axis ``"devices"``,
    split one row per device) or of ``jax.pmap``; else 1. A batch split one row per
    device over a mesh of your own is not taken for copies: only those two layouts are
    known to hold replicas."""
    n = 1 if sharding is None else len(sharding.device_set)
    if n == 1 or not np.ndim(x) or x.shape[0] != n:
        return 1
    pmapped = type(sharding).__name__ == "PmapSharding"  # what jax.pmap returns
    mesh = getattr(sharding, "mesh", None)
    replicated = getattr(mesh, "axis_names", None) == ("devices",) and tuple(sharding.spec)[:1] == ("devices",)
    return n if pmapped or replicated else 1


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _axis_size(where, mesh, axis) -> int:
    if axis not in mesh.shape:
        raise ValueError(
            f"{where}: the mesh has no axis {axis!r} (its axes: {dict(mesh.shape)}). Pass axis= one of them."
        )
    return mesh.shape[axis]
