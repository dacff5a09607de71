"""Normalization layers: BatchNorm (optionally synced across devices), InstanceNorm, LayerNorm,
RMSNorm and GroupNorm."""

from __future__ import annotations

import math
from typing import Hashable, Optional, Sequence

import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet.core import Layer, check_input, check_known, check_shape, named, need_state, normalize_axis
from funcnet.core import check_param_shapes

__all__ = ["BatchNorm", "InstanceNorm", "LayerNorm", "RMSNorm", "GroupNorm"]


def _check_axes(layer: str, axis):
    axes = (axis,) if checks.is_int(axis) else axis
    if not isinstance(axes, (tuple, list)) or not axes or not all(checks.is_int(a) for a in axes):
        raise ValueError(f"{layer}: axis must be an int or a non-empty tuple of ints, got {axis!r}.")
    return tuple(int(a) for a in axes)


def _normalized_axes(layer: str, axes, rank: int):
    norm = sorted(normalize_axis(layer, a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        raise ValueError(f"{layer}: axis {axes} names the same axis twice for a rank-{rank} input.")
    return tuple(norm)


def _compute_dtype(dtype):
    """Statistics in at least float32: half-precision means/variances lose too much."""
    return jnp.promote_types(dtype, jnp.float32) if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


def _out_dtype(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


def _check_stats_dtype(layer: str, state) -> None:
    """Running averages need float32: bfloat16 cannot even hold a momentum of 0.99, and
    each update would round away the small ``(1 - momentum) * batch`` contribution."""
    for key in ("mean", "var"):
        dtype = getattr(state.get(key) if isinstance(state, dict) else None, "dtype", None)
        if dtype is not None and (not jnp.issubdtype(dtype, jnp.floating) or dtype.itemsize < 4):
            raise TypeError(
                f"{layer}: the running statistics must be float32 (or float64), got "
                f"state[{key!r}] of dtype {dtype}. Low-precision running averages "
                f"drift away from the data's statistics. Keep the float32 state "
                f"from init (cast only params and inputs for mixed precision, "
                f"e.g. with funcnet.precision.apply_policy), or upcast it once: "
                f"jax.tree.map(lambda a: a.astype(jnp.float32), state)."
            )


def _check_batch_statistics(layer: str, shape, reduce_axes, axis_name) -> None:
    """torch's "Expected more than 1 value per channel when training": with one value
    per channel the batch variance is 0 and the output is the bias alone, silently;
    with none, NaN. Shapes are static, so this fires once, at trace time."""
    count = math.prod(shape[a] for a in reduce_axes)
    if count == 1 and axis_name is not None:
        count *= lax.axis_size(axis_name)  # synced: statistics over every device's values
    if count > 1:
        return
    raise ValueError(
        f"{layer}: expected more than 1 value per channel when training, got input of shape "
        f"{tuple(shape)}: the batch statistics over axes {tuple(reduce_axes)} would be taken "
        f"over {count} value(s) per channel, and the output would be the bias alone (or NaN). "
        f"Drop the last partial batch (funcnet.data.batches(..., drop_remainder=True)), use "
        f"batches of at least 2 examples, or apply it with train=False (running statistics)."
    )


_RUNNING_VAR = ("unbiased", "biased")


def _batch_norm_options(layer: str, momentum, running_var, track_running_stats):
    if momentum is not None:
        momentum = checks.real(
            layer,
            "momentum (weight of the old running value; None for torch's cumulative average)",
            momentum,
            low=0.0,
            high=1.0,
        )
    if running_var not in _RUNNING_VAR:
        raise checks.ArgumentError(
            f"{layer}: running_var must be 'unbiased' (torch's running_var, the batch variance "
            f"times n / (n - 1)) or 'biased' (the variance used to normalise, as Keras and "
            f"Flax keep it), got {checks.got(running_var)}."
        )
    track_running_stats = checks.flag(layer, "track_running_stats", track_running_stats)
    return momentum, track_running_stats


def _batch_stats(x, reduce_axes, bshape, axis_name):
    """Mean and biased variance over ``reduce_axes`` (and over ``axis_name``'s devices),
    and ``n``, the number of values per feature they were taken over."""
    n = math.prod(x.shape[a] for a in reduce_axes)
    mean = jnp.mean(x, axis=reduce_axes)
    if axis_name is not None:
        mean = lax.pmean(mean, axis_name)
        n *= lax.axis_size(axis_name)
    var = jnp.mean(jnp.square(x - mean.reshape(bshape)), axis=reduce_axes)
    if axis_name is not None:
        var = lax.pmean(var, axis_name)
    return mean, var, n


def _updated_running_stats(state, mean, var, n, momentum, running_var):
    """torch's update: ``running <- (1 - f) * running + f * batch`` with ``f = 1 - momentum``
    (``1 / num_batches_tracked`` for ``momentum=None``), the variance unbiased by default."""
    if running_var == "unbiased":
        var = var * (n / (n - 1))
    new_state = dict(state)
    if momentum is None:
        count = state["num_batches_tracked"] + 1
        new_state["num_batches_tracked"] = count
        factor = 1.0 / count.astype(state["mean"].dtype)
    else:
        factor = 1.0 - momentum
    for key, batch in (("mean", mean), ("var", var)):
        old = state[key]
        new_state[key] = ((1.0 - factor) * old + factor * batch).astype(old.dtype)
    return new_state


def BatchNorm(
    axis: int = -1,
    momentum: Optional[float] = 0.9,
    epsilon: float = 1e-5,
    center: bool = True,
    scale: bool = True,
    axis_name: Optional[Hashable] = None,
    *,
    running_var: str = "unbiased",
    track_running_stats: bool = True,
) -> Layer:
    """Batch normalization over every axis except the feature ``axis``, as
    ``torch.nn.BatchNorm1d/2d/3d``.

    ``train=True`` normalises with the statistics of the batch, over the ``n`` values
    per feature (all axes but ``axis``, and every device's with ``axis_name``):

    ```
    mean = E[x],  var = E[(x - mean)^2]          (biased: the one used to normalise)
    y    = (x - mean) / sqrt(var + epsilon) * scale + bias
    running_mean <- momentum * running_mean + (1 - momentum) * mean
    running_var  <- momentum * running_var  + (1 - momentum) * var * n / (n - 1)
    ```

    and returns the updated running statistics as the new state. ``train=False``
    normalises with the running statistics and returns the state unchanged.

    params ``{"scale", "bias"}`` (ones, zeros; ``scale=False``/``center=False`` drop
    them; torch's ``weight``/``bias``, ``affine=False`` drops both) and state
    ``{"mean", "var"}`` (zeros, ones: torch's ``running_mean``/``running_var``, copied
    as they are) have the size of the feature axis. ``axis=-1`` suits ``(N, C)`` and
    channels-last ``(N, H, W, C)``; use ``axis=1`` for channels-first
    ``(N, C, L)``/``(N, C, H, W)`` like PyTorch.

    Options, versus torch:

    * ``momentum`` is the weight of the *old* running value, as in Keras, MXNet and
      Flax. PyTorch's ``momentum`` is the weight of the *new* batch value: torch
      ``momentum=0.1`` (its default) is ``momentum=0.9`` here. ``momentum=None`` is
      torch's ``momentum=None``, the cumulative moving average: the state gains
      ``"num_batches_tracked"`` (an int32 count, torch's buffer of that name) and each
      update weighs the batch by ``1 / num_batches_tracked``.
    * ``running_var="unbiased"`` (the default, torch's) accumulates the unbiased batch
      variance ``var * n / (n - 1)``; ``running_var="biased"`` accumulates ``var``
      itself, funcnet 0.1's rule (and Keras's and Flax's).
      Outputs in train mode and running means do not depend on it.
    * ``track_running_stats=False`` (torch's): no running statistics at all; the state
      is ``()`` and the batch statistics are used in eval mode too (in eval mode those
      of each device's own batch, even with ``axis_name``, as torch's SyncBatchNorm).

    Synced BatchNorm: with ``axis_name`` set and ``apply`` run under ``jax.pmap``
    (or ``shard_map``) with that axis name, the batch mean and variance are averaged
    with ``lax.pmean`` over the devices, so every device normalises with -- and
    stores -- the statistics of the global batch (all devices' batches have the same
    size under pmap, so the mean of means is the global mean; ``n`` is the global
    count). The variance is computed in two passes, ``pmean(E[(x - pmean(E[x]))^2])``,
    rather than from ``pmean(E[x^2]) - mean^2``: one more all-reduce of ``C`` numbers,
    but no float32 cancellation when ``|mean| >> std``. Calling a synced BatchNorm in
    train mode outside a pmap over ``axis_name`` fails with JAX's "unbound axis name"
    error.

    Mixed precision: batch statistics are computed in at least float32 (inputs
    are upcast), the running statistics are kept and averaged in float32, and the
    output has the input's dtype (the compute dtype under a
    :class:`funcnet.precision.Policy`). A state whose ``mean``/``var`` are in a
    dtype narrower than float32 (bfloat16, float16) is refused with a TypeError
    rather than silently drifting.

    Args:
      axis: the feature axis, an int: -1 for ``(N, C)`` and channels-last inputs, 1 for
        channels-first ones.
      momentum: the weight of the old running value, in ``[0, 1]`` (torch's
        ``1 - momentum``); None for the cumulative average.
      epsilon: added to the variance, >= 0.
      center: False drops the bias.
      scale: False drops the scale.
      axis_name: the ``pmap``/``shard_map`` axis name whose devices' batch statistics
        are averaged (synced BatchNorm), or None.
      running_var: ``"unbiased"`` (torch's) or ``"biased"``: the batch variance the
        running average accumulates.
      track_running_stats: False keeps no running statistics (state ``()``) and uses the
        batch statistics in eval mode too.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` gives
      ``(input_shape, params, state)`` with params ``{"scale": (C,), "bias": (C,)}`` and
      state ``{"mean": (C,), "var": (C,)}`` (float32, ``C`` the size of ``axis``; plus
      ``"num_batches_tracked"``, an int32 scalar, for ``momentum=None``; ``()`` for
      ``track_running_stats=False``). ``apply(..., train=True)`` returns the updated
      state.

    Raises:
      ValueError: ``axis`` is not an int; in train mode (or without running
        statistics), one value per feature in the batch.
      MismatchError: at ``apply``, a ``scale`` or ``bias`` not of one entry per feature.
      ArgumentError: ``momentum`` outside ``[0, 1]``, a negative ``epsilon``, or an
        unknown ``running_var``.
      TypeError: running statistics in a dtype narrower than float32.

    Examples:
      >>> init, apply = BatchNorm()
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 3))
      >>> out_shape, sorted(params), sorted(state)
      ((-1, 3), ['bias', 'scale'], ['mean', 'var'])
      >>> x = jnp.array([[0.0, 1.0, 2.0], [2.0, 3.0, 6.0]])
      >>> y, new_state = apply(params, state, x, train=True)
      >>> np.round(np.asarray(y, np.float64), 3).tolist()
      [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]
      >>> np.round(np.asarray(new_state["mean"], np.float64), 3).tolist()  # 0.1 * batch mean
      [0.1, 0.2, 0.4]
      >>> BatchNorm(axis=1).init(jax.random.key(0), (-1, 3, 8, 8))[2]["var"].shape  # NCHW
      (3,)
    """
    if not checks.is_int(axis):
        raise ValueError(f"BatchNorm: axis must be an int (the feature axis), got {axis!r}.")
    momentum, track_running_stats = _batch_norm_options("BatchNorm", momentum, running_var, track_running_stats)
    epsilon = checks.real("BatchNorm", "epsilon", epsilon, low=0.0)
    name = f"BatchNorm(axis={axis})" if axis != -1 else "BatchNorm"
    state_keys = ("mean", "var") + (("num_batches_tracked",) if momentum is None else ())

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=2)
        ax = normalize_axis(name, axis, len(shape))
        check_known(name, shape, [ax], "feature dimension")
        c = shape[ax]
        params = {}
        if scale:
            params["scale"] = jnp.ones((c,), jnp.float32)
        if center:
            params["bias"] = jnp.zeros((c,), jnp.float32)
        if not track_running_stats:
            return shape, params, ()
        state = {"mean": jnp.zeros((c,), jnp.float32), "var": jnp.ones((c,), jnp.float32)}
        if momentum is None:
            state["num_batches_tracked"] = jnp.zeros((), jnp.int32)
        return shape, params, state

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=2)
        rank = inputs.ndim
        ax = normalize_axis(name, axis, rank)
        if track_running_stats:
            need_state(name, state, state_keys)
            check_input(name, inputs, axis=ax, size=state["mean"].shape[0], what="features")
            _check_stats_dtype(name, state)
        # a (1,) scale would broadcast over every feature without a word
        check_param_shapes(name, params, {"scale": (inputs.shape[ax],), "bias": (inputs.shape[ax],)})
        bshape = [1] * rank
        bshape[ax] = inputs.shape[ax]
        reduce_axes = tuple(i for i in range(rank) if i != ax)
        x = inputs.astype(_compute_dtype(inputs.dtype))

        if train or not track_running_stats:
            # eval without running statistics: this device's batch, as torch's
            # SyncBatchNorm syncs only in training
            sync = axis_name if train else None
            _check_batch_statistics(name, inputs.shape, reduce_axes, sync)
            mean, var, n = _batch_stats(x, reduce_axes, bshape, sync)
            new_state = (
                _updated_running_stats(state, mean, var, n, momentum, running_var)
                if train and track_running_stats
                else state
            )
        else:
            mean, var, new_state = state["mean"], state["var"], state

        mul = lax.rsqrt(var + epsilon)
        if "scale" in params:
            mul = mul * _mesh.at_use(params["scale"], x, (ax,))
        y = (x - mean.reshape(bshape)) * mul.reshape(bshape)
        if "bias" in params:
            y = y + _mesh.at_use(params["bias"], x, (ax,)).reshape(bshape)
        return y.astype(_out_dtype(inputs.dtype)), new_state

    return named(name, init, apply)


def _instance_norm_options(axis, epsilon, momentum, affine, track_running_stats, running_var):
    """``InstanceNorm``'s arguments checked: ``(momentum, track_running_stats, epsilon,
    affine)`` as its layer uses them."""
    if not checks.is_int(axis):
        raise checks.ArgumentError(f"InstanceNorm: axis must be an int (the channel axis), got {checks.got(axis)}.")
    if momentum is None:
        # torch takes InstanceNorm's momentum=None as 0.0 (F.instance_norm has no cumulative
        # average): the running statistics would never move
        raise checks.ArgumentError(
            "InstanceNorm: momentum=None is not supported: torch.nn.InstanceNorm*d accepts it "
            "but never updates its running statistics then (it passes momentum 0). Give "
            "momentum=1.0 for that behaviour, or a momentum in [0, 1) (torch's 1 - momentum) "
            "to track them."
        )
    momentum, track_running_stats = _batch_norm_options("InstanceNorm", momentum, running_var, track_running_stats)
    epsilon = checks.real("InstanceNorm", "epsilon", epsilon, low=0.0)
    affine = checks.flag("InstanceNorm", "affine", affine)
    return momentum, track_running_stats, epsilon, affine


def InstanceNorm(
    axis: int = -1,
    epsilon: float = 1e-5,
    momentum: Optional[float] = 0.9,
    affine: bool = False,
    track_running_stats: bool = False,
    *,
    running_var: str = "unbiased",
) -> Layer:
    """Instance normalization, as ``torch.nn.InstanceNorm1d/2d/3d``: per example and
    channel, over the spatial axes.

    Input ``(N, *spatial, C)`` with the channels on ``axis`` (-1, channels-last, the
    default; ``axis=1`` for torch's ``(N, C, *spatial)``) and at least one spatial
    axis:

    ```
    mean = E[x],  var = E[(x - mean)^2]     (biased, over the spatial axes)
    y    = (x - mean) / sqrt(var + epsilon) * scale + bias
    ```

    torch's defaults: ``affine=False`` (``True`` adds params ``{"scale", "bias"}`` of
    shape ``(C,)``, ones and zeros: torch's ``weight``/``bias``) and
    ``track_running_stats=False`` (stateless; the instance statistics are used in
    eval mode too). ``track_running_stats=True`` keeps state ``{"mean", "var"}``
    updated in train mode from
    the instance statistics averaged over the batch, with :func:`BatchNorm`'s rules
    (``momentum`` is the weight of the *old* value, torch ``0.1`` = ``0.9`` here;
    ``running_var="unbiased"`` as torch, ``n`` the number of spatial positions), and
    used in eval mode. ``momentum=None`` is refused: torch's InstanceNorm takes it as 0
    (running statistics that never move), which is ``momentum=1.0`` here. A single
    spatial position (variance 0) is refused in train
    mode or without running statistics, as torch refuses it.

    Args:
      axis: the channel axis, an int other than the batch axis: -1 (channels-last) or 1
        (torch's ``(N, C, *spatial)``).
      epsilon: added to the variance, >= 0.
      momentum: the weight of the old running value, in ``[0, 1]`` (torch's
        ``1 - momentum``), used with ``track_running_stats=True``; None is refused.
      affine: True adds params ``{"scale", "bias"}``.
      track_running_stats: True keeps running statistics, updated in train mode and used
        in eval mode.
      running_var: ``"unbiased"`` (torch's) or ``"biased"``, as :func:`BatchNorm`'s.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` gives
      ``(input_shape, params, state)`` with params ``{"scale": (C,), "bias": (C,)}`` for
      ``affine=True`` (else ``{}``) and state ``{"mean": (C,), "var": (C,)}`` (float32)
      for ``track_running_stats=True`` (else ``()``), ``C`` the size of ``axis``.

    Raises:
      ArgumentError: ``axis`` is not an int, ``momentum=None`` or out of ``[0, 1]``,
        a negative ``epsilon``, or an unknown ``running_var``.
      ValueError: the channel axis is the batch axis (0); a single spatial
        position in train mode or without running statistics; params built for
        another number of channels.
      TypeError: running statistics in a dtype narrower than float32.

    Examples:
      >>> init, apply = InstanceNorm(affine=True)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 4, 2))  # (N, L, C)
      >>> out_shape, sorted(params), state
      ((-1, 4, 2), ['bias', 'scale'], ())
      >>> y, _ = apply(params, state, jnp.arange(16.0).reshape(2, 4, 2))
      >>> np.round(np.asarray(y[0, :, 0], np.float64), 3).tolist()
      [-1.342, -0.447, 0.447, 1.342]
    """
    momentum, track_running_stats, epsilon, affine = _instance_norm_options(
        axis, epsilon, momentum, affine, track_running_stats, running_var
    )
    name = f"InstanceNorm(axis={axis})" if axis != -1 else "InstanceNorm"
    state_keys = ("mean", "var")

    def _channel_axis(shape):
        ax = normalize_axis(name, axis, len(shape))
        if ax == 0:
            raise ValueError(
                f"{name}: axis 0 is the batch; the channel axis must be another "
                f"(-1 for channels-last, 1 for torch's (N, C, *spatial))."
            )
        return ax

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=3)
        ax = _channel_axis(shape)
        check_known(name, shape, [ax], "channel dimension")
        c = shape[ax]
        params = {"scale": jnp.ones((c,), jnp.float32), "bias": jnp.zeros((c,), jnp.float32)} if affine else {}
        state = ()
        if track_running_stats:
            state = {"mean": jnp.zeros((c,), jnp.float32), "var": jnp.ones((c,), jnp.float32)}
        return shape, params, state

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=3)
        rank = inputs.ndim
        ax = _channel_axis(inputs.shape)
        c = inputs.shape[ax]
        if track_running_stats:
            need_state(name, state, state_keys)
            check_input(name, inputs, axis=ax, size=state["mean"].shape[0], what="channels")
            _check_stats_dtype(name, state)
        for key, p in params.items():
            if p.shape != (c,):
                raise ValueError(
                    f"{name}: the input has {c} channels on axis {ax} but "
                    f"params[{key!r}] was built for {p.shape[0]}. Re-run init "
                    f"with the right input_shape."
                )
        bshape = [1] * rank
        bshape[ax] = c
        spatial = tuple(i for i in range(1, rank) if i != ax)
        x = inputs.astype(_compute_dtype(inputs.dtype))
        if train or not track_running_stats:
            n = math.prod(inputs.shape[a] for a in spatial)
            if n <= 1:
                raise ValueError(
                    f"{name}: expected more than 1 spatial element when training, got input "
                    f"of shape {tuple(inputs.shape)}: the statistics over the spatial axes "
                    f"{spatial} would be taken over {n} value(s), and the output would be "
                    f"the bias alone (or NaN). Give it a spatial extent of at least 2, or "
                    f"use BatchNorm."
                )
            mean = jnp.mean(x, axis=spatial, keepdims=True)
            var = jnp.mean(jnp.square(x - mean), axis=spatial, keepdims=True)
            y = (x - mean) * lax.rsqrt(var + epsilon)
            new_state = state
            if train and track_running_stats:
                # torch averages the per-instance statistics over the batch
                new_state = _updated_running_stats(
                    state, jnp.mean(mean, axis=0).reshape(c), jnp.mean(var, axis=0).reshape(c), n, momentum, running_var
                )
        else:
            y = (x - state["mean"].reshape(bshape)) * lax.rsqrt(state["var"] + epsilon).reshape(bshape)
            new_state = state
        if "scale" in params:
            y = y * _mesh.at_use(params["scale"], x, (ax,)).reshape(bshape)
        if "bias" in params:
            y = y + _mesh.at_use(params["bias"], x, (ax,)).reshape(bshape)
        return y.astype(_out_dtype(inputs.dtype)), new_state

    return named(name, init, apply)


