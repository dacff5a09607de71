"""Training: the state a step carries and the pure step.

The step is a pure function ``(train_state, batch) -> (train_state, metrics)``.
Wrap it in ``jax.jit`` (one device) or ``jax.pmap`` (``axis_name`` given; one
replica per device). :func:`funcnet.loop.fit` is a convenience on top: everything
it does can be written by hand with the step, and the examples show both.

The loss function
-----------------
One convention:

```
loss_fn(params, state, batch, rng, loss_state) -> (loss, Aux(state=..., loss_state=..., metrics={...}))
```

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

Arrays a step wants back (generated images, Q-values, the noise it drew) go in
``Aux(outputs={...})``: when the loss_fn puts any there, the step returns them as
a third value, ``(train_state, metrics, outputs)``, un-averaged (per device under
pmap). A loss_fn that leaves ``outputs`` empty keeps the two-value step.

Several models
--------------
``TrainState.create({"gen": (G, (-1, 64)), "disc": (D, (-1, 784))}, optimizers, rng)``
holds several networks: ``params`` and ``state`` are dicts keyed by model name, and
the loss_fn sees all of them (``params["disc"]``). ``optimizers`` is either one
optimizer for all (one joint optimizer state over the whole dict, as
``torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()))``: a VAE or an
autoencoder, stepped with the plain ``make_train_step(loss_fn, optimizer)``), or a
dict of optimizers, one per trained model, each with its own state (a GAN's two
optimizers). A model with no entry in that dict has no optimizer and is never
trained (a DQN target network; see :func:`copy_params` and :func:`polyak_update`).
``make_train_step(loss_fn, optimizers, update="disc")`` differentiates and updates
``disc`` only: the other models' params and optimizer states come back
bit-identical, while the loss_fn still runs them (a generator loss through the
frozen discriminator).
"""

from __future__ import annotations

import inspect
import warnings
from functools import partial
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import _checks as checks
from funcnet import _mesh
from funcnet import metrics as metrics_lib
from funcnet import params as fparams
from funcnet import precision
from funcnet.core import Layer, PyTree, Shape, as_layer, describe_tree
from funcnet.errors import MismatchError

__all__ = [
    "TrainState",
    "Aux",
    "EMA",
    "make_train_step",
    "make_eval_step",
    "copy_params",
    "polyak_update",
    "make_scaled_train_step",
]

# What ``optimizer`` takes: one optax optimizer, or {model name: optimizer} for several models.
Optimizers = Union[optax.GradientTransformation, Mapping[str, optax.GradientTransformation]]


class TrainState(NamedTuple):
    """Everything a training step reads and writes; a pytree (jit/pmap/checkpoint it as is).

    Attributes:
      params: trainable parameters (what ``optax`` updates); for several models a
        dict ``{name: params}``.
      state: layer state (e.g. BatchNorm running statistics), ``()`` if none; for
        several models a dict ``{name: state}``.
      opt_state: the optimizer's state; with a dict of optimizers, ``{name: state}``
        for the models that have one.
      step: number of steps taken (int32 scalar).
      rng: the run's key, never changed by a step: step ``n`` draws its randomness
        (dropout) from ``jax.random.fold_in(rng, n)``.
      loss_state: state kept by the loss (e.g. center-loss centers), ``()`` if none.
      ema: an :class:`EMA` of the params when created with ``ema=True`` (updated by a
        step built with ``ema_decay=``), ``()`` otherwise.
      loss_scale: a :class:`funcnet.precision.LossScale` when created with
        ``loss_scale=`` (float16 training: the step scales the loss, unscales the
        gradients, skips non-finite steps and updates the scale), ``()`` otherwise.

    Why eight fields: the first five are read and written by every step. The last
    three are optional and default to ``()``, an empty pytree (no leaves: nothing is
    stored, traced or transferred for them, and the step adds no operation for them).
    They live here rather than next to the state because each changes at every step
    that uses it and must come back at a resume: in the TrainState they are
    checkpointed and restored with the params, a non-finite float16 step keeps the
    old loss state and EMA as it keeps the old params, and ``make_train_step`` needs
    no extra argument (the 0.1 ``make_scaled_train_step`` passed the loss scale
    separately). They stay fields even when empty because checkpoints store the
    TrainState by its fields.

    Examples:
      >>> from funcnet.layers import Dense
      >>> ts = TrainState.create(Dense(2), optax.sgd(0.1), jax.random.key(0), (-1, 3))
      >>> ts._fields
      ('params', 'state', 'opt_state', 'step', 'rng', 'loss_state', 'ema', 'loss_scale')
      >>> ts = ts._replace(step=ts.step + 1)  # a NamedTuple: replace fields, never mutate
      >>> int(ts.step), [x.shape for x in jax.tree.leaves(ts.params)]
      (1, [(3, 2), (2,)])
    """

    params: Any
    state: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    loss_state: Any = ()
    ema: Any = ()
    loss_scale: Any = ()

    def replace(self, **changes: Any) -> TrainState:
        """A copy with the named fields replaced, as Flax's ``TrainState.replace``.

        The same as the NamedTuple's ``_replace`` (which keeps working), with an error
        that lists the fields when a name is not one of them. Only the container is new:
        the arrays are shared, nothing is copied, and it works inside ``jax.jit``.

        Args:
          **changes: ``field=new_value`` for any of the fields (``params``, ``state``,
            ``opt_state``, ``step``, ``rng``, ``loss_state``, ``ema``, ``loss_scale``).

        Returns:
          A :class:`TrainState` with those fields replaced, the others as they were.

        Raises:
          TypeError: a name that is not a field of TrainState.

        Examples:
          >>> from funcnet.layers import Dense
          >>> ts = TrainState.create(Dense(2), optax.sgd(0.1), jax.random.key(0), (-1, 3))
          >>> ts2 = ts.replace(step=ts.step + 1, params=jax.tree.map(jnp.zeros_like, ts.params))
          >>> int(ts2.step), float(ts2.params["W"].sum()), int(ts.step)
          (1, 0.0, 0)
        """
        unknown = [name for name in changes if name not in self._fields]
        if unknown:
            raise TypeError(_unknown_fields_message(unknown, self._fields))
        return self._replace(**changes)

    @classmethod
    def create(
        cls,
        layer: Union[Layer, Mapping[str, tuple[Layer, Shape]]],
        optimizer: Optimizers,
        rng: jax.Array,
        input_shape: Optional[Shape] = None,
        *,
        loss_state: PyTree = (),
        ema: bool = False,
        loss_scale: Optional[precision.LossScale] = None,
        params: Optional[PyTree] = None,
        state: Optional[PyTree] = None,
    ) -> TrainState:
        """Initialises ``layer`` for ``input_shape`` and the optimizer on its params.

        ``params=`` starts from params you have instead (weights loaded from a file,
        another framework's init), as Flax's ``TrainState.create(params=...)``: ``layer``'s
        init is traced for ``input_shape`` (``jax.eval_shape``: nothing is drawn or
        computed) and the given params must have its tree, shapes and dtypes; they are
        used as given, not copied. A layer with state (BatchNorm's statistics) takes it
        the same way, as ``state=``. That skips the init's random draws, which on CPU
        cost seconds for a large model (each new shape compiles its own small program).

        ``ema=True`` also keeps an exponential moving average of the params
        (:class:`EMA`, a copy of the initial params until the first step), for a step
        built with ``make_train_step(..., ema_decay=...)``.

        ``loss_scale`` (``funcnet.precision.dynamic_loss_scale()`` or
        ``static_loss_scale(S)``) turns on loss scaling for float16 compute in every
        step built by :func:`make_train_step` (see there).

        Several models: ``layer`` is a dict ``{name: (layer, input_shape)}`` and
        ``input_shape`` is left out; ``params``/``state`` become dicts keyed by
        name. ``optimizer`` is one optimizer (one joint state over all models) or
        a dict ``{name: optimizer}`` (one state per model, ``opt_state[name]``;
        models left out are not trained). Each model is initialised with its own
        key, split from ``rng`` in sorted name order.

        Args:
          layer: a :class:`funcnet.Layer`, or a dict ``{name: (layer, input_shape)}``.
          optimizer: an optax ``GradientTransformation``, or a dict ``{name: optimizer}``
            for several models.
          rng: a JAX PRNG key; split into the init key and the steps' key.
          input_shape: the input shape for ``layer`` (``-1`` for the batch); default
            None, the value for a dict of models (which leaves it out).
          loss_state: the loss's initial state; default ``()``, none.
          ema: keep an :class:`EMA` of the params; default False.
          loss_scale: a :class:`funcnet.precision.LossScale`; default None, no loss
            scaling.
          params: the params to start from (a single layer only); default None,
            ``layer``'s init.
          state: the layer state to start from, with ``params`` (required then when the
            layer has state); default None.

        Returns:
          The train state, a :class:`TrainState` at step 0.

        Raises:
          TypeError: ``input_shape`` missing for a single layer, given with a dict of
            models, or a dict entry that is not ``(layer, input_shape)``.
          ValueError: a dict of optimizers naming models the dict of models lacks.
          funcnet.errors.ArgumentError: a ``loss_scale`` that is not a ``LossScale``;
            ``params``/``state`` with a dict of models, or ``state`` without ``params``.
          funcnet.errors.MismatchError: ``params``/``state`` whose tree, shapes or
            dtypes are not what ``layer``'s init gives (or no ``state`` for a layer
            that has state).

        Examples:
          >>> from funcnet.layers import Dense
          >>> ts = TrainState.create(Dense(2), optax.sgd(0.1), jax.random.key(0), (-1, 3))
          >>> ts.params["W"].shape, int(ts.step), ts.ema, ts.loss_scale
          ((3, 2), 0, (), ())
          >>> loaded = {"W": jnp.ones((3, 2)), "b": jnp.zeros(2)}
          >>> ts = TrainState.create(Dense(2), optax.sgd(0.1), jax.random.key(0), (-1, 3), params=loaded)
          >>> ts.params["W"] is loaded["W"]
          True
        """
        init_key, rng = jax.random.split(checks.prng_key("TrainState.create", rng))
        if isinstance(layer, dict):
            if input_shape is not None:
                raise TypeError(
                    "TrainState.create: with a dict of models, each model's input "
                    "shape goes in the dict, {name: (layer, input_shape)}; leave "
                    f"input_shape out (got {input_shape!r})."
                )
            if params is not None or state is not None:
                raise checks.ArgumentError(
                    "TrainState.create: params=/state= take a single layer's; with a "
                    "dict of models, create the TrainState, then ts.replace(params="
                    "{**ts.params, name: loaded}, opt_state=...) with the optimizer's "
                    "init of the new params."
                )
            params, state = _init_models(layer, init_key)
            opt_state = _init_optimizers(optimizer, params)
        else:
            if input_shape is None:
                raise TypeError(
                    "TrainState.create: input_shape is required for a single layer, "
                    "e.g. TrainState.create(net, optimizer, rng, (-1, 784))."
                )
            layer = as_layer(layer, "TrainState.create")
            if params is None:
                if state is not None:
                    raise checks.ArgumentError(
                        "TrainState.create: state= goes with params= (both loaded); "
                        "without params the layer's init gives both."
                    )
                _, params, state = layer.init(init_key, input_shape)
            else:
                state = _given_start(layer, input_shape, params, state)
            opt_state = optimizer.init(params)
        average = (
            EMA(jax.tree.map(jnp.copy, params), jnp.zeros((), jnp.int32))
            if checks.flag("TrainState.create", "ema", ema)
            else ()
        )
        if loss_scale is not None and not isinstance(loss_scale, precision.LossScale):
            raise checks.ArgumentError(
                f"TrainState.create: loss_scale must be None or a funcnet.precision.LossScale "
                f"(precision.dynamic_loss_scale() or precision.static_loss_scale(S)), got "
                f"{checks.got(loss_scale)[:120]}."
            )
        return cls(
            params,
            state,
            opt_state,
            jnp.zeros((), jnp.int32),
            rng,
            loss_state,
            average,
            () if loss_scale is None else loss_scale,
        )


