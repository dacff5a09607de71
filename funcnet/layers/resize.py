"""Resizing: ``Upsample`` (nearest, area, linear and bicubic interpolation) and ``ZeroPad``.

Inputs are channels-last, ``(N, *spatial, C)`` with 1 to 3 spatial axes: ``(N, L, C)``,
``(N, H, W, C)`` or ``(N, D, H, W, C)``. Both layers are stateless and parameter-free.

``Upsample`` reproduces ``torch.nn.Upsample`` (``F.interpolate``) index for index: the
source positions and weights are computed at trace time with PyTorch's formulas in
PyTorch's precision (the interpolating modes in float64 for float64 inputs, float32
otherwise; the nearest modes in float32), and the layer is then a gather (nearest
modes), a gather and a weighted sum per spatial axis (linear and bicubic modes), or
adaptive average pooling (``"area"``). ``jax.image.resize`` is not used because it
matches none of these modes exactly: its ``"nearest"`` samples pixel centres (torch's
``"nearest-exact"``, not ``"nearest"``), it has no ``align_corners``, its cubic kernel
has ``A = -0.5`` (torch's ``-0.75``), it antialiases when downsampling (torch's
``Upsample`` does not), and it derives the sampling scale from the sizes, where torch
uses ``1 / scale_factor`` when a scale factor is given.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet.core import Layer, check_input, check_shape, named
from funcnet.layers.pooling import AdaptiveAvgPool

__all__ = ["Upsample", "ZeroPad"]

# The modes tied to a number of spatial axes, as in torch; the others take 1 to 3.
_MODE_AXES = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
_LINEAR_NAMES = {1: "linear", 2: "bilinear", 3: "trilinear"}
_INTERPOLATING = ("linear", "bilinear", "trilinear", "bicubic")  # the align_corners modes
_MODES = ("nearest", "nearest-exact", "area") + _INTERPOLATING
_LAYOUTS = {1: "(N, L, C)", 2: "(N, H, W, C)", 3: "(N, D, H, W, C)"}
_F32 = np.float32
_CUBIC_A = -0.75  # torch's (and OpenCV's) bicubic kernel parameter


# --------------------------------------------------------------------------- #
# PyTorch's source indices and weights (aten/src/ATen/native/UpSample.h), computed
# in NumPy on static sizes: trace-time constants.
# --------------------------------------------------------------------------- #


def _index_dtype(dtype) -> type:
    """torch's ``opmath_t`` for the interpolating modes: float64 for float64 inputs, else
    float32 (half-precision inputs too)."""
    return np.float64 if dtype == jnp.float64 else _F32


def _scale(in_size: int, out_size: int, scale_factor, ft=_F32):
    """torch's ``compute_scales_value``: ``1 / scale_factor`` when one was given, else in/out,
    in ``ft``."""
    if scale_factor is not None and scale_factor > 0:
        return ft(1.0 / scale_factor)
    return ft(in_size) / ft(out_size)


def _nearest_index(in_size: int, out_size: int, scale_factor, exact_cases: bool) -> np.ndarray:
    """``src = min(floor(dst * scale), in - 1)``; with ``exact_cases`` (torch does this for
    2 spatial axes only, ``nearest_idx`` in UpSample.h) a same-size axis is copied and a
    doubled one reads ``dst // 2`` whatever the scale factor."""
    if exact_cases and out_size == in_size:
        return np.arange(out_size)
    if exact_cases and out_size == 2 * in_size:
        return np.arange(out_size) >> 1
    src = np.arange(out_size).astype(_F32) * _scale(in_size, out_size, scale_factor)
    return np.minimum(np.floor(src).astype(np.int64), in_size - 1)


def _nearest_exact_index(in_size: int, out_size: int, scale_factor) -> np.ndarray:
    """torch's ``nearest_exact_idx``: ``src = min(floor((dst + 0.5) * scale), in - 1)``, the
    product in float64 of a float32 scale, floored as float32 (torch's ``floorf``)."""
    src = (np.arange(out_size) + 0.5) * np.float64(_scale(in_size, out_size, scale_factor))
    return np.minimum(np.floor(src.astype(_F32)).astype(np.int64), in_size - 1)


