"""The npz checkpoint format: ``save``/``restore`` of a pytree as one ``ckpt-<step>.npz``
per step, listing and reading headers (the package docstring describes the format)."""

from __future__ import annotations

import errno
import json
import operator
import os
import re
import shutil
import zipfile
import zlib
from pathlib import Path
from typing import Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet.checkpoint._ownership import CheckpointInfo, host, owner_for_save, steps_to_rotate
from funcnet.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError, CheckpointVersionError
from funcnet.core import PyTree
from funcnet.fileio import atomic_write

__all__ = ["save", "restore", "latest_step", "all_steps", "info", "is_prng_key"]

_FORMAT = "funcnet.checkpoint"
_VERSION = 2  # 2 added the header's run_id and finite
_READABLE = (1, 2)
_NAME_RE = re.compile(r"^ckpt-(\d+)\.npz$")
_TMP_RE = re.compile(r"^\.ckpt-\d+\.npz\.(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d+)\..*\.tmp$")
_PY_SCALARS = {"bool": bool, "int": int, "float": float, "complex": complex}


def _path(directory, step: int) -> Path:
    return Path(directory) / f"ckpt-{step}.npz"


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


def all_steps(directory: str | os.PathLike, *, finite_only: bool = False) -> List[int]:
    """The steps that have a complete checkpoint in ``directory``, ascending.

    Temporary files of unfinished saves are not listed. A missing directory
    has no steps. ``finite_only=True`` lists only checkpoints whose header says
    their values (and the loss they were saved with) were finite; it reads each
    header (not the arrays), and leaves out files it cannot read.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    steps = sorted(int(m.group(1)) for m in map(_NAME_RE.match, names) if m)
    if finite_only:
        infos = _infos(directory, steps)
        steps = [s for s in steps if s in infos and infos[s].finite]
    return steps


def latest_step(directory: str | os.PathLike, *, finite_only: bool = False) -> Optional[int]:
    """The highest saved step in ``directory`` (with ``finite_only``, the highest
    finite one: what a resume after a diverged run wants), or ``None``."""
    steps = all_steps(directory, finite_only=finite_only)
    return steps[-1] if steps else None


def info(directory: str | os.PathLike, step: Optional[int] = None) -> CheckpointInfo:
    """The :class:`CheckpointInfo` of ``step`` (default: the latest) in ``directory``.

    Raises ``FileNotFoundError`` when there is no such checkpoint and the
    :func:`restore` errors when its header cannot be read.
    """
    directory = Path(directory)
    step = _existing_step(directory, step, "checkpoint.info")
    return _info_of(_path(directory, step), step)


def _existing_step(directory: Path, step, where: str) -> int:
    if step is None:
        step = latest_step(directory)
        if step is None:
            raise FileNotFoundError(f"{where}: no checkpoint in {directory} (expected files named ckpt-<step>.npz).")
    step = _check_step(step)
    if not _path(directory, step).is_file():
        raise FileNotFoundError(
            f"{where}: no checkpoint for step {step} in {directory}; available steps: {all_steps(directory)}."
        )
    return step


# Headers already read, by (path, mtime, size): save and finite_only listings read
# the same few headers again and again.
_INFO_CACHE: Dict[tuple, CheckpointInfo] = {}


def _info_of(path: Path, step: int) -> CheckpointInfo:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _INFO_CACHE:
        try:
            with np.load(path, allow_pickle=False) as z:
                header = _checked_header(path, z)
        except CheckpointError:
            raise
        except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, zlib.error) as e:
            raise _corrupt(path, f"cannot be read as a checkpoint ({type(e).__name__}: {e})") from None
        if len(_INFO_CACHE) > 4096:
            _INFO_CACHE.clear()
        _INFO_CACHE[key] = CheckpointInfo(step, header.get("run_id"), bool(header.get("finite", True)), path)
    return _INFO_CACHE[key]


def _infos(directory, steps) -> Dict[int, CheckpointInfo]:
    """Headers of ``steps``; files that vanish or cannot be read are left out."""
    out = {}
    for s in steps:
        try:
            out[s] = _info_of(_path(directory, s), s)
        except (CheckpointError, FileNotFoundError):
            pass
    return out


# --------------------------------------------------------------------------- #
# Encoding
# --------------------------------------------------------------------------- #


def is_prng_key(x) -> bool:
    """Whether ``x`` is a typed PRNG key array (stored as its key data)."""
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
        return {"t": "namedtuple", "name": type(node).__name__, "fields": list(type(node)._fields), "c": kids}
    if isinstance(node, dict):  # keys in jax's order (sorted, or insertion for OrderedDict)
        return {"t": "dict", "keys": [_json_key(getattr(e, "key", e)) for e, _ in entries], "c": kids}
    if type(node) is tuple:
        return {"t": "tuple", "c": kids}
    return {"t": "list" if isinstance(node, list) else "node", "name": type(node).__name__, "c": kids}


def _pytype(x) -> str:
    return next(n for n, t in _PY_SCALARS.items() if isinstance(x, t))


def _encode_leaf(x, where: str):
    """``(array to store, header entry)`` for one leaf."""
    if is_prng_key(x):
        data = np.asarray(jax.random.key_data(x))
        return data, {"kind": "key", "impl": str(jax.random.key_impl(x)), "shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        try:
            arr = np.asarray(x)
        except OverflowError:
            arr = np.asarray(None)
        if arr.dtype == object:
            raise TypeError(f"checkpoint.save: the Python int at {where} does not fit in int64.")
        return arr, {"kind": "python", "pytype": _pytype(x), "shape": [], "dtype": arr.dtype.name}
    if isinstance(x, (np.ndarray, np.generic, jax.Array)):
        arr = np.asarray(x)
        if arr.dtype.kind in "OSUM" or arr.dtype.fields is not None:
            raise TypeError(f"checkpoint.save: leaf {where} has dtype {arr.dtype}, which is not a numeric/bool dtype.")
        entry = {"kind": "array", "shape": list(arr.shape), "dtype": arr.dtype.name}
        if np.dtype(arr.dtype.str) != arr.dtype:  # ml_dtypes (bfloat16, float8, int4...)
            arr = arr.view(np.dtype(f"u{arr.dtype.itemsize}"))
            entry["raw"] = True
        return arr, entry
    raise TypeError(
        f"checkpoint.save: leaf {where} is a {type(x).__name__}; checkpoints hold "
        "arrays, numpy/Python scalars and PRNG keys. Keep other values out of the "
        "saved tree (or convert them to arrays)."
    )


def _crc(arr: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))


def _clean_stale_tmp(directory: Path) -> None:
    here = host()
    for name in os.listdir(directory):
        m = _TMP_RE.match(name)
        if not m or m.group("host") != here:
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


def save(
    directory: str | os.PathLike,
    train_state: PyTree,
    step: int,
    *,
    keep: Optional[int] = None,
    run_id: Optional[str] = None,
    finite: Optional[bool] = None,
    overwrite: bool = False,
) -> Path:
    """Writes ``train_state`` as the checkpoint of ``step`` (atomically).

    Args:
      directory: created if needed.
      train_state: any pytree (see the module docstring for what leaves may be).
        Arrays are copied to host memory.
      step: a non-negative int; an existing checkpoint of the same step and run
        is replaced (atomically).
      keep: if given, keep this run's ``keep`` newest checkpoints up to this
        step: older ones of the same run are deleted, never this one, never
        newer steps, never another run's, and never the newest finite
        checkpoint in the directory (so a diverged run cannot rotate away the
        last good state). ``None`` keeps everything.
      run_id: the run this checkpoint belongs to (e.g. from :func:`new_run_id`;
        ``fit`` passes its own). A directory belongs to the run of its newest
        checkpoint, and ``save`` refuses (:class:`CheckpointOwnershipError`) to
        write into another run's directory. ``None``: one id per process, and a
        save whose step comes after every step in a directory of another run
        continues that run (a script restarted after a crash); going back to
        or below another run's steps is refused.
      finite: ``False`` marks the checkpoint non-finite (e.g. the loss was
        NaN); the leaves are checked either way, and one NaN/inf float leaf
        marks it non-finite. See ``latest_step(..., finite_only=True)``.
      overwrite: write even into another run's directory, and delete that
        run's checkpoints once this one is written.

    Returns:
      The path of the written file.

    Raises:
      CheckpointOwnershipError: the directory holds another run's checkpoints.
      OSError: the write failed (a full disk says so, with the free space);
        the previous checkpoints are untouched and no temporary file remains.
    """
    step = _check_step(step)
    if keep is not None:
        keep = checks.positive_int("checkpoint.save", "keep (or None)", keep)
    arrays, is_finite = _encode_tree(train_state)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(directory)
    infos = _infos(directory, all_steps(directory))
    owner = owner_for_save(f"checkpoint.save(step={step})", directory, infos, step, run_id, overwrite=overwrite)
    header = {
        "format": _FORMAT,
        "version": _VERSION,
        "step": step,
        "run_id": owner,
        "finite": bool(is_finite and finite is not False),
        **arrays.pop("header"),
    }
    raw = json.dumps(header).encode()
    arrays["header"] = np.frombuffer(raw, np.uint8)
    arrays["header_crc32"] = np.array(zlib.crc32(raw), np.uint32)
    final = _path(directory, step)
    _write(final, arrays)
    infos[step] = CheckpointInfo(step, owner, header["finite"], final)
    doomed = [s for s, i in infos.items() if s != step and i.run_id != owner] if overwrite else []
    doomed += steps_to_rotate(infos, step, owner, keep)
    for old in doomed:
        try:
            os.unlink(_path(directory, old))
        except FileNotFoundError:
            pass
    return final


def _encode_tree(tree):
    """``({name: array, "header": {"leaves", "tree"}}, all float leaves finite)``."""
    path_leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    counter = [0]
    skeleton = _skeleton(tree, counter)
    if counter[0] != len(path_leaves):  # would mean _skeleton disagrees with jax's order
        raise RuntimeError("checkpoint.save: internal error: tree skeleton and leaves disagree.")
    arrays, entries, finite = {}, [], True
    for i, (key_path, leaf) in enumerate(path_leaves):
        where = jax.tree_util.keystr(key_path)
        arr, entry = _encode_leaf(leaf, where)
        finite = finite and _leaf_finite(leaf, entry)
        entry["path"] = where
        entry["crc32"] = _crc(arr)
        arrays[f"leaf_{i}"] = arr
        entries.append(entry)
    arrays["header"] = {"leaves": entries, "tree": skeleton}
    return arrays, finite


def _leaf_finite(leaf, entry) -> bool:
    if entry["kind"] == "key":
        return True
    arr = np.asarray(leaf)
    return not jnp.issubdtype(arr.dtype, jnp.inexact) or bool(np.isfinite(arr).all())


def _write(final: Path, arrays) -> None:
    """The atomic write; a full disk becomes an error that says where and how full."""
    try:
        with atomic_write(final, prefix=f".{final.name}.{host()}.{os.getpid()}.") as (f, _):
            np.savez(f, **arrays)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        need = sum(a.nbytes for a in arrays.values())
        try:
            free = f"{shutil.disk_usage(final.parent).free / 2**20:,.1f} MiB free"
        except OSError:
            free = "free space unknown"
        raise OSError(
            e.errno,
            f"checkpoint.save: no space left writing {final} (about "
            f"{need / 2**20:,.1f} MiB needed, {free} on that file system). The "
            f"previous checkpoints are intact and the partial file was removed. Free "
            f"space, lower keep=, or save to another directory.",
        ) from e


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
    if is_prng_key(x):
        return {"kind": "key", "shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return {"kind": "python", "pytype": _pytype(x)}
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return {"kind": "array", "shape": [int(d) for d in x.shape], "dtype": np.dtype(x.dtype).name}
    raise TypeError(
        f"checkpoint.restore: target leaf {where} is a {type(x).__name__}; targets "
        "hold arrays, jax.ShapeDtypeStruct, Python scalars or PRNG keys."
    )


def _compatible(found, expected) -> bool:
    if expected["kind"] == "python":
        return found["kind"] == "python" and found["pytype"] == expected["pytype"]
    return (
        found["kind"] == expected["kind"]
        and found["dtype"] == expected["dtype"]
        and list(found["shape"]) == expected["shape"]
    )


def _corrupt(path: Path, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{path}: {why}. The checkpoint is unusable; restore another step "
        f"(available: {all_steps(path.parent)}) or delete this file."
    )


def _checked_header(path: Path, z) -> dict:
    """The header of an open checkpoint, its checksum, format and version checked."""
    names = set(z.files)
    if "header" not in names or "header_crc32" not in names:
        raise _corrupt(path, "not a funcnet checkpoint (no header)")
    raw = z["header"].tobytes()
    if zlib.crc32(raw) != int(z["header_crc32"]):
        raise _corrupt(path, "header checksum mismatch")
    header = json.loads(raw.decode())
    if header.get("format") != _FORMAT:
        raise _corrupt(path, "not a funcnet checkpoint (wrong format tag)")
    version = header.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > max(_READABLE):
        raise CheckpointVersionError(
            f"{path} is a checkpoint of format version {version}, written by a newer funcnet; "
            f"this funcnet reads versions {', '.join(map(str, _READABLE))}. Upgrade funcnet "
            f"to restore it (the file itself is fine; keep it)."
        )
    if version not in _READABLE:
        raise _corrupt(path, f"unsupported checkpoint version {version!r}")
    return header


def _read(path: Path):
    """``(header, [leaf values])`` with every checksum verified."""
    try:
        with np.load(path, allow_pickle=False) as z:
            header = _checked_header(path, z)
            values = []
            for i, entry in enumerate(header["leaves"]):
                arr = z[f"leaf_{i}"]
                if _crc(arr) != entry["crc32"]:
                    raise _corrupt(path, f"checksum mismatch in leaf {entry['path']}")
                values.append(_decode_leaf(arr, entry))
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, zlib.error, TypeError, IndexError) as e:
        raise _corrupt(path, f"cannot be read as a checkpoint ({type(e).__name__}: {e})") from None
    return header, values


def _decode_leaf(arr: np.ndarray, entry):
    if entry["kind"] == "key":
        return jax.random.wrap_key_data(arr, impl=entry["impl"])
    if entry["kind"] == "python":
        return _PY_SCALARS[entry["pytype"]](arr.item())
    if entry.get("raw"):
        arr = arr.view(jnp.dtype(entry["dtype"]))
    if arr.dtype.name != entry["dtype"] or list(arr.shape) != list(entry["shape"]):
        raise ValueError(
            f"leaf {entry['path']} is {arr.dtype}{list(arr.shape)}, header says {entry['dtype']}{entry['shape']}"
        )
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


def restore(directory: str | os.PathLike, target: Optional[PyTree] = None, step: Optional[int] = None) -> PyTree:
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
    header, values, path = _read_step(directory, step, "checkpoint.restore")
    if target is None:
        return _from_skeleton(header["tree"], values)
    stored = {e["path"]: (e, v) for e, v in zip(header["leaves"], values)}
    return _matched(f"checkpoint.restore: {path}", stored, target)


def _read_step(directory, step, where: str):
    """``(header, leaf values, path)`` of ``step`` (default: the latest) in ``directory``."""
    directory = Path(directory)
    step = _existing_step(directory, step, where)
    path = _path(directory, step)
    header, values = _read(path)
    if header.get("step") != step:
        raise CheckpointCorruptError(f"{path}: the header says step {header.get('step')}, the file name step {step}.")
    return header, values, path


def restore_within(directory, target: dict, step=None):
    """``(restored, rest)``: the top-level entries of a checkpoint (a dict at its top)
    that ``target`` (a dict) names, checked and placed as :func:`restore` does, and the
    other entries as ``restore`` without a target gives them."""
    header, values, path = _read_step(directory, step, "checkpoint.restore")
    tree = _from_skeleton(header["tree"], values)
    if not isinstance(tree, dict):
        raise CheckpointMismatchError(
            f"checkpoint.restore: {path} holds a "
            f"{type(tree).__name__} at its top, not the dict of "
            f"entries {sorted(target)} expected."
        )
    prefixes = tuple(f"[{k!r}]" for k in target)
    stored = {e["path"]: (e, v) for e, v in zip(header["leaves"], values) if e["path"].startswith(prefixes)}
    restored = _matched(f"checkpoint.restore: {path}", stored, target)
    return restored, {k: v for k, v in tree.items() if k not in target}


def _matched(where: str, stored: dict, target):
    """``target``'s tree of the stored ``{path: (entry, value)}``; every path, shape and
    dtype that does not fit is listed in one :class:`CheckpointMismatchError`."""
    target_leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    wanted = [jax.tree_util.keystr(p) for p, _ in target_leaves]
    problems = []
    missing = [p for p in wanted if p not in stored]
    wanted_set = set(wanted)
    unexpected = [p for p in stored if p not in wanted_set]
    if missing:
        problems.append(
            "in target but not in the checkpoint: "
            + ", ".join(missing[:10])
            + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
        )
    if unexpected:
        problems.append(
            "in the checkpoint but not in target: "
            + ", ".join(unexpected[:10])
            + (f" (+{len(unexpected) - 10} more)" if len(unexpected) > 10 else "")
        )
    out = []
    for path, (_, like) in zip(wanted, target_leaves):
        expected = _target_entry(like, path)
        if path not in stored:
            continue
        entry, value = stored[path]
        if not _compatible(entry, expected):
            problems.append(f"{path}: target expects {_describe(expected)}, the checkpoint has {_describe(entry)}")
            continue
        out.append(_place(value, like))
    if problems:
        raise CheckpointMismatchError(
            f"{where} does not match target:\n  - " + "\n  - ".join(problems) + _fit_hint(unexpected)
        )
    return jax.tree_util.tree_unflatten(treedef, out)


def _fit_hint(unexpected) -> str:
    """The way to read a ``fit`` checkpoint, when the entries a target left out are the
    ones ``fit`` adds (see :func:`funcnet.checkpoint.restore_train_state`)."""
    if any(p.startswith(("['data']", "['epoch_metrics']")) for p in unexpected):
        return (
            "\nThis is a checkpoint written by fit (train_state, loop position, data "
            "layout, callback states, metric sums): read its train state with "
            "funcnet.checkpoint.restore_train_state(directory, target), or all of it "
            "with funcnet.checkpoint.restore_fit_checkpoint."
        )
    return ""