def _unknown_fields_message(unknown, fields) -> str:
    """``TrainState.replace``'s error: the names it got wrong, the fields there are, and
    the nearest field for a misspelt one."""
    import difflib  # only on this error path

    hints = [
        f"{name!r} -> {close[0]!r}"
        for name in unknown
        for close in [difflib.get_close_matches(name, fields, n=1)]
        if close
    ]
    flax = [name for name in unknown if name in ("apply_fn", "tx")]
    return (
        f"TrainState.replace: {unknown} {'is not a field' if len(unknown) == 1 else 'are not fields'}"
        f" of TrainState; its fields are {list(fields)}."
        + (f" Did you mean {', '.join(hints)}?" if hints else "")
        + (
            f" Flax's TrainState keeps {flax} in the state; funcnet's step gets the model "
            f"and the optimizer from make_train_step(loss_fn, optimizer) instead."
            if flax
            else ""
        )
    )


class EMA(NamedTuple):
    """An exponential moving average of the params, PyTorch's
    ``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))`` updated after
    every optimizer step:

    ```
    count == 0:  ema = params                      (the first update copies)
    otherwise:   ema = ema + (1 - decay) * (params - ema)
    ```

    That is ``make_train_step(..., ema_start="first_update")``, the default. Where the
    average starts is the one thing the common EMAs differ in; ``ema_start`` picks it
    (``t`` is ``count`` after the update, 1 at the first):

    - ``"init"``: from the initial params (``TrainState.create`` copies them into
      ``ema.params``), ``ema = ema + (1 - decay) * (params - ema)`` from the first
      update on, as TensorFlow's ``tf.train.ExponentialMovingAverage`` (shadow
      variables start at the variables' values) and timm's ``ModelEmaV2`` (a copy of
      the model at construction) do. The initial params weigh ``decay ** t``.
    - ``"zeros_debiased"``: from zeros, with Adam's bias correction, as
      ``optax.ema(decay, debias=True)`` and Haiku's ``EMAParamsTree(decay)``
      (``zero_debias=True``): ``ema.params`` holds the corrected average, updated as
      ``ema = ema + (1 - decay) / (1 - decay ** t) * (params - ema)``; the first update
      copies, as torch's, and the initial params never count.

    Attributes:
      params: the averaged params (the structure of ``TrainState.params``).
      count: updates so far (torch's ``n_averaged``).

    Only params are averaged: layer state (BatchNorm statistics) is the live model's,
    as with ``AveragedModel(use_buffers=False)``, torch's default.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(2), optax.sgd(0.1)
      >>> def loss_fn(params, state, batch, rng):
      ...     return jnp.mean(net.apply(params, state, batch)[0] ** 2), Aux(state=state)
      >>> ts = TrainState.create(net, opt, jax.random.key(0), (-1, 3), ema=True)
      >>> step = jax.jit(make_train_step(loss_fn, opt, ema_decay=0.9))
      >>> ts, _ = step(ts, jnp.ones((4, 3)))  # the first update copies the params
      >>> bool(jnp.array_equal(ts.ema.params["W"], ts.params["W"]))
      True
      >>> before = ts.ema.params["W"]
      >>> ts, _ = step(ts, jnp.ones((4, 3)))
      >>> want = before + (1 - 0.9) * (ts.params["W"] - before)
      >>> int(ts.ema.count), bool(jnp.allclose(ts.ema.params["W"], want))
      (2, True)
    """

    params: Any
    count: jax.Array


