"""Pooling: ``MaxPool``, ``AvgPool`` (windows over the spatial axes), ``MaxUnpool``,
``AdaptiveAvgPool``, ``AdaptiveMaxPool``, ``GlobalAvgPool`` and ``GlobalMaxPool``.

Inputs are channels-last, ``(N, *spatial, C)``, with ``len(window_shape)``
spatial axes (1, 2 or 3). Padding is as in :func:`funcnet.layers.conv.Conv`:
``"VALID"``, ``"SAME"``, ``"SAME_LOWER"``, an int ``p`` (PyTorch's ``padding=p``)
or per-axis ints or ``(low, high)`` pairs. Padding spelled as PyTorch spells it
(ints) must be at most half the window, ``window // 2``, PyTorch's rule (its check
ignores ``dilation``); ``(low, high)`` pairs must each be smaller than the (dilated)
window. A max-pool window that dilation makes skip over the whole input (it would hold
only padding) is refused, and so, as in PyTorch, is a 3-D ``AvgPool`` input smaller than
the window on some axis when the padding is given as ints.
Output sizes are ``(in + low + high - window) // stride + 1`` (PyTorch's
``ceil_mode=False``), or with ``ceil_mode=True`` PyTorch's rounding up, less a last
window that would start in the right padding.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet.core import Layer, as_tuple, check_input, check_shape, named
from funcnet.errors import ArgumentError
from funcnet.layers._windows import normalize_padding, window_tuple

__all__ = ["MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool", "MaxUnpool", "AdaptiveAvgPool", "AdaptiveMaxPool"]


def _pool_args(name, window_shape, strides, padding, dilation=1):
    """Checked window, strides, dilation, dilated window ("span"), padding, and whether
    the padding is spelled as PyTorch spells it (ints, or "VALID")."""
    window = window_tuple(name, window_shape, "window_shape")
    n = len(window)
    # PyTorch's default: non-overlapping windows.
    strides = as_tuple(name, window if strides is None else strides, n, "strides")
    dilation = as_tuple(name, dilation, n, "dilation")
    span = tuple((w - 1) * d + 1 for w, d in zip(window, dilation))
    # Ints are PyTorch's spelling, so PyTorch's limit applies to them; (low, high) pairs
    # have no PyTorch counterpart and keep the looser "every window overlaps the input".
    torch_spelling = checks.is_int(padding) or (
        isinstance(padding, (tuple, list)) and all(checks.is_int(p) for p in padding)
    )
    padding = normalize_padding(name, padding, n)
    if not isinstance(padding, str):
        for ax, (pad, w, d, e) in enumerate(zip(padding, window, dilation, span)):
            # PyTorch checks the undilated window in every rank (its "effective kernel
            # size" check also runs, but is looser): pad <= kernel_size // 2.
            if torch_spelling and pad[0] > w // 2:
                dilated = f" (dilation {d} does not count)" if d > 1 else ""
                raise ArgumentError(
                    f"{name}: padding {pad[0]} on spatial axis {ax} is more than half the "
                    f"window: window {w}{dilated}, so padding may be at most {w // 2} (PyTorch's "
                    f"rule: pad should be smaller than or equal to half of kernel size). "
                    f"Use a smaller padding or a larger window."
                )
            if max(pad) >= e:
                raise ArgumentError(
                    f"{name}: padding {padding} must be smaller than the window {span} "
                    f"(after dilation) on each axis, or some windows would only cover padding."
                )
    return window, strides, dilation, span, padding, torch_spelling or padding == "VALID"


def _geometry(name, size, span, stride, padding, ceil_mode, axis):
    """``(lo, hi, out, extra)`` for one spatial axis of known ``size``.

    ``extra`` is how far past ``hi`` the last window reaches with ``ceil_mode``:
    PyTorch lets that window hang over the end, and pads it only for the reduction.
    """
    lo, hi = lax.padtype_to_pads([size], [span], [stride], padding)[0] if isinstance(padding, str) else padding
    lo, hi = int(lo), int(hi)
    # Python's // rounds towards -inf, as PyTorch's div_rtn: with ceil_mode an input
    # smaller than the window still gives one window.
    out = (size + lo + hi - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + lo:
        out -= 1  # PyTorch drops a last window that would start in the right padding.
    if out < 1:
        raise ValueError(
            f"{name}: input size {size} on axis {axis} is too small for a window "
            f"of {span} (after dilation) with padding {(lo, hi)}: the output would "
            f"be empty. Use a larger input, a smaller filter/window, or more "
            f"padding."
        )
    return lo, hi, out, max((out - 1) * stride + span - (size + lo + hi), 0)


def _check_min_input(name, size, window, axis):
    """PyTorch's avg_pool3d refuses an input smaller than the kernel on any axis,
    whatever the padding (its other pools only need one window)."""
    if size < window:
        raise ArgumentError(
            f"{name}: input size {size} on axis {axis} is smaller than the window "
            f"{window} (PyTorch's avg_pool3d rule: input image smaller than kernel size, "
            f"padding does not count). Use an input of at least {window} on that axis or "
            f"a smaller window, or spell the padding as (low, high) pairs or 'SAME', "
            f"which only need one window."
        )


def _check_reaches_input(name, size, geometry, stride, window, dilation, axis):
    """Refuse a dilated window that skips over the whole input (only padding in it):
    its max would be -inf, and PyTorch's index for it points outside the window (its
    gradient lands on another element, even another channel's)."""
    lo, _, out, _ = geometry
    first = np.arange(out)[:, None] * stride - lo + np.arange(window)[None, :] * dilation
    empty = ~np.any((first >= 0) & (first < size), axis=1)
    if empty.any():
        o = int(np.argmax(empty))
        raise ValueError(
            f"{name}: window {o} on axis {axis} covers only padding: input size {size}, "
            f"window {window} with dilation {dilation} reads positions "
            f"{first[o].tolist()} (padding {lo} before). Its max would be -inf, and "
            f"PyTorch's index and gradient for such a window point at another element. "
            f"Use a smaller dilation or less padding, or a larger input."
        )


