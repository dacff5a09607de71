"""funcnet: a functional deep-learning framework on JAX.

Layers are ``(init, apply)`` pairs, state is explicit, every step is a pure
function that ``jax.jit`` and ``jax.pmap`` accept. The README's "Layout" section
says which module holds which concept.
"""

from funcnet import (callbacks, checkpoint, checkpoint_orbax, combinators, core, data, distributed,
                     initializers, introspect, layers, loop, losses, metrics, optim, outputs,
                     testing, train)
from funcnet.combinators import FanInConcat, FanInSum, FanOut, Identity, Residual, parallel, serial
from funcnet.core import Layer, named
from funcnet.introspect import count, summary
from funcnet.loop import fit
from funcnet.train import Aux, TrainState, make_eval_step, make_train_step

__version__ = "0.1.0"

__all__ = ["Layer", "named", "serial", "parallel", "FanOut", "FanInSum", "FanInConcat", "Residual",
           "Identity", "summary", "count", "fit", "TrainState", "Aux", "make_train_step",
           "make_eval_step", "callbacks", "checkpoint", "checkpoint_orbax", "combinators", "core",
           "data", "distributed", "initializers", "introspect", "layers", "loop", "losses", "metrics",
           "optim", "outputs", "testing", "train"]
