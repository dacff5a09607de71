"""funcnet.checkpoint safety: run ownership, non-finite checkpoints, a full disk,
and files of a newer format version."""

import errno
import json
import os
import zlib

import numpy as np
import pytest

from funcnet import checkpoint


def tree(v):
    return {"w": np.full(3, v, np.float32), "n": np.int64(1)}


# --------------------------------------------------------------------------- #
# a. run ownership
# --------------------------------------------------------------------------- #


def test_new_run_cannot_save_into_another_runs_directory(tmp_path):
    for s in (10, 11):
        checkpoint.save(tmp_path, tree(s), s, keep=2, run_id="old-run")
    with pytest.raises(checkpoint.CheckpointOwnershipError) as info:
        checkpoint.save(tmp_path, tree(1), 1, keep=2, run_id="new-run")
    msg = str(info.value)
    for part in (str(tmp_path), "[10, 11]", "'old-run'", "resume", "new directory", "overwrite=True"):
        assert part in msg
    assert checkpoint.all_steps(tmp_path) == [10, 11]
    assert checkpoint.latest_step(tmp_path) == 11


def test_anonymous_save_below_another_runs_steps_is_refused(tmp_path):
    # Today: save(step=1, keep=2) into a directory with steps 10, 11 deletes ckpt-1 at once.
    for s in (10, 11):
        checkpoint.save(tmp_path, tree(s), s, keep=2, run_id="old-run")
    with pytest.raises(checkpoint.CheckpointOwnershipError, match="another run"):
        checkpoint.save(tmp_path, tree(1), 1, keep=2)
    assert checkpoint.all_steps(tmp_path) == [10, 11]


def test_save_never_deletes_what_it_just_wrote(tmp_path):
    checkpoint.save(tmp_path, tree(10), 10, run_id="r")
    checkpoint.save(tmp_path, tree(11), 11, run_id="r")
    path = checkpoint.save(tmp_path, tree(1), 1, keep=2, run_id="r")  # same run going back
    assert path.is_file()
    assert checkpoint.all_steps(tmp_path) == [1, 10, 11]


def test_overwrite_replaces_the_other_runs_checkpoints(tmp_path):
    for s in (10, 11):
        checkpoint.save(tmp_path, tree(s), s, run_id="old-run")
    checkpoint.save(tmp_path, tree(1), 1, keep=2, run_id="new-run", overwrite=True)
    assert checkpoint.all_steps(tmp_path) == [1]
    assert checkpoint.info(tmp_path).run_id == "new-run"


def test_same_run_rotation_and_header_run_id(tmp_path):
    for s in (1, 2, 3):
        checkpoint.save(tmp_path, tree(s), s, keep=2)
    assert checkpoint.all_steps(tmp_path) == [2, 3]
    rid = checkpoint.new_run_id()
    other = tmp_path / "other"
    for s in (1, 2, 3):
        checkpoint.save(other, tree(s), s, keep=2, run_id=rid)
    assert checkpoint.all_steps(other) == [2, 3]
    assert checkpoint.info(other, 2) == checkpoint.CheckpointInfo(2, rid, True, other / "ckpt-2.npz")


def test_anonymous_save_after_every_step_continues_that_run(tmp_path):
    for s in (1, 2):
        checkpoint.save(tmp_path, tree(s), s, keep=2, run_id="crashed-script")
    checkpoint.save(tmp_path, tree(3), 3, keep=2)  # the script restarted, no run id
    assert checkpoint.all_steps(tmp_path) == [2, 3]
    assert checkpoint.info(tmp_path).run_id == "crashed-script"


# --------------------------------------------------------------------------- #
# b. non-finite state
# --------------------------------------------------------------------------- #


