"""fit's option combinations that would do nothing (or fail late): eval_on_ema without an
EMA that moves, Profile windows inside a dispatch / overlapping / left running after an
error, a learning rate that is NaN from the start or later (issue G3)."""

import glob

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import callbacks, data, metrics
from funcnet.errors import ArgumentError
from funcnet.layers import Dense
from funcnet.loop._epoch import _dispatch_plan
from funcnet.train import Aux, TrainState
from funcnet.loop import FitOptions
from helpers.profile_marks import step_marks

X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
Y = X.sum(1, keepdims=True)
NET = Dense(1)


def _loss(params, state, batch, rng):
    pred, state = NET.apply(params, state, batch[0])
    return jnp.mean((pred - batch[1]) ** 2), Aux(state=state)


def _ts(opt=optax.sgd(0.05), **kw):
    return TrainState.create(NET, opt, jax.random.key(0), (-1, 4), **kw)


def _eval_kw():
    mse = metrics.MSE()

    def eval_fn(params, state, batch):
        return mse.update(mse.init(), NET.apply(params, state, batch[0])[0], batch[1])

    return dict(eval_data=[(X, Y)], eval_fn=eval_fn, metric=mse)


# -- eval_on_ema ---------------------------------------------------------------


def _fit_on_ema(ts):
    """fit asked to evaluate the moving average (nothing in the step updates one)."""
    funcnet.fit(
        ts,
        _loss,
        optax.sgd(0.05),
        data.DeviceData((X, Y), 16),
        progress=False,
        options=FitOptions(eval_on_ema=True),
        **_eval_kw(),
    )


def test_eval_on_ema_without_an_ema_in_the_state_is_refused_before_training():
    with pytest.raises(ArgumentError, match=r"TrainState keeps no EMA.*ema=True") as e:
        _fit_on_ema(_ts())
    assert not hasattr(e.value, "train_state")  # before the first step


def test_eval_on_ema_without_ema_decay_would_evaluate_the_initial_params():
    # The old loop logged the initial params' metrics every epoch here, without a word.
    with pytest.raises(ArgumentError, match=r"no ema_decay.*initial params.*'ema_decay'"):
        _fit_on_ema(_ts(ema=True))
    with pytest.raises(ArgumentError, match=r"ema=True.*and pass step_options"):
        _fit_on_ema(_ts())


def test_eval_on_ema_without_an_evaluation_is_refused():
    with pytest.raises(ArgumentError, match=r"eval_on_ema=True but no evaluation"):
        funcnet.fit(
            _ts(ema=True),
            _loss,
            optax.sgd(0.05),
            data.DeviceData((X, Y), 16),
            progress=False,
            options=FitOptions(eval_on_ema=True, step_options={"ema_decay": 0.9}),
        )


# -- Profile -------------------------------------------------------------------


def test_dispatch_plan_ends_dispatches_at_the_edges():
    assert _dispatch_plan(0, 8, 0, 16) == [(0, 8), (8, 8)]
    assert _dispatch_plan(0, 8, 0, 16, (2, 3)) == [(0, 2), (2, 1), (3, 5), (8, 8)]
    assert _dispatch_plan(10, 4, 2, 8, (11, 40)) == [(2, 1), (3, 1), (4, 4)]  # resumed


def test_profile_window_inside_one_dispatch_is_traced(tmp_path):
    ends = []

    class Count(callbacks.Callback):
        every_steps = None  # keeps fit's dispatch size, as Profile does
        log_keys = ()

        def on_step_end(self, ctx, step):
            ends.append(step)

    # 8 steps per dispatch; the window (2, 3] lies inside the first: the old loop never
    # started the trace (nothing written, nothing said).
    funcnet.fit(
        _ts(),
        _loss,
        optax.sgd(0.05),
        data.DeviceData((X, Y), 8),
        epochs=2,
        progress=False,
        callbacks=[Count(), callbacks.Profile(tmp_path / "p", steps=(2, 3))],
        options=FitOptions(log_every=8),
    )
    assert ends == [2, 3, 8, 16]  # only the window's edges split a dispatch
    assert step_marks(tmp_path / "p") == [3]


def test_profile_stops_its_trace_when_fit_fails_inside_the_window(tmp_path):
    class Boom(callbacks.Callback):
        log_keys = ()
        every_steps = None

        def on_step_end(self, ctx, step):
            if step == 3:
                raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        funcnet.fit(
            _ts(),
            _loss,
            optax.sgd(0.05),
            [(X[:16], Y[:16])] * 4,
            progress=False,
            callbacks=[callbacks.Profile(tmp_path / "a", steps=(1, 4)), Boom()],
        )
    # The trace was stopped (and written): the next one starts. The old loop left it
    # running, and this failed with "Only one profile may be run at a time".
    assert glob.glob(str(tmp_path / "a" / "**" / "*.xplane.pb"), recursive=True)
    jax.profiler.start_trace(str(tmp_path / "b"))
    jax.profiler.stop_trace()


