"""Checkpoints: save and restore a training-state pytree, atomically.

A directory holds one file per step, ``ckpt-<step>.npz``::

    checkpoint.save("runs/mnist", state, step, keep=3)     # keeps the 3 highest steps
    state = checkpoint.restore("runs/mnist", target=state)  # latest step, validated
    checkpoint.latest_step("runs/mnist"), checkpoint.all_steps("runs/mnist")

Format and why: a plain, uncompressed NumPy ``.npz`` (a zip of ``.npy``
files) holding ``leaf_0 ... leaf_{n-1}`` (the flattened leaves, in
``jax.tree`` order) and ``header``, a JSON document with, per leaf, its tree
path, kind, dtype, shape and CRC-32, plus a skeleton of the containers and the
step; ``header_crc32`` guards the header itself. This needs nothing beyond
NumPy (no new dependency, no pickle, so loading a file never runs code),
stays readable with ``np.load`` alone, and writes at disk speed. A single file
per step is what makes the write atomic: it is written under a temporary name
in the same directory, flushed and fsynced, then ``os.replace``-d into place
and the directory is fsynced. A process killed mid-save leaves the previous
checkpoints intact and at worst a hidden ``.ckpt-*.tmp`` file, which listings
ignore and the next ``save`` from the same host removes once its writer is
dead. (One writer per directory; multi-host sharded arrays are out of scope.)

Leaves: numpy/jax arrays of any dtype (bfloat16 and other ml_dtypes are stored
as raw bits with their dtype name), numpy scalars, Python ``bool``/``int``/
``float``/``complex`` (restored as Python scalars), typed PRNG keys from
``jax.random.key`` (stored as ``jax.random.key_data`` plus the impl name,
restored with ``jax.random.wrap_key_data``) and legacy ``uint32[2]`` keys
(plain arrays). Containers: dicts, lists, tuples, NamedTuples, ``None`` and
any other registered pytree node.

``restore(..., target=tree)`` checks the checkpoint against ``target`` (paths,
shapes, dtypes; every mismatch is listed) and returns a tree with target's
structure; a leaf comes back as the target leaf's kind: a ``jax.Array`` is
placed with the target's sharding (so pmap-replicated state stays
replicated), a numpy array or ``jax.ShapeDtypeStruct`` gives a numpy array,
a Python scalar a Python scalar. Without a target the result is built from
the stored skeleton: dicts for dicts *and NamedTuples* (field name -> value;
the class itself is not stored), lists for lists and other custom nodes,
tuples for tuples, numpy arrays for arrays (numpy scalars as 0-d arrays),
jax key arrays for typed keys, Python scalars for Python scalars.
"""

from __future__ import annotations

import json
import operator
import os
import re
import socket
import zipfile
import zlib
from pathlib import Path
from typing import List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet.fileio import atomic_write

__all__ = ["save", "restore", "latest_step", "all_steps", "CheckpointError",
           "CheckpointCorruptError", "CheckpointMismatchError"]

_FORMAT = "funcnet.checkpoint"
_VERSION = 1
_NAME_RE = re.compile(r"^ckpt-(\d+)\.npz$")
_TMP_RE = re.compile(r"^\.ckpt-\d+\.npz\.(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d+)\..*\.tmp$")
_PY_SCALARS = {"bool": bool, "int": int, "float": float, "complex": complex}


class CheckpointError(ValueError):
    """Base class of the checkpoint errors below."""


class CheckpointCorruptError(CheckpointError):
    """The file is truncated, fails its checksum, or is not a funcnet checkpoint."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit the ``target`` tree (paths, shapes or dtypes)."""


def _path(directory, step: int) -> Path:
    return Path(directory) / f"ckpt-{step}.npz"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64]


def _check_step(step) -> int:
    try:
        step = operator.index(step)
    except TypeError:
        try:  # 0-d integer arrays (jax or numpy), e.g. a train state's step counter
            arr = np.asarray(step)
            if arr.ndim != 0 or not np.issubdtype(arr.dtype, np.integer):
                raise TypeError
            step = int(arr)
        except TypeError:
            raise TypeError(f"checkpoint: step must be an int, got {step!r}.") from None
    if step < 0:
        raise ValueError(f"checkpoint: step must be >= 0, got {step}.")
    return step


