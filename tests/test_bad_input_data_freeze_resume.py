"""Bad input and injected faults for the features of the second reliability round (issue 24):
device data, target-network updates, freeze masks, resuming at an epoch's end. Each case is a
real call; each error must name the argument and say what would fix it."""

import importlib.util
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import callbacks, checkpoint, data, distributed, optim, sharding
from funcnet.loop import _fit as loop_module
from funcnet.loop._resume import checkpoint_extras
from funcnet import serial
from funcnet.inference import make_predict_fn
from funcnet.layers import Dense, Embedding, Relu
from funcnet.loop import FitOptions, fit
from funcnet.params import freeze, subtree_mask
from funcnet.train import TrainState, copy_params, polyak_update
from helpers.training import X, Y, Crash, CrashAt, fit_setup, params_equal

# This file also checks fit(devices=N), the deprecated pmap placement, which still works.
pytestmark = pytest.mark.filterwarnings(r"ignore:fit\(devices=:DeprecationWarning")

KEY = jax.random.key(0)
BIG = np.array([1, 2**40, 3, 4], np.int64)  # int32 cannot hold 2**40 (x64 is off in tests)


# --- 4. one x32 check on every path that puts host data on a device -------------------


@pytest.mark.parametrize(
    "put",
    [
        lambda: data.DeviceData((np.ones((4, 2), np.float32), BIG), 2),
        lambda: data.DeviceData({"ids": BIG}, 2),
        lambda: list(data.prefetch_to_device([{"ids": BIG}])),
        lambda: distributed.shard_batch(distributed.data_mesh(), {"ids": BIG}),
        lambda: _fit_on([(X[:4], BIG)]),
        lambda: _fit_on([(X[:4], BIG)], options=FitOptions(prefetch=2)),
        lambda: _fit_on([(X[:4], BIG)], devices=1),
        lambda: _fit_on([(X[:4], BIG)], mesh=distributed.data_mesh()),
        lambda: _fit_on([(X[:4], Y[:4])], eval_data=[(X[:4], BIG)]),
        lambda: sharding.shard_params({"a": BIG}, distributed.data_mesh(), []),
        lambda: make_predict_fn(Embedding(4, 2), {"a": BIG}),
        lambda: _predict_ids(BIG),
    ],
    ids=[
        "DeviceData-tuple",
        "DeviceData-dict",
        "prefetch_to_device",
        "shard_batch",
        "fit",
        "fit-prefetch",
        "fit-pmap",
        "fit-mesh",
        "fit-eval",
        "shard_params",
        "make_predict_fn-params",
        "make_predict_fn-inputs",
    ],
)
def test_int64_values_int32_cannot_hold_are_refused_everywhere(put):
    with pytest.raises(
        ValueError,
        match=r"holds 1099511627776, which int32 cannot hold.*"
        r"jax_enable_x64",
    ):
        put()


def _fit_on(train_data, eval_data=None, **kw):
    ts, loss_fn, opt, _, fit_kw = fit_setup(dropout=0.0)
    if eval_data is not None:
        fit_kw["eval_data"] = eval_data
    return fit(ts, loss_fn, opt, train_data, epochs=1, **{**fit_kw, **kw})


def _predict_ids(ids):
    net = Embedding(4, 2)
    _, params, state = net.init(KEY, (-1,))
    return make_predict_fn(net, params, state)(ids)


def test_int64_values_that_fit_still_go_on_device():
    dd = data.DeviceData((np.arange(4, dtype=np.int64),), 2)
    assert [np.asarray(b[0]).tolist() for b in dd(0)] == [[0, 1], [2, 3]]


# --- 5. polyak_update's tau and copy_params's shapes -----------------------------------


def _two():
    q = serial(Dense(4), Relu, Dense(2))
    return TrainState.create({"online": (q, (-1, 3)), "target": (q, (-1, 3))}, {"online": optax.sgd(0.1)}, KEY)


@pytest.mark.parametrize(
    "tau,err,match",
    [
        (1.5, ValueError, r"tau must be in \[0, 1\].*got 1.5.*tau=0.005"),
        (-0.1, ValueError, r"tau must be in \[0, 1\].*got -0.1"),
        (np.array([0.1, 0.2]), ValueError, r"tau must be in \[0, 1\]"),
        ("0.005", TypeError, r"tau must be a number.*string '0.005'.*float\('0.005'\)"),
    ],
)
def test_polyak_update_refuses_a_tau_outside_0_1(tau, err, match):
    with pytest.raises(err, match=match):
        polyak_update(_two(), "online", "target", tau)


