"""Pooling: ``MaxPool``, ``AvgPool`` (windows over the spatial axes), ``GlobalAvgPool`` and
``GlobalMaxPool``.

Inputs are channels-last, ``(N, *spatial, C)``, with ``len(window_shape)``
spatial axes. The windows are ``lax.reduce_window`` over the spatial axes only.
Padding is as in :func:`funcnet.layers.conv.Conv`: ``"VALID"``, ``"SAME"``,
``"SAME_LOWER"``, an int ``p`` (PyTorch's ``padding=p``) or per-axis ints or
``(low, high)`` pairs; each pad must be smaller than its window so that every
window overlaps the input. There is no ``ceil_mode``: output sizes are
``(in + low + high - window) // stride + 1``, PyTorch's ``ceil_mode=False``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from funcnet import _mesh
from funcnet.core import Layer, as_tuple, check_input, check_shape, named
from funcnet.layers._windows import normalize_padding, output_size, window_tuple

__all__ = ["MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool"]


def _pool_args(name, window_shape, strides, padding):
    window = window_tuple(name, window_shape, "window_shape")
    n = len(window)
    # PyTorch's default: non-overlapping windows.
    strides = as_tuple(name, window if strides is None else strides, n, "strides")
    padding = normalize_padding(name, padding, n)
    if not isinstance(padding, str):
        for pad, w in zip(padding, window):
            if max(pad) >= w:
                raise ValueError(f"{name}: padding {padding} must be smaller than the window "
                                 f"{window} on each axis, or some windows would only cover "
                                 f"padding.")
    return window, strides, padding


def _pads(shape, window, strides, padding):
    """Per-spatial-axis ``(low, high)`` pads for a concrete input shape."""
    if isinstance(padding, str):
        return tuple(tuple(p) for p in lax.padtype_to_pads(shape[1:-1], window, strides, padding))
    return padding


def _make_pool(name, window, strides, padding, reduce):
    n = len(window)

    def out_shape(shape):
        pads = [padding] * n if isinstance(padding, str) else padding
        spatial = tuple(output_size(name, d, w, s, p, ax + 1) for ax, (d, w, s, p)
                        in enumerate(zip(shape[1:-1], window, strides, pads)))
        return (shape[0],) + spatial + (shape[-1],)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=n + 2)
        return out_shape(shape), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, rank=n + 2)
        out_shape(tuple(inputs.shape))
        pads = _pads(inputs.shape, window, strides, padding)
        return reduce(inputs, pads), state

    return named(name, init, apply)


def MaxPool(window_shape, strides=None, padding="VALID") -> Layer:
    """Max over each window, as ``torch.nn.MaxPool{1,2,3}d`` (on channels-last input).

    ``y[n, p, c] = max_k x[n, p * stride + k - pad_lo, c]``; padded positions are
    ``-inf`` and never win. ``strides`` defaults to ``window_shape``.
    """
    name = f"MaxPool({window_shape!r})"
    window, strides, padding = _pool_args(name, window_shape, strides, padding)
    dims, steps = (1,) + window + (1,), (1,) + strides + (1,)

    def reduce(x, pads):
        if (strides == window and all(p == (0, 0) for p in pads) and jax.default_backend() == "cpu"
                and not _spatially_split(x)):
            return _tiled_max(x, window)
        # -inf (the identity of max) lets lax use its reduce_window_max rule.
        init = -np.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
        return lax.reduce_window(x, np.array(init, x.dtype), lax.max, dims, steps,
                                 ((0, 0),) + pads + ((0, 0),))

    return _make_pool(name, window, strides, padding, reduce)


def _tiled_max(x, window):
    """Max over non-overlapping, unpadded windows, as reshape + argmax + select.

    Same values and gradients as ``reduce_window(max)``, ties included: the
    gradient goes to the first maximum of each window in row-major order, as
    XLA's select-and-scatter and torch's MaxPool do. The point is speed:
    select-and-scatter (reduce_window's gradient) is a slow scalar loop on
    XLA:CPU, tens of ms for a LeNet pool, while this gradient is elementwise
    (see benchmarks/CONV_NOTES.md). Used on the CPU backend only: elsewhere
    select-and-scatter has fast kernels and the transposes here would cost.
    """
    n = len(window)
    out = [d // w for d, w in zip(x.shape[1:-1], window)]
    x = x[(slice(None),) + tuple(slice(0, o * w) for o, w in zip(out, window))]  # VALID drops the rest
    # Batch and channel axes keep their Explicit-mesh split (if any); spatial ones are whole.
    spec = _mesh.explicit_spec(x) or (None,) * x.ndim
    batch, channel = spec[0], spec[-1]
    tiles = tuple(v for o, w in zip(out, window) for v in (o, w))
    tiled = jnp.reshape(x, (x.shape[0],) + tiles + (x.shape[-1],),
                        out_sharding=_mesh.explicit_sharding(x, batch, *(None,) * 2 * n,
                                                                   channel))
    # (N, o1, w1, ..., on, wn, C) -> (N, o1, ..., on, C, w1 * ... * wn)
    order = (0,) + tuple(1 + 2 * i for i in range(n)) + (2 * n + 1,) + tuple(2 + 2 * i for i in range(n))
    windows = jnp.reshape(tiled.transpose(order), (tiled.shape[0], *out, x.shape[-1], -1),
                          out_sharding=_mesh.explicit_sharding(x, batch, *(None,) * n,
                                                                     channel, None))
    first = jnp.argmax(windows, axis=-1)[..., None] == jnp.arange(windows.shape[-1])
    # where, not a one-hot product: -inf * 0 would be NaN.
    return jnp.sum(jnp.where(lax.stop_gradient(first), windows, jnp.zeros((), x.dtype)), axis=-1)


def _spatially_split(x) -> bool:
    """True when a spatial axis of ``x`` is split over Explicit mesh axes: windows would
    straddle devices, which ``reduce_window`` handles and a reshape into tiles cannot."""
    spec = _mesh.explicit_spec(x)
    return spec is not None and any(p is not None for p in spec[1:-1])


def AvgPool(window_shape, strides=None, padding="VALID", count_include_pad: bool = True) -> Layer:
    """Mean over each window, as ``torch.nn.AvgPool{1,2,3}d`` (on channels-last input).

    ``y[n, p, c] = sum_k x_pad[n, p * stride + k - pad_lo, c] / D`` with zero
    padding. ``count_include_pad=True`` (PyTorch's default) divides by the window
    size ``D = prod(window_shape)``, padded zeros included; ``False`` divides by
    the number of real (unpadded) elements in each window. This applies to
    ``"SAME"`` padding too: TF/Keras ``SAME`` average pooling is
    ``count_include_pad=False``. ``strides`` defaults to ``window_shape``.
    Integer inputs give floating-point outputs.
    """
    name = f"AvgPool({window_shape!r})"
    window, strides, padding = _pool_args(name, window_shape, strides, padding)
    dims, steps = (1,) + window + (1,), (1,) + strides + (1,)

    def counts(shape, pads):
        # Real elements per window, separable over axes: a trace-time constant.
        total = np.ones((), np.float32)
        for size, w, s, (lo, hi) in zip(shape[1:-1], window, strides, pads):
            starts = np.arange((size + lo + hi - w) // s + 1) * s - lo
            per_axis = np.minimum(starts + w, size) - np.maximum(starts, 0)
            total = np.multiply.outer(total, per_axis.astype(np.float32))
        return total[..., None]

    def reduce(x, pads):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.result_type(float))
        summed = lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, steps,
                                   ((0, 0),) + pads + ((0, 0),))
        if count_include_pad:
            return summed / jnp.asarray(math.prod(window), x.dtype)
        return summed / jnp.asarray(counts(x.shape, pads), x.dtype)

    return _make_pool(name, window, strides, padding, reduce)


def _global_avg_init(rng, input_shape):
    shape = check_shape("GlobalAvgPool", input_shape, min_rank=3)
    return (shape[0], shape[-1]), (), ()


def _global_avg_apply(params, state, inputs, *, rng=None, train=False):
    check_input("GlobalAvgPool", inputs, min_rank=3)
    return jnp.mean(inputs, axis=tuple(range(1, inputs.ndim - 1))), state


# Mean over every axis but the first and the last: (N, *spatial, C) -> (N, C). A layer
# value (use GlobalAvgPool, not GlobalAvgPool()); on channels-last input it equals
# torch.nn.AdaptiveAvgPool2d(1) followed by flattening.
GlobalAvgPool: Layer = named("GlobalAvgPool", _global_avg_init, _global_avg_apply)


def _global_max_init(rng, input_shape):
    shape = check_shape("GlobalMaxPool", input_shape, min_rank=3)
    return (shape[0], shape[-1]), (), ()


def _global_max_apply(params, state, inputs, *, rng=None, train=False):
    check_input("GlobalMaxPool", inputs, min_rank=3)
    axes = tuple(range(1, inputs.ndim - 1))
    # The first maximum of each (example, channel) in row-major order, found by
    # reductions over the spatial axes only (no reshape, so any Explicit-mesh split of
    # the batch or channel axis is kept). A NaN is the maximum, as in torch.
    top = lax.stop_gradient(jnp.max(inputs, axis=axes, keepdims=True))
    hit = (inputs == top) | (inputs != inputs)
    spatial = inputs.shape[1:-1]
    position = np.arange(math.prod(spatial), dtype=np.int32).reshape((1,) + spatial + (1,))
    first = jnp.min(jnp.where(hit, position, position.size), axis=axes, keepdims=True)
    # where, not a one-hot product: -inf * 0 would be NaN.
    pick = lax.stop_gradient(position == first)
    return jnp.sum(jnp.where(pick, inputs, jnp.zeros((), inputs.dtype)), axis=axes,
                   dtype=inputs.dtype), state


# Max over every axis but the first and the last: (N, *spatial, C) -> (N, C). A layer
# value (use GlobalMaxPool, not GlobalMaxPool()); on channels-last input it equals
# torch.nn.AdaptiveMaxPool2d(1) (1d, 3d) followed by flattening, gradients included:
# with ties the whole gradient goes to the first maximum in row-major order, as torch's
# adaptive max pooling and MaxPool do (jnp.max would split it between the ties). Integer
# inputs keep their dtype.
GlobalMaxPool: Layer = named("GlobalMaxPool", _global_max_init, _global_max_apply)
