"""Convolutions: ``Conv`` and ``ConvTranspose`` for 1-D, 2-D and 3-D inputs.

Both wrap ``jax.lax`` (``conv_general_dilated`` / ``conv_transpose``). The number
of spatial dimensions is ``len(filter_shape)``. Layouts are channels-last by
default, as in stax and flax:

| dims | input/output | kernel |
|---|---|---|
| 1 | ``NWC`` | ``WIO`` |
| 2 | ``NHWC`` | ``HWIO`` |
| 3 | ``NDHWC`` | ``DHWIO`` |

``dimension_numbers=(lhs, rhs, out)`` overrides them with lax's spec strings, e.g.
``("NCHW", "OIHW", "NCHW")`` for PyTorch's layout. As in lax, the order of the
spatial letters in the *kernel* spec is the order in which ``filter_shape``,
``strides``, ``dilation`` and ``padding`` list the spatial axes.

Padding and window arguments are read as in :mod:`funcnet.layers.pooling`
(the same rules for both). ``Conv``'s ``padding_mode``
(PyTorch's) says what the padding holds: zeros, or the input reflected, replicated or
wrapped around.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import jax
import jax.export  # a submodule jax before 0.8 does not import by itself
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet import initializers
from funcnet import xla
from funcnet.errors import ArgumentError
from funcnet.core import Layer, as_tuple, check_input, check_known, check_param_shapes, check_shape, named
from funcnet.initializers import Initializer
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
    example = '("NCHW", "OIHW", "NCHW")'
    if len(specs) != 3 or not all(isinstance(s, str) and len(s) == n + 2 for s in specs):
        raise ValueError(
            f"{layer}: dimension_numbers must be three spec strings (lhs, rhs, out) "
            f"of length {n + 2} for a {n}-D filter, e.g. {example}; got "
            f"{dimension_numbers!r}."
        )
    try:
        lax.conv_general_permutations(specs)
    except TypeError as err:
        raise ValueError(
            f"{layer}: invalid dimension_numbers {specs!r}: {err} The input and "
            f"output specs need 'N' and 'C', the kernel spec 'O' and 'I', and all "
            f"three the same spatial letters."
        ) from None
    return specs


def _spatial(spec: str, chars: str) -> list:
    return [c for c in spec if c not in chars]


def _layout_perm(spatial_letters, rhs_spec: str, in_letter: str, out_letter: str):
    """Permutation taking a canonical ``(*spatial, in, out)`` kernel to ``rhs_spec``."""
    canonical = "".join(spatial_letters) + in_letter + out_letter
    return tuple(canonical.index(c) for c in rhs_spec)


def _kernel_shape(filter_shape, out_k: int, perm):
    """The kernel's shape in the rhs layout, None for the input channels (the input's
    to decide): the canonical ``(*filter_shape, in, out_k)`` moved by ``perm``."""
    canonical = tuple(filter_shape) + (None, out_k)
    return tuple(canonical[p] for p in perm)


def _init_params(rng, W_init, b_init, canonical_shape, perm, fan_in: int, use_bias: bool, out_chan: int):
    """``{"W", "b"}``: the kernel drawn in the canonical ``(*spatial, in, out)`` layout
    (whose fans every initializer reads correctly), then moved to the rhs layout; ``b`` has
    ``out_chan`` entries (a grouped transposed kernel holds ``out_chan / groups``)."""
    k1, k2 = jax.random.split(rng)
    params = {"W": jnp.transpose(W_init(k1, canonical_shape, jnp.float32), perm)}
    if use_bias:
        b_init = b_init or initializers.torch_default_bias(fan_in)
        params["b"] = b_init(k2, (out_chan,), jnp.float32)
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


def Conv(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Optional[int | Sequence[int]] = None,
    padding: str | int | Sequence[int | Tuple[int, int]] = "VALID",
    dilation: Optional[int | Sequence[int]] = None,
    feature_group_count: int = 1,
    dimension_numbers: Optional[Tuple[str, str, str]] = None,
    W_init: Optional[Initializer] = None,
    b_init: Optional[Initializer] = None,
    use_bias: bool = True,
    implementation: str = "auto",
    padding_mode: str = "zeros",
) -> Layer:
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
        (XLA's forward convolution with a hand-written gradient through the input's
        patches: the filter gradient one matrix product, the input gradient the
        patch extraction's transpose; the default layout and
        ``feature_group_count=1`` only; workload 3's step 0.76-0.89x of building the
        patches in the forward too, 2026-11-25, ``benchmarks/CONV_NOTES.md``),
        ``"chunked"`` (XLA's convolution on 32 examples at a time, the outputs
        concatenated; at most 16 pieces, so larger batches get larger ones), or
        ``"auto"`` (default). On CPU under a plain ``jax.jit``,
        ``"auto"`` takes patches for a one-channel input, and chunks for a 2-D
        convolution of a batch over 32 on an input of at most 16x16 positions, where
        XLA:CPU's own kernels measured slower (the documentation's performance page,
        "Conv on CPU", has the rule's figures); elsewhere, and in a function compiled
        by :func:`funcnet.xla.jit` (``fit``'s steps are), whose options put
        convolutions on XLA's multi-threaded kernels, xla. Chunks need the batch
        axis on this device: on a global mesh (``jax.set_mesh`` with Auto or Explicit
        axes, or an input split over Explicit axes) ``"chunked"`` and ``"auto"`` use
        one convolution; inside ``pmap``/``shard_map`` they chunk the local batch. All
        give the same values and gradients up to float rounding.
      padding_mode: what the padding holds, PyTorch's ``padding_mode``: ``"zeros"``
        (default), ``"reflect"`` (the input mirrored without repeating the edge:
        ``x[1], x[0] | x[0], x[1], ...``), ``"replicate"`` (the edge value repeated)
        or ``"circular"`` (the input wrapped around: ``x[-1] | x[0], ...``). As in torch,
        the input is padded in that mode by the ``(low, high)`` amounts ``padding``
        gives (``jnp.pad`` with mode ``"reflect"``, ``"edge"`` or ``"wrap"``) and then
        convolved without padding, so the output shape does not depend on the mode.
        ``"SAME"``/``"SAME_LOWER"`` pad by their computed amounts: with stride 1,
        ``padding="SAME"`` is torch's ``padding="same"`` (the odd extra pad at the
        end), in any mode; torch refuses ``"same"`` with a stride over 1, funcnet pads
        as TF's ``SAME`` there. ``"VALID"`` pads nothing in any mode.

    Params are ``{"W": kernel in the rhs layout, "b": (out_chan,)}``. To port a
    PyTorch ``Conv2d`` weight ``w`` (``OIHW``) to the default layout use
    ``W = w.permute(2, 3, 1, 0)``. Input sizes of -1 (batch, or an unknown spatial
    size) stay -1 in the output shape; the channel size must be known.

    Returns:
      The layer, a :class:`funcnet.core.Layer` ``(init, apply)``.

    Raises:
      ArgumentError: an unknown ``padding_mode``; ``"reflect"`` padding as large as
        the input on some axis, or ``"circular"`` padding larger than it (PyTorch's
        rules, checked in ``init`` where the size is known, and in ``apply``).
      ValueError: bad shapes, strides, padding, groups or layouts (each names the
        value and what is allowed).
      MismatchError: at ``apply``, a kernel of other output channels or filter shape,
        or a bias not of ``out_chan`` entries (params of another model or configuration).

    Examples:
      >>> layer = Conv(2, (3,), padding=1, padding_mode="circular", use_bias=False)
      >>> out_shape, params, _ = layer.init(jax.random.key(0), (1, 4, 1))
      >>> out_shape
      (1, 4, 2)
      >>> params = {"W": jnp.ones((3, 1, 2))}   # a sum over each window of 3
      >>> y, _ = layer.apply(params, (), jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1))
      >>> y[0, :, 0]   # x wraps around: 4+1+2, 1+2+3, 2+3+4, 3+4+1
      Array([7., 6., 9., 8.], dtype=float32)
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
    implementation, patches_ok = _implementation(name, implementation, groups, (lhs_spec, rhs_spec, out_spec))
    padding_mode = checks.one_of(name, "padding_mode", padding_mode, tuple(_PADDING_MODES))

    def pads_at(i, size):
        """``(low, high)`` padding of the i-th spatial axis (kernel-spec order)."""
        if isinstance(padding, str):
            return tuple(lax.padtype_to_pads([size], [window[i]], [strides[i]], padding)[0])
        return padding[i]

    def spatial_size(i, letter, size):
        axis = lhs_spec.index(letter)
        if padding_mode != "zeros" and size != -1 and not jax.export.is_symbolic_dim(size):
            _check_mode_padding(name, padding_mode, pads_at(i, size), size, axis)
        pad = padding if isinstance(padding, str) else padding[i]
        return output_size(name, size, window[i], strides[i], pad, axis)

    def out_shape(shape):
        return _output_shape(shape, lhs_spec, out_spec, spatial, out_chan, spatial_size)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=n + 2)
        check_known(name, shape, [c_axis], "channel dimension")
        in_chan = shape[c_axis]
        if in_chan % groups:
            raise ValueError(
                f"{name}: feature_group_count={groups} must divide the input "
                f"channels, got {in_chan} channels (input shape {shape})."
            )
        canonical = filter_shape + (in_chan // groups, out_chan)  # (*k, in / groups, out)
        fan_in = math.prod(canonical[:-1])
        params = _init_params(rng, W_init, b_init, canonical, perm, fan_in, use_bias, out_chan)
        return out_shape(shape), params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        W = params["W"]
        # a kernel of other out channels or window would convolve without a word
        check_param_shapes(name, params, {"W": _kernel_shape(filter_shape, out_chan, perm), "b": (out_chan,)})
        check_input(name, inputs, rank=n + 2, axis=c_axis, size=W.shape[rhs_spec.index("I")] * groups, what="channels")
        out_shape(tuple(inputs.shape))  # a readable error for inputs smaller than the window
        dtype = jnp.result_type(inputs, W)
        x, W = inputs.astype(dtype), W.astype(dtype)
        conv_padding = padding
        if padding_mode != "zeros" and padding != "VALID":
            # torch's order: pad the whole input in the mode, then convolve unpadded. Done
            # before any chunking, so every path below sees the same padded input.
            x = _pad_in_mode(x, padding_mode, lhs_spec, spatial, pads_at)
            conv_padding = ((0, 0),) * n
        path = _conv_path(implementation, patches_ok, x, c_axis, n_axis, n)
        out = _convolve(path, x, W, strides, conv_padding, dilation, window, groups, (lhs_spec, rhs_spec, out_spec))
        return _add_bias(out, params, out_spec), state

    return named(name, init, apply)


def _implementation(name: str, implementation: str, groups: int, specs) -> tuple:
    """``Conv``'s ``implementation``, checked, and whether the patches path can run at all
    (the default channels-last layout and one group only)."""
    implementation = checks.one_of(name, "implementation", implementation, ("auto", "xla", "patches", "chunked"))
    patches_ok = groups == 1 and tuple(specs) == _DEFAULT_SPECS[len(specs[0]) - 2]
    if implementation == "patches" and not patches_ok:
        raise ValueError(
            f"{name}: implementation='patches' needs the default channels-last "
            f"layout and feature_group_count=1; use 'xla' or 'auto'."
        )
    return implementation, patches_ok


# PyTorch's padding modes and the jnp.pad mode that fills the padding the same way.
def _pad_in_mode(x, mode: str, lhs_spec: str, spatial: str, pads_at):
    """``x`` padded as torch's ``padding_mode`` pads: each spatial axis (``spatial``, the
    kernel-spec order) by ``pads_at(i, size)``, in ``jnp.pad``'s name for the mode."""
    widths = [(0, 0)] * x.ndim
    for i, c in enumerate(spatial):
        widths[lhs_spec.index(c)] = pads_at(i, x.shape[lhs_spec.index(c)])
    return jnp.pad(x, widths, mode=_PADDING_MODES[mode])


