"""Convolution as patches times a matrix, with a hand-written VJP (private to ``layers``).

Why it exists: XLA:CPU's convolution computes the *filter* gradient of a
convolution with one input channel (the first layer of an image network) as a
slow Eigen kernel, several times slower than the same sum written as one matrix
product over the input's patches (the documentation's performance page, "Conv on
CPU", has the figures). ``funcnet.layers.Conv`` uses this formulation for such layers on CPU.

For a channels-last input ``x`` of shape ``(N, *spatial, C)`` and a kernel
``W`` of shape ``(*window, C, O)``::

    P[n, p, (k, c)] = x_padded[n, p * s + k * d, c]       (the patches, K = prod(window))
    y[n, p, o]      = sum_{k, c} P[n, p, (k, c)] * W[k, c, o]
    dW              = P^T dy                              (one matmul)
    dx              = (the transpose of the patch extraction)(dy W^T)

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
    out = [(x.shape[1 + i] - ((window[i] - 1) * dilation[i] + 1)) // strides[i] + 1
           for i in range(n_sp)]
    cols = []
    for offset in itertools.product(*(range(k) for k in window)):
        index = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                      for o, d, m, s in zip(offset, dilation, out, strides))
        cols.append(x[(slice(None), *index, slice(None))])
    return jnp.concatenate(cols, axis=-1)


def patch_conv(x, W, strides, dilation, pads):
    """``lax.conv_general_dilated`` for channels-last ``x`` and a ``(*window, C, O)`` kernel,
    ``feature_group_count=1``, computed as patches @ kernel; explicit ``pads`` pairs."""
    window = W.shape[:-2]
    args = (tuple(window), tuple(strides), tuple(dilation), tuple(map(tuple, pads)))
    return _conv_vjp(args, x, W)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv_vjp(args, x, W):
    return _patches(x, *args) @ W.reshape(-1, W.shape[-1])


def _fwd(args, x, W):
    p = _patches(x, *args)
    return p @ W.reshape(-1, W.shape[-1]), (p, x, W)


def _bwd(args, res, dy):
    p, x, W = res
    o = W.shape[-1]
    # Summed over the batch: under an Explicit mesh that axis is split, so the result's
    # (whole, replicated) layout is stated; elsewhere explicit_sharding gives None.
    dW = jnp.einsum("...k,...o->ko", p, dy,
                    out_sharding=_mesh.explicit_sharding(p, None, None))
    dW = dW.reshape(W.shape)
    dp = dy @ W.reshape(-1, o).T
    # The patch extraction is linear in x; its transpose is the overlap-add (col2im).
    (dx,) = jax.linear_transpose(lambda v: _patches(v, *args), x)(dp)
    return dx, dW


_conv_vjp.defvjp(_fwd, _bwd)