def _source(in_size: int, out_size: int, scale_factor, align_corners: bool, ft, cubic: bool):
    """torch's ``area_pixel_compute_source_index`` for every ``dst``, in ``ft``: negative
    positions clamp to 0 except for cubic, whose taps reach beyond the edge."""
    dst = np.arange(out_size).astype(ft)
    if align_corners:
        scale = ft(in_size - 1) / ft(out_size - 1) if out_size > 1 else ft(0)
        return scale * dst
    src = _scale(in_size, out_size, scale_factor, ft) * (dst + ft(0.5)) - ft(0.5)
    return src if cubic else np.maximum(src, ft(0))


def _floor_and_fraction(src, in_size: int, ft):
    """torch's ``guard_index_and_lambda``: ``i = min(floor(src), in - 1)`` and
    ``t = clip(src - i, 0, 1)``."""
    i = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    return i, np.clip(src - i.astype(ft), ft(0), ft(1)).astype(ft)


def _linear_taps(in_size: int, out_size: int, scale_factor, align_corners: bool, ft):
    """``((i0, i1), (w0, w1))``: ``y[dst] = w0 * x[i0] + w1 * x[i1]`` along one axis."""
    src = _source(in_size, out_size, scale_factor, align_corners, ft, cubic=False)
    i0, w1 = _floor_and_fraction(src, in_size, ft)
    i1 = i0 + (i0 < in_size - 1)
    return (i0, i1), ((ft(1) - w1).astype(ft), w1)


def _cubic_taps(in_size: int, out_size: int, scale_factor, align_corners: bool, ft):
    """Four indices and weights along one axis: ``y[dst] = sum_k w_k * x[i - 1 + k]`` with
    ``i = floor(src)``, the indices clamped to ``[0, in - 1]`` (torch's
    ``upsample_get_value_bounded``) and torch's ``get_cubic_upsample_coefficients`` of
    ``t = src - i``, written in its order of operations."""
    src = _source(in_size, out_size, scale_factor, align_corners, ft, cubic=True)
    i, t = _floor_and_fraction(src, in_size, ft)
    a, one = ft(_CUBIC_A), ft(1)

    def near(x):  # the kernel for |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # the kernel for 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = (far(t + one), near(t), near(one - t), far((one - t) + one))
    index = tuple(np.clip(i + k, 0, in_size - 1) for k in (-1, 0, 1, 2))
    return index, tuple(w.astype(ft) for w in weights)


def _positive_reals(name: str, what: str, value, *, ints: bool):
    """An int/real or a tuple of 1 to 3 of them, all positive, as a tuple (or a scalar)."""
    ok = checks.is_int if ints else checks.is_real
    kind = "int" if ints else "number"
    items = value if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(items) <= 3 or not all(ok(v) for v in items) or not all(math.isfinite(v) and v > 0 for v in items):
        raise checks.ArgumentError(
            f"{name}: {what} must be a positive {kind} or a tuple of 1 to 3 positive "
            f"{kind}s (one per spatial axis), got {value!r}."
        )
    items = tuple(int(v) if ints else float(v) for v in items)
    return items if isinstance(value, (tuple, list)) else items[0]


# --------------------------------------------------------------------------- #
# Upsample's pieces: its options, the input's rank, the output size, the resizing.
# --------------------------------------------------------------------------- #


def _upsample_options(name: str, scale_factor, size, mode: str, align_corners):
    """Checked ``(scale_factor, size, n_spatial)``; ``n_spatial`` None: 1 to 3 axes."""
    if (scale_factor is None) == (size is None):
        raise checks.ArgumentError(
            f"{name}: give exactly one of scale_factor (e.g. Upsample(scale_factor=2)) or "
            f"size (e.g. Upsample(size=(32, 32))), got "
            f"{'both' if size is not None else 'neither'}."
        )
    checks.one_of(name, "mode", mode, _MODES)
    checks.flag(name, "align_corners", align_corners)
    if align_corners and mode not in _INTERPOLATING:
        raise checks.ArgumentError(
            f"{name}: align_corners=True is only for the interpolating "
            f"modes {', '.join(map(repr, _INTERPOLATING))}; {mode} "
            f"has no corners to align. Drop align_corners."
        )
    if size is not None:
        size = _positive_reals(name, "size", size, ints=True)
    else:
        scale_factor = _positive_reals(name, "scale_factor", scale_factor, ints=False)
    given = size if size is not None else scale_factor
    given_dims = len(given) if isinstance(given, tuple) else None
    n_spatial = _MODE_AXES.get(mode, given_dims)
    if mode in _MODE_AXES and given_dims not in (None, n_spatial):
        raise checks.ArgumentError(
            f"{name}: mode {mode!r} interpolates {n_spatial} spatial axes, but "
            f"{'size' if size is not None else 'scale_factor'} has {given_dims} entries."
        )
    return scale_factor, size, n_spatial


