"""Reading back what fit saved (issue G3): restore_train_state / restore_fit_checkpoint
from both backends with concrete and abstract targets; mismatch errors that name the
path and shapes on the orbax backend too."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import callbacks, checkpoint, data
from funcnet.errors import CheckpointMismatchError
from funcnet.layers import Dense
from funcnet.loop import LoopPosition
from funcnet.train import Aux, TrainState

pytest.importorskip("orbax.checkpoint")
from funcnet.checkpoint import OrbaxCheckpointer  # noqa: E402

X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
Y = X.sum(1, keepdims=True)
OPT = optax.adam(1e-2)


def _ts(width=1):
    return TrainState.create(Dense(width), OPT, jax.random.key(0), (-1, 4))


def _loss(params, state, batch, rng):
    pred, state = Dense(1).apply(params, state, batch[0])
    return jnp.mean((pred - batch[1]) ** 2), Aux(state=state)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One fit per backend, checkpointed at every epoch's end and once mid-epoch (with an
    EarlyStopping, whose state the checkpoint carries)."""
    out = {}
    for backend in ("npz", "orbax"):
        directory = tmp_path_factory.mktemp(backend)
        trained, _ = funcnet.fit(
            _ts(),
            _loss,
            OPT,
            data.DeviceData((X, Y), 16),
            epochs=2,
            progress=False,
            callbacks=[
                callbacks.EarlyStopping(monitor="loss", patience=5),
                callbacks.Checkpoint(directory, every_steps=6, every_epochs=1, backend=backend),
            ],
        )
        out[backend] = directory, trained
    return out


def _source(backend, directory, as_checkpointer):
    if not as_checkpointer:
        return str(directory)  # a path: the backend is recognised from the files
    return OrbaxCheckpointer(directory) if backend == "orbax" else checkpoint.NpzCheckpointer(directory)


@pytest.mark.parametrize("backend", ["npz", "orbax"])
@pytest.mark.parametrize("abstract", [False, True], ids=["concrete", "abstract"])
def test_restore_train_state_of_a_fit_checkpoint(runs, backend, abstract):
    directory, trained = runs[backend]
    target = jax.eval_shape(_ts) if abstract else _ts()
    back = checkpoint.restore_train_state(_source(backend, directory, abstract), target)
    assert isinstance(back, TrainState) and int(back.step) == 8
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(trained)):
        assert isinstance(got, jax.Array)  # ready for a model, abstract target or not
        if jnp.issubdtype(got.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # inference with it
    pred, _ = Dense(1).apply(back.params, back.state, X[:2])
    assert pred.shape == (2, 1)


@pytest.mark.parametrize("backend", ["npz", "orbax"])
def test_restore_fit_checkpoint_gives_the_position_and_the_rest(runs, backend):
    directory, _ = runs[backend]
    mid = checkpoint.restore_fit_checkpoint(_source(backend, directory, True), _ts(), step=6)
    assert mid.step == 6 and int(mid.train_state.step) == 6
    assert mid.position == LoopPosition(epoch=1, batch_in_epoch=2)
    assert set(mid.extras) == {"data", "callbacks", "epoch_metrics"}
    assert int(mid.extras["data"]["batch_size"]) == 16
    assert list(mid.extras["callbacks"]) == ["0_EarlyStopping"]
    assert int(mid.extras["epoch_metrics"]["count"]) == 2  # steps 5 and 6 of epoch 1
    end = checkpoint.restore_fit_checkpoint(_source(backend, directory, False), jax.eval_shape(_ts))
    assert end.step == 8 and end.position == LoopPosition(epoch=2, batch_in_epoch=0)


@pytest.mark.parametrize("backend", ["npz", "orbax"])
def test_a_wrong_model_names_the_path_and_both_shapes(runs, backend):
    directory, _ = runs[backend]
    both = r"\.params\['W'\].*[\[(]4, 3[\])].*[\[(]4, 1[\])]"  # npz: [4, 3]; orbax: (4, 3)
    with pytest.raises(CheckpointMismatchError, match=both):
        checkpoint.restore_train_state(_source(backend, directory, True), _ts(width=3))


@pytest.mark.parametrize("backend", ["npz", "orbax"])
def test_the_old_three_entry_target_says_how_to_read_a_fit_checkpoint(runs, backend):
    # What code restoring {"train_state", "epoch", "batch_in_epoch"} now meets.
    directory, _ = runs[backend]
    with pytest.raises(
        CheckpointMismatchError,
        match=r"(?s)in the checkpoint but not in "
        r"target: .*\['data'\].*restore_train_state",
    ):
        LoopPosition.restore(_source(backend, directory, True), _ts())


def test_a_checkpoint_of_the_three_entry_layout_restores_with_no_extras(tmp_path):
    ts = _ts()
    checkpoint.save(tmp_path, LoopPosition(1, 3).checkpoint_tree(ts), 7)
    old = checkpoint.restore_fit_checkpoint(tmp_path, jax.eval_shape(_ts))
    assert old.position == LoopPosition(1, 3) and old.extras == {} and old.step == 7


def test_orbax_mismatch_names_the_paths_like_npz(tmp_path):
    ckptr = OrbaxCheckpointer(tmp_path, async_=False)
    ckptr.save(1, {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})
    # a path the checkpoint lacks, and one it has that target lacks: orbax itself said
    # only "tree structures do not match"
    with pytest.raises(
        CheckpointMismatchError,
        match=r"in target but not in the checkpoint: \['v'\] \(float32\[2, 3\]\)"
        r"\n.*in the checkpoint but not in target: \['b'\] \(float32\[3\]\)",
    ):
        ckptr.restore({"w": np.zeros((2, 3), np.float32), "v": np.zeros((2, 3), np.float32)})
    with pytest.raises(CheckpointMismatchError, match=r"not in target: \['b'\]"):
        ckptr.restore({"w": np.zeros((2, 3), np.float32)})
    with pytest.raises(
        CheckpointMismatchError,
        match=r"\['w'\]: target expects shape \(3, 2\), the checkpoint has "
        r"\(2, 3\)",
    ):
        ckptr.restore({"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.float32)})
    ckptr.close()


def test_restore_fit_checkpoint_refuses_a_non_path():
    with pytest.raises(TypeError, match="checkpoint directory or a"):
        checkpoint.restore_train_state(3, _ts())


def test_orbax_checks_a_checkpoint_another_checkpointer_wrote(tmp_path):
    # A new process reads a run: its manager has no handler for the step's item yet and
    # orbax gave no metadata, so the dtype, shape and path checks were skipped and a
    # float32 checkpoint was cast into a float16 target without a word.
    writer = OrbaxCheckpointer(tmp_path, async_=False)
    writer.save(1, {"w": np.full((2, 3), 1.7, np.float32)})
    writer.close()
    reader = OrbaxCheckpointer(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"\['w'\]: target expects float16\[2, 3\]"):
        reader.restore({"w": np.zeros((2, 3), np.float16)})
    with pytest.raises(CheckpointMismatchError, match=r"not in the checkpoint: \['v'\]"):
        reader.restore({"w": np.zeros((2, 3), np.float32), "v": np.zeros(1, np.float32)})
    back = reader.restore({"w": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
    np.testing.assert_array_equal(back["w"], np.full((2, 3), 1.7, np.float32))
    reader.close()
