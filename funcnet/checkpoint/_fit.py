"""Reading back what ``fit`` saved: the train state of a fit checkpoint, and the rest.

A checkpoint written by ``fit`` (``callbacks.Checkpoint``) holds a dict: the
``train_state``, the loop position (``epoch``, ``batch_in_epoch``) and what resuming
needs beside them (``data``: the training data's layout; ``callbacks``: the stateful
callbacks' states; ``epoch_metrics``: the current epoch's metric sums). Those extras
grow with funcnet, so a target spelling the whole layout breaks; the functions here
take a target for the train state only and read the rest as it is stored, from
either backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from funcnet._loop_position import LoopPosition
from funcnet.core import PyTree
from funcnet.checkpoint._npz import all_steps, restore_within
from funcnet.checkpoint._backends import Checkpointer, NpzCheckpointer
from funcnet.checkpoint._orbax import OrbaxCheckpointer

__all__ = ["FitCheckpoint", "restore_fit_checkpoint", "restore_train_state"]


class FitCheckpoint(NamedTuple):
    """What a ``fit`` checkpoint holds (see :func:`restore_fit_checkpoint`).

    Attributes:
      train_state: the :class:`funcnet.train.TrainState`, in the target's structure.
      position: the :class:`funcnet.loop.LoopPosition` ``fit(resume_from=...)`` resumes at.
      step: the checkpoint's step.
      extras: every other entry, as stored (dicts of NumPy arrays): ``data``,
        ``callbacks``, ``epoch_metrics`` for a checkpoint of this funcnet; ``{}`` for
        one written before fit stored them.
    """

    train_state: Any
    position: LoopPosition
    step: int
    extras: dict


def restore_fit_checkpoint(
    source: str | os.PathLike | Checkpointer, target: PyTree, step: Optional[int] = None
) -> FitCheckpoint:
    """Reads a checkpoint ``fit`` wrote, with a target for its train state only.

    Args:
      source: the checkpoint directory (npz; a directory of orbax steps is recognised),
        or a :class:`funcnet.checkpoint.Checkpointer` (``NpzCheckpointer``,
        ``OrbaxCheckpointer``).
      target: the train state's structure: a ``TrainState`` (e.g. a fresh
        ``TrainState.create(...)``) or its ``jax.eval_shape``. Paths, shapes and dtypes
        must match the saved ones.
      step: which step; default: the latest.

    Returns:
      A :class:`FitCheckpoint`. Leaves of a concrete target come back as the target's
      (a ``jax.Array`` with its sharding); leaves of an abstract target as
      ``jax.Array``\\ s, on the default device or with the ``ShapeDtypeStruct``'s
      sharding.

    Raises:
      FileNotFoundError: no checkpoint (or none for ``step``).
      funcnet.errors.CheckpointMismatchError: the train state does not fit ``target``;
        names each differing path with both shapes and dtypes.
    """
    checkpointer = _checkpointer(source)
    step = checkpointer.info(step).step
    wanted = LoopPosition().checkpoint_tree(target)
    if isinstance(checkpointer, NpzCheckpointer):
        restored, rest = restore_within(checkpointer.directory, wanted, step)
    elif isinstance(checkpointer, OrbaxCheckpointer):
        restored, rest = _orbax_within(checkpointer, wanted, step)
    else:  # another backend: only the layout of the train state and position
        restored, rest = checkpointer.restore(wanted, step=step), {}
    position = LoopPosition(int(restored["epoch"]), int(restored["batch_in_epoch"]))
    return FitCheckpoint(_on_device(restored["train_state"], target), position, step, rest)


def restore_train_state(source: str | os.PathLike | Checkpointer, target: PyTree, step: Optional[int] = None) -> PyTree:
    """The :class:`funcnet.train.TrainState` of a checkpoint ``fit`` wrote: for
    inference, evaluation or fine-tuning from it, whatever else the checkpoint holds.
    ``restore_fit_checkpoint(source, target, step).train_state``; the arguments are
    :func:`restore_fit_checkpoint`'s.

    Examples:
      >>> import tempfile
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> run = tempfile.mkdtemp()
      >>> trained, _ = funcnet.fit(ts, loss_fn, opt, [np.ones((4, 2), np.float32)],
      ...                          callbacks=[funcnet.callbacks.Checkpoint(run)], progress=False)
      >>> abstract = jax.eval_shape(lambda: ts)          # shapes only, nothing allocated
      >>> back = funcnet.checkpoint.restore_train_state(run, abstract)
      >>> int(back.step), bool(jnp.array_equal(back.params["W"], trained.params["W"]))
      (1, True)
    """
    return restore_fit_checkpoint(source, target, step).train_state


def _checkpointer(source):
    """``source`` if a :class:`Checkpointer`, else the backend its directory holds."""
    if isinstance(source, Checkpointer):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"restore_fit_checkpoint: source must be a checkpoint directory or a "
            f"funcnet.checkpoint.Checkpointer, got {type(source).__name__}."
        )
    directory = Path(source)
    if (
        not all_steps(directory)
        and directory.is_dir()
        and any(p.is_dir() and p.name.isdigit() for p in directory.iterdir())
    ):
        return OrbaxCheckpointer(directory)  # orbax writes one directory per step
    return NpzCheckpointer(directory)


def _orbax_within(checkpointer: OrbaxCheckpointer, wanted: dict, step: int):
    """``(restored, rest)`` as :func:`funcnet.checkpoint._npz.restore_within` for orbax:
    the stored tree's other entries become NumPy targets of their stored shapes."""
    stored = checkpointer.stored_tree(step)
    if not isinstance(stored, dict):  # no metadata: the position's layout only
        return checkpointer.restore(wanted, step=step), {}
    rest = {
        k: jax.tree.map(lambda s: np.zeros(s.shape, s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s, v)
        for k, v in stored.items()
        if k not in wanted
    }
    restored = checkpointer.restore({**rest, **wanted}, step=step)
    return ({k: restored[k] for k in wanted}, {k: restored[k] for k in rest})


def _on_device(tree, target):
    """The leaves an abstract target leaf (a ``ShapeDtypeStruct`` without a sharding)
    gave as NumPy arrays, as ``jax.Array``\\ s: what a model applies."""

    def put(value, like):
        if isinstance(like, jax.ShapeDtypeStruct) and isinstance(value, (np.ndarray, np.generic)):
            return jnp.asarray(value)
        return value

    try:
        return jax.tree.map(put, tree, target)
    except (ValueError, TypeError):  # structures differ (a custom backend): as restored
        return tree
