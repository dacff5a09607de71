"""Where ``fit``'s training batches come from: one class per data source, one interface.

A data source answers what ``fit`` and the epoch loop ask of ``train_data`` (``_Source``'s
docstring has the questions), so neither asks which kind of data it has: a
:class:`funcnet.data.DeviceData` gathered inside the step (``_OnDevice``, several steps
per dispatch), :func:`funcnet.data.batches` read several at a time (``_StackedBatches``,
one epoch's), and any other host iterable, or a callable ``epoch -> iterable``, one
step per dispatch (``_HostIterable``; a ``DeviceData`` on pmap replicas is read as one,
``_DeviceDataIterated``). :func:`source_for` is the one place that looks at the type of
``train_data``. Also the host boundary every host batch passes through
(:func:`host_arrays`): leaves of any array-like type (PyTorch tensors, tf.data and
grain elements) become NumPy arrays.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable, Iterable, NamedTuple, Optional

import jax
import numpy as np

from funcnet import data as data_lib
from funcnet.loop._placement import _checked_device_put
from funcnet.loop._resume import check_layout, data_layout

__all__ = ["host_arrays", "source_for", "placed_data"]


class _Epoch(NamedTuple):
    """One epoch as a source plans it: what the epoch loop (``_epoch._train_epoch``) runs.

    Attributes:
      dispatches: ``(i, n, examples, payload)`` per dispatch, in order: ``n`` steps from
        batch ``i`` of the epoch (batches a resumed run skips are not in it), training on
        ``examples`` examples; ``payload`` is what ``run`` needs (a host batch, or None).
      run: ``run(state, i, n, payload) -> (state, metrics)``: the dispatch. Its metrics
        are rows (one per step, ``k`` of them, the first ``n`` written), or with
        ``per_step`` the one step's own.
      per_step: one step per dispatch, its metrics kept as the step returns them (no
        device op per step to stack them; read back at the end by the placement's
        ``fetched``, in a few transfers).
      lag: what the progress bar reads: 0, the latest step, synchronously, every
        ``log_every`` batches of the epoch; 1, the last step of the dispatch before the
        latest (which the device has finished: the read never waits), every
        ``log_every`` global steps.
      last: the last, smaller batch, run after the dispatches (``last(state) ->
        ((state, metrics), examples)``, the step's own metrics), or None.
      full: the batches before ``last`` (it runs unless a resumed run skips past them).
      max_in_flight: dispatches queued and unfinished at most
        (:class:`funcnet.distributed.InFlight`; None: no bound).
      ahead: host work for the next epoch that the loop runs once this epoch's
        dispatches are queued, while the device runs them (``_OnDevice``: the next
        order, placed), or None.
    """

    dispatches: Iterable
    run: Callable
    per_step: bool = False
    lag: int = 1
    last: Optional[Callable] = None
    full: int = 0
    max_in_flight: Optional[int] = None
    ahead: Optional[Callable] = None


class _Source:
    """A data source: what ``fit`` trains on, as ``fit`` and its epoch loop read it.

    This one is the base (a source that knows nothing ahead: its answers are the
    defaults). Each source answers the same questions, so neither ``fit`` nor the epoch
    loop asks which it has: ``layout`` (what a checkpoint's loop position counts in),
    ``batch_spec`` and ``first_batch`` (shapes to trace the step with), ``steps_per_epoch``,
    ``placed`` (the source as it runs on a placement), ``several_per_dispatch`` and
    ``take`` (how the steps read it), and ``epoch``: the epoch's dispatches. A new data
    source is one subclass; an instance given to ``fit`` as ``train_data`` is used as
    it is (:func:`source_for`).

    Attributes:
      data: what the source reads (a ``DeviceData`` as placed, an iterable, a callable).
      steps_per_epoch: the steps of every epoch, when known before the first one (for
        ``FitContext.planned_steps``), else None.
      take: a :meth:`funcnet.data.DeviceData.take_ordered` for steps that gather their batches
        on the device (``_placement._compile``), else None.
      grows_dispatches: whether a dispatch may run more than ``steps_per_dispatch``
        steps, up to the steps' ``dispatch_bound`` (the device loop over a ``DeviceData``,
        whose program is the same for any count; a host pipeline's stacked batches
        have the count in their shape).
    """

    steps_per_epoch: Optional[int] = None
    take: Optional[Callable] = None
    grows_dispatches: bool = False

    def __init__(self, data=None):
        self.data = data

    def layout(self) -> dict:
        """What a loop position means in this data, for the checkpoint
        (:func:`funcnet.loop._resume.data_layout`; -1 where unknown before an epoch)."""
        return data_layout(None)

    def batch_spec(self):
        """The batches' shapes and dtypes known without reading any (a pytree of
        ``jax.ShapeDtypeStruct``), else None (the loop records the first batch's)."""
        return None

    def first_batch(self, name: str = "train_data"):
        """A batch (or its spec) to trace the step with before training, or None when
        reading one would use up data that can be read only once."""
        return self.batch_spec()

    def placed(self, placement) -> "_Source":
        """This source as it runs on ``placement`` (``_placement._OneDevice`` or a subclass)."""
        return self

    def several_per_dispatch(self, placement) -> bool:
        """Whether the steps can run several per dispatch over this data on ``placement``."""
        return False

    def epoch(self, run, steps, epoch: int, skip: int, cut: Callable):
        """A context manager over epoch ``epoch``'s :class:`_Epoch`, without its first
        ``skip`` batches (trained on before the checkpoint a run resumed from). ``run``
        is the run record (``_context._Run``: its ``loop`` holds the state), ``steps``
        the compiled steps (``_placement._Steps``), ``cut(start, stop)`` the loop's
        ``(i, n)`` dispatches over batches ``start .. stop - 1``. Leaving it ends what
        the epoch started (a background thread, an iterator)."""
        raise NotImplementedError(f"{type(self).__name__}.epoch")


class _OnDevice(_Source):
    """A :class:`funcnet.data.DeviceData` gathered inside the step, on one device or a
    mesh: up to ``steps_per_dispatch`` steps per dispatch (by default more for short
    steps: ``_epoch._grown``), and no host work per dispatch but the dispatch."""

    grows_dispatches = True

    @property
    def take(self):
        return self.data.take_ordered

    @property
    def steps_per_epoch(self) -> int:
        full, tail = self.data.order(0)
        return len(full) + (tail is not None)

    def layout(self) -> dict:
        return data_layout(self.data)

    def batch_spec(self):
        data = self.data
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct((data.batch_size,) + a.shape[1:], a.dtype), data.arrays)

    def placed(self, placement) -> _Source:
        """The data set on the placement's mesh (or whole on the default device); on a
        placement that does not gather in the step (pmap), read as an iterable."""
        data = self.data.placed(placement.mesh)
        return (_OnDevice if placement.gathers_device_data else _DeviceDataIterated)(data)

    def several_per_dispatch(self, placement) -> bool:
        return placement.gathers_device_data

    _next = None  # (epoch, its order placed, its tail): ``ahead``'s work

    def _placed_order(self, loop, epoch):
        if self._next is not None and self._next[0] == epoch:
            return self._next[1:]
        full, tail = self.data.order(epoch)
        return loop.put_order(full), tail

    def _order_ahead(self, loop, epoch):
        # The next epoch's order is host work (a NumPy permutation and its copy: ~1 ms
        # for 60,000 rows on CPU) that would otherwise run between two epochs, with the
        # device idle; done here it runs while the device runs this epoch's steps.
        self._next = (epoch, *self._placed_order(loop, epoch))

    @contextlib.contextmanager
    def epoch(self, run, steps, epoch, skip, cut):
        loop, data, k = run.loop, self.data, steps.steps_per_dispatch
        order, tail = self._placed_order(loop, epoch)

        def dispatch(state, i, n, _):
            at = (np.int32(i),) if k == 1 else (np.int32(i), np.int32(n))
            return steps.on_device(state, data.arrays, order, *at)

        def last(state):
            return steps.on_device_one(state, data.arrays, loop.put_order(tail)), len(tail)

        size = data.batch_size
        yield _Epoch(
            [(i, n, n * size, None) for i, n in cut(skip, len(order))],
            dispatch,
            per_step=k == 1,  # one step per dispatch: the step's own metrics (_device_steps)
            last=None if tail is None else last,
            full=len(order),
            ahead=lambda: self._order_ahead(loop, epoch + 1),
        )