def _make_pool(
    name, span, strides, padding, ceil_mode, reduce, two_outputs=False, *, window=None, dilation=None, min_input=False
):
    """``window``/``dilation`` given: refuse windows of only padding (MaxPool);
    ``min_input``: refuse an input smaller than ``span`` (PyTorch's avg_pool3d)."""
    n = len(span)

    def axis_geometry(ax, size, w, s, p):
        if min_input:
            _check_min_input(name, size, w, ax + 1)
        g = _geometry(name, size, w, s, p, ceil_mode, ax + 1)
        if dilation is not None and dilation[ax] > 1:
            _check_reaches_input(name, size, g, s, window[ax], dilation[ax], ax + 1)
        return g

    def geometry(shape):
        return [
            None if d == -1 else axis_geometry(ax, d, w, s, p)
            for ax, (d, w, s, p) in enumerate(
                zip(shape[1:-1], span, strides, [padding] * n if isinstance(padding, str) else padding)
            )
        ]

    def out_shape(shape):
        spatial = tuple(-1 if g is None else g[2] for g in geometry(shape))
        out = (shape[0],) + spatial + (shape[-1],)
        return (out, out) if two_outputs else out

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=n + 2)
        return out_shape(shape), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, rank=n + 2)
        return reduce(inputs, geometry(tuple(inputs.shape))), state

    return named(name, init, apply)


def _windows(x, positions, valid):
    """Every window of ``x`` gathered: ``(patches, mask, flat)``.

    ``positions[a]`` and ``valid[a]`` are ``(out_a, k_a)`` arrays for spatial axis
    ``a``: the input position of the ``k``-th element of window ``o``, and whether it
    is inside the input (padding is not). ``patches`` is ``(N, *out, K, C)`` with the
    ``K = prod(k_a)`` elements of each window in row-major order, PyTorch's scan
    order; ``mask`` and ``flat`` (the flat spatial index, ``h * W + w`` in 2-D) are
    ``(1, *out, K, 1)`` NumPy constants.
    """
    n = len(positions)
    sizes = x.shape[1:-1]
    outs = tuple(p.shape[0] for p in positions)
    ks = tuple(p.shape[1] for p in positions)
    index, mask, flat = [], np.ones((), bool), np.zeros((), np.int64)
    for a, (p, v) in enumerate(zip(positions, valid)):
        shape = [1] * (2 * n)
        shape[a], shape[n + a] = outs[a], ks[a]
        p = np.clip(p, 0, sizes[a] - 1).reshape(shape)
        index.append(p)
        mask = mask & v.reshape(shape)
        flat = flat * sizes[a] + p
    k = math.prod(ks)
    # One gather: its gradient is one scatter-add, exact for overlapping windows too.
    patches = x[(slice(None),) + tuple(index)].reshape((x.shape[0],) + outs + (k, x.shape[-1]))
    mask = np.broadcast_to(mask, outs + ks).reshape((1,) + outs + (k, 1))
    flat = np.broadcast_to(flat, outs + ks).reshape((1,) + outs + (k, 1)).astype(np.int32)
    return patches, mask, flat


