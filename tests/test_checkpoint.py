"""funcnet.checkpoint: round trips, target checks, keep, corruption, SIGKILL during save."""

import os
import random
import signal
import subprocess
import sys
import time
from typing import NamedTuple
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from funcnet import checkpoint, optim


class TrainState(NamedTuple):
    params: dict
    opt_state: object
    step: int
    rng: jax.Array


def make_state():
    params = {
        "dense": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3)},
        "head": (jnp.ones((3,), jnp.bfloat16), np.arange(4, dtype=np.int64)),
    }
    opt_state = optim.adam(1e-3).init(params)
    return TrainState(params, opt_state, 7, jax.random.key(42))


def zoo():
    """One leaf of every supported kind, in every container kind."""
    return {
        "f32": np.linspace(0, 1, 5, dtype=np.float32),
        "f64": np.array([[1.5, -2.25]]),
        "f16": np.array([1.0, 2.0], np.float16),
        "bf16": jnp.array([1.5, -3.0], jnp.bfloat16),
        "i32": jnp.array([-1, 2], jnp.int32),
        "i64": np.array([2**40, -(2**40)], np.int64),
        "u32": np.array([0, 2**32 - 1], np.uint32),
        "bool": np.array([True, False]),
        "np_scalar": np.float32(2.5),
        "py": [1, 2.5, True, None, 3 + 4j],
        "empty": (),
        "keys": (
            jax.random.key(0),
            jax.random.split(jax.random.key(1), 3),
            jax.random.key(5, impl="rbg"),
            jax.random.PRNGKey(3),
        ),
    }


def assert_tree_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(jax.random.key_data(x), jax.random.key_data(y))
        else:
            assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
            assert np.asarray(x).dtype == np.asarray(y).dtype
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _mismatch(tmp_path, saved, target, backend="npz"):
    if backend == "npz":
        checkpoint.save(tmp_path, saved, 1)
        with pytest.raises(checkpoint.CheckpointMismatchError) as info:
            checkpoint.restore(tmp_path, target=target)
        return str(info.value)
    pytest.importorskip("orbax.checkpoint")
    from funcnet.checkpoint import OrbaxCheckpointer

    ckptr = OrbaxCheckpointer(tmp_path, async_=False)
    try:
        ckptr.save(1, saved)
        with pytest.raises(checkpoint.CheckpointMismatchError) as info:
            ckptr.restore(target)
    finally:
        ckptr.close()
    return str(info.value)


BACKENDS = pytest.mark.parametrize("backend", ["npz", "orbax"])


def _corrupt_and_check(tmp_path, mutate, match):
    data = np.arange(1000, dtype=np.float64)
    path = checkpoint.save(tmp_path, {"data": data, "x": np.ones(3)}, 2)
    raw = bytearray(path.read_bytes())
    path.write_bytes(mutate(raw, data))
    with pytest.raises(checkpoint.CheckpointCorruptError, match=match) as info:
        checkpoint.restore(tmp_path, step=2)
    assert str(path) in str(info.value)


BIG = 12_500_000  # float32 elements: 50 MB per checkpoint


WRITER = (
    r"""
import sys
import numpy as np
from funcnet import checkpoint
directory, first = sys.argv[1], int(sys.argv[2])
for step in range(first, first + 100000):
    checkpoint.save(directory, {"big": np.arange(%d, dtype=np.float32) + step,
                                "meta": {"step": step, "tag": np.full(3, step, np.int32)}},
                    step, keep=2)
"""
    % BIG
)


def expected_tree(step):
    return {"big": np.arange(BIG, dtype=np.float32) + step, "meta": {"step": step, "tag": np.full(3, step, np.int32)}}


def _temp_files(directory):
    return [e for e in os.scandir(directory) if e.name.endswith(".tmp")]


def _kill_mid_write(directory, first_step, threshold, log):
    """Starts a writer and SIGKILLs it while a save is in progress, once its
    temp file holds `threshold` bytes and at least one complete checkpoint
    exists. Returns True if a partial temp file was left behind."""
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory), str(first_step)], stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"writer exited early ({proc.returncode}): {open(log).read()[-2000:]}")
            if checkpoint.all_steps(directory):
                try:
                    if any(e.stat().st_size >= threshold for e in _temp_files(directory)):
                        os.kill(proc.pid, signal.SIGKILL)
                        break
                except FileNotFoundError:  # renamed under us: wait for the next one
                    pass
            time.sleep(0.0005)
        else:
            pytest.fail("timed out waiting for the writer")
        proc.wait(timeout=30)
        return bool(_temp_files(directory))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_roundtrip_with_target(tmp_path):
    state = make_state()
    checkpoint.save(tmp_path, state, 7)
    restored = checkpoint.restore(tmp_path, target=state)
    assert isinstance(restored, TrainState)
    assert isinstance(restored.opt_state[0], optax.ScaleByAdamState)
    assert_tree_equal(restored, state)
    assert isinstance(restored.params["dense"]["w"], jax.Array)
    assert isinstance(restored.params["head"][1], np.ndarray)
    assert type(restored.step) is int
    # the typed key still works and draws the same numbers
    np.testing.assert_array_equal(jax.random.normal(restored.rng, (3,)), jax.random.normal(state.rng, (3,)))


