"""The PyTorch ``state_dict`` loader behind :func:`funcnet.interop.load_torch_state_dict`
(documented there), in its own module so that the Flax, Haiku and Equinox loaders
(``funcnet._jax_frameworks``) build on it without importing ``funcnet.interop``."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, NamedTuple, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.core import PyTree
from funcnet.params import path_str
from funcnet.errors import StateDictMismatchError

__all__ = ["load_torch_state_dict"]


_RNN = re.compile(r"^(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$")


def load_torch_state_dict(
    params: PyTree, state: PyTree, state_dict: Mapping[str, Any], *, conv_transpose: Sequence[str] = ()
) -> Tuple[Any, Any]:
    """``(params, state)`` with every array replaced by its torch counterpart.

    The funcnet side is read from ``params`` (and ``state``) alone: their tree is the
    network's structure, in layer order, so the layer itself is not needed (a
    ConvTranspose's kernel is the one layout the shapes may not tell, hence
    ``conv_transpose``).

    Args:
      params: funcnet's, e.g. from ``layer.init`` (only their structure, shapes and
        dtypes are used).
      state: funcnet's layer state, as ``params``.
      state_dict: ``module.state_dict()``, or a dict of NumPy arrays with its keys.
      conv_transpose: funcnet paths (as :func:`funcnet.paths` spells them, without
        the trailing ``/W``) of ``ConvTranspose`` layers whose kernel shape cannot
        tell a transposed from a plain convolution.

    Returns:
      New ``(params, state)`` trees (float arrays in the dtypes of the given ones).

    Raises:
      StateDictMismatchError: (a :class:`funcnet.errors.MismatchError`) a different
        number of layers; or, all in one error for the whole model as torch's
        ``load_state_dict(strict=True)`` reports them, the missing and unexpected
        torch keys (also on the error as ``.missing`` and ``.unexpected``) and every
        shape that does not fit (naming the funcnet path and the torch key); a meta
        tensor (no values to load).
      TypeError: ``state_dict`` is not a mapping (e.g. the module itself).

    Examples:
      >>> from funcnet.layers import Dense
      >>> net = funcnet.serial(Dense(3))
      >>> _, params, state = net.init(jax.random.key(0), (-1, 2))
      >>> torch_weights = {"0.weight": np.ones((3, 2), np.float32),   # Linear(2, 3)
      ...                  "0.bias": np.zeros(3, np.float32)}
      >>> params, state = load_torch_state_dict(params, state, torch_weights)
      >>> params[0]["W"].shape                                         # weight.T
      (2, 3)
      >>> try:
      ...     load_torch_state_dict(params, state, {"0.weight": np.ones((3, 2)), "0.scale": 1})
      ... except StateDictMismatchError as e:
      ...     print(e.missing, e.unexpected)
      ['0.bias'] ['0.scale']
    """
    _check_state_dict(state_dict)
    torch_units = _torch_units(state_dict)
    ours = _units(params)
    if len(ours) != len(torch_units):
        raise StateDictMismatchError(
            f"load_torch_state_dict: funcnet's params have {len(ours)} layers with weights "
            f"({[p or '<root>' for p, _ in ours]}) and the state_dict {len(torch_units)} "
            f"modules ({[m or '<root>' for m, _ in torch_units]}). Load into a network "
            f"with the same layers in the same order."
        )
    flat_state = _by_path(state)
    new_params, new_state = {}, {}
    report = _Report([], [], [])
    for (path, unit), (prefix, entries) in zip(ours, torch_units):
        got_p, got_s = _convert(path, unit, flat_state, prefix, entries, path in set(conv_transpose), report)
        new_params.update(got_p)
        new_state.update(got_s)
    # Collected over the whole model first, so one error lists every problem (as
    # torch's strict load does) instead of one fix-and-rerun per problem.
    if report.missing or report.unexpected or report.other:
        raise report.error()
    return _rebuilt(params, new_params), _rebuilt(state, new_state)


class _Report(NamedTuple):
    """What does not fit, gathered over every layer before raising."""

    missing: List[str]  # torch keys a funcnet param needs but the state_dict lacks
    unexpected: List[str]  # state_dict keys no funcnet param takes
    other: List[str]  # shape mismatches and unknown layers, each a sentence

    def error(self) -> StateDictMismatchError:
        missing = list(dict.fromkeys(self.missing))  # a key read for several params: once
        parts = (
            ([f"missing key(s) in state_dict: {missing}"] if missing else [])
            + ([f"unexpected key(s) in state_dict: {self.unexpected}"] if self.unexpected else [])
            + self.other
        )
        return StateDictMismatchError(
            "load_torch_state_dict: the state_dict does not fit funcnet's params: "
            + "; ".join(parts)
            + ". Layers pair with torch's modules by order (see "
            "funcnet.interop): build the funcnet network with the torch model's layers, "
            "in its order and sizes, or drop or rename the state_dict's entries first.",
            missing=missing,
            unexpected=self.unexpected,
        )


def _np(x, key="") -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach()
        if getattr(x, "is_meta", False):
            raise StateDictMismatchError(
                f"load_torch_state_dict: torch's {key!r} is a meta tensor (a shape without "
                f"values, from torch.device('meta') or init_empty_weights), so there is "
                f"nothing to load. Load the checkpoint into the torch model first "
                f"(load_state_dict(..., assign=True)), or pass the file's own state_dict."
            )
        x = x.cpu()
        if x.dtype.is_floating_point and x.dtype.itemsize < 4 and str(x.dtype) != "torch.float16":
            # NumPy has no bfloat16 (nor float8): float32 holds every such value exactly,
            # and _rebuilt casts to the param's dtype, so a bfloat16 param gets them back.
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _torch_units(state_dict) -> List[Tuple[str, Dict[str, np.ndarray]]]:
    units: Dict[str, Dict[str, np.ndarray]] = {}
    for key, value in state_dict.items():
        prefix, _, leaf = key.rpartition(".")
        if leaf == "num_batches_tracked" and _tkey(prefix, "running_mean") not in state_dict:
            continue
        if prefix == "out_proj" or prefix.endswith(".out_proj"):
            owner = prefix[: -len("out_proj")].rstrip(".")
            # nn.MultiheadAttention's own: packed in_proj_weight, or q/k/v_proj_weight
            # when kdim/vdim differ from embed_dim
            if any(_tkey(owner, w) in state_dict for w in ("in_proj_weight", "q_proj_weight")):
                units.setdefault(owner, {})[f"out_proj.{leaf}"] = _np(value, key)
                continue
        units.setdefault(prefix, {})[leaf] = _np(value, key)
    return list(units.items())


def _check_state_dict(state_dict):
    """A mapping of names to arrays, or a TypeError saying what to pass instead."""
    if hasattr(state_dict, "items") and callable(state_dict.items):
        return
    hint = (
        "the module itself: pass module.state_dict()"
        if callable(getattr(state_dict, "state_dict", None))
        else "pass module.state_dict(), or a dict of NumPy arrays with its keys"
    )
    raise TypeError(
        f"load_torch_state_dict: state_dict must be a mapping of torch's keys to "
        f"tensors, got a {type(state_dict).__name__}; {hint}."
    )


def _units(params) -> List[Tuple[str, dict]]:
    """funcnet's layers with weights, in params order: the dicts whose values are
    arrays (a layer's own params), or MultiHeadAttention's / a stacked RNN's dict of
    such dicts."""
    out = []

    def visit(node, path):
        if isinstance(node, dict) and node:
            if all(_is_array(v) for v in node.values()):
                out.append((path, node))
                return
            if set(node) >= {"query", "key", "value", "out"} or all(re.fullmatch(r"l\d+(_reverse)?", k) for k in node):
                out.append((path, node))
                return
            for k in sorted(node):
                visit(node[k], f"{path}/{k}" if path else str(k))
        elif isinstance(node, (tuple, list)):
            for i, v in enumerate(node):
                visit(v, f"{path}/{i}" if path else str(i))

    visit(params, "")
    return out


def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _by_path(tree) -> Dict[str, Any]:
    return {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _join(path, key):
    return f"{path}/{key}" if path else key


def _convert(path, unit, flat_state, prefix, entries, transposed, report: _Report):
    """One funcnet unit's arrays from one torch module's entries; what does not fit
    goes into ``report``."""
    where = f"funcnet {path or '<root>'!r} and torch module {prefix or '<root>'!r}"
    out_p: Dict[str, np.ndarray] = {}
    out_s: Dict[str, np.ndarray] = {}
    used = set()

    def load(target, fkey, key, like, convert=lambda v: v):
        """torch's ``key``, converted, as funcnet's ``fkey`` (shaped like ``like``)."""
        used.add(key)
        if key not in entries:
            report.missing.append(_tkey(prefix, key))
            return
        value = convert(entries[key])
        if tuple(value.shape) != tuple(like.shape):
            report.other.append(
                f"{where}: {_join(path, fkey)!r} has shape {tuple(like.shape)} but torch's "
                f"{_tkey(prefix, key)!r} converts to {tuple(value.shape)}"
            )
            return
        target[_join(path, fkey)] = value

    keys = set(unit)
    if keys >= {"query", "key", "value", "out"}:
        _load_attention(load, out_p, unit, entries)
    elif "W_ih" in keys or all(re.fullmatch(r"l\d+(_reverse)?", k) for k in keys):
        layers = {"l0": unit} if "W_ih" in keys else unit
        for sub, p in layers.items():
            for ours, theirs, t in (
                ("W_ih", "weight_ih", True),
                ("W_hh", "weight_hh", True),
                ("b_ih", "bias_ih", False),
                ("b_hh", "bias_hh", False),
                ("W_hr", "weight_hr", True),
            ):  # LSTM(proj_size=P)
                # bias=False: torch has no bias_* entries either; no proj_size, no weight_hr
                if ours not in p:
                    continue
                fkey = ours if "W_ih" in keys else f"{sub}/{ours}"
                load(out_p, fkey, f"{theirs}_{sub}", p[ours], (lambda v: v.T) if t else (lambda v: v))
    elif keys <= {"W", "b"} and "W" in keys:
        W = unit["W"]

        def layout(weight):
            if W.ndim == 2:
                return weight.T
            if weight.ndim != W.ndim:  # not a convolution's: reported as a shape mismatch
                return weight
            spatial = tuple(range(2, W.ndim))
            plain = weight.transpose(spatial + (1, 0))  # Conv: (out, in, *k)
            trans = weight.transpose(spatial + (0, 1))  # ConvTranspose: (in, out, *k)
            fits_trans = tuple(trans.shape) == tuple(W.shape)
            return trans if transposed or (fits_trans and tuple(plain.shape) != tuple(W.shape)) else plain

        load(out_p, "W", "weight", W, layout)
        if "b" in keys:
            load(out_p, "b", "bias", unit["b"])
    elif keys == {"E"}:
        load(out_p, "E", "weight", unit["E"])
    elif keys <= {"scale", "bias"}:
        if "scale" in keys:
            load(out_p, "scale", "weight", unit["scale"])
        if "bias" in keys:
            load(out_p, "bias", "bias", unit["bias"])
        for ours, theirs in (
            ("mean", "running_mean"),
            ("var", "running_var"),
            ("num_batches_tracked", "num_batches_tracked"),
        ):
            if _join(path, ours) in flat_state:
                load(out_s, ours, theirs, flat_state[_join(path, ours)])
        # only BatchNorm(momentum=None) reads torch's count; any other drops it
        used.add("num_batches_tracked")
    else:
        report.other.append(f"{where}: funcnet's params {sorted(keys)} are not a layer this loader knows")
        used.update(entries)  # the module is reported whole, not its keys one by one
    report.unexpected.extend(_tkey(prefix, k) for k in sorted(set(entries) - used))
    return out_p, out_s


def _load_attention(load, out_p, unit, entries):
    """MultiHeadAttention's projections from an ``nn.MultiheadAttention``'s entries, with
    ``_convert``'s ``load``: ``in_proj_weight``'s three row blocks transposed, or, when
    kdim/vdim differ from embed_dim, ``q/k/v_proj_weight`` transposed (the bias stays
    packed in ``in_proj_bias`` either way)."""
    E = unit["query"]["W"].shape[1]
    separate = (
        "q_proj_weight" in entries
        or "in_proj_weight" not in entries
        and any(f"{w}_proj_weight" in entries for w in "kv")
    )
    for i, name in enumerate(("query", "key", "value")):
        rows = slice(i * E, (i + 1) * E)
        if separate:
            load(out_p, f"{name}/W", f"{name[0]}_proj_weight", unit[name]["W"], lambda w: w.T)
        else:
            load(out_p, f"{name}/W", "in_proj_weight", unit[name]["W"], lambda w: w[rows].T)
        if "b" in unit[name]:
            load(out_p, f"{name}/b", "in_proj_bias", unit[name]["b"], lambda b: b[rows])
    load(out_p, "out/W", "out_proj.weight", unit["out"]["W"], lambda w: w.T)
    if "b" in unit["out"]:
        load(out_p, "out/b", "out_proj.bias", unit["out"]["b"])
    for extra in ("bias_k", "bias_v"):  # add_bias_kv=True: torch's (1, 1, E), funcnet's (E,)
        if extra in unit:
            load(out_p, extra, extra, unit[extra], lambda b: b.reshape(-1))


def _tkey(prefix, key):
    return f"{prefix}.{key}" if prefix else key


def _rebuilt(tree, values: Dict[str, np.ndarray]):
    def one(p, x):
        key = path_str(p)
        if key not in values:
            return x
        return jnp.asarray(values[key], dtype=x.dtype)

    return jax.tree_util.tree_map_with_path(one, tree)