def test_polyak_update_still_takes_edges_and_a_traced_tau():
    ts = _two()
    params_equal(polyak_update(ts, "online", "target", 1.0).params["target"], ts.params["online"])
    params_equal(polyak_update(ts, "online", "target", 0).params["target"], ts.params["target"])
    soft = jax.jit(lambda t, tau: polyak_update(t, "online", "target", tau))(ts, 0.25)
    jax.tree.map(
        lambda s, o, t: np.testing.assert_allclose(s, 0.25 * o + 0.75 * t, rtol=1e-6),
        soft.params["target"],
        ts.params["online"],
        ts.params["target"],
    )


@pytest.mark.parametrize("fn", [copy_params, lambda ts, a, b: polyak_update(ts, a, b, 0.5)])
def test_copy_between_architectures_of_one_structure_is_refused(fn):
    with pytest.raises(
        ValueError,
        match=r"different architectures: params\[0\]\['W'\] has shape "
        r"\(3, 4\) in 'online' but \(3, 5\) in 'target'.*"
        r"same layer and input shape",
    ):
        fn(_mismatched(), "online", "target")


def _mismatched():  # one structure, other shapes
    q, other = serial(Dense(4), Relu, Dense(2)), serial(Dense(5), Relu, Dense(2))
    return TrainState.create({"online": (q, (-1, 3)), "target": (other, (-1, 3))}, {"online": optax.sgd(0.1)}, KEY)


# --- 6. freeze's mask ------------------------------------------------------------------

PARAMS = {"encoder": {"W": jnp.ones(2)}, "decoder": {"W": jnp.ones(2)}}


@pytest.mark.parametrize(
    "mask,err,match",
    [
        (
            {"encoder": {"W": False}, "decoder": {"W": False}},
            ValueError,
            r"mask selects no parameter.*typo in a path prefix.*allow_empty=True",
        ),
        (lambda p: jax.tree.map(lambda _: False, p), ValueError, r"allow_empty=True"),
        ({"encoder": True}, ValueError, r"mask must have the params' structure.*subtree_mask"),
        (
            {"encoder": {"W": np.array([True, False])}, "decoder": {"W": False}},
            TypeError,
            r"mask\['encoder'\]\['W'\] must be one bool per parameter array.*element-wise",
        ),
        ({"encoder": {"W": 1}, "decoder": {"W": 0}}, TypeError, r"must be one bool"),
    ],
)
def test_freeze_refuses_masks_that_cannot_mean_what_was_meant(mask, err, match):
    opt = freeze(optax.sgd(0.5), mask)
    with pytest.raises(err, match=match):
        opt.init(PARAMS)


def test_freeze_allow_empty_opts_out_and_a_real_mask_still_works():
    nothing = {"encoder": {"W": False}, "decoder": {"W": False}}
    opt = freeze(optax.sgd(0.5), nothing, allow_empty=True)
    updates, _ = opt.update(PARAMS, opt.init(PARAMS), PARAMS)
    assert updates["encoder"]["W"].tolist() == [-0.5, -0.5]
    opt = freeze(optax.sgd(0.5), lambda p: subtree_mask(p, "encoder"))
    updates, _ = jax.jit(opt.update)(PARAMS, opt.init(PARAMS), PARAMS)
    assert updates["encoder"]["W"].tolist() == [0.0, 0.0]
    with pytest.raises(TypeError, match="allow_empty"):
        freeze(optax.sgd(0.5), nothing, allow_empty="yes")


# --- resuming from a checkpoint taken at an epoch's last step --------------------------