def test_roundtrip_every_leaf_kind(tmp_path):
    tree = zoo()
    checkpoint.save(tmp_path, tree, 0)
    assert_tree_equal(checkpoint.restore(tmp_path, target=tree), tree)
    keys = checkpoint.restore(tmp_path, target=tree)["keys"]
    assert str(jax.random.key_impl(keys[2])) == "rbg"
    assert keys[3].dtype == np.uint32 and keys[3].shape == (2,)


def test_restore_without_target_gives_plain_containers(tmp_path):
    state = make_state()
    checkpoint.save(tmp_path, {"state": state, "zoo": zoo()}, 3)
    out = checkpoint.restore(tmp_path)
    s = out["state"]
    assert isinstance(s, dict) and list(s) == ["params", "opt_state", "step", "rng"]
    assert isinstance(s["params"]["head"], tuple)
    assert isinstance(s["opt_state"][0], dict) and set(s["opt_state"][0]) == {"count", "mu", "nu"}
    assert isinstance(s["params"]["dense"]["w"], np.ndarray)
    np.testing.assert_array_equal(s["params"]["dense"]["w"], np.arange(6.0).reshape(2, 3))
    assert s["params"]["head"][0].dtype == ml_dtypes.bfloat16
    assert s["step"] == 7 and type(s["step"]) is int
    z = out["zoo"]
    assert z["py"] == [1, 2.5, True, None, 3 + 4j] and type(z["py"][2]) is bool
    assert z["empty"] == ()
    assert jnp.issubdtype(z["keys"][1].dtype, jax.dtypes.prng_key) and z["keys"][1].shape == (3,)
    np.testing.assert_array_equal(
        jax.random.key_data(z["keys"][1]), jax.random.key_data(jax.random.split(jax.random.key(1), 3))
    )


def test_restore_into_abstract_target(tmp_path):
    state = make_state()
    checkpoint.save(tmp_path, state, 1)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x, state)
    assert isinstance(abstract.params["dense"]["w"], jax.ShapeDtypeStruct)
    restored = checkpoint.restore(tmp_path, target=abstract)
    np.testing.assert_array_equal(np.asarray(restored.opt_state[0].mu["dense"]["w"]), np.zeros((2, 3)))
    np.testing.assert_array_equal(np.asarray(restored.params["dense"]["w"]), np.asarray(state.params["dense"]["w"]))


def test_restore_keeps_pmap_replication(tmp_path):
    ndev = jax.device_count()
    replicated = jax.pmap(lambda x: x + 1)(jnp.zeros((ndev, 2)))
    checkpoint.save(tmp_path, {"w": replicated}, 1)
    out = checkpoint.restore(tmp_path, target={"w": replicated})["w"]
    assert out.sharding == replicated.sharding
    np.testing.assert_array_equal(np.asarray(out), np.ones((ndev, 2)))


@BACKENDS
def test_mismatch_shape(tmp_path, backend):
    msg = _mismatch(
        tmp_path, {"a": {"w": np.zeros((2, 3), np.float32)}}, {"a": {"w": np.zeros((3, 2), np.float32)}}, backend
    )
    if backend == "npz":
        assert "['a']['w']" in msg and "float32[3, 2]" in msg and "float32[2, 3]" in msg
        assert "ckpt-1.npz" in msg
    else:
        assert "['a']['w']" in msg and "(3, 2)" in msg and "(2, 3)" in msg


@BACKENDS
def test_mismatch_dtype_and_kind(tmp_path, backend):
    msg = _mismatch(
        tmp_path,
        {"x": np.zeros(2, np.float64), "n": 3, "k": jax.random.PRNGKey(0)},
        {"x": np.zeros(2, np.float32), "n": np.int64(3), "k": jax.random.key(0)},
        backend,
    )
    assert "['x']: target expects float32[2], the checkpoint has float64[2]" in msg
    if backend == "npz":  # orbax stores a key as its key data, a Python int as an array
        assert "['n']: target expects int64[], the checkpoint has Python int" in msg
        assert "['k']: target expects PRNG key key<fry>[], the checkpoint has uint32[2]" in msg


@BACKENDS
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int32, jnp.bfloat16])
def test_a_float32_checkpoint_is_not_cast_into_another_dtype(tmp_path, backend, dtype):
    # a float16 or int32 target would get rounded or truncated values without a word
    name = jnp.dtype(dtype).name
    for like in (np.zeros((2, 3), dtype), jnp.zeros((2, 3), dtype)):  # host and device targets
        msg = _mismatch(tmp_path / type(like).__name__, {"w": jnp.full((2, 3), 1.7)}, {"w": like}, backend)
        assert f"['w']: target expects {name}[2, 3], the checkpoint has float32[2, 3]" in msg


