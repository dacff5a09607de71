"""``PixelShuffle`` and ``PixelUnshuffle``: channels to space and back, as torch's.

Inputs are channels-last, ``(*, H, W, C)`` (any number of leading axes, usually the
batch), the layout of funcnet's convolution, pooling and resizing layers; torch's are
``(*, C, H, W)``. The channels are split as torch splits them, ``c * r * r + i * r + j``
for output channel ``c`` at offset ``(i, j)`` inside an ``r x r`` block, so a network
ported from torch (its convolution weights transposed to funcnet's layout) gives the same
numbers. ``tf.nn.depth_to_space`` orders them the other way round (``(i * r + j) * C + c``)
and is not this layer. Both layers are a reshape and a transpose: stateless, without
parameters, exact for any dtype, with the gradient of the inverse permutation.
"""

from __future__ import annotations


from funcnet import _checks as checks
from funcnet.core import Layer, check_input, check_shape, named

__all__ = ["PixelShuffle", "PixelUnshuffle"]


def _rank(name: str, shape) -> None:
    if len(shape) < 3:
        raise ValueError(
            f"{name}: expected a channels-last input (*, H, W, C) of rank >= 3 "
            f"(e.g. (N, H, W, C)), got shape {shape}. torch's (N, C, H, W) is "
            f"x.transpose(0, 2, 3, 1) here."
        )


def PixelShuffle(upscale_factor: int) -> Layer:
    """Rearranges ``(*, H, W, C * r * r)`` into ``(*, H * r, W * r, C)``, as
    ``torch.nn.PixelShuffle(upscale_factor=r)`` on the channels-first transpose.

    ``y[..., h * r + i, w * r + j, c] = x[..., h, w, c * r * r + i * r + j]``: each
    group of ``r * r`` consecutive channels becomes an ``r x r`` block of one output
    channel (sub-pixel convolution, Shi et al. 2016). Inverse of :func:`PixelUnshuffle`.

    Args:
      upscale_factor: ``r``, a positive int.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``upscale_factor`` is not a positive int.
      ValueError: at ``init`` or at trace time, an input of rank below 3, or channels
        that are not a multiple of ``r * r`` (torch refuses them too).

    Examples:
      >>> layer = PixelShuffle(2)
      >>> layer.init(jax.random.key(0), (-1, 3, 5, 8))[0]
      (-1, 6, 10, 2)
      >>> layer.apply((), (), jnp.arange(4).reshape(1, 1, 1, 4))[0][0, :, :, 0].tolist()
      [[0, 1], [2, 3]]
    """
    r = checks.positive_int("PixelShuffle", "upscale_factor", upscale_factor)
    name = f"PixelShuffle({r})"

    def out_shape(shape):
        _rank(name, shape)
        *lead, h, w, c = shape
        if c != -1 and c % (r * r):
            raise ValueError(
                f"{name}: the input's channels (last axis) must be a multiple of "
                f"upscale_factor**2 = {r * r}, got {c} in shape {shape}. Give the layer "
                f"before it {r * r} * C channels for C output channels, e.g. "
                f"Conv({r * r} * C, ...)."
            )
        grow = lambda d, k: -1 if d == -1 else d * k
        return (*lead, grow(h, r), grow(w, r), -1 if c == -1 else c // (r * r))

    def init(rng, input_shape):
        return out_shape(check_shape(name, input_shape, min_rank=0)), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        *lead, h, w, c = out_shape(tuple(inputs.shape))
        n = len(lead)
        x = inputs.reshape(*lead, h // r, w // r, c, r, r)
        # (*, H, W, C, i, j) -> (*, H, i, W, j, C)
        x = x.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2)
        return x.reshape(*lead, h, w, c), state

    return named(name, init, apply)


def PixelUnshuffle(downscale_factor: int) -> Layer:
    """Rearranges ``(*, H * r, W * r, C)`` into ``(*, H, W, C * r * r)``, as
    ``torch.nn.PixelUnshuffle(downscale_factor=r)`` on the channels-first transpose.

    ``y[..., h, w, c * r * r + i * r + j] = x[..., h * r + i, w * r + j, c]``: each
    ``r x r`` block of a channel becomes ``r * r`` consecutive channels. Inverse of
    :func:`PixelShuffle`.

    Args:
      downscale_factor: ``r``, a positive int.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``downscale_factor`` is not a positive int.
      ValueError: at ``init`` or at trace time, an input of rank below 3, or a height
        or width that is not a multiple of ``r`` (torch refuses them too).

    Examples:
      >>> layer = PixelUnshuffle(2)
      >>> layer.init(jax.random.key(0), (-1, 6, 10, 2))[0]
      (-1, 3, 5, 8)
      >>> layer.apply((), (), jnp.arange(4).reshape(1, 2, 2, 1))[0][0, 0, 0].tolist()
      [0, 1, 2, 3]
    """
    r = checks.positive_int("PixelUnshuffle", "downscale_factor", downscale_factor)
    name = f"PixelUnshuffle({r})"

    def out_shape(shape):
        _rank(name, shape)
        *lead, h, w, c = shape
        if any(d != -1 and d % r for d in (h, w)):
            raise ValueError(
                f"{name}: the input's height and width must be multiples of "
                f"downscale_factor {r}, got {h} x {w} in shape {shape}. Crop them, or pad "
                f"them with ZeroPad, to multiples of {r}."
            )
        shrink = lambda d: -1 if d == -1 else d // r
        return (*lead, shrink(h), shrink(w), -1 if c == -1 else c * r * r)

    def init(rng, input_shape):
        return out_shape(check_shape(name, input_shape, min_rank=0)), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        *lead, h, w, c = out_shape(tuple(inputs.shape))
        n = len(lead)
        x = inputs.reshape(*lead, h, r, w, r, c // (r * r))
        # (*, H, i, W, j, C) -> (*, H, W, C, i, j)
        x = x.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3)
        return x.reshape(*lead, h, w, c), state

    return named(name, init, apply)
