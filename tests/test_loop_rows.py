"""fit's epoch metrics on the host as columns (funcnet.loop._rows.StepRows): the same
steps, values and order as the per-step dicts they replace, and the same epoch sums."""

import numpy as np
import pytest

from funcnet.loop._resume import EpochSums
from funcnet.loop._rows import StepRows


def _steps(n, devices=None):
    rng = np.random.default_rng(0)
    shape = () if devices is None else (devices,)
    return [
        {"loss": rng.normal(size=shape).astype(np.float32), "n": np.int32(i), "acc": rng.random(shape)}
        for i in range(n)
    ]


@pytest.mark.parametrize("devices", [None, 3])
def test_rows_index_and_slice_as_the_step_dicts(devices):
    steps = _steps(7, devices)
    rows = StepRows.of(steps)
    assert len(rows) == 7 and rows.keys() == ("loss", "n", "acc") and bool(rows)
    for i in (0, 3, -1):
        for key in steps[i]:
            np.testing.assert_array_equal(rows[i][key], steps[i][key])
            assert rows[i][key].dtype == steps[i][key].dtype
    part = rows[2:5]
    assert len(part) == 3 and int(part[0]["n"]) == 2 and int(part[-1]["n"]) == 4
    assert len(rows[7:]) == 0 and not rows[7:]
    assert rows.column("loss").shape == (7, 1 if devices is None else 3)
    with pytest.raises(IndexError):
        rows[7]


def test_stacked_takes_the_first_n_entries_of_each_chunk_in_order():
    # a device loop's rows: k entries, the first n of them steps (the rest unwritten)
    a = {"loss": np.array([1.0, 2.0, 9.0], np.float32)}
    b = {"loss": np.array([3.0, 9.0, 9.0], np.float32)}
    rows = StepRows.stacked([(a, 2), (b, 1), (a, 0)])
    assert len(rows) == 3 and rows.column("loss").ravel().tolist() == [1.0, 2.0, 3.0]
    assert len(StepRows.stacked([])) == 0 and len(StepRows.of([])) == 0


@pytest.mark.parametrize("devices", [None, 3])
def test_epoch_sums_are_the_per_step_means_added_in_order(devices):
    steps = _steps(50, devices)
    rows = StepRows.of(steps)
    sums = EpochSums.of(rows)
    assert sums.keys == ("loss", "n", "acc")
    # the sums a Python loop makes: each step's mean in its dtype, then float64 in order
    want = {}
    for key in sums.keys:
        total = 0.0
        for step in steps:
            total += float(np.asarray(step[key]).mean())
        want[key] = total / len(steps)
    assert sums.plus(rows).means() == want
    # cut anywhere (a checkpoint inside the epoch), the same additions
    assert sums.plus(rows[:17]).plus(rows[17:]).means() == want
