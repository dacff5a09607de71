"""Mixed precision: a dtype policy for layers, and loss scaling for float16.

The policy
----------
A :class:`Policy` names three dtypes, as jmp's ``Policy`` and flax's
``param_dtype``/``dtype`` pair do:

* ``param_dtype``: how parameters are *stored* (what ``init`` returns and what
  optax updates: the "master weights");
* ``compute_dtype``: what the layer computes in (params and floating inputs are
  cast to it at apply time);
* ``output_dtype``: what the layer returns (floating outputs are cast to it).

The usual recipe is ``Policy("float32", "bfloat16", "float32")``: float32 master
weights, bfloat16 matmuls, float32 logits for the loss. Gradients with respect to
the stored params arrive in ``param_dtype`` (the transpose of a cast is a cast).

Every layer follows a policy through one mechanism, :func:`apply_policy`, which
wraps any :class:`funcnet.Layer` -- a single ``Dense``, a whole ``serial`` model,
or a user layer. Layers take no ``dtype`` argument of their own: one wrapper
keeps the rule the same for all of them. Integer inputs and params (token ids,
counters) are never cast. Layer *state* is not cast either; each layer keeps its
state in the dtype its ``init`` chose -- BatchNorm keeps its running statistics
in float32 and refuses lower-precision ones (see
:func:`funcnet.layers.BatchNorm`). LayerNorm and BatchNorm compute their
statistics in at least float32 whatever the compute dtype.

Nest policies with care: ``apply_policy(model, bf16)`` casts every param of
``model`` to bfloat16 before any inner wrapper sees it, so an inner float32
policy cannot give back the rounded-off bits. To keep one layer in float32, wrap
the layers one by one instead of the model as a whole. ``TransformerBlock(policy=...)``
and ``funcnet.models.GPT(policy=...)`` do that for a transformer, as ``torch.autocast``
does: the matrix products follow the policy; the LayerNorms and the residual stream stay
in the params' float32.

Losses (:mod:`funcnet.losses`) and MXNet output ops (:mod:`funcnet.outputs`)
compute in float32 when handed bfloat16/float16 inputs; metrics accumulate in
float32 and int32.

Loss scaling (float16)
----------------------
float16 has a narrow exponent range: small gradients underflow to zero.
Multiplying the loss by ``S`` scales every gradient by ``S`` through the
backward pass; dividing the gradients by ``S`` before the update restores them.
:class:`LossScale` is the state (all arrays: it jits, pmaps and checkpoints);
:func:`scale_loss`, :func:`unscale_grads`, :func:`all_finite` and
:func:`update_loss_scale` are the pieces, and :func:`funcnet.train.make_train_step`
puts them into the step for a ``TrainState`` created with ``loss_scale=``. bfloat16
has float32's exponent range and does not need loss scaling.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from funcnet.core import Layer, PyTree, as_layer, named

__all__ = [
    "Policy",
    "parse_policy",
    "as_policy",
    "apply_policy",
    "cast_floating",
    "LossScale",
    "static_loss_scale",
    "dynamic_loss_scale",
    "scale_loss",
    "unscale_grads",
    "all_finite",
    "update_loss_scale",
]

_ALIASES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "half": "float16",
    "float": "float32",
    "full": "float32",
}
_KEYS = {
    "params": "param_dtype",
    "param": "param_dtype",
    "p": "param_dtype",
    "compute": "compute_dtype",
    "c": "compute_dtype",
    "output": "output_dtype",
    "o": "output_dtype",
}


def _float_dtype(where: str, what: str, dtype) -> np.dtype:
    name = _ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    try:
        dt = jnp.dtype(name)
    except TypeError:
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(
            f"{where}: {what} must be a floating dtype (float32, bfloat16, "
            f"float16, float64 or the short names f32/bf16/f16), got {dtype!r}."
        )
    return dt


class Policy(NamedTuple):
    """Parameter, compute and output dtypes (see the module docstring).

    ``Policy()`` is full float32 (a no-op); ``output_dtype=None`` means "the
    compute dtype". Build one with :meth:`make` (validates, accepts short names)
    or :func:`parse_policy` from a string.

    Examples:
      >>> Policy.make("float32", "bf16", "float32").compute_dtype
      dtype(bfloat16)
    """

    param_dtype: Any = jnp.float32
    compute_dtype: Any = jnp.float32
    output_dtype: Any = None

    @classmethod
    def make(cls, param_dtype="float32", compute_dtype="float32", output_dtype=None) -> "Policy":
        """A validated policy; dtypes may be dtypes or names (``"bf16"``, ``"float32"``)."""
        where = "funcnet.precision.Policy"
        p = _float_dtype(where, "param_dtype", param_dtype)
        c = _float_dtype(where, "compute_dtype", compute_dtype)
        o = c if output_dtype is None else _float_dtype(where, "output_dtype", output_dtype)
        return cls(p, c, o)

    def cast_to_param(self, tree):
        """Floating leaves of ``tree`` in ``param_dtype``."""
        return cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree):
        """Floating leaves of ``tree`` in ``compute_dtype``."""
        return cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree):
        """Floating leaves of ``tree`` in ``output_dtype`` (the compute dtype if None)."""
        return cast_floating(tree, self.compute_dtype if self.output_dtype is None else self.output_dtype)


def parse_policy(spec: str) -> Policy:
    """A :class:`Policy` from ``"params=float32,compute=bfloat16,output=float32"``.

    Keys ``params``/``p``, ``compute``/``c``, ``output``/``o``; values are dtype
    names or ``f32``/``bf16``/``f16``/``f64``. A key left out takes the default
    (params and compute float32, output = compute). A bare dtype, ``"bf16"``,
    sets all three.

    Raises:
      ValueError: a part that is not ``key=dtype`` with a known key, or a key given twice.

    Examples:
      >>> p = parse_policy("params=float32,compute=bf16")
      >>> p.param_dtype, p.compute_dtype, p.output_dtype
      (dtype('float32'), dtype(bfloat16), dtype(bfloat16))
    """
    where = "funcnet.precision.parse_policy"
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"{where}: expected a string like 'params=float32,compute=bfloat16,output=float32', got {spec!r}."
        )
    if "=" not in spec:
        d = spec.strip()
        return Policy.make(d, d, d)
    fields = {}
    for part in spec.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in _KEYS:
            raise ValueError(
                f"{where}: cannot read {part.strip()!r} in {spec!r}; expected "
                f"key=dtype with key one of params, compute, output."
            )
        if _KEYS[key] in fields:
            raise ValueError(f"{where}: {key!r} is given twice in {spec!r}.")
        fields[_KEYS[key]] = value
    return Policy.make(**fields)


def cast_floating(tree: PyTree, dtype: DTypeLike) -> PyTree:
    """Casts the floating-point leaves of ``tree`` to ``dtype``; other leaves are kept.

    Examples:
      >>> tree = cast_floating({"w": jnp.ones(2), "ids": jnp.arange(2)}, jnp.bfloat16)
      >>> tree["w"].dtype, tree["ids"].dtype
      (dtype(bfloat16), dtype('int32'))
    """

    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jnp.asarray(x).astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def as_policy(policy: Policy | str, where: str = "funcnet.precision.as_policy") -> Policy:
    """``policy`` as a validated :class:`Policy`: a Policy, or a string for
    :func:`parse_policy`. For layers that take a ``policy=`` argument (``where`` names
    the layer in the error).

    Args:
      policy: a :class:`Policy` or a string such as ``"params=float32,compute=bf16"``.
      where: the name the error gives for the caller.

    Returns:
      The :class:`Policy`, its dtypes validated.

    Raises:
      TypeError: ``policy`` is neither a Policy nor a string.
      ValueError: a string :func:`parse_policy` cannot read, or a non-floating dtype.

    Examples:
      >>> as_policy("compute=bf16").compute_dtype
      dtype(bfloat16)
      >>> as_policy(Policy.make("float32", "float16")).output_dtype
      dtype('float16')
    """
    if isinstance(policy, str):
        return parse_policy(policy)
    if isinstance(policy, Policy):
        return Policy.make(*policy)
    raise TypeError(
        f"{where}: policy must be a funcnet.precision.Policy or a string like "
        f"'params=float32,compute=bfloat16,output=float32', got "
        f"{type(policy).__name__}."
    )


def apply_policy(layer: Layer, policy: Policy | str) -> Layer:
    """``layer`` following ``policy`` (a :class:`Policy` or a string for :func:`parse_policy`).

    * ``init``: the layer's params, cast to ``param_dtype``; its state unchanged.
    * ``apply``: params and floating inputs cast to ``compute_dtype``, the layer
      run, its floating outputs cast to ``output_dtype``. The new state is
      returned as the layer made it (BatchNorm: float32 statistics).

    The stored params stay in ``param_dtype``, so their gradients (and optax's
    updates) are in ``param_dtype`` too. Integer leaves are never cast.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net = apply_policy(Dense(3), "params=float32,compute=bf16,output=float32")
      >>> _, params, state = net.init(jax.random.key(0), (-1, 2))
      >>> out, _ = net.apply(params, state, jnp.ones((1, 2)))
      >>> params["W"].dtype, out.dtype
      (dtype('float32'), dtype('float32'))
    """
    where = "funcnet.precision.apply_policy"
    inner = as_layer(layer, where)
    policy = as_policy(policy, where)

    def init(rng, input_shape):
        out_shape, params, state = inner.init(rng, input_shape)
        return out_shape, policy.cast_to_param(params), state

    def apply(params, state, inputs, *, rng=None, train=False):
        out, new_state = inner.apply(
            policy.cast_to_compute(params), state, policy.cast_to_compute(inputs), rng=rng, train=train
        )
        return policy.cast_to_output(out), new_state

    short = lambda d: jnp.dtype(d).name
    return named(
        f"{inner.name}@{short(policy.param_dtype)}/{short(policy.compute_dtype)}/{short(policy.output_dtype)}",
        init,
        apply,
    )


# --------------------------------------------------------------------------- #
# Loss scaling.
# --------------------------------------------------------------------------- #


class LossScale(NamedTuple):
    """Loss-scale state; every field is an array, so it jits, pmaps and checkpoints.

    Attributes:
      scale: float32 scalar, the current multiplier ``S`` of the loss.
      good_steps: int32, consecutive finite steps since the scale last changed.
      period: int32, finite steps after which a dynamic scale grows.
      factor: float32, the growth/shrink factor; ``1`` makes the scale static.
      min_scale: float32, the floor a dynamic scale never goes below.

    Make one with :func:`static_loss_scale` or :func:`dynamic_loss_scale`.

    Examples:
      >>> ls = dynamic_loss_scale(2.0 ** 10, period=100)
      >>> float(ls.scale), int(ls.good_steps), int(ls.period), float(ls.factor)
      (1024.0, 0, 100, 2.0)
      >>> jax.tree.map(jnp.shape, ls).scale  # every field an array: a pytree
      ()
    """

    scale: jax.Array
    good_steps: jax.Array
    period: jax.Array
    factor: jax.Array
    min_scale: jax.Array


def _positive(where: str, what: str, value, integer=False):
    ok = (
        isinstance(value, (int, float, np.number))
        and not isinstance(value, bool)
        and np.isfinite(value)
        and value > 0
        and (not integer or float(value).is_integer())
    )
    if not ok:
        kind = "positive int" if integer else "positive finite number"
        raise ValueError(f"{where}: {what} must be a {kind}, got {value!r}.")
    return value


def static_loss_scale(scale: float = 2.0**15) -> LossScale:
    """A fixed scale ``S``: steps with non-finite gradients are still skipped, ``S`` never changes.

    Examples:
      >>> float(static_loss_scale(1024.0).scale)
      1024.0
    """
    scale = _positive("funcnet.precision.static_loss_scale", "scale", scale)
    return LossScale(
        jnp.asarray(scale, jnp.float32),
        jnp.zeros((), jnp.int32),
        jnp.ones((), jnp.int32),
        jnp.ones((), jnp.float32),
        jnp.asarray(scale, jnp.float32),
    )


def dynamic_loss_scale(
    initial: float = 2.0**15, *, period: int = 2000, factor: float = 2.0, min_scale: float = 1.0
) -> LossScale:
    """A scale that shrinks by ``factor`` on every non-finite step and grows by it after
    ``period`` finite steps in a row (PyTorch ``GradScaler``'s ``backoff_factor = 1/factor``,
    ``growth_factor = factor``, ``growth_interval = period``; its defaults are ``2**16``,
    2 and 2000). It never falls below ``min_scale``.

    Give it to ``funcnet.TrainState.create(..., loss_scale=...)``: every step of
    :func:`funcnet.train.make_train_step` then scales the loss.

    Examples:
      >>> ls = dynamic_loss_scale(2.0 ** 10, period=2)
      >>> float(update_loss_scale(ls, jnp.asarray(False)).scale)  # non-finite: halved
      512.0
    """
    where = "funcnet.precision.dynamic_loss_scale"
    _positive(where, "initial", initial)
    _positive(where, "period", period, integer=True)
    _positive(where, "min_scale", min_scale)
    if not (isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1 and np.isfinite(factor)):
        raise ValueError(
            f"{where}: factor must be a finite number > 1, got {factor!r}. Use static_loss_scale for a fixed scale."
        )
    return LossScale(
        jnp.asarray(initial, jnp.float32),
        jnp.zeros((), jnp.int32),
        jnp.asarray(period, jnp.int32),
        jnp.asarray(factor, jnp.float32),
        jnp.asarray(min_scale, jnp.float32),
    )


def _check_scale(where: str, other: str, loss_scale) -> None:
    # Swapped arguments otherwise fail inside with "has no attribute 'scale'".
    if not isinstance(loss_scale, LossScale):
        raise TypeError(
            f"{where}: the first argument must be the LossScale (from "
            f"static_loss_scale() or dynamic_loss_scale()), got "
            f"{type(loss_scale).__name__}; call {where}(loss_scale, {other}) "
            f"(arguments swapped?)."
        )


def scale_loss(loss_scale: LossScale, loss: ArrayLike) -> jax.Array:
    """``loss * S``, computed in float32 at least (a float16 loss times ``2**15`` overflows).

    Examples:
      >>> scaled = scale_loss(static_loss_scale(8.0), jnp.float16(2.0))
      >>> scaled.dtype, float(scaled)
      (dtype('float32'), 16.0)
    """
    _check_scale("scale_loss", "loss", loss_scale)
    loss = jnp.asarray(loss)
    return loss.astype(jnp.promote_types(loss.dtype, jnp.float32)) * loss_scale.scale


def unscale_grads(loss_scale: LossScale, grads: PyTree) -> PyTree:
    """``grads / S``, leaf by leaf, divided in float32 and returned in each leaf's dtype.

    Examples:
      >>> g = unscale_grads(static_loss_scale(8.0), {"w": jnp.full((2,), 16.0, jnp.float16)})
      >>> g["w"].dtype, g["w"].tolist()
      (dtype('float16'), [2.0, 2.0])
    """
    _check_scale("unscale_grads", "grads", loss_scale)
    inv = 1.0 / loss_scale.scale

    def unscale(g):
        wide = jnp.promote_types(g.dtype, jnp.float32)
        return (g.astype(wide) * inv).astype(g.dtype)

    return jax.tree.map(unscale, grads)


def all_finite(tree: PyTree) -> jax.Array:
    """A bool scalar: True when no floating leaf of ``tree`` holds an inf or a NaN.

    Examples:
      >>> bool(all_finite([jnp.ones(2), jnp.asarray([1.0, jnp.inf])]))
      False
    """
    leaves = [
        jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.floating)
    ]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def update_loss_scale(loss_scale: LossScale, grads_finite: ArrayLike) -> LossScale:
    """The next state after a step whose (unscaled) gradients were ``grads_finite``.

    Non-finite: ``S <- max(S / factor, min_scale)``, ``good_steps <- 0``. Finite:
    ``good_steps + 1``; when that reaches ``period``, ``S <- S * factor`` (kept
    finite in float32) and ``good_steps <- 0``. With ``factor == 1`` ``S`` stays.

    Args:
      loss_scale: the current :class:`LossScale`.
      grads_finite: a bool scalar (e.g. :func:`all_finite` of the unscaled gradients);
        may be traced.

    Returns:
      The next :class:`LossScale`.

    Raises:
      TypeError: ``loss_scale`` is not a :class:`LossScale` (e.g. the arguments swapped).

    Examples:
      >>> ls = dynamic_loss_scale(2.0 ** 10, period=2)
      >>> ls = update_loss_scale(ls, jnp.asarray(True))
      >>> float(ls.scale), int(ls.good_steps)
      (1024.0, 1)
      >>> ls = update_loss_scale(ls, jnp.asarray(True))  # period finite steps: grows
      >>> float(ls.scale), int(ls.good_steps)
      (2048.0, 0)
      >>> float(update_loss_scale(ls, jnp.asarray(False)).scale)  # non-finite: shrinks
      1024.0
    """
    _check_scale("update_loss_scale", "grads_finite", loss_scale)
    ls = loss_scale
    good = ls.good_steps + 1
    grow = good >= ls.period
    grown = jnp.where(grow, ls.scale * ls.factor, ls.scale)
    grown = jnp.where(jnp.isfinite(grown), grown, ls.scale)
    shrunk = jnp.maximum(ls.scale / ls.factor, ls.min_scale)
    return ls._replace(
        scale=jnp.where(grads_finite, grown, shrunk).astype(jnp.float32),
        good_steps=jnp.where(grads_finite & ~grow, good, 0).astype(jnp.int32),
    )
