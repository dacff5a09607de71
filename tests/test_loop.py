"""The fit loop: training, logging, evaluation, devices, bit-identical resumption."""

import json

import jax
import numpy as np
import optax
import pytest

from funcnet import callbacks, data, distributed, losses
from funcnet.loop import fit
from funcnet.loop import FitOptions
from helpers.training import X, Y, fit_setup, mlp, params_equal

# This file also checks fit(devices=N), the deprecated pmap placement, which still works.
pytestmark = pytest.mark.filterwarnings(r"ignore:fit\(devices=:DeprecationWarning")


def test_fit_trains_logs_and_evaluates(tmp_path):
    ts, loss_fn, opt, train_data, kw = fit_setup()
    sched = optax.exponential_decay(1e-2, 8, 0.5)
    cbs = [
        callbacks.LearningRateLogger(sched),
        callbacks.CSVLogger(tmp_path / "h.csv"),
        callbacks.JSONLLogger(tmp_path / "h.jsonl"),
    ]
    lines = []
    ts2, history = fit(
        ts, loss_fn, opt, train_data, epochs=3, callbacks=cbs, options=FitOptions(print_fn=lines.append), **kw
    )
    assert [h["epoch"] for h in history] == [0, 1, 2] and len(lines) == 3
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["eval_acc"] > 0.6
    assert int(ts2.step) == 3 * (256 // 32)
    assert history[0]["lr"] == pytest.approx(float(sched(8)))
    rows = (tmp_path / "h.csv").read_text().strip().splitlines()
    assert len(rows) == 4 and rows[0].startswith("epoch,loss,acc")
    js = [json.loads(l) for l in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert [j["epoch"] for j in js] == [0, 1, 2]
    # The logged eval loss is the real mean loss over the eval set.
    logits, _ = mlp(0.2).apply(ts2.params, ts2.state, X)
    assert js[-1]["eval_loss"] == pytest.approx(float(losses.cross_entropy(logits, Y)), rel=1e-5)


@pytest.mark.parametrize("every", ["epoch", "steps"])
def test_resume_is_bit_identical(tmp_path, every):
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.3)
    full, _ = fit(ts, loss_fn, opt, train_data, epochs=3, **kw)

    class Crash(Exception):
        pass

    class CrashAt(callbacks.Callback):
        def on_step_end(self, ctx, step):
            if step == 13:  # mid-epoch 1
                raise Crash

    saver = (
        callbacks.Checkpoint(tmp_path, every_epochs=1)
        if every == "epoch"
        else callbacks.Checkpoint(tmp_path, every_steps=5, every_epochs=None)
    )
    with pytest.raises(Crash):
        fit(ts, loss_fn, opt, train_data, epochs=3, callbacks=[saver, CrashAt()], **kw)
    resumed, history = fit(ts, loss_fn, opt, train_data, epochs=3, resume_from=tmp_path, **kw)
    assert int(resumed.step) == int(full.step)
    params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
    np.testing.assert_array_equal(jax.random.key_data(resumed.rng), jax.random.key_data(full.rng))
    assert history[0]["epoch"] == 1


@pytest.mark.devices(4)
def test_fit_on_four_devices_matches_one(tmp_path):
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    one, h1 = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    four, h4 = fit(ts, loss_fn, opt, train_data, epochs=2, devices=4, **kw)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), four.params, one.params)
    assert h4[-1]["eval_acc"] == pytest.approx(h1[-1]["eval_acc"])
    with pytest.raises(ValueError, match="cannot be split evenly over 4 devices"):
        fit(ts, loss_fn, opt, lambda e: data.batches((X, Y), 30), epochs=1, devices=4, progress=False)


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.devices(4)
def test_fit_on_a_mesh_matches_one_device(explicit):
    """jit over a data mesh: no axis_name, no hand-written collective, one device's result."""
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    one, h1 = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    mesh = distributed.data_mesh(explicit=explicit)
    on_mesh, hm = fit(ts, loss_fn, opt, train_data, epochs=2, mesh=mesh, **kw)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
        (on_mesh.params, on_mesh.opt_state),
        (one.params, one.opt_state),
    )
    assert int(on_mesh.step) == int(one.step)
    assert hm[-1]["loss"] == pytest.approx(h1[-1]["loss"], rel=1e-5)
    assert hm[-1]["eval_acc"] == pytest.approx(h1[-1]["eval_acc"])
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(ts))  # donation spared the input
    with pytest.raises(ValueError, match="cannot be split evenly over 4 devices"):
        fit(ts, loss_fn, opt, lambda e: data.batches((X, Y), 30), mesh=mesh, progress=False)
    with pytest.raises(ValueError, match="either devices=4 .* or mesh="):
        fit(ts, loss_fn, opt, train_data, devices=4, mesh=mesh)


