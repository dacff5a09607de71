"""The ``fit`` loop: epochs of the pure step, evaluation, callbacks, resumption.

Everything :func:`fit` does can be written by hand with
:func:`funcnet.train.make_train_step` (the examples show both). The loop keeps its
position in one small record, :class:`LoopPosition`, which is what a checkpoint stores
next to the train state and what ``resume_from`` reads back; callbacks see the run
through :class:`FitContext`; :class:`FitOptions` holds the settings a run rarely changes.

This package's ``__init__`` is its only way in. Its parts (data sources, placements,
the epoch loop, the run record, progress) are in the
[table of the loop's parts](../concepts.md#the-loops-parts).
"""

from funcnet._loop_position import LoopPosition
from funcnet.loop._checks import LogKeys
from funcnet.loop._context import FitContext
from funcnet.loop._fit import fit
from funcnet.loop._options import FitOptions

__all__ = ["fit", "FitOptions", "FitContext", "LoopPosition", "LogKeys"]
