"""Activation layers, each the ``torch.nn`` module of the same name.

Three kinds of names:

* Layers to use as they are (torch's module has no arguments but ``inplace``):
  ``Relu``, ``Relu6``, ``Selu``, ``Sigmoid``, ``Tanh``, ``Silu`` (``Swish`` is the
  same object), ``Mish``, ``Hardsigmoid``, ``Hardswish``, ``LogSigmoid``, ``Softsign``,
  ``Tanhshrink``.
* Layers with torch's default arguments that, called, build the layer with other
  arguments: ``Elu(alpha)``, ``Celu(alpha)``, ``Gelu(approximate)``,
  ``Softplus(beta, threshold)``, ``Hardtanh(min_val, max_val)``,
  ``LeakyRelu(negative_slope)``, ``Glu(axis)`` (torch's ``dim``) and the learned
  ``Prelu(num_parameters, init, axis)``.
* Constructors: ``Softmax(axis)``, ``LogSoftmax(axis)``, ``Threshold(threshold, value)``
  (torch's ``Threshold`` has no defaults).

Design of the second kind: ``Elu`` is a :class:`funcnet.Layer` (an ``(init, apply)``
pair, so ``serial(Dense(4), Elu)`` works as it always has) whose class also defines
``__call__``: ``Elu(alpha=0.5)`` returns a plain :class:`~funcnet.Layer` with that
``alpha``, and ``Elu()`` one equal in behaviour to ``Elu``. Each name keeps one
meaning, "ELU, torch's arguments optional", as ``torch.nn.ELU`` and
``torch.nn.ELU()`` would if torch allowed the first. A called layer is not callable
again (``Elu(0.5)(0.3)`` is a TypeError), so an option can't be set twice. The
arguments are torch's, by name and position and default, and torch's rejected values
are rejected here (as :class:`funcnet.errors.ArgumentError`).

Gradients at kinks are torch's, which are not always ``jax.nn``'s: ``LeakyRelu``,
``Prelu`` and ``Celu`` take the negative branch at exactly 0 and ``Hardtanh`` has
gradient 0 at ``min_val`` and ``max_val``; each function's note says where it departs
from ``jax.nn``. Names case torch's as funcnet always has: ``ReLU`` is ``Relu``,
``PReLU`` ``Prelu``, ``SiLU`` ``Silu``, ``CELU`` ``Celu``, ``GLU`` ``Glu``.
:func:`elementwise` turns any shape-preserving function into a layer.
"""

from __future__ import annotations

import inspect
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet.core import Layer, MismatchError, check_input, check_known, check_shape, named, normalize_axis

__all__ = [
    "Relu",
    "Relu6",
    "LeakyRelu",
    "Prelu",
    "Elu",
    "Celu",
    "Selu",
    "Gelu",
    "Sigmoid",
    "Tanh",
    "Softplus",
    "Hardtanh",
    "Hardsigmoid",
    "Hardswish",
    "Silu",
    "Swish",
    "Mish",
    "Softmax",
    "LogSoftmax",
    "elementwise",
    "Glu",
    "LogSigmoid",
    "Softsign",
    "Tanhshrink",
    "Threshold",
]


def elementwise(name: str, fn: Callable, axis: int | None = None) -> Layer:
    """A stateless, parameter-free layer computing ``fn(inputs)``; the shape is unchanged.

    ``axis`` is for functions that work along one axis (softmax): it is checked
    against the input rank at ``init`` and at trace time.

    Args:
      name: the layer's name, shown in its repr and its error messages.
      fn: the function, an array to an array of the same shape.
      axis: the axis ``fn`` works along, or None for a function of each element.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`: ``init(rng, input_shape)``
      gives ``(input_shape, (), ())`` and ``apply`` gives ``(fn(inputs), state)``.

    Raises:
      ValueError: with ``axis``, an input (at ``init`` or at trace time) whose rank
        has no such axis.

    Examples:
      >>> square = elementwise("Square", jnp.square)
      >>> square.name, square.apply((), (), jnp.arange(3.0))[0]
      ('Square', Array([0., 1., 4.], dtype=float32))
    """

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0 if axis is None else 1)
        if axis is not None:
            normalize_axis(name, axis, len(shape))
        return shape, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        if axis is not None:
            normalize_axis(name, axis, inputs.ndim)
        return fn(inputs), state

    return named(name, init, apply)


