"""Running a trained network: the inputs-to-outputs function, with params and state bound."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax

from funcnet.core import as_layer

__all__ = ["make_predict_fn"]


def make_predict_fn(layer, params, state: Any = ()) -> Callable:
    """Returns ``predict(inputs) -> outputs``: ``layer.apply`` in eval mode, jitted.

    ``predict(x)`` is ``layer.apply(params, state, x, rng=None, train=False)[0]``
    (PyTorch's ``model.eval()`` followed by ``model(x)`` under ``no_grad``; Keras'
    ``model.predict``): Dropout is off, BatchNorm uses its running statistics, and
    the unchanged state is dropped. ``state`` may stay ``()`` when every layer is
    stateless; a network with BatchNorm needs the state from training
    (``train_state.state``, or ``train_state.state["gen"]`` for one model of several).

    Named ``make_*`` like :func:`funcnet.make_train_step`: it builds a function.
    ``params`` and ``state`` are passed to the jitted function as arguments, not
    baked into the compiled program as constants, so large models compile as fast
    as small ones; a new input shape compiles once more.
    """
    layer = as_layer(layer, "make_predict_fn")
    return functools.partial(_predictor(layer), params, state)


@functools.lru_cache(maxsize=64)
def _predictor(layer):
    # One jitted function per layer: new params for the same network (every epoch's,
    # say) reuse its compiled program instead of compiling another.
    @jax.jit
    def predict(params, state, inputs):
        outputs, _ = layer.apply(params, state, inputs, rng=None, train=False)
        return outputs

    return predict