def _check_rank(name: str, mode: str, n_spatial, shape) -> None:
    rank = len(shape)
    if n_spatial is None:
        if not 3 <= rank <= 5:
            raise ValueError(
                f"{name}: expected an input (N, *spatial, C) with 1 to 3 "
                f"spatial axes (rank 3 to 5, channels last), got shape "
                f"{shape}."
            )
    elif rank != n_spatial + 2:
        hint = ""
        if mode in _MODE_AXES and 3 <= rank <= 5:
            hint = f" For a rank-{rank} input use mode={_LINEAR_NAMES[rank - 2]!r}."
            if mode == "bicubic":
                hint = " torch's bicubic is 2-D only too." + hint
        raise ValueError(
            f"{name}: expected a rank-{n_spatial + 2} input "
            f"{_LAYOUTS[n_spatial]} (channels last), got shape {shape}.{hint}"
        )


def _per_axis(value, n: int) -> tuple:
    return value if isinstance(value, tuple) else (value,) * n


def _out_spatial(name: str, spatial, size, scale_factor) -> tuple:
    """The output's spatial sizes: ``size``, or ``floor(in * scale_factor)`` (-1 stays -1)."""
    n = len(spatial)
    if size is not None:
        return _per_axis(size, n)
    out = []
    for ax, (d, s) in enumerate(zip(spatial, _per_axis(scale_factor, n))):
        o = -1 if d == -1 else math.floor(d * s)
        if o == 0:
            raise ValueError(
                f"{name}: input size {d} on axis {ax + 1} times scale_factor "
                f"{s:g} is below 1: the output would be empty. Use a larger "
                f"input or scale_factor, or give size=."
            )
        out.append(o)
    return tuple(out)


def _resize_nearest(x, spatial, outs, factors, exact: bool):
    for ax, (d, o, s) in enumerate(zip(spatial, outs, factors), start=1):
        if exact:
            index = _nearest_exact_index(d, o, s)
        else:
            index = _nearest_index(d, o, s, exact_cases=len(spatial) == 2)
        if o != d or not np.array_equal(index, np.arange(d)):
            x = jnp.take(x, index, axis=ax)
    return x


def _interpolate(x, spatial, outs, factors, taps, copy_same: bool):
    """``y[dst] = sum_k w_k * x[i_k]`` along each spatial axis, the last first: torch's
    kernel interpolates the innermost axis inside the outer ones, so this is its order of
    operations, and so is the left-to-right sum. ``copy_same``: an axis whose size does
    not change is copied (torch's linear modes; its bicubic interpolates it)."""
    ft = _index_dtype(x.dtype)
    for ax in reversed(range(1, len(spatial) + 1)):
        d, o, s = spatial[ax - 1], outs[ax - 1], factors[ax - 1]
        if copy_same and o == d:
            continue
        index, weights = taps(d, o, s, ft=ft)
        bshape = (o,) + (1,) * (x.ndim - ax - 1)
        # one gather for all the taps: XLA compiles one several times faster than k
        rows = jnp.split(jnp.take(x, np.concatenate(index), axis=ax), len(index), axis=ax)
        terms = [r * jnp.asarray(w.reshape(bshape), x.dtype) for r, w in zip(rows, weights)]
        x = functools.reduce(lambda total, term: total + term, terms)
    return x


