"""Checkpoints at scale: an orbax-checkpoint backend behind :class:`funcnet.checkpoint.Checkpointer`.

Use it when the train state is sharded (over devices, or over processes in a
multi-process run) or large enough that a step should not wait for the write:

```
from funcnet.checkpoint import OrbaxCheckpointer
ckptr = OrbaxCheckpointer("runs/big", keep=3)        # async by default
ckptr.save(step, train_state)       # returns once the arrays are copied off the device
...                                 # training goes on while the files are written
ckptr.wait()                        # or close() at the end
```

Every process calls ``save``; each writes only the shards it holds (nothing is
gathered to one host), and orbax commits a step by renaming its temporary
directory once every process is done, so a crash mid-save leaves the previous
steps restorable. ``restore(target)`` places every array with the sharding of
the target's leaf (a ``jax.Array`` or a ``jax.ShapeDtypeStruct`` carrying a
``sharding``); a numpy array or a ``ShapeDtypeStruct`` without one gives a numpy
array, as in :func:`funcnet.checkpoint.restore`.

funcnet's run id and finite flag go into orbax's per-step custom metadata, so
the rules of :func:`funcnet.checkpoint.save` hold here too: a directory of
another run is refused, ``keep=`` rotates only this run's older steps (after
the new one is committed) and never the newest finite step. Typed PRNG keys are
stored as their ``jax.random.key_data`` and re-wrapped from the target.

orbax-checkpoint is optional (``pip install funcnet[orbax]``); it is imported
when an :class:`OrbaxCheckpointer` is made.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet.checkpoint._ownership import CheckpointInfo, owner_for_save, steps_to_rotate
from funcnet.errors import CheckpointMismatchError

__all__ = ["OrbaxCheckpointer", "tree_is_finite"]

_RUN_KEY, _FINITE_KEY = "funcnet_run_id", "funcnet_finite"


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise ImportError(
            "OrbaxCheckpointer needs orbax-checkpoint: pip install "
            "'funcnet[orbax]' (or orbax-checkpoint). The default npz "
            "checkpoints (funcnet.checkpoint) need nothing extra."
        ) from e
    return ocp


def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _is_float_array(x) -> bool:
    return (
        isinstance(x, (jax.Array, np.ndarray, np.generic)) and not _is_key(x) and jnp.issubdtype(x.dtype, jnp.inexact)
    )


@jax.jit
def _all_finite(leaves):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def tree_is_finite(tree) -> bool:
    """Whether every float leaf of ``tree`` is finite: one small reduction on the
    devices (all processes take part for global arrays), no gather."""
    leaves = [x for x in jax.tree.leaves(tree) if _is_float_array(x)]
    host = [x for x in leaves if not isinstance(x, jax.Array)]
    device = [x for x in leaves if isinstance(x, jax.Array)]
    if not all(np.isfinite(np.asarray(x)).all() for x in host):
        return False
    return not device or bool(_all_finite(device))


def _storable(tree):
    """Typed keys become their key data (orbax stores plain arrays)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _abstract(like):
    """The orbax restore target of one target leaf."""
    if _is_key(like):
        like = (
            jax.eval_shape(jax.random.key_data, like) if not isinstance(like, jax.Array) else jax.random.key_data(like)
        )
    if isinstance(like, jax.Array):
        return jax.ShapeDtypeStruct(like.shape, like.dtype, sharding=like.sharding)
    if isinstance(like, jax.ShapeDtypeStruct) and getattr(like, "sharding", None) is None:
        return np.zeros(like.shape, like.dtype)
    if isinstance(like, np.generic):
        return np.asarray(like)
    return like


def _placed(value, like):
    if _is_key(like):
        # key_impl takes only concrete keys; an abstract (jax.eval_shape) key leaf carries
        # its implementation on its dtype (no public accessor as of jax 0.10).
        impl = jax.random.key_impl(like) if isinstance(like, jax.Array) else like.dtype._impl
        return jax.random.wrap_key_data(value, impl=impl)
    if isinstance(like, np.generic):
        return np.asarray(value)[()]
    if isinstance(like, np.ndarray) or (
        isinstance(like, jax.ShapeDtypeStruct) and getattr(like, "sharding", None) is None
    ):
        return np.asarray(value)
    return value