def test_non_finite_state_is_marked_and_never_rotates_away_the_last_finite(tmp_path):
    checkpoint.save(tmp_path, tree(1.0), 1, keep=2, run_id="r")
    checkpoint.save(tmp_path, tree(2.0), 2, keep=2, run_id="r")
    checkpoint.save(tmp_path, tree(np.nan), 3, keep=2, run_id="r")
    checkpoint.save(tmp_path, tree(np.inf), 4, keep=2, run_id="r")
    checkpoint.save(tmp_path, tree(5.0), 5, keep=2, run_id="r", finite=False)  # NaN loss
    assert [checkpoint.info(tmp_path, s).finite for s in (2, 4, 5)] == [True, False, False]
    assert checkpoint.all_steps(tmp_path) == [2, 4, 5]
    assert checkpoint.latest_step(tmp_path) == 5
    assert checkpoint.latest_step(tmp_path, finite_only=True) == 2
    assert checkpoint.all_steps(tmp_path, finite_only=True) == [2]
    np.testing.assert_array_equal(checkpoint.restore(tmp_path, step=2)["w"], np.full(3, 2.0))
    checkpoint.save(tmp_path, tree(6.0), 6, keep=2, run_id="r")  # finite again: 2 may go
    assert checkpoint.all_steps(tmp_path) == [5, 6]


def test_integer_and_key_leaves_do_not_count_as_non_finite(tmp_path):
    import jax

    checkpoint.save(tmp_path, {"i": np.arange(3), "k": jax.random.key(0), "b": True}, 1)
    assert checkpoint.info(tmp_path, 1).finite


# --------------------------------------------------------------------------- #
# c. a full disk
# --------------------------------------------------------------------------- #


def test_full_disk_names_path_and_space_and_leaves_no_trace(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, tree(1.0), 1, keep=1)
    before = sorted(os.listdir(tmp_path))

    def full(f, **arrays):
        f.write(b"x" * 1000)  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(OSError) as info:
        checkpoint.save(tmp_path, tree(2.0), 2, keep=1)
    monkeypatch.undo()
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert str(tmp_path / "ckpt-2.npz") in msg and "no space left" in msg and "MiB free" in msg
    assert "previous checkpoints are intact" in msg
    assert sorted(os.listdir(tmp_path)) == before  # no temp file, ckpt-1 still there
    np.testing.assert_array_equal(checkpoint.restore(tmp_path)["w"], np.full(3, 1.0))


# --------------------------------------------------------------------------- #
# d. a newer format version
# --------------------------------------------------------------------------- #


def _rewrite_header(path, drop=(), **changes):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays["header"].tobytes())
    header.update(changes)
    for key in drop:
        del header[key]
    raw = json.dumps(header).encode()
    arrays["header"] = np.frombuffer(raw, np.uint8)
    arrays["header_crc32"] = np.array(zlib.crc32(raw), np.uint32)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_newer_format_version_says_upgrade_not_delete(tmp_path):
    path = checkpoint.save(tmp_path, tree(1.0), 1)
    _rewrite_header(path, version=99)
    with pytest.raises(checkpoint.CheckpointVersionError) as info:
        checkpoint.restore(tmp_path)
    msg = str(info.value)
    assert str(path) in msg and "version 99" in msg and "newer funcnet" in msg
    assert "reads versions 1, 2" in msg and "Upgrade funcnet" in msg
    assert "delete" not in msg.replace("keep it", "")
    assert not isinstance(info.value, checkpoint.CheckpointCorruptError)


def test_version_1_files_are_still_read(tmp_path):
    path = checkpoint.save(tmp_path, tree(4.0), 4)
    _rewrite_header(path, drop=("run_id", "finite"), version=1)  # as funcnet wrote it before
    np.testing.assert_array_equal(checkpoint.restore(tmp_path)["w"], np.full(3, 4.0))
    info = checkpoint.info(tmp_path)
    assert info.run_id is None and info.finite
    # A version-1 directory (no run ids) may be continued by a run that has one.
    checkpoint.save(tmp_path, tree(5.0), 5, run_id="new")
    assert checkpoint.all_steps(tmp_path) == [4, 5]
