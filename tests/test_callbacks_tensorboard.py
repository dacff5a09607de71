"""TensorBoardLogger writes what JSONLLogger writes (read back from the event files), and
Profile traces a window of steps without changing fit's dispatches."""

import glob
import json
import os
import struct

import jax
import numpy as np
import optax
import pytest

import funcnet
from funcnet import callbacks, data, metrics
from funcnet.layers import Dense, Relu
from funcnet.train import Aux, TrainState
from funcnet.loop import FitOptions
from helpers.profile_marks import step_marks

pytest.importorskip("tensorboardX")


def _events(logdir):
    """``{tag: {step: value}}`` from the TFRecord event files under ``logdir`` (the
    format: u64 length, u32 crc, the Event proto, u32 crc)."""
    from tensorboardX.proto import event_pb2

    out = {}
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        raw, i = open(path, "rb").read(), 0
        while i < len(raw):
            n = struct.unpack("<Q", raw[i : i + 8])[0]
            event = event_pb2.Event.FromString(raw[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, {})[event.step] = v.simple_value
    return out


def _setup():
    net = funcnet.serial(Dense(16), Relu, Dense(3))
    opt = optax.adam(1e-2)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 4))
    r = np.random.default_rng(0)
    x = r.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0])
        return funcnet.losses.cross_entropy(logits, batch[1]), Aux(state=state)

    acc = metrics.Accuracy()

    def eval_fn(params, state, batch):
        return acc.update(acc.init(), net.apply(params, state, batch[0])[0], batch[1])

    return ts, loss_fn, opt, (x, y), eval_fn, acc


def test_tensorboard_scalars_are_the_jsonl_logs_and_the_step_metrics(tmp_path):
    ts, loss_fn, opt, arrays, eval_fn, acc = _setup()
    tb = callbacks.TensorBoardLogger(tmp_path / "tb", every_steps=2)
    jl = callbacks.JSONLLogger(tmp_path / "log.jsonl")
    seen = {}

    class Steps(callbacks.Callback):
        every_steps = 2

        def on_step_end(self, ctx, step):
            if step % 2 == 0:
                seen[step] = ctx.step_metrics

    funcnet.fit(
        ts,
        loss_fn,
        opt,
        data.DeviceData(arrays, 16, shuffle=True, rng=0),
        epochs=3,
        eval_data=lambda e: data.batches(arrays, 32),
        eval_fn=eval_fn,
        metric=acc,
        callbacks=[Steps(), tb, jl],
        options=FitOptions(step_options={"grad_norm": True}),
    )
    got = _events(tmp_path / "tb")
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert len(rows) == 3
    for row in rows:
        for key in ("loss", "grad_norm", "eval_metric", "samples_per_s"):
            assert got[f"epoch/{key}"][row["epoch"]] == pytest.approx(row[key], rel=1e-6), key
    assert sorted(got["step/loss"]) == [2, 4, 6, 8, 10, 12]
    for step, m in seen.items():
        assert got["step/loss"][step] == pytest.approx(m["loss"], rel=1e-6)
        assert got["step/grad_norm"][step] == pytest.approx(m["grad_norm"], rel=1e-6)


def test_profile_traces_its_window_and_keeps_the_dispatches(tmp_path):
    ts, loss_fn, opt, arrays, _, _ = _setup()
    dispatches = []

    class Count(callbacks.Callback):
        every_steps = None

        def on_step_end(self, ctx, step):
            dispatches.append(step)

    train = data.DeviceData(arrays, 16)
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        train,
        epochs=4,
        callbacks=[Count(), callbacks.Profile(tmp_path / "prof", steps=(4, 8))],
        options=FitOptions(steps_per_dispatch=None, log_every=4),
    )
    assert dispatches == [4, 8, 12, 16]  # 4 steps per dispatch, as without Profile
    assert glob.glob(str(tmp_path / "prof" / "**" / "*.xplane.pb"), recursive=True)
    with pytest.warns(UserWarning, match="past this run's last step"):
        funcnet.fit(ts, loss_fn, opt, train, epochs=1, callbacks=[callbacks.Profile(tmp_path / "p2", steps=(1, 100))])
    with pytest.raises(ValueError, match=r"0 <= start < stop"):
        callbacks.Profile(tmp_path, steps=(5, 5))


def test_profile_marks_each_dispatch_of_its_window_with_a_step_annotation(tmp_path):
    ts, loss_fn, opt, arrays, _, _ = _setup()
    started = []

    class Begin(callbacks.Callback):
        every_steps = None  # keeps fit's dispatch size, as Profile does

        def on_step_begin(self, ctx, step):
            started.append(step)

    # one step per dispatch: each step of the window marked
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        lambda e: data.batches(arrays, 16),
        epochs=3,
        callbacks=[Begin(), callbacks.Profile(tmp_path / "host", steps=(4, 8))],
        options=FitOptions(steps_per_dispatch=1),
    )
    assert started == list(range(1, 13))
    assert step_marks(tmp_path / "host") == [5, 6, 7, 8]
    # the host pipeline in dispatches of 4 stacked batches: marked by its first step
    started.clear()
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        lambda e: data.batches(arrays, 16),
        epochs=3,
        callbacks=[Begin(), callbacks.Profile(tmp_path / "stacked", steps=(4, 8))],
        options=FitOptions(log_every=4),
    )
    assert started == [1, 5, 9]
    assert step_marks(tmp_path / "stacked") == [5]
    # a DeviceData in dispatches of 4 steps: the dispatch inside the window, by its first step
    started.clear()
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        data.DeviceData(arrays, 16),
        epochs=4,
        callbacks=[Begin(), callbacks.Profile(tmp_path / "dev", steps=(4, 8))],
        options=FitOptions(steps_per_dispatch=4, log_every=4),
    )
    assert started == [1, 5, 9, 13]
    assert step_marks(tmp_path / "dev") == [5]