class OrbaxCheckpointer:
    """:class:`funcnet.checkpoint.Checkpointer` over ``orbax.checkpoint.CheckpointManager``.

    Args:
      directory: the checkpoint directory (one sub-directory per step).
      keep: keep this run's ``keep`` newest steps (rotation as in
        :func:`funcnet.checkpoint.save`); ``None`` keeps all.
      async_: ``True`` (default): ``save`` returns once the arrays are on the
        host and the files are written in the background; ``False`` waits.
      run_id: the run the checkpoints belong to, as for :func:`funcnet.checkpoint.save`.
      overwrite: write into another run's directory, as for
        :func:`funcnet.checkpoint.save`.
    """

    every_process_saves = True

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep: Optional[int] = None,
        async_: bool = True,
        run_id: Optional[str] = None,
        overwrite: bool = False,
    ) -> None:
        ocp = _orbax()
        if keep is not None:
            keep = checks.positive_int("OrbaxCheckpointer", "keep (or None)", keep)
        self.directory, self.keep, self.run_id = Path(directory).absolute(), keep, run_id
        self.overwrite = checks.flag("OrbaxCheckpointer", "overwrite", overwrite)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,
            create=True,  # rotation is ours: it knows runs and finite steps
            enable_async_checkpointing=checks.flag("OrbaxCheckpointer", "async_", async_),
        )
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._infos: Dict[int, CheckpointInfo] = {}
        self._pending = None  # (step, run id) of the save whose rotation is still due

    # -- saving ---------------------------------------------------------------
    def save(self, step, tree, *, finite: Optional[bool] = None) -> None:
        """Starts writing ``tree`` as ``step`` (every process calls it; see the class)."""
        step = _step(step)
        is_finite = finite is not False and tree_is_finite(tree)
        self._finish_pending()  # the previous save is committed before the next starts
        self._manager.reload()  # another run may have written here since: not a cached list
        infos = self._all_infos()
        owner = owner_for_save(
            f"OrbaxCheckpointer.save(step={step})", self.directory, infos, step, self.run_id, overwrite=self.overwrite
        )
        if step in infos:  # orbax never overwrites a step; the same run replaces it
            self._delete(step)
        self._manager.save(
            step,
            args=self._ocp.args.StandardSave(_storable(tree)),
            force=True,
            custom_metadata={_RUN_KEY: owner, _FINITE_KEY: bool(is_finite)},
        )
        self._infos[step] = CheckpointInfo(step, owner, bool(is_finite), self.directory / str(step))
        self._pending = (step, owner)

    def _finish_pending(self) -> None:
        self._manager.wait_until_finished()
        if self._pending is None:
            return
        step, owner = self._pending
        self._pending = None
        infos = self._all_infos()
        doomed = steps_to_rotate(infos, step, owner, self.keep)
        if self.overwrite:
            doomed += [s for s, i in infos.items() if i.run_id != owner and s not in doomed]
        for s in doomed:
            self._delete(s)

    def _delete(self, step: int) -> None:
        self._manager.delete(step)
        self._infos.pop(step, None)

    def wait(self) -> None:
        """Blocks until every started save is committed (and rotation is done)."""
        self._finish_pending()

    def close(self) -> None:
        self._finish_pending()
        self._manager.close()

    # -- reading --------------------------------------------------------------
    def _all_infos(self) -> Dict[int, CheckpointInfo]:
        steps = set(self._manager.all_steps())
        for s in steps - set(self._infos):
            meta = self._manager.metadata(s).custom_metadata or {}
            self._infos[s] = CheckpointInfo(
                s, meta.get(_RUN_KEY), bool(meta.get(_FINITE_KEY, True)), self.directory / str(s)
            )
        return {s: self._infos[s] for s in sorted(steps)}

    def all_steps(self, *, finite_only: bool = False) -> List[int]:
        """Committed steps, ascending (a save still in flight is not listed)."""
        self._manager.reload()
        return [s for s, i in self._all_infos().items() if i.finite or not finite_only]

    def latest_step(self, *, finite_only: bool = False) -> Optional[int]:
        steps = self.all_steps(finite_only=finite_only)
        return steps[-1] if steps else None

    def info(self, step: Optional[int] = None) -> CheckpointInfo:
        infos = self._all_infos()
        step = self.latest_step() if step is None else _step(step)
        if step not in infos:
            raise FileNotFoundError(
                f"OrbaxCheckpointer: no checkpoint for step {step} in "
                f"{self.directory}; available steps: {sorted(infos)}."
            )
        return infos[step]

    def restore(self, target, step: Optional[int] = None):
        """``target``'s tree read from ``step`` (default: the latest), each array placed
        with the target leaf's sharding."""
        info = self.info(step)
        leaves, treedef = jax.tree.flatten(target)
        abstract_leaves = [_abstract(x) for x in leaves]
        abstract = jax.tree.unflatten(treedef, abstract_leaves)
        # Orbax casts the stored values to the target's dtypes without a word (float32
        # into float16 or int32 rounds or truncates them), and says only "tree structures
        # do not match" of other paths; the npz backend names each difference, and so does
        # this one, before reading any array.
        leaves_meta = self._stored_leaves(info.step)
        stored = _with_dtypes(leaves_meta)
        _check_against(
            f"OrbaxCheckpointer.restore: step {info.step} in {self.directory}",
            target,
            abstract_leaves,
            leaves_meta,
            stored,
        )
        try:
            restored = self._manager.restore(info.step, args=self._ocp.args.StandardRestore(abstract))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointMismatchError(
                f"OrbaxCheckpointer.restore: step {info.step} in {self.directory} does not "
                f"match target: {e}{_structure_hint(target, leaves_meta)}"
            ) from e
        got = treedef.flatten_up_to(restored)
        # Orbax hands back the stored shapes whatever the target says; the npz backend
        # refuses, and so does this one (a model built with other sizes cannot use them).
        wrong = [
            f"{jax.tree_util.keystr(path)}: target expects shape {tuple(np.shape(a))}, the "
            f"checkpoint has {tuple(np.shape(v))}"
            for (path, _), a, v in zip(jax.tree_util.tree_flatten_with_path(target)[0], abstract_leaves, got)
            if tuple(np.shape(a)) != tuple(np.shape(v))
        ]
        if wrong:
            raise CheckpointMismatchError(
                f"OrbaxCheckpointer.restore: step {info.step} in {self.directory} does not "
                f"match target:\n  - " + "\n  - ".join(wrong[:10])
            )
        return jax.tree.unflatten(treedef, [_placed(v, like) for v, like in zip(got, leaves)])

    def stored_tree(self, step: Optional[int] = None):
        """What the checkpoint of ``step`` (default: the latest) holds, without reading its
        arrays: its tree (NamedTuples as dicts, tuples as lists, as orbax stores them)
        with a ``jax.ShapeDtypeStruct`` per array; None when orbax gives no metadata."""
        tree = self._item_metadata(self.info(step).step)
        if tree is None:
            return None
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype)) if _has_shape(leaf) else leaf,
            tree,
            is_leaf=_has_shape,
        )

    def _item_metadata(self, step: int):
        """orbax's metadata tree of the checkpoint of ``step``, or None. A manager that
        did not write the step (a new process reading a run) has no handler for its item
        yet and gives None; the standard handler, which wrote it, reads it then."""
        try:
            metadata = self._manager.item_metadata(step)
            if metadata is None:
                handler = self._ocp.StandardCheckpointHandler()
                try:
                    metadata = handler.metadata(self.directory / str(step) / "default")
                finally:
                    handler.close()
        except Exception:  # an older or foreign layout
            return None
        return getattr(metadata, "tree", metadata)

    def _stored_leaves(self, step: int) -> dict:
        """orbax's metadata of every leaf the checkpoint of ``step`` holds, by its path
        (see :func:`_plain`); empty when orbax gives no metadata (nothing is then
        compared)."""
        tree = self._item_metadata(step)
        if tree is None:  # an older or foreign layout: restore checks what it can
            return {}
        return {_plain(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_has_shape)[0]}

    def __repr__(self):
        return f"OrbaxCheckpointer({str(self.directory)!r}, keep={self.keep})"