class _OptionalArguments(Layer):
    """A layer with torch's default arguments; calling it builds one with others."""

    __slots__ = ()
    _build: Callable[..., Layer]

    def __call__(self, *args, **kwargs) -> Layer:
        return self._build(*args, **kwargs)


def _optional_arguments(build: Callable[..., Layer]) -> Layer:
    """``build()`` as a layer that is also ``build``: see the module docstring.

    One class per name, so that ``help(Elu)`` shows ``build``'s docstring, the repr
    says ``Elu(init=..., apply=...)``, and a pytree round trip (which rebuilds a
    NamedTuple from its type) keeps the layer callable.
    """
    cls = type(
        build.__name__,
        (_OptionalArguments,),
        {
            "__slots__": (),
            "__doc__": build.__doc__,
            "__module__": __name__,
            "__qualname__": build.__name__,
            "__signature__": inspect.signature(build),
            "_build": staticmethod(build),
        },
    )
    return cls(*build())


def _name(layer: str, **options) -> str:
    """``layer`` with the options that differ from torch's defaults: ``Elu(alpha=0.5)``."""
    shown = ", ".join(f"{k}={v!r}" for k, (v, default) in options.items() if v != default)
    return f"{layer}({shown})" if shown else layer


# --------------------------------------------------------------------------- #
# Layers without arguments.
# --------------------------------------------------------------------------- #

Relu = elementwise("Relu", jax.nn.relu)
"""ReLU, ``max(x, 0)``, as ``torch.nn.ReLU``; gradient 0 at 0 in both."""
Relu6 = elementwise("Relu6", jax.nn.relu6)
"""ReLU6, ``min(max(x, 0), 6)``, as ``torch.nn.ReLU6``; gradient 0 at 0 and 6 in both."""
Selu = elementwise("Selu", jax.nn.selu)
"""SELU, ``scale * elu(x, alpha)`` with the self-normalising constants, as ``torch.nn.SELU``;
gradient ``scale * alpha`` at 0 in both."""
Sigmoid = elementwise("Sigmoid", jax.nn.sigmoid)
"""The logistic sigmoid, ``1 / (1 + exp(-x))``, as ``torch.nn.Sigmoid``."""
Tanh = elementwise("Tanh", jnp.tanh)
"""``tanh(x)``, as ``torch.nn.Tanh``."""
Hardsigmoid = elementwise("Hardsigmoid", jax.nn.hard_sigmoid)
"""``relu6(x + 3) / 6``, as ``torch.nn.Hardsigmoid``; gradient 0 at -3 and 3 in both."""
Hardswish = elementwise("Hardswish", jax.nn.hard_swish)
"""``x * relu6(x + 3) / 6``, as ``torch.nn.Hardswish``; gradient 0 at -3 and 1 at 3 in both."""
Silu = elementwise("Silu", jax.nn.silu)
"""SiLU, ``x * sigmoid(x)``, as ``torch.nn.SiLU``. ``Swish`` is the same layer (the same
object), not a copy."""
Swish = Silu
"""Swish, the same layer object as ``Silu``: ``x * sigmoid(x)``, as ``torch.nn.SiLU``."""
Mish = elementwise("Mish", jax.nn.mish)
"""Mish, ``x * tanh(softplus(x))``, as ``torch.nn.Mish``. jax's softplus is the stable form,
so large ``x`` give ``x`` where torch's float32 kernel also gives ``x``."""
LogSigmoid = elementwise("LogSigmoid", jax.nn.log_sigmoid)
"""``log(sigmoid(x)) = -softplus(-x)``, as ``torch.nn.LogSigmoid``. Both use the stable form
``min(x, 0) - log1p(exp(-|x|))``, finite where ``log(sigmoid(x))`` would give ``log(0)``."""
Softsign = elementwise("Softsign", jax.nn.soft_sign)
"""``x / (1 + |x|)``, as ``torch.nn.Softsign``; gradient 1 at 0 in both (abs's gradient there
is 0)."""
Tanhshrink = elementwise("Tanhshrink", lambda x: x - jnp.tanh(x))
"""``x - tanh(x)``, as ``torch.nn.Tanhshrink``, written as torch's composite is, so the gradient
is ``1 - (1 - tanh(x)^2)`` in both, with the same rounding near 0."""