@pytest.mark.parametrize("pipeline", ["host", "device"])
def test_resume_from_a_checkpoint_at_an_epochs_last_step(tmp_path, pipeline):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    x, y = X[:24], Y[:24]  # 3 steps per epoch
    train_data = (
        data.DeviceData((x, y), 8, shuffle=True, rng=3)
        if pipeline == "device"
        else (lambda epoch: data.batches((x, y), 8, shuffle=True, rng=3, epoch=epoch))
    )
    full, _ = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    saver = callbacks.Checkpoint(tmp_path, every_steps=3, every_epochs=None)
    with pytest.raises(Crash):  # crashes after step 3 is saved, before epoch 0 ends
        fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[saver, CrashAt(3)], **kw)
    saver.checkpointer.wait()
    assert saver.checkpointer.all_steps() == [3]
    ckptr = checkpoint.NpzCheckpointer(tmp_path)
    resumed, history = fit(ts, loss_fn, opt, train_data, epochs=2, resume_from=ckptr, **kw)
    assert int(resumed.step) == int(full.step) == 6
    params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
    assert [h["epoch"] for h in history] == [0, 1]


# --- 1, 2 and "Done when": resume after every step of a 2-epoch fit, both pipelines ------


def _pipelines():
    x, y = X[:24], Y[:24]  # 3 steps of 8 per epoch
    return {
        "host": lambda epoch: data.batches((x, y), 8, shuffle=True, rng=3, epoch=epoch),
        "device": data.DeviceData((x, y), 8, shuffle=True, rng=3),
    }


def _early():  # mode="max": epoch 0 stays the best, so restore_best hands back its state
    return callbacks.EarlyStopping("eval_loss", patience=1, mode="max", restore_best=True)


@pytest.mark.parametrize("pipeline", ["host", "device"])
def test_resume_after_any_step_is_bit_identical_callbacks_included(tmp_path, pipeline):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.3)
    train_data = _pipelines()[pipeline]
    full, full_history = fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[_early()], **kw)
    assert int(full.step) == 3  # EarlyStopping's restored best: epoch 0's state
    for k in range(1, 7):
        where = tmp_path / str(k)
        saver = callbacks.Checkpoint(where, every_steps=1, every_epochs=None, keep=1)
        with pytest.raises(Crash):
            fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[saver, _early(), CrashAt(k)], **kw)
        saver.checkpointer.wait()
        ckptr = checkpoint.NpzCheckpointer(where, keep=1)
        resumed, history = fit(
            ts,
            loss_fn,
            opt,
            train_data,
            epochs=2,
            resume_from=ckptr,
            callbacks=[callbacks.Checkpoint(ckptr, every_steps=1, every_epochs=None), _early()],
            **kw,
        )
        assert int(resumed.step) == 3, k
        params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
        np.testing.assert_array_equal(jax.random.key_data(resumed.rng), jax.random.key_data(full.rng))
        # the whole history of the epochs it ran, the resumed epoch's training means
        # included (the checkpoint carries the sums of that epoch's earlier steps)
        assert _untimed(history) == _untimed([h for h in full_history if h["epoch"] >= (k - 1) // 3]), k


def test_a_checkpoint_without_epoch_sums_keeps_its_layout_and_callback_states(tmp_path, monkeypatch):
    # What an earlier funcnet writes: no epoch_metrics entry.
    # Its data layout and callback states must still be read, not dropped as "older".
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.3)
    train_data = _pipelines()["device"]
    full, _ = fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[_early()], **kw)
    saver = callbacks.Checkpoint(tmp_path, every_steps=1, every_epochs=None, keep=1)

    def without_sums(*args, **kwargs):
        extras = checkpoint_extras(*args, **kwargs)
        del extras["epoch_metrics"]
        return extras

    with monkeypatch.context() as m:
        m.setattr(loop_module, "checkpoint_extras", without_sums)
        with pytest.raises(Crash):
            fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[saver, _early(), CrashAt(4)], **kw)
    saver.checkpointer.wait()
    other = data.DeviceData((X[:24], Y[:24]), 4, shuffle=True, rng=3)
    with pytest.raises(
        ValueError,
        match=r"batch_size=8, but this fit's train_data has "
        r"batch_size=4",
    ):
        fit(
            ts,
            loss_fn,
            opt,
            other,
            epochs=2,
            resume_from=tmp_path,
            callbacks=[callbacks.Checkpoint(tmp_path), _early()],
            **kw,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "older funcnet" warning: nothing was dropped
        resumed, _ = fit(
            ts,
            loss_fn,
            opt,
            train_data,
            epochs=2,
            resume_from=tmp_path,
            callbacks=[callbacks.Checkpoint(tmp_path), _early()],
            **kw,
        )
    assert int(resumed.step) == 3  # EarlyStopping's restored best state came back too
    params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))


