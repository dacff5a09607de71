"""Sequence losses: connectionist temporal classification (CTC)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet.losses._args import _concrete, _float_array, _int_labels
from funcnet.losses._reduction import _check_torch_reduction

__all__ = ["ctc_loss"]


def _ctc_args(fn, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    """The checked arguments of :func:`ctc_loss`, and ``in_target`` (the labels within
    ``target_lengths``)."""
    log_probs = _float_array(fn, log_probs, "log_probs")
    if log_probs.ndim != 3:
        raise ValueError(
            f"{fn}: log_probs must be (N, T, C), batch first, got shape "
            f"{log_probs.shape}. From torch's (T, N, C) layout: "
            f"jnp.swapaxes(log_probs, 0, 1)."
        )
    N, T, C = log_probs.shape
    targets = _int_labels(fn, targets, "targets")
    if targets.ndim != 2 or targets.shape[0] != N:
        raise ValueError(f"{fn}: targets must be padded labels of shape ({N}, S), got {targets.shape}.")
    lengths = []
    for what, x, most in (("input_lengths", input_lengths, T), ("target_lengths", target_lengths, targets.shape[1])):
        x = _int_labels(fn, x, what)
        if x.shape != (N,):
            raise ValueError(f"{fn}: {what} must have shape ({N},), one per sequence, got {x.shape}.")
        v = _concrete(x)
        if v is not None and v.size and (v.min() < 0 or v.max() > most):
            raise ValueError(f"{fn}: {what} must lie in [0, {most}], found values from {v.min()} to {v.max()}.")
        lengths.append(x)
    input_lengths, target_lengths = lengths
    blank = checks.integer(fn, "blank", blank)
    if not 0 <= blank < C:
        raise ValueError(
            f"{fn}: blank must be in label range: blank={blank} but log_probs "
            f"has {C} classes. Give the index of the blank class, in [0, {C})."
        )
    _check_torch_reduction(fn, reduction)
    zero_infinity = checks.flag(fn, "zero_infinity", zero_infinity)
    in_target = jnp.arange(targets.shape[1])[None, :] < target_lengths[:, None]
    v = _concrete(targets)
    mask = _concrete(in_target)
    if v is not None and mask is not None and v.size:
        bad = mask & ((v < 0) | (v >= C) | (v == blank))
        if bad.any():
            raise ValueError(
                f"{fn}: targets must be class ids in [0, {C}) other than "
                f"blank={blank}, found {np.unique(v[bad])[:8].tolist()} within "
                f"target_lengths."
            )
    return (log_probs, targets, input_lengths, target_lengths, blank, zero_infinity, in_target)


@jax.custom_jvp
def _nan_gradient(log_probs, where):
    """0 per sequence, whose gradient is NaN where ``where`` (``log_probs``' shape) is
    set and 0 elsewhere, whatever the cotangent: torch's gradient of an infinite CTC
    loss (its alphas and betas are all -inf there, and exp(-inf + inf) is NaN). A JVP
    rather than a VJP, so forward-mode differentiation keeps working."""
    return jnp.zeros(log_probs.shape[:1], log_probs.dtype)


@_nan_gradient.defjvp
def _nan_gradient_jvp(primals, tangents):
    log_probs, where = primals
    nan_at = jnp.where(where, jnp.nan, 0.0).astype(log_probs.dtype)
    return _nan_gradient(log_probs, where), jnp.sum(nan_at * tangents[0], axis=(1, 2))


def ctc_loss(
    log_probs: ArrayLike,
    targets: ArrayLike,
    input_lengths: ArrayLike,
    target_lengths: ArrayLike,
    *,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
) -> jax.Array:
    r"""Connectionist temporal classification loss, as ``torch.nn.CTCLoss``, computed by
    ``optax.ctc_loss``.

    Batch first: ``log_probs`` ``(N, T, C)`` are per-frame log-probabilities
    (``jax.nn.log_softmax`` output; torch's ``(T, N, C)`` is
    ``jnp.swapaxes(log_probs, 0, 1)``), ``targets`` ``(N, S)`` padded integer labels (not
    ``blank``; torch's concatenated 1-D form is not accepted), ``input_lengths`` and
    ``target_lengths`` ``(N,)`` the valid frames and labels of each sequence. Per
    sequence, :math:`l_n = -\log \sum_{\pi \in B^{-1}(y_n)} \prod_t p_{t, \pi_t}`;
    ``"mean"`` is torch's: :math:`\frac1N \sum_n l_n / \max(|y_n|, 1)`; ``"sum"`` and
    ``"none"`` (shape ``(N,)``) as usual.

    A target that no alignment of its input length can produce (shorter than the target
    plus its repeated neighbours) has an infinite loss, as in torch, and, as in torch, a
    NaN gradient with respect to that sequence's frames within ``input_lengths`` (0 for
    the others): an infinite loss has no usable gradient, and a NaN makes the update
    fail loudly instead of training on as if the sequence were learnt.
    ``zero_infinity=True`` makes such losses, and their gradients, 0. The gradient with
    respect to ``log_probs`` is torch's (``exp(log_probs) - posteriors``: optax
    normalises the input once more, which for log-probabilities changes the value by
    nothing and the gradient exactly as torch's formula does), so gradients through a
    ``log_softmax`` are those of torch.

    Args:
      log_probs: float per-frame log-probabilities ``(N, T, C)``.
      targets: integer padded labels ``(N, S)``.
      input_lengths: integer valid frames per sequence ``(N,)``, each in ``[0, T]``.
      target_lengths: integer valid labels per sequence ``(N,)``, each in ``[0, S]``.
      blank: the class id of the blank, in ``[0, C)``.
      reduction: ``"mean"``, ``"sum"`` or ``"none"`` (torch's).
      zero_infinity: make the infinite losses of impossible targets (and their NaN
        gradients) 0.

    Returns:
      The reduced loss, a float32 (or float64) scalar; ``(N,)`` with ``reduction="none"``.

    Raises:
      TypeError: ``log_probs`` not floating, or ``targets`` or a lengths array not integer.
      ValueError: shapes other than those above, a ``blank`` outside ``[0, C)``, a bad
        ``reduction``, or concrete lengths or targets (within ``target_lengths``) out of
        range or equal to ``blank``.

    Examples:
      >>> log_probs = jnp.log(jnp.full((1, 2, 2), 0.5))  # 2 frames, classes {blank, 1}
      >>> # "1" is read off 3 of the 4 paths: -log(0.75)
      >>> round(float(ctc_loss(log_probs, jnp.array([[1]]), jnp.array([2]), jnp.array([1]))), 4)
      0.2877
      >>> # "1 1" needs a blank between the repeats, 3 frames: impossible in 2
      >>> print(ctc_loss(log_probs, jnp.array([[1, 1]]), jnp.array([2]), jnp.array([2]),
      ...                reduction="none"))
      [inf]
    """
    fn = "funcnet.losses.ctc_loss"
    (log_probs, targets, input_lengths, target_lengths, blank, zero_infinity, in_target) = _ctc_args(
        fn, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity
    )
    T = log_probs.shape[1]
    in_input = jnp.arange(T)[None, :] < input_lengths[:, None]
    frame_pad = (~in_input).astype(log_probs.dtype)
    label_pad = (~in_target).astype(log_probs.dtype)
    safe_targets = jnp.where(in_target, targets, 0)
    nll = optax.ctc_loss(log_probs, frame_pad, safe_targets, label_pad, blank_id=blank)
    # optax's log-space zero is a finite -1e5: detect impossible alignments as torch's inf
    repeats = jnp.sum(in_target[:, 1:] & (safe_targets[:, 1:] == safe_targets[:, :-1]), axis=1)
    feasible = input_lengths >= target_lengths + repeats
    nll = jnp.where(feasible, nll, 0.0 if zero_infinity else jnp.inf)
    if not zero_infinity:
        nan_where = jnp.broadcast_to((~feasible[:, None] & in_input)[..., None], log_probs.shape)
        nll = nll + _nan_gradient(log_probs, nan_where)
    if reduction == "mean":
        return jnp.mean(nll / jnp.maximum(target_lengths, 1).astype(nll.dtype))
    if reduction == "sum":
        return jnp.sum(nll)
    return nll