def _select_max(patches, mask, flat, return_indices):
    """PyTorch's max over each window: its value, and its flat index if asked.

    PyTorch scans a window in row-major order and keeps a value when it is larger
    than the best so far or NaN: the first maximum wins, or the last NaN. The one
    element chosen gets the whole gradient (``jnp.max`` would split it between ties).
    """
    k = patches.shape[-2]
    inexact = jnp.issubdtype(patches.dtype, jnp.inexact)
    low = -np.inf if inexact else jnp.iinfo(patches.dtype).min
    v = jnp.where(mask, patches, np.array(low, patches.dtype))
    top = lax.stop_gradient(jnp.max(v, axis=-2, keepdims=True))
    choose = jnp.argmax(mask & (v == top), axis=-2)  # the first True; 0 if none
    if inexact:
        nan = v != v
        last_nan = k - 1 - jnp.argmax(nan[..., ::-1, :], axis=-2)
        choose = jnp.where(jnp.any(nan, axis=-2), last_nan, choose)
    pick = lax.stop_gradient(np.arange(k).reshape(k, 1) == choose[..., None, :])
    # where, not a one-hot product: -inf * 0 would be NaN.
    out = jnp.sum(jnp.where(pick, v, jnp.zeros((), v.dtype)), axis=-2, dtype=v.dtype)
    if not return_indices:
        return out
    return out, jnp.sum(jnp.where(pick, flat, 0), axis=-2, dtype=jnp.int32)