def _has_shape(leaf) -> bool:
    return getattr(leaf, "dtype", None) is not None and getattr(leaf, "shape", None) is not None


def _with_dtypes(leaves_meta: dict) -> Dict[tuple, jax.ShapeDtypeStruct]:
    """The dtype and shape of each stored leaf that has them (arrays), by path."""
    return {
        key: jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype))
        for key, leaf in leaves_meta.items()
        if _has_shape(leaf)
    }


def _check_against(
    where: str, target, abstract_leaves, leaves_meta: dict, stored: Dict[tuple, jax.ShapeDtypeStruct]
) -> None:
    """Refuses, before reading any array, a target whose paths, dtypes or shapes are not
    the checkpoint's, listing each difference as the npz backend does. Nothing is
    compared without metadata (``leaves_meta`` empty)."""
    if not leaves_meta:
        return
    flat = jax.tree_util.tree_flatten_with_path(target)[0]
    paths = {_plain(p) for p, _ in flat}
    missing = [
        jax.tree_util.keystr(p) + (f" ({_typed(a)})" if hasattr(a, "dtype") else "")
        for (p, _), a in zip(flat, abstract_leaves)
        if _plain(p) not in leaves_meta
    ]
    unexpected = [
        _shown(key) + (f" ({_typed(stored[key])})" if key in stored else "") for key in leaves_meta if key not in paths
    ]
    problems = [
        f"{what}: " + ", ".join(names[:10]) + (f" (+{len(names) - 10} more)" if len(names) > 10 else "")
        for what, names in (
            ("in target but not in the checkpoint", missing),
            ("in the checkpoint but not in target", unexpected),
        )
        if names
    ]
    wrong = [
        _difference(jax.tree_util.keystr(p), like, a, stored[_plain(p)])
        for (p, like), a in zip(flat, abstract_leaves)
        if hasattr(a, "dtype") and _plain(p) in stored
    ]
    wrong = [w for w in wrong if w]
    if not problems and not wrong:
        return
    raise CheckpointMismatchError(
        f"{where} does not match target:\n  - "
        + "\n  - ".join(problems + wrong[:10])
        + (_fit_hint(leaves_meta) if problems else "")
        + (
            "\nRestore into a target of the saved shapes and dtypes (the model and policy "
            "the run was saved with), then cast explicitly if another dtype is wanted."
            if wrong
            else ""
        )
    )


