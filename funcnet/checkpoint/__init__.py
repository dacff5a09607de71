"""Checkpoints: save and restore a training-state pytree, atomically.

A directory holds one file per step, ``ckpt-<step>.npz``:

```
checkpoint.save("runs/mnist", state, step, keep=3, run_id=rid)  # this run's 3 newest stay
state = checkpoint.restore("runs/mnist", target=state)  # latest step, validated
checkpoint.latest_step("runs/mnist", finite_only=True), checkpoint.all_steps("runs/mnist")
```

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
orbax backend, :class:`OrbaxCheckpointer`, behind the same :class:`Checkpointer`.)

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

A checkpoint written by ``fit`` holds a dict whose entries grow with funcnet (the
train state, the loop position, the data layout, callback states, metric sums):
:func:`restore_train_state` reads its train state from either backend with a target
for the train state alone (concrete or ``jax.eval_shape``), and
:func:`restore_fit_checkpoint` the rest too.

The package: ``_npz`` (the file format, ``save``/``restore``), ``_ownership`` (the
run-ownership rules both backends follow), ``_orbax`` (:class:`OrbaxCheckpointer`),
``_backends`` (the :class:`Checkpointer` interface, :class:`NpzCheckpointer` and
:func:`checkpointer_for`) and ``_fit`` (reading ``fit``'s checkpoints); everything
public is here, at ``funcnet.checkpoint``.
"""

from funcnet.checkpoint._backends import Checkpointer, NpzCheckpointer, checkpointer_for
from funcnet.checkpoint._fit import FitCheckpoint, restore_fit_checkpoint, restore_train_state
from funcnet.checkpoint._npz import all_steps, info, latest_step, restore, save
from funcnet.checkpoint._orbax import OrbaxCheckpointer
from funcnet.checkpoint._ownership import CheckpointInfo, new_run_id, owner_for_save, steps_to_rotate
from funcnet.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointOwnershipError,
    CheckpointVersionError,
)

__all__ = [
    "save",
    "restore",
    "latest_step",
    "all_steps",
    "info",
    "new_run_id",
    "CheckpointInfo",
    "owner_for_save",
    "steps_to_rotate",
    "Checkpointer",
    "NpzCheckpointer",
    "OrbaxCheckpointer",
    "checkpointer_for",
    "restore_train_state",
    "restore_fit_checkpoint",
    "FitCheckpoint",
    "CheckpointError",
    "CheckpointCorruptError",
    "CheckpointMismatchError",
    "CheckpointVersionError",
    "CheckpointOwnershipError",
]