class _HostIterable(_Source):
    """A host pipeline: an iterable re-iterated every epoch, or a callable ``epoch ->
    iterable``; one step per dispatch, each batch through :func:`host_arrays` (in
    ``prefetch``'s background thread when there is one). An epoch whose iterable is a
    :func:`funcnet.data.batches` the steps can stack runs as :class:`_StackedBatches`
    (decided per epoch: the callable may return one in one epoch and not in another)."""

    def layout(self) -> dict:
        return _layout_of(self.data)

    def first_batch(self, name: str = "train_data"):
        data = self.data
        if callable(data):
            data = data(0)
        elif iter(data) is data:
            return None
        batch = next(iter(data), None)
        return None if batch is None else host_arrays(batch, name, 0, 0)

    def several_per_dispatch(self, placement) -> bool:
        # A callable may return batches the steps can stack; decided per epoch.
        return placement.stacks_host_batches

    def epoch(self, run, steps, epoch, skip, cut):
        batches = self.data(epoch) if callable(self.data) else self.data
        if steps.on_stacked is not None and callable(self.data) and _stackable(batches):
            return _StackedBatches(batches).epoch(run, steps, epoch, skip, cut)
        if steps.several_asked:
            raise ValueError(
                f"fit: steps_per_dispatch={steps.steps_per_dispatch} needs batches "
                f"it can read several at a time: train_data=funcnet.data."
                f"DeviceData(...), or a callable returning funcnet.data.batches(...) "
                f"(got {type(batches).__name__} from train_data). Other iterables "
                f"run one step per dispatch: leave steps_per_dispatch unset."
            )
        return _host_epoch(run, steps, batches, epoch, skip)