def LayerNorm(
    axis: int | Sequence[int] = -1,
    epsilon: float = 1e-5,
    center: Optional[bool] = None,
    scale: bool = True,
    use_bias: Optional[bool] = None,
) -> Layer:
    """Layer normalization, as ``torch.nn.LayerNorm``: per example, over ``axis``.

    ```
    mean = E[x],  var = E[(x - mean)^2]          (biased, over `axis`)
    y    = (x - mean) / sqrt(var + epsilon) * scale + bias
    ```

    ``axis`` is an int or a tuple of ints. ``torch.nn.LayerNorm(normalized_shape)``
    normalises the last ``len(normalized_shape)`` axes: that is ``axis=-1`` (the
    default) or ``axis=(-2, -1)`` etc. here. Other axes work too (e.g. ``axis=1`` on
    ``(N, C, L)``). params ``{"scale", "bias"}`` (ones, zeros; elementwise affine, as
    torch's ``weight``/``bias``) have the shape of the normalised axes in increasing
    axis order, so torch's ``weight`` copies over unchanged. Stateless. Statistics
    are computed in at least float32; the output has the input's dtype.

    ``use_bias=False`` drops the bias: torch's ``nn.LayerNorm(bias=False)`` and nanoGPT's
    ``LayerNorm(ndim, bias=False)``. ``center`` is the same switch under Keras's name;
    give one of them (both, disagreeing, is an error).

    Args:
      axis: the axis or axes to normalise over, an int or a tuple of ints.
      epsilon: added to the variance, >= 0.
      center: Keras's name for ``use_bias``; None leaves the choice to ``use_bias``.
      scale: False drops the scale.
      use_bias: False drops the bias; None keeps it unless ``center=False``.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` gives
      ``(input_shape, params, ())`` with params ``{"scale", "bias"}`` (float32), each of
      the shape of the normalised axes: ``(C,)`` for ``axis=-1``.

    Raises:
      ValueError: ``center`` and ``use_bias`` disagree; a bad ``axis`` (not an int
        or tuple of ints, or one axis twice); params built for other normalised
        sizes.
      ArgumentError: a negative ``epsilon``.

    Examples:
      >>> init, apply = LayerNorm()
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 4))
      >>> out_shape, params["scale"].shape, params["bias"].shape, state
      ((-1, 4), (4,), (4,), ())
      >>> y, _ = apply(params, state, jnp.array([[1.0, 2.0, 3.0, 4.0]]))
      >>> np.round(np.asarray(y, np.float64), 3).tolist()
      [[-1.342, -0.447, 0.447, 1.342]]
      >>> sorted(LayerNorm(use_bias=False).init(jax.random.key(0), (-1, 4))[1])
      ['scale']
    """
    if center is not None and use_bias is not None and bool(center) != bool(use_bias):
        raise ValueError(
            f"LayerNorm: center={center!r} and use_bias={use_bias!r} are the same "
            f"switch (a learned bias) and disagree; give only use_bias."
        )
    given = use_bias if use_bias is not None else center
    center = True if given is None else checks.flag("LayerNorm", "use_bias", given)
    axes = _check_axes("LayerNorm", axis)
    epsilon = checks.real("LayerNorm", "epsilon", epsilon, low=0.0)
    name = f"LayerNorm(axis={axis})" if axis != -1 else "LayerNorm"

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=max(max(axes) + 1, -min(axes)))
        norm = _normalized_axes(name, axes, len(shape))
        check_known(name, shape, norm, "normalised dimension")
        pshape = tuple(shape[a] for a in norm)
        params = {}
        if scale:
            params["scale"] = jnp.ones(pshape, jnp.float32)
        if center:
            params["bias"] = jnp.zeros(pshape, jnp.float32)
        return shape, params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=max(max(axes) + 1, -min(axes)))
        rank = inputs.ndim
        norm = _normalized_axes(name, axes, rank)
        pshape = tuple(inputs.shape[a] for a in norm)
        for key, p in params.items():
            if p.shape != pshape:
                raise ValueError(
                    f"{name}: input shape {tuple(inputs.shape)} has {pshape} on the "
                    f"normalised axes {norm}, but params[{key!r}] was built for "
                    f"{tuple(p.shape)}. Re-run init with the right input_shape."
                )
        bshape = [inputs.shape[i] if i in norm else 1 for i in range(rank)]
        x = inputs.astype(_compute_dtype(inputs.dtype))
        mean = jnp.mean(x, axis=norm, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=norm, keepdims=True)
        y = (x - mean) * lax.rsqrt(var + epsilon)
        if "scale" in params:
            y = y * _mesh.at_use(params["scale"], x, norm).reshape(bshape)
        if "bias" in params:
            y = y + _mesh.at_use(params["bias"], x, norm).reshape(bshape)
        return y.astype(_out_dtype(inputs.dtype)), state

    return named(name, init, apply)


