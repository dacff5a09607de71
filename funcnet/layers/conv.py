"""Convolutions: ``Conv`` and ``ConvTranspose`` for 1-D, 2-D and 3-D inputs.

Both wrap ``jax.lax`` (``conv_general_dilated`` / ``conv_transpose``). The number
of spatial dimensions is ``len(filter_shape)``. Layouts are channels-last by
default, as in stax and flax:

==========  ===========  ===========
dims        input/output kernel
==========  ===========  ===========
1           ``NWC``      ``WIO``
2           ``NHWC``     ``HWIO``
3           ``NDHWC``    ``DHWIO``
==========  ===========  ===========

``dimension_numbers=(lhs, rhs, out)`` overrides them with lax's spec strings, e.g.
``("NCHW", "OIHW", "NCHW")`` for PyTorch's layout. As in lax, the order of the
spatial letters in the *kernel* spec is the order in which ``filter_shape``,
``strides``, ``dilation`` and ``padding`` list the spatial axes.

Padding and window arguments are read as in :mod:`funcnet.layers.pooling`
(the shared rules live in ``funcnet.layers._windows``).
"""

from __future__ import annotations

import math

import jax
import jax.export  # a submodule jax before 0.8 does not import by itself
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet import initializers
from funcnet.core import Layer, as_tuple, check_input, check_known, check_shape, named
from funcnet.layers._patches import patch_conv
from funcnet.layers._windows import normalize_padding, output_size, window_tuple

__all__ = ["Conv", "ConvTranspose"]


_DEFAULT_SPECS = {
    1: ("NWC", "WIO", "NWC"),
    2: ("NHWC", "HWIO", "NHWC"),
    3: ("NDHWC", "DHWIO", "NDHWC"),
}


def _specs(layer: str, dimension_numbers, n: int):
    if dimension_numbers is None:
        return _DEFAULT_SPECS[n]
    specs = tuple(dimension_numbers) if isinstance(dimension_numbers, (tuple, list)) else ()
    example = "(\"NCHW\", \"OIHW\", \"NCHW\")"
    if len(specs) != 3 or not all(isinstance(s, str) and len(s) == n + 2 for s in specs):
        raise ValueError(f"{layer}: dimension_numbers must be three spec strings (lhs, rhs, out) "
                         f"of length {n + 2} for a {n}-D filter, e.g. {example}; got "
                         f"{dimension_numbers!r}.")
    try:
        lax.conv_general_permutations(specs)
    except TypeError as err:
        raise ValueError(f"{layer}: invalid dimension_numbers {specs!r}: {err} The input and "
                         f"output specs need 'N' and 'C', the kernel spec 'O' and 'I', and all "
                         f"three the same spatial letters.") from None
    return specs


def _spatial(spec: str, chars: str) -> list:
    return [c for c in spec if c not in chars]


def _layout_perm(spatial_letters, rhs_spec: str, in_letter: str, out_letter: str):
    """Permutation taking a canonical ``(*spatial, in, out)`` kernel to ``rhs_spec``."""
    canonical = "".join(spatial_letters) + in_letter + out_letter
    return tuple(canonical.index(c) for c in rhs_spec)


def _init_params(rng, W_init, b_init, canonical_shape, perm, fan_in: int, use_bias: bool):
    """``{"W", "b"}``: the kernel drawn in the canonical ``(*spatial, in, out)`` layout
    (whose fans every initializer reads correctly), then moved to the rhs layout."""
    k1, k2 = jax.random.split(rng)
    params = {"W": jnp.transpose(W_init(k1, canonical_shape, jnp.float32), perm)}
    if use_bias:
        b_init = b_init or initializers.torch_default_bias(fan_in)
        params["b"] = b_init(k2, (canonical_shape[-1],), jnp.float32)
    return params


def _output_shape(shape, lhs_spec: str, out_spec: str, spatial, out_chan: int, spatial_size):
    """The output shape: ``spatial_size(i, letter, size)`` for the i-th spatial axis."""
    sizes = {c: spatial_size(i, c, shape[lhs_spec.index(c)]) for i, c in enumerate(spatial)}
    sizes["N"], sizes["C"] = shape[lhs_spec.index("N")], out_chan
    return tuple(sizes[c] for c in out_spec)


def _add_bias(out, params, out_spec: str):
    if "b" not in params:
        return out
    shape = [1] * out.ndim
    shape[out_spec.index("C")] = -1
    return out + params["b"].reshape(shape).astype(out.dtype)