def _given_start(layer: Layer, input_shape: Shape, params, state):
    """The layer state to start from given ``params`` (and ``state``, None for none):
    both checked against ``layer``'s init for ``input_shape``, traced and never run."""
    _, want_params, want_state = jax.eval_shape(lambda k: layer.init(k, input_shape), jax.random.key(0))
    _check_like(layer, input_shape, "params", params, want_params)
    if state is None:
        if jax.tree.leaves(want_state):
            raise MismatchError(
                "TrainState.create",
                "state",
                layer.name,
                describe_tree(want_state),
                "nothing",
                message=f"TrainState.create: {layer.name} has state ({describe_tree(want_state)}); "
                "with params= pass state= too, e.g. the statistics saved with the params.",
            )
        return jax.tree.map(lambda x: x, want_state)  # its containers: no leaves
    _check_like(layer, input_shape, "state", state, want_state)
    return state


def _check_like(layer: Layer, input_shape: Shape, what: str, given, want) -> None:
    """Raises MismatchError unless ``given`` has ``want``'s tree, shapes and dtypes."""
    got, expected = fparams.paths(given), fparams.paths(want)
    wrong = [
        f"{p}: {describe_tree(got[p])} where the init gives {describe_tree(x)}"
        for p, x in expected.items()
        if p in got and (tuple(np.shape(got[p])) != x.shape or jnp.result_type(got[p]) != x.dtype)
    ]
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if not (wrong or missing or extra or jax.tree.structure(given) != jax.tree.structure(want)):
        return
    parts = wrong[:3] + [f"missing {', '.join(missing[:5])}"] * bool(missing)
    parts += [f"not in {layer.name}: {', '.join(extra[:5])}"] * bool(extra)
    detail = "; ".join(parts) or "another tree of containers"
    raise MismatchError(
        "TrainState.create",
        what,
        layer.name,
        describe_tree(want),
        describe_tree(given),
        message=f"TrainState.create: the {what} given {'are' if what == 'params' else 'is'} not "
        f"{layer.name}'s for input shape {tuple(input_shape)} ({detail}). Pass {what} of this "
        "architecture, converted to its tree (funcnet.params.paths lists its leaves).",
    )


def _init_models(models: dict, rng):
    """``{name: (layer, input_shape)}`` -> params and state dicts keyed by name."""
    params, state = {}, {}
    names = sorted(models)
    for name, key in zip(names, jax.random.split(rng, len(names))):
        entry = models[name]
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], (tuple, list))):
            raise TypeError(
                f"TrainState.create: models[{name!r}] must be (layer, input_shape), "
                f"e.g. {{{name!r}: (net, (-1, 784))}}; got {type(entry).__name__}."
            )
        layer, shape = entry
        _, params[name], state[name] = as_layer(layer, f"TrainState.create[{name!r}]").init(key, shape)
    return params, state


def _init_optimizers(optimizer, params: dict):
    if not isinstance(optimizer, dict):
        return optimizer.init(params)
    _check_model_names("TrainState.create", "optimizer", optimizer, params)
    return {name: opt.init(params[name]) for name, opt in optimizer.items()}


def _check_model_names(where, what, names, params):
    unknown = sorted(set(names) - set(params)) if isinstance(params, dict) else sorted(names)
    if unknown:
        have = sorted(params) if isinstance(params, dict) else "a single model (not a dict)"
        raise ValueError(
            f"{where}: {what} names the models {unknown}, which the TrainState does "
            f"not have; its models are {have}. Create it with a dict of models, "
            f"TrainState.create({{name: (layer, input_shape), ...}}, ...)."
        )


class Aux(NamedTuple):
    """What a loss function returns next to the loss.

    Attributes:
      state: the new layer state (``()`` if none).
      loss_state: the new loss state, when the TrainState holds one.
      metrics: scalars, returned next to ``"loss"`` (averaged over devices under pmap).
      outputs: arrays of any shape the step should hand back (images, Q-values, the
        noise it drew), never averaged. When not empty, the step returns
        ``(train_state, metrics, outputs)`` instead of ``(train_state, metrics)``.

    Examples:
      >>> Aux(state=(), metrics={"acc": 1.0})
      Aux(state=(), loss_state=(), metrics={'acc': 1.0}, outputs={})
    """

    state: Any = ()
    loss_state: Any = ()
    metrics: dict = {}
    outputs: Any = {}


def _as_aux(aux, where) -> Aux:
    if isinstance(aux, Aux):
        return aux
    if isinstance(aux, dict) and "state" in aux and set(aux) <= set(Aux._fields):
        return Aux(**aux)
    raise TypeError(
        f"{where}: loss_fn must return (loss, funcnet.train.Aux(state=new_state, ...)), "
        f"got aux of type {type(aux).__name__}. Wrap the new layer state: "
        f"return loss, Aux(state=new_state)."
    )