def RMSNorm(axis: int | Sequence[int] = -1, epsilon: Optional[float] = None, scale: bool = True) -> Layer:
    """Root-mean-square normalization, as ``torch.nn.RMSNorm``: per example, over ``axis``.

    ```
    y = x / sqrt(E[x^2] + epsilon) * scale           (the mean over `axis`)
    ```

    ``epsilon=None`` is torch's default: the machine epsilon of the dtype the statistics
    are computed in, at least float32 -- ``finfo(float32).eps`` = 1.19e-7 for bfloat16,
    float16 and float32 inputs, ``finfo(float64).eps`` = 2.2e-16 for float64. That is
    what torch computes (its "opmath" eps since pytorch#142848, early 2025; checked on
    torch 2.13), although its docs said ``torch.finfo(x.dtype).eps`` of the *input*
    dtype until pytorch#173039: for bfloat16 that would be 7.8e-3, large enough to
    shrink activations whose mean square is ~1e-2. Pass
    ``epsilon=float(jnp.finfo(jnp.bfloat16).eps)`` for that documented-only rule.
    params ``{"scale"}`` (ones; torch's ``weight``, copied as is) of the shape of the
    normalised axes; ``scale=False`` drops it (torch's ``elementwise_affine=False``).
    ``axis`` as :func:`LayerNorm`. Statistics in at least float32; the output has the
    input's dtype. Stateless.

    Args:
      axis: the axis or axes to normalise over, an int or a tuple of ints.
      epsilon: added to the mean square, >= 0; None for torch's default, the machine
        epsilon of the statistics' dtype.
      scale: False drops the scale (torch's ``elementwise_affine=False``).

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` gives
      ``(input_shape, params, ())`` with params ``{"scale"}`` (float32) of the shape of
      the normalised axes, or ``{}`` for ``scale=False``.

    Raises:
      ValueError: a bad ``axis`` (as :func:`LayerNorm`); params built for other
        normalised sizes.
      ArgumentError: a negative ``epsilon``, or ``scale`` not a bool.

    Examples:
      >>> init, apply = RMSNorm()
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 2))
      >>> out_shape, params["scale"].shape, state
      ((-1, 2), (2,), ())
      >>> y, _ = apply(params, state, jnp.array([[3.0, 4.0]]))  # rms = sqrt(12.5)
      >>> np.round(np.asarray(y, np.float64), 3).tolist()
      [[0.849, 1.131]]
    """
    axes = _check_axes("RMSNorm", axis)
    if epsilon is not None:
        epsilon = checks.real("RMSNorm", "epsilon", epsilon, low=0.0)
    scale = checks.flag("RMSNorm", "scale", scale)
    name = f"RMSNorm(axis={axis})" if axis != -1 else "RMSNorm"
    min_rank = max(max(axes) + 1, -min(axes))

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=min_rank)
        norm = _normalized_axes(name, axes, len(shape))
        check_known(name, shape, norm, "normalised dimension")
        params = {"scale": jnp.ones(tuple(shape[a] for a in norm), jnp.float32)} if scale else {}
        return shape, params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=min_rank)
        norm = _normalized_axes(name, axes, inputs.ndim)
        pshape = tuple(inputs.shape[a] for a in norm)
        if "scale" in params and params["scale"].shape != pshape:
            raise ValueError(
                f"{name}: input shape {tuple(inputs.shape)} has {pshape} on the "
                f"normalised axes {norm}, but params['scale'] was built for "
                f"{tuple(params['scale'].shape)}. Re-run init with the right "
                f"input_shape."
            )
        compute = _compute_dtype(inputs.dtype)
        eps = epsilon if epsilon is not None else float(jnp.finfo(compute).eps)
        x = inputs.astype(compute)
        y = x * lax.rsqrt(jnp.mean(jnp.square(x), axis=norm, keepdims=True) + eps)
        if "scale" in params:
            bshape = [inputs.shape[i] if i in norm else 1 for i in range(inputs.ndim)]
            y = y * _mesh.at_use(params["scale"], x, norm).reshape(bshape)
        return y.astype(_out_dtype(inputs.dtype)), state

    return named(name, init, apply)


