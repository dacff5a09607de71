"""Where :func:`funcnet.loop.fit` stands, as a checkpoint stores it (public as ``funcnet.loop.LoopPosition``).

A module of its own, below both the loop (which restores it) and the callbacks (whose
``Checkpoint`` saves it), so that neither imports the other to reach it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["LoopPosition"]


class LoopPosition(NamedTuple):
    """Where the loop stands: the epoch, and how many of its batches were trained on.

    A checkpoint stores it next to the train state; resuming skips
    ``batch_in_epoch`` batches of ``epoch`` (the data order is the same for a
    seeded ``train_data(epoch)``), so the run continues as if never interrupted.

    Attributes:
      epoch: the epoch (0-based) the loop is in, or resumes at.
      batch_in_epoch: the batches of ``epoch`` already trained on.

    Examples:
      >>> pos = LoopPosition(epoch=2, batch_in_epoch=5)
      >>> pos
      LoopPosition(epoch=2, batch_in_epoch=5)
      >>> tree = pos.checkpoint_tree({"w": np.zeros(2)})  # what a checkpoint stores
      >>> sorted(tree), int(tree["batch_in_epoch"])
      (['batch_in_epoch', 'epoch', 'train_state'], 5)
    """

    epoch: int = 0
    batch_in_epoch: int = 0

    @classmethod
    def of(cls, ctx) -> "LoopPosition":
        """The position of a :class:`funcnet.loop.FitContext`."""
        return cls(ctx.epoch, ctx.batch_in_epoch)

    def checkpoint_tree(self, train_state) -> dict:
        """The tree a checkpoint holds: the train state and this position."""
        return {
            "train_state": train_state,
            "epoch": np.int64(self.epoch),
            "batch_in_epoch": np.int64(self.batch_in_epoch),
        }

    @classmethod
    def restore(cls, checkpointer, train_state, step=None):
        """``(train_state, position)`` from ``step`` (default: the latest) of a
        :class:`funcnet.checkpoint.Checkpointer`; arrays keep ``train_state``'s shardings."""
        restored = checkpointer.restore(cls().checkpoint_tree(train_state), step=step)
        return restored["train_state"], cls(int(restored["epoch"]), int(restored["batch_in_epoch"]))
