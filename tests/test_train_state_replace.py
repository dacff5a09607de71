"""TrainState.replace: Flax's spelling of the NamedTuple's _replace, with an error that names
the fields; a pytree under jit and through a checkpoint as before."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import checkpoint
from funcnet.layers import Dense
from funcnet.train import Aux, TrainState, make_train_step


def _state(**kw):
    return TrainState.create(Dense(2), optax.sgd(0.1), jax.random.key(0), (-1, 3), **kw)


def _loss(params, state, batch, rng):
    out, state = Dense(2).apply(params, state, batch)
    return jnp.mean(out**2), Aux(state=state)


def test_replace_swaps_the_named_fields_and_keeps_the_rest():
    ts = _state()
    zeros = jax.tree.map(jnp.zeros_like, ts.params)
    new = ts.replace(params=zeros, step=ts.step + 3)
    assert type(new) is TrainState and int(new.step) == 3 and int(ts.step) == 0
    assert float(jnp.abs(new.params["W"]).sum()) == 0.0
    assert float(jnp.abs(ts.params["W"]).sum()) > 0.0  # the original is untouched
    for field in ("state", "opt_state", "rng", "loss_state", "ema", "loss_scale"):
        assert getattr(new, field) is getattr(ts, field)
    assert new == ts._replace(params=zeros, step=new.step)  # _replace still works
    assert ts.replace() == ts


def test_replace_names_the_fields_for_an_unknown_name():
    ts = _state()
    with pytest.raises(
        TypeError,
        match=r"\['parms'\] is not a field of TrainState; its fields "
        r"are \['params', 'state', 'opt_state', 'step', 'rng', "
        r"'loss_state', 'ema', 'loss_scale'\]\. "
        r"Did you mean 'parms' -> 'params'\?",
    ):
        ts.replace(parms=ts.params)
    with pytest.raises(
        TypeError,
        match=r"\['tx', 'apply_fn'\] are not fields.*Flax's "
        r"TrainState keeps \['tx', 'apply_fn'\].*make_train_step",
    ):
        ts.replace(tx=optax.sgd(0.1), apply_fn=None)
    # _replace is the NamedTuple's own: what a plain NamedTuple raises on this Python
    # (ValueError before 3.13, TypeError since), with its words, not replace's
    with pytest.raises(Exception) as plain:
        collections.namedtuple("Plain", "params")(1)._replace(parms=2)
    with pytest.raises(type(plain.value), match=r"^Got unexpected field names: \['parms'\]$"):
        ts._replace(parms=ts.params)


def test_replace_under_jit_and_through_a_step_and_a_checkpoint(tmp_path):
    ts = _state(ema=True)
    bumped = jax.jit(lambda t: t.replace(step=t.step + 1, params=jax.tree.map(lambda p: 2 * p, t.params)))(ts)
    assert type(bumped) is TrainState
    assert jax.tree.structure(bumped) == jax.tree.structure(ts)
    np.testing.assert_array_equal(bumped.params["W"], 2 * ts.params["W"])
    step = jax.jit(make_train_step(_loss, optax.sgd(0.1), ema_decay=0.9))
    after, metrics = step(bumped, jnp.ones((4, 3)))
    assert int(after.step) == 2 and np.isfinite(float(metrics["loss"]))
    checkpoint.save(tmp_path, after, 2)
    restored = checkpoint.restore(tmp_path, target=after)
    assert type(restored) is TrainState and int(restored.step) == 2
    for a, b in zip(jax.tree.leaves((restored.params, restored.ema)), jax.tree.leaves((after.params, after.ema))):
        np.testing.assert_array_equal(a, b)
