"""make_train_step's stages in their order: the composed step equals the written-out
sequence (scale the loss, differentiate, unscale, clip, update, average, skip a
non-finite step), and a stage that is not asked for changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import precision
from funcnet.layers import Dense
from funcnet.train import Aux, TrainState, make_train_step

NET = Dense(3)
X = jax.random.normal(jax.random.key(1), (6, 4))
OPT = optax.sgd(0.5)


def loss_fn(params, state, batch, rng, loss_state):
    out, state = NET.apply(params, state, batch)
    loss = jnp.mean(out**2) + jnp.sum(loss_state**2)
    return loss, Aux(state=state, loss_state=loss_state * 0.5, metrics={"m": out.mean()})


def _state(scale):
    return TrainState.create(NET, OPT, jax.random.key(0), (-1, 4), loss_state=jnp.ones(2), ema=True, loss_scale=scale)


def _by_hand(ts, clip, decay):
    """One step written out in the documented order, S = ts.loss_scale.scale."""
    s = ts.loss_scale

    def scaled(p):
        loss, aux = loss_fn(p, ts.state, X, None, ts.loss_state)
        return precision.scale_loss(s, loss), aux

    (loss, aux), g = jax.value_and_grad(scaled, has_aux=True)(ts.params)
    g = precision.unscale_grads(s, g)  # before clipping: the norm is of the true gradients
    norm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(g)))
    g = jax.tree.map(lambda x: x * jnp.minimum(1.0, clip / (norm + 1e-6)), g)
    updates, _ = OPT.update(g, ts.opt_state, ts.params)
    params = optax.apply_updates(ts.params, updates)
    ema = jax.tree.map(lambda p: p, params)  # the first EMA update copies the params
    return loss / s.scale, norm, params, ema, aux.loss_state


def test_the_stages_run_in_the_documented_order():
    ts = _state(precision.static_loss_scale(3.0))  # not a power of 2: unscaling is not exact
    new, metrics = jax.jit(make_train_step(loss_fn, OPT, clip_grad_norm=0.1, ema_decay=0.9))(ts, X)
    loss, norm, params, ema, loss_state = _by_hand(ts, 0.1, 0.9)
    assert sorted(metrics) == ["grad_norm", "grads_finite", "loss", "loss_scale", "m"]
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    close(metrics["loss"], loss)
    close(metrics["grad_norm"], norm)
    jax.tree.map(close, (new.params, new.ema.params, new.loss_state), (params, ema, loss_state))
    assert float(norm) > 0.1 and int(new.step) == 1 and bool(metrics["grads_finite"])


def test_a_non_finite_step_keeps_every_trained_field():
    ts = _state(precision.dynamic_loss_scale(2.0**127))  # loss * S overflows float32
    new, metrics = jax.jit(make_train_step(loss_fn, OPT, ema_decay=0.9))(ts, X * 1e10)
    assert not bool(metrics["grads_finite"])
    for field in ("params", "state", "opt_state", "loss_state", "ema"):
        jax.tree.map(np.testing.assert_array_equal, getattr(new, field), getattr(ts, field))
    # the step count still moves on, so the next step draws a fresh key (fold_in(rng, 1))
    assert int(new.step) == 1 and float(new.loss_scale.scale) < 2.0**127
    np.testing.assert_array_equal(jax.random.key_data(new.rng), jax.random.key_data(ts.rng))


def test_unasked_stages_add_no_operation():
    plain = TrainState.create(NET, OPT, jax.random.key(0), (-1, 4), loss_state=jnp.ones(2))
    step = make_train_step(loss_fn, OPT)
    explicit = make_train_step(loss_fn, OPT, microbatches=1, clip_grad_norm=None, grad_norm=False, ema_decay=None)
    text = lambda f: str(jax.make_jaxpr(f)(plain, X))
    assert text(step) == text(explicit)
    assert "pmean" not in text(step) and "sqrt" not in text(step)