def test_fit_argument_errors():
    ts, loss_fn, opt, train_data, kw = fit_setup()
    with pytest.raises(ValueError, match="eval_data, eval_fn and metric together"):
        fit(ts, loss_fn, opt, train_data, eval_data=kw["eval_data"])
    with pytest.raises(ValueError, match="asked for 64 devices"):
        fit(ts, loss_fn, opt, train_data, devices=64)
    once = iter(list(train_data(0)))
    with pytest.raises(ValueError, match="gave no batches in epoch 1.*callable"):
        fit(ts, loss_fn, opt, once, epochs=2, progress=False)


def test_progress_bar_shows_loss_and_throughput(capsys):
    ts, loss_fn, opt, train_data, kw = fit_setup()
    kw["progress"] = True
    fit(ts, loss_fn, opt, train_data, epochs=1, options=FitOptions(log_every=2), **kw)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "loss=" in err and "samples_s=" in err


def test_callbacks_may_keep_the_train_state_they_see():
    ts, loss_fn, opt, train_data, kw = fit_setup()
    kept = []

    class Keep(callbacks.Callback):
        def on_step_end(self, ctx, step):
            if step == 2:
                kept.append(ctx.train_state)

    fit(ts, loss_fn, opt, train_data, epochs=1, callbacks=[Keep()], progress=False)
    assert int(kept[0].step) == 2 and np.isfinite(np.asarray(kept[0].params[0]["W"])).all()


# --------------------------------------------------------------------------- #
# DeviceData: the data set on the device, batches gathered inside the step
# --------------------------------------------------------------------------- #


def _device_data(x=X, y=Y, **kw):
    return data.DeviceData((x, y), 32, shuffle=True, rng=7, **kw)


def _without_times(history):
    return [{k: v for k, v in h.items() if k not in ("seconds", "samples_per_s")} for h in history]


def test_device_data_gives_the_host_pipelines_result_bit_for_bit(capsys):
    """Same seed, same batches: the params, metrics and eval logs of the host pipeline,
    whatever the number of steps per dispatch (3 does not divide the 8 batches)."""
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.3)
    host, h_host = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    kw["eval_data"] = data.DeviceData((X, Y), 64)
    for k, progress in [(1, False), (3, True)]:
        dev, h_dev = fit(
            ts,
            loss_fn,
            opt,
            _device_data(),
            epochs=2,
            options=FitOptions(steps_per_dispatch=k, log_every=3),
            **dict(kw, progress=progress),
        )
        params_equal(
            (dev.params, dev.opt_state, jax.random.key_data(dev.rng)),
            (host.params, host.opt_state, jax.random.key_data(host.rng)),
        )
        assert _without_times(h_dev) == _without_times(h_host)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(ts))
    err = capsys.readouterr().err  # the bar shows a loss read without waiting for the device
    assert "loss=" in err and "samples_s=" in err


def test_device_data_keeps_the_last_smaller_batch_when_asked():
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    x, y = X[:100], Y[:100]
    host, _ = fit(
        ts,
        loss_fn,
        opt,
        lambda e: data.batches((x, y), 32, shuffle=True, rng=3, epoch=e, drop_remainder=False),
        epochs=2,
        progress=False,
    )
    dev, _ = fit(
        ts,
        loss_fn,
        opt,
        data.DeviceData((x, y), 32, shuffle=True, rng=3, drop_remainder=False),
        epochs=2,
        progress=False,
        options=FitOptions(steps_per_dispatch=2),
    )
    assert int(dev.step) == int(host.step) == 2 * 4
    params_equal(dev.params, host.params)


class _Crash(Exception):
    pass


class _Steps(callbacks.Callback):
    def __init__(self, crash_at=None):
        self.seen, self.crash_at = [], crash_at

    def on_step_end(self, ctx, step):
        self.seen.append(step)
        if self.crash_at is not None and step >= self.crash_at:
            raise _Crash


