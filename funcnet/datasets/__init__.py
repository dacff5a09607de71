"""Data sets, as NumPy arrays: MNIST (``datasets.mnist.load``), and the idx format it ships in.

The pipeline that batches them (shuffling, prefetching) is :mod:`funcnet.data`.
"""

from funcnet.datasets import idx, mnist
from funcnet.datasets.idx import CorruptFileError, read_idx
from funcnet.datasets.mnist import MNISTNotFoundError

__all__ = ["idx", "mnist", "read_idx", "MNISTNotFoundError", "CorruptFileError"]