# --------------------------------------------------------------------------- #
# Layers with torch's optional arguments.
# --------------------------------------------------------------------------- #


@_optional_arguments
def Elu(alpha: float = 1.0) -> Layer:
    """ELU, as ``torch.nn.ELU(alpha)``: ``x if x > 0 else alpha * (exp(x) - 1)``.

    Use ``Elu`` as a layer (``alpha=1``) or call it for another ``alpha``. The gradient
    at 0 is ``alpha`` (the ``x <= 0`` branch), as torch's and ``jax.nn.elu``'s.

    Args:
      alpha: the value approached as ``x -> -inf`` is ``-alpha``; any finite real
        (torch accepts 0 and negative values too).

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``alpha`` is not a finite real number.

    Examples:
      >>> Elu.apply((), (), jnp.array([-1.0, 0.0, 2.0]))[0]
      Array([-0.63212055,  0.        ,  2.        ], dtype=float32)
      >>> layer = Elu(alpha=0.5)
      >>> layer.name, layer.apply((), (), jnp.array([-1.0, 2.0]))[0]
      ('Elu(alpha=0.5)', Array([-0.31606027,  2.        ], dtype=float32))
    """
    alpha = checks.real("Elu", "alpha", alpha)
    return elementwise(_name("Elu", alpha=(alpha, 1.0)), lambda x: jax.nn.elu(x, alpha))


@_optional_arguments
def Celu(alpha: float = 1.0) -> Layer:
    """CELU, as ``torch.nn.CELU(alpha)``: ``x if x > 0 else alpha * (exp(x / alpha) - 1)``.

    The gradient at 0 is 1 from the ``x <= 0`` branch, as torch's. ``jax.nn.celu``
    (``max(x, 0) + min(0, ...)``) reaches 1 there only as the sum of two halves of
    ``max``/``min``'s tie rule, so it is written out here.

    Args:
      alpha: a finite real number, not 0 (torch: "alpha cannot be 0 for CELU").

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``alpha`` is 0 or not a finite real number.

    Examples:
      >>> layer = Celu(alpha=2.0)
      >>> layer.name, layer.apply((), (), jnp.array([-2.0, 0.0, 3.0]))[0]
      ('Celu(alpha=2.0)', Array([-1.2642411,  0.       ,  3.       ], dtype=float32))
      >>> Celu(0.0)
      Traceback (most recent call last):
      funcnet.errors.ArgumentError: Celu: alpha must not be 0 (it divides x), got 0.0. ...
    """
    alpha = checks.real("Celu", "alpha", alpha)
    if alpha == 0:
        raise checks.ArgumentError(
            f"Celu: alpha must not be 0 (it divides x), got {alpha!r}. "
            f"torch.nn.CELU refuses it too; use Celu() for alpha=1."
        )

    inverse = 1.0 / alpha  # torch multiplies by 1/alpha: x / alpha differs by an ulp, which
    # exp turns into 3e-6 (float32) where x / alpha nears 40

    def celu(x):
        # x > 0 would give exp(x / alpha) = inf for alpha > 0 in the branch not taken, and
        # its 0 * inf gradient is NaN: feed that branch 0 instead.
        negative = jnp.where(x > 0, 0, x)
        return jnp.where(x > 0, x, alpha * jnp.expm1(negative * inverse))

    return elementwise(_name("Celu", alpha=(alpha, 1.0)), celu)