def _convolve(path: str, x, W, strides, padding, dilation, window, groups: int, specs):
    """``Conv``'s convolution on the path :func:`_conv_path` chose (same values on all)."""
    lhs_spec, _, out_spec = specs
    if path == "patches":
        pads = lax.padtype_to_pads(x.shape[1:-1], window, strides, padding) if isinstance(padding, str) else padding
        return patch_conv(x, W, strides, dilation, pads)

    def conv(x):
        return lax.conv_general_dilated(
            x, W, strides, padding, rhs_dilation=dilation, dimension_numbers=specs, feature_group_count=groups
        )

    return _batch_chunked(conv, x, lhs_spec.index("N"), out_spec.index("N")) if path == "chunked" else conv(x)


_PADDING_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _check_mode_padding(name: str, mode: str, pads, size: int, axis: int) -> None:
    """PyTorch's limits on ``F.pad``: jnp.pad would reflect or wrap more than once where
    torch refuses, so a model that runs here would fail when ported back."""
    lo, hi = pads
    if mode == "reflect" and max(lo, hi) >= size:
        raise ArgumentError(
            f"{name}: padding_mode='reflect' needs padding smaller than the input size on "
            f'each axis (torch: "Padding size should be less than the corresponding input '
            f'dimension"); got padding {(lo, hi)} on axis {axis} of size {size}. Pad at most '
            f"{size - 1} there, use a larger input, or padding_mode='replicate'."
        )
    if mode == "circular" and max(lo, hi) > size:
        raise ArgumentError(
            f"{name}: padding_mode='circular' needs padding at most the input size on each "
            f'axis (torch: "Padding value causes wrapping around more than once"); got '
            f"padding {(lo, hi)} on axis {axis} of size {size}. Pad at most {size} there, or "
            f"use a larger input."
        )