def make_train_step(
    loss_fn: Callable,
    optimizer: Optimizers,
    *,
    update: Union[str, Sequence[str], None] = None,
    axis_name: Optional[str] = None,
    clip_grad_norm: Optional[float] = None,
    microbatches: Optional[int] = None,
    ema_decay: Optional[float] = None,
    grad_norm: Optional[bool] = None,
    ema_start: str = "first_update",
) -> Callable:
    """Builds ``step(train_state, batch) -> (train_state, metrics)``, pure and unjitted.

    Per step: take the step's key, ``jax.random.fold_in(train_state.rng,
    train_state.step)`` (Flax's idiom; ``rng`` itself is never changed); compute
    ``value_and_grad`` of ``loss_fn``; under ``axis_name`` (inside ``jax.pmap`` or
    ``jax.shard_map``) average the gradients over devices (a ``lax.pmean``; under
    ``shard_map``'s default ``check_vma=True`` a replicated parameter's gradient arrives
    already summed and is divided by the device count instead), ``lax.pmean`` the
    metrics and the floating layer state, and give each device its own dropout key
    (``fold_in`` of the device index); apply the optax update. ``metrics`` is
    ``{"loss": loss, **aux.metrics}``, plus ``"grad_norm"`` (see the option) when it is
    asked for or clipping computes it anyway. When the loss_fn returns
    ``Aux(outputs=...)`` with any array in it, the step returns
    ``(train_state, metrics, outputs)``.

    Args:
      loss_fn: ``loss_fn(params, state, batch, rng[, loss_state]) -> (loss, Aux(...))``
        (see the module docstring).
      optimizer: an optax ``GradientTransformation``, or the dict ``{name: optimizer}``
        the TrainState was created with (several models).
      update: the model name, or a sequence of names, that this step trains (several
        models; see below). Default None: every model in the optimizer dict, or the
        whole params with one optimizer.
      axis_name: the ``jax.pmap``/``jax.shard_map`` axis to average over (see above).
        Default None: one device.
      clip_grad_norm: default None. Rescale the gradients as PyTorch's
        ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` does: with ``n`` the
        global norm over every trained parameter (after the cross-device mean),
        ``g * min(1, max_norm / (n + 1e-6))``. None: no clipping.
      microbatches: default None (one pass over the whole batch). ``k`` accumulates the
        gradient over ``k`` micro-batches inside the one step (a ``lax.scan``), for a
        batch too large for memory at once: one update per step, with the mean of the
        micro-batches' gradients, so for a loss that is a mean over examples the step
        equals the full-batch step. The batch's leading axis must be a multiple of
        ``k``; micro-batch ``i`` takes rows ``i, i + k, i + 2k, ...`` (on a mesh each
        micro-batch stays split over the devices as the batch was). Layer state
        (BatchNorm statistics) and loss state thread through the micro-batches in order;
        each gets its own dropout key (``fold_in`` of its index); ``loss`` and the
        ``Aux.metrics`` are the means over the micro-batches, ``outputs`` come back in
        the batch's row order.
      ema_decay: default None (no average). Update ``train_state.ema`` (create the state
        with ``ema=True``) after every step: see :class:`EMA` for the formula, PyTorch's
        ``get_ema_multi_avg_fn(decay)``. ``make_eval_step(..., ema=True)`` evaluates
        with it.
      ema_start: where that average starts (see :class:`EMA`): ``"first_update"``
        (default; torch's ``AveragedModel``: the first update copies the params),
        ``"init"`` (from the initial params, as ``tf.train.ExponentialMovingAverage``)
        or ``"zeros_debiased"`` (``optax.ema(decay, debias=True)``). Needs ``ema_decay``.
      grad_norm: report ``metrics["grad_norm"]``, the global 2-norm of the gradients the
        update sees (after the cross-device mean and loss unscaling, before clipping).
        ``None`` (default): only with ``clip_grad_norm``, which computes it anyway;
        ``True``: always; ``False``: never. It is off by default because it costs a pass
        of its own over every gradient: on XLA:CPU the square is not fused into the sum,
        and on the MNIST MLP (784-400-100-10, Adam, batch 128) it took 13 % of the step
        (BENCHMARKS.md, workload 6); neither PyTorch nor a hand-written optax loop
        computes it unasked.

    Loss scaling (float16 compute; bfloat16 needs none): for a ``train_state`` created
    with ``loss_scale=`` (a :class:`funcnet.precision.LossScale`), the step

    1. multiplies the loss by ``S = train_state.loss_scale.scale`` before differentiation;
    2. divides the gradients by ``S`` (after the cross-device mean, before clipping);
    3. if any gradient is inf/NaN, skips the update: params, layer state, optimizer
       state, loss state and EMA stay as they were (``step`` and ``rng`` advance, so
       the next batch gets fresh randomness);
    4. updates the scale with :func:`funcnet.precision.update_loss_scale`.

    ``metrics`` then also hold ``"loss_scale"`` (the ``S`` used) and ``"grads_finite"``;
    ``"loss"`` and ``"grad_norm"`` are unscaled.

    Optimizers that take extra arguments (``optax.GradientTransformationExtraArgs``:
    ``optax.chain`` of anything, ``optax.contrib.reduce_on_plateau``) get
    ``value=loss`` (the step's mean loss), so a plateau schedule works in the step.

    Several models (a TrainState created from a dict of models): ``optimizer`` is the
    same one optimizer or dict of optimizers the state was created with. ``update``
    (a model name or a sequence of names) picks the models that get gradients and
    an update, default: every model in the optimizer dict. The others are held
    fixed, like PyTorch's ``requires_grad_(False)`` on a whole network: no gradient
    is computed for them, and their params and optimizer state come back
    bit-identical. ``update=`` needs one optimizer state per model (a dict of
    optimizers at create, the same optimizer under several names if you like).

    Returns:
      ``step(train_state, batch) -> (train_state, metrics)`` (or ``(train_state,
      metrics, outputs)``, see above), pure and unjitted.

    Examples:
      >>> from funcnet import losses
      >>> from funcnet.layers import Dense
      >>> net = Dense(2)
      >>> def loss_fn(params, state, batch, rng):
      ...     logits, state = net.apply(params, state, batch["x"], rng=rng, train=True)
      ...     return losses.cross_entropy(logits, batch["y"]), Aux(state=state)
      >>> opt = optax.sgd(0.1)
      >>> ts = TrainState.create(net, opt, jax.random.key(0), (-1, 3))
      >>> step = jax.jit(make_train_step(loss_fn, opt, clip_grad_norm=1.0))
      >>> ts, metrics = step(ts, {"x": jnp.ones((4, 3)), "y": jnp.array([0, 1, 0, 1])})
      >>> int(ts.step), sorted(metrics)
      (1, ['grad_norm', 'loss'])
    """
    takes_loss_state = _takes_loss_state(loss_fn)
    updater = _updater(optimizer, update)
    clip_grad_norm, k, ema_decay, report_norm = _checked_options(clip_grad_norm, microbatches, ema_decay, grad_norm)
    ema_start = _checked_ema_start(ema_start, ema_decay)
    # The stages, innermost first: each wraps the one before, as optax.chain composes.
    objective = _loss_scaled(_objective(loss_fn, takes_loss_state, updater.merge))
    gradient = _microbatched(_gradient(objective, updater.select), updater.select, k)
    gradient = _clipped(_unscaled(_cross_device(_measured(gradient), axis_name)), clip_grad_norm, report_norm)
    apply = _skip_nonfinite(_ema(_updated(updater), ema_decay, ema_start))

    def step(train_state: TrainState, batch):
        # the step's key from the run's key and the step count, not a split carried from
        # step to step: a network that draws nothing (no dropout) then computes no key at
        # all, where a carried split costs each step a threefry hash, on XLA:CPU a loop of
        # its own inside the device loop (11.7-14.5 us a step on jax 0.12, a quarter of a
        # small MLP's step: benchmarks/key_probe.py)
        key = jax.random.fold_in(train_state.rng, train_state.step)
        _check_state_fits(train_state, not _is_empty(train_state.loss_state), takes_loss_state, loss_fn, ema_decay)
        out = gradient(train_state, batch, key)
        new = apply(train_state, out)._replace(step=train_state.step + 1)
        if jax.tree.leaves(out.outputs):
            return new, out.metrics, out.outputs
        return new, out.metrics

    return step


def make_scaled_train_step(loss_fn: Callable, optimizer: Optimizers, *, axis_name: Optional[str] = None) -> Callable:
    """Deprecated (until 0.3): create the state with ``TrainState.create(...,
    loss_scale=...)`` and use :func:`make_train_step`, which scales the loss then.

    Returns the 0.1 form, ``step(train_state, loss_scale, batch) -> (train_state,
    loss_scale, metrics)``, computed by :func:`make_train_step` with ``loss_scale``
    put into the train state for the step (the ``train_state`` returned holds none).

    Args:
      loss_fn: as for :func:`make_train_step`.
      optimizer: as for :func:`make_train_step`.
      axis_name: as for :func:`make_train_step`; default None (one device).

    Returns:
      ``step(train_state, loss_scale, batch) -> (train_state, loss_scale, metrics)``,
      pure and unjitted.

    Raises:
      funcnet.errors.ArgumentError: (from the step) its first two arguments are not
        a :class:`TrainState` and a :class:`funcnet.precision.LossScale`, in that order.

    Examples:
      >>> import warnings
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(2), optax.sgd(0.1)
      >>> def loss_fn(params, state, batch, rng):
      ...     return jnp.mean(net.apply(params, state, batch)[0] ** 2), Aux(state=state)
      >>> ts = TrainState.create(net, opt, jax.random.key(0), (-1, 3))
      >>> with warnings.catch_warnings(record=True) as caught:
      ...     warnings.simplefilter("always")
      ...     step = make_scaled_train_step(loss_fn, opt)
      >>> caught[0].category.__name__
      'DeprecationWarning'
      >>> ts, ls, metrics = step(ts, precision.static_loss_scale(1024.0), jnp.ones((4, 3)))
      >>> int(ts.step), ts.loss_scale, float(ls.scale), sorted(metrics)
      (1, (), 1024.0, ['grad_norm', 'grads_finite', 'loss', 'loss_scale'])
    """
    warnings.warn(
        "make_scaled_train_step is deprecated and goes in funcnet 0.3: create the "
        "state with TrainState.create(..., loss_scale=precision.dynamic_loss_scale()) "
        "and use make_train_step, which then scales the loss.",
        DeprecationWarning,
        stacklevel=2,
    )
    inner = make_train_step(loss_fn, optimizer, axis_name=axis_name, grad_norm=True)

    def step(train_state: TrainState, loss_scale, batch):
        if not isinstance(train_state, TrainState) or not isinstance(loss_scale, precision.LossScale):
            raise checks.ArgumentError(
                f"make_scaled_train_step: the step takes (train_state, loss_scale, batch), got "
                f"({type(train_state).__name__}, {type(loss_scale).__name__}, ...): pass the "
                f"TrainState first and the precision.LossScale second."
            )
        new, metrics, *outputs = inner(train_state._replace(loss_scale=loss_scale), batch)
        return (new._replace(loss_scale=()), new.loss_scale, metrics, *outputs)

    return step


