"""Checkpoints: save and restore a training-state pytree, atomically.

A directory holds one file per step, ``ckpt-<step>.npz``::

    checkpoint.save("runs/mnist", state, step, keep=3, run_id=rid)  # this run's 3 newest stay
    state = checkpoint.restore("runs/mnist", target=state)  # latest step, validated
    checkpoint.latest_step("runs/mnist", finite_only=True), checkpoint.all_steps("runs/mnist")

Safety: every header records the run that wrote it (``run_id``) and whether its
float values were finite (``finite``). A directory belongs to the run of its
newest checkpoint: ``save`` refuses to write another run's checkpoints into it
(resume from it, use a new directory, or pass ``overwrite=True``), and ``keep=``
only ever deletes the same run's older steps, never the file just written and
never the newest finite checkpoint (a run that diverged keeps its last good
state). A full disk is reported with the path and free space, and leaves the
previous checkpoints intact. Files of a newer format version are refused with
"upgrade funcnet", never called corrupt.

Format and why: a plain, uncompressed NumPy ``.npz`` (a zip of ``.npy``
files) holding ``leaf_0 ... leaf_{n-1}`` (the flattened leaves, in
``jax.tree`` order) and ``header``, a JSON document with, per leaf, its tree
path, kind, dtype, shape and CRC-32, plus a skeleton of the containers and the
step, run id and finite flag (format version 2; version 1 files, without the
last two, are still read); ``header_crc32`` guards the header itself. This needs nothing beyond
NumPy (no new dependency, no pickle, so loading a file never runs code),
stays readable with ``np.load`` alone, and writes at disk speed. A single file
per step is what makes the write atomic: it is written under a temporary name
in the same directory, flushed and fsynced, then ``os.replace``-d into place
and the directory is fsynced. A process killed mid-save leaves the previous
checkpoints intact and at worst a hidden ``.ckpt-*.tmp`` file, which listings
ignore and the next ``save`` from the same host removes once its writer is
dead. (One writer per directory; for sharded or multi-process state use the
orbax backend, ``funcnet.checkpoint_orbax``, behind the same :class:`Checkpointer`.)

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

import errno
import json
import operator
import os
import re
import shutil
import socket
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet.errors import (CheckpointCorruptError, CheckpointError, CheckpointMismatchError,
                            CheckpointOwnershipError, CheckpointVersionError)
from funcnet.fileio import atomic_write

__all__ = ["save", "restore", "latest_step", "all_steps", "info", "new_run_id", "CheckpointInfo",
           "owner_for_save", "steps_to_rotate",
           "Checkpointer", "NpzCheckpointer", "checkpointer_for", "CheckpointError", "CheckpointCorruptError",
           "CheckpointMismatchError", "CheckpointVersionError", "CheckpointOwnershipError"]

_FORMAT = "funcnet.checkpoint"
_VERSION = 2               # 2 added the header's run_id and finite
_READABLE = (1, 2)
_NAME_RE = re.compile(r"^ckpt-(\d+)\.npz$")
_TMP_RE = re.compile(r"^\.ckpt-\d+\.npz\.(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d+)\..*\.tmp$")
_PY_SCALARS = {"bool": bool, "int": int, "float": float, "complex": complex}


class CheckpointInfo(NamedTuple):
    """What a checkpoint's header says about it, without loading its arrays.

    ``run_id`` is ``None`` for checkpoints written before funcnet recorded it;
    they count as finite (the flag did not exist either).
    """

    step: int
    run_id: Optional[str]
    finite: bool
    path: Path


def new_run_id() -> str:
    """A fresh run id (host, time-ordered uuid). Every process of a multi-process run
    gets the same one: process 0's, broadcast, because all of them save together."""
    rid = uuid.uuid4()
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        raw = np.frombuffer(rid.bytes, np.uint8).astype(np.int32)
        rid = uuid.UUID(bytes=bytes(np.asarray(
            multihost_utils.broadcast_one_to_all(raw)).astype(np.uint8).tolist()))
    return f"{_host()}-{rid.hex[:16]}"


# The run id of saves that name none: one per process (see save's ``run_id``).
_PROCESS_RUN_ID = f"{socket.gethostname()[:32]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


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


def all_steps(directory, *, finite_only: bool = False) -> List[int]:
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


def latest_step(directory, *, finite_only: bool = False) -> Optional[int]:
    """The highest saved step in ``directory`` (with ``finite_only``, the highest
    finite one: what a resume after a diverged run wants), or ``None``."""
    steps = all_steps(directory, finite_only=finite_only)
    return steps[-1] if steps else None


