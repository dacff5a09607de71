"""An independent idx writer and tiny MNIST directories for the data-set tests."""

import gzip
import hashlib
from pathlib import Path

import numpy as np

from funcnet.datasets import mnist

N = 5  # examples in the synthetic MNIST files


# --------------------------------------------------------------------------- #
# helpers: an independent idx writer
# --------------------------------------------------------------------------- #

_CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(">i2"): 0x0B,
    np.dtype(">i4"): 0x0C,
    np.dtype(">f4"): 0x0D,
    np.dtype(">f8"): 0x0E,
}


def idx_bytes(arr):
    arr = np.asarray(arr)
    big = arr.astype(arr.dtype.newbyteorder(">")) if arr.dtype.itemsize > 1 else arr
    header = bytes([0, 0, _CODES[big.dtype], arr.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + big.tobytes()


def write_idx(path, arr, gz=True):
    raw = idx_bytes(arr)
    Path(path).write_bytes(gzip.compress(raw) if gz else raw)
    return hashlib.md5(raw).hexdigest()


def make_mnist_dir(directory, marker, gz=True, split="train", only=None):
    """Writes a tiny MNIST split whose labels are all `marker` (to tell copies apart)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(marker)
    images = rng.integers(0, 256, size=(N, 28, 28), dtype=np.uint8)
    labels = np.full((N,), marker, np.uint8)
    img_name, lbl_name = mnist.MNIST_FILES[split]
    md5 = {}
    for name, arr in ((img_name, images), (lbl_name, labels)):
        if only is None or only == name:
            md5[name] = write_idx(directory / (name + (".gz" if gz else "")), arr, gz)
    return images, labels, md5