def test_a_seed_per_epoch_resumes_and_only_the_resumed_epoch_is_compared(tmp_path):
    # lambda epoch: batches(..., rng=100 + epoch): each epoch has its own shuffle seed, so a
    # checkpoint's layout is compared with the epoch it was taken in, not the run's first.
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.3)
    x, y = X[:24], Y[:24]
    per_epoch = lambda epoch: data.batches((x, y), 8, shuffle=True, rng=100 + epoch, epoch=epoch)
    full, full_history = fit(ts, loss_fn, opt, per_epoch, epochs=3, **kw)
    for crash in (4, 6):  # inside epoch 1, and after its last step
        where = tmp_path / str(crash)
        with pytest.raises(Crash):
            fit(
                ts,
                loss_fn,
                opt,
                per_epoch,
                epochs=3,
                callbacks=[callbacks.Checkpoint(where, every_steps=1, every_epochs=None), CrashAt(crash)],
                **kw,
            )
        resumed, history = fit(
            ts,
            loss_fn,
            opt,
            per_epoch,
            epochs=3,
            resume_from=where,
            callbacks=[callbacks.Checkpoint(where, every_steps=1, every_epochs=None)],
            **kw,
        )
        params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
        assert _untimed(history) == _untimed(full_history[1:]), crash
    # inside the epoch, another seed for it is still refused, naming both
    wrong = lambda epoch: data.batches((x, y), 8, shuffle=True, rng=7, epoch=epoch)
    # (the directory's latest checkpoint is the resumed run's last step, inside epoch 2)
    with pytest.raises(ValueError, match=r"seed=102, but this fit's train_data has seed=7"):
        fit(ts, loss_fn, opt, wrong, epochs=3, resume_from=tmp_path / "4", **kw)


def test_a_one_pass_iterator_resumes_from_a_checkpoint_with_epoch_sums(tmp_path):
    # fit cannot trace a step ahead of an iterator it may read only once; the checkpoint's
    # epoch sums have one shape whatever the metrics, so they restore all the same.
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    x, y = X[:24], Y[:24]
    fit(
        ts,
        loss_fn,
        opt,
        lambda e: data.batches((x, y), 8, epoch=e),
        epochs=1,
        callbacks=[callbacks.Checkpoint(tmp_path, every_epochs=1)],
        **kw,
    )
    resumed, history = fit(ts, loss_fn, opt, data.batches((x, y), 8, epoch=1), epochs=2, resume_from=tmp_path, **kw)
    assert int(resumed.step) == 6 and [h["epoch"] for h in history] == [1]


_TIMING = ("seconds", "samples_per_s")


def _untimed(history):
    return [{k: v for k, v in h.items() if k not in _TIMING} for h in history]


@pytest.mark.parametrize("pipeline", ["host", "device"])
def test_resume_after_a_non_improving_epoch_keeps_early_stoppings_wait(tmp_path, pipeline):
    # mode="max" on a falling eval_loss: epoch 0 stays the best, epochs 1 and 2 do not
    # improve, and patience 2 stops the run after epoch 2 (of 4). Interrupted after epoch 1
    # (wait 1): a resume that forgot the wait would train epoch 3 too.
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.3)
    train_data = _pipelines()[pipeline]
    early = lambda: callbacks.EarlyStopping("eval_loss", patience=2, mode="max")
    full, full_history = fit(ts, loss_fn, opt, train_data, epochs=4, callbacks=[early()], **kw)
    assert int(full.step) == 9 and len(full_history) == 3  # stopped after epoch 2
    saver = callbacks.Checkpoint(tmp_path, every_epochs=1)
    with pytest.raises(Crash):  # in epoch 2's first step, after epoch 1's checkpoint
        fit(ts, loss_fn, opt, train_data, epochs=4, callbacks=[saver, early(), CrashAt(7)], **kw)
    saver.checkpointer.wait()
    assert saver.checkpointer.all_steps() == [3, 6]
    resumed, history = fit(
        ts,
        loss_fn,
        opt,
        train_data,
        epochs=4,
        resume_from=tmp_path,
        callbacks=[callbacks.Checkpoint(tmp_path), early()],
        **kw,
    )
    assert int(resumed.step) == int(full.step)
    params_equal((resumed.params, resumed.opt_state), (full.params, full.opt_state))
    np.testing.assert_array_equal(jax.random.key_data(resumed.rng), jax.random.key_data(full.rng))
    assert _untimed(history) == _untimed(full_history[2:])


