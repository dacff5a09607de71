"""fit's data sources (funcnet/loop/_sources.py): one class per source with one interface,
picked by one factory; one epoch loop drives them all, so a new source is one class (here
two, defined in the test) and fit and the epoch loop never test the data's type."""

import contextlib
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

import funcnet
from funcnet import data
from funcnet.callbacks import Callback
from funcnet.layers import Dense
from funcnet.loop import FitOptions, _placement, _sources
from funcnet.train import Aux, TrainState

NET, OPT = Dense(1), optax.sgd(0.1)
X = np.linspace(-1, 1, 36, dtype=np.float32).reshape(18, 2)
ARRAYS = {"x": X, "y": X.sum(1, keepdims=True)}


def _loss(params, state, batch, rng):
    pred, state = NET.apply(params, state, batch["x"])
    return jnp.mean((pred - batch["y"]) ** 2), Aux(state=state)


def _fit(train_data, **kwargs):
    ts = TrainState.create(NET, OPT, jax.random.key(0), (-1, 2))
    return funcnet.fit(ts, _loss, OPT, train_data, progress=False, **kwargs)


def _same(a, b):
    (ts_a, hist_a), (ts_b, hist_b) = a, b
    jax.tree.map(np.testing.assert_array_equal, ts_a.params, ts_b.params)
    assert [h["loss"] for h in hist_a] == [h["loss"] for h in hist_b]
    assert int(ts_a.step) == int(ts_b.step)


class ListSource(_sources._Source):
    """A source of one's own: dict batches from a Python list, the same every epoch, one
    step per dispatch; it knows its steps per epoch and batch shapes ahead."""

    @property
    def steps_per_epoch(self):
        return len(self.data)

    def batch_spec(self):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.data[0])

    def epoch(self, run, steps, epoch, skip, cut):
        put = run.loop.put_batch
        return contextlib.nullcontext(
            _sources._Epoch(
                [(i, 1, len(b["x"]), b) for i, b in enumerate(self.data) if i >= skip],
                lambda state, i, n, batch: steps.train(state, put(batch)),
                per_step=True,
                lag=0,
            )
        )


class Counting(_sources._Source):
    """A source wrapping another (a DeviceData's, several steps per dispatch), counting
    the epochs it plans: the interface is all the loop needs."""

    def __init__(self, inner, counts):
        super().__init__(inner.data)
        self.inner, self.counts = inner, counts
        self.take, self.steps_per_epoch = inner.take, inner.steps_per_epoch

    def layout(self):
        return self.inner.layout()

    def batch_spec(self):
        return self.inner.batch_spec()

    def placed(self, placement):
        return Counting(self.inner.placed(placement), self.counts)

    def several_per_dispatch(self, placement):
        return self.inner.several_per_dispatch(placement)

    def epoch(self, run, steps, epoch, skip, cut):
        self.counts.append((epoch, steps.steps_per_dispatch))
        return self.inner.epoch(run, steps, epoch, skip, cut)


class Planned(Callback):
    log_keys = ()

    def __init__(self):
        self.seen = []

    def on_train_begin(self, ctx):
        self.seen.append(ctx.planned_steps)


def test_a_source_of_ones_own_trains_as_the_builtin_one():
    batches = list(data.batches(ARRAYS, 4))
    planned = Planned()
    _same(
        _fit(ListSource(batches), epochs=2, options=FitOptions(log_every=2), callbacks=[planned]),
        _fit(batches, epochs=2, options=FitOptions(log_every=2)),
    )
    assert planned.seen == [8]  # its steps_per_epoch reached FitContext.planned_steps


def test_a_source_wrapping_a_builtin_one_runs_its_dispatches():
    counts = []
    device = data.DeviceData(ARRAYS, 4, shuffle=True, rng=0, drop_remainder=False)
    _same(
        _fit(Counting(_sources.source_for(device), counts), epochs=2, options=FitOptions(steps_per_dispatch=2)),
        _fit(device, epochs=2, options=FitOptions(steps_per_dispatch=2)),
    )
    assert counts == [(0, 2), (1, 2)]


def test_the_factory_picks_one_class_per_input():
    device = data.DeviceData(ARRAYS, 4)
    one, replicas = _placement._placement(None, None), _placement._Replicas(1)
    source_for = _sources.source_for
    assert type(source_for(device)) is _sources._OnDevice
    assert type(source_for(device, one)) is _sources._OnDevice
    assert type(source_for(device, replicas)) is _sources._DeviceDataIterated  # pmap iterates
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    on_mesh = source_for(device, _placement._OnMesh(mesh))
    assert type(on_mesh) is _sources._OnDevice and on_mesh.data.mesh is mesh
    for host in ([ARRAYS], lambda e: data.batches(ARRAYS, 4, epoch=e), data.batches(ARRAYS, 4)):
        assert type(source_for(host, one)) is _sources._HostIterable
    mine = ListSource([ARRAYS])
    assert source_for(mine, one) is mine
    # what each knows ahead: layout, steps, shapes
    assert int(source_for(device).layout()["n"]) == 18
    assert int(source_for([ARRAYS]).layout()["batch_size"]) == -1
    assert source_for(device, replicas).steps_per_epoch == 4
    assert source_for([ARRAYS]).steps_per_epoch is None
    assert source_for(device, replicas).first_batch()["x"].shape == (4, 2)
    assert _sources.placed_data(None, one) is None


def test_a_callable_is_read_stacked_in_the_epochs_that_allow_it():
    # even epochs: data.batches, read several at a time; odd ones: a list, one per dispatch
    def epochs(e):
        it = data.batches(ARRAYS, 4, shuffle=True, rng=0, epoch=e)
        return it if e % 2 == 0 else list(it)

    device = data.DeviceData(ARRAYS, 4, shuffle=True, rng=0)
    _same(
        _fit(epochs, epochs=3, options=FitOptions(log_every=2)), _fit(device, epochs=3, options=FitOptions(log_every=2))
    )


def test_fit_and_the_epoch_loop_test_no_data_type():
    root = pathlib.Path(funcnet.__file__).parent / "loop"
    type_test = re.compile(r"(isinstance|type)\([^)]*\b(DeviceData|Batches)\b")
    for name in ("_epoch.py", "_fit.py", "_placement.py", "_resume.py", "_checks.py"):
        assert not type_test.search((root / name).read_text()), name
    # the pattern finds the one factory's tests (so the check above can fail)
    assert len(type_test.findall((root / "_sources.py").read_text())) >= 2
