"""Initializers: ``jax.nn.initializers`` plus the few that other frameworks use by default.

Every initializer has the ``jax.nn.initializers`` signature ``init(key, shape, dtype)``
and reads fans with the same convention: the input axis is ``in_axis=-2`` and the
output axis ``out_axis=-1``; the other axes form the receptive field. That is the
``(in, out)`` Dense kernel and the ``(*spatial, in, out)`` conv kernel funcnet uses.

Defaults in funcnet's layers, and why:

* ``Dense`` and ``Conv``/``ConvTranspose``: :func:`torch_default` weights and
  :func:`torch_default_bias` biases. It is what PyTorch users get from
  ``nn.Linear``/``nn.Conv2d``, so a model ported from PyTorch starts from the same
  distribution and trains the same way. tinynn's default is :func:`xavier_uniform`
  with zero bias; pass ``W_init=xavier_uniform(), b_init=zeros`` to get it
  (``examples/mnist_mlp.py`` does).
* ``Embedding``: ``normal(1.0)``, as ``torch.nn.Embedding``.
* ``RNN``/``LSTM``/``GRU``: ``U(-1/sqrt(hidden), 1/sqrt(hidden))`` for every
  weight and bias, as ``torch.nn.RNN``/``LSTM``/``GRU``.
* ``BatchNorm``/``LayerNorm``: scale ones, bias zeros.

The uniform ones (:func:`xavier_uniform`, :func:`kaiming_uniform`, :func:`torch_default`,
:func:`uniform_symmetric`, :func:`torch_default_bias`) give ``jax.nn.initializers``'
values bit for bit (``variance_scaling(..., "uniform")``, ``jax.random.uniform``) but,
called eagerly, draw a kernel's values in one axis and reshape them: XLA:CPU compiles a
draw in a kernel's shape several times slower (a (100, 10) Dense kernel 1.1 s against
0.2 s), and an eager init compiles one draw per shape, so a LeNet's init took 5.6-5.9 s
before and 2.8-3.1 s after (jax 0.12.0.1, 2-core CPU). With partitionable threefry (jax's
default) sizes also share a draw: a parameter takes the first values of a draw of a few
fixed counts (4096 for every small one), the same bits, so an init compiles a draw per
count, not per size (LeNet's init 1.4-1.6 -> 1.1-1.2 s on jax 0.12). Under a trace (an init inside
``jax.jit``) they draw as jax does.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.nn.initializers import (  # re-exported: use these rather than re-writing them
    constant,
    glorot_normal,
    glorot_uniform,
    he_normal,
    he_uniform,
    lecun_normal,
    lecun_uniform,
    normal,
    ones,
    orthogonal,
    truncated_normal,
    uniform,
    variance_scaling,
    zeros,
)

__all__ = [
    "constant",
    "glorot_normal",
    "glorot_uniform",
    "he_normal",
    "he_uniform",
    "lecun_normal",
    "lecun_uniform",
    "normal",
    "ones",
    "orthogonal",
    "truncated_normal",
    "uniform",
    "variance_scaling",
    "zeros",
    "xavier_uniform",
    "xavier_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "torch_default",
    "torch_default_bias",
    "uniform_symmetric",
    "calculate_gain",
    "Initializer",
]

Initializer = Callable[..., jax.Array]
"""A weight initializer, ``init(key, shape, dtype=jnp.float32) -> array``, as in ``jax.nn.initializers``."""


def calculate_gain(nonlinearity: str = "leaky_relu", negative_slope: float = 0.0) -> float:
    """``torch.nn.init.calculate_gain`` for the nonlinearities kaiming init uses.

    Args:
      nonlinearity: ``"linear"``, ``"conv*"``, ``"sigmoid"``, ``"tanh"``, ``"relu"``,
        ``"leaky_relu"`` or ``"selu"``.
      negative_slope: leaky ReLU's slope (``"leaky_relu"`` only).

    Returns:
      The gain, a float.

    Raises:
      ValueError: an unknown ``nonlinearity``.

    Examples:
      >>> calculate_gain("relu") == math.sqrt(2), calculate_gain("tanh")
      (True, 1.6666666666666667)
    """
    if nonlinearity in ("linear", "sigmoid") or nonlinearity.startswith("conv"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1.0 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4.0
    raise ValueError(
        f"calculate_gain: unknown nonlinearity {nonlinearity!r}; expected one of "
        f"linear, sigmoid, tanh, relu, leaky_relu, selu."
    )


def xavier_uniform(gain: float = 1.0, in_axis: int = -2, out_axis: int = -1) -> Initializer:
    """``U(-a, a)``, ``a = gain * sqrt(6 / (fan_in + fan_out))``.

    tinynn's default and ``torch.nn.init.xavier_uniform_``; with ``gain=1`` it is
    ``jax.nn.initializers.glorot_uniform``.

    Args:
      gain: scales the bound.
      in_axis: the kernel's input axis.
      out_axis: the kernel's output axis.

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Examples:
      >>> W = xavier_uniform()(jax.random.key(0), (4, 2))
      >>> W.shape, W.dtype, bool(abs(W).max() <= 1.0)  # a = sqrt(6 / 6)
      ((4, 2), dtype('float32'), True)
    """
    return _scaled_uniform(gain**2, "fan_avg", in_axis, out_axis)


def xavier_normal(gain: float = 1.0, in_axis: int = -2, out_axis: int = -1) -> Initializer:
    """``N(0, std²)``, ``std = gain * sqrt(2 / (fan_in + fan_out))`` (``torch.nn.init.xavier_normal_``).

    Args:
      gain: scales the standard deviation.
      in_axis: the kernel's input axis.
      out_axis: the kernel's output axis.

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Examples:
      >>> W = xavier_normal()(jax.random.key(0), (200, 200))
      >>> W.shape, round(float(W.std()), 2)  # std = sqrt(2 / 400)
      ((200, 200), 0.07)
    """
    return variance_scaling(gain**2, "fan_avg", "normal", in_axis=in_axis, out_axis=out_axis)


def kaiming_uniform(
    negative_slope: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    in_axis: int = -2,
    out_axis: int = -1,
) -> Initializer:
    """``U(-b, b)``, ``b = gain * sqrt(3 / fan)``, ``gain = calculate_gain(nonlinearity, negative_slope)``.

    Matches ``torch.nn.init.kaiming_uniform_(w, a=negative_slope, mode, nonlinearity)``.

    Args:
      negative_slope: leaky ReLU's slope (torch's ``a``).
      mode: ``"fan_in"`` or ``"fan_out"``.
      nonlinearity: as :func:`calculate_gain`.
      in_axis: the kernel's input axis.
      out_axis: the kernel's output axis.

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Raises:
      ValueError: an unknown ``nonlinearity``.

    Examples:
      >>> W = kaiming_uniform(nonlinearity="relu")(jax.random.key(0), (6, 3))
      >>> W.shape, bool(abs(W).max() <= 1.0)  # b = sqrt(2) * sqrt(3 / 6)
      ((6, 3), True)
    """
    gain = calculate_gain(nonlinearity, negative_slope)
    return _scaled_uniform(gain**2, mode, in_axis, out_axis)


def kaiming_normal(
    negative_slope: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    in_axis: int = -2,
    out_axis: int = -1,
) -> Initializer:
    """``N(0, std²)``, ``std = gain / sqrt(fan)`` (not truncated), as ``torch.nn.init.kaiming_normal_``.

    Args:
      negative_slope: leaky ReLU's slope (torch's ``a``).
      mode: ``"fan_in"`` or ``"fan_out"``.
      nonlinearity: as :func:`calculate_gain`.
      in_axis: the kernel's input axis.
      out_axis: the kernel's output axis.

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Raises:
      ValueError: an unknown ``nonlinearity``.

    Examples:
      >>> W = kaiming_normal(nonlinearity="relu")(jax.random.key(0), (200, 200))
      >>> W.shape, round(float(W.std()), 2)  # std = sqrt(2 / 200)
      ((200, 200), 0.1)
    """
    gain = calculate_gain(nonlinearity, negative_slope)
    return variance_scaling(gain**2, mode, "normal", in_axis=in_axis, out_axis=out_axis)


def torch_default(in_axis: int = -2, out_axis: int = -1) -> Initializer:
    """PyTorch's ``nn.Linear``/``nn.Conv*`` weight init: ``kaiming_uniform(a=sqrt(5))``.

    The gain is ``sqrt(2 / (1 + 5)) = sqrt(1/3)``, so the bound is
    ``sqrt(1/3) * sqrt(3 / fan_in) = 1 / sqrt(fan_in)``: ``W ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Args:
      in_axis: the kernel's input axis.
      out_axis: the kernel's output axis.

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Examples:
      >>> W = torch_default()(jax.random.key(0), (16, 3))
      >>> W.shape, bool(abs(W).max() <= 1 / math.sqrt(16))
      ((16, 3), True)
    """
    return kaiming_uniform(math.sqrt(5.0), "fan_in", "leaky_relu", in_axis, out_axis)


def uniform_symmetric(bound: float) -> Initializer:
    """``U(-bound, bound)``.

    Args:
      bound: the half-width of the interval.

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Examples:
      >>> b = uniform_symmetric(0.5)(jax.random.key(0), (100,))
      >>> b.shape, bool(abs(b).max() <= 0.5)
      ((100,), True)
    """

    def init(key, shape, dtype=jnp.float32):
        if not _draws_flat(key, shape, dtype, one_axis=True):
            return jax.random.uniform(key, shape, dtype, -bound, bound)
        return _flat_uniform(key, tuple(shape), jnp.dtype(dtype), -bound, bound, None)

    return init


def torch_default_bias(fan_in: int) -> Initializer:
    """PyTorch's ``nn.Linear``/``nn.Conv*`` bias init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    The bias has no fan of its own, so the layer passes the weight's ``fan_in``.

    Args:
      fan_in: the weight's fan-in (0 gives zeros).

    Returns:
      An initializer ``init(key, shape, dtype)``.

    Examples:
      >>> b = torch_default_bias(16)(jax.random.key(0), (3,))
      >>> b.shape, bool(abs(b).max() <= 0.25)
      ((3,), True)
    """
    return uniform_symmetric(1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0)


# Drawing a parameter flat. On XLA:CPU a random draw's program compiles several times
# slower for a shape of two or more axes than for the same number of values in one axis,
# most of all when the last axis is short: ``jax.random.uniform`` of a (100, 10) Dense
# kernel 1.1 s against 0.2 s for (1000,), a (5, 5, 32, 64) conv kernel 1.5 s against 0.2 s
# (jax 0.12.0.1; 1.7 and 0.3 s on 0.10.2), and an eager init compiles one such program per
# parameter shape. jax's threefry draws depend only on each value's position in row-major
# order, so the flat draw reshaped is the same array bit for bit (partitionable or not;
# tests/test_initializers_flat.py checks it against jax's own initializers).
#
# Sharing the draw. Even flat, each count of values is a program of its own (~0.1 s to
# compile on a 2-core CPU, jax 0.12), once per parameter size: a Dense layer's kernel and
# bias are two, a GPT's blocks several. With ``jax_threefry_partitionable`` (jax's default)
# the value at position i depends on i alone, not on how many are drawn, so the first n
# values of a longer draw are the draw of n, bit for bit: sizes round up to a few draw
# counts (:func:`_draw_count`), and what is left per shape is a slice and a reshape, a
# program that compiles in a fraction of the draw's time. Without it (the older threefry)
# the bits depend on the count, and each size draws exactly its own.

_SHARED_DRAW = 4096  # values: every smaller parameter takes the first values of this draw
_SHARED_UP_TO = 1 << 20  # values: larger parameters draw exactly their own (no copy of a slice)


def _draw_count(n: int) -> int:
    """How many values to draw for ``n <= _SHARED_UP_TO``: ``_SHARED_DRAW`` for the small
    ones, else the next power of two (4 MB of float32 at most drawn in vain). Larger
    parameters draw exactly their own: there the draw's run time and memory outweigh its
    compile."""
    return max(_SHARED_DRAW, 1 << (n - 1).bit_length())


def _draws_flat(key, shape, dtype, one_axis: bool = False) -> bool:
    """Whether ``key``'s draws of ``shape`` may be made flat: an eager draw, a single
    threefry key (the default; other generators, e.g. ``rbg``, shape their bits by the
    shape), a floating dtype, two or more axes (``one_axis``: or one, where the draw can
    be shared, :func:`_draw_count`) and a value."""
    fewest = 1 if one_axis and jax.threefry_partitionable.value else 2
    if dtype is None or len(shape) < fewest or 0 in tuple(shape) or not jnp.issubdtype(dtype, jnp.floating):
        return False
    if not isinstance(key, jax.Array) or isinstance(key, jax.core.Tracer):
        # Traced (an init under jit): the program is the caller's, perhaps with sharded
        # outputs, which jax's draw in the parameter's shape is made to split by.
        return False
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        single = key.shape == ()
    else:
        single = key.shape == (2,) and key.dtype == jnp.uint32
    return single and str(jax.random.key_impl(key)) == "threefry2x32"


def _flat_uniform(key, shape, dtype, minval, maxval, scale):
    """``jax.random.uniform(key, shape, dtype, minval, maxval)`` (times ``scale`` unless
    None), drawn flat: with partitionable threefry the first values of a shared draw
    (:func:`_draw_count`; the bounds traced, as in jax's own ``uniform``), else (or for
    a large parameter) one flat draw of exactly this shape's count."""
    n = math.prod(shape)
    if n > _SHARED_UP_TO or not jax.threefry_partitionable.value:
        return _exact_flat_uniform(key, shape, dtype, minval, maxval, scale)
    values = jax.random.uniform(key, (_draw_count(n),), dtype, float(minval), float(maxval))
    return _first(values, shape, scale)