def MaxPool(
    window_shape: Sequence[int],
    strides: Optional[int | Sequence[int]] = None,
    padding: str | int | Sequence[int | Tuple[int, int]] = "VALID",
    *,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Layer:
    """Max over each window, as ``torch.nn.MaxPool{1,2,3}d`` (on channels-last input).

    ``y[n, o, c] = max_k x[n, o * stride + k * dilation - pad_lo, c]`` over the
    window's positions inside the input (padding never wins). With ties the first
    maximum in row-major window order is taken, for the value's gradient and its
    index, as in PyTorch (a NaN is the maximum; of several, the last).

    Args:
      window_shape: 1 to 3 ints, one per spatial axis; the input is
        ``(N, *spatial, C)`` with ``len(window_shape)`` spatial axes.
      strides: an int or one per axis; defaults to ``window_shape`` (PyTorch's).
      padding: ``"VALID"``, ``"SAME"``, ``"SAME_LOWER"``, an int or per-axis ints
        (PyTorch's ``padding``: at most ``window // 2``, dilation aside, as PyTorch
        checks it), or per-axis ``(low, high)`` pairs.
      dilation: an int or one per axis: the gap between window elements,
        PyTorch's ``dilation``; the window spans ``(window - 1) * dilation + 1``.
      ceil_mode: PyTorch's ``ceil_mode``: output sizes
        ``ceil((in + lo + hi - span) / stride) + 1`` instead of rounding down,
        less a last window that would start in the right padding; the last window
        may then reach past the padded input, and only its real elements count.
      return_indices: also return the position of each maximum, as PyTorch's
        ``return_indices=True``: an int32 array of the output's shape holding, per
        ``(n, c)``, the flat index of the maximum among the input's spatial
        positions (``h * W + w`` in 2-D, ``(d * H + h) * W + w`` in 3-D): PyTorch's
        numbers, for :func:`MaxUnpool`.

    Returns:
      The layer; it outputs ``y``, or ``(y, indices)`` with ``return_indices``.
      Integer inputs keep their dtype.

    Raises:
      ArgumentError: a bad window, stride, dilation or padding (an int padding
        larger than ``window // 2``, as in PyTorch, whatever the dilation).
      ValueError: an input too small for one window; or a window that dilation
        makes skip over the whole input, so that it holds only padding (e.g. input
        size 1, window 2, dilation 2, padding 1). PyTorch gives such a window -inf,
        an index outside it and its gradient to another element (even of another
        channel); funcnet refuses it.

    Examples:
      >>> x = jnp.array([1., 3., 3., 2., 5.]).reshape(1, 5, 1)
      >>> y, i = MaxPool((2,), ceil_mode=True, return_indices=True).apply((), (), x)[0]
      >>> y[0, :, 0].tolist(), i[0, :, 0].tolist()
      ([3.0, 3.0, 5.0], [1, 2, 4])
    """
    name = f"MaxPool({window_shape!r})"
    window, strides, dilation, span, padding, _ = _pool_args(name, window_shape, strides, padding, dilation)
    ceil_mode = checks.flag(name, "ceil_mode", ceil_mode)
    return_indices = checks.flag(name, "return_indices", return_indices)
    dims, steps = (1,) + window + (1,), (1,) + strides + (1,)
    # reduce_window's gradient (select-and-scatter) has no dilation, and it gives no
    # indices: those two options gather the windows instead.
    gather = return_indices or any(d > 1 for d in dilation)

    def reduce(x, geometry):
        if gather:
            positions, valid = [], []
            for size, (lo, _, out, _), w, s, d in zip(x.shape[1:-1], geometry, window, strides, dilation):
                p = np.arange(out)[:, None] * s - lo + np.arange(w)[None, :] * d
                positions.append(p)
                valid.append((p >= 0) & (p < size))
            return _select_max(*_windows(x, positions, valid), return_indices)
        pads = tuple((lo, hi + extra) for lo, hi, _, extra in geometry)
        if (
            strides == window
            and all(p == (0, 0) for p in pads)
            and jax.default_backend() == "cpu"
            and not _spatially_split(x)
        ):
            return _tiled_max(x, window)
        # -inf (the identity of max) lets lax use its reduce_window_max rule.
        init = -np.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
        return lax.reduce_window(x, np.array(init, x.dtype), lax.max, dims, steps, ((0, 0),) + pads + ((0, 0),))

    return _make_pool(
        name, span, strides, padding, ceil_mode, reduce, two_outputs=return_indices, window=window, dilation=dilation
    )


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
    tiled = jnp.reshape(
        x,
        (x.shape[0],) + tiles + (x.shape[-1],),
        out_sharding=_mesh.explicit_sharding(x, batch, *(None,) * 2 * n, channel),
    )
    # (N, o1, w1, ..., on, wn, C) -> (N, o1, ..., on, C, w1 * ... * wn)
    order = (0,) + tuple(1 + 2 * i for i in range(n)) + (2 * n + 1,) + tuple(2 + 2 * i for i in range(n))
    windows = jnp.reshape(
        tiled.transpose(order),
        (tiled.shape[0], *out, x.shape[-1], -1),
        out_sharding=_mesh.explicit_sharding(x, batch, *(None,) * n, channel, None),
    )
    first = jnp.argmax(windows, axis=-1)[..., None] == jnp.arange(windows.shape[-1])
    # where, not a one-hot product: -inf * 0 would be NaN.
    return jnp.sum(jnp.where(lax.stop_gradient(first), windows, jnp.zeros((), x.dtype)), axis=-1)


def _spatially_split(x) -> bool:
    """True when a spatial axis of ``x`` is split over Explicit mesh axes: windows would
    straddle devices, which ``reduce_window`` handles and a reshape into tiles cannot."""
    spec = _mesh.explicit_spec(x)
    return spec is not None and any(p is not None for p in spec[1:-1])


def AvgPool(
    window_shape: Sequence[int],
    strides: Optional[int | Sequence[int]] = None,
    padding: str | int | Sequence[int | Tuple[int, int]] = "VALID",
    count_include_pad: bool = True,
    *,
    ceil_mode: bool = False,
    divisor_override: Optional[int] = None,
) -> Layer:
    """Mean over each window, as ``torch.nn.AvgPool{1,2,3}d`` (on channels-last input).

    ``y[n, o, c] = sum_k x_pad[n, o * stride + k - pad_lo, c] / D`` with zero
    padding. ``count_include_pad=True`` (PyTorch's default) counts the padded zeros
    in ``D``: ``D = prod(window_shape)``, except for a ``ceil_mode`` window that
    reaches past the padded input, which counts up to the end of the padding only
    (PyTorch's rule). ``False`` counts the real (unpadded) elements of each window.
    This applies to ``"SAME"`` padding too: TF/Keras ``SAME`` average pooling is
    ``count_include_pad=False``.

    Args:
      window_shape: 1 to 3 ints, one per spatial axis; the input is
        ``(N, *spatial, C)`` with ``len(window_shape)`` spatial axes.
      strides: an int or one per axis; defaults to ``window_shape`` (PyTorch's).
      padding: ``"VALID"``, ``"SAME"``, ``"SAME_LOWER"``, an int or per-axis ints
        (PyTorch's ``padding``: at most half the window), or per-axis ``(low, high)``
        pairs.
      count_include_pad: whether padded zeros count in ``D`` (PyTorch's default True).
      ceil_mode: PyTorch's ``ceil_mode``: output sizes rounded up, less a last window
        that would start in the right padding (see :func:`MaxPool`).
      divisor_override: a non-zero int: ``D`` for every window, PyTorch's
        ``divisor_override`` (``count_include_pad`` then does not matter).

    Returns:
      The layer. Integer inputs give floating-point outputs.

    Raises:
      ArgumentError: a bad window, stride or padding (an int padding larger than half
        the window, as in PyTorch), ``divisor_override`` 0 or not an int, or in 3-D
        with int padding an input smaller than the window on some axis (PyTorch's
        avg_pool3d refuses it whatever the padding; its 1-D and 2-D pools do not).
      ValueError: an input too small for one window.

    Examples:
      >>> x = jnp.arange(1., 6.).reshape(1, 5, 1)
      >>> AvgPool((2,), ceil_mode=True).apply((), (), x)[0][0, :, 0].tolist()
      [1.5, 3.5, 5.0]
      >>> AvgPool((2,), divisor_override=1).apply((), (), x)[0][0, :, 0].tolist()
      [3.0, 7.0]
    """
    name = f"AvgPool({window_shape!r})"
    window, strides, _, _, padding, torch_spelling = _pool_args(name, window_shape, strides, padding)
    count_include_pad = checks.flag(name, "count_include_pad", count_include_pad)
    ceil_mode = checks.flag(name, "ceil_mode", ceil_mode)
    if divisor_override is not None:
        checks.integer(name, "divisor_override", divisor_override)
        if divisor_override == 0:
            raise ArgumentError(
                f"{name}: divisor_override must be a non-zero int or None, got "
                f"0 (PyTorch: divisor must be not zero). Use None to divide by "
                f"the window's size."
            )
        divisor_override = int(divisor_override)
    dims, steps = (1,) + window + (1,), (1,) + strides + (1,)

    def divisors(shape, geometry):
        # PyTorch's per-window divisor, separable over axes: a trace-time constant.
        total = np.ones((), np.float64)
        for size, w, s, (lo, hi, out, _) in zip(shape[1:-1], window, strides, geometry):
            starts = np.arange(out) * s - lo
            if count_include_pad:
                per_axis = np.minimum(starts + w, size + hi) - starts
            else:
                per_axis = np.minimum(starts + w, size) - np.maximum(starts, 0)
            total = np.multiply.outer(total, per_axis)
        return total[..., None]

    def reduce(x, geometry):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.result_type(float))
        pads = tuple((lo, hi + extra) for lo, hi, _, extra in geometry)
        summed = lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, steps, ((0, 0),) + pads + ((0, 0),))
        if divisor_override is not None:
            return summed / jnp.asarray(divisor_override, x.dtype)
        if count_include_pad and all(g[3] == 0 for g in geometry):
            return summed / jnp.asarray(math.prod(window), x.dtype)
        return summed / jnp.asarray(divisors(x.shape, geometry), x.dtype)

    # PyTorch's avg_pool3d (not its 1-D/2-D pools, nor max pools) wants the unpadded input
    # at least the window on every axis; "SAME" and (low, high) pairs are not PyTorch's.
    return _make_pool(name, window, strides, padding, ceil_mode, reduce, min_input=len(window) == 3 and torch_spelling)


