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