def _resize(name: str, x, mode: str, scale_factor, size, align_corners: bool):
    spatial = tuple(x.shape[1:-1])
    outs = _out_spatial(name, spatial, size, scale_factor)
    factors = _per_axis(scale_factor, len(spatial))
    if mode in ("nearest", "nearest-exact"):
        return _resize_nearest(x, spatial, outs, factors, exact=mode == "nearest-exact")
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    if mode == "area":
        return AdaptiveAvgPool(outs).apply((), (), x)[0]
    cubic = mode == "bicubic"
    taps = functools.partial(_cubic_taps if cubic else _linear_taps, align_corners=align_corners)
    return _interpolate(x, spatial, outs, factors, taps, copy_same=not cubic)


def Upsample(
    scale_factor: Optional[float | Sequence[float]] = None,
    size: Optional[int | Sequence[int]] = None,
    mode: str = "nearest",
    align_corners: bool = False,
) -> Layer:
    """Resizes the spatial axes of ``(N, *spatial, C)`` inputs, as ``torch.nn.Upsample``.

    Give exactly one of ``scale_factor`` (output size ``floor(in * scale_factor)``,
    per axis) or ``size`` (the output spatial size). Each is a number for every
    spatial axis or a tuple with one entry per spatial axis; with a tuple the input
    must have that many spatial axes. Scale factors below 1 shrink the input: then,
    as in torch, every output sample of the interpolating and nearest modes reads at
    most two (bicubic: four) input samples per axis (no antialiasing).

    Modes, with ``dst`` an output index and ``in``/``out`` the sizes of one axis, and
    ``scale = 1 / scale_factor`` when a scale factor is given, else ``in / out``:

    * ``"nearest"`` (any of 1 to 3 spatial axes), PyTorch's legacy ``"nearest"``:
      ``y[dst] = x[min(floor(dst * scale), in - 1)]`` (computed in float32, as torch
      does). For 2 spatial axes only, torch (and so this layer) copies an axis whose
      size does not change and reads ``dst // 2`` on one whose size doubles, whatever
      the scale factor; with 1 or 3 spatial axes e.g. ``scale_factor=1.1`` on 7
      samples gives 7 samples read from ``[0, 0, 1, 2, 3, 4, 5]``, as in torch.
    * ``"nearest-exact"`` (1 to 3 spatial axes): the nearest sample to the pixel
      centre, ``y[dst] = x[min(floor((dst + 0.5) * scale), in - 1)]`` (Pillow's and
      scikit-image's nearest), without ``"nearest"``'s special cases.
    * ``"area"`` (1 to 3 spatial axes): adaptive average pooling to the output size,
      as torch's (``torch.nn.AdaptiveAvgPool{1,2,3}d``, see
      :func:`~funcnet.layers.AdaptiveAvgPool`): ``y[dst]`` is the mean of
      ``x[floor(dst * in / out) : ceil((dst + 1) * in / out)]``.
    * ``"linear"`` (``(N, L, C)``), ``"bilinear"`` (``(N, H, W, C)``) and
      ``"trilinear"`` (``(N, D, H, W, C)``): separable linear interpolation,
      ``y[dst] = (1 - l) * x[i0] + l * x[i0 + 1]`` with ``i0 = floor(src)``,
      ``l = src - i0`` (the upper index clamped to ``in - 1``) and

      - ``align_corners=False`` (default): ``src = max(scale * (dst + 0.5) - 0.5, 0)``
        (half-pixel centres; the corners of the input and output grids line up);
      - ``align_corners=True``: ``src = dst * (in - 1) / (out - 1)`` (the centres of
        the corner pixels line up; the scale factor then only sets the output size).

      As in torch, an axis whose size does not change is copied unchanged.
    * ``"bicubic"`` (``(N, H, W, C)``, as torch's): separable cubic convolution with
      torch's ``A = -0.75``, ``y[dst] = sum_{k=-1..2} w_k(t) * x[clip(i0 + k, 0, in - 1)]``
      with ``i0 = floor(src)``, ``t = src - i0``, ``src`` as for the linear modes but
      not clamped at 0 (for either ``align_corners``), and the Keys kernel
      ``w(s) = (A + 2)|s|^3 - (A + 3)|s|^2 + 1`` for ``|s| <= 1``,
      ``A|s|^3 - 5A|s|^2 + 8A|s| - 4A`` for ``1 < |s| < 2``. Outputs may overshoot
      the input's range, as torch's do (no clamping).

    Positions and weights are computed as torch computes them: in float64 for float64
    inputs, float32 otherwise (the nearest modes always float32). Integer inputs give
    floating-point outputs, except with the nearest modes (a gather keeps the dtype).
    ``align_corners`` is for the linear and bicubic modes only (torch raises for the
    others too). Output values match ``torch.nn.Upsample`` on the same (channels-first)
    data to rounding; gradients are those of the gather and weighted sum (of the mean,
    for ``"area"``).

    Args:
      scale_factor: the factor of the spatial sizes, a positive number or a tuple of
        one per spatial axis; None when ``size`` is given.
      size: the output spatial size, a positive int or a tuple of one per spatial axis;
        None when ``scale_factor`` is given.
      mode: ``"nearest"``, ``"nearest-exact"``, ``"area"``, ``"linear"``,
        ``"bilinear"``, ``"trilinear"`` or ``"bicubic"``.
      align_corners: for the linear and bicubic modes, True lines up the centres of the
        corner pixels; must be False with the other modes.

    Returns:
      The layer, an ``(init, apply)`` pair without params or state:
      ``init(rng, (N, *spatial, C))`` gives ``((N, *out_spatial, C), (), ())``.

    Raises:
      ArgumentError: both or neither of ``scale_factor`` and ``size``; an unknown
        ``mode``; ``align_corners`` not a bool, or True with a mode that is not linear
        or bicubic; a size or scale factor that is not positive, or a tuple of the
        wrong length for the mode.
      ValueError: an input of the wrong rank (not 1 to 3 spatial axes, or not the
        mode's or the tuple's number); a scale factor that gives an empty output.

    Examples:
      >>> init, apply = Upsample(scale_factor=2)
      >>> init(jax.random.key(0), (-1, 4, 4, 3))[0]
      (-1, 8, 8, 3)
      >>> apply((), (), jnp.arange(2.0).reshape(1, 1, 2, 1))[0][0, :, :, 0].tolist()
      [[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
      >>> x = jnp.array([1.0, 2.0, 6.0]).reshape(1, 3, 1)
      >>> Upsample(size=2, mode="area").apply((), (), x)[0][0, :, 0].tolist()
      [1.5, 4.0]
    """
    name = (
        f"Upsample({'size' if size is not None else 'scale_factor'}="
        f"{size if size is not None else scale_factor!r}, mode={mode!r})"
    )
    scale_factor, size, n_spatial = _upsample_options(name, scale_factor, size, mode, align_corners)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0)
        _check_rank(name, mode, n_spatial, shape)
        out = _out_spatial(name, shape[1:-1], size, scale_factor)
        return (shape[0],) + out + (shape[-1],), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        _check_rank(name, mode, n_spatial, tuple(inputs.shape))
        return _resize(name, inputs, mode, scale_factor, size, align_corners), state

    return named(name, init, apply)


