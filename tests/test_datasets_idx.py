"""funcnet.datasets.idx: reading idx files, and every way a damaged file is named."""

import gzip

import numpy as np
import pytest

from funcnet import datasets
from funcnet.datasets import idx
from helpers.idx_files import idx_bytes, write_idx


# --------------------------------------------------------------------------- #
# read_idx
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([-7, 0, 123456789], dtype=">i4"),
        np.linspace(-1, 1, 6).reshape(3, 2).astype(">f8"),
    ],
    ids=["u8", "i32", "f64"],
)
def test_read_idx_roundtrip(tmp_path, arr, gz):
    path = tmp_path / "x.idx"
    md5 = write_idx(path, arr, gz)
    out = datasets.read_idx(path, md5=md5)
    assert out.shape == arr.shape and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def _good_raw():
    return idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5))


@pytest.mark.parametrize(
    "content,why",
    [
        (lambda: gzip.compress(_good_raw())[:-12], "bad gzip"),
        (lambda: _good_raw()[:-7], "size mismatch"),
        (lambda: _good_raw() + b"\0", "size mismatch"),
        (lambda: _good_raw()[:10], "ends after"),
        (lambda: b"\x12\x34\x56\x78" + _good_raw()[4:], "wrong magic"),
        (lambda: b"\0\0", "shorter than an idx header"),
        (
            lambda: (lambda z: z[:30] + bytes(b ^ 0xFF for b in z[30:60]) + z[60:])(gzip.compress(_good_raw())),
            "bad gzip",
        ),
    ],
    ids=["truncated-gz", "truncated-raw", "trailing", "short-header", "magic", "tiny", "flipped-gz"],
)
def test_read_idx_corrupt_files_name_the_file(tmp_path, content, why):
    path = tmp_path / "broken-idx3-ubyte.gz"
    path.write_bytes(content())
    with pytest.raises(datasets.CorruptFileError, match=why) as info:
        datasets.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_md5_mismatch(tmp_path):
    path = tmp_path / "ok.gz"
    md5 = write_idx(path, np.zeros((2, 2), np.uint8))
    wrong = "0" * 32
    with pytest.raises(datasets.CorruptFileError, match=f"expected {wrong}") as info:
        datasets.read_idx(path, md5=wrong)
    assert str(path) in str(info.value) and md5 in str(info.value)


def test_read_idx_cached_takes_a_string_path(tmp_path):
    arr = np.arange(6, dtype=np.uint8).reshape(2, 3)
    path = tmp_path / "x-idx2-ubyte"
    write_idx(path, arr)
    np.testing.assert_array_equal(idx.read_idx_cached(str(path)), arr)
    assert idx.read_idx_cached(str(path)) is idx.read_idx_cached(path)  # one entry