def _global_avg_init(rng, input_shape):
    shape = check_shape("GlobalAvgPool", input_shape, min_rank=3)
    return (shape[0], shape[-1]), (), ()


def _global_avg_apply(params, state, inputs, *, rng=None, train=False):
    check_input("GlobalAvgPool", inputs, min_rank=3)
    return jnp.mean(inputs, axis=tuple(range(1, inputs.ndim - 1))), state


GlobalAvgPool: Layer = named("GlobalAvgPool", _global_avg_init, _global_avg_apply)
"""The mean over every axis but the first and the last: ``(N, *spatial, C) -> (N, C)``.

A layer value (use ``GlobalAvgPool``, not ``GlobalAvgPool()``); on channels-last input it
equals ``torch.nn.AdaptiveAvgPool2d(1)`` (1d, 3d) followed by flattening.
"""


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
    return jnp.sum(jnp.where(pick, inputs, jnp.zeros((), inputs.dtype)), axis=axes, dtype=inputs.dtype), state


GlobalMaxPool: Layer = named("GlobalMaxPool", _global_max_init, _global_max_apply)
"""The max over every axis but the first and the last: ``(N, *spatial, C) -> (N, C)``.

A layer value (use ``GlobalMaxPool``, not ``GlobalMaxPool()``); on channels-last input it
equals ``torch.nn.AdaptiveMaxPool2d(1)`` (1d, 3d) followed by flattening, gradients included:
with ties the whole gradient goes to the first maximum in row-major order, as torch's
adaptive max pooling and ``MaxPool`` do (``jnp.max`` would split it between the ties).
Integer inputs keep their dtype.
"""


