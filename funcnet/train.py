"""Training: the state a step carries and the pure step.

The step is a pure function ``(train_state, batch) -> (train_state, metrics)``.
Wrap it in ``jax.jit`` (one device) or ``jax.pmap`` (``axis_name`` given; one
replica per device). :func:`funcnet.loop.fit` is a convenience on top: everything
it does can be written by hand with the step, and the examples show both.

The loss function
-----------------
One convention::

    loss_fn(params, state, batch, rng, loss_state) -> (loss, Aux(state=..., loss_state=..., metrics={...}))

``state`` is the layer state (e.g. BatchNorm statistics), ``loss_state`` the state
the loss keeps (e.g. center-loss centers; ``()`` when there is none), and the
:class:`Aux` carries both back updated. ``Aux.metrics`` are scalars the step returns
next to ``"loss"`` (averaged over devices under pmap).

A loss without state may leave the last parameter out:
``loss_fn(params, state, batch, rng)``. Which call the step makes is decided once,
from ``loss_fn``'s signature, when the step is built: a ``loss_fn`` with a parameter
named ``loss_state`` (or ``**kwargs``) always gets ``loss_state=`` as a keyword;
one without it is called with four arguments, and giving it a :class:`TrainState`
that holds loss state is an error (the state would otherwise be dropped).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from funcnet import metrics as metrics_lib
from funcnet.core import as_layer

__all__ = ["TrainState", "Aux", "make_train_step", "make_eval_step"]


class TrainState(NamedTuple):
    """Everything a training step reads and writes; a pytree (jit/pmap/checkpoint it as is).

    Attributes:
      params: trainable parameters (what ``optax`` updates).
      state: layer state (e.g. BatchNorm running statistics), ``()`` if none.
      opt_state: the optimizer's state.
      step: number of steps taken (int32 scalar).
      rng: the key the next step splits for its randomness (dropout).
      loss_state: state kept by the loss (e.g. center-loss centers), ``()`` if none.
    """

    params: Any
    state: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    loss_state: Any = ()

    @classmethod
    def create(cls, layer, optimizer: optax.GradientTransformation, rng, input_shape, *,
               loss_state=()) -> "TrainState":
        """Initialises ``layer`` for ``input_shape`` and the optimizer on its params."""
        init_key, rng = jax.random.split(rng)
        _, params, state = as_layer(layer, "TrainState.create").init(init_key, input_shape)
        return cls(params, state, optimizer.init(params), jnp.zeros((), jnp.int32), rng, loss_state)


class Aux(NamedTuple):
    """What a loss function returns next to the loss."""

    state: Any = ()
    loss_state: Any = ()
    metrics: dict = {}


def _as_aux(aux, where) -> Aux:
    if isinstance(aux, Aux):
        return aux
    if isinstance(aux, dict) and "state" in aux and set(aux) <= set(Aux._fields):
        return Aux(**aux)
    raise TypeError(f"{where}: loss_fn must return (loss, funcnet.train.Aux(state=new_state, ...)), "
                    f"got aux of type {type(aux).__name__}. Wrap the new layer state: "
                    f"return loss, Aux(state=new_state).")


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *,
                    axis_name: Optional[str] = None) -> Callable:
    """Builds ``step(train_state, batch) -> (train_state, metrics)``, pure and unjitted.

    Per step: split ``train_state.rng``; compute ``value_and_grad`` of ``loss_fn``;
    under ``axis_name`` (inside ``jax.pmap`` or ``jax.shard_map``) average the gradients
    over devices (a ``lax.pmean``; under ``shard_map``'s default ``check_vma=True`` a
    replicated parameter's gradient arrives already summed and is divided by the
    device count instead), ``lax.pmean`` the
    metrics and the floating layer state, and give each device its own dropout key
    (``fold_in`` of the device index); apply the optax update. ``metrics`` is
    ``{"loss": loss, **aux.metrics}``.
    """

    takes_loss_state = _takes_loss_state(loss_fn)

    def step(train_state: TrainState, batch):
        rng, key = jax.random.split(train_state.rng)
        if axis_name is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
        has_loss_state = not _is_empty(train_state.loss_state)
        if has_loss_state and not takes_loss_state:
            raise TypeError(f"make_train_step: the TrainState holds loss state, but "
                            f"{_fn_name(loss_fn)} has no loss_state parameter, so it could "
                            f"neither read nor return it. Define it as loss_fn(params, state, "
                            f"batch, rng, loss_state) and return Aux(..., loss_state=new).")

        def objective(params):
            if takes_loss_state:
                out = loss_fn(params, train_state.state, batch, key, loss_state=train_state.loss_state)
            else:
                out = loss_fn(params, train_state.state, batch, key)
            return _check_loss_output(out, loss_fn)

        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(train_state.params)
        aux = _as_aux(aux, "make_train_step")
        if has_loss_state and _is_empty(aux.loss_state):
            raise ValueError("make_train_step: the TrainState holds loss state but loss_fn "
                             "returned Aux without loss_state; return the updated value, "
                             "e.g. Aux(state=new_state, loss_state=new_centers).")
        if "loss" in aux.metrics:
            raise ValueError("make_train_step: Aux.metrics may not contain 'loss'; the step "
                             "reports the loss_fn's value under that name. Rename the metric.")
        metrics = {"loss": loss, **aux.metrics}
        new_state = aux.state
        if axis_name is not None:
            grads = _mean_gradients(grads, axis_name)
            metrics = jax.lax.pmean(metrics, axis_name)
            # Keeps replicas identical when a stateful layer or loss was not synced itself
            # (e.g. center_loss called without axis_name); a no-op for synced state.
            new_state = _pmean_floating(new_state, axis_name)
            if has_loss_state:
                aux = aux._replace(loss_state=_pmean_floating(aux.loss_state, axis_name))
        updates, opt_state = optimizer.update(grads, train_state.opt_state, train_state.params)
        params = optax.apply_updates(train_state.params, updates)
        new = TrainState(params, new_state, opt_state, train_state.step + 1, rng,
                         aux.loss_state if has_loss_state else train_state.loss_state)
        return new, metrics

    return step


def _check_loss_output(out, loss_fn):
    if not (isinstance(out, tuple) and len(out) == 2):
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise TypeError(f"make_train_step: {_fn_name(loss_fn)} must return (loss, Aux(...)), got "
                        f"{got}. A loss without layer state returns: loss, Aux(state=state).")
    loss = out[0]
    if jnp.ndim(loss) != 0:
        raise TypeError(f"make_train_step: {_fn_name(loss_fn)} returned a loss of shape "
                        f"{jnp.shape(loss)}; it must be a scalar (reduce it, e.g. .mean()).")
    return out


def _takes_loss_state(loss_fn) -> bool:
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return False
    return any(p.name == "loss_state" and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD
               for p in params)


def _fn_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _is_empty(tree) -> bool:
    return not jax.tree.leaves(tree)


def _mean_gradients(grads, axis_name):
    """The mean over ``axis_name`` of every device's gradients, under pmap and shard_map alike.

    Under ``jax.pmap`` and ``jax.shard_map(check_vma=False)`` each device holds its own
    gradients: ``pmean``. Under ``jax.shard_map`` with ``check_vma=True`` (its default)
    the gradient of a value that does not vary over the axis (a replicated parameter)
    arrives already summed over it -- JAX transposes the implicit cast to varying into
    a ``psum`` -- so a ``pmean`` would leave it N times too large: divide it by the
    axis size instead. Which case holds is read from the types: the device index
    varies over the axis exactly when JAX tracks varying axes.
    """
    if not _varies(jax.lax.axis_index(axis_name), axis_name):
        return jax.lax.pmean(grads, axis_name)
    size = jax.lax.axis_size(axis_name)
    return jax.tree.map(lambda g: jax.lax.pmean(g, axis_name) if _varies(g, axis_name)
                        else g / size, grads)


def _varies(x, axis_name) -> bool:
    mat = getattr(jax.typeof(x), "manual_axis_type", None)  # JAX 0.10; older: .vma
    varying = mat.varying if mat is not None else getattr(jax.typeof(x), "vma", frozenset())
    return axis_name in varying


def _pmean_floating(tree, axis_name):
    return jax.tree.map(
        lambda x: jax.lax.pmean(x, axis_name) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def make_eval_step(metric_fn: Callable, *, axis_name: Optional[str] = None) -> Callable:
    """Builds ``eval_step(train_state, batch) -> metric_state``.

    ``metric_fn(params, state, batch)`` returns the metric state of one batch (e.g.
    ``metric.update(metric.init(), logits, labels)`` for a ``funcnet.metrics``
    metric). States are sums and counts, so batches combine by adding them; under
    ``axis_name`` the step ``psum``-s them so every device holds the global value.
    """

    def eval_step(train_state: TrainState, batch):
        out = metric_fn(train_state.params, train_state.state, batch)
        return metrics_lib.merge(out, axis_name) if axis_name is not None else out

    return eval_step