# --------------------------------------------------------------------------- #
# make_train_step's stages. The gradient side maps (train_state, batch, key) to
# a _Gradients record; the update side maps (train_state, _Gradients) to the new
# TrainState. Each stage is built once, when the step is built, and wraps the
# stage before it; whatever depends on the TrainState (loss scaling, loss state)
# is decided at trace time from its structure, so a stage that has nothing to do
# adds no operation to the step.
# --------------------------------------------------------------------------- #


class _Gradients(NamedTuple):
    """What the gradient stages hand to the update stages."""

    grads: Any  # of the trained params (updater.select)
    metrics: dict  # {"loss": ..., [grad_norm], **Aux.metrics, [loss_scale, grads_finite]}
    state: Any  # the new layer state
    loss_state: Any  # the new loss state (whatever came in when the TrainState holds none)
    outputs: Any  # Aux.outputs, never averaged
    finite: Any = None  # under loss scaling: whether every gradient is finite


def _scaling(train_state) -> bool:
    """Whether the step scales the loss: the TrainState was created with ``loss_scale=``."""
    return isinstance(train_state.loss_scale, precision.LossScale)


def _objective(loss_fn, takes_loss_state, merge):
    """``loss_fn`` called as its signature asks (``loss_state=`` by keyword or not at all) on
    the full params: ``(ts, trained, state, loss_state, batch, key) -> (loss, aux)``."""

    def objective(ts, trained, state, loss_state, batch, key):
        params = merge(ts.params, trained)
        if takes_loss_state:
            out = loss_fn(params, state, batch, key, loss_state=loss_state)
        else:
            out = loss_fn(params, state, batch, key)
        return _check_loss_output(out, loss_fn)

    return objective


def _loss_scaled(objective):
    """Loss scaling's first part, torch's ``GradScaler.scale(loss)``: the loss times ``S``
    (:func:`funcnet.precision.scale_loss`) before differentiation; a no-op without one."""

    def scaled(ts, *args):
        loss, aux = objective(ts, *args)
        return (precision.scale_loss(ts.loss_scale, loss) if _scaling(ts) else loss), aux

    return scaled


def _gradient(objective, select):
    """``jax.value_and_grad`` of ``objective`` with respect to the trained params (torch's
    ``loss.backward()``): ``(ts, state, loss_state, batch, key) -> (loss, aux, grads)``."""

    def one(ts, state, loss_state, batch, key):
        has_loss_state = not _is_empty(ts.loss_state)
        (loss, aux), grads = jax.value_and_grad(partial(objective, ts), has_aux=True)(
            select(ts), state, loss_state, batch, key
        )
        aux = _checked_aux(aux, has_loss_state)
        return loss, aux._replace(loss_state=aux.loss_state if has_loss_state else loss_state), grads

    return one


def _microbatched(one, select, k):
    """The gradient stage over ``k`` micro-batches (``_accumulate``; torch's gradient
    accumulation with ``loss / k``), or over the whole batch when ``k == 1``:
    ``(ts, batch, key) -> (loss, aux, grads)``."""
    if k == 1:
        return lambda ts, batch, key: one(ts, ts.state, ts.loss_state, batch, key)
    return lambda ts, batch, key: _accumulate(one, ts, select(ts), batch, key, k)


def _measured(gradient):
    """The gradient stage's results as a :class:`_Gradients`, with ``metrics = {"loss":
    loss, **aux.metrics}`` and the loss divided by the loss scale ``S`` again."""

    def measured(ts, batch, key):
        loss, aux, grads = gradient(ts, batch, key)
        if _scaling(ts):
            loss = loss / ts.loss_scale.scale
        return _Gradients(grads, {"loss": loss, **aux.metrics}, aux.state, aux.loss_state, aux.outputs)

    return measured


def _cross_device(gradient, axis_name):
    """Data parallelism under ``axis_name`` (torch's DDP): a dropout key per device, then the
    mean over devices of the gradients (:func:`_mean_gradients`, the ``check_vma`` rule),
    the metrics and the floating layer and loss state. A no-op without ``axis_name``."""
    if axis_name is None:
        return gradient

    def averaged(ts, batch, key):
        out = gradient(ts, batch, jax.random.fold_in(key, jax.lax.axis_index(axis_name)))
        # Keeps replicas identical when a stateful layer or loss was not synced itself
        # (e.g. center_loss called without axis_name); a no-op for synced state.
        loss_state = out.loss_state
        if not _is_empty(ts.loss_state):
            loss_state = _pmean_floating(loss_state, axis_name)
        return out._replace(
            grads=_mean_gradients(out.grads, axis_name),
            metrics=jax.lax.pmean(out.metrics, axis_name),
            state=_pmean_floating(out.state, axis_name),
            loss_state=loss_state,
        )

    return averaged


def _unscaled(gradient):
    """Loss scaling's second part, torch's ``GradScaler.unscale_``: the gradients divided by
    ``S`` (after the cross-device mean, so every device sees the same ``finite``), and
    ``metrics["loss_scale"]``, ``metrics["grads_finite"]``. A no-op without loss scaling."""

    def unscaled(ts, batch, key):
        out = gradient(ts, batch, key)
        if not _scaling(ts):
            return out
        grads = precision.unscale_grads(ts.loss_scale, out.grads)
        finite = precision.all_finite(grads)
        metrics = dict(out.metrics, loss_scale=ts.loss_scale.scale, grads_finite=finite)
        return out._replace(grads=grads, metrics=metrics, finite=finite)

    return unscaled


def _clipped(gradient, clip_grad_norm, report_norm):
    """torch's ``clip_grad_norm_(params, clip_grad_norm)`` and ``metrics["grad_norm"]``
    (:func:`_clip_and_report_norm`); a no-op when neither is asked for."""
    if clip_grad_norm is None and not report_norm:
        return gradient

    def clipped(ts, batch, key):
        out = gradient(ts, batch, key)
        grads, metrics = _clip_and_report_norm(out.grads, out.metrics, clip_grad_norm, report_norm)
        return out._replace(grads=grads, metrics=metrics)

    return clipped


def _updated(updater):
    """The optimizer step, torch's ``optimizer.step()`` (optax ``update`` and
    ``apply_updates``, per model under ``update=``): ``(ts, gradients) -> TrainState``
    with the new params, optimizer state, layer state and loss state (``step`` and ``rng``
    are the step's to advance)."""

    def apply(ts, out):
        params, opt_state = updater.apply(out.grads, ts, out.metrics["loss"])
        loss_state = out.loss_state if not _is_empty(ts.loss_state) else ts.loss_state
        return TrainState(params, out.state, opt_state, ts.step, ts.rng, loss_state, ts.ema, ts.loss_scale)

    return apply


def _ema(apply, decay, start):
    """The update stage followed by one :class:`EMA` update of the new params
    (:func:`_ema_update`, torch's ``AveragedModel.update_parameters``); a no-op without
    ``ema_decay``."""
    if decay is None:
        return apply

    def averaged(ts, out):
        new = apply(ts, out)
        return new._replace(ema=_ema_update(ts.ema, new.params, decay, start))

    return averaged


def _skip_nonfinite(apply):
    """Loss scaling's last part, torch's ``GradScaler.step`` and ``update``: when a gradient
    is inf/NaN the params, layer state, optimizer state, loss state and EMA stay as they
    were; then :func:`funcnet.precision.update_loss_scale`. A no-op without loss scaling."""

    def guarded(ts, out):
        new = apply(ts, out)
        if out.finite is None:
            return new
        fields = ("params", "state", "opt_state", "loss_state", "ema")
        kept = jax.tree.map(
            lambda a, b: jnp.where(out.finite, a, b),
            tuple(getattr(new, f) for f in fields),
            tuple(getattr(ts, f) for f in fields),
        )
        return new._replace(
            **dict(zip(fields, kept)), loss_scale=precision.update_loss_scale(ts.loss_scale, out.finite)
        )

    return guarded


