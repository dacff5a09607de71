"""Keras's two callbacks on an evaluation metric: ReduceLROnPlateau (the rate changed in the
optimizer state, the step not compiled again) and Checkpoint(best=...) (keeps the best
epoch), both resumable."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import checkpoint
from funcnet.callbacks import Callback, Checkpoint, EarlyStopping, ReduceLROnPlateau
from funcnet.errors import ArgumentError
from funcnet.layers import Dense

NET = Dense(1)
DATA = [np.ones((4, 2), np.float32)] * 2
TRACES = []


def _loss(params, state, x, rng):
    TRACES.append(1)  # once per compilation
    return 0.0 * jnp.sum(params["W"]) + 1.0, funcnet.Aux(state=state)


class Script(Callback):
    """Logs a scripted "score" per epoch, as an evaluation would."""

    log_keys = ("score",)

    def __init__(self, scores):
        self.scores = scores

    def on_epoch_end(self, ctx, epoch, logs):
        logs["score"] = self.scores[epoch]


def _ts(opt):
    return funcnet.TrainState.create(NET, opt, jax.random.key(0), (-1, 2))


def _keras_rates(scores, lr, factor, patience, cooldown, min_lr, min_delta=1e-4):
    """Keras 3's ReduceLROnPlateau.on_epoch_end, transcribed (mode "min")."""
    best, wait, cool, rates = np.inf, 0, 0, []
    for current in scores:
        if cool > 0:
            cool, wait = cool - 1, 0
        if current < best - min_delta:
            best, wait = current, 0
        elif cool <= 0:
            wait += 1
            if wait >= patience and lr > min_lr:
                lr, cool, wait = max(lr * factor, min_lr), cooldown, 0
        rates.append(lr)
    return rates


class Rates(Callback):
    log_keys = ()

    def __init__(self):
        self.seen = []

    def on_epoch_end(self, ctx, epoch, logs):
        self.seen.append(float(ctx.train_state.opt_state.hyperparams["learning_rate"]))


@pytest.mark.parametrize("patience,cooldown,min_lr", [(1, 0, 0.0), (2, 1, 0.0), (1, 2, 0.02)])
def test_reduce_lr_on_plateau_follows_keras_rule_without_compiling_again(patience, cooldown, min_lr):
    scores = [5.0, 4.0, 4.0, 4.5, 3.0, 3.0, 3.0, 3.0, 2.0, 2.5]
    opt = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    rates = Rates()
    TRACES.clear()
    funcnet.fit(
        _ts(opt),
        _loss,
        opt,
        DATA,
        epochs=len(scores),
        progress=False,
        callbacks=[
            Script(scores),
            ReduceLROnPlateau("score", factor=0.5, patience=patience, cooldown=cooldown, min_lr=min_lr),
            rates,
        ],
    )
    want = _keras_rates(scores, 0.1, 0.5, patience, cooldown, min_lr)
    np.testing.assert_allclose(rates.seen, want, rtol=1e-6)
    assert want[-1] < 0.1  # the run did reduce
    reducing, TRACES[:] = len(TRACES), []
    funcnet.fit(_ts(opt), _loss, opt, DATA, epochs=len(scores), progress=False, callbacks=[Script(scores)])
    assert reducing == len(TRACES)  # no trace more: the rate lives in the state


def test_reduce_lr_on_plateau_resumes_with_its_wait_and_cooldown(tmp_path):
    scores = [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.adam)(learning_rate=0.1))

    def run(epochs, resume=False):
        cbs = [
            Script(scores),
            ReduceLROnPlateau("score", factor=0.5, patience=2, cooldown=1),
            Checkpoint(tmp_path, overwrite=not resume),
        ]
        ts, _ = funcnet.fit(
            _ts(opt),
            _loss,
            opt,
            DATA,
            epochs=epochs,
            progress=False,
            callbacks=cbs,
            resume_from=tmp_path if resume else None,
        )
        return float(ts.opt_state[1].hyperparams["learning_rate"]), cbs[1]

    whole, _ = run(6)
    run(2)  # stops inside a wait: forgotten, the resumed run reduces late
    resumed, cb = run(6, resume=True)
    assert resumed == whole == pytest.approx(_keras_rates(scores, 0.1, 0.5, 2, 1, 0.0)[-1])


