"""Checkpoints at scale: :class:`OrbaxCheckpointer`, the orbax-checkpoint backend behind
:class:`funcnet.checkpoint.Checkpointer` (also ``funcnet.checkpoint.OrbaxCheckpointer``).

Use it when the train state is sharded (over devices, or over processes in a
multi-process run) or large enough that a step should not wait for the write::

    from funcnet.checkpoint_orbax import OrbaxCheckpointer
    ckptr = OrbaxCheckpointer("runs/big", keep=3)        # async by default
    ckptr.save(step, train_state)       # returns once the arrays are copied off the device
    ckptr.wait()                        # or close() at the end

orbax-checkpoint is optional (``pip install funcnet[orbax]``); it is imported when an
:class:`OrbaxCheckpointer` is made. The class's docstring has the details.
"""

from funcnet.checkpoint import OrbaxCheckpointer

__all__ = ["OrbaxCheckpointer"]
