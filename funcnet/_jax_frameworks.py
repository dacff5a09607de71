"""Weights from Flax (Linen and NNX), Haiku and Equinox, for :mod:`funcnet.interop`.

Each framework's modules are taken in layer order, renamed and laid out as the PyTorch
module of the same kind (``kernel (in, out)`` -> ``weight (out, in)``, a ``(h, w, in,
out)`` convolution kernel -> ``(out, in, h, w)``, ``scale`` -> ``weight``, running
statistics -> ``running_mean``/``running_var``), and loaded by
:func:`funcnet.interop.load_torch_state_dict`, so the pairing by order, the shape checks
and the error listing every misfit are the torch loader's. Only Equinox keeps the
order in which its layers run; for the others it is given as ``order=``:

| source | its order | sound? |
|---|---|---|
| Linen ``variables`` | names count per type; ``jax.tree.map`` sorts them | no: ``order=`` is required |
| an NNX module or ``nnx.State`` | ``nnx.split``/``merge`` sort attributes by name | no: ``order=`` is required |
| an Equinox module | field order (``Sequential``'s list order) | yes |
| Haiku ``params`` | module names sorted alphabetically | no: ``order=`` is required |

``order=`` also fixes a model whose attributes or fields are not in the order its
layers run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from funcnet.core import PyTree
from funcnet.errors import StateDictMismatchError

# _is_array: the torch loader's test for an array leaf, one definition for both loaders
from funcnet._torch_state_dict import _is_array, load_torch_state_dict

__all__ = ["load_flax_params", "load_haiku_params", "load_equinox_params"]

Units = List[Tuple[str, Dict[str, np.ndarray]]]


def load_flax_params(params: PyTree, state: PyTree, variables: PyTree, *, order: Sequence[str]) -> Tuple[Any, Any]:
    """``(params, state)`` with every array replaced by the Flax model's.

    ``variables`` is Linen's ``model.init(...)`` result (``{"params": ...,
    "batch_stats": ...}``, or the ``params`` dict alone), an NNX module or its
    ``nnx.State`` (``nnx.Param`` and ``nnx.BatchStat`` variables are read, so dropout's
    RNG state is skipped). No Flax tree keeps its layers' order, so ``order`` is
    required. Kinds: Linen/NNX
    ``Dense``/``Linear`` (``kernel (in, out)``), ``Conv`` (``kernel (*window, in, out)``,
    the same layout as funcnet's), ``Embed`` (``embedding``), ``BatchNorm`` (``scale``,
    ``bias``, ``mean``, ``var``), ``LayerNorm``/``GroupNorm``/``RMSNorm`` (``scale``,
    ``bias``). Flax's ``ConvTranspose`` and attention are not read (their kernels follow
    no torch layout this loader can check).

    Args:
      params: funcnet's, e.g. from ``layer.init`` (structure, shapes and dtypes used).
      state: funcnet's state from the same ``init``.
      variables: the Flax side, as above.
      order: module paths (``"Conv_0"``, ``"Block_0/Dense_1"``, an NNX model's
        ``"conv1"``) in the order the layers run.

    Returns:
      New ``(params, state)`` trees, as :func:`funcnet.interop.load_torch_state_dict`.

    Raises:
      StateDictMismatchError: a different number of layers, or shapes that do not fit
        (each misfit named with the Flax module path), or an ``order`` that names a
        module the tree lacks or leaves one out.

    Examples:
      >>> from funcnet.layers import Dense
      >>> _, params, state = Dense(3).init(jax.random.key(0), (-1, 2))
      >>> linen = {"params": {"Dense_0": {"kernel": np.ones((2, 3)), "bias": np.zeros(3)}}}
      >>> params, state = load_flax_params(params, state, linen, order=["Dense_0"])
      >>> params["W"].shape                           # Flax's kernel is funcnet's W
      (2, 3)
    """
    if order is None:
        raise TypeError(
            "load_flax_params: pass order=[module paths in layer order] (e.g. ['Conv_0', "
            "'BatchNorm_0', 'Dense_0'], or an NNX model's attribute names ['conv', 'bn', "
            "'dense']): Linen's names count per layer type, and JAX transformations (jax.tree.map, "
            "nnx.split/merge, a checkpoint restore) sort a tree's keys, so no Flax tree keeps "
            "the order its layers run in."
        )
    if _is_nnx_module(variables):
        from flax import nnx  # an NNX module was passed, so flax is installed

        # its weights and running statistics only: dropout's RNG state is no layer's weight
        variables = nnx.state(variables, nnx.Any(nnx.Param, nnx.BatchStat))
    if hasattr(variables, "to_pure_dict"):  # an nnx.State, so flax is installed
        from flax import nnx

        # flax 0.12 deprecates the method (State becomes a dict) for the function
        pure = getattr(nnx, "to_pure_dict", None)
        variables = pure(variables) if pure is not None else variables.to_pure_dict()
    tree = variables.get("params", variables)
    stats = _flat_modules(variables.get("batch_stats", {})) if "params" in variables else {}
    units = [(path, {**arrays, **stats.get(path, {})}) for path, arrays in _flat_modules(tree).items()]
    return _load("load_flax_params", "Flax", params, state, [_flax_unit(u) for u in units], order)


def load_haiku_params(
    params: PyTree,
    state: PyTree,
    hk_params: Mapping[str, Mapping[str, Any]],
    hk_state: Optional[Mapping[str, Mapping[str, Any]]] = None,
    *,
    order: Sequence[str],
) -> Tuple[Any, Any]:
    """``(params, state)`` with every array replaced by the Haiku model's.

    Haiku keeps its modules in a dict sorted by name (``batch_norm`` before ``conv2_d``),
    not in layer order, so ``order`` is required: the module names in the order the
    layers run. Kinds: ``Linear`` (``w (in, out)``, ``b``), ``ConvND`` (``w (*window, in,
    out)``), ``Embed`` (``embeddings``), ``BatchNorm`` (``scale``, ``offset``, and from
    ``hk_state`` the ``mean_ema``/``var_ema`` averages), ``LayerNorm``/``RMSNorm``
    (``scale``, ``offset``). Haiku's ``(1, 1, 1, C)`` BatchNorm arrays become ``(C,)``.

    Args:
      params: funcnet's, e.g. from ``layer.init`` (structure, shapes and dtypes used).
      state: funcnet's state from the same ``init``.
      hk_params: the ``params`` of ``hk.transform(_with_state)``'s ``init``.
      hk_state: its ``state`` (BatchNorm's moving averages), if the model has one.
      order: Haiku module names (``"conv2_d"``, ``"mlp/~/linear_0"``) in layer order.

    Returns:
      New ``(params, state)`` trees, as :func:`funcnet.interop.load_torch_state_dict`.

    Raises:
      StateDictMismatchError: as :func:`load_flax_params`.

    Examples:
      >>> from funcnet.layers import Dense
      >>> _, params, state = Dense(3).init(jax.random.key(0), (-1, 2))
      >>> hk_params = {"linear": {"w": np.ones((2, 3)), "b": np.zeros(3)}}
      >>> params, state = load_haiku_params(params, state, hk_params, order=["linear"])
      >>> params["W"].shape
      (2, 3)
    """
    stats: Dict[str, Dict[str, np.ndarray]] = {}
    for path, arrays in _flat_modules(hk_state or {}).items():
        owner, _, ema = path.rpartition("/~/")
        if ema in ("mean_ema", "var_ema") and "average" in arrays:
            stats.setdefault(owner, {})[ema[:-4]] = arrays["average"]
    units = [(path, {**arrays, **stats.get(path, {})}) for path, arrays in _flat_modules(hk_params).items()]
    return _load("load_haiku_params", "Haiku", params, state, [_haiku_unit(u) for u in units], order)


def load_equinox_params(
    params: PyTree, state: PyTree, model: Any, eqx_state: Optional[Any] = None, *, order: Optional[Sequence[str]] = None
) -> Tuple[Any, Any]:
    """``(params, state)`` with every array replaced by the Equinox model's.

    ``model`` is read field by field in declaration order (``eqx.nn.Sequential``'s
    layers in list order); Equinox lays weights out as PyTorch does, so ``Linear``,
    ``Conv``, ``Embedding``, ``LayerNorm`` and ``GroupNorm`` load as their torch
    counterparts (a convolution's ``(out, 1, 1)`` bias becomes ``(out,)``); a
    ``BatchNorm``'s running mean and variance are read from ``eqx_state`` (the
    ``eqx.nn.State`` of ``eqx.nn.make_with_state``).

    Args:
      params: funcnet's, e.g. from ``layer.init`` (structure, shapes and dtypes used).
      state: funcnet's state from the same ``init``.
      model: the Equinox module.
      eqx_state: its ``eqx.nn.State``, needed when the model has a ``BatchNorm``.
      order: module paths (``"layers.0"``, ``"conv1"``) in layer order, where the
        fields' order is not the order the layers run.

    Returns:
      New ``(params, state)`` trees, as :func:`funcnet.interop.load_torch_state_dict`.

    Raises:
      StateDictMismatchError: as :func:`load_flax_params`.
    """
    units: Units = []
    _eqx_walk(model, "", eqx_state, units)
    return _load(
        "load_equinox_params",
        "Equinox",
        params,
        state,
        [(p, {k: _squeeze_trailing(v) if k == "bias" else v for k, v in u.items()}) for p, u in units],
        order,
    )


def _load(fn: str, source: str, params, state, units: Units, order) -> Tuple[Any, Any]:
    """The units as a torch ``state_dict`` through the torch loader, its errors renamed."""
    units = _ordered(fn, source, units, order)
    state_dict = {f"{path}.{k}" if path else k: v for path, unit in units for k, v in unit.items()}
    try:
        return load_torch_state_dict(params, state, state_dict)
    except StateDictMismatchError as e:
        raise StateDictMismatchError(
            f"{fn}: the {source} modules {[p for p, _ in units]}, read in this order with "
            f"torch's names and layouts (kernel -> weight, scale -> weight, mean -> "
            f"running_mean), do not fit funcnet's params. "
            + str(e).replace("load_torch_state_dict: ", "")
            + f" If the {source} tree is not in layer order, pass order=[module paths].",
            missing=e.missing,
            unexpected=e.unexpected,
        ) from e


def _ordered(fn: str, source: str, units: Units, order) -> Units:
    if order is None:
        return units
    by_path = dict(units)
    unknown = [p for p in order if p not in by_path]
    left = [p for p in by_path if p not in set(order)]
    if unknown or left or len(set(order)) != len(order):
        raise StateDictMismatchError(
            f"{fn}: order must name each {source} module with weights once; "
            f"{'unknown: ' + str(unknown) + '; ' if unknown else ''}"
            f"{'left out: ' + str(left) + '; ' if left else ''}"
            f"the modules are {list(by_path)}.",
            missing=unknown,
            unexpected=left,
        )
    return [(p, by_path[p]) for p in order]


def _flat_modules(tree, prefix: str = "") -> Dict[str, Dict[str, np.ndarray]]:
    """The mappings whose values are arrays (one module's weights), by ``/``-joined
    path, in the tree's order."""
    out: Dict[str, Dict[str, np.ndarray]] = {}
    arrays = {k: v for k, v in tree.items() if _is_array(v)}
    if arrays:
        out[prefix] = {k: np.asarray(v) for k, v in arrays.items()}
    for k, v in tree.items():
        if hasattr(v, "items") and not _is_array(v):
            out.update(_flat_modules(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def _torch_kernel(k: np.ndarray) -> np.ndarray:
    """``(in, out)`` -> ``(out, in)``; ``(*window, in, out)`` -> ``(out, in, *window)``."""
    if k.ndim == 2:
        return k.T
    n = k.ndim
    return k.transpose((n - 1, n - 2) + tuple(range(n - 2)))


def _squeeze_leading(v: np.ndarray) -> np.ndarray:
    return v.reshape(v.shape[-1:]) if v.ndim > 1 and all(d == 1 for d in v.shape[:-1]) else v


def _squeeze_trailing(v: np.ndarray) -> np.ndarray:
    return v.reshape(v.shape[:1]) if v.ndim > 1 and all(d == 1 for d in v.shape[1:]) else v


_FLAX = {
    "kernel": ("weight", _torch_kernel),
    "bias": ("bias", None),
    "scale": ("weight", None),
    "embedding": ("weight", None),
    "mean": ("running_mean", None),
    "var": ("running_var", None),
}
_HAIKU = {
    "w": ("weight", _torch_kernel),
    "b": ("bias", None),
    "scale": ("weight", _squeeze_leading),
    "offset": ("bias", _squeeze_leading),
    "embeddings": ("weight", None),
    "mean": ("running_mean", _squeeze_leading),
    "var": ("running_var", _squeeze_leading),
}


def _renamed(table, unit):
    path, arrays = unit
    out = {}
    for k, v in arrays.items():
        name, convert = table.get(k, (k, None))  # an unknown name is reported as unexpected
        out[name] = convert(v) if convert else v
    return path, out


def _flax_unit(unit):
    return _renamed(_FLAX, unit)


def _haiku_unit(unit):
    return _renamed(_HAIKU, unit)


def _is_nnx_module(x) -> bool:
    return any(c.__module__.startswith("flax.nnx") and c.__name__ == "Module" for c in type(x).__mro__)


def _eqx_walk(node, path: str, eqx_state, units: Units) -> None:
    """Equinox modules are dataclasses: their array fields are one unit, in field order;
    a field holding a ``StateIndex`` (BatchNorm's running statistics) is read from
    ``eqx_state``."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        arrays: Dict[str, np.ndarray] = {}
        children = []
        for f in dataclasses.fields(node):
            v = getattr(node, f.name, None)
            if _is_array(v):
                arrays[f.name] = np.asarray(v)
            elif type(v).__name__ == "StateIndex":
                arrays.update(_eqx_running_stats(v, eqx_state, path))
            else:
                children.append((f.name, v))
        if arrays:
            units.append((path, arrays))
        for name, child in children:
            _eqx_walk(child, f"{path}.{name}" if path else name, eqx_state, units)
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            _eqx_walk(child, f"{path}.{i}" if path else str(i), eqx_state, units)


def _eqx_running_stats(index, eqx_state, path: str) -> Dict[str, np.ndarray]:
    """A BatchNorm's ``(mean, var)`` under its state index; other indices (its
    first-call flag) carry no weights."""
    if eqx_state is None:
        return {}
    value = eqx_state.get(index)
    if isinstance(value, tuple) and len(value) == 2 and all(_is_array(a) for a in value):
        return {"running_mean": np.asarray(value[0]), "running_var": np.asarray(value[1])}
    return {}