def all_steps(directory) -> List[int]:
    """The steps that have a complete checkpoint in ``directory``, ascending.

    Temporary files of unfinished saves are not listed. A missing directory
    has no steps.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME_RE.match, names) if m)


def latest_step(directory) -> Optional[int]:
    """The highest saved step in ``directory``, or ``None`` when there is none."""
    steps = all_steps(directory)
    return steps[-1] if steps else None


# --------------------------------------------------------------------------- #
# Encoding
# --------------------------------------------------------------------------- #

def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _children(node) -> list:
    """``[(path entry, child)]`` of ``node``, in jax's flattening order."""
    kids, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [(path[0], child) for path, child in kids]


def _is_leaf(node) -> bool:
    leaves = jax.tree_util.tree_leaves(node, is_leaf=lambda x: x is None)
    return len(leaves) == 1 and leaves[0] is node and node is not None


def _json_key(k):
    return [type(k).__name__, k] if type(k) in (int, str) else ["str", str(k)]


def _skeleton(node, counter: list):
    """JSON description of the containers; leaves become their index."""
    if node is None:
        return {"t": "none"}
    if _is_leaf(node):
        counter[0] += 1
        return {"t": "leaf", "i": counter[0] - 1}
    entries = _children(node)
    kids = [_skeleton(c, counter) for _, c in entries]
    if _is_namedtuple(node):
        return {"t": "namedtuple", "name": type(node).__name__,
                "fields": list(type(node)._fields), "c": kids}
    if isinstance(node, dict):  # keys in jax's order (sorted, or insertion for OrderedDict)
        return {"t": "dict", "keys": [_json_key(getattr(e, "key", e)) for e, _ in entries],
                "c": kids}
    if type(node) is tuple:
        return {"t": "tuple", "c": kids}
    return {"t": "list" if isinstance(node, list) else "node", "name": type(node).__name__,
            "c": kids}


def _pytype(x) -> str:
    return next(n for n, t in _PY_SCALARS.items() if isinstance(x, t))


def _encode_leaf(x, where: str):
    """``(array to store, header entry)`` for one leaf."""
    if _is_key(x):
        data = np.asarray(jax.random.key_data(x))
        return data, {"kind": "key", "impl": str(jax.random.key_impl(x)),
                      "shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        try:
            arr = np.asarray(x)
        except OverflowError:
            arr = np.asarray(None)
        if arr.dtype == object:
            raise TypeError(f"checkpoint.save: the Python int at {where} does not fit in int64.")
        return arr, {"kind": "python", "pytype": _pytype(x), "shape": [],
                     "dtype": arr.dtype.name}
    if isinstance(x, (np.ndarray, np.generic, jax.Array)):
        arr = np.asarray(x)
        if arr.dtype.kind in "OSUM" or arr.dtype.fields is not None:
            raise TypeError(f"checkpoint.save: leaf {where} has dtype {arr.dtype}, which is not "
                            "a numeric/bool dtype.")
        entry = {"kind": "array", "shape": list(arr.shape), "dtype": arr.dtype.name}
        if np.dtype(arr.dtype.str) != arr.dtype:  # ml_dtypes (bfloat16, float8, int4...)
            arr = arr.view(np.dtype(f"u{arr.dtype.itemsize}"))
            entry["raw"] = True
        return arr, entry
    raise TypeError(f"checkpoint.save: leaf {where} is a {type(x).__name__}; checkpoints hold "
                    "arrays, numpy/Python scalars and PRNG keys. Keep other values out of the "
                    "saved tree (or convert them to arrays).")


def _crc(arr: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))


def _clean_stale_tmp(directory: Path) -> None:
    host = _host()
    for name in os.listdir(directory):
        m = _TMP_RE.match(name)
        if not m or m.group("host") != host:
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # its writer is alive
        except ProcessLookupError:
            pass
        except (PermissionError, OSError):
            continue
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            pass