_SQRT_HALF = 0.7071067811865476  # a Python float: weakly typed, keeps bfloat16 inputs bfloat16


def _gelu(x):
    """The exact GELU, ``x * Phi(x) = x/2 * (1 + erf(x / sqrt(2)))``: torch.nn.GELU()'s
    default (approximate="none"), in the erf form torch's CPU kernel uses. jax.nn.gelu
    defaults to the tanh approximation, and its exact form goes through erfc, which
    XLA:CPU computes at about twice the cost inside a training step (a GPT's MLP); the
    two agree to 1e-6 (float32), as both do with torch."""
    return 0.5 * x * (1.0 + lax.erf(x * _SQRT_HALF))


_SQRT_2_OVER_PI = 0.7978845608028654
_KAPPA = 0.044715


@jax.custom_jvp
def _gelu_tanh(x):
    """torch.nn.GELU(approximate="tanh"), ``x/2 * (1 + tanh(u))`` with
    ``u = sqrt(2/pi) * (x + 0.044715 x^3)`` (jax.nn.gelu(approximate=True)'s formula too),
    written ``x * sigmoid(2u)``, the same function without the cancellation of
    ``1 + tanh(u)`` for ``x < 0``."""
    return x * jax.nn.sigmoid(2.0 * _SQRT_2_OVER_PI * (x + _KAPPA * (x * x * x)))


@_gelu_tanh.defjvp
def _gelu_tanh_jvp(primals, tangents):
    # torch's closed-form derivative, sigmoid(2u) + x/2 * (1 - tanh(u)^2) * u', with
    # 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u). Autodiff through tanh (XLA:CPU's float32
    # tanh is an approximation, and 1 - tanh^2 cancels) is off by up to 3.5e-6 for
    # |x| in [3, 6]; this form by 2e-7, torch's float32 kernel by 1e-6 (against float64).
    (x,), (t,) = primals, tangents
    x_sq = x * x
    u2 = 2.0 * _SQRT_2_OVER_PI * (x + _KAPPA * (x_sq * x))
    s, s_neg = jax.nn.sigmoid(u2), jax.nn.sigmoid(-u2)
    slope = s + 2.0 * x * s * s_neg * _SQRT_2_OVER_PI * (1.0 + 3.0 * _KAPPA * x_sq)
    return x * s, slope * t


@_optional_arguments
def Gelu(approximate: str = "none") -> Layer:
    """GELU, as ``torch.nn.GELU(approximate)``.

    ``approximate="none"`` (the default, and bare ``Gelu``) is the exact
    ``x/2 * (1 + erf(x / sqrt(2)))``; ``"tanh"`` is
    ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``. Note that ``jax.nn.gelu``
    defaults to the other one: its ``approximate=True`` is ``"tanh"`` here.

    Args:
      approximate: ``"none"`` or ``"tanh"``, torch's strings.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``approximate`` is neither string (a bool gets a hint).

    Examples:
      >>> x = jnp.array([-1.0, 1.0])
      >>> print(np.asarray(Gelu.apply((), (), x)[0], float).round(5))
      [-0.15866  0.84134]
      >>> print(np.asarray(Gelu(approximate="tanh").apply((), (), x)[0], float).round(5))
      [-0.15881  0.84119]
    """
    if isinstance(approximate, bool):
        raise checks.ArgumentError(
            f"Gelu: approximate must be 'none' or 'tanh' (torch's strings), got {approximate!r}. "
            f"jax.nn.gelu's approximate={approximate} is Gelu(approximate="
            f"{'tanh' if approximate else 'none'!r})."
        )
    checks.one_of("Gelu", "approximate", approximate, ("none", "tanh"))
    if approximate == "tanh":
        return elementwise("Gelu(approximate='tanh')", _gelu_tanh)
    return elementwise("Gelu", _gelu)


