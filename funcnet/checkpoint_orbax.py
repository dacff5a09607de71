"""Deprecated: :class:`funcnet.checkpoint.OrbaxCheckpointer` is the one import path of the
orbax-checkpoint backend (``from funcnet.checkpoint import OrbaxCheckpointer``).

``funcnet.checkpoint_orbax.OrbaxCheckpointer`` still works in 0.2 with a
``DeprecationWarning``, and goes in 0.3.
"""

from funcnet._deprecation import moved_names

__all__: list = []

__getattr__ = moved_names(__name__, {"OrbaxCheckpointer": "funcnet.checkpoint"})
