"""Combinators: layers built from layers, threading params, state and rng.

``serial`` and ``parallel`` keep one params/state entry per child (a tuple), so
the pytrees mirror the network. Every child gets its own key from
``jax.random.split``: two Dropouts in one ``serial`` never share a mask.
"""

from __future__ import annotations

import jax.numpy as jnp

from funcnet import _checks as checks
from funcnet.core import Layer, as_layer, named, normalize_axis, split_rng


def serial(*layers) -> Layer:
    """Composes layers in sequence: ``serial(f, g)(x) = g(f(x))``.

    params and state are tuples with one entry per layer; ``serial`` of serials nests.
    """
    layers = tuple(as_layer(l, "serial") for l in layers)
    inits, applies = zip(*layers) if layers else ((), ())

    def init(rng, input_shape):
        params, state = [], []
        for init_fn, key in zip(inits, split_rng(rng, len(layers))):
            input_shape, p, s = init_fn(key, input_shape)
            params.append(p)
            state.append(s)
        return input_shape, tuple(params), tuple(state)

    def apply(params, state, inputs, *, rng=None, train=False):
        _check_children("serial", params, state, len(layers))
        new_state = []
        for fn, p, s, key in zip(applies, params, state, split_rng(rng, len(layers))):
            inputs, s = fn(p, s, inputs, rng=key, train=train)
            new_state.append(s)
        return inputs, tuple(new_state)

    return named("serial", init, apply)


def parallel(*layers) -> Layer:
    """Applies the i-th layer to the i-th element of a tuple input.

    Input and output are tuples of the same length as ``layers``; use with
    ``FanOut`` and ``FanInSum``/``FanInConcat`` to build branches.
    """
    layers = tuple(as_layer(l, "parallel") for l in layers)
    inits, applies = zip(*layers) if layers else ((), ())
    n = len(layers)

    def init(rng, input_shape):
        _check_tuple("parallel", input_shape, n, "input_shape")
        outs = [f(k, shape) for f, k, shape in zip(inits, split_rng(rng, n), input_shape)]
        return tuple(o[0] for o in outs), tuple(o[1] for o in outs), tuple(o[2] for o in outs)

    def apply(params, state, inputs, *, rng=None, train=False):
        _check_children("parallel", params, state, n)
        _check_tuple("parallel", inputs, n, "inputs")
        outs = [f(p, s, x, rng=k, train=train)
                for f, p, s, x, k in zip(applies, params, state, inputs, split_rng(rng, n))]
        return tuple(o[0] for o in outs), tuple(o[1] for o in outs)

    return named("parallel", init, apply)


def FanOut(num: int) -> Layer:
    """Copies its input ``num`` times into a tuple."""
    num = checks.positive_int("FanOut", "num", num)

    def init(rng, input_shape):
        return (input_shape,) * num, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        return (inputs,) * num, state

    return named(f"FanOut({num})", init, apply)


def _fan_in_sum():
    def init(rng, input_shape):
        _check_tuple("FanInSum", input_shape, None, "input_shape")
        shapes = {tuple(s) for s in input_shape}
        if len(shapes) != 1:
            raise ValueError(f"FanInSum: all branches must have the same shape, got "
                             f"{tuple(input_shape)}.")
        return tuple(input_shape[0]), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        _check_tuple("FanInSum", inputs, None, "inputs")
        shapes = {x.shape for x in inputs}
        if len(shapes) != 1:
            raise ValueError(f"FanInSum: all branches must have the same shape, got "
                             f"{[x.shape for x in inputs]}.")
        return sum(inputs[1:], inputs[0]), state

    return named("FanInSum", init, apply)


FanInSum = _fan_in_sum()  # sums a tuple of same-shaped inputs


def FanInConcat(axis: int = -1) -> Layer:
    """Concatenates a tuple of inputs along ``axis``."""
    axis = checks.integer("FanInConcat", "axis", axis)

    def init(rng, input_shape):
        _check_tuple("FanInConcat", input_shape, None, "input_shape")
        rank = len(input_shape[0])
        ax = normalize_axis("FanInConcat", axis, rank)
        for s in input_shape:
            if len(s) != rank or any(a != b for i, (a, b) in enumerate(zip(s, input_shape[0]))
                                     if i != ax):
                raise ValueError(f"FanInConcat(axis={axis}): branch shapes must agree except on "
                                 f"the concatenation axis, got {tuple(input_shape)}.")
        sizes = [s[ax] for s in input_shape]
        total = -1 if -1 in sizes else sum(sizes)
        out = list(input_shape[0])
        out[ax] = total
        return tuple(out), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        _check_tuple("FanInConcat", inputs, None, "inputs")
        return jnp.concatenate(inputs, axis=axis), state

    return named(f"FanInConcat(axis={axis})", init, apply)


def _identity():
    def init(rng, input_shape):
        return input_shape, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        return inputs, state

    return named("Identity", init, apply)


Identity = _identity()  # returns its input unchanged


def Residual(layer) -> Layer:
    """``x + f(x)``; ``f`` must preserve the shape of its input."""
    inner = as_layer(layer, "Residual")

    def init(rng, input_shape):
        out_shape, params, state = inner.init(rng, input_shape)
        if tuple(out_shape) != tuple(input_shape):
            raise ValueError(f"Residual: the wrapped layer must keep the shape, but maps "
                             f"{tuple(input_shape)} to {tuple(out_shape)}. Add a projection "
                             f"(e.g. serial(FanOut(2), parallel(f, Dense(...)), FanInSum)).")
        return out_shape, params, state

    def apply(params, state, inputs, *, rng=None, train=False):
        out, state = inner.apply(params, state, inputs, rng=rng, train=train)
        return inputs + out, state

    return named(f"Residual({inner.name})", init, apply)


def _check_tuple(layer, value, n, what):
    if not isinstance(value, (tuple, list)) or (value and not isinstance(value[0], (tuple, list))
                                                and what == "input_shape"):
        raise TypeError(f"{layer}: expected a tuple of {'shapes' if what == 'input_shape' else 'arrays'}"
                        f" (one per branch), got {value!r}. Put FanOut(n) in front.")
    if n is not None and len(value) != n:
        raise ValueError(f"{layer}: expected {n} branches, got {len(value)}.")


def _check_children(layer, params, state, n):
    if not isinstance(params, (tuple, list)) or len(params) != n:
        raise ValueError(f"{layer}: params do not match this {layer} of {n} layers (got "
                         f"{type(params).__name__} of length {len(params) if hasattr(params, '__len__') else '?'}). "
                         f"Use the params returned by this layer's init.")
    if not isinstance(state, (tuple, list)) or len(state) != n:
        raise ValueError(f"{layer}: state does not match this {layer} of {n} layers. Use the "
                         f"state returned by this layer's init (or the last apply).")