# --------------------------------------------------------------------------- #
# ZeroPad
# --------------------------------------------------------------------------- #


def _pad_spec(name: str, padding):
    """``padding`` as ``(n_spatial or None, pairs or int)``; None: any number of axes."""
    bad = checks.ArgumentError(
        f"{name}: padding must be a non-negative int (every side of every spatial axis), a "
        f"tuple of one entry per spatial axis, each a non-negative int (both sides) or a "
        f"(before, after) pair, e.g. (1, 2) or ((0, 1), (2, 2)) for (N, H, W, C), or for "
        f"(N, L, C) inputs a (left, right) pair; got {padding!r}."
    )
    if checks.is_int(padding):
        if padding < 0:
            raise bad
        return None, int(padding)
    if not isinstance(padding, (tuple, list)) or not 1 <= len(padding) <= 3:
        if isinstance(padding, (tuple, list)) and len(padding) == 4 and all(checks.is_int(p) for p in padding):
            raise checks.ArgumentError(
                f"{name}: a flat 4-tuple is ambiguous, got {padding!r}. torch.nn.ZeroPad2d's "
                f"(left, right, top, bottom) is ((top, bottom), (left, right)) here."
            )
        raise bad
    pairs = []
    for entry in padding:
        if checks.is_int(entry):
            entry = (entry, entry)
        if (
            not isinstance(entry, (tuple, list))
            or len(entry) != 2
            or not all(checks.is_int(p) and p >= 0 for p in entry)
        ):
            raise bad
        pairs.append((int(entry[0]), int(entry[1])))
    return len(pairs), tuple(pairs)