@_optional_arguments
def Softplus(beta: float = 1.0, threshold: float = 20.0) -> Layer:
    """Softplus, as ``torch.nn.Softplus(beta, threshold)``:
    ``x if beta * x > threshold else log(1 + exp(beta * x)) / beta``.

    Above the threshold the output is ``x`` itself and its gradient 1, as torch's
    (``beta * x == threshold`` exactly takes the log branch, as torch). Below it,
    ``log(1 + exp(z))`` is ``jax.nn.softplus``'s stable form: the same values where
    torch's is finite, and finite where torch's ``exp`` overflows (a threshold above
    ~88 in float32).

    Args:
      beta: a finite real number, not 0 (torch divides by it and returns inf);
        negative values are torch's too.
      threshold: a finite real number.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``beta`` is 0, or either is not a finite real number.

    Examples:
      >>> y, _ = Softplus.apply((), (), jnp.array([-1.0, 0.0, 30.0]))
      >>> print(np.asarray(y, float).round(4))
      [ 0.3133  0.6931 30.    ]
      >>> layer = Softplus(beta=2.0, threshold=4.0)  # x itself where 2 * x > 4
      >>> print(np.asarray(layer.apply((), (), jnp.array([0.0, 3.0]))[0], float).round(4))
      [0.3466 3.    ]
    """
    beta = checks.real("Softplus", "beta", beta)
    threshold = checks.real("Softplus", "threshold", threshold)
    if beta == 0:
        raise checks.ArgumentError(
            "Softplus: beta must not be 0 (softplus divides by it: "
            "torch.nn.Softplus(beta=0) gives inf everywhere), got "
            f"{beta!r}. Use Softplus() for beta=1."
        )

    def softplus(x):
        z = x * beta
        return jnp.where(z > threshold, x, jax.nn.softplus(z) / beta)

    return elementwise(_name("Softplus", beta=(beta, 1.0), threshold=(threshold, 20.0)), softplus)


@_optional_arguments
def Hardtanh(min_val: float = -1.0, max_val: float = 1.0) -> Layer:
    """Hardtanh, as ``torch.nn.Hardtanh(min_val, max_val)``: ``x`` clipped to
    ``[min_val, max_val]``.

    The gradient is 1 strictly inside the interval and 0 at and beyond its ends, as
    torch's. ``jax.nn.hard_tanh`` (fixed to ``[-1, 1]``) has gradient 1 at the ends,
    and ``jnp.clip`` 0.5 at a tie, so neither is used.

    Args:
      min_val: the lower end, a finite real number.
      max_val: the upper end, a finite real number greater than ``min_val``.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`.

    Raises:
      ArgumentError: ``max_val <= min_val`` (torch refuses it too), or either is not a
        finite real number.

    Examples:
      >>> Hardtanh.apply((), (), jnp.array([-2.0, 0.5, 2.0]))[0]
      Array([-1. ,  0.5,  1. ], dtype=float32)
      >>> Hardtanh(0.0, 6.0).name
      'Hardtanh(min_val=0.0, max_val=6.0)'
      >>> Hardtanh(1.0, 1.0)
      Traceback (most recent call last):
      funcnet.errors.ArgumentError: Hardtanh: max_val (1.0) must be greater than min_val (1.0). ...
    """
    min_val = checks.real("Hardtanh", "min_val", min_val)
    max_val = checks.real("Hardtanh", "max_val", max_val)
    if not max_val > min_val:
        raise checks.ArgumentError(
            f"Hardtanh: max_val ({max_val!r}) must be greater than min_val ({min_val!r}). "
            f"Pass them in that order: Hardtanh(min_val={min(min_val, max_val)!r}, max_val="
            f"{max(min_val, max_val)!r}) (for two different values)."
        )

    def hardtanh(x):
        return jnp.where(x <= min_val, min_val, jnp.where(x >= max_val, max_val, x))

    return elementwise(_name("Hardtanh", min_val=(min_val, -1.0), max_val=(max_val, 1.0)), hardtanh)


