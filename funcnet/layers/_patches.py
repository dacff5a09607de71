"""Convolution with a patches-matmul filter gradient, hand-written VJP (private to ``layers``).

Why it exists: XLA:CPU's convolution computes the *filter* gradient of a
convolution with one input channel (the first layer of an image network) as a
slow kernel, several times slower than the same sum written as one matrix
product over the input's patches, and its *input* gradient likewise slower than
the transpose of the patch extraction (the documentation's performance page,
"Conv on CPU", and ``benchmarks/CONV_NOTES.md`` have the figures).
``funcnet.layers.Conv`` uses this formulation for such layers on CPU.

For a channels-last input ``x`` of shape ``(N, *spatial, C)`` and a kernel
``W`` of shape ``(*window, C, O)``, with ``K = prod(window)`` kernel offsets:

```
y               = lax.conv_general_dilated(x, W)      (XLA's forward: fastest here)
Q[k, n, p, c]   = x_padded[n, p * s + k * d, c]       (the patches, kernel offset major)
dW[k, c, o]     = sum_{n, p} Q[k, n, p, c] * dy[n, p, o]   (one matmul, K*C x M x O)
P[n, p, (k, c)] = Q[k, n, p, c]                       (the same patches, example major)
dx              = (the transpose of the patch extraction P)(dy W^T)
```

The forward used to be ``P @ W`` too; on jaxlib 0.10 (where XLA:CPU runs
convolutions and dots through YNNPACK) XLA's forward convolution is about 4x
faster than building ``P`` (a concatenation of ``K`` one-channel slices), and
building ``Q`` (a stack of the same slices on a new leading axis, each copied
whole) instead of ``P`` makes the filter gradient a plain matrix product with no
transpose (2026-11-25: workload 3's step 0.76-0.89x in three paired runs,
``benchmarks/CONV_NOTES.md``).
The patch matrix is ``K`` times the input, which is why ``Conv`` only takes this
path when the input has one channel (``K * C`` stays small).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp

from funcnet import _mesh

__all__ = ["patch_conv"]


def _patches(x, window, strides, dilation, pads):
    """``(N, *out, K * C)``: every window position's inputs, kernel offset major."""
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    n_sp = len(window)
    out = [(x.shape[1 + i] - ((window[i] - 1) * dilation[i] + 1)) // strides[i] + 1 for i in range(n_sp)]
    cols = []
    for offset in itertools.product(*(range(k) for k in window)):
        index = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in zip(offset, dilation, out, strides))
        cols.append(x[(slice(None), *index, slice(None))])
    return jnp.concatenate(cols, axis=-1)


def _offset_patches(x, window, strides, dilation, pads):
    """``(K, N, *out, C)``: :func:`_patches`'s slices stacked on a new leading axis."""
    x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    out = [(x.shape[1 + i] - ((window[i] - 1) * dilation[i] + 1)) // strides[i] + 1 for i in range(len(window))]
    return jnp.stack(
        [
            x[
                (
                    slice(None),
                    *(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in zip(offset, dilation, out, strides)),
                    slice(None),
                )
            ]
            for offset in itertools.product(*(range(k) for k in window))
        ]
    )


def _xla_conv(x, W, window, strides, dilation, pads):
    spatial = "DHW"[3 - len(window) :]
    specs = (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
    return jax.lax.conv_general_dilated(x, W, strides, pads, rhs_dilation=dilation, dimension_numbers=specs)


def patch_conv(x, W, strides, dilation, pads):
    """``lax.conv_general_dilated`` for channels-last ``x`` and a ``(*window, C, O)`` kernel,
    ``feature_group_count=1``, explicit ``pads`` pairs: XLA's forward, the gradients
    through the input's patches (see the module docstring)."""
    window = W.shape[:-2]
    args = (tuple(window), tuple(strides), tuple(dilation), tuple(map(tuple, pads)))
    return _conv_vjp(args, x, W)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv_vjp(args, x, W):
    return _xla_conv(x, W, *args)


def _fwd(args, x, W):
    return _xla_conv(x, W, *args), (x, W)


def _bwd(args, res, dy):
    x, W = res
    o = W.shape[-1]
    q = _offset_patches(x, *args)  # (K, N, *out, C)
    rest = list(range(1, q.ndim - 1))  # N and the output positions
    k, c, oo = 0, q.ndim - 1, q.ndim
    # Summed over the batch: under an Explicit mesh that axis is split, so the result's
    # (whole, replicated) layout is stated; elsewhere explicit_sharding gives None.
    dW = jnp.einsum(
        q, [k, *rest, c], dy, [*rest, oo], [k, c, oo], out_sharding=_mesh.explicit_sharding(x, None, None, None)
    )
    dW = dW.reshape(W.shape)
    dp = dy @ W.reshape(-1, o).T
    # The patch extraction is linear in x; its transpose is the overlap-add (col2im).
    (dx,) = jax.linear_transpose(lambda v: _patches(v, *args), x)(dp)
    return dx, dW


_conv_vjp.defvjp(_fwd, _bwd)