# CPU policy of "auto" (docs/benchmarks.md, "Conv on CPU", has the measurements): examples
# per convolution on the "chunked" path, at most this many pieces, and the largest input
# (in positions) "auto" chunks.
_CHUNK = 32
_MAX_CHUNKS = 16
_CHUNK_MAX_POSITIONS = 16 * 16


def _conv_path(implementation: str, patches_ok: bool, x, c_axis: int, n_axis: int, n_spatial: int) -> str:
    """What ``Conv`` computes ``x`` with: "patches", "chunked" or "xla" (see its docstring)."""
    if implementation == "auto" and jax.default_backend() == "cpu" and (not xla.traced_with_options()):
        if patches_ok and x.shape[c_axis] == 1:
            return "patches"
        positions = math.prod(d for i, d in enumerate(x.shape) if i not in (c_axis, n_axis))
        # A symbolic batch (jax.export) has no size to compare: take XLA's convolution.
        if (
            n_spatial == 2
            and not jax.export.is_symbolic_dim(x.shape[n_axis])
            and x.shape[n_axis] > _CHUNK
            and positions <= _CHUNK_MAX_POSITIONS
        ):
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
    return jnp.concatenate(
        [conv(lax.slice_in_dim(x, i, min(i + chunk, size), axis=n_in)) for i in range(0, size, chunk)], axis=n_out
    )


