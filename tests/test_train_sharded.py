"""make_train_step with axis_name under jax.pmap and jax.shard_map (check_vma on and off).

Each must give the one-device step on the global batch, synced BatchNorm and center
loss included. Under shard_map's default check_vma=True the gradient of a replicated
parameter arrives already summed over the axis; a plain pmean would leave it 4x too large.
"""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import funcnet
from funcnet import distributed, losses
from funcnet.layers import BatchNorm, Dense, Relu
from funcnet.train import Aux, TrainState, make_train_step

RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 16, 6)).astype(np.float32)  # 3 steps of a global batch of 16
Y = RNG.integers(0, 4, size=(3, 16)).astype(np.int32)


def _step(axis):
    net = funcnet.serial(Dense(8), BatchNorm(axis_name=axis), Relu, Dense(4))

    def loss_fn(params, state, batch, rng, loss_state):
        x, y = batch
        logits, state = net.apply(params, state, x, train=True)
        closs, centers = losses.center_loss(loss_state, logits, y, alpha=0.5, axis_name=axis)
        return losses.cross_entropy(logits, y) + 0.1 * closs, Aux(state=state, loss_state=centers)

    opt = optax.sgd(0.1, momentum=0.9)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 6), loss_state=losses.center_loss_init(4, 4))
    return ts, make_train_step(loss_fn, opt, axis_name=axis)


def _pmap(ts, step):
    run = jax.pmap(step, axis_name="data")
    ts = distributed.replicate(ts)
    for x, y in zip(X, Y):
        ts, m = run(ts, distributed.shard((x, y), 4))
    return distributed.unreplicate((ts, m))


def _shard_map(check_vma):
    def train(ts, step):
        mesh = jax.make_mesh((4,), ("data",))
        run = jax.jit(
            jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()), check_vma=check_vma)
        )
        ts = jax.device_put(ts, NamedSharding(mesh, P()))
        for x, y in zip(X, Y):
            ts, m = run(ts, jax.device_put((x, y), NamedSharding(mesh, P("data"))))
        return ts, m

    return train


@pytest.mark.parametrize("transform", ["pmap", "shard_map", "shard_map-no-check-vma"])
@pytest.mark.devices(4)
def test_data_parallel_step_equals_one_device_on_the_global_batch(transform):
    ts, step = _step(None)
    one = jax.jit(step)
    for x, y in zip(X, Y):
        ts, m_one = one(ts, (x, y))
    train = {"pmap": _pmap, "shard_map": _shard_map(True), "shard_map-no-check-vma": _shard_map(False)}[transform]
    ts_dp, m_dp = train(*_step("data"))
    np.testing.assert_allclose(m_dp["loss"], m_one["loss"], rtol=1e-5)
    for name in ("params", "state", "loss_state"):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{transform}: {name}"),
            getattr(ts_dp, name),
            getattr(ts, name),
        )
    assert not np.allclose(ts.loss_state, 0)  # the centers did move
