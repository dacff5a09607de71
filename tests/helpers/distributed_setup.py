"""The model, data and step shared by the 2-process test and its single-process reference."""

import jax
import numpy as np
import optax

import funcnet
from funcnet import losses
from funcnet.layers import BatchNorm, Dense, Relu
from funcnet.train import Aux, TrainState, make_train_step

GLOBAL_BATCH = 32
N_STEPS = 3
_rng = np.random.default_rng(1)
_X = _rng.normal(size=(GLOBAL_BATCH * N_STEPS, 6)).astype(np.float32)
_Y = (_X[:, 0] > 0).astype(np.int32)


def batch(i):
    s = slice(i * GLOBAL_BATCH, (i + 1) * GLOBAL_BATCH)
    return _X[s], _Y[s]


def build(axis_name=None):
    net = funcnet.serial(Dense(8), BatchNorm(axis_name=axis_name), Relu, Dense(2))
    opt = optax.sgd(0.1, momentum=0.9)
    ts = TrainState.create(net, opt, jax.random.key(3), (-1, 6))

    def loss_fn(params, state, b, rng):
        logits, state = net.apply(params, state, b[0], rng=rng, train=True)
        return losses.cross_entropy(logits, b[1]), Aux(state=state)

    return ts, make_train_step(loss_fn, opt, axis_name=axis_name)