@BACKENDS
def test_mismatch_missing_and_extra_paths(tmp_path, backend):
    msg = _mismatch(tmp_path, {"a": np.zeros(1), "b": np.zeros(1)}, {"a": np.zeros(1), "c": np.zeros(1)}, backend)
    if backend == "npz":
        assert "in target but not in the checkpoint: ['c']" in msg
        assert "in the checkpoint but not in target: ['b']" in msg
    else:  # orbax's own words, behind the step and directory
        assert "step 1" in msg and "does not match target" in msg


def test_mismatch_namedtuple_vs_dict(tmp_path):
    state = make_state()
    msg = _mismatch(tmp_path, state, state._asdict())
    assert "['params']" in msg and ".params" in msg


def test_steps_and_keep_last_k(tmp_path):
    assert checkpoint.all_steps(tmp_path / "nope") == [] and checkpoint.latest_step(tmp_path) is None
    for s in (1, 2, 10, 3):
        checkpoint.save(tmp_path, {"s": np.array(s)}, s)
    assert checkpoint.all_steps(tmp_path) == [1, 2, 3, 10]
    assert checkpoint.latest_step(tmp_path) == 10
    assert int(checkpoint.restore(tmp_path)["s"]) == 10
    assert int(checkpoint.restore(tmp_path, step=2)["s"]) == 2
    checkpoint.save(tmp_path, {"s": np.array(11)}, jnp.asarray(11), keep=2)
    assert checkpoint.all_steps(tmp_path) == [10, 11]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-10.npz", "ckpt-11.npz"]
    checkpoint.save(tmp_path, {"s": np.array(-11)}, 11, keep=1)  # same step: replaced
    assert checkpoint.all_steps(tmp_path) == [11]
    assert int(checkpoint.restore(tmp_path)["s"]) == -11


def test_restore_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        checkpoint.restore(tmp_path)
    checkpoint.save(tmp_path, {"a": np.zeros(1)}, 4)
    with pytest.raises(FileNotFoundError, match=r"step 5.*available steps: \[4\]"):
        checkpoint.restore(tmp_path, step=5)


def test_leftover_temp_and_junk_files_are_not_listed(tmp_path):
    checkpoint.save(tmp_path, {"a": np.zeros(1)}, 4)
    (tmp_path / ".ckpt-9.npz.somehost.12345.abc.tmp").write_bytes(b"partial")
    (tmp_path / "ckpt-x.npz").write_bytes(b"junk")
    (tmp_path / "notes.txt").write_text("hi")
    assert checkpoint.all_steps(tmp_path) == [4]


def test_save_errors(tmp_path):
    with pytest.raises(TypeError, match=r"\['name'\]"):
        checkpoint.save(tmp_path, {"name": "resnet"}, 1)
    with pytest.raises(ValueError, match="step"):
        checkpoint.save(tmp_path, {}, -1)
    with pytest.raises(ValueError, match="keep"):
        checkpoint.save(tmp_path, {}, 1, keep=0)
    assert checkpoint.all_steps(tmp_path) == [] and os.listdir(tmp_path) == []


def test_corrupt_truncated(tmp_path):
    _corrupt_and_check(tmp_path, lambda raw, _: bytes(raw[: len(raw) // 2]), "cannot be read")


def test_corrupt_flipped_data_byte(tmp_path):
    def flip(raw, data):
        i = bytes(raw).index(data.tobytes()) + 4000
        raw[i] ^= 0x01
        return bytes(raw)

    _corrupt_and_check(tmp_path, flip, "checksum|CRC")


def test_corrupt_garbage_and_foreign_npz(tmp_path):
    _corrupt_and_check(tmp_path, lambda raw, _: os.urandom(len(raw)), "cannot be read")
    foreign = tmp_path / "ckpt-3.npz"
    np.savez(foreign, a=np.zeros(2))
    with pytest.raises(checkpoint.CheckpointCorruptError, match="not a funcnet checkpoint") as info:
        checkpoint.restore(tmp_path, step=3)
    assert str(foreign) in str(info.value)


def test_sigkill_during_save_keeps_last_checkpoint(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    rng = random.Random(1234)
    left_partial = []
    step = 1
    for round_ in range(2):
        # round 0 kills during a later save, round 1 may hit the first one
        threshold = int(rng.uniform(0.1, 0.85) * BIG * 4)
        left_partial.append(_kill_mid_write(directory, step, threshold, tmp_path / "log"))
        steps = checkpoint.all_steps(directory)
        assert steps and steps[-1] >= step - 1
        for s in steps[:-1]:  # every listed checkpoint is complete
            assert checkpoint.restore(directory, step=s)["meta"]["step"] == s
        latest = checkpoint.restore(directory, target=expected_tree(0))
        assert latest["meta"]["step"] == steps[-1]
        np.testing.assert_array_equal(latest["meta"]["tag"], np.full(3, steps[-1], np.int32))
        assert np.array_equal(latest["big"], np.arange(BIG, dtype=np.float32) + steps[-1])
        step = steps[-1] + 1
    assert any(left_partial), "no kill landed inside a write"
    # The next save removes the dead writer's partial file.
    checkpoint.save(directory, {"x": np.zeros(1)}, step)
    assert _temp_files(directory) == []
    assert checkpoint.latest_step(directory) == step