# --------------------------------------------------------------------------- #
# ConvTranspose
# --------------------------------------------------------------------------- #


def _output_padding(name: str, output_padding, padding, strides, dilation) -> tuple:
    """PyTorch's ``output_padding``: per axis, non-negative, below the stride or dilation."""
    n = len(strides)
    if checks.is_int(output_padding):
        output_padding = (output_padding,) * n
    if (
        not isinstance(output_padding, (tuple, list))
        or len(output_padding) != n
        or not all(checks.is_int(p) and p >= 0 for p in output_padding)
    ):
        raise ValueError(f"{name}: output_padding must be a non-negative int or {n} of them, got {output_padding!r}.")
    output_padding = tuple(int(p) for p in output_padding)
    if any(output_padding):
        if isinstance(padding, str):
            raise ValueError(
                f"{name}: output_padding={output_padding} needs explicit padding "
                f"(ints or (low, high) pairs), got padding={padding!r}."
            )
        for op, s, d in zip(output_padding, strides, dilation):
            if op >= max(s, d):
                raise ValueError(
                    f"{name}: output_padding {output_padding} must be smaller than "
                    f"the stride {strides} or the dilation {dilation} on each axis."
                )
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
        raise ValueError(
            f"{name}: padding {pad} on axis {axis} is larger than the output "
            f"({(size - 1) * s + k} before padding) for input size {size}."
        )
    return out