def _accumulate(one, train_state, trained, batch, key, k):
    """``one`` over ``k`` micro-batches of ``batch`` in a ``lax.scan``: the mean loss,
    the last Aux (state and loss state threaded through; metrics averaged; outputs
    in row order) and the mean gradients."""
    _check_micro_leaves(batch, k)
    micro = jax.tree.map(lambda x: _split_rows("make_train_step", x, k), batch)

    def body(carry, xs):
        state, loss_state, total = carry
        chunk, i = xs
        loss, aux, grads = one(train_state, state, loss_state, chunk, jax.random.fold_in(key, i))
        total = jax.tree.map(jnp.add, total, grads)
        return (aux.state, aux.loss_state, total), (loss, aux.metrics, aux.outputs)

    zeros = jax.tree.map(jnp.zeros_like, trained)  # the gradients' shapes, dtypes and layouts
    (state, loss_state, total), (losses, metrics, outputs) = jax.lax.scan(
        body, (train_state.state, train_state.loss_state, zeros), (micro, jnp.arange(k))
    )
    aux = Aux(
        state=state,
        loss_state=loss_state,
        metrics=jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics),
        outputs=jax.tree.map(_mesh.merge_leading, outputs),
    )
    return jnp.mean(losses), aux, jax.tree.map(lambda g: g / k, total)


def _split_rows(where, x, k):
    x = jnp.asarray(x)
    if x.ndim == 0 or x.shape[0] % k:
        size = x.shape[0] if x.ndim else "a scalar"
        raise ValueError(
            f"{where}: microbatches={k} must divide the batch's leading size, got "
            f"{size} (a batch of {size} cannot be cut into {k} equal micro-batches). "
            f"Use a batch size that is a multiple of {k}, or another microbatches."
        )
    return _mesh.split_leading(x, k)


def _check_micro_leaves(batch, k):
    """Every batch leaf has one leading (batch) axis of one size that ``k`` divides, named
    by its path when not: leaves of other sizes would be cut into mismatched rows."""
    first = None
    for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
        # keystr: "['x']", or "" when the batch is one array
        where, shape = jax.tree_util.keystr(tuple(path)), tuple(jnp.shape(x))
        if not shape:
            raise ValueError(
                f"make_train_step: microbatches={k} cuts every batch leaf along "
                f"its leading (batch) axis, but batch{where} is a scalar (shape "
                f"()). Give it a batch axis (one value per example), or pass "
                f"constants through the loss_fn (a closure), not the batch."
            )
        if shape[0] % k:
            raise ValueError(
                f"make_train_step: microbatches={k} must divide the batch's leading "
                f"size, got {shape[0]} for batch{where} of shape {shape} (a batch "
                f"of {shape[0]} cannot be cut into {k} equal micro-batches). Use a "
                f"batch size that is a multiple of {k}, or another microbatches."
            )
        if first is not None and shape[0] != first[1][0]:
            raise ValueError(
                f"make_train_step: with microbatches={k} every batch leaf needs the "
                f"same leading (batch) size, got batch{first[0]} of shape "
                f"{first[1]} and batch{where} of shape {shape}; cut apart, their "
                f"rows would no longer match. Give every leaf one row per example."
            )
        first = first or (where, shape)


def _checked_options(clip_grad_norm, microbatches, ema_decay, grad_norm):
    """``make_train_step``'s options checked: ``(clip_grad_norm, k, ema_decay,
    report_norm)``, ``k`` the micro-batch count and ``report_norm`` whether the metrics
    hold ``grad_norm``."""
    where = "make_train_step"
    if clip_grad_norm is not None:
        clip_grad_norm = checks.real(where, "clip_grad_norm", clip_grad_norm)
        if not clip_grad_norm > 0:
            raise checks.ArgumentError(
                f"{where}: clip_grad_norm={clip_grad_norm!r} must be > 0 "
                f"(the largest global gradient norm let through), or "
                f"None for no clipping."
            )
    k = 1 if microbatches is None else checks.positive_int(where, "microbatches", microbatches)
    report_norm = clip_grad_norm is not None if grad_norm is None else checks.flag(where, "grad_norm", grad_norm)
    if ema_decay is not None:
        ema_decay = checks.real(where, "ema_decay", ema_decay)
        if not 0.0 < ema_decay < 1.0:
            raise checks.ArgumentError(
                f"{where}: ema_decay={ema_decay!r} must be in (0, 1), e.g. 0.999 (the weight of the old average)."
            )
    return clip_grad_norm, k, ema_decay, report_norm


_EMA_STARTS = ("first_update", "init", "zeros_debiased")


def _checked_ema_start(ema_start, ema_decay) -> str:
    """``make_train_step``'s ``ema_start``: one of :data:`_EMA_STARTS`, and only with an
    ``ema_decay`` (without one no average is kept, so a start would be silently ignored)."""
    checks.one_of("make_train_step", "ema_start", ema_start, _EMA_STARTS)
    if ema_decay is None and ema_start != "first_update":
        raise checks.ArgumentError(
            f"make_train_step: ema_start={ema_start!r} is given without ema_decay, so the "
            f"step keeps no moving average for it to start. Add ema_decay=, e.g. 0.999 (and "
            f"create the state with TrainState.create(..., ema=True)), or drop ema_start."
        )
    return ema_start


def _check_state_fits(train_state, has_loss_state, takes_loss_state, loss_fn, ema_decay):
    """The step's options against what the TrainState holds (at trace time)."""
    if has_loss_state and not takes_loss_state:
        raise TypeError(
            f"make_train_step: the TrainState holds loss state, but "
            f"{_fn_name(loss_fn)} has no loss_state parameter, so it could "
            f"neither read nor return it. Define it as loss_fn(params, state, "
            f"batch, rng, loss_state) and return Aux(..., loss_state=new)."
        )
    if ema_decay is not None and not isinstance(train_state.ema, EMA):
        raise ValueError(
            "make_train_step: ema_decay is set but the TrainState keeps no "
            "EMA; create it with TrainState.create(..., ema=True)."
        )


def _clip_and_report_norm(grads, metrics, clip_grad_norm, report_norm):
    """torch's ``clip_grad_norm_`` rule, ``g * min(1, max_norm / (n + 1e-6))``, and
    ``metrics["grad_norm"] = n`` (right after ``"loss"``) when reported. The norm is
    computed only when one of them needs it: on XLA:CPU it is a pass of its own."""
    if not report_norm and clip_grad_norm is None:
        return grads, metrics
    norm = _global_norm(grads)
    if report_norm:
        metrics = {"loss": metrics["loss"], "grad_norm": norm, **{n: v for n, v in metrics.items() if n != "loss"}}
    if clip_grad_norm is not None:
        scale = jnp.minimum(1.0, clip_grad_norm / (norm + 1e-6))
        grads = jax.tree.map(lambda g: g * scale.astype(g.dtype), grads)
    return grads, metrics


def _global_norm(grads):
    """The 2-norm of all gradients together (torch's ``clip_grad_norm_`` total norm)."""
    leaves = jax.tree.leaves(grads)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.promote_types(g.dtype, jnp.float32)))) for g in leaves))


def _ema_update(average, params, decay, start="first_update"):
    """One :class:`EMA` update, the formula ``start`` (``make_train_step``'s ``ema_start``)
    picks."""
    if start == "init":
        new = jax.tree.map(lambda e, p: (e + (1.0 - decay) * (p - e)).astype(e.dtype), average.params, params)
        return EMA(new, average.count + 1)
    if start == "zeros_debiased":
        # optax's debiased ema, z_t / (1 - decay^t), kept corrected: z_{t-1} = d_{t-1} *
        # (1 - decay^(t-1)) gives d_t = d_{t-1} + (1 - decay) / (1 - decay^t) * (p - d_{t-1})
        t = (average.count + 1).astype(jnp.float32)
        weight = (1.0 - decay) / (1.0 - jnp.power(jnp.float32(decay), t))
        new = jax.tree.map(lambda e, p: (e + weight.astype(e.dtype) * (p - e)).astype(e.dtype), average.params, params)
        return EMA(new, average.count + 1)
    first = average.count == 0
    new = jax.tree.map(
        lambda e, p: jnp.where(first, p, e + (1.0 - decay) * (p - e)).astype(e.dtype), average.params, params
    )
    return EMA(new, average.count + 1)


