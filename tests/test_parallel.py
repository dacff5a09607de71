"""replicate / unreplicate / shard / process_slice, and the callable module."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funcnet
from funcnet import parallel
from funcnet.layers import Dense


def test_replicate_puts_one_copy_per_device_and_unreplicate_inverts():
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.int32(3), "key": jax.random.key(1)}
    rep = parallel.replicate(tree)
    assert rep["w"].shape == (4, 2, 3) and rep["step"].shape == (4,)
    assert {d for d in rep["w"].sharding.device_set} == set(jax.local_devices())
    back = parallel.unreplicate(rep)
    np.testing.assert_array_equal(back["w"], tree["w"])
    np.testing.assert_array_equal(jax.random.key_data(back["key"]), jax.random.key_data(tree["key"]))
    assert parallel.replicate(tree, 2)["w"].shape == (2, 2, 3)


def test_shard_splits_leading_axis_and_explains_bad_sizes():
    x, y = np.arange(24.0).reshape(8, 3), np.arange(8)
    sx, sy = parallel.shard((x, y))
    assert sx.shape == (4, 2, 3) and sy.shape == (4, 2)
    np.testing.assert_array_equal(sx.reshape(8, 3), x)
    with pytest.raises(ValueError, match=r"a batch of 10 examples cannot be split evenly over 4 devices.*multiple of 4 \(e.g. 8\)"):
        parallel.shard(np.zeros((10, 2)))
    with pytest.raises(ValueError, match="asked for 8 devices but this process has 4"):
        parallel.shard(x, 8)


def test_process_slice_partitions_the_global_batch():
    parts = [parallel.process_slice(12, i, 3) for i in range(3)]
    assert [(s.start, s.stop) for s in parts] == [(0, 4), (4, 8), (8, 12)]
    assert parallel.process_slice(8) == slice(0, 8)  # one process here
    with pytest.raises(ValueError, match="cannot be split evenly over 3 processes"):
        parallel.process_slice(10, 0, 3)
    assert parallel.is_main_process()


def test_module_is_also_the_parallel_combinator():
    layer = funcnet.parallel(Dense(2), Dense(3))
    assert isinstance(layer, funcnet.Layer)
    shapes, _, _ = layer.init(jax.random.key(0), ((-1, 4), (-1, 4)))
    assert shapes == ((-1, 2), (-1, 3))
    assert funcnet.parallel.shard is parallel.shard