def info(directory, step=None) -> CheckpointInfo:
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
            raise FileNotFoundError(f"{where}: no checkpoint in {directory} "
                                    "(expected files named ckpt-<step>.npz).")
    step = _check_step(step)
    if not _path(directory, step).is_file():
        raise FileNotFoundError(f"{where}: no checkpoint for step {step} in "
                                f"{directory}; available steps: {all_steps(directory)}.")
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
        _INFO_CACHE[key] = CheckpointInfo(step, header.get("run_id"),
                                          bool(header.get("finite", True)), path)
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


def save(directory, train_state, step, *, keep: Optional[int] = None, run_id: Optional[str] = None,
         finite: Optional[bool] = None, overwrite: bool = False) -> Path:
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
    owner = owner_for_save(f"checkpoint.save(step={step})", directory, infos, step, run_id,
                           overwrite=overwrite)
    header = {"format": _FORMAT, "version": _VERSION, "step": step, "run_id": owner,
              "finite": bool(is_finite and finite is not False), **arrays.pop("header")}
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


def owner_for_save(where: str, directory, infos: Dict[int, CheckpointInfo], step: int,
                   run_id: Optional[str], *, overwrite: bool = False) -> str:
    """The run id a new checkpoint of ``step`` is saved under (the rule of :func:`save`'s
    ``run_id``, shared by the backends), or :class:`CheckpointOwnershipError`.

    ``infos`` are the directory's readable checkpoints by step; the newest one owns it.
    """
    mine = run_id or _PROCESS_RUN_ID
    if not infos or overwrite:
        return mine
    newest = infos[max(infos)]
    if newest.run_id == mine:
        return mine
    if step > newest.step and (run_id is None or newest.run_id is None):
        # Continuing: an anonymous save after every step (the same script restarted
        # after a crash), or a run taking over checkpoints written before run ids.
        return newest.run_id if run_id is None and newest.run_id else mine
    who = f"run {run_id!r}" if run_id else "this process's run (no run_id given)"
    raise CheckpointOwnershipError(
        f"{where}: {directory} holds the checkpoints of another run ({newest.run_id!r}, steps "
        f"{sorted(infos)}), not of {who}. Saving there would mix the two runs and let keep= "
        f"delete one of them. Either resume from it (fit(..., resume_from=...) continues that "
        f"run), pick a new directory for this run, or pass overwrite=True to replace that "
        f"run's checkpoints.")


def steps_to_rotate(infos: Dict[int, CheckpointInfo], step: int, run_id: str,
                    keep: Optional[int]) -> List[int]:
    """The steps ``keep=`` deletes once ``step`` is written (shared by the backends): the
    run's own, older than ``step``, beyond its ``keep`` newest, never the newest finite
    checkpoint in the directory (``infos``, the new one included)."""
    if keep is None:
        return []
    older = sorted(s for s, i in infos.items() if s < step and i.run_id == run_id)
    finite = [s for s, i in infos.items() if i.finite]
    protected = max(finite) if finite else None
    return [s for s in older[:max(len(older) - (keep - 1), 0)] if s != protected]


def _write(final: Path, arrays) -> None:
    """The atomic write; a full disk becomes an error that says where and how full."""
    try:
        with atomic_write(final, prefix=f".{final.name}.{_host()}.{os.getpid()}.") as (f, _):
            np.savez(f, **arrays)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        need = sum(a.nbytes for a in arrays.values())
        try:
            free = f"{shutil.disk_usage(final.parent).free / 2**20:,.1f} MiB free"
        except OSError:
            free = "free space unknown"
        raise OSError(e.errno, f"checkpoint.save: no space left writing {final} (about "
                      f"{need / 2**20:,.1f} MiB needed, {free} on that file system). The "
                      f"previous checkpoints are intact and the partial file was removed. Free "
                      f"space, lower keep=, or save to another directory.") from e


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


def _corrupt(path: Path, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{path}: {why}. The checkpoint is unusable; restore another step "
        f"(available: {all_steps(path.parent)}) or delete this file.")


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
            f"to restore it (the file itself is fine; keep it).")
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
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, zlib.error,
            TypeError, IndexError) as e:
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
    step = _existing_step(directory, step, "checkpoint.restore")
    path = _path(directory, step)
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


# --------------------------------------------------------------------------- #
# The interface the Checkpoint callback and fit's resume use
# --------------------------------------------------------------------------- #

@runtime_checkable
class Checkpointer(Protocol):
    """One checkpoint directory behind one backend: :class:`NpzCheckpointer` (this
    module's format, no dependency) or ``funcnet.checkpoint_orbax.OrbaxCheckpointer``
    (sharded, asynchronous).

    ``run_id`` names the run whose checkpoints this writes (see :func:`save`);
    ``fit`` sets it. ``every_process_saves`` says whether every process calls
    ``save`` (each writing its own shards) or only process 0 writes. ``save`` may
    return before the files are written; ``wait`` blocks until they are, and
    ``close`` waits and releases the backend.
    """

    directory: Path
    run_id: Optional[str]
    every_process_saves: bool

    def save(self, step: int, tree: Any, *, finite: Optional[bool] = None) -> None: ...
    def restore(self, target: Any, step: Optional[int] = None) -> Any: ...
    def latest_step(self, *, finite_only: bool = False) -> Optional[int]: ...
    def all_steps(self, *, finite_only: bool = False) -> List[int]: ...
    def info(self, step: Optional[int] = None) -> CheckpointInfo: ...
    def wait(self) -> None: ...
    def close(self) -> None: ...