# --------------------------------------------------------------------------- #
# Conv
# --------------------------------------------------------------------------- #

def Conv(out_chan: int, filter_shape, strides=None, padding="VALID", dilation=None,
         feature_group_count: int = 1, dimension_numbers=None, W_init=None, b_init=None,
         use_bias: bool = True, implementation: str = "auto") -> Layer:
    """N-d convolution (cross-correlation), as ``torch.nn.Conv{1,2,3}d`` / ``lax.conv_general_dilated``.

    ``y[n, p, o] = b[o] + sum_{k, i} x[n, p * s + k * d - pad_lo, g(o) * I + i] * W[k, i, o]``
    with ``I = in_chan / groups`` and ``g(o)`` the group of output channel ``o``.

    Args:
      out_chan: number of output channels.
      filter_shape: spatial kernel size, e.g. ``(3, 3)``; its length (1, 2, 3)
        sets the dimensionality and the input rank (``len + 2``).
      strides: int or one int per spatial axis (default 1).
      padding: ``"VALID"`` (none), ``"SAME"`` (output size ``ceil(in / stride)``,
        the odd extra pad at the end, like TF), ``"SAME_LOWER"`` (extra pad at the
        start), an int ``p`` (PyTorch's ``padding=p``), or per-axis ints or
        ``(low, high)`` pairs.
      dilation: int or one int per spatial axis (``rhs_dilation``; default 1).
      feature_group_count: PyTorch's ``groups``; must divide both the input and
        the output channels. ``groups == in_chan`` is a depthwise convolution.
      dimension_numbers: ``(lhs, rhs, out)`` lax spec strings; default
        channels-last (``NHWC``, ``HWIO``, ``NHWC`` in 2-D).
      W_init: called as ``W_init(key, (*filter_shape, in_chan // groups, out_chan),
        float32)`` (the canonical layout, whose fans every ``jax.nn.initializers``
        function reads correctly); the result is transposed to the ``rhs`` layout.
        Default :func:`funcnet.initializers.torch_default`.
      b_init: bias initializer for shape ``(out_chan,)``; default
        ``torch_default_bias(fan_in)`` with ``fan_in = prod(filter_shape) * in_chan /
        groups``. Together these match ``nn.ConvNd.reset_parameters``.
      use_bias: whether to add the bias ``b``.
      implementation: ``"xla"`` (one ``lax.conv_general_dilated``), ``"patches"``
        (the input's patches times the kernel, with a hand-written gradient; the
        default layout and ``feature_group_count=1`` only), ``"chunked"`` (XLA's
        convolution on 32 examples at a time, the outputs concatenated; at most 16
        pieces, so larger batches get larger ones), or ``"auto"`` (default). On CPU,
        ``"auto"`` takes patches for a one-channel input, and chunks for a 2-D
        convolution of a batch over 32 on an input of at most 16x16 positions:
        XLA:CPU's kernels there, the filter gradient above all, are up to 2.9x slower
        on a whole batch than in pieces of 32 (on larger images pieces were even or
        slower; ``benchmarks/CONV_NOTES.md``); elsewhere xla. Chunks need the batch
        axis on this device: on a global mesh (``jax.set_mesh`` with Auto or Explicit
        axes, or an input split over Explicit axes) ``"chunked"`` and ``"auto"`` use
        one convolution; inside ``pmap``/``shard_map`` they chunk the local batch. All
        give the same values and gradients up to float rounding.

    Params are ``{"W": kernel in the rhs layout, "b": (out_chan,)}``. To port a
    PyTorch ``Conv2d`` weight ``w`` (``OIHW``) to the default layout use
    ``W = w.permute(2, 3, 1, 0)``. Input sizes of -1 (batch, or an unknown spatial
    size) stay -1 in the output shape; the channel size must be known.
    """
    name = f"Conv({out_chan}, {filter_shape!r})"
    out_chan = checks.positive_int(name, "out_chan", out_chan)
    filter_shape = window_tuple(name, filter_shape, "filter_shape")
    n = len(filter_shape)
    strides = as_tuple(name, 1 if strides is None else strides, n, "strides")
    dilation = as_tuple(name, 1 if dilation is None else dilation, n, "dilation")
    padding = normalize_padding(name, padding, n)
    groups = checks.positive_int(name, "feature_group_count", feature_group_count)
    if out_chan % groups:
        raise ValueError(f"{name}: feature_group_count={groups} must divide out_chan={out_chan}.")
    lhs_spec, rhs_spec, out_spec = _specs(name, dimension_numbers, n)
    spatial = _spatial(rhs_spec, "OI")
    perm = _layout_perm(spatial, rhs_spec, "I", "O")
    c_axis, n_axis = lhs_spec.index("C"), lhs_spec.index("N")
    window = tuple((k - 1) * d + 1 for k, d in zip(filter_shape, dilation))
    W_init = checks.initializer(name, "W_init", W_init) or initializers.torch_default()
    b_init = checks.initializer(name, "b_init", b_init)
    implementation = checks.one_of(name, "implementation", implementation,
                                   ("auto", "xla", "patches", "chunked"))
    patches_ok = groups == 1 and (lhs_spec, rhs_spec, out_spec) == _DEFAULT_SPECS[n]
    if implementation == "patches" and not patches_ok:
        raise ValueError(f"{name}: implementation='patches' needs the default channels-last "
                         f"layout and feature_group_count=1; use 'xla' or 'auto'.")

    def spatial_size(i, letter, size):
        pad = padding if isinstance(padding, str) else padding[i]
        return output_size(name, size, window[i], strides[i], pad, lhs_spec.index(letter))

    def out_shape(shape):
        return _output_shape(shape, lhs_spec, out_spec, spatial, out_chan, spatial_size)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=n + 2)
        check_known(name, shape, [c_axis], "channel dimension")
        in_chan = shape[c_axis]
        if in_chan % groups:
            raise ValueError(f"{name}: feature_group_count={groups} must divide the input "
                             f"channels, got {in_chan} channels (input shape {shape}).")
        params = _init_params(rng, W_init, b_init, filter_shape + (in_chan // groups, out_chan),
                              perm, math.prod(filter_shape) * (in_chan // groups), use_bias)
        return out_shape(shape), params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        W = params["W"]
        check_input(name, inputs, rank=n + 2, axis=c_axis,
                    size=W.shape[rhs_spec.index("I")] * groups, what="channels")
        out_shape(tuple(inputs.shape))  # a readable error for inputs smaller than the window
        dtype = jnp.result_type(inputs, W)
        x, W = inputs.astype(dtype), W.astype(dtype)
        path = _conv_path(implementation, patches_ok, x, c_axis, n_axis, n)
        if path == "patches":
            pads = (lax.padtype_to_pads(x.shape[1:-1], window, strides, padding)
                    if isinstance(padding, str) else padding)
            out = patch_conv(x, W, strides, dilation, pads)
        else:
            def conv(x):
                return lax.conv_general_dilated(
                    x, W, strides, padding, rhs_dilation=dilation,
                    dimension_numbers=(lhs_spec, rhs_spec, out_spec), feature_group_count=groups)
            out = (_batch_chunked(conv, x, n_axis, out_spec.index("N"))
                   if path == "chunked" else conv(x))
        return _add_bias(out, params, out_spec), state

    return named(name, init, apply)


# Examples per convolution on the "chunked" path, and at most this many pieces
# (benchmarks/CONV_NOTES.md: 16-32 examples were best for LeNet's conv2 on XLA:CPU).
_CHUNK = 32
_MAX_CHUNKS = 16
# "auto" chunks only inputs of at most 16x16 positions: there chunks won (1.1-2.9x);
# at 28x28 and 32x32 they were even, or slower (up to 1.5x for 32x32x16 -> 32).
_CHUNK_MAX_POSITIONS = 16 * 16


def _conv_path(implementation: str, patches_ok: bool, x, c_axis: int, n_axis: int,
               n_spatial: int) -> str:
    """What ``Conv`` computes ``x`` with: "patches", "chunked" or "xla" (see its docstring)."""
    if implementation == "auto" and jax.default_backend() == "cpu":
        if patches_ok and x.shape[c_axis] == 1:
            return "patches"
        positions = math.prod(d for i, d in enumerate(x.shape) if i not in (c_axis, n_axis))
        # A symbolic batch (jax.export) has no size to compare: take XLA's convolution.
        if (n_spatial == 2 and not jax.export.is_symbolic_dim(x.shape[n_axis])
                and x.shape[n_axis] > _CHUNK and positions <= _CHUNK_MAX_POSITIONS):
            implementation = "chunked"
    if implementation == "chunked":
        # Slices of a batch split over devices would cut across them.
        return "xla" if _mesh.on_global_mesh(x) else "chunked"
    return "patches" if implementation == "patches" else "xla"


def _batch_chunked(conv, x, n_in: int, n_out: int):
    """``conv(x)`` as ``conv`` of consecutive slices of the batch axis, concatenated:
    each output example depends on its own input only, so the values are the same."""
    size = x.shape[n_in]
    chunk = max(_CHUNK, -(-size // _MAX_CHUNKS))
    if size <= chunk:
        return conv(x)
    return jnp.concatenate([conv(lax.slice_in_dim(x, i, min(i + chunk, size), axis=n_in))
                            for i in range(0, size, chunk)], axis=n_out)


# --------------------------------------------------------------------------- #
# ConvTranspose
# --------------------------------------------------------------------------- #

def _output_padding(name: str, output_padding, padding, strides, dilation) -> tuple:
    """PyTorch's ``output_padding``: per axis, non-negative, below the stride or dilation."""
    n = len(strides)
    if checks.is_int(output_padding):
        output_padding = (output_padding,) * n
    if (not isinstance(output_padding, (tuple, list)) or len(output_padding) != n
            or not all(checks.is_int(p) and p >= 0 for p in output_padding)):
        raise ValueError(f"{name}: output_padding must be a non-negative int or {n} of them, "
                         f"got {output_padding!r}.")
    output_padding = tuple(int(p) for p in output_padding)
    if any(output_padding):
        if isinstance(padding, str):
            raise ValueError(f"{name}: output_padding={output_padding} needs explicit padding "
                             f"(ints or (low, high) pairs), got padding={padding!r}.")
        for op, s, d in zip(output_padding, strides, dilation):
            if op >= max(s, d):
                raise ValueError(f"{name}: output_padding {output_padding} must be smaller than "
                                 f"the stride {strides} or the dilation {dilation} on each axis.")
    return output_padding


def _transposed_size(name: str, size: int, k: int, s: int, pad, op: int, axis: int) -> int:
    """Output size of a transposed conv on one axis (see :func:`ConvTranspose`)."""
    if size == -1:
        return -1
    if pad == "SAME":
        out = size * s
    elif pad == "VALID":
        out = size * s + max(k - s, 0)
    else:
        out = (size - 1) * s + k - pad[0] - pad[1] + op
    if out < 1:
        raise ValueError(f"{name}: padding {pad} on axis {axis} is larger than the output "
                         f"({(size - 1) * s + k} before padding) for input size {size}.")
    return out


def ConvTranspose(out_chan: int, filter_shape, strides=None, padding="VALID", dilation=None,
                  dimension_numbers=None, W_init=None, b_init=None, use_bias: bool = True,
                  output_padding=0) -> Layer:
    """N-d transposed convolution, as ``torch.nn.ConvTranspose{1,2,3}d`` (``groups=1``).

    ``ConvTranspose`` with kernel ``W`` is the transpose (the input gradient) of
    the ``Conv`` whose kernel is ``W`` with its in/out channel axes swapped: each
    input pixel scatters ``x[n, p, i] * W[k, i, o]`` to output position
    ``p * stride + k * dilation - pad_lo``. It is computed with
    ``lax.conv_transpose(..., transpose_kernel=True, use_consistent_padding=True)``,
    so no kernel flip is needed to port weights: PyTorch's ``w`` (``(in, out, *k)``)
    is ``W = w.permute(*spatial, 0, 1)``, e.g. ``w.permute(2, 3, 0, 1)`` in 2-D.
    It is the operation of Keras' ``Conv2DTranspose`` too (whose kernel is stored
    ``(*k, out, in)``); flax's ``ConvTranspose`` (default ``transpose_kernel=False``)
    equals it with the kernel flipped spatially.

    Padding is that of the corresponding forward convolution. With per-axis
    stride ``s``, effective kernel ``k = dilation * (filter - 1) + 1`` and input
    size ``i``, the output size is

    * ``(low, high)`` pairs (or an int ``p`` = ``(p, p)``):
      ``(i - 1) * s + k - low - high + output_padding``. ``padding=p`` and
      ``output_padding=op`` give exactly ``torch.nn.ConvTranspose*d(padding=p,
      output_padding=op)``, whose size is ``(i-1)*s - 2p + dilation*(filter-1) + op + 1``.
    * ``"SAME"``: ``i * s`` (the inverse of a ``SAME`` forward conv's ``ceil(i / s)``).
    * ``"VALID"``: ``i * s + max(k - s, 0)``; equal to torch's ``padding=0``
      size ``(i - 1) * s + k`` when ``k >= s``, while for ``k < s`` it ends with
      ``s - k`` extra positions (bias only), as Keras/lax do.

    Args:
      out_chan, filter_shape, strides, dilation, dimension_numbers, use_bias:
        as in :func:`Conv` (``groups`` is not supported).
      padding: ``"VALID"``, ``"SAME"``, an int, or per-axis ints or
        ``(low, high)`` pairs, all as forward-conv padding (see above).
      output_padding: int or one int per spatial axis, added to the end of each
        output axis (PyTorch's ``output_padding``; resolves the size ambiguity of
        strided transposes). Only with explicit padding; each entry must be
        smaller than the stride or the dilation of its axis, as in PyTorch.
      W_init: called with the canonical shape ``(*filter_shape, in_chan,
        out_chan)``, then transposed to the rhs layout. Default
        ``torch_default(in_axis=-1, out_axis=-2)``: PyTorch computes a transposed
        conv's fan-in from its *output* channels, ``fan_in = out_chan *
        prod(filter_shape)``, so ``W ~ U(±1/sqrt(fan_in))``.
      b_init: default ``torch_default_bias(out_chan * prod(filter_shape))``,
        also PyTorch's.
    """
    name = f"ConvTranspose({out_chan}, {filter_shape!r})"
    out_chan = checks.positive_int(name, "out_chan", out_chan)
    filter_shape = window_tuple(name, filter_shape, "filter_shape")
    n = len(filter_shape)
    strides = as_tuple(name, 1 if strides is None else strides, n, "strides")
    dilation = as_tuple(name, 1 if dilation is None else dilation, n, "dilation")
    padding = normalize_padding(name, padding, n, strings=("VALID", "SAME"))
    output_padding = _output_padding(name, output_padding, padding, strides, dilation)
    lhs_spec, rhs_spec, out_spec = _specs(name, dimension_numbers, n)
    spatial = _spatial(rhs_spec, "OI")
    perm = _layout_perm(spatial, rhs_spec, "I", "O")
    # lax's transpose_kernel=True reads the kernel as the forward conv's, whose
    # "O" is our input channel axis: hand it the spec with I and O swapped.
    lax_rhs_spec = rhs_spec.translate(str.maketrans("IO", "OI"))
    lax_padding = padding if isinstance(padding, str) else tuple(
        (lo, hi - op) for (lo, hi), op in zip(padding, output_padding))
    c_axis = lhs_spec.index("C")
    window = tuple((k - 1) * d + 1 for k, d in zip(filter_shape, dilation))
    W_init = (checks.initializer(name, "W_init", W_init)
              or initializers.torch_default(in_axis=-1, out_axis=-2))
    b_init = checks.initializer(name, "b_init", b_init)

    def spatial_size(i, letter, size):
        pad = padding if isinstance(padding, str) else padding[i]
        return _transposed_size(name, size, window[i], strides[i], pad, output_padding[i],
                                lhs_spec.index(letter))

    def out_shape(shape):
        return _output_shape(shape, lhs_spec, out_spec, spatial, out_chan, spatial_size)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=n + 2)
        check_known(name, shape, [c_axis], "channel dimension")
        in_chan = shape[c_axis]
        params = _init_params(rng, W_init, b_init, filter_shape + (in_chan, out_chan), perm,
                              math.prod(filter_shape) * out_chan, use_bias)
        return out_shape(shape), params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        W = params["W"]
        check_input(name, inputs, rank=n + 2, axis=c_axis, size=W.shape[rhs_spec.index("I")],
                    what="channels")
        out_shape(tuple(inputs.shape))
        dtype = jnp.result_type(inputs, W)
        out = lax.conv_transpose(
            inputs.astype(dtype), W.astype(dtype), strides, lax_padding, rhs_dilation=dilation,
            dimension_numbers=(lhs_spec, lax_rhs_spec, out_spec), transpose_kernel=True,
            use_consistent_padding=True)
        return _add_bias(out, params, out_spec), state

    return named(name, init, apply)
