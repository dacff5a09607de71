"""funcnet: a functional deep-learning framework on JAX.

Layers are ``(init, apply)`` pairs, state is explicit, every step is a pure
function that ``jax.jit`` and ``jax.pmap`` accept. The
[API reference's index](docs/api/index.md) says which module holds which concept.
"""

from funcnet import (
    callbacks,
    checkpoint,
    combinators,
    core,
    data,
    datasets,
    decoding,
    distributed,
    errors,
    inference,
    initializers,
    interop,
    introspect,
    layers,
    loop,
    losses,
    metrics,
    models,
    onnx,
    optim,
    outputs,
    params,
    precision,
    sharding,
    testing,
    train,
    xla,
)
from funcnet.combinators import (
    FanInConcat,
    FanInSum,
    FanOut,
    Identity,
    Remat,
    Residual,
    Scan,
    parallel,
    serial,
    stack_params,
    unstack_params,
)
from funcnet.core import Layer, named
from funcnet.decoding import generate
from funcnet.inference import make_predict_fn
from funcnet.introspect import count, summary
from funcnet.loop import fit
from funcnet.params import freeze, kernel_mask, mask_where, path_str, paths, subtree_mask
from funcnet.train import Aux, TrainState, copy_params, make_eval_step, make_train_step, polyak_update

from funcnet._version import __version__

# a deprecated alias module, imported so that funcnet.checkpoint_orbax keeps working
from funcnet import checkpoint_orbax  # noqa: F401

__all__ = [
    "Layer",
    "named",
    "serial",
    "parallel",
    "FanOut",
    "FanInSum",
    "FanInConcat",
    "Residual",
    "Identity",
    "Remat",
    "Scan",
    "stack_params",
    "unstack_params",
    "generate",
    "summary",
    "count",
    "fit",
    "TrainState",
    "Aux",
    "make_train_step",
    "make_eval_step",
    "copy_params",
    "polyak_update",
    "make_predict_fn",
    "paths",
    "path_str",
    "mask_where",
    "kernel_mask",
    "subtree_mask",
    "freeze",
    "__version__",
    # modules
    "callbacks",
    "checkpoint",
    "combinators",
    "core",
    "data",
    "datasets",
    "decoding",
    "distributed",
    "errors",
    "inference",
    "initializers",
    "interop",
    "introspect",
    "layers",
    "loop",
    "losses",
    "metrics",
    "models",
    "onnx",
    "optim",
    "outputs",
    "params",
    "precision",
    "sharding",
    "testing",
    "train",
    "xla",
]
