"""funcnet: a functional deep-learning framework on JAX.

Layers are ``(init, apply)`` pairs, state is explicit, every step is a pure
function that ``jax.jit`` and ``jax.pmap`` accept.
"""

from funcnet import combinators, core, initializers, layers
from funcnet.combinators import FanInConcat, FanInSum, FanOut, Identity, Residual, parallel, serial
from funcnet.core import Layer

__version__ = "0.1.0"