def save(directory, train_state, step, *, keep: Optional[int] = None) -> Path:
    """Writes ``train_state`` as the checkpoint of ``step`` (atomically).

    Args:
      directory: created if needed.
      train_state: any pytree (see the module docstring for what leaves may be).
        Arrays are copied to host memory.
      step: a non-negative int; an existing checkpoint of the same step is
        replaced (atomically).
      keep: if given, keep only the ``keep`` highest steps after this save
        (older files are deleted); ``None`` keeps everything.

    Returns:
      The path of the written file.
    """
    step = _check_step(step)
    if keep is not None:
        keep = checks.positive_int("checkpoint.save", "keep (or None)", keep)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(directory)

    path_leaves, _ = jax.tree_util.tree_flatten_with_path(train_state)
    counter = [0]
    skeleton = _skeleton(train_state, counter)
    if counter[0] != len(path_leaves):  # would mean _skeleton disagrees with jax's order
        raise RuntimeError("checkpoint.save: internal error: tree skeleton and leaves disagree.")
    arrays, entries = {}, []
    for i, (key_path, leaf) in enumerate(path_leaves):
        where = jax.tree_util.keystr(key_path)
        arr, entry = _encode_leaf(leaf, where)
        entry["path"] = where
        entry["crc32"] = _crc(arr)
        arrays[f"leaf_{i}"] = arr
        entries.append(entry)
    header = json.dumps({"format": _FORMAT, "version": _VERSION, "step": step,
                         "leaves": entries, "tree": skeleton}).encode()
    arrays["header"] = np.frombuffer(header, np.uint8)
    arrays["header_crc32"] = np.array(zlib.crc32(header), np.uint32)

    final = _path(directory, step)
    with atomic_write(final, prefix=f".{final.name}.{_host()}.{os.getpid()}.") as (f, _):
        np.savez(f, **arrays)

    if keep is not None:
        for old in all_steps(directory)[:-keep]:
            try:
                os.unlink(_path(directory, old))
            except FileNotFoundError:
                pass
    return final


# --------------------------------------------------------------------------- #
# Decoding
# --------------------------------------------------------------------------- #

def _describe(entry) -> str:
    if entry["kind"] == "key":
        return f"PRNG key {entry['dtype']}{list(entry['shape'])}"
    if entry["kind"] == "python":
        return f"Python {entry['pytype']}"
    return f"{entry['dtype']}{list(entry['shape'])}"


def _target_entry(x, where: str):
    if _is_key(x):
        return {"kind": "key", "shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return {"kind": "python", "pytype": _pytype(x)}
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return {"kind": "array", "shape": [int(d) for d in x.shape], "dtype": np.dtype(x.dtype).name}
    raise TypeError(f"checkpoint.restore: target leaf {where} is a {type(x).__name__}; targets "
                    "hold arrays, jax.ShapeDtypeStruct, Python scalars or PRNG keys.")


def _compatible(found, expected) -> bool:
    if expected["kind"] == "python":
        return found["kind"] == "python" and found["pytype"] == expected["pytype"]
    return (found["kind"] == expected["kind"] and found["dtype"] == expected["dtype"]
            and list(found["shape"]) == expected["shape"])


def _read(path: Path):
    """``(header, [leaf values])`` with every checksum verified."""
    def corrupt(why):
        return CheckpointCorruptError(
            f"{path}: {why}. The checkpoint is unusable; restore another step "
            f"(available: {all_steps(path.parent)}) or delete this file.")

    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if "header" not in names or "header_crc32" not in names:
                raise corrupt("not a funcnet checkpoint (no header)")
            raw = z["header"].tobytes()
            if zlib.crc32(raw) != int(z["header_crc32"]):
                raise corrupt("header checksum mismatch")
            header = json.loads(raw.decode())
            if header.get("format") != _FORMAT:
                raise corrupt("not a funcnet checkpoint (wrong format tag)")
            if header.get("version") != _VERSION:
                raise corrupt(f"unsupported checkpoint version {header.get('version')!r}")
            values = []
            for i, entry in enumerate(header["leaves"]):
                arr = z[f"leaf_{i}"]
                if _crc(arr) != entry["crc32"]:
                    raise corrupt(f"checksum mismatch in leaf {entry['path']}")
                values.append(_decode_leaf(arr, entry))
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, zlib.error,
            TypeError, IndexError) as e:
        raise corrupt(f"cannot be read as a checkpoint ({type(e).__name__}: {e})") from None
    return header, values