@_optional_arguments
def LeakyRelu(negative_slope: float = 0.01) -> Layer:
    """Leaky ReLU, as ``torch.nn.LeakyReLU(negative_slope)``:
    ``x if x > 0 else negative_slope * x``.

    The gradient at exactly 0 is ``negative_slope``, as torch's; ``jax.nn.leaky_relu``
    takes ``x >= 0`` and gives 1 there, so it is not used.

    Args:
      negative_slope: the slope for ``x <= 0``, a finite real number (torch's
        default 0.01).

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`, named ``LeakyRelu(slope)``.

    Raises:
      ArgumentError: ``negative_slope`` is not a finite real number.

    Examples:
      >>> x = jnp.array([-2.0, 0.0, 3.0])
      >>> LeakyRelu.apply((), (), x)[0]
      Array([-0.02,  0.  ,  3.  ], dtype=float32)
      >>> jax.grad(lambda x: LeakyRelu(0.2).apply((), (), x)[0])(0.0)
      Array(0.2, dtype=float32, weak_type=True)
    """
    negative_slope = checks.real("LeakyRelu", "negative_slope", negative_slope)
    return elementwise(f"LeakyRelu({negative_slope})", lambda x: jnp.where(x > 0, x, negative_slope * x))


@_optional_arguments
def Prelu(num_parameters: int = 1, init: float = 0.25, axis: int = -1) -> Layer:
    """PReLU, a leaky ReLU with a learned slope, as ``torch.nn.PReLU(num_parameters, init)``:
    ``x if x > 0 else weight * x``.

    params ``{"weight"}`` of shape ``(num_parameters,)``, filled with ``init``: torch's
    ``weight``, copied as it is. ``num_parameters=1`` shares one slope across all
    inputs (any shape, scalars included); otherwise there is one slope per channel,
    and ``num_parameters`` must equal the input's size on ``axis``. torch's channel
    axis is dim 1 (``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)``); funcnet is
    channels-last, so ``axis=-1`` (the default, as :func:`~funcnet.layers.BatchNorm`'s)
    is that axis for ``(N, C)`` and ``(N, ..., C)`` inputs; pass ``axis=1`` for
    channels-first inputs. The gradient at exactly 0 takes the ``weight * x`` branch
    (input gradient ``weight``, weight gradient 0), as torch's.

    Args:
      num_parameters: the number of slopes, 1 or the channel count.
      init: the initial slope, a finite real number.
      axis: the channel axis, used when ``num_parameters > 1``.

    Returns:
      A stateless :class:`funcnet.Layer` with params.

    Raises:
      ArgumentError: a bad argument; at ``init``, ``num_parameters`` that is neither 1
        nor the channel count (the message gives both numbers).

    Examples:
      >>> layer = Prelu(num_parameters=3)
      >>> out_shape, params, state = layer.init(jax.random.key(0), (-1, 3))
      >>> params
      {'weight': Array([0.25, 0.25, 0.25], dtype=float32)}
      >>> layer.apply(params, state, jnp.array([[-4.0, 0.0, 2.0]]))[0]
      Array([[-1.,  0.,  2.]], dtype=float32)
      >>> Prelu(num_parameters=4).init(jax.random.key(0), (-1, 3))
      Traceback (most recent call last):
      funcnet.errors.ArgumentError: Prelu(num_parameters=4): num_parameters (4) must be 1 or
      the channel count, the input's size on axis -1 (3); ...
    """
    num_parameters = checks.positive_int("Prelu", "num_parameters", num_parameters)
    init_value = checks.real("Prelu", "init", init)
    if not checks.is_int(axis):
        raise checks.ArgumentError(f"Prelu: axis must be an int (the channel axis), got {checks.got(axis)}.")
    axis = int(axis)
    name = _name("Prelu", num_parameters=(num_parameters, 1), init=(init_value, 0.25), axis=(axis, -1))
    per_channel = num_parameters > 1

    def init_fn(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=2 if per_channel else 0)
        if per_channel:
            ax = normalize_axis(name, axis, len(shape))
            check_known(name, shape, [ax], "channel count")
            if shape[ax] != num_parameters:
                raise checks.ArgumentError(
                    f"{name}: num_parameters ({num_parameters}) must be 1 or the channel "
                    f"count, the input's size on axis {axis} ({shape[ax]}); input_shape "
                    f"{shape}. Use Prelu(num_parameters={shape[ax]}) for a slope per channel, "
                    f"Prelu() for one shared slope, or set axis to the channel axis."
                )
        return shape, {"weight": jnp.full((num_parameters,), init_value, jnp.float32)}, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=2 if per_channel else None)
        weight = params.get("weight") if isinstance(params, dict) else None
        if getattr(weight, "shape", None) != (num_parameters,):
            raise MismatchError(
                name,
                "params",
                name,
                f"{{'weight': shape ({num_parameters},)}}",
                repr(jax.tree_util.tree_map(jnp.shape, params)),
                hint="Pass the params this layer's init made.",
            )
        if per_channel:
            ax = normalize_axis(name, axis, inputs.ndim)
            check_input(name, inputs, axis=ax, size=num_parameters, what="channels")
            slope = weight.reshape((num_parameters,) + (1,) * (inputs.ndim - 1 - ax))
        else:
            slope = weight[0]
        return jnp.where(inputs > 0, inputs, slope * inputs), state

    return named(name, init_fn, apply)


