"""funcnet: a functional deep-learning framework on JAX.

Layers are ``(init, apply)`` pairs, state is explicit, every step is a pure
function that ``jax.jit`` and ``jax.pmap`` accept.

``funcnet.parallel`` is both the data-parallel module (``replicate``, ``shard``,
``initialize``, ...) and, called, the ``parallel`` combinator.
"""

from funcnet import (checkpoint, combinators, core, data, initializers, introspect, layers, losses,
                     metrics, optim, outputs, testing)
from funcnet.combinators import FanInConcat, FanInSum, FanOut, Identity, Residual, serial
from funcnet.core import Layer, named
from funcnet.introspect import count, summary
from funcnet import parallel  # noqa: E402  (the module; calling it builds the combinator)
from funcnet import train  # noqa: E402
from funcnet import precision  # noqa: E402  (after train: its scaled step builds on train's)

__version__ = "0.1.0"

__all__ = ["Layer", "named", "serial", "parallel", "FanOut", "FanInSum", "FanInConcat", "Residual",
           "Identity", "summary", "count", "checkpoint", "combinators", "core", "data",
           "initializers", "introspect", "layers", "losses", "metrics", "optim", "outputs",
           "precision", "testing", "train"]