def _decode_leaf(arr: np.ndarray, entry):
    if entry["kind"] == "key":
        return jax.random.wrap_key_data(arr, impl=entry["impl"])
    if entry["kind"] == "python":
        return _PY_SCALARS[entry["pytype"]](arr.item())
    if entry.get("raw"):
        arr = arr.view(jnp.dtype(entry["dtype"]))
    if arr.dtype.name != entry["dtype"] or list(arr.shape) != list(entry["shape"]):
        raise ValueError(f"leaf {entry['path']} is {arr.dtype}{list(arr.shape)}, header says "
                         f"{entry['dtype']}{entry['shape']}")
    return arr


def _from_skeleton(node, values):
    t = node["t"]
    if t == "none":
        return None
    if t == "leaf":
        return values[node["i"]]
    kids = [_from_skeleton(c, values) for c in node["c"]]
    if t == "dict":
        return {k: v for (_, k), v in zip(node["keys"], kids)}
    if t == "namedtuple":
        return dict(zip(node["fields"], kids))
    if t == "tuple":
        return tuple(kids)
    return kids


def _place(value, like):
    """``value`` as the same kind of object as the target leaf ``like``."""
    if isinstance(like, np.generic):
        return value[()]
    if isinstance(like, jax.Array):
        return jax.device_put(value, like.sharding)
    sharding = getattr(like, "sharding", None)  # a ShapeDtypeStruct may carry one
    if isinstance(like, jax.ShapeDtypeStruct) and sharding is not None:
        return jax.device_put(value, sharding)
    return value


def restore(directory, target=None, step=None):
    """Loads a checkpoint written by :func:`save`.

    Args:
      directory: the checkpoint directory.
      target: optional pytree with the expected structure (arrays,
        ``jax.ShapeDtypeStruct``, Python scalars, PRNG keys). When given, the
        checkpoint's paths, shapes and dtypes must match it exactly and the
        result has target's structure and leaf kinds (see module docstring).
      step: which step; defaults to :func:`latest_step`.

    Returns:
      The restored tree. Without ``target``: nested dicts/lists/tuples of
      numpy arrays (NamedTuples come back as dicts of their fields).

    Raises:
      FileNotFoundError: no checkpoint (or none for ``step``) in ``directory``.
      CheckpointCorruptError: truncated file, bad checksum, or not a checkpoint;
        names the file.
      CheckpointMismatchError: the checkpoint does not fit ``target``; lists each
        offending path with the expected and found shape/dtype.
    """
    directory = Path(directory)
    if step is None:
        step = latest_step(directory)
        if step is None:
            raise FileNotFoundError(f"checkpoint.restore: no checkpoint in {directory} "
                                    "(expected files named ckpt-<step>.npz).")
    step = _check_step(step)
    path = _path(directory, step)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint.restore: no checkpoint for step {step} in "
                                f"{directory}; available steps: {all_steps(directory)}.")
    header, values = _read(path)
    if header.get("step") != step:
        raise CheckpointCorruptError(f"{path}: the header says step {header.get('step')}, "
                                     f"the file name step {step}.")
    if target is None:
        return _from_skeleton(header["tree"], values)

    target_leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    stored = {e["path"]: (e, v) for e, v in zip(header["leaves"], values)}
    wanted = [jax.tree_util.keystr(p) for p, _ in target_leaves]
    problems = []
    missing = [p for p in wanted if p not in stored]
    wanted_set = set(wanted)
    unexpected = [p for p in stored if p not in wanted_set]
    if missing:
        problems.append("in target but not in the checkpoint: " + ", ".join(missing[:10])
                        + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else ""))
    if unexpected:
        problems.append("in the checkpoint but not in target: " + ", ".join(unexpected[:10])
                        + (f" (+{len(unexpected) - 10} more)" if len(unexpected) > 10 else ""))
    out = []
    for where, (_, like) in zip(wanted, target_leaves):
        expected = _target_entry(like, where)
        if where not in stored:
            continue
        entry, value = stored[where]
        if not _compatible(entry, expected):
            problems.append(f"{where}: target expects {_describe(expected)}, "
                            f"the checkpoint has {_describe(entry)}")
            continue
        out.append(_place(value, like))
    if problems:
        raise CheckpointMismatchError(
            f"checkpoint.restore: {path} does not match target:\n  - " + "\n  - ".join(problems))
    return jax.tree_util.tree_unflatten(treedef, out)