def _checked_aux(aux, has_loss_state) -> Aux:
    aux = _as_aux(aux, "make_train_step")
    if has_loss_state and _is_empty(aux.loss_state):
        raise ValueError(
            "make_train_step: the TrainState holds loss state but loss_fn "
            "returned Aux without loss_state; return the updated value, "
            "e.g. Aux(state=new_state, loss_state=new_centers)."
        )
    if "loss" in aux.metrics:
        raise ValueError(
            "make_train_step: Aux.metrics may not contain 'loss'; the step "
            "reports the loss_fn's value under that name. Rename the metric."
        )
    return aux


class _Updater(NamedTuple):
    """Which params a step differentiates, and how it updates them."""

    select: Callable  # train_state -> the trained params (what value_and_grad sees)
    merge: Callable  # (all params, trained params) -> the params loss_fn sees
    apply: Callable  # (grads, train_state, loss) -> (new params, new opt_state)


def _updater(optimizer, update) -> _Updater:
    if not isinstance(optimizer, dict) and update is None:

        def apply(grads, ts, loss):
            _check_joint_opt_state(optimizer, ts)
            _check_opt_state("opt_state", optimizer, ts.opt_state, ts.params)
            updates, opt_state = optimizer.update(grads, ts.opt_state, ts.params, **_extra_args(optimizer, loss))
            return optax.apply_updates(ts.params, updates), opt_state

        return _Updater(lambda ts: ts.params, lambda params, trained: trained, apply)
    names = _update_names(optimizer, update)
    opts = optimizer if isinstance(optimizer, dict) else dict.fromkeys(names, optimizer)

    def select(ts):
        _check_model_names("make_train_step", "update", names, ts.params)
        if not (isinstance(ts.opt_state, dict) and set(names) <= set(ts.opt_state)):
            raise ValueError(
                f"make_train_step: update={list(names)} needs one optimizer state "
                f"per model, but the TrainState's opt_state is one joint state. "
                f"Create it with a dict of optimizers, e.g. "
                f"TrainState.create(models, {{{names[0]!r}: optimizer, ...}}, rng)."
            )
        return {name: ts.params[name] for name in names}

    def apply(grads, ts, loss):
        params, opt_state = dict(ts.params), dict(ts.opt_state)
        for name in names:
            _check_opt_state(f"opt_state[{name!r}]", opts[name], ts.opt_state[name], ts.params[name])
            updates, opt_state[name] = opts[name].update(
                grads[name], ts.opt_state[name], ts.params[name], **_extra_args(opts[name], loss)
            )
            params[name] = optax.apply_updates(ts.params[name], updates)
        return params, opt_state

    return _Updater(select, lambda params, trained: {**params, **trained}, apply)


def _extra_args(optimizer, loss) -> dict:
    """``value=loss`` for optimizers that take extra arguments (a plateau schedule
    reads it); nothing for plain ``GradientTransformation``s, which would refuse it."""
    return {"value": loss} if isinstance(optimizer, optax.GradientTransformationExtraArgs) else {}


def _check_joint_opt_state(optimizer, ts) -> None:
    """A per-model opt_state stepped with one optimizer: say so instead of optax's tree error."""
    keyed_by_model = (
        isinstance(ts.opt_state, dict)
        and isinstance(ts.params, dict)
        and ts.opt_state
        and set(ts.opt_state) <= set(ts.params)
    )
    if keyed_by_model and (
        jax.tree.structure(ts.opt_state) != jax.tree.structure(jax.eval_shape(optimizer.init, ts.params))
    ):
        raise ValueError(
            f"make_train_step: the TrainState keeps one optimizer state per model "
            f"({sorted(ts.opt_state)}), but the step was built with one optimizer "
            f"for the whole params. Build it with the dict of optimizers the state "
            f"was created with, make_train_step(loss_fn, {{name: optimizer, ...}}), "
            f"optionally with update=name."
        )


def _check_opt_state(what: str, optimizer, opt_state, params) -> None:
    """An opt_state made by another optimizer fails inside optax with messages about its
    internals (a missing ``.trace``, "number of updates and states"): compare structures
    first. ``eval_shape`` of the init builds nothing, and this runs at trace time."""
    want = jax.eval_shape(optimizer.init, params)
    if jax.tree.structure(opt_state) == jax.tree.structure(want):
        return
    raise ValueError(
        f"make_train_step: the TrainState's {what} was made by another optimizer: "
        f"it holds {_state_kinds(opt_state)}, this optimizer's init gives "
        f"{_state_kinds(want)}. Step it with the same optimizer it was created "
        f"with (TrainState.create(..., optimizer, ...)), or start this optimizer "
        f"afresh: ts._replace(opt_state=optimizer.init(ts.params))."
    )


def _state_kinds(tree, limit: int = 200) -> str:
    """An optimizer state by the names of its parts: ``(ScaleByAdamState, EmptyState)``."""

    def show(t):
        if hasattr(t, "_fields"):
            return type(t).__name__
        if isinstance(t, (tuple, list)):
            return "(" + ", ".join(show(v) for v in t) + ")"
        if isinstance(t, dict):
            return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in sorted(t.items())) + "}"
        return type(t).__name__

    text = show(tree)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _update_names(optimizer, update) -> tuple:
    if update is None:
        return tuple(optimizer)
    names = (update,) if isinstance(update, str) else tuple(update)
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"make_train_step: update must be a model name or a sequence of model names, got {update!r}.")
    if isinstance(optimizer, dict) and set(names) - set(optimizer):
        raise ValueError(
            f"make_train_step: update={list(names)} names models without an "
            f"optimizer: {sorted(set(names) - set(optimizer))}; the optimizers are "
            f"for {sorted(optimizer)}. Add an optimizer for them, or update only "
            f"those models."
        )
    return names


def _check_loss_output(out, loss_fn):
    if not (isinstance(out, tuple) and len(out) == 2):
        if isinstance(out, tuple):
            got = f"a tuple of {len(out)}"
        elif hasattr(out, "shape"):  # a traced array's type name (LinearizeTracer) says nothing
            got = f"an array of shape {tuple(out.shape)} alone (the loss without its Aux?)"
        else:
            got = type(out).__name__
        raise TypeError(
            f"make_train_step: {_fn_name(loss_fn)} must return (loss, Aux(...)), got "
            f"{got}. A loss without layer state returns: loss, Aux(state=state)."
        )
    loss = out[0]
    if jnp.ndim(loss) != 0:
        raise TypeError(
            f"make_train_step: {_fn_name(loss_fn)} returned a loss of shape "
            f"{jnp.shape(loss)}; it must be a scalar (reduce it, e.g. .mean())."
        )
    if not jnp.issubdtype(jnp.result_type(loss), jnp.floating):
        # jax.grad refuses integer outputs with a message about the dtype alone.
        raise TypeError(
            f"make_train_step: {_fn_name(loss_fn)} returned a loss of dtype "
            f"{jnp.result_type(loss)}; it must be floating to be differentiated "
            f"(an argmax/count instead of a loss? compute it from the float "
            f"outputs, or cast: loss.astype(jnp.float32))."
        )
    return out


def _takes_loss_state(loss_fn) -> bool:
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return False
    return any(p.name == "loss_state" and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD for p in params)


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
    return jax.tree.map(lambda g: jax.lax.pmean(g, axis_name) if _varies(g, axis_name) else g / size, grads)