@_optional_arguments
def Glu(axis: int = -1) -> Layer:
    """GLU, the gated linear unit, as ``torch.nn.GLU(dim=axis)``: the input split along
    ``axis`` into halves ``a`` (the first) and ``b``, then ``a * sigmoid(b)``.

    The output is half as long on ``axis``, whose size must be even (torch refuses odd
    sizes too). ``axis=-1`` is torch's default ``dim=-1``: the features of ``(N, F)``
    and of channels-last ``(N, ..., C)`` inputs. Gradients are those of the product:
    ``g * sigmoid(b)`` for ``a`` and ``g * a * sigmoid(b) * (1 - sigmoid(b))`` for ``b``.

    Args:
      axis: the axis to split, an int (torch's ``dim``), checked against the input's
        rank at ``init`` and at trace time.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`; ``init`` halves ``axis`` in
      the shape (an unknown size, -1, stays -1).

    Raises:
      ArgumentError: ``axis`` is not an int.
      ValueError: at ``init`` or at trace time, an input without that axis, or an odd
        size on ``axis`` (the message says how to get an even one).

    Examples:
      >>> Glu.init(jax.random.key(0), (-1, 6))[0]
      (-1, 3)
      >>> y, _ = Glu.apply((), (), jnp.array([[1.0, 2.0, 0.0, 100.0]]))
      >>> print(np.asarray(y, float).round(4))
      [[0.5 2. ]]
      >>> Glu(axis=0).name
      'Glu(axis=0)'
    """
    axis = checks.integer("Glu", "axis", axis)
    name = _name("Glu", axis=(axis, -1))

    def halved(shape, ax):
        if shape[ax] != -1 and shape[ax] % 2:
            raise ValueError(
                f"{name}: the input's size on axis {axis} must be even, Glu splits it into "
                f"two halves (a * sigmoid(b)); got {shape[ax]} in shape {shape}. Have the layer "
                f"before it give twice the features wanted, e.g. Dense(2 * k) for k outputs."
            )
        return shape[:ax] + (-1 if shape[ax] == -1 else shape[ax] // 2,) + shape[ax + 1 :]

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=1)
        return halved(shape, normalize_axis(name, axis, len(shape))), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=1)
        ax = normalize_axis(name, axis, inputs.ndim)
        halved(tuple(inputs.shape), ax)
        a, b = jnp.split(inputs, 2, axis=ax)
        return a * jax.nn.sigmoid(b), state

    return named(name, init, apply)