class _DeviceDataIterated(_HostIterable):
    """A :class:`funcnet.data.DeviceData` on a placement that does not gather in the
    step (pmap): an iterable of batches gathered on the default device, one step per
    dispatch; what it is made of is known ahead, as ``_OnDevice`` knows it."""

    steps_per_epoch = _OnDevice.steps_per_epoch
    layout = _OnDevice.layout
    batch_spec = _OnDevice.batch_spec

    def first_batch(self, name: str = "train_data"):
        return self.batch_spec()


class _StackedBatches(_Source):
    """One epoch's :func:`funcnet.data.batches` (a ``Batches`` with random access), read
    several at a time: each dispatch's batches at once
    (:meth:`funcnet.data.Batches.stacked`, one gather and one copy to the device), run as up to
    ``steps.steps_per_dispatch`` steps on the device. The next dispatch's batches are
    gathered while the device runs the last one (dispatch is asynchronous), or
    ``prefetch`` ahead in a background thread. ``_HostIterable`` makes one per epoch."""

    def layout(self) -> dict:
        return data_layout(self.data)

    @contextlib.contextmanager
    def epoch(self, run, steps, epoch, skip, cut):
        loop, source = run.loop, self.data
        k, size = steps.steps_per_dispatch, source.batch_size
        full = source.full_batches - source.skip  # counted as the iteration counts them
        _check_host_layout(run, source, size, skip > 0)
        if source.num_batches > source.skip:
            run.batch_spec = _spec(source.batch(source.skip))
        local = jax.device_put(np.arange(k, dtype=np.int32))
        plan = cut(skip, full)

        def stacked():  # what each dispatch runs on, in the plan's order
            for i, n in plan:
                try:
                    chunk = _checked_device_put(source.stacked(source.skip + i, n, size=k))
                except Exception as e:
                    e.add_note(
                        f"fit: reading batches {i}..{i + n - 1} of epoch {epoch} "
                        f"(Batches.stacked) for one dispatch of {n} steps"
                    )
                    raise
                yield chunk

        def last(state):
            batch = source.batch(source.num_batches - 1)
            return steps.train(state, loop.put_batch(batch)), _batch_size(batch)

        with loop.host_batches(stacked()) as chunks:

            def dispatch(state, i, n, _):
                return steps.on_stacked(state, next(chunks), local, np.int32(0), np.int32(n))

            tail = source.num_batches > source.full_batches
            # At most 2 dispatches in flight: the host gathers the next one's batches while
            # the device runs, without queueing (and holding) a whole epoch's copies.
            yield _Epoch(
                [(i, n, n * size, None) for i, n in plan],
                dispatch,
                last=last if tail else None,
                full=full,
                max_in_flight=2,
            )
        source.close()  # used up, as iterating it would leave it