def ZeroPad(padding: int | Sequence[int | Tuple[int, int]]) -> Layer:
    """Zero padding of the spatial axes of ``(N, *spatial, C)``, as ``torch.nn.ZeroPad{1,2,3}d``.

    ``y[n, p + before, c] = x[n, p, c]``, zeros elsewhere; the batch and channel
    axes are not padded. ``padding`` (the Keras ``ZeroPadding{1,2,3}D`` spellings):

    * an int ``p``: ``p`` zeros on both sides of every spatial axis (any of 1 to 3
      spatial axes), torch's ``ZeroPad2d(p)``;
    * one entry per spatial axis, each an int (both sides) or a ``(before, after)``
      pair: ``(pad_h, pad_w)`` or ``((top, bottom), (left, right))`` for
      ``(N, H, W, C)``; ``((front, back), (top, bottom), (left, right))`` for 3-D;
    * for ``(N, L, C)`` inputs also ``(left, right)``, as torch's ``ZeroPad1d`` and
      Keras' ``ZeroPadding1D``.

    Note the order: torch's ``ZeroPad2d((left, right, top, bottom))`` is
    ``ZeroPad(((top, bottom), (left, right)))`` here (a flat 4-tuple is refused).
    Negative padding (torch crops) is not supported. Stateless, no parameters.

    Args:
      padding: an int, one entry per spatial axis (an int or a ``(before, after)``
        pair), or for ``(N, L, C)`` inputs a ``(left, right)`` pair, as above.

    Returns:
      The layer, an ``(init, apply)`` pair without params or state:
      ``init(rng, (N, *spatial, C))`` gives ``(output_shape, (), ())``, each spatial
      axis of ``output_shape`` longer by its ``before + after``.

    Raises:
      ArgumentError: ``padding`` of another form, a negative entry, or a flat 4-tuple.
      ValueError: an input whose number of spatial axes does not fit ``padding`` (or is
        not 1 to 3).

    Examples:
      >>> init, apply = ZeroPad(1)
      >>> init(jax.random.key(0), (-1, 4, 4, 3))[0]
      (-1, 6, 6, 3)
    """
    name = f"ZeroPad({padding!r})"
    n_spatial, spec = _pad_spec(name, padding)
    # (left, right) for 1-D inputs: two ints, which also read as (pad_h, pad_w).
    pair_1d = (
        ((int(padding[0]), int(padding[1])),) if n_spatial == 2 and all(checks.is_int(p) for p in padding) else None
    )

    def pads_for(rank, shape):
        n = rank - 2
        if n_spatial is None:
            if not 1 <= n <= 3:
                raise ValueError(
                    f"{name}: expected an input (N, *spatial, C) with 1 to 3 "
                    f"spatial axes (rank 3 to 5, channels last), got shape "
                    f"{shape}."
                )
            return ((spec, spec),) * n
        if n == 1 and pair_1d is not None:
            return pair_1d
        if n != n_spatial:
            also = " (or a rank-3 input (N, L, C), as (left, right))" if pair_1d else ""
            raise ValueError(
                f"{name}: padding has {n_spatial} entries, one per spatial axis, "
                f"so it expects a rank-{n_spatial + 2} input {_LAYOUTS[n_spatial]} "
                f"(channels last){also}, got shape {shape}."
            )
        return spec

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0)
        pads = pads_for(len(shape), shape)
        spatial = tuple(-1 if d == -1 else d + lo + hi for d, (lo, hi) in zip(shape[1:-1], pads))
        return (shape[0],) + spatial + (shape[-1],), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        pads = pads_for(inputs.ndim, tuple(inputs.shape))
        return jnp.pad(inputs, ((0, 0),) + tuple(pads) + ((0, 0),)), state

    return named(name, init, apply)