def test_profile_stops_its_trace_when_a_later_callback_fails_to_begin(tmp_path):
    class BadBegin(callbacks.Callback):
        log_keys = ()

        def on_train_begin(self, ctx):
            raise OSError("no")

    with pytest.raises(OSError, match="no"):
        funcnet.fit(
            _ts(),
            _loss,
            optax.sgd(0.05),
            [(X[:16], Y[:16])],
            progress=False,
            callbacks=[callbacks.Profile(tmp_path / "a", steps=(0, 1)), BadBegin()],
        )
    jax.profiler.start_trace(str(tmp_path / "b"))
    jax.profiler.stop_trace()


def test_overlapping_profile_windows_are_refused_before_training(tmp_path):
    def run(*windows):
        funcnet.fit(
            _ts(),
            _loss,
            optax.sgd(0.05),
            [(X[:16], Y[:16])] * 4,
            progress=False,
            callbacks=[callbacks.Profile(tmp_path / str(w), steps=w) for w in windows],
        )

    with pytest.raises(ValueError, match=r"\(1, 3\).*\(2, 4\)\) overlap.*steps=\(1, 4\)"):
        run((1, 3), (2, 4))
    with pytest.raises(ValueError, match=r"List Profile\(steps=\(1, 2\)\) first"):
        run((2, 3), (1, 2))
    run((1, 2), (2, 3))  # touching, in order: the first stops before the second starts
    assert step_marks(tmp_path / "(1, 2)") == [2] and step_marks(tmp_path / "(2, 3)") == [3]


def test_profile_says_so_when_another_trace_runs(tmp_path):
    jax.profiler.start_trace(str(tmp_path / "mine"))
    try:
        with pytest.raises(RuntimeError, match=r"another one is running.*stop_trace\(\)"):
            funcnet.fit(
                _ts(),
                _loss,
                optax.sgd(0.05),
                [(X[:16], Y[:16])],
                progress=False,
                callbacks=[callbacks.Profile(tmp_path / "p", steps=(0, 1))],
            )
    finally:
        jax.profiler.stop_trace()


def test_profile_window_outside_the_run_is_warned_about(tmp_path):
    ts = _ts()._replace(step=jnp.int32(10))  # e.g. a resumed run, past the window
    with pytest.warns(
        UserWarning,
        match=r"steps=\(2, 4\) holds none of this run's steps "
        r"\(11 to 12\)",
    ):
        funcnet.fit(
            ts,
            _loss,
            optax.sgd(0.05),
            [(X[:16], Y[:16])] * 2,
            progress=False,
            callbacks=[callbacks.Profile(tmp_path / "p", steps=(2, 4))],
        )


# -- a non-finite learning rate ------------------------------------------------


def _nan_at(step):
    return lambda count: jnp.where(count == step, jnp.nan, 0.05)


def test_a_schedule_nan_at_step_0_is_named_in_the_nonfinite_loss_error():
    opt = optax.sgd(_nan_at(0))
    with pytest.raises(
        FloatingPointError,
        match=r"non-finite \(nan\) at epoch 0, step 2.*"
        r"optimizer itself.*step 1 \(optimizer count "
        r"0\).*schedule\(0\)",
    ):
        funcnet.fit(_ts(opt), _loss, opt, data.DeviceData((X, Y), 16), progress=False)


def test_a_schedule_nan_later_is_named_at_its_count():
    opt = optax.adam(_nan_at(5))
    with pytest.raises(FloatingPointError, match=r"step 7 .*optimizer count 5\)"):
        funcnet.fit(_ts(opt), _loss, opt, data.DeviceData((X, Y), 8), progress=False)


def test_a_diverging_loss_with_a_finite_rate_adds_no_optimizer_note():
    opt = optax.sgd(1e6)
    with pytest.raises(FloatingPointError, match="non-finite") as e:
        funcnet.fit(_ts(opt), _loss, opt, data.DeviceData((X * 1e3, Y), 8), epochs=4, progress=False)
    assert "optimizer itself" not in str(e.value)


def test_an_injected_learning_rate_nan_at_the_start_is_refused_before_training():
    opt = optax.inject_hyperparams(optax.sgd)(learning_rate=_nan_at(0))
    with pytest.raises(
        FloatingPointError,
        match=r"first step \(step 0\): "
        r".*\['learning_rate'\] = nan",
    ) as e:
        funcnet.fit(_ts(opt), _loss, opt, data.DeviceData((X, Y), 16), progress=False)
    assert not hasattr(e.value, "train_state")  # before the first step
    with pytest.warns(RuntimeWarning) as record:  # "warn" trains on, and says so twice
        funcnet.fit(
            _ts(opt), _loss, opt, data.DeviceData((X, Y), 16), progress=False, options=FitOptions(on_nonfinite="warn")
        )
    said = [str(w.message) for w in record]
    assert any("not finite at the run's first step" in m for m in said)
    assert any("non-finite (nan) at epoch 0, step 2" in m and "optimizer itself" in m for m in said)


def test_a_learning_rate_logger_schedule_nan_at_the_start_is_refused_before_training():
    schedule = _nan_at(0)
    opt = optax.sgd(schedule)
    with pytest.raises(FloatingPointError, match=r"LearningRateLogger's schedule\(0\) = nan"):
        funcnet.fit(
            _ts(opt),
            _loss,
            opt,
            data.DeviceData((X, Y), 16),
            progress=False,
            callbacks=[callbacks.LearningRateLogger(schedule)],
        )