@contextlib.contextmanager
def _host_epoch(run, steps, batches, epoch: int, skip: int):
    """An epoch of a host pipeline's ``batches``, one step per dispatch. Skipped batches
    are read (an iterable cannot seek); the first one records the layout and spec."""
    loop = run.loop
    train, put = steps.train, loop.put_batch

    def dispatches(it):
        for i, batch in enumerate(it):
            if i == 0:
                _check_host_layout(run, batches, _batch_size(batch), skip > 0)
                run.batch_spec = _spec(batch)
            if i < skip:
                continue
            yield i, 1, _batch_size(batch), batch

    # The with block stops the background thread however the epoch ends (early stop,
    # an exception, KeyboardInterrupt).
    with loop.host_batches(batches, _converter("train_data", epoch)) as it:
        yield _Epoch(dispatches(it), lambda state, i, n, batch: train(state, put(batch)), per_step=True, lag=0)


def source_for(train_data, placement=None) -> _Source:
    """The data source of ``train_data`` (on ``placement``, if given: ``_Source.placed``).
    The one place that looks at the type of ``fit``'s data: a ``_Source`` is used as it
    is (a data source of one's own), a :class:`funcnet.data.DeviceData` is gathered in
    the step, anything else is a host pipeline (an iterable or ``epoch -> iterable``)."""
    if isinstance(train_data, _Source):
        source = train_data
    elif isinstance(train_data, data_lib.DeviceData):
        source = _OnDevice(train_data)
    else:
        source = _HostIterable(train_data)
    return source if placement is None else source.placed(placement)


def placed_data(data, placement):
    """``eval_data`` (or any data ``fit`` reads) placed where ``placement``'s steps run:
    a ``DeviceData`` on its mesh, anything else as it is."""
    return None if data is None else source_for(data, placement).data


def _layout_of(batches) -> dict:
    """:func:`funcnet.loop._resume.data_layout` of a host pipeline's iterable: known for
    a :func:`funcnet.data.batches` (it says what it is made of), else -1 everywhere."""
    return data_layout(batches if isinstance(batches, data_lib.Batches) else None)


def _stackable(batches) -> bool:
    """Whether an epoch's iterable can be read several batches at a time."""
    return isinstance(batches, data_lib.Batches) and batches.stackable


def _check_host_layout(run, batches, size: int, resumed_inside: bool) -> None:
    """Records what a checkpoint's loop position counts in for a host pipeline, from
    this epoch's iterable (all of it for a ``data.Batches``) and first batch
    (``size``). In the epoch a run resumes inside, refuses it when it differs from what
    the checkpoint recorded for that epoch: the batches to skip must be the saved ones.
    (Each epoch may have its own shuffle seed, so only that epoch is compared.)"""
    now = _layout_of(batches)
    if int(now["batch_size"]) == -1:
        now["batch_size"] = np.int64(size)
    if resumed_inside:
        check_layout(run.resumed, now)
    # What this iterable cannot tell stays as recorded before.
    run.data_layout = {k: v if int(v) != -1 else run.data_layout[k] for k, v in now.items()}