def _transpose_pads(k: int, s: int, pad) -> tuple:
    """``(low, high)`` padding of the stride-dilated input that makes a convolution with the
    flipped kernel the transpose of a forward conv with window ``k``, stride ``s`` and
    padding ``pad`` (jax's ``_conv_transpose_padding``, private to lax, restated)."""
    if pad == "SAME":
        total = k + s - 2
        low = k - 1 if s > k - 1 else -(-total // 2)
    elif pad == "VALID":
        total = k + s - 2 + max(k - s, 0)
        low = k - 1
    else:
        low, total = k - 1 - pad[0], 2 * (k - 1) - pad[0] - pad[1]
    return low, total - low


def _check_transpose_options(name: str, out_chan: int, groups: int, padding_mode, n: int) -> None:
    """``ConvTranspose``'s refusals of what torch's ``ConvTranspose*d`` refuses too: groups
    that do not divide the output channels, a ``padding_mode`` other than zeros."""
    if out_chan % groups:
        raise ArgumentError(
            f"{name}: feature_group_count={groups} must divide out_chan="
            f"{out_chan}, as torch's groups must divide out_channels; use "
            f"a divisor of {out_chan} or change out_chan."
        )
    if padding_mode != "zeros":
        raise ArgumentError(
            f"{name}: padding_mode must be 'zeros', got {padding_mode!r}: as "
            f'in torch ("Only "zeros" padding mode is supported for '
            f'ConvTranspose{n}d"), a transposed convolution pads with zeros '
            f"only. Drop padding_mode, or pad the input with jnp.pad first."
        )


def _transpose_lax_pads(window, strides, padding, output_padding) -> tuple:
    """Per axis, the ``(low, high)`` padding of the stride-dilated input: lax.conv_transpose's
    use_consistent_padding rule, with ``output_padding`` taken off the forward conv's high side."""
    pads = (padding,) * len(window) if isinstance(padding, str) else padding
    return tuple(
        _transpose_pads(k, s, p if isinstance(p, str) else (p[0], p[1] - op))
        for k, s, p, op in zip(window, strides, pads, output_padding)
    )


def _transpose_kernel(W, to_canonical, groups: int):
    """The kernel XLA's forward convolution needs for ``ConvTranspose``: ``W`` moved to the
    canonical ``(*k, in, out/g)`` layout and flipped spatially; with groups, regrouped to
    ``(*k, in/g, out)``, as XLA's grouped convolution reads group j's kernel from output
    channels ``[j*out/g, (j+1)*out/g)`` and contracts ``in/g`` inputs."""
    n = W.ndim - 2
    K = jnp.flip(jnp.transpose(W, to_canonical), tuple(range(n)))
    if groups == 1:
        return K
    k_in, k_out = K.shape[n:]
    K = K.reshape(K.shape[:n] + (groups, k_in // groups, k_out))
    return jnp.swapaxes(K, n, n + 1).reshape(K.shape[:n] + (k_in // groups, groups * k_out))


def ConvTranspose(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Optional[int | Sequence[int]] = None,
    padding: str | int | Sequence[int | Tuple[int, int]] = "VALID",
    dilation: Optional[int | Sequence[int]] = None,
    dimension_numbers: Optional[Tuple[str, str, str]] = None,
    W_init: Optional[Initializer] = None,
    b_init: Optional[Initializer] = None,
    use_bias: bool = True,
    output_padding: int | Sequence[int] = 0,
    feature_group_count: int = 1,
    padding_mode: str = "zeros",
) -> Layer:
    """N-d transposed convolution, as ``torch.nn.ConvTranspose{1,2,3}d``.

    ``ConvTranspose`` with kernel ``W`` is the transpose (the input gradient) of
    the ``Conv`` whose kernel is ``W`` with its in/out channel axes swapped: each
    input pixel scatters ``x[n, p, i] * W[k, i, o]`` to output position
    ``p * stride + k * dilation - pad_lo``. It is computed as XLA's convolution of the
    input dilated by the stride with the kernel flipped spatially (what
    ``lax.conv_transpose(..., transpose_kernel=True, use_consistent_padding=True)``
    does), so no kernel flip is needed to port weights: PyTorch's ``w`` (``(in, out,
    *k)``) is ``W = w.permute(*spatial, 0, 1)``, e.g. ``w.permute(2, 3, 0, 1)`` in 2-D.
    It is the operation of Keras' ``Conv2DTranspose`` too (whose kernel is stored
    ``(*k, out, in)``); flax's ``ConvTranspose`` (default ``transpose_kernel=False``)
    equals it with the kernel flipped spatially.

    With ``feature_group_count=g`` (PyTorch's ``groups``) the channels split into
    ``g`` groups that do not mix: input channels ``[j*in/g, (j+1)*in/g)`` feed only
    output channels ``[j*out/g, (j+1)*out/g)``, and
    ``y[n, q, j*out/g + o] = sum_{p, k, i in group j} x[n, p, i] * W[k, i, o]``.
    The kernel keeps every input channel and the output channels of one group,
    ``(*k, in, out/g)``, as torch's ``(in, out/g, *k)`` weight does, so the port is
    the same permutation: ``W = w.permute(2, 3, 0, 1)`` in 2-D (``w.permute(2, 0, 1)``
    in 1-D, ``w.permute(2, 3, 4, 0, 1)`` in 3-D); ``W[..., j*in/g + i, o]`` is
    torch's ``w[j*in/g + i, o, ...]``, the weight from input channel ``j*in/g + i`` to
    output channel ``j*out/g + o``.

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
      out_chan: number of output channels, as in :func:`Conv`.
      filter_shape: spatial kernel size, as in :func:`Conv`.
      strides: int or one int per spatial axis, as in :func:`Conv`.
      dilation: int or one int per spatial axis, as in :func:`Conv`.
      dimension_numbers: ``(lhs, rhs, out)`` lax spec strings, as in :func:`Conv`.
      use_bias: whether to add the bias ``b``, as in :func:`Conv`.
      padding: ``"VALID"``, ``"SAME"``, an int, or per-axis ints or
        ``(low, high)`` pairs, all as forward-conv padding (see above).
      output_padding: int or one int per spatial axis, added to the end of each
        output axis (PyTorch's ``output_padding``; resolves the size ambiguity of
        strided transposes). Only with explicit padding; each entry must be
        smaller than the stride or the dilation of its axis, as in PyTorch.
      feature_group_count: PyTorch's ``groups``; must divide both the input and the
        output channels (see above).
      padding_mode: ``"zeros"`` only, as in PyTorch's ``ConvTranspose*d``: accepted so
        that a ported call that spells it runs; any other mode is refused, as torch does.
      W_init: called with the canonical shape ``(*filter_shape, in_chan,
        out_chan // groups)``, then transposed to the rhs layout. Default
        ``torch_default(in_axis=-1, out_axis=-2)``: PyTorch computes a transposed
        conv's fan-in from its weight's second axis, the output channels of one
        group, ``fan_in = out_chan / groups * prod(filter_shape)``, so
        ``W ~ U(±1/sqrt(fan_in))``.
      b_init: default ``torch_default_bias(out_chan / groups * prod(filter_shape))``,
        also PyTorch's.

    Returns:
      The layer, a :class:`funcnet.core.Layer` ``(init, apply)``.

    Raises:
      ArgumentError: a ``padding_mode`` other than ``"zeros"``; groups that do not
        divide the output channels (here) or the input channels (in ``init``).
      ValueError: bad shapes, strides, padding, ``output_padding`` or layouts.
      MismatchError: at ``apply``, a kernel of other output channels or filter shape,
        or a bias not of ``out_chan`` entries.

    Examples:
      >>> layer = ConvTranspose(4, (3,), strides=2, padding=1, output_padding=1,
      ...                       feature_group_count=2)
      >>> out_shape, params, _ = layer.init(jax.random.key(0), (1, 5, 6))
      >>> out_shape, params["W"].shape   # W: (*k, in, out / groups)
      ((1, 10, 4), (3, 6, 2))
      >>> layer.apply(params, (), jnp.ones((1, 5, 6)))[0].shape
      (1, 10, 4)
    """
    name = f"ConvTranspose({out_chan}, {filter_shape!r})"
    out_chan = checks.positive_int(name, "out_chan", out_chan)
    filter_shape = window_tuple(name, filter_shape, "filter_shape")
    n = len(filter_shape)
    strides = as_tuple(name, 1 if strides is None else strides, n, "strides")
    dilation = as_tuple(name, 1 if dilation is None else dilation, n, "dilation")
    padding = normalize_padding(name, padding, n, strings=("VALID", "SAME"))
    output_padding = _output_padding(name, output_padding, padding, strides, dilation)
    groups = checks.positive_int(name, "feature_group_count", feature_group_count)
    _check_transpose_options(name, out_chan, groups, padding_mode, n)
    lhs_spec, rhs_spec, out_spec = _specs(name, dimension_numbers, n)
    spatial = _spatial(rhs_spec, "OI")
    perm = _layout_perm(spatial, rhs_spec, "I", "O")
    to_canonical = tuple(sorted(range(n + 2), key=perm.__getitem__))
    canonical_spec = "".join(spatial) + "IO"
    c_axis = lhs_spec.index("C")
    window = tuple((k - 1) * d + 1 for k, d in zip(filter_shape, dilation))
    lax_pads = _transpose_lax_pads(window, strides, padding, output_padding)
    W_init = checks.initializer(name, "W_init", W_init) or initializers.torch_default(in_axis=-1, out_axis=-2)
    b_init = checks.initializer(name, "b_init", b_init)

    def spatial_size(i, letter, size):
        pad = padding if isinstance(padding, str) else padding[i]
        return _transposed_size(name, size, window[i], strides[i], pad, output_padding[i], lhs_spec.index(letter))

    def out_shape(shape):
        return _output_shape(shape, lhs_spec, out_spec, spatial, out_chan, spatial_size)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=n + 2)
        check_known(name, shape, [c_axis], "channel dimension")
        in_chan = shape[c_axis]
        if in_chan % groups:
            raise ArgumentError(
                f"{name}: feature_group_count={groups} must divide the input "
                f"channels, got {in_chan} channels (input shape {shape}), as "
                f"torch's groups must divide in_channels."
            )
        canonical = filter_shape + (in_chan, out_chan // groups)  # (*k, in, out / groups)
        fan_in = math.prod(filter_shape) * (out_chan // groups)  # torch reads it off the out axis
        params = _init_params(rng, W_init, b_init, canonical, perm, fan_in, use_bias, out_chan)
        return out_shape(shape), params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        W = params["W"]
        check_param_shapes(name, params, {"W": _kernel_shape(filter_shape, out_chan // groups, perm), "b": (out_chan,)})
        check_input(name, inputs, rank=n + 2, axis=c_axis, size=W.shape[rhs_spec.index("I")], what="channels")
        out_shape(tuple(inputs.shape))
        dtype = jnp.result_type(inputs, W)
        K = _transpose_kernel(W.astype(dtype), to_canonical, groups)
        out = lax.conv_general_dilated(
            inputs.astype(dtype),
            K,
            (1,) * n,
            lax_pads,
            lhs_dilation=strides,
            rhs_dilation=dilation,
            dimension_numbers=(lhs_spec, canonical_spec, out_spec),
            feature_group_count=groups,
        )
        return _add_bias(out, params, out_spec), state

    return named(name, init, apply)
