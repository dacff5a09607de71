"""Callbacks: early stopping and the CSV logger's columns."""

import pytest

from funcnet import callbacks
from funcnet.loop import fit
from helpers.training import fit_setup


def test_early_stopping_stops():
    ts, loss_fn, opt, train_data, kw = fit_setup()
    stop = callbacks.EarlyStopping("eval_acc", patience=1, mode="max", min_delta=10.0)
    _, history = fit(ts, loss_fn, opt, train_data, epochs=10, callbacks=[stop], **kw)
    assert len(history) == 2


def test_csv_logger_keeps_its_columns_and_refuses_new_ones(tmp_path):
    log = callbacks.CSVLogger(tmp_path / "h.csv")
    log.on_epoch_end(None, 0, {"epoch": 0, "loss": 1.0})
    log2 = callbacks.CSVLogger(tmp_path / "h.csv")  # e.g. after a resume
    log2.on_epoch_end(None, 1, {"loss": 0.5, "epoch": 1})
    assert (tmp_path / "h.csv").read_text().splitlines() == ["epoch,loss", "0,1.0", "1,0.5"]
    with pytest.raises(ValueError, match=r"CSVLogger: epoch 2 logs \['lr'\].*JSONLLogger"):
        log2.on_epoch_end(None, 2, {"epoch": 2, "loss": 0.4, "lr": 0.1})


def test_monitored_keys_fit_never_logs_fail_before_training(tmp_path):
    ts, loss_fn, opt, train_data, kw = fit_setup()
    steps = []

    class Steps(callbacks.Callback):
        def on_step_end(self, ctx, step):
            steps.append(step)

    with pytest.raises(
        ValueError,
        match=r"EarlyStopping: monitor='val_acc' is not a key fit will "
        r"log.*'eval_acc', 'eval_loss'",
    ):
        fit(ts, loss_fn, opt, train_data, callbacks=[Steps(), callbacks.EarlyStopping("val_acc")], **kw)
    with pytest.raises(ValueError, match=r"monitor='eval_loss'.*eval_data, eval_fn and metric"):
        fit(ts, loss_fn, opt, train_data, callbacks=[Steps(), callbacks.EarlyStopping()], progress=False)
    with pytest.raises(ValueError, match=r"monitor='lr'.*LearningRateLogger adds it after"):
        fit(
            ts,
            loss_fn,
            opt,
            train_data,
            callbacks=[Steps(), callbacks.EarlyStopping("lr"), callbacks.LearningRateLogger(0.1)],
            **kw,
        )
    (tmp_path / "h.csv").write_text("epoch,loss\n0,1.0\n")  # a resumed log with other columns
    with pytest.raises(
        ValueError,
        match=r"CSVLogger: .*h.csv has no column for \['eval_acc', "
        r"'eval_loss', 'samples_per_s', 'seconds'\]",
    ):
        fit(ts, loss_fn, opt, train_data, callbacks=[Steps(), callbacks.CSVLogger(tmp_path / "h.csv")], **kw)
    assert steps == []

    class AddsKey(callbacks.Callback):  # a user callback may add any key: not refused
        def on_epoch_end(self, ctx, epoch, logs):
            logs["custom"] = 1.0

    # The step's own metrics ("acc", from Aux.metrics), a logger's "lr", a user's key: fine.
    _, history = fit(
        ts,
        loss_fn,
        opt,
        train_data,
        epochs=1,
        progress=False,
        callbacks=[
            callbacks.LearningRateLogger(0.1),
            AddsKey(),
            callbacks.EarlyStopping("acc"),
            callbacks.EarlyStopping("lr"),
            callbacks.EarlyStopping("custom"),
        ],
    )
    assert len(history) == 1


def test_callback_arguments_that_would_silently_do_nothing_are_refused(tmp_path):
    from funcnet import _checks as checks

    # every_steps=0 / every_epochs=0 never saved; every_steps=-1 saved at every step.
    for kw, says in (
        ({"every_steps": 0}, "every_steps"),
        ({"every_steps": -1}, "every_steps"),
        ({"every_epochs": 0}, "every_epochs"),
        ({"every_epochs": 1.5}, "every_epochs"),
        ({"every_steps": None, "every_epochs": None}, "would never save"),
    ):
        with pytest.raises(checks.ArgumentError, match=rf"Checkpoint: .*{says}"):
            callbacks.Checkpoint(tmp_path / "a", **kw)
    for kw, says in (
        ({"patience": -1}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"min_delta": -0.1}, "min_delta"),
        ({"monitor": 3}, "monitor"),
    ):
        with pytest.raises(checks.ArgumentError, match=rf"EarlyStopping: {says}"):
            callbacks.EarlyStopping(**kw)
    callbacks.EarlyStopping(patience=0)  # Keras' meaning: stop at the first epoch without gain
