"""Shared small training setup for the train, loop and callbacks tests."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import funcnet
from funcnet import callbacks, data, losses, metrics
from funcnet.layers import Dense, Dropout, Relu
from funcnet.train import Aux, TrainState

KEY = jax.random.key(0)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(256, 8)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32) + 2 * (X[:, 2] > 0).astype(np.int32)


def mlp(dropout=0.0):
    layers = [Dense(16), Relu] + ([Dropout(dropout)] if dropout else []) + [Dense(4)]
    return funcnet.serial(*layers)


def make_loss(net):
    def loss_fn(params, state, batch, rng):
        x, y = batch
        logits, state = net.apply(params, state, x, rng=rng, train=True)
        return losses.cross_entropy(logits, y), Aux(state=state, metrics={"acc": jnp.mean(jnp.argmax(logits, -1) == y)})

    return loss_fn


def fit_setup(dropout=0.2):
    net = mlp(dropout)
    opt = optax.adam(1e-2)
    ts = TrainState.create(net, opt, KEY, (-1, 8))
    acc = metrics.collection(acc=metrics.Accuracy(), loss=metrics.Mean())

    def eval_fn(params, state, batch):
        logits, _ = net.apply(params, state, batch[0])
        return acc.update(
            acc.init(), acc=(logits, batch[1]), loss=losses.cross_entropy(logits, batch[1], reduction="none")
        )

    train_data = lambda epoch: data.batches((X, Y), 32, shuffle=True, rng=7, epoch=epoch)
    eval_data = lambda epoch: data.batches((X, Y), 64)
    kw = dict(eval_data=eval_data, eval_fn=eval_fn, metric=acc, progress=False)
    return ts, make_loss(net), opt, train_data, kw


def params_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class Crash(Exception):
    """What :class:`CrashAt` raises: a run killed mid-epoch, for the resume tests."""


class CrashAt(callbacks.Callback):
    """Raises :class:`Crash` at the end of global step ``at``."""

    def __init__(self, at):
        self.at = at

    def on_step_end(self, ctx, step):
        if step == self.at:
            raise Crash