def test_reduce_lr_on_plateau_needs_an_injected_rate_and_sane_arguments():
    opt = optax.sgd(0.1)
    with pytest.raises(
        ValueError,
        match=r"no injected hyperparameter 'learning_rate'.*"
        r"optax.inject_hyperparams",
    ):
        funcnet.fit(_ts(opt), _loss, opt, DATA, progress=False, callbacks=[Script([1.0]), ReduceLROnPlateau("score")])
    for bad in (0.0, 1.0, 2.0):
        with pytest.raises(ArgumentError, match="factor"):
            ReduceLROnPlateau(factor=bad)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        ReduceLROnPlateau(mode="lowest")
    with pytest.raises(
        ValueError,
        match=r"ReduceLROnPlateau: monitor='eval_loss' is not a key "
        r"fit will log.*no evaluation",
    ):
        funcnet.fit(
            _ts(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)),
            _loss,
            optax.sgd(0.1),
            DATA,
            progress=False,
            callbacks=[ReduceLROnPlateau()],
        )


def _saved_steps(directory):
    return sorted(int(f[5:-4]) for f in os.listdir(directory) if f.startswith("ckpt-"))


def test_checkpoint_best_saves_only_improvements_and_its_latest_is_the_best(tmp_path):
    opt = optax.sgd(0.1)
    scores = [3.0, 1.0, 2.0, 0.5, 0.7]  # best at epochs 0, 1, 3
    best = Checkpoint(tmp_path / "best", best="score", keep=None)
    ts, _ = funcnet.fit(_ts(opt), _loss, opt, DATA, epochs=5, progress=False, callbacks=[Script(scores), best])
    assert _saved_steps(tmp_path / "best") == [2, 4, 8]  # 2 steps an epoch
    restored = checkpoint.restore_train_state(tmp_path / "best", ts)
    assert int(restored.step) == 8
    mx = Checkpoint(tmp_path / "max", best="score", mode="max", keep=None)
    funcnet.fit(_ts(opt), _loss, opt, DATA, epochs=5, progress=False, callbacks=[Script(scores), mx])
    assert _saved_steps(tmp_path / "max") == [2]


def test_checkpoint_best_resumes_comparing_with_the_saved_best(tmp_path):
    """Resumed from the latest-epoch Checkpoint, the best one keeps its best value (2.0 from
    epoch 1): epoch 2's 2.5 is not saved, epoch 3's 1.0 is. Forgetting it would save 2.5."""
    opt = optax.sgd(0.1)
    scores = [3.0, 2.0, 2.5, 1.0]

    def run(epochs, resume):
        cbs = [
            Script(scores),
            Checkpoint(tmp_path / "last", overwrite=not resume),
            Checkpoint(tmp_path / "best", best="score", keep=None, overwrite=not resume),
        ]
        funcnet.fit(
            _ts(opt),
            _loss,
            opt,
            DATA,
            epochs=epochs,
            progress=False,
            callbacks=cbs,
            resume_from=tmp_path / "last" if resume else None,
        )

    run(2, resume=False)
    assert _saved_steps(tmp_path / "best") == [2, 4]
    run(4, resume=True)
    assert _saved_steps(tmp_path / "best") == [2, 4, 8]


def test_checkpoint_best_arguments_are_checked():
    with pytest.raises(ArgumentError, match=r"best='score' .* every_steps=10"):
        Checkpoint("/tmp/x", best="score", every_steps=10, every_epochs=None)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        Checkpoint("/tmp/x", best="score", mode="up")
    with pytest.raises(ValueError, match=r"Checkpoint: best='eval_acc' is not a key fit will log"):
        funcnet.fit(
            _ts(optax.sgd(0.1)),
            _loss,
            optax.sgd(0.1),
            DATA,
            progress=False,
            callbacks=[Checkpoint("/tmp/never-written", best="eval_acc")],
        )


def test_early_stopping_keeps_its_behaviour_on_the_shared_monitor():
    stop = EarlyStopping("score", patience=1)
    _, history = funcnet.fit(
        _ts(optax.sgd(0.1)),
        _loss,
        optax.sgd(0.1),
        DATA,
        epochs=5,
        progress=False,
        callbacks=[Script([3.0, 2.0, 2.5, 1.0, 0.0]), stop],
    )
    assert len(history) == 3 and stop.best == 2.0 and stop.wait == 1