def _data(pipeline, xs, ys, **args):
    if pipeline == "device":
        return data.DeviceData((xs, ys), **args)
    return lambda epoch: data.batches((xs, ys), epoch=epoch, **args)


@pytest.mark.parametrize("pipeline", ["host", "device"])
@pytest.mark.parametrize("change", ["batch_size", "drop_remainder", "shuffle", "seed", "n"])
def test_resume_with_other_data_is_refused_naming_both_values(tmp_path, change, pipeline):
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    x, y = X[:24], Y[:24]
    saver = callbacks.Checkpoint(tmp_path, every_steps=1, every_epochs=None)
    saved = dict(batch_size=8, shuffle=True, rng=3)
    with pytest.raises(Crash):
        fit(ts, loss_fn, opt, _data(pipeline, x, y, **saved), epochs=2, callbacks=[saver, CrashAt(2)], **kw)
    saver.checkpointer.wait()
    other = {
        "batch_size": dict(batch_size=4),
        "drop_remainder": dict(drop_remainder=False),
        "shuffle": dict(shuffle=False),
        "seed": dict(rng=4),
        "n": {},
    }[change]
    xs, ys = (X[:20], Y[:20]) if change == "n" else (x, y)
    with pytest.raises(
        ValueError,
        match=rf"saved with train_data of {change}=.*but this fit's "
        rf"train_data has {change}=.*Resume with {change}=",
    ):
        fit(ts, loss_fn, opt, _data(pipeline, xs, ys, **{**saved, **other}), epochs=2, resume_from=tmp_path, **kw)


# --- writers checked when fit starts; the trained state survives a late failure ---------


@pytest.mark.parametrize(
    "make",
    [
        lambda d: callbacks.CSVLogger(d),  # a directory where a file path belongs
        lambda d: callbacks.JSONLLogger(d),
        lambda d: callbacks.Checkpoint(checkpoint.NpzCheckpointer(d / "x.csv")),
        pytest.param(
            lambda d: callbacks.TensorBoardLogger(d / "x.csv"),
            marks=pytest.mark.skipif(importlib.util.find_spec("tensorboardX") is None, reason="needs tensorboardX"),
        ),
        lambda d: callbacks.Profile(d / "x.csv"),
    ],
    ids=["CSVLogger", "JSONLLogger", "Checkpoint", "TensorBoardLogger", "Profile"],
)
def test_an_unwritable_destination_fails_before_training(tmp_path, make):
    (tmp_path / "x.csv").write_text("")  # a file where a directory belongs
    cb = make(tmp_path)
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    started = CrashAt(1)
    with pytest.raises(
        OSError,
        match=r"cannot write (path|directory|logdir)=.*before "
        r"training\. Pass a writable",
    ):
        fit(ts, loss_fn, opt, train_data, epochs=1, callbacks=[cb, started], **kw)


class FailAtEpochEnd(callbacks.Callback):
    def on_epoch_end(self, ctx, epoch, logs):
        if epoch == 1:
            raise OSError(28, "No space left on device")


def test_a_late_callback_failure_keeps_the_trained_state_on_the_exception():
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    train_data = _pipelines()["host"]
    full, _ = fit(ts, loss_fn, opt, train_data, epochs=2, **kw)
    with pytest.raises(OSError, match="No space left") as info:
        fit(ts, loss_fn, opt, train_data, epochs=2, callbacks=[FailAtEpochEnd()], **kw)
    assert ".train_state" in "".join(getattr(info.value, "__notes__", []))
    params_equal(info.value.train_state.params, full.params)


# --- 3. the orbax backend follows the npz backend's safety rules ------------------------