def _scatter_planes(size, v, idx, add):
    """``(N, L, C)`` values written at ``(N, L, C)`` flat indices into ``(N, size, C)`` zeros."""
    n, _, c = v.shape
    # A negative index would wrap around; moved out of range, it is dropped as the rest.
    idx = jnp.where(idx < 0, size, idx)
    # jnp.arange: n is symbolic under jax.export's symbolic batch
    target = jnp.zeros((n, size, c), v.dtype).at[jnp.arange(n)[:, None, None], idx, jnp.arange(c)[None, None, :]]
    return target.add(v, mode="drop") if add else target.set(v, mode="drop")


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _unpool_planes(size, v, idx):
    return _scatter_planes(size, v, idx, add=False)


@_unpool_planes.defjvp
def _unpool_planes_jvp(size, primals, tangents):
    # A scatter-add tangent, so the gradient is a gather: each value gets the output's
    # gradient at its index, duplicates included, as PyTorch's max_unpool backward.
    # (The gradient of a scatter-set gives a duplicated index's gradient to one value.)
    v, idx = primals
    return _unpool_planes(size, v, idx), _scatter_planes(size, tangents[0], idx, add=True)


def _unpool_shape(name: str, shape, window, strides, padding, output_size):
    """``MaxUnpool``'s output shape for values of ``shape`` (channels-last): torch's
    ``(in - 1) * stride - low - high + window`` per spatial axis, or ``output_size``
    where given, which must lie within a stride of it, as torch requires."""
    spatial = []
    for ax, (size, w, s, (lo, hi)) in enumerate(zip(shape[1:-1], window, strides, padding)):
        want = None if output_size is None else output_size[ax]
        if size == -1:
            spatial.append(-1 if want is None else want)
            continue
        default = (size - 1) * s - lo - hi + w
        if want is None:
            if default < 1:
                raise ValueError(
                    f"{name}: input size {size} on axis {ax + 1} with padding "
                    f"{(lo, hi)} gives an empty output. Use less padding."
                )
            want = default
        elif not default - s < want < default + s:
            raise ArgumentError(
                f"{name}: output_size {output_size} is invalid: on spatial axis {ax} it "
                f"must be between {default - s} and {default + s}, exclusive, for an input "
                f"of size {size} (PyTorch's rule: (in - 1) * stride - 2 * padding + "
                f"window = {default}, give or take less than a stride)."
            )
        spatial.append(want)
    return (shape[0],) + tuple(spatial) + (shape[-1],)


