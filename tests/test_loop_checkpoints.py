"""fit with both checkpoint backends: bit-identical resume, run ownership, a mistyped
resume_from, and non-finite losses."""

import warnings

import jax
import numpy as np
import pytest

from funcnet import callbacks, checkpoint, data
from funcnet.loop import fit
from funcnet.loop import FitOptions
from helpers.training import X, Y, Crash, CrashAt, fit_setup, params_equal

BACKENDS = [
    "npz",
    pytest.param(
        "orbax",
        marks=pytest.mark.skipif(
            not __import__("importlib").util.find_spec("orbax"), reason="orbax-checkpoint not installed"
        ),
    ),
]


def checkpointer(backend, directory, keep):
    if backend == "orbax":
        from funcnet.checkpoint import OrbaxCheckpointer

        return OrbaxCheckpointer(directory, keep=keep)
    return checkpoint.NpzCheckpointer(directory, keep=keep)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_is_bit_identical_with_both_backends(tmp_path, backend):
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.3)
    full, _ = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    saver = callbacks.Checkpoint(tmp_path, every_steps=5, every_epochs=None, keep=2, backend=backend)
    with pytest.raises(Crash):
        fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[saver, CrashAt(13)], **kw)
    saver.checkpointer.wait()  # an async save may still be committing after the crash
    assert saver.checkpointer.all_steps() == [5, 10]
    run_id = saver.checkpointer.info().run_id
    # the resumed run keeps saving into the same directory, under the same run id
    ckptr = checkpointer(backend, tmp_path, keep=2)
    again = callbacks.Checkpoint(ckptr, every_steps=5, every_epochs=None)
    resumed, history = fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[again], resume_from=ckptr, **kw)
    assert int(resumed.step) == int(full.step) == 16
    params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
    np.testing.assert_array_equal(jax.random.key_data(resumed.rng), jax.random.key_data(full.rng))
    assert history[0]["epoch"] == 1
    assert again.checkpointer.all_steps() == [10, 15]
    assert again.checkpointer.info().run_id == run_id


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_run_refuses_an_old_runs_directory(tmp_path, backend):
    ts, loss_fn, opt, train_data, _ = fit_setup()
    kw = dict(progress=False)
    fit(
        ts,
        loss_fn,
        opt,
        train_data,
        epochs=1,
        callbacks=[callbacks.Checkpoint(tmp_path, every_epochs=1, backend=backend)],
        **kw,
    )
    with pytest.raises(checkpoint.CheckpointOwnershipError, match="resume from it"):
        fit(
            ts,
            loss_fn,
            opt,
            train_data,
            epochs=1,
            callbacks=[callbacks.Checkpoint(tmp_path, every_epochs=1, backend=backend)],
            **kw,
        )
    fit(
        ts,
        loss_fn,
        opt,
        train_data,
        epochs=1,
        callbacks=[callbacks.Checkpoint(tmp_path, every_epochs=1, backend=backend, overwrite=True)],
        **kw,
    )


def test_mistyped_resume_from_is_an_error_and_missing_ok_starts_fresh(tmp_path):
    ts, loss_fn, opt, train_data, kw = fit_setup()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("hi")
    for path, says in ((tmp_path / "runz", "does not exist"), (tmp_path / "runs", "notes.txt")):
        with pytest.raises(FileNotFoundError) as info:
            fit(ts, loss_fn, opt, train_data, epochs=1, resume_from=path, **kw)
        assert str(path) in str(info.value) and says in str(info.value)
        assert "missing_ok=True" in str(info.value)
    out, history = fit(
        ts, loss_fn, opt, train_data, epochs=1, resume_from=tmp_path / "runz", options=FitOptions(missing_ok=True), **kw
    )
    assert history[0]["epoch"] == 0 and int(out.step) == 8


def nan_data(bad_step):
    """Batches of the usual data; the global step ``bad_step`` (1-based) gets a NaN input."""

    def batches(epoch):
        for i, (x, y) in enumerate(data.batches((X, Y), 32, shuffle=True, rng=7, epoch=epoch)):
            if epoch * 8 + i + 1 == bad_step:
                x = np.full_like(x, np.nan)
            yield x, y

    return batches


def test_nonfinite_loss_raises_naming_epoch_and_step_and_keeps_last_finite_checkpoint(tmp_path):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    saver = callbacks.Checkpoint(tmp_path, every_steps=2, every_epochs=None, keep=2)
    with pytest.raises(FloatingPointError, match=r"non-finite \(nan\) at epoch 1, step 11"):
        fit(ts, loss_fn, opt, nan_data(11), epochs=3, callbacks=[saver], **kw)
    # steps 12, 14, 16 were saved with NaN params; keep=2 still kept step 10, the last good one
    assert checkpoint.all_steps(tmp_path) == [10, 14, 16]
    assert checkpoint.latest_step(tmp_path, finite_only=True) == 10
    resumed, history = fit(ts, loss_fn, opt, nan_data(-1), epochs=2, resume_from=tmp_path, **kw)
    assert np.isfinite(history[-1]["loss"]) and int(resumed.step) == 16


def test_nonfinite_loss_seen_at_a_progress_refresh_stops_mid_epoch(tmp_path):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    kw["progress"] = True
    seen = []

    class Steps(callbacks.Callback):
        def on_step_end(self, ctx, step):
            seen.append(step)

    with pytest.raises(FloatingPointError, match="at epoch 0, step 4"):
        fit(ts, loss_fn, opt, nan_data(4), epochs=1, callbacks=[Steps()], options=FitOptions(log_every=2), **kw)
    assert max(seen) == 4  # the refresh after step 4 saw it, not the end of the epoch


@pytest.mark.parametrize("mode", ["warn", "ignore"])
def test_nonfinite_loss_may_be_trained_through(tmp_path, mode):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    saver = callbacks.Checkpoint(tmp_path, every_epochs=1, keep=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history = fit(
            ts, loss_fn, opt, nan_data(11), epochs=3, callbacks=[saver], options=FitOptions(on_nonfinite=mode), **kw
        )
    hits = [w for w in caught if "non-finite" in str(w.message)]
    assert len(hits) == (1 if mode == "warn" else 0)
    assert len(history) == 3 and np.isnan(history[1]["loss"])
    assert checkpoint.all_steps(tmp_path) == [8, 24]  # step 16's was rotated, 8 is the last finite
    assert checkpoint.all_steps(tmp_path, finite_only=True) == [8]
    with pytest.raises(ValueError, match="on_nonfinite"):
        fit(ts, loss_fn, opt, nan_data(11), epochs=1, options=FitOptions(on_nonfinite="skip"), **kw)