def GroupNorm(num_groups: int, axis: int = -1, epsilon: float = 1e-5, center: bool = True, scale: bool = True) -> Layer:
    """Group normalization, as ``torch.nn.GroupNorm(num_groups, C)``: per example and group.

    The ``C`` channels (on ``axis``; -1 is channels-last, funcnet's conv layout; use
    ``axis=1`` for torch's ``NCHW``) split into ``num_groups`` contiguous groups of
    ``C / num_groups``; each group is normalised over its channels and every axis but
    the batch (axis 0):

    ```
    y = (x - E_g[x]) / sqrt(Var_g[x] + epsilon) * scale_c + bias_c
    ```

    with the biased variance; params ``{"scale", "bias"}`` of shape ``(C,)`` (ones,
    zeros; torch's ``weight``/``bias``). ``num_groups=1`` normalises every channel
    together (LayerNorm over all but the batch), ``num_groups=C`` each alone
    (InstanceNorm). Statistics in at least float32; the output has the input's dtype.
    Stateless.

    Args:
      num_groups: the number of channel groups, a positive int dividing the channels.
      axis: the channel axis, an int other than the batch axis: -1 (channels-last) or 1
        (``NCHW``).
      epsilon: added to the variance, >= 0.
      center: False drops the bias.
      scale: False drops the scale.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)`` gives
      ``(input_shape, params, ())`` with params ``{"scale": (C,), "bias": (C,)}``
      (float32), ``C`` the size of ``axis``.

    Raises:
      ArgumentError: ``num_groups`` not a positive int, ``axis`` not an int, a
        negative ``epsilon``, or ``center``/``scale`` not bools.
      ValueError: the channel axis is the batch axis (0); ``num_groups`` does not
        divide the channels; params built for another number of channels.

    Examples:
      >>> init, apply = GroupNorm(2)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 5, 4))  # (N, L, C)
      >>> out_shape, params["scale"].shape, state
      ((-1, 5, 4), (4,), ())
      >>> apply(params, state, jax.random.normal(jax.random.key(1), (2, 5, 4)))[0].shape
      (2, 5, 4)
      >>> GroupNorm(3).init(jax.random.key(0), (-1, 4))
      Traceback (most recent call last):
      ValueError: GroupNorm(3): num_groups=3 does not divide the 4 channels on axis 1 ...
    """
    num_groups = checks.positive_int("GroupNorm", "num_groups", num_groups)
    axis = checks.integer("GroupNorm", "axis", axis)
    epsilon = checks.real("GroupNorm", "epsilon", epsilon, low=0.0)
    center = checks.flag("GroupNorm", "center", center)
    scale = checks.flag("GroupNorm", "scale", scale)
    name = f"GroupNorm({num_groups}, axis={axis})" if axis != -1 else f"GroupNorm({num_groups})"

    def _channels(shape):
        ax = normalize_axis(name, axis, len(shape))
        if ax == 0:
            raise ValueError(
                f"{name}: axis 0 is the batch; the channel axis must be another (-1 for NHWC, 1 for NCHW)."
            )
        c = shape[ax]
        if c % num_groups:
            raise ValueError(
                f"{name}: num_groups={num_groups} does not divide the {c} "
                f"channels on axis {ax} of shape {tuple(shape)}. Pick a divisor "
                f"of {c}."
            )
        return ax, c

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, min_rank=2)
        ax = normalize_axis(name, axis, len(shape))
        check_known(name, shape, [ax], "channel dimension")
        _, c = _channels(shape)
        params = {}
        if scale:
            params["scale"] = jnp.ones((c,), jnp.float32)
        if center:
            params["bias"] = jnp.zeros((c,), jnp.float32)
        return shape, params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, min_rank=2)
        ax, c = _channels(inputs.shape)
        for key, p in params.items():
            if p.shape != (c,):
                raise ValueError(
                    f"{name}: the input has {c} channels on axis {ax} but "
                    f"params[{key!r}] was built for {p.shape[0]}. Re-run init "
                    f"with the right input_shape."
                )
        x = inputs.astype(_compute_dtype(inputs.dtype))
        # channels -> (groups, channels per group), then reduce all but batch and group
        grouped = x.reshape(x.shape[:ax] + (num_groups, c // num_groups) + x.shape[ax + 1 :])
        reduce = tuple(i for i in range(1, grouped.ndim) if i != ax)
        mean = jnp.mean(grouped, axis=reduce, keepdims=True)
        var = jnp.mean(jnp.square(grouped - mean), axis=reduce, keepdims=True)
        y = ((grouped - mean) * lax.rsqrt(var + epsilon)).reshape(x.shape)
        bshape = [1] * x.ndim
        bshape[ax] = c
        if "scale" in params:
            y = y * _mesh.at_use(params["scale"], x, (ax,)).reshape(bshape)
        if "bias" in params:
            y = y + _mesh.at_use(params["bias"], x, (ax,)).reshape(bshape)
        return y.astype(_out_dtype(inputs.dtype)), state

    return named(name, init, apply)