def _varies(x, axis_name) -> bool:
    mat = getattr(jax.typeof(x), "manual_axis_type", None)  # JAX 0.10; older: .vma
    varying = mat.varying if mat is not None else getattr(jax.typeof(x), "vma", frozenset())
    return axis_name in varying


def _pmean_floating(tree, axis_name):
    return jax.tree.map(lambda x: jax.lax.pmean(x, axis_name) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def make_eval_step(metric_fn: Callable, *, axis_name: Optional[str] = None, ema: bool = False) -> Callable:
    """Builds ``eval_step(train_state, batch) -> metric_state``.

    ``metric_fn(params, state, batch)`` returns the metric state of one batch (e.g.
    ``metric.update(metric.init(), logits, labels)`` for a ``funcnet.metrics``
    metric). States are sums and counts, so batches combine by adding them; under
    ``axis_name`` the step ``psum``-s them so every device holds the global value.
    ``ema=True`` evaluates the params' moving average (``train_state.ema.params``)
    with the live layer state.

    Examples:
      >>> from funcnet import metrics
      >>> from funcnet.layers import Dense
      >>> net, acc = Dense(2), metrics.Accuracy()
      >>> def metric_fn(params, state, batch):
      ...     logits, _ = net.apply(params, state, batch["x"])
      ...     return acc.update(acc.init(), logits, batch["y"])
      >>> ts = TrainState.create(net, optax.sgd(0.1), jax.random.key(0), (-1, 3))
      >>> total = make_eval_step(metric_fn)(ts, {"x": jnp.ones((4, 3)), "y": jnp.zeros(4, int)})
      >>> 0.0 <= float(acc.compute(total)) <= 1.0
      True
    """
    ema = checks.flag("make_eval_step", "ema", ema)

    def eval_step(train_state: TrainState, batch):
        params = train_state.params
        if ema:
            if not isinstance(train_state.ema, EMA):
                raise ValueError(
                    "make_eval_step: ema=True but the TrainState keeps no EMA; "
                    "create it with TrainState.create(..., ema=True) and train "
                    "with make_train_step(..., ema_decay=...)."
                )
            params = train_state.ema.params
        out = metric_fn(params, train_state.state, batch)
        return metrics_lib.merge(out, axis_name) if axis_name is not None else out

    return eval_step


# --------------------------------------------------------------------------- #
# Target networks
# --------------------------------------------------------------------------- #


def copy_params(train_state: TrainState, src: str, dst: str) -> TrainState:
    """``train_state`` with model ``dst`` set to a copy of model ``src``: params and layer state.

    The hard target-network update of DQN, PyTorch's
    ``target.load_state_dict(online.state_dict())`` (which copies buffers, i.e.
    BatchNorm statistics, too). ``dst``'s optimizer state, if it has one, is left
    as it is. The copies are new arrays, so the result can be donated to a jitted
    step (one buffer may not be donated twice). Pure: jit it or call it eagerly.

    Args:
      train_state: a :class:`TrainState` of several models (created from a dict).
      src: the model copied from (the online network).
      dst: the model copied onto (the target network).

    Returns:
      The new :class:`TrainState`; ``train_state`` itself is unchanged.

    Raises:
      ValueError: ``src`` or ``dst`` is not a model of the state, or their params
        differ in structure or shapes.

    Examples:
      >>> from funcnet.layers import Dense
      >>> models = {"online": (Dense(2), (-1, 3)), "target": (Dense(2), (-1, 3))}
      >>> ts = TrainState.create(models, {"online": optax.sgd(0.1)}, jax.random.key(0))
      >>> bool(jnp.array_equal(ts.params["online"]["W"], ts.params["target"]["W"]))
      False
      >>> ts = copy_params(ts, "online", "target")
      >>> bool(jnp.array_equal(ts.params["online"]["W"], ts.params["target"]["W"]))
      True
    """
    _check_pair("copy_params", train_state, src, dst)
    params = {**train_state.params, dst: jax.tree.map(jnp.copy, train_state.params[src])}
    state = train_state.state
    if isinstance(state, dict) and src in state and dst in state:
        state = {**state, dst: jax.tree.map(jnp.copy, state[src])}
    return train_state._replace(params=params, state=state)


def polyak_update(train_state: TrainState, src: str, dst: str, tau: Union[float, jax.Array]) -> TrainState:
    """``train_state`` with ``params[dst] = tau * params[src] + (1 - tau) * params[dst]``.

    The soft target update of DDPG/SAC/DQN variants (Stable-Baselines3's
    ``polyak_update(params, target_params, tau)``), computed by
    ``optax.incremental_update``. ``tau=1`` copies, ``tau=0`` keeps ``dst``. Only
    params are averaged: ``dst``'s layer state (BatchNorm statistics) stays; copy
    it with :func:`copy_params` when it should follow. ``tau`` may be traced.

    Args:
      train_state: a :class:`TrainState` of several models (created from a dict).
      src: the model mixed in (the online network).
      dst: the model updated (the target network).
      tau: the fraction of ``src`` mixed in, in ``[0, 1]`` (e.g. 0.005).

    Returns:
      The new :class:`TrainState`; ``train_state`` itself is unchanged.

    Raises:
      TypeError: ``tau`` is a string.
      ValueError: a concrete ``tau`` outside ``[0, 1]``; ``src`` or ``dst`` is not a
        model of the state, or their params differ in structure or shapes.

    Examples:
      >>> from funcnet.layers import Dense
      >>> models = {"online": (Dense(2), (-1, 3)), "target": (Dense(2), (-1, 3))}
      >>> ts = TrainState.create(models, {"online": optax.sgd(0.1)}, jax.random.key(0))
      >>> new = polyak_update(ts, "online", "target", tau=0.5)
      >>> want = (ts.params["online"]["W"] + ts.params["target"]["W"]) / 2
      >>> bool(jnp.allclose(new.params["target"]["W"], want))
      True
      >>> polyak_update(ts, "online", "target", tau=2.0)
      Traceback (most recent call last):
      ...
      ValueError: polyak_update: tau must be in [0, 1] ...
    """
    _check_pair("polyak_update", train_state, src, dst)
    if isinstance(tau, (str, bytes)):
        raise TypeError(
            f"polyak_update: tau must be a number in [0, 1] (e.g. tau=0.005), got "
            f"the string {tau!r}; pass float({tau!r})."
        )
    value = checks.concrete(tau)
    if value is not None and (value.size != 1 or not 0.0 <= float(value) <= 1.0):
        # Outside [0, 1] optax extrapolates past src or away from it without a word.
        raise ValueError(
            f"polyak_update: tau must be in [0, 1] (the fraction of {src!r} mixed "
            f"into {dst!r}; 1 copies, 0 keeps), got {tau!r}. Typical soft updates "
            f"use tau=0.005."
        )
    averaged = optax.incremental_update(train_state.params[src], train_state.params[dst], tau)
    return train_state._replace(params={**train_state.params, dst: averaged})


def _check_pair(where, train_state, src, dst):
    _check_model_names(where, "src/dst", (src, dst), train_state.params)
    if jax.tree.structure(train_state.params[src]) != jax.tree.structure(train_state.params[dst]):
        raise ValueError(
            f"{where}: models {src!r} and {dst!r} have differently structured "
            f"params, so one cannot be copied onto the other. Build both from "
            f"the same layer and input shape."
        )
    pairs = zip(
        jax.tree_util.tree_flatten_with_path(train_state.params[src])[0], jax.tree.leaves(train_state.params[dst])
    )
    for (path, a), b in pairs:
        if jnp.shape(a) != jnp.shape(b):
            raise ValueError(
                f"{where}: models {src!r} and {dst!r} are different architectures: "
                f"params{jax.tree_util.keystr(tuple(path))} has shape {jnp.shape(a)} "
                f"in {src!r} but {jnp.shape(b)} in {dst!r}, so {dst!r}'s layer could "
                f"not use the copy. Build both from the same layer and input shape."
            )
