"""Dropout (inverted): ``Dropout`` (elements) and ``SpatialDropout`` (whole channels)."""

from __future__ import annotations


import jax
import jax.numpy as jnp

from funcnet import _checks as checks
from funcnet.core import Layer, check_input, check_shape, named, need_rng

__all__ = ["Dropout", "SpatialDropout"]


def Dropout(rate: float) -> Layer:
    """Inverted dropout, as ``torch.nn.Dropout(p=rate)`` and ``flax.linen.Dropout``.

    With ``train=True`` every element is kept independently with probability
    ``1 - rate`` and the kept ones are multiplied by ``1 / (1 - rate)``:

    ```
    y = where(mask, x * (1 / (1 - rate)), 0),   mask ~ Bernoulli(1 - rate)
    ```

    so ``E[y] = x`` and nothing needs rescaling at evaluation time: ``train=False``
    is the identity. The mask comes from the ``rng`` passed to ``apply``; train mode
    without one raises ValueError. ``rate == 0`` is the identity in both modes and
    needs no ``rng`` (a ``Dropout(0.0)`` placeholder never costs a key). Stateless.

    Args:
      rate: drop probability, a real number in ``[0, 1)``.

    Returns:
      The layer, an ``(init, apply)`` pair without params or state:
      ``init(rng, input_shape)`` gives ``(input_shape, (), ())``; the output has the
      input's shape and dtype.

    Raises:
      ArgumentError: ``rate`` not a real number in ``[0, 1)``.
      ValueError: at ``apply``, ``train=True`` with ``rate > 0`` and no ``rng``.

    Examples:
      >>> init, apply = Dropout(0.5)
      >>> x = jnp.ones((2, 4))
      >>> bool((apply((), (), x)[0] == x).all())          # eval: the identity
      True
      >>> y, _ = apply((), (), x, rng=jax.random.key(0), train=True)
      >>> sorted(set(y.ravel().tolist())) in ([0.0, 2.0], [2.0], [0.0])  # kept ones scaled by 2
      True
    """
    rate = checks.real(
        "Dropout", "rate (the probability of dropping an element)", rate, low=0.0, high=1.0, high_open=True
    )
    keep = 1.0 - rate
    scale = 1.0 / keep
    name = f"Dropout({rate:g})"

    def init(rng, input_shape):
        return check_shape(name, input_shape, min_rank=0), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        if not train or rate == 0.0:
            return inputs, state
        need_rng(name, rng)
        mask = jax.random.bernoulli(rng, keep, jnp.shape(inputs))
        # A multiply, as torch does: XLA would turn `x / keep` into `x * (1/keep)` anyway.
        # The Python float is weakly typed, so the input dtype is kept.
        return jnp.where(mask, inputs * scale, jnp.zeros((), inputs.dtype)), state

    return named(name, init, apply)


def SpatialDropout(rate: float) -> Layer:
    """Channel dropout, as ``torch.nn.Dropout2d(p=rate)`` and Keras ``SpatialDropout2D(rate)``.

    On channels-last inputs ``(N, *spatial, C)`` (1 to 3 spatial axes, e.g. the
    ``(N, H, W, C)`` output of a ``Conv``), ``train=True`` keeps or drops each
    channel of each example as a whole: one draw per ``(n, c)``, shared by every
    spatial position:

    ```
    y[n, ..., c] = where(mask[n, c], x[n, ..., c] * (1 / (1 - rate)), 0),
    mask ~ Bernoulli(1 - rate)
    ```

    Neighbouring positions of a feature map are strongly correlated, so dropping
    single elements (:func:`Dropout`) regularises them little; dropping whole
    feature maps does (Tompson et al., 2015). As with ``Dropout``, ``train=False`` is
    the identity, the mask comes from ``apply``'s ``rng`` (train mode without one
    raises), and ``rate == 0`` is the identity in both modes, needing no ``rng``.
    PyTorch calls this ``Dropout2d`` (``Dropout1d``/``Dropout3d`` for 1 and 3 spatial
    axes, all channels first), Keras ``SpatialDropout2D`` (``1D``/``3D``); this one
    layer takes any of the three ranks, channels last. Stateless.

    Args:
      rate: probability of dropping a channel, a real number in ``[0, 1)``.

    Returns:
      The layer, an ``(init, apply)`` pair without params or state:
      ``init(rng, input_shape)`` gives ``(input_shape, (), ())``; the output has the
      input's shape and dtype.

    Raises:
      ArgumentError: ``rate`` not a real number in ``[0, 1)``.
      ValueError: an input that is not of rank 3 to 5; at ``apply``, ``train=True``
        with ``rate > 0`` and no ``rng``.

    Examples:
      >>> init, apply = SpatialDropout(0.5)
      >>> y, _ = apply((), (), jnp.ones((1, 4, 4, 8)), rng=jax.random.key(0), train=True)
      >>> bool(jnp.all((y == 0).all(axis=(1, 2)) | (y == 2).all(axis=(1, 2))))  # whole channels
      True
    """
    rate = checks.real(
        "SpatialDropout", "rate (the probability of dropping a channel)", rate, low=0.0, high=1.0, high_open=True
    )
    keep = 1.0 - rate
    scale = 1.0 / keep
    name = f"SpatialDropout({rate:g})"

    def check_rank(shape):
        if not 3 <= len(shape) <= 5:
            hint = (
                " For (N, features) inputs use Dropout: without spatial axes a channel is one element."
                if len(shape) == 2
                else ""
            )
            raise ValueError(
                f"{name}: expected a channels-last input (N, *spatial, C) with 1 "
                f"to 3 spatial axes (rank 3 to 5, e.g. (N, H, W, C)), got shape "
                f"{tuple(shape)}.{hint}"
            )

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=0)
        check_rank(shape)
        return shape, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs)
        check_rank(inputs.shape)
        if not train or rate == 0.0:
            return inputs, state
        need_rng(name, rng)
        shape = jnp.shape(inputs)
        mask = jax.random.bernoulli(rng, keep, (shape[0],) + (1,) * (len(shape) - 2) + shape[-1:])
        return jnp.where(mask, inputs * scale, jnp.zeros((), inputs.dtype)), state

    return named(name, init, apply)
