"""What fit shows: one summary line per epoch on stderr by default (terminal or not), a
tqdm bar that stays when the epoch ends where output is interactive, nothing with
progress=False, and the plain line when tqdm is missing."""

import re
import sys
import types

import optax
import pytest

from funcnet import callbacks
from funcnet.loop import fit
from funcnet.loop import FitOptions
from helpers.training import Crash, CrashAt, fit_setup

_LINE = re.compile(
    r"^epoch (\d)/2: 8 steps, \d+\.\d\d s, loss=\S+ acc=\S+ eval_acc=\S+ "
    r"eval_loss=\S+$",
    re.M,
)
_BAR = re.compile(r"epoch (\d)/2: 8step \[[^\r\n]*\] *\n")  # a bar's last draw, kept (tqdm pads it)


def _run(capsys, print_fn=None, **kw):
    ts, loss_fn, opt, train_data, base = fit_setup()
    capsys.readouterr()
    fit(ts, loss_fn, opt, train_data, epochs=2, options=FitOptions(log_every=4, print_fn=print_fn), **dict(base, **kw))
    return capsys.readouterr()


def test_by_default_each_epoch_prints_one_line_on_stderr_in_any_output(capsys):
    out = _run(capsys, progress=None)  # captured: not a terminal, like a log file
    assert out.out == ""  # stdout stays the script's
    assert _LINE.findall(out.err) == ["1", "2"], out.err
    assert not _BAR.search(out.err) and "step/s" not in out.err  # no bar in a log file


def test_progress_false_shows_nothing(capsys):
    out = _run(capsys, progress=False)
    assert (out.out, out.err) == ("", "")


def test_the_bar_stays_when_an_epoch_ends_and_the_line_follows_it(capsys):
    pytest.importorskip("tqdm.auto")
    err = _run(capsys, progress=True).err
    assert _BAR.findall(err) == ["1", "2"], err  # tqdm's leave=False would erase it
    assert _LINE.findall(err) == ["1", "2"]
    assert err.index("epoch 1/2: 8step") < err.index("epoch 1/2: 8 steps") < err.index("epoch 2/2: 8step")


def test_a_jupyter_kernel_gets_the_bar_though_stderr_is_not_a_terminal(capsys, monkeypatch):
    pytest.importorskip("tqdm.auto")  # imported before the stand-in: a terminal's tqdm
    shell = types.SimpleNamespace(config={"IPKernelApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    err = _run(capsys, progress=None).err
    assert _BAR.findall(err) == ["1", "2"] and _LINE.findall(err) == ["1", "2"]


def test_without_tqdm_the_line_is_the_fallback(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import tqdm.auto: ImportError
    err = _run(capsys, progress=None).err
    assert _LINE.findall(err) == ["1", "2"] and "tqdm" not in err
    err = _run(capsys, progress=True).err
    assert err.count("progress=True but tqdm is not installed (pip install tqdm)") == 1
    assert _LINE.findall(err) == ["1", "2"] and not _BAR.search(err)


def test_print_fn_receives_the_line_instead_of_stderr(capsys):
    lines = []
    out = _run(capsys, progress=None, print_fn=lines.append)
    assert out.err == "" and len(lines) == 2
    assert lines[0].startswith("epoch=0 loss=") and " eval_acc=" in lines[0]


def test_the_line_has_what_callbacks_add_and_counts_a_resumed_epochs_steps(capsys, tmp_path):
    ts, loss_fn, opt, train_data, base = fit_setup()
    sched = optax.constant_schedule(1e-2)
    kw = dict(base, progress=None, callbacks=[callbacks.LearningRateLogger(sched)])
    capsys.readouterr()
    fit(ts, loss_fn, opt, train_data, epochs=1, **kw)
    assert re.search(r"^epoch 1/1: 8 steps, .* eval_loss=\S+ lr=0\.01$", capsys.readouterr().err, re.M)

    saver = callbacks.Checkpoint(tmp_path, every_steps=3)
    with pytest.raises(Crash):
        fit(ts, loss_fn, opt, train_data, epochs=1, **dict(base, callbacks=[saver, CrashAt(3)]))
    capsys.readouterr()
    fit(ts, loss_fn, opt, train_data, epochs=1, resume_from=tmp_path, **dict(base, progress=None))
    assert re.search(r"^epoch 1/1: 5 steps, ", capsys.readouterr().err, re.M)


def test_a_fit_that_fails_mid_epoch_closes_its_bar(capsys):
    pytest.importorskip("tqdm.auto")
    ts, loss_fn, opt, train_data, base = fit_setup()

    capsys.readouterr()
    with pytest.raises(Crash) as failed:  # its traceback keeps fit's frame, and the bar, alive
        fit(ts, loss_fn, opt, train_data, epochs=2, **dict(base, progress=True, callbacks=[CrashAt(3)]))
    # Closed where it stood (left open, it would stay half drawn, holding tqdm's line 0).
    assert re.search(r"epoch 1/2: \d+step \[[^\r\n]*\] *\n$", capsys.readouterr().err)
    assert failed.value.train_state is not None


def test_the_bar_redraws_at_tqdms_pace_not_once_per_dispatch(capsys):
    """The loss and samples/s ride on the bar's next draw, which tqdm rate-limits (0.1 s),
    so a dispatch-bound epoch is not slowed by a redraw per dispatch; the last draw has them."""
    pytest.importorskip("tqdm.auto")
    ts, loss_fn, opt, _, _ = fit_setup(dropout=0.0)
    from helpers.training import X, Y
    from funcnet import data

    steps = len(X)  # one example per batch: one step per dispatch, a bar update each
    capsys.readouterr()
    fit(
        ts,
        loss_fn,
        opt,
        lambda epoch: data.batches((X, Y), 1, shuffle=True, rng=3, epoch=epoch),
        epochs=1,
        progress=True,
        options=FitOptions(log_every=1, steps_per_dispatch=1),
    )
    err = capsys.readouterr().err
    draws = err.count("\r")
    assert steps >= 200 and draws < steps // 4, (steps, draws)
    last = err.split("\r")[-1]
    assert f"{steps}/{steps}" in last or f"{steps}step" in last, last
    assert "loss=" in last and "samples_s=" in last, last