# --------------------------------------------------------------------------- #
# Constructors.
# --------------------------------------------------------------------------- #


def _check_axis(layer: str, axis) -> int:
    if not checks.is_int(axis):
        raise TypeError(f"{layer}: axis must be an int, got {axis!r}.")
    return int(axis)


def Softmax(axis: int = -1) -> Layer:
    """``exp(x) / sum(exp(x), axis)``: ``torch.nn.Softmax(dim=axis)``.

    Args:
      axis: the axis the outputs sum to 1 along (torch's ``dim``), an int checked
        against the input's rank at ``init`` and at trace time.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`, named ``Softmax(axis=...)``;
      the output has the input's shape.

    Raises:
      TypeError: ``axis`` is not an int.
      ValueError: an input (at ``init`` or at trace time) whose rank has no such axis.

    Examples:
      >>> layer = Softmax()
      >>> y, _ = layer.apply((), (), jnp.log(jnp.array([1.0, 3.0])))
      >>> layer.name, np.round(np.asarray(y, np.float64), 3).tolist()
      ('Softmax(axis=-1)', [0.25, 0.75])
    """
    axis = _check_axis("Softmax", axis)
    return elementwise(f"Softmax(axis={axis})", lambda x: jax.nn.softmax(x, axis=axis), axis)


def LogSoftmax(axis: int = -1) -> Layer:
    """``x - logsumexp(x, axis)``: ``torch.nn.LogSoftmax(dim=axis)``.

    Args:
      axis: the axis to normalise along (torch's ``dim``), an int checked against the
        input's rank at ``init`` and at trace time.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`, named
      ``LogSoftmax(axis=...)``; the output has the input's shape.

    Raises:
      TypeError: ``axis`` is not an int.
      ValueError: an input (at ``init`` or at trace time) whose rank has no such axis.

    Examples:
      >>> y, _ = LogSoftmax(axis=0).apply((), (), jnp.log(jnp.array([1.0, 3.0])))
      >>> np.round(np.asarray(jnp.exp(y), np.float64), 3).tolist()
      [0.25, 0.75]
    """
    axis = _check_axis("LogSoftmax", axis)
    return elementwise(f"LogSoftmax(axis={axis})", lambda x: jax.nn.log_softmax(x, axis=axis), axis)


def Threshold(threshold: float, value: float) -> Layer:
    """``x if x > threshold else value``: ``torch.nn.Threshold(threshold, value)``.

    Both arguments are required, as in torch. The gradient is 1 where
    ``x > threshold`` and 0 elsewhere, at ``x == threshold`` too, as torch's. The test
    is written as torch's kernel writes it, ``value if x <= threshold else x``, so a NaN
    input stays NaN (and passes its gradient), as in torch.

    Args:
      threshold: the value ``x`` must exceed to pass, a finite real number.
      value: what replaces ``x`` at and below ``threshold``, a finite real number.

    Returns:
      A parameter-free, stateless :class:`funcnet.Layer`, named
      ``Threshold(threshold=..., value=...)``; the output has the input's shape.

    Raises:
      ArgumentError: either argument is not a finite real number.

    Examples:
      >>> layer = Threshold(0.5, -1.0)
      >>> layer.name, layer.apply((), (), jnp.array([0.0, 0.5, 2.0]))[0]
      ('Threshold(threshold=0.5, value=-1.0)', Array([-1., -1.,  2.], dtype=float32))
    """
    threshold = checks.real("Threshold", "threshold", threshold)
    value = checks.real("Threshold", "value", value)
    return elementwise(
        f"Threshold(threshold={threshold!r}, value={value!r})", lambda x: jnp.where(x <= threshold, value, x)
    )


# The optional-argument layers are instances, which doctest's finder skips: run their
# docstrings' examples by name.
__test__ = {
    name: globals()[name].__doc__
    for name in ("Elu", "Celu", "Gelu", "Softplus", "Hardtanh", "LeakyRelu", "Prelu", "Glu")
}