def test_device_data_resume_mid_epoch_is_bit_identical(tmp_path):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.3)
    full, _ = fit(ts, loss_fn, opt, _device_data(), epochs=3, options=FitOptions(steps_per_dispatch=2), **kw)
    saver, crash = callbacks.Checkpoint(tmp_path, every_steps=4, every_epochs=None), _Steps(13)
    with pytest.raises(_Crash):
        fit(
            ts,
            loss_fn,
            opt,
            _device_data(),
            epochs=3,
            callbacks=[saver, crash],
            options=FitOptions(steps_per_dispatch=2),
            **kw,
        )
    assert crash.seen == [2, 4, 6, 8, 10, 12, 14]  # once per dispatch, after its last step
    assert saver.checkpointer.latest_step() == 12  # mid-epoch 1, taken between dispatches
    # resumed with the default steps per dispatch (a callback of its own makes it 1: it
    # sees every step): still the same run, bit for bit
    steps = _Steps()
    resumed, history = fit(ts, loss_fn, opt, _device_data(), epochs=3, resume_from=tmp_path, callbacks=[steps], **kw)
    assert steps.seen == list(range(13, 25))
    params_equal(
        (resumed.params, resumed.opt_state, jax.random.key_data(resumed.rng)),
        (full.params, full.opt_state, jax.random.key_data(full.rng)),
    )
    assert history[0]["epoch"] == 1


def _host_data(x=X[:100], y=Y[:100]):  # 3 full batches of 32 and a last one of 4
    return lambda e: data.batches((x, y), 32, shuffle=True, rng=3, epoch=e, drop_remainder=False)


class _EveryStep(callbacks.Callback):
    """A callback that needs dispatches to end on its every_steps, not every step."""

    every_steps = 2

    def __init__(self):
        self.seen = []

    def on_step_end(self, ctx, step):
        self.seen.append(step)


def test_host_pipeline_runs_several_steps_per_dispatch_bit_identically(capsys):
    """A callable giving funcnet.data.batches runs k steps per dispatch on stacked batches
    (one gather and one copy each): the same params, metrics and eval logs as one step
    per dispatch, and as DeviceData; the last, smaller batch runs on its own."""
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.3)
    one, h_one = fit(ts, loss_fn, opt, _host_data(), epochs=3, options=FitOptions(steps_per_dispatch=1), **kw)
    dev, _ = fit(
        ts,
        loss_fn,
        opt,
        data.DeviceData((X[:100], Y[:100]), 32, shuffle=True, rng=3, drop_remainder=False),
        epochs=3,
        **kw,
    )
    params_equal(dev.params, one.params)
    every = _EveryStep()
    for options, extra in [(FitOptions(log_every=3), {}), (FitOptions(steps_per_dispatch=2), dict(callbacks=[every]))]:
        several, h = fit(ts, loss_fn, opt, _host_data(), epochs=3, options=options, **dict(kw, **extra))
        params_equal(
            (several.params, several.opt_state, jax.random.key_data(several.rng)),
            (one.params, one.opt_state, jax.random.key_data(one.rng)),
        )
        assert _without_times(h) == _without_times(h_one)
    assert every.seen == [2, 3, 4, 6, 7, 8, 10, 11, 12]  # dispatch ends, then the last batch
    fit(ts, loss_fn, opt, fit_setup()[3], options=FitOptions(log_every=2), **dict(kw, progress=True))  # k = 2
    err = capsys.readouterr().err  # the bar shows a loss read without waiting for the device
    assert "loss=" in err and "samples_s=" in err


def test_host_pipeline_resume_mid_epoch_with_several_steps_per_dispatch(tmp_path):
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.3)
    full, h_full = fit(ts, loss_fn, opt, train_data, epochs=3, options=FitOptions(steps_per_dispatch=1), **kw)
    saver, crash = callbacks.Checkpoint(tmp_path, every_steps=4, every_epochs=None), _Steps(13)
    with pytest.raises(_Crash):
        fit(
            ts,
            loss_fn,
            opt,
            train_data,
            epochs=3,
            callbacks=[saver, crash],
            options=FitOptions(steps_per_dispatch=2),
            **kw,
        )
    assert crash.seen == [2, 4, 6, 8, 10, 12, 14]
    assert saver.checkpointer.latest_step() == 12  # mid-epoch 1 (8 batches an epoch)
    resumed, history = fit(
        ts, loss_fn, opt, train_data, epochs=3, resume_from=tmp_path, options=FitOptions(steps_per_dispatch=4), **kw
    )
    params_equal(
        (resumed.params, resumed.opt_state, jax.random.key_data(resumed.rng)),
        (full.params, full.opt_state, jax.random.key_data(full.rng)),
    )
    assert _without_times(history) == _without_times(h_full[1:])