@functools.partial(jax.jit, static_argnums=1)
def _first(values, shape, scale):
    """The first values of a shared draw, as many as ``shape`` holds, times ``scale``
    unless None, in ``shape``."""
    values = values[: math.prod(shape)]
    return (values if scale is None else values * scale).reshape(shape)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _exact_flat_uniform(key, shape, dtype, minval, maxval, scale):
    """The flat draw of exactly ``shape``'s count (the older threefry, or a large
    parameter): one program per shape."""
    values = jax.random.uniform(key, (math.prod(shape),), dtype, minval, maxval)
    return (values if scale is None else values * scale).reshape(shape)


_DENOMINATORS = {
    "fan_in": lambda fan_in, fan_out: fan_in,
    "fan_out": lambda fan_in, fan_out: fan_out,
    "fan_avg": lambda fan_in, fan_out: (fan_in + fan_out) / 2,
}


def _scaled_uniform(scale: float, mode: str, in_axis: int, out_axis: int) -> Initializer:
    """``variance_scaling(scale, mode, "uniform", in_axis=, out_axis=)``, the same values
    bit for bit, its draw made flat where :func:`_draws_flat` allows (else jax's own)."""
    exact = variance_scaling(scale, mode, "uniform", in_axis=in_axis, out_axis=out_axis)
    # tuple axes and other modes: jax's own initializer (its answer, or its error)
    mirrored = isinstance(in_axis, int) and isinstance(out_axis, int) and mode in _DENOMINATORS

    def init(key, shape, dtype=jnp.float32):
        if not (mirrored and _draws_flat(key, shape, dtype)):
            return exact(key, shape, dtype)
        shape = tuple(int(d) for d in shape)
        # jax.nn.initializers' fans and variance, in its order of operations
        in_size, out_size = shape[in_axis], shape[out_axis]
        receptive = math.prod(shape) / in_size / out_size
        fan_in, fan_out = in_size * receptive, out_size * receptive
        denominator = _DENOMINATORS[mode](fan_in, fan_out)
        variance = jnp.array(scale / denominator, dtype=dtype)
        return _flat_uniform(key, shape, jnp.dtype(dtype), -1, 1.0, jnp.sqrt(3 * variance))

    return init