def MaxUnpool(
    window_shape: Sequence[int],
    strides: Optional[int | Sequence[int]] = None,
    padding: int | Sequence[int | Tuple[int, int]] = 0,
    output_size: Optional[Sequence[int]] = None,
) -> Layer:
    """The inverse of :func:`MaxPool` with ``return_indices``, as ``torch.nn.MaxUnpool{1,2,3}d``.

    Takes ``(values, indices)``, both ``(N, *spatial, C)`` (channels-last), and
    returns zeros of shape ``(N, *output, C)`` with each value written at its flat
    spatial index (``h * W + w`` in 2-D) in its ``(n, c)`` plane: MaxPool's indices,
    or PyTorch's. Indices written twice (overlapping pool windows) hold the same
    value when they come from a max pool; each value's gradient is the output's
    gradient at its index, as in PyTorch.

    Args:
      window_shape: 1 to 3 ints, the pool's window (one per spatial axis).
      strides: an int or one per axis; defaults to ``window_shape``.
      padding: the pool's padding, an int or per-axis ints or ``(low, high)`` pairs.
      output_size: the output's spatial sizes (one per axis), or None for
        ``(in - 1) * stride - pad_lo - pad_hi + window`` (PyTorch's default). Given,
        each must be within ``stride - 1`` of that default, as in PyTorch; pass the
        pooled input's spatial shape when the pool dropped a remainder.

    Returns:
      The layer.

    Raises:
      ArgumentError: bad arguments, an ``output_size`` too far from the default, or
        (outside ``jit``) an index outside the output. Under ``jit``, values at such
        indices are dropped.

    Examples:
      >>> x = jnp.array([1., 3., 2., 5.]).reshape(1, 4, 1)
      >>> y, i = MaxPool((2,), return_indices=True).apply((), (), x)[0]
      >>> MaxUnpool((2,)).apply((), (), (y, i))[0][0, :, 0].tolist()
      [0.0, 3.0, 0.0, 5.0]
    """
    name = f"MaxUnpool({window_shape!r})"
    window = window_tuple(name, window_shape, "window_shape")
    n = len(window)
    strides = as_tuple(name, window if strides is None else strides, n, "strides")
    if isinstance(padding, str):
        raise ArgumentError(
            f"{name}: padding must be an int, {n} ints or {n} (low, high) "
            f"pairs, the pool's, got the string {padding!r}. A 'SAME' pool's "
            f"padding is its output_size: pass the pooled input's spatial "
            f"shape as output_size."
        )
    padding = normalize_padding(name, padding, n)
    if output_size is not None:
        if (
            not isinstance(output_size, (tuple, list))
            or len(output_size) != n
            or not all(checks.is_int(v) and v > 0 for v in output_size)
        ):
            raise ArgumentError(
                f"{name}: output_size must be None or {n} positive ints (the "
                f"spatial sizes, channels-last), got {output_size!r}."
            )
        output_size = tuple(int(v) for v in output_size)

    def out_shape(shape):
        return _unpool_shape(name, shape, window, strides, padding, output_size)

    def split(where, pair):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ArgumentError(
                f"{name}: {where} must be a pair (values, indices), as "
                f"MaxPool(..., return_indices=True) gives, got "
                f"{type(pair).__name__}."
            )
        return pair

    def init(rng, input_shape):
        if (
            isinstance(input_shape, (tuple, list))
            and len(input_shape) == 2
            and all(isinstance(s, (tuple, list)) for s in input_shape)
        ):
            values, indices = input_shape
        else:
            values, indices = split("input_shape", None)
        values = check_shape(name, values, rank=n + 2, what="values")
        indices = check_shape(name, indices, rank=n + 2, what="indices")
        if values != indices:
            raise ValueError(f"{name}: values {values} and indices {indices} must have one shape.")
        return out_shape(values), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        values, indices = split("the input", inputs)
        check_input(name, values, rank=n + 2)
        check_input(name, indices, rank=n + 2)
        if values.shape != indices.shape or not jnp.issubdtype(indices.dtype, jnp.integer):
            raise ArgumentError(
                f"{name}: indices must be integers of the values' shape "
                f"{tuple(values.shape)}, got {indices.dtype} of shape "
                f"{tuple(indices.shape)}."
            )
        shape = out_shape(tuple(values.shape))
        size = math.prod(shape[1:-1])
        known = checks.concrete(indices)
        if known is not None and known.size and (known.min() < 0 or known.max() >= size):
            bad = known.min() if known.min() < 0 else known.max()
            raise ArgumentError(
                f"{name}: index {int(bad)} is outside the output's {size} "
                f"spatial positions {shape[1:-1]} (PyTorch: Found an invalid "
                f"max index). Check window_shape, strides, padding and "
                f"output_size against the pool's."
            )
        nb, c = values.shape[0], values.shape[-1]
        out = _unpool_planes(size, values.reshape(nb, -1, c), indices.reshape(nb, -1, c))
        return out.reshape(shape), state

    return named(name, init, apply)


def _adaptive_args(name, output_size):
    if (
        not isinstance(output_size, (tuple, list))
        or not 1 <= len(output_size) <= 3
        or not all(v is None or checks.is_int(v) for v in output_size)
    ):
        raise ArgumentError(
            f"{name}: output_size must be a tuple of 1 to 3 entries, one per "
            f"spatial axis (e.g. (7, 7) for 2-D), each a positive int or None "
            f"(keep that axis's size), got {output_size!r}."
        )
    for v in output_size:
        if v is not None and v <= 0:
            raise ArgumentError(
                f"{name}: output_size entries must be positive, got {v} in "
                f"{tuple(output_size)} (PyTorch would return an empty output). "
                f"Use None to keep an axis's size."
            )
    return tuple(None if v is None else int(v) for v in output_size)