def _converter(name: str, epoch: int) -> Callable:
    """:func:`host_arrays` for an epoch's batches, taken in order (on one thread),
    counting them for its error message: fit's host boundary, where a PyTorch, tf.data
    or grain batch becomes NumPy, once per batch."""
    count = itertools.count()
    return lambda batch: host_arrays(batch, name, next(count), epoch)


def _spec(batch):
    """A batch's shapes and dtypes, without its values (nothing kept alive)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)


def _batch_size(batch) -> int:
    return int(jax.tree.leaves(batch)[0].shape[0])


# Leaves fit passes on as they are: what jit takes without a conversion (so a NumPy
# batch costs no copy and a JAX array stays where it is).
_NATIVE = (np.ndarray, np.generic, jax.Array, int, float, complex)
# NumPy dtype kinds JAX cannot hold: objects, strings, bytes, datetimes.
_NOT_NUMBERS = frozenset("OUSMm")
_NUMBER = np.dtype(np.float32)  # what a Python number's missing dtype counts as


def host_arrays(batch, name: str, index: int, epoch: int):
    """``batch`` with every leaf an array JAX takes: NumPy and JAX arrays and Python
    numbers as they are, any other leaf through ``np.asarray`` (a PyTorch CPU tensor
    shares its memory; tf.data and grain elements implement ``__array__``), as
    ``torch.utils.data.DataLoader`` users expect of a PyTorch loop. A leaf that does
    not become an array of numbers raises a ``TypeError`` naming its type, ``name``
    (``"train_data"``, ``"eval_data"``) and the batch's ``index`` in ``epoch``."""
    leaves, treedef = jax.tree.flatten(batch)
    if all(isinstance(x, _NATIVE) and getattr(x, "dtype", _NUMBER).kind not in _NOT_NUMBERS for x in leaves):
        return batch  # the common case: nothing converted, nothing rebuilt
    out = []
    for i, x in enumerate(leaves):
        if not isinstance(x, _NATIVE):
            try:
                x = np.asarray(x)
            except Exception as e:  # noqa: BLE001 -- reported with the leaf, below
                _unconvertible(batch, i, x, name, index, epoch, f"{type(e).__name__}: {e}")
        if getattr(x, "dtype", _NUMBER).kind in _NOT_NUMBERS:
            _unconvertible(
                batch, i, leaves[i], name, index, epoch, f"an array of dtype {x.dtype}, which JAX cannot hold"
            )
        out.append(x)
    return jax.tree.unflatten(treedef, out)


def _unconvertible(batch, i: int, leaf, name: str, index: int, epoch: int, got: str):
    path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(batch)[0][i][0])
    kind = type(leaf)
    where = f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
    if kind.__module__.split(".")[0] == "torch":
        fix = (
            "Yield tensors on the CPU without grad (tensor.detach().cpu(), in the "
            "DataLoader's collate_fn or a generator around it), and bfloat16 ones as "
            ".float(): NumPy has no bfloat16."
        )
    else:
        fix = (
            "Turn it into numbers in the pipeline (e.g. strings into token or class ids) "
            "or give its type an __array__ method returning a NumPy array."
        )
    raise TypeError(
        f"fit: batch {index} of epoch {epoch} of {name} has a leaf {path or '(the batch)'} of "
        f"type {where} that is not an array of numbers (np.asarray gave {got}). fit reads "
        f"each leaf of a host batch with np.asarray: NumPy and JAX arrays, PyTorch CPU "
        f"tensors, tf.data and grain elements work. {fix}"
    )
