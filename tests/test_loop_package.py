"""funcnet.loop's layout: one way in, callbacks see only the public FitContext, one class
per placement with the same interface, and fit's docstring has one Args row per parameter."""

import importlib.util
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import loop
from funcnet.callbacks import Callback
from funcnet.layers import Dense
from funcnet.loop import _placement
from funcnet.train import Aux, TrainState

NET = Dense(1)


def _loss(params, state, x, rng):
    return jnp.mean(NET.apply(params, state, x)[0] ** 2), Aux(state=state)


def test_the_package_is_the_only_way_in():
    assert loop.__all__ == ["fit", "FitOptions", "FitContext", "LoopPosition", "LogKeys"]
    assert funcnet.fit is loop.fit
    # the flat private modules are gone; LoopPosition stays below loop and callbacks
    for name in ("funcnet._loop_checks", "funcnet._loop_resume"):
        assert importlib.util.find_spec(name) is None, name


def test_callbacks_see_only_the_public_context():
    seen = {}

    class Spy(Callback):
        log_keys = ()

        def on_epoch_end(self, ctx, epoch, logs):
            seen.update(vars(ctx), metrics=ctx.step_metrics)

    opt = optax.sgd(0.1)
    ts = TrainState.create(NET, opt, jax.random.key(0), (-1, 2))
    funcnet.fit(ts, _loss, opt, [np.ones((4, 2), np.float32)] * 2, callbacks=[Spy()], progress=False)
    # the loop's scratchpad (latest metrics, data layout, epoch sums) is in its run record
    assert [k for k in seen if k.startswith("_")] == ["_run"]
    assert set(seen["metrics"]) == {"loss"}


def test_each_placement_is_one_class_with_the_same_interface():
    assert type(_placement._placement(None, None)) is _placement._OneDevice
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    assert type(_placement._placement(None, mesh)) is _placement._OnMesh
    with pytest.raises(ValueError, match="either devices=1 .* not both"):
        _placement._placement(1, mesh)
    base = {n for n in vars(_placement._OneDevice) if not n.startswith("__")}
    for cls in (_placement._Replicas, _placement._OnMesh):
        extra = {n for n in vars(cls) if not n.startswith("__")} - base
        assert extra == set(), f"{cls.__name__} adds {extra} to the placement interface"


def test_fit_docstring_has_one_args_row_per_parameter():
    doc = inspect.getdoc(loop.fit)
    args = doc[doc.index("Args:") : doc.index("History:")]
    rows = [r.lstrip("*") for r in re.findall(r"^  (\**\w+(?:, \w+)*):", args, re.M)]
    assert all("," not in r for r in rows), rows
    assert sorted(rows) == sorted(inspect.signature(loop.fit).parameters)