def test_orbax_refuses_other_shapes_and_a_second_run_in_one_directory(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    from funcnet.checkpoint import OrbaxCheckpointer

    tree = {"w": jnp.ones((2, 3)), "rng": jax.random.key(1), "n": np.int64(3)}
    first = OrbaxCheckpointer(tmp_path, keep=3, run_id="a", async_=False)
    second = OrbaxCheckpointer(tmp_path, keep=3, run_id="b", async_=False)  # sees no step yet
    first.save(1, tree)
    first.wait()
    with pytest.raises(
        checkpoint.CheckpointMismatchError, match=r"\['w'\]: target expects shape \(2, 4\), the checkpoint has \(2, 3\)"
    ):
        first.restore({**tree, "w": np.ones((2, 4), np.float32)})  # a host-array target
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"\(2, 4\).*\(2, 3\)"):
        first.restore({**tree, "w": jnp.ones((2, 4))})
    # an abstract target, PRNG key included
    back = first.restore(jax.eval_shape(lambda: tree))
    np.testing.assert_array_equal(jax.random.key_data(back["rng"]), jax.random.key_data(tree["rng"]))
    # a second run opened before the first saved: its ownership check reads the disk
    first.save(2, tree)
    first.wait()
    with pytest.raises(checkpoint.CheckpointOwnershipError, match=r"\[1, 2\]"):
        second.save(3, tree)
    first.close()
    second.close()


# --- hyperparameters and the loss, checked where they are given -------------------------


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: optim.rmsprop(1e-3, alpha=1.5), r"rmsprop: alpha .*\[0, 1\].*1.5"),
        (
            lambda: optim.rmsprop(lambda step: jnp.nan),
            r"rmsprop: the learning_rate schedule gives nan at step 0.*finite number >= 0",
        ),
        (lambda: optim.adam(optax.linear_schedule(-1.0, 0.0, 10)), r"adam: the learning_rate schedule gives -1.0"),
    ],
)
def test_bad_hyperparameters_fail_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_an_integer_loss_is_refused_naming_the_fix():
    from funcnet.train import Aux, make_train_step

    ts, _, opt, _, _ = fit_setup(dropout=0.0)

    def count_loss(params, state, batch, rng):
        return jnp.sum(batch[1]), Aux(state=state)

    with pytest.raises(
        TypeError,
        match=r"returned a loss of dtype int32; it must be floating.*"
        r"astype\(jnp.float32\)",
    ):
        make_train_step(count_loss, opt)(ts, (X[:8], Y[:8]))


@pytest.mark.parametrize("call", ["scale_loss", "unscale_grads", "update_loss_scale"])
def test_loss_scale_functions_with_swapped_arguments_say_so(call):
    from funcnet import precision

    ls = precision.dynamic_loss_scale()
    other = {
        "scale_loss": jnp.float32(1.0),
        "unscale_grads": {"w": jnp.ones(2)},
        "update_loss_scale": jnp.asarray(True),
    }[call]
    with pytest.raises(
        TypeError,
        match=rf"{call}: the first argument must be the LossScale.*"
        rf"arguments swapped",
    ):
        getattr(precision, call)(other, ls)


# --- float16 compute overflowing: said, not a generic non-finite loss --------------------


def _policy_setup(policy):
    from funcnet import losses, precision
    from funcnet.train import Aux

    net = precision.apply_policy(Dense(2), policy) if policy else Dense(2)
    ts = TrainState.create(net, optax.sgd(0.1), KEY, (-1, 3))

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0])
        return losses.cross_entropy(out.astype(jnp.float32), batch[1]), Aux(state=state)

    return ts, loss_fn, optax.sgd(0.1)


@pytest.mark.parametrize("policy", ["params=float32,compute=float16,output=float32", "params=float16,compute=float16"])
@pytest.mark.parametrize("pipeline", ["host", "device"])
def test_float16_overflow_is_named_with_bfloat16_and_loss_scaling_as_fixes(policy, pipeline):
    huge = np.full((4, 3), 1e6, np.float32)  # beyond float16's 65504: inf in the network
    arrays = (huge, np.zeros(4, np.int32))
    train_data = data.DeviceData(arrays, 4) if pipeline == "device" else [arrays]
    with pytest.raises(
        FloatingPointError,
        match=r"non-finite.*float16.*65504.*bfloat16.*"
        r"loss_scale",
    ):
        fit(*_policy_setup(policy), train_data, epochs=1, progress=False)


def test_a_float32_network_is_not_told_about_float16():
    bad = (np.full((4, 3), np.nan, np.float32), np.zeros(4, np.int32))
    with pytest.raises(FloatingPointError, match="non-finite") as info:
        fit(*_policy_setup(None), [bad], epochs=1, progress=False)
    assert "float16" not in str(info.value)
