"""Where the steps run: the placement that holds the train state, and the compiled steps.

Three placements, one class each with the same small interface (``_OneDevice``'s):
one device (``jax.jit``), ``n`` local devices (``_Replicas``: ``jax.pmap``,
the deprecated ``fit(devices=n)``), or a mesh (``_OnMesh``: ``jax.jit`` over inputs sharded on it,
``fit(mesh=)``). A placement holds the state between steps, puts batches where the
step reads them, compiles the step and reads results back; ``_compile`` asks it for
the steps, with ``funcnet.xla``'s compiler options. What the steps read is the data
source's side (``_sources``): a source places itself on a placement, asking it only
``gathers_device_data``, ``stacks_host_batches`` and ``mesh``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from funcnet import _checks as checks
from funcnet import data as data_lib
from funcnet import distributed
from funcnet import sharding
from funcnet import xla
from funcnet.loop._race import Raced
from funcnet.loop._rows import StepRows
from funcnet.train import make_eval_step, make_train_step

__all__: list = []


class _OneDevice:
    """A placement: where the train state lives between steps and where batches go.

    This one (and the base of the others): the default device, ``jax.jit`` steps. Each
    placement answers the same questions, so the epoch loop never asks which it has:
    ``hold`` the state, ``replace``/``host_state`` it, ``put_batch``/``put_order`` the
    inputs, ``compile`` and ``wrap`` a step, and read results back (``first``,
    ``fetched``). A new placement is one subclass.

    Attributes:
      axis_name: the step's collective axis (pmap), else None.
      gathers_device_data: a :class:`funcnet.data.DeviceData` is gathered inside the step
        (several steps per dispatch); else iterated as a host pipeline.
      stacks_host_batches: a host pipeline of :func:`funcnet.data.batches` may run several
        steps per dispatch (pmap and mesh placements split each batch on the host).
      multi: several devices take part in each step.
      races: fit may compile a train step both with XLA's loop fusions split over the
        cores and unsplit, and keep the faster (``_race.Raced``): one device only.
    """

    axis_name: Optional[str] = None
    gathers_device_data = True
    stacks_host_batches = True
    races = True
    n: Optional[int] = None  # pmap replicas
    mesh = None

    @property
    def multi(self) -> bool:
        return False

    def hold(self, train_state, prefetch: int):
        """Places ``train_state`` (a copy: the step donates its input buffers, and the
        caller's state stays alive); returns this placement, which holds it as ``state``."""
        self.prefetch = prefetch
        self.state = self._placed(train_state)
        # At most two multi-device steps in flight on CPU, where many queued executions
        # can stall XLA:CPU's collectives (distributed.InFlight says what happens).
        self.throttle = self.multi and jax.local_devices()[0].platform == "cpu"
        return self

    def _placed(self, train_state):
        return jax.tree.map(jnp.copy, train_state)

    def replace(self, train_state):
        self.state = jax.tree.map(jnp.copy, train_state)

    def host_state(self):
        # A copy: the next step donates self.state's buffers, and a callback may keep this.
        # One compiled copy of the whole tree, not a dispatch per leaf: ~0.1 ms a leaf on
        # CPU, which a callback reading ctx.train_state every epoch would pay each time.
        return _copied(self.state)

    def put_batch(self, batch):
        # jit would store int64 values int32 cannot hold (x64 off) wrapped, without a
        # word; shard and shard_batch check the same on the other two placements.
        checks.fits_x32("fit", batch)
        return batch

    def _thread_put(self):
        # The copy starts in the thread on an accelerator, where device_put is an
        # asynchronous DMA. Not on CPU: there device_put costs ~150 us of Python per
        # batch (GIL held), several times the copy jit makes of a NumPy argument.
        return _checked_device_put if jax.default_backend() != "cpu" else None

    def host_batches(self, batches, convert=None):
        """A context manager over an epoch's batches (an iterable) from a host pipeline:
        assembled ``prefetch`` ahead in a background thread
        (:func:`funcnet.data.background`), on one device also copied there
        (``device_put``), so both overlap with the steps. ``prefetch=0``: iterated
        here, one at a time. ``convert`` (``_sources._converter``) is applied to each batch
        first, in the thread when there is one."""
        if not self.prefetch:
            batches = iter(batches)
            return contextlib.nullcontext(batches if convert is None else map(convert, batches))
        put = self._thread_put()
        if convert is not None:
            put = convert if put is None else (lambda batch: _checked_device_put(convert(batch)))
        return data_lib.background(batches, self.prefetch, transform=put)

    def put_order(self, order):
        """An epoch's index matrix (or the last batch's indices) where the step runs."""
        return jax.device_put(order)

    def first(self, tree):
        """One replica's value of a per-device result (the value itself on one device)."""
        return tree

    def fetched(self, step_metrics: list) -> StepRows:
        """An epoch's per-step metrics (a list of per-step dicts), read back stacked
        (one device or a mesh, whose metrics are global arrays)."""
        return _fetch_stacked(step_metrics)

    def state_shardings(self):
        """The train state's layout a step keeps (a mesh's), else None."""
        return None

    def compile(self, fn, jit, donate: bool):
        """``fn`` (a train or eval step) compiled for this placement by ``jit``."""
        return jit(fn, donate_argnums=0) if donate else jit(fn)

    def wrap(self, fn):
        """A compiled step as the epoch loop calls it (on a mesh: with the mesh set)."""
        return fn


class _Replicas(_OneDevice):
    """``n`` local devices (the deprecated ``fit(devices=n)``): the state replicated, ``jax.pmap`` steps,
    every batch split over the devices on the host."""

    axis_name = "batch"
    gathers_device_data = False
    stacks_host_batches = False
    races = False

    def __init__(self, n: int):
        self.n = n

    @property
    def multi(self) -> bool:
        return True

    def _placed(self, train_state):
        return distributed.replicate(train_state, self.n)

    def replace(self, train_state):
        self.state = distributed.replicate(train_state, self.n)

    def host_state(self):
        return distributed.unreplicate(self.state)

    def put_batch(self, batch):
        return distributed.shard(batch, self.n)

    def _thread_put(self):
        return None  # split on this thread (put_batch)

    def first(self, tree):
        return jax.tree.map(lambda x: x[0], tree)

    def fetched(self, step_metrics: list) -> StepRows:
        # pmap's results lie one row per device: a jit stack would gather them onto one
        # device first. Read per entry; this placement is deprecated (use a mesh).
        return StepRows.of(jax.device_get(step_metrics))

    def compile(self, fn, jit, donate: bool):
        if donate:
            return jax.pmap(fn, axis_name=self.axis_name, donate_argnums=0)
        return jax.pmap(fn, axis_name=self.axis_name)


class _OnMesh(_OneDevice):
    """A mesh (``fit(mesh=)``): the state as given when it already lies on the mesh
    (sharded by :func:`funcnet.sharding.shard_params`), else whole on every device;
    each batch split over the data axis; the one-device steps, which the inputs'
    shardings make XLA partition, run with the mesh set (``jax.set_mesh``)."""

    stacks_host_batches = False
    races = False

    def __init__(self, mesh):
        self.mesh = mesh

    @property
    def multi(self) -> bool:
        return self.mesh.size > 1

    def _placed(self, train_state):
        if _lies_on(train_state, self.mesh):
            return _copy_placed(train_state)
        return distributed.replicate_on(self.mesh, train_state)

    def replace(self, train_state):
        self.state = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=sharding.state_shardings(self.state))(
            train_state
        )

    def put_batch(self, batch):
        return distributed.shard_batch(self.mesh, batch)

    def _thread_put(self):
        return None  # on this thread (put_batch): it may read the thread's jax.set_mesh

    def put_order(self, order):
        """Whole on every device of the mesh, where each device picks the rows it holds."""
        # Every process computes the same order and places its own devices' copies.
        whole = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_callback(order.shape, whole, lambda index: order[index])

    def state_shardings(self):
        return sharding.state_shardings(self.state)

    def wrap(self, fn):
        return _on_mesh(self.mesh, fn)