def test_several_steps_per_dispatch_need_batches_read_several_at_a_time():
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    batch_list = list(train_data(0))
    for other in (
        batch_list,
        lambda e: iter(batch_list),
        data.batches((X, Y), 32, shuffle=True, rng=7),
    ):  # one pass, not callable
        with pytest.raises(ValueError, match="steps_per_dispatch=2 needs batches it can read"):
            fit(ts, loss_fn, opt, other, options=FitOptions(steps_per_dispatch=2), **kw)
    # left unset, they run one step per dispatch, as before
    out, _ = fit(ts, loss_fn, opt, batch_list, epochs=2, **kw)
    assert int(out.step) == 16
    with pytest.raises(ValueError, match="gave no batches in epoch 1"):
        fit(ts, loss_fn, opt, data.batches((X, Y), 32), epochs=2, **kw)


def test_stacked_host_batches_errors_name_the_batches():
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    y_big = Y.astype(np.int64)
    y_big[40] = 2**40  # int32 cannot hold it (x64 off)
    for prefetch in (0, 2):  # read on this thread, or in the background one
        with pytest.raises(ValueError, match="int32 cannot hold") as info:
            fit(ts, loss_fn, opt, lambda e: data.batches((X, y_big), 32), options=FitOptions(prefetch=prefetch), **kw)
        assert any("reading batches 0..7 of epoch 0" in n for n in info.value.__notes__)
    assert _background_threads() == []


def test_steps_per_dispatch_default_and_checks():
    from funcnet.loop._fit import _check_dispatch

    ckpt4 = callbacks.Checkpoint("unused", every_steps=4, every_epochs=None)
    assert _check_dispatch(None, True, [], 50) == 50  # log_every
    assert _check_dispatch(None, True, [ckpt4, callbacks.EarlyStopping()], 50) == 2
    assert _check_dispatch(None, True, [_Steps()], 50) == 1  # sees every step
    assert _check_dispatch(None, False, [], 50) == 1  # pmap, host data on a mesh
    assert _check_dispatch(4, True, [ckpt4, _Steps()], 50) == 4  # asked for: once per dispatch
    with pytest.raises(ValueError, match=r"Checkpoint\(every_steps=4\) would fall inside"):
        _check_dispatch(8, True, [ckpt4], 50)
    with pytest.raises(ValueError, match="steps_per_dispatch=2 needs train_data=funcnet.data"):
        _check_dispatch(2, False, [], 50)
    with pytest.raises(ValueError, match="steps_per_dispatch must be a positive int"):
        _check_dispatch(0, True, [], 50)