def _bins(size, out):
    """PyTorch's adaptive bins over an axis: ``floor(i * size / out)`` to
    ``ceil((i + 1) * size / out)``, as ``(positions, valid, lengths)``."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    positions = start[:, None] + np.arange(int((end - start).max()))[None, :]
    return positions, positions < end[:, None], end - start


def _make_adaptive(name, output_size, reduce, two_outputs=False):
    n = len(output_size)

    def out_shape(shape):
        spatial = tuple(d if o is None else o for d, o in zip(shape[1:-1], output_size))
        out = (shape[0],) + spatial + (shape[-1],)
        return (out, out) if two_outputs else out

    def init(rng, input_shape):
        return out_shape(check_shape(name, input_shape, rank=n + 2)), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, rank=n + 2)
        bins = [_bins(d, d if o is None else o) for d, o in zip(inputs.shape[1:-1], output_size)]
        return reduce(inputs, bins), state

    return named(name, init, apply)


def AdaptiveAvgPool(output_size: Sequence[Optional[int]]) -> Layer:
    """Mean over adaptive bins, as ``torch.nn.AdaptiveAvgPool{1,2,3}d`` (channels-last).

    Output ``o`` along an axis of size ``in`` averages the input positions
    ``floor(o * in / out)`` to ``ceil((o + 1) * in / out) - 1``: PyTorch's bins, which
    overlap when ``out`` does not divide ``in`` and repeat inputs when ``out > in``.

    Args:
      output_size: 1 to 3 entries, one per spatial axis (the input is
        ``(N, *spatial, C)``), each a positive int or None to keep that axis's size.

    Returns:
      The layer: ``(N, *spatial, C) -> (N, *output_size, C)``. Integer inputs give
      floating-point outputs.

    Raises:
      ArgumentError: ``output_size`` is not 1 to 3 positive ints or None.

    Examples:
      >>> x = jnp.arange(1., 6.).reshape(1, 5, 1)
      >>> AdaptiveAvgPool((3,)).apply((), (), x)[0][0, :, 0].tolist()
      [1.5, 3.0, 4.5]
      >>> AdaptiveAvgPool((4, None)).init(jax.random.key(0), (-1, 9, 7, 3))[0]
      (-1, 4, 7, 3)
    """
    name = f"AdaptiveAvgPool({output_size!r})"
    output_size = _adaptive_args(name, output_size)

    def reduce(x, bins):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.result_type(float))
        patches, mask, _ = _windows(x, [b[0] for b in bins], [b[1] for b in bins])
        counts = np.ones((), np.float64)
        for _, _, lengths in bins:
            counts = np.multiply.outer(counts, lengths)
        # where, not a mask product: an inf outside a bin must not make it NaN.
        summed = jnp.sum(jnp.where(mask, patches, jnp.zeros((), x.dtype)), axis=-2)
        return summed / jnp.asarray(counts[None, ..., None], x.dtype)

    return _make_adaptive(name, output_size, reduce)


def AdaptiveMaxPool(output_size: Sequence[Optional[int]], return_indices: bool = False) -> Layer:
    """Max over adaptive bins, as ``torch.nn.AdaptiveMaxPool{1,2,3}d`` (channels-last).

    The bins are :func:`AdaptiveAvgPool`'s (PyTorch's). Ties and NaNs as in
    :func:`MaxPool`: the first maximum in row-major order gets the gradient and the
    index (of several NaNs, the last).

    Args:
      output_size: 1 to 3 entries, one per spatial axis (the input is
        ``(N, *spatial, C)``), each a positive int or None to keep that axis's size.
      return_indices: also return each maximum's flat spatial index per ``(n, c)``
        (``h * W + w`` in 2-D), int32, PyTorch's numbers (see :func:`MaxPool`).

    Returns:
      The layer; it outputs ``y``, or ``(y, indices)`` with ``return_indices``.
      Integer inputs keep their dtype.

    Raises:
      ArgumentError: ``output_size`` is not 1 to 3 positive ints or None.

    Examples:
      >>> x = jnp.array([1., 3., 2., 5., 4.]).reshape(1, 5, 1)
      >>> y, i = AdaptiveMaxPool((3,), return_indices=True).apply((), (), x)[0]
      >>> y[0, :, 0].tolist(), i[0, :, 0].tolist()
      ([3.0, 5.0, 5.0], [1, 3, 3])
    """
    name = f"AdaptiveMaxPool({output_size!r})"
    output_size = _adaptive_args(name, output_size)
    return_indices = checks.flag(name, "return_indices", return_indices)

    def reduce(x, bins):
        patches, mask, flat = _windows(x, [b[0] for b in bins], [b[1] for b in bins])
        return _select_max(patches, mask, flat, return_indices)

    return _make_adaptive(name, output_size, reduce, two_outputs=return_indices)