def _placement(devices, mesh) -> _OneDevice:
    """``fit(devices=, mesh=)``: the placement, still without a state (``hold``)."""
    if mesh is not None and devices is not None:
        raise ValueError(f"fit: give either devices={devices!r} (pmap) or mesh= (jit over a mesh), not both.")
    n = distributed.local_device_count(devices) if devices else None
    if n:
        return _Replicas(n)
    return _OneDevice() if mesh is None else _OnMesh(mesh)


def _checked_device_put(batch):
    """``jax.device_put`` of a host batch after the int32 check ``put_batch`` makes:
    device_put would wrap the values as silently as jit."""
    checks.fits_x32("fit", batch)
    return jax.device_put(batch)


def _lies_on(tree, mesh) -> bool:
    """Whether every array of ``tree`` is placed on ``mesh`` (a NamedSharding over it)."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(
        isinstance(x, jax.Array)
        and isinstance(x.sharding, jax.sharding.NamedSharding)
        and x.sharding.mesh.devices.shape == mesh.devices.shape
        and (x.sharding.mesh.devices == mesh.devices).all()
        and x.sharding.mesh.axis_names == mesh.axis_names
        for x in leaves
    )


@jax.jit
def _copied(tree):
    """A copy of ``tree`` (new buffers, as ``jnp.copy`` of each leaf makes) in one dispatch."""
    return jax.tree.map(jnp.copy, tree)


def _copy_placed(tree):
    """A copy of ``tree`` with the same shardings (new buffers a donating step may
    consume); each process copies its own shards."""
    return jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=sharding.state_shardings(tree))(tree)


class _Steps(NamedTuple):
    train: Callable
    eval: Optional[Callable]
    add: Callable
    on_device: Optional[Callable] = None  # up to k steps over a DeviceData, one dispatch
    on_device_one: Optional[Callable] = None  # one step over given rows (the last, smaller batch)
    steps_per_dispatch: int = 1
    on_stacked: Optional[Callable] = None  # up to k steps over k stacked host batches
    several_asked: bool = False  # steps_per_dispatch > 1 given explicitly
    dispatch_bound: int = 1  # the most steps on_device runs in one dispatch (>= k)


def _compile(
    loss_fn,
    optimizer,
    eval_fn,
    placement,
    take,
    step_options,
    steps_per_dispatch,
    eval_on_ema=False,
    several_asked=False,
    compiler_options=None,
    dispatch_bound=None,
    race_steps=None,
) -> _Steps:
    """The train and eval steps, compiled by ``placement`` (``jax.jit`` on one device or a
    mesh, ``jax.pmap`` over replicas).

    On a mesh the steps are the one-device steps: their inputs' shardings make XLA
    partition them and insert the all-reduces, and they run with the mesh set
    (``jax.set_mesh``) so that arrays they create land on it too. ``take`` (a
    :meth:`funcnet.data.DeviceData.take_ordered`) adds the steps that gather their batches
    from a data set on the device. The placement's ``state_shardings`` (on a mesh)
    keeps the train state's layout from step to step: on Auto mesh axes the compiler
    would otherwise choose the outputs' layout, e.g. gather a sharded parameter whole.
    ``compiler_options``: XLA's options for the jitted steps (None: none, plain ``jax.jit``).
    ``dispatch_bound``: the most steps the device loop over a ``DeviceData`` may run in
    one dispatch (default ``steps_per_dispatch``); its program is the same for any count
    up to it.
    ``race_steps``: the steps the run has left, where fit may choose between XLA's loop
    fusions split over the cores and unsplit (:func:`funcnet.xla.unsplit_fusions`) by
    timing both (``_race.Raced``; one device only, whose programs compute the same bits
    either way); None: XLA's default.
    """
    bound = dispatch_bound or steps_per_dispatch
    axis = placement.axis_name
    jit = functools.partial(xla.jit, options=dict(compiler_options or {}))
    step = make_train_step(loss_fn, optimizer, axis_name=axis, **(step_options or {}))
    state_shardings = placement.state_shardings()

    def raw_step(state, batch):
        # fit consumes metrics only; Aux(outputs=...) arrays are for hand-written loops.
        state, metrics = step(state, batch)[:2]
        if state_shardings is not None:
            state = jax.lax.with_sharding_constraint(state, state_shardings)
        return state, metrics

    # Where fit races: XLA:CPU's loop fusions unsplit, compiled from the default's own
    # lowering (the same trace, so the same program but for that pass).
    unsplit = xla.unsplit_fusions() if race_steps and placement.races else None

    def raced(fn, steps_of):
        """``fn`` (jitted); where fit races, it raced against its unsplit compilation."""
        if unsplit is None:
            return fn
        return Raced(fn, functools.partial(_unsplit_prospect, fn, unsplit), steps_of, race_steps, ("split", "unsplit"))

    train = placement.compile(raw_step, jit, donate=True)
    evaluate = None
    if eval_fn is not None:
        raw_eval = make_eval_step(eval_fn, axis_name=axis, ema=eval_on_ema)
        evaluate = placement.compile(raw_eval, jit, donate=False)
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
    on_device = on_device_one = on_stacked = None
    if take is not None and placement.gathers_device_data:
        on_device, on_device_one = _device_steps(raw_step, take, bound, jit)
        # the dispatch program of every step but an epoch's last, smaller batch; only a
        # DeviceData knows its steps ahead (race_steps), so only this program races
        on_device = raced(on_device, _steps_of if bound > 1 else _one)
    elif placement.stacks_host_batches and steps_per_dispatch > 1:
        on_stacked = _device_steps(raw_step, _take_stacked, steps_per_dispatch, jit)[0]
    train, evaluate, add, on_device, on_device_one = (
        None if f is None else placement.wrap(f) for f in (train, evaluate, add, on_device, on_device_one)
    )
    return _Steps(train, evaluate, add, on_device, on_device_one, steps_per_dispatch, on_stacked, several_asked, bound)


# fit races split against unsplit only where no loop fusion XLA:CPU splits is larger:
# above it the halves have paid for their hand-off in every program measured (the
# 784-400-100-10 MLP's 1.25 MB weight update: its epoch 1.13x slower unsplit; the CNNs'
# and the GPT's activations, 1.06-1.31x), at or below it the race decides (784-64-10:
# 0.65x on jax 0.12, its largest 200 KB).
SPLIT_BYTES = 1 << 19


def _unsplit_prospect(fn, unsplit: dict, args):
    """``Raced``'s prospect for ``fn`` called on ``args``: XLA's program compiled (which
    the call then runs), and ``(build, None)``, ``build()`` compiling it under ``unsplit``
    from the same lowering, where its split fusions are all at most ``SPLIT_BYTES``;
    else ``(None, why not)``."""
    lowered = fn.lower(*args)
    split = xla.split_fusions(lowered.compile())
    if not split:
        return None, "XLA:CPU splits none of its loop fusions"
    name, size = max(split.items(), key=lambda kv: kv[1])
    if size > SPLIT_BYTES:
        return None, f"XLA:CPU splits a loop fusion of {size:,} bytes ({name}), too large to keep whole"
    return (lambda: lowered.compile(unsplit)), None


def _steps_of(args) -> int:
    """The steps one call of the device loop runs: its ``n`` (``_device_steps``)."""
    return int(args[4])


def _one(args) -> int:
    return 1


def _take_stacked(arrays, j):
    """Batch ``j`` of stacked batches (``Batches.stacked``), inside the jitted loop."""
    return jax.tree.map(lambda a: a[j], arrays)


def _device_steps(raw_step, take, k: int, jit=jax.jit):
    """The steps over a data set on the device, jitted (by ``jit``), donating the train state.

    ``several(state, arrays, order, pos, n) -> (state, metrics)`` runs ``n <= k`` steps
    in one dispatch, step ``j`` on the batch ``take(arrays, order[pos + j])``;
    ``metrics`` holds ``k`` rows, the first ``n`` written. ``n`` is traced (a
    ``fori_loop``), so every dispatch runs the same compiled program whatever its
    length, and a resumed run computes exactly what the uninterrupted one did. For
    ``k == 1`` it is ``several(state, arrays, order, pos)``: one step, no loop, and the
    step's own metrics (a row each would be a device array per metric and step, each
    read back on its own: ~40 us of host time a step on CPU, at the epoch's end).
    ``one(state, arrays, idx)`` is one step on the rows ``idx`` (the last, smaller batch).
    """

    def one(state, arrays, idx):
        return raw_step(state, take(arrays, idx))

    def single(state, arrays, order, pos):
        return one(state, arrays, order[pos])

    # The loop's metric rows need the step's output shapes before the loop traces its
    # body; one jitted function serves both, so jax traces the step once (its trace
    # cache), not twice: a second or more of fit's start on a GPT. The program XLA
    # compiles is the same (the nested call is inlined; tests compare the bits).
    traced_once = jax.jit(one)

    def several(state, arrays, order, pos, n):
        metric_shapes = jax.eval_shape(traced_once, state, arrays, order[0])[1]
        rows = jax.tree.map(lambda m: jnp.zeros((k, *m.shape), m.dtype), metric_shapes)

        def body(j, carry):
            state, rows = carry
            state, metrics = traced_once(state, arrays, order[pos + j])
            return state, jax.tree.map(lambda r, m: r.at[j].set(m), rows, metrics)

        return jax.lax.fori_loop(0, n, body, (state, rows))

    return (jit(single if k == 1 else several, donate_argnums=0), jit(one, donate_argnums=0))


def _on_mesh(mesh, fn):
    def run(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return run


_FETCH_GROUP = 64


@jax.jit
def _stack_metrics(group):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *group)


def _fetch_stacked(step_metrics: list) -> StepRows:
    """``jax.device_get(step_metrics)`` (a list of per-step metric dicts on one device,
    or global arrays on a mesh) in one transfer per group of ``_FETCH_GROUP`` steps,
    stacked where the metrics lie: on CPU a transfer costs ~70 us of host time on one
    device (~9 us a replicated scalar on a 4-device mesh), once per scalar, which was
    the larger part of the host pipeline's per-step cost. The values are the same (a
    stack is exact); the last group is padded with its last entry, so one compiled
    stack serves all. On a mesh every process runs the same stacks in the same order,
    as it runs the steps."""
    chunks = []
    for start in range(0, len(step_metrics), _FETCH_GROUP):
        group = step_metrics[start : start + _FETCH_GROUP]
        chunks.append((_stack_metrics(group + group[-1:] * (_FETCH_GROUP - len(group))), len(group)))
    return StepRows.stacked(zip(jax.device_get([rows for rows, _ in chunks]), [n for _, n in chunks]))
