"""The epoch's metrics on the host: non-finite losses, and the per-epoch means.

An epoch's step metrics stay on the device until the epoch ends (or a progress
refresh, or a checkpoint, reads some); what is fetched is checked for a NaN/inf loss
here, and summed in float64 in step order (:class:`funcnet.loop._resume.EpochSums`),
continuing a resumed epoch's sums, so the logged means do not depend on where
checkpoints were taken.
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import precision
from funcnet._jaxpr import any_eqn, loss_jaxpr
from funcnet.loop._resume import EpochSums
from funcnet.loop._rows import StepRows

__all__: list = []


def _check_losses(run, host_metrics: StepRows, epoch: int, last_step: int, on_nonfinite: str) -> None:
    """Acts on the first non-finite loss among fetched step metrics (no extra device
    sync: fit fetches them anyway). ``last_step`` is the step of the last entry."""
    ctx = run.ctx
    if not host_metrics:  # an epoch resumed from a checkpoint taken at its last step
        return
    finite = np.isfinite(host_metrics.column("loss")).all(axis=1)
    if finite.all():
        return
    bad = int(np.argmin(finite))
    first = not ctx.loss_was_nonfinite
    ctx.loss_was_nonfinite = True  # later checkpoints are marked non-finite
    if on_nonfinite == "ignore" or (on_nonfinite == "warn" and not first):
        return  # nothing to say: the message (and its float16 trace) is not built
    step = last_step - len(host_metrics) + bad + 1
    msg = (
        f"fit: the loss became non-finite ({np.asarray(host_metrics[bad]['loss']).ravel()[0]})"
        f" at epoch {epoch}, step {step} (the first such step fit has seen). Checkpoints "
        f"taken from now on are marked non-finite and keep= never rotates away the last "
        f"finite one; resume_from= restores that one. Lower the learning rate or check the "
        f"data, or pass options=FitOptions(on_nonfinite='warn' or 'ignore') to train on."
    )
    if run.float16():
        # The most likely cause then, and one a learning rate cannot fix: float16 overflow.
        msg += (
            " The loss computes in float16, whose largest value is 65504: larger "
            "activations or inputs become inf (then NaN). Compute in bfloat16 instead "
            "(float32's range; e.g. policy 'params=float32,compute=bfloat16,"
            "output=float32'), or keep float16 with the inputs scaled to a small range "
            "and loss scaling (TrainState.create(..., loss_scale="
            "precision.dynamic_loss_scale()))."
        )
    msg += run.optimizer_note(step)  # a NaN learning rate, named as such
    if on_nonfinite == "raise":
        raise FloatingPointError(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _computes_in_float16(train_state, loss_fn, batch_spec) -> bool:
    """Whether ``loss_fn`` computes anything in float16, read from its jaxpr (traced
    on the shapes, never run): a float16 policy's compute dtype is nowhere else (params
    and outputs may be float32). When it cannot be traced (a pmap collective, no batch
    seen): float16 params or a loss scale, which is for float16 training."""
    jaxpr = loss_jaxpr(train_state, loss_fn, batch_spec)
    if jaxpr is None:
        return isinstance(train_state.loss_scale, precision.LossScale) or any(
            getattr(x, "dtype", None) == jnp.float16 for x in jax.tree.leaves(train_state.params)
        )
    return any_eqn(jaxpr, lambda eqn: any(getattr(v.aval, "dtype", None) == jnp.float16 for v in eqn.outvars))


def _mean_metrics(run, host) -> dict:
    """Per-epoch means of the epoch's (fetched) step metrics ``host``, ``loss`` first: the
    mean over the steps of each step's mean (over devices under pmap), with the steps a
    resumed epoch ran before its checkpoint (:class:`funcnet.loop._resume.EpochSums`).
    The sums continue those checkpoints folded in, in step order, so they are the same
    float64 additions whether or not (and wherever) checkpoints were taken."""
    _, steps, sums = run.epoch_folded
    if sums is None:
        sums = _epoch_base(run, host)
    return sums.plus(host[steps:]).means()


def _epoch_base(run, host) -> EpochSums:
    """What an epoch's sums start from: the checkpoint's part of a resumed epoch, when it
    has the same metrics as this run's steps, else zeros."""
    fresh = EpochSums.of(host)
    carried = run.carried
    if carried is None:
        return fresh
    if host and set(carried.keys) != set(fresh.keys):
        warnings.warn(
            f"fit: the checkpoint resumed from logged the metrics {list(carried.keys)}"
            f" in this epoch, this run's step gives {list(fresh.keys)}: the epoch's "
            f"logged means cover its resumed steps only.",
            RuntimeWarning,
            stacklevel=4,
        )
        return fresh
    return carried


def _epoch_sums_now(run) -> Optional[EpochSums]:
    """What a checkpoint taken now stores of the epoch's metrics: nothing at an epoch's
    end (the position is the next epoch's start), else the sums of the steps so far,
    fetching only those since the previous checkpoint."""
    ctx = run.ctx
    if ctx.batch_in_epoch == 0:
        return None
    start, steps, sums = run.epoch_folded
    host, end = run.epoch_fetch(start)
    if sums is None:
        sums = _epoch_base(run, host)
    sums = sums.plus(host)
    run.epoch_folded = (end, steps + len(host), sums)
    return sums
