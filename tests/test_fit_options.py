"""fit's surface: the FitOptions record, the deprecated keywords it replaces, and the
deprecated ``devices=`` (pmap) against the mesh that replaces it."""

import dataclasses
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import distributed, losses
from funcnet.errors import ArgumentError
from funcnet.layers import BatchNorm, Dense, Relu
from funcnet.loop import FitOptions, fit
from funcnet.train import Aux, TrainState
from helpers.training import X, Y, fit_setup, params_equal


def test_fit_takes_at_most_thirteen_named_parameters():
    named = [p for p in inspect.signature(fit).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert len(named) <= 13, [p.name for p in named]


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("log_every", 0, "log_every must be a positive int"),
        ("steps_per_dispatch", -1, "steps_per_dispatch must be a positive int"),
        ("prefetch", -1, "prefetch"),
        ("on_nonfinite", "skip", "on_nonfinite"),
        ("eval_on_ema", "yes", "eval_on_ema"),
        ("missing_ok", 1.5, "missing_ok"),
        ("print_fn", "stderr", "print_fn must be a function"),
        ("step_options", {"clip": 1.0}, r"unknown: \['clip'\]"),
    ],
)
def test_fit_options_check_each_field_when_built(field, value, match):
    with pytest.raises(ArgumentError, match=match):
        FitOptions(**{field: value})


def test_fit_options_compiler_options_type_error_and_frozen():
    with pytest.raises(TypeError, match="compiler_options must be 'auto', a dict"):
        FitOptions(compiler_options="fast")
    options = FitOptions(step_options={"clip_grad_norm": 1.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.log_every = 3
    assert dataclasses.replace(options, log_every=3).step_options == {"clip_grad_norm": 1.0}
    with pytest.raises(TypeError):
        FitOptions(10)  # keyword-only: a positional value would be ambiguous


def test_deprecated_keywords_warn_and_train_as_the_options_record():
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    options = FitOptions(step_options={"clip_grad_norm": 0.5}, log_every=4, steps_per_dispatch=4)
    new, h_new = fit(ts, loss_fn, opt, train_data, epochs=2, options=options, **kw)
    with pytest.warns(DeprecationWarning, match=r"pass options=funcnet\.loop\.FitOptions\(") as w:
        old, h_old = fit(
            ts,
            loss_fn,
            opt,
            train_data,
            epochs=2,
            log_every=4,
            steps_per_dispatch=4,
            step_options={"clip_grad_norm": 0.5},
            **kw,
        )
    assert len(w) == 1 and w[0].filename == __file__  # one warning, at the caller's line
    params_equal(new.params, old.params)
    assert [h["loss"] for h in h_new] == [h["loss"] for h in h_old]


def test_new_spelling_warns_nothing():
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        fit(ts, loss_fn, opt, train_data, options=FitOptions(log_every=4), **kw)


def test_unknown_and_doubled_keywords_are_type_errors():
    ts, loss_fn, opt, train_data, kw = fit_setup()
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'. Did you mean 'epochs'"):
        fit(ts, loss_fn, opt, train_data, epoch=2, **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'log_evry'. Did you mean 'log_every'"):
        fit(ts, loss_fn, opt, train_data, log_evry=2, **kw)
    with pytest.raises(TypeError, match="log_every given both as a keyword and in options="):
        fit(ts, loss_fn, opt, train_data, log_every=2, options=FitOptions(log_every=3), **kw)
    with pytest.warns(DeprecationWarning, match="log_every"):  # other fields: folded in
        fit(ts, loss_fn, opt, train_data, log_every=2, options=FitOptions(prefetch=0), **kw)
    with pytest.raises(ArgumentError, match="options must be a funcnet.loop.FitOptions, got dict"):
        fit(ts, loss_fn, opt, train_data, options={"log_every": 2}, **kw)


def test_missing_ok_through_options(tmp_path):
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    with pytest.raises(FileNotFoundError):
        fit(ts, loss_fn, opt, train_data, resume_from=tmp_path / "none", **kw)
    out, history = fit(
        ts, loss_fn, opt, train_data, resume_from=tmp_path / "none", options=FitOptions(missing_ok=True), **kw
    )
    assert int(out.step) == 8 and len(history) == 1


def test_print_fn_through_options_gets_the_epoch_line():
    ts, loss_fn, opt, train_data, kw = fit_setup(dropout=0.0)
    lines = []
    fit(ts, loss_fn, opt, train_data, epochs=2, options=FitOptions(print_fn=lines.append), **kw)
    assert len(lines) == 2 and lines[1].startswith("epoch=1 ")


def _bn_net_and_loss(axis_name):
    net = funcnet.serial(Dense(16), BatchNorm(axis_name=axis_name), Relu, Dense(4))

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0], rng=rng, train=True)
        return losses.cross_entropy(logits, batch[1]), Aux(state=state)

    return net, loss_fn


@pytest.mark.devices(4)
def test_devices_is_deprecated_and_the_mesh_gives_what_it_gave():
    """The evidence for retiring ``fit(devices=N)``: with BatchNorm, whose statistics
    pmap syncs only through ``axis_name``, the pmap run, the mesh run (the same layer
    without ``axis_name``: jit over the mesh sees the global batch) and one device end
    at the same params and running statistics. (SGD: the Dense bias before BatchNorm
    has a zero gradient up to rounding, which Adam would scale up to full steps.)"""
    opt = optax.sgd(0.1)
    batches = lambda epoch: funcnet.data.batches((X, Y), 32, shuffle=True, rng=3, epoch=epoch)
    results = {}
    for name, axis, where in [
        ("one", None, {}),
        ("mesh", None, {"mesh": distributed.data_mesh(4)}),
        ("pmap", "batch", {"devices": 4}),
    ]:
        net, loss_fn = _bn_net_and_loss(axis)
        ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out, _ = fit(ts, loss_fn, opt, batches, epochs=2, progress=False, **where)
        deprecations = [str(x.message) for x in w if x.category is DeprecationWarning]
        assert bool(deprecations) == (name == "pmap"), deprecations
        if name == "pmap":
            assert "mesh=funcnet.distributed.data_mesh(4)" in deprecations[0]
        results[name] = out
    for name in ("mesh", "pmap"):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
            (results[name].params, results[name].state),
            (results["one"].params, results["one"].state),
        )
    assert jnp.all(jnp.isfinite(jax.tree.leaves(results["one"].params)[0]))