class NpzCheckpointer:
    """:class:`Checkpointer` over :func:`save`/:func:`restore`: one ``ckpt-<step>.npz``
    per step, written synchronously (atomically) by process 0 only.

    A state sharded over a mesh (:func:`funcnet.sharding.shard_params`) is gathered
    whole into process 0's host memory to be written (and placed back with its
    shardings on restore). That is fine for what fits one host; past
    ``max_gather_bytes`` the save refuses, as it does for a state split across
    processes (no one host holds it all): use the orbax backend
    (``backend="orbax"``), which writes each process's shards where they lie.

    Args:
      directory: the checkpoint directory.
      keep: ``keep=`` of :func:`save`.
      run_id, overwrite: as for :func:`save`.
      max_gather_bytes: the largest sharded state to gather (default 2 GiB; None:
        no limit).
    """

    every_process_saves = False

    def __init__(self, directory, *, keep: Optional[int] = None, run_id: Optional[str] = None,
                 overwrite: bool = False, max_gather_bytes: Optional[int] = 2 ** 31):
        if keep is not None:
            keep = checks.positive_int("NpzCheckpointer", "keep (or None)", keep)
        if max_gather_bytes is not None:
            max_gather_bytes = checks.non_negative_int("NpzCheckpointer", "max_gather_bytes",
                                                       max_gather_bytes)
        self.directory, self.keep, self.run_id = Path(directory), keep, run_id
        self.overwrite = checks.flag("NpzCheckpointer", "overwrite", overwrite)
        self.max_gather_bytes = max_gather_bytes

    def save(self, step, tree, *, finite=None) -> None:
        _check_gatherable(tree, self.max_gather_bytes)
        if jax.process_index() == 0:
            save(self.directory, jax.device_get(tree), step, keep=self.keep, run_id=self.run_id,
                 finite=finite, overwrite=self.overwrite)

    def restore(self, target, step=None):
        return restore(self.directory, target=target, step=step)

    def latest_step(self, *, finite_only=False):
        return latest_step(self.directory, finite_only=finite_only)

    def all_steps(self, *, finite_only=False):
        return all_steps(self.directory, finite_only=finite_only)

    def info(self, step=None) -> CheckpointInfo:
        return info(self.directory, step)

    def wait(self) -> None:
        pass  # saves are synchronous

    def close(self) -> None:
        pass

    def __repr__(self):
        return f"NpzCheckpointer({str(self.directory)!r}, keep={self.keep})"


def _check_gatherable(tree, limit: Optional[int]) -> None:
    """Refuses, with the way out, a sharded state the npz backend cannot or should not
    gather to one host."""
    split = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)
             and not x.sharding.is_fully_replicated and len(x.sharding.device_set) > 1]
    if not split:
        return
    if any(not x.is_fully_addressable for x in split):
        raise ValueError("NpzCheckpointer.save: the state is sharded across processes, and the "
                         "npz backend writes one file from process 0, which does not hold the "
                         "other processes' shards. Use the orbax backend (Checkpoint(..., "
                         "backend='orbax') or funcnet.checkpoint_orbax.OrbaxCheckpointer): "
                         "each process writes its own shards.")
    total = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)
                if hasattr(x, "dtype") and not _is_key(x))
    if limit is not None and total > limit:
        raise ValueError(f"NpzCheckpointer.save: the state is sharded over a mesh and the npz "
                         f"backend would gather all {total / 2**20:.0f} MiB of it into this "
                         f"host's memory, past max_gather_bytes={limit}. Use the orbax backend "
                         f"(backend='orbax'), which writes each device's shards without "
                         f"gathering, or raise max_gather_bytes.")


def checkpointer_for(target, *, backend: str = "npz", keep: Optional[int] = None,
                     overwrite: bool = False, where: str = "checkpointer_for"):
    """``target`` itself if it is a :class:`funcnet.checkpoint.Checkpointer`, else the
    ``backend`` (``"npz"`` or ``"orbax"``) checkpointer of the directory ``target``."""
    if isinstance(target, Checkpointer):
        return target
    backend = checks.one_of(where, "backend", backend, ("npz", "orbax"))
    if backend == "orbax":
        from funcnet.checkpoint_orbax import OrbaxCheckpointer
        return OrbaxCheckpointer(target, keep=keep, overwrite=overwrite)
    return NpzCheckpointer(target, keep=keep, overwrite=overwrite)