def _difference(where: str, like, abstract, stored: jax.ShapeDtypeStruct) -> str:
    """How a target leaf differs from the stored one ('' if it does not): its dtype
    (``float32[2, 3]`` against ``float16[2, 3]``), else its shape."""
    if not _same_dtype(like, abstract, stored.dtype):
        return f"{where}: target expects {_typed(abstract)}, the checkpoint has {_typed(stored)}"
    if tuple(np.shape(abstract)) != tuple(stored.shape):
        return f"{where}: target expects shape {tuple(np.shape(abstract))}, the checkpoint has {tuple(stored.shape)}"
    return ""


def _fit_hint(stored) -> str:
    """The way to read a ``fit`` checkpoint, when ``stored`` is one (see
    :func:`funcnet.checkpoint.restore_train_state`)."""
    if any(key[:1] in (("data",), ("epoch_metrics",)) for key in stored):
        return (
            "\nThis is a checkpoint written by fit (train_state, loop position, data "
            "layout, callback states, metric sums): read its train state with "
            "funcnet.checkpoint.restore_train_state(checkpointer, target), or all of it "
            "with funcnet.checkpoint.restore_fit_checkpoint."
        )
    return ""


def _structure_hint(target, stored) -> str:
    """The first path where target and checkpoint differ, for orbax's own error."""
    if not stored:
        return ""
    mine = sorted(_plain(p) for p, _ in jax.tree_util.tree_flatten_with_path(target)[0])
    theirs = sorted(stored)
    for a, b in zip(mine + [None], theirs + [None]):
        if a != b:
            return (
                f" (first difference: target has {_shown(a) if a else 'nothing more'}, "
                f"the checkpoint {_shown(b) if b else 'nothing more'})"
            )
    return ""


def _shown(key: tuple) -> str:
    """A plain path (see :func:`_plain`) as ``jax.tree_util.keystr`` writes a dict's."""
    return "".join(f"[{k!r}]" for k in key)


def _plain(path) -> tuple:
    """A tree path as plain strings: orbax stores a NamedTuple as a dict and a tuple as a
    list, so a target's ``.params`` is the checkpoint's ``['params']``."""
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _same_dtype(like, abstract, stored) -> bool:
    """Whether a target leaf's dtype (``abstract``'s, :func:`_abstract` of ``like``) is
    the stored one. A JAX target (a device array, a ``jax.eval_shape`` leaf) of a stored
    int64 is int32 when x64 is off, as JAX itself holds it: the same integer type, not
    a cast."""
    dtype = np.dtype(abstract.dtype)
    if dtype == stored:
        return True
    return (
        stored.kind in "iu"
        and isinstance(like, (jax.Array, jax.ShapeDtypeStruct))
        and jax.dtypes.canonicalize_dtype(stored) == dtype
    )


def _typed(like) -> str:
    """``float32[2, 3]``: a leaf's dtype and shape, as the npz backend says it."""
    return f"{np.dtype(like.dtype).name}{list(np.shape(like))}"


def _step(step) -> int:
    # a train state's step counter is a 0-d device array
    value = np.asarray(step).item() if hasattr(step, "shape") else step
    return checks.non_negative_int("OrbaxCheckpointer", "step", value)