@pytest.mark.devices(4)
def test_device_data_on_a_mesh_is_split_and_under_pmap_is_iterated():
    """On a mesh the data set is split over the devices and each step gathers a global
    batch split over them: the host pipeline's result on the same mesh bit for bit, one
    device's within float rounding (the all-reduce adds in another order). Under pmap
    a DeviceData is an ordinary iterable of batches, one step per dispatch."""
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    mesh = distributed.data_mesh()
    dd = _device_data(device=mesh)
    assert dd.arrays[0].sharding.spec == jax.sharding.PartitionSpec("data")
    assert {s.data.shape for s in dd.arrays[0].addressable_shards} == {(64, 8)}
    host, hh = fit(ts, loss_fn, opt, train_data, epochs=2, mesh=mesh, **kw)
    on_mesh, hm = fit(
        ts, loss_fn, opt, _device_data(), epochs=2, mesh=mesh, options=FitOptions(steps_per_dispatch=3), **kw
    )
    params_equal((on_mesh.params, on_mesh.opt_state), (host.params, host.opt_state))
    assert _without_times(hm) == _without_times(hh)
    one, h1 = fit(ts, loss_fn, opt, dd, epochs=2, **kw)  # placed back on one device
    four, _ = fit(ts, loss_fn, opt, dd, epochs=2, devices=4, **kw)
    for other in (on_mesh, four):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
            (other.params, other.opt_state),
            (one.params, one.opt_state),
        )
    assert hm[-1]["loss"] == pytest.approx(h1[-1]["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="steps_per_dispatch=2 needs train_data=funcnet.data"):
        fit(ts, loss_fn, opt, dd, devices=4, options=FitOptions(steps_per_dispatch=2))


def test_fit_checks_eval_metric_and_epochs_before_training():
    from funcnet import metrics

    ts, loss_fn, opt, train_data, kw = fit_setup()
    steps = []

    class Steps(callbacks.Callback):
        def on_step_end(self, ctx, step):
            steps.append(step)

    # eval_fn returns the collection's state; metric= is one Accuracy: found before epoch 1.
    with pytest.raises(
        ValueError,
        match=r"fit: eval_fn returns a state that metric= cannot "
        r"compute: funcnet.metrics.Accuracy.compute: the state does not fit.*"
        r"got \{'acc': .*'loss': .*the metric whose state eval_fn returns",
    ):
        fit(ts, loss_fn, opt, train_data, callbacks=[Steps()], **dict(kw, metric=metrics.Accuracy()))
    with pytest.raises(ValueError, match=r"fit: epochs must be a non-negative int, got -1"):
        fit(ts, loss_fn, opt, train_data, epochs=-1, callbacks=[Steps()], **kw)
    assert steps == []


def _background_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "funcnet-background" and t.is_alive()]


def test_host_pipeline_in_a_background_thread_is_bit_identical_and_stops_with_fit():
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.3)
    sync, h_sync = fit(ts, loss_fn, opt, train_data, epochs=2, options=FitOptions(prefetch=0), **kw)
    threaded, h_threaded = fit(ts, loss_fn, opt, train_data, epochs=2, options=FitOptions(prefetch=3), **kw)
    params_equal(
        (threaded.params, threaded.opt_state, jax.random.key_data(threaded.rng)),
        (sync.params, sync.opt_state, jax.random.key_data(sync.rng)),
    )
    assert _without_times(h_threaded) == _without_times(h_sync)
    assert _background_threads() == []

    def broken(epoch):  # a host pipeline that fails at batch 5 of epoch 1
        for i, batch in enumerate(train_data(epoch)):
            if epoch == 1 and i == 5:
                raise OSError("unreadable shard")
            yield batch

    with pytest.raises(OSError, match="unreadable shard") as info:
        fit(ts, loss_fn, opt, broken, epochs=2, options=FitOptions(prefetch=2), **kw)
    assert any("item 5" in note for note in info.value.__notes__)
    assert _background_threads() == []

    class Interrupt(BaseException):  # as KeyboardInterrupt: not an Exception
        pass

    class InterruptAt(callbacks.Callback):
        def on_step_end(self, ctx, step):
            if step == 3:
                raise Interrupt

    with pytest.raises(Interrupt):
        fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[InterruptAt()], options=FitOptions(prefetch=2), **kw)
    assert _background_threads() == []
    _, history = fit(
        ts,
        loss_fn,
        opt,
        train_data,
        epochs=5,
        callbacks=[callbacks.EarlyStopping("loss", patience=0, mode="max")],
        options=FitOptions(prefetch=2),
        **kw,
    )
    assert len(history) == 2 and _background_threads() == []
    with pytest.raises(ValueError, match="prefetch"):
        fit(ts, loss_fn, opt, train_data, options=FitOptions(prefetch=-1), **kw)


class _KeepsStates(callbacks.Callback):
    """Keeps ``ctx.train_state`` at each epoch's end, as a user's callback may."""

    def __init__(self):
        self.kept = []

    def on_epoch_end(self, ctx, epoch, logs):
        self.kept.append(ctx.train_state)


@pytest.mark.parametrize("on_mesh", [False, True], ids=["one-device", "mesh"])
@pytest.mark.devices(4)
def test_ctx_train_state_is_a_copy_that_outlives_the_donating_steps(on_mesh):
    """``ctx.train_state`` is a copy in new buffers (the next step donates the loop's), on
    a mesh laid out as the loop's state (replicated there); the copy at the last epoch's
    end is what fit returns, and each earlier one is that epoch's state, still readable
    after the steps."""
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    kw = {k: v for k, v in kw.items() if not k.startswith("eval") and k != "metric"}
    mesh = distributed.data_mesh() if on_mesh else None
    keep = _KeepsStates()
    fitted, _ = fit(ts, loss_fn, opt, train_data, epochs=3, mesh=mesh, callbacks=[keep], **kw)
    assert [int(s.step) for s in keep.kept] == [int(fitted.step) // 3 * (e + 1) for e in range(3)]
    params_equal(keep.kept[-1].params, fitted.params)
    first, last = jax.tree.leaves(keep.kept[0].params), jax.tree.leaves(fitted.params)
    assert not all(np.array_equal(a, b) for a, b in zip(first, last))
    for state in keep.kept:
        assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    if on_mesh:  # whole on every device of the mesh, as fit placed the state there
        for leaf in jax.tree.leaves(keep.kept[-1]):
            assert leaf.sharding.device_set == set(mesh.devices.flat) and leaf.sharding.is_fully_replicated
    pointer = lambda leaf: leaf.addressable_shards[0].data.unsafe_buffer_pointer()  # noqa: E731
    for a, b in zip(jax.tree.leaves(keep.kept[0].params), jax.tree.leaves(keep.kept[1].params)):
        assert pointer(a) != pointer(b)
