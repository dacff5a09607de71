"""Data: MNIST from idx files, reproducible minibatches, device prefetching.

``mnist(split)`` finds the four idx files (gzip or raw) in this order::

    1. the ``data_dir`` argument          (the directory itself, then data_dir/mnist)
    2. ``$FUNCNET_DATA_DIR``              (the directory itself, then .../mnist)
    3. the repository's ``data/mnist/``   (shipped with the source checkout)
    4. the user cache                     ($XDG_CACHE_HOME/funcnet/mnist or ~/.cache/funcnet/mnist)
    5. a download from the public mirrors into the user cache

The first directory that holds both files of a split wins (images and labels
never come from different places). Every file's *uncompressed* content is
checked against the md5 of the original MNIST release (so any gzip
recompression is fine), and a truncated, damaged or substituted file is an
error naming that file, never a silently wrong array. Parsed files are cached in-process, keyed by path,
size and modification time.

``batches`` slices aligned numpy arrays into minibatches; with ``shuffle`` the
order is a pure function of ``(rng, epoch)``, so a resumed run can rebuild the
order of any epoch and skip the batches it already consumed::

    for x, y in batches((images, labels), 128, shuffle=True, rng=seed, epoch=e, skip=k):
        ...

``prefetch_to_device`` keeps a few batches already on their way to the device
(``jax.device_put`` is asynchronous), so the copy overlaps with compute.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import itertools
import os
import threading
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import jax
import numpy as np

from funcnet import _checks as checks
from funcnet.fileio import atomic_write

__all__ = [
    "mnist", "read_idx", "batches", "epoch_order", "num_batches", "prefetch_to_device",
    "MNISTNotFoundError", "CorruptFileError",
    "MNIST_FILES", "MNIST_MD5", "MNIST_MIRRORS", "REPO_DATA_DIR",
]

# --------------------------------------------------------------------------- #
# MNIST
# --------------------------------------------------------------------------- #

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

#: md5 of the *uncompressed* idx content (valid for any gzip recompression).
MNIST_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}

#: Mirrors of the original ``<name>.gz`` files, tried in order.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

#: The copy shipped with a source checkout: ``<repo>/data/mnist``.
REPO_DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "mnist"

_DOWNLOAD_TIMEOUT_S = 60


class MNISTNotFoundError(FileNotFoundError):
    """MNIST is in none of the searched places and could not be downloaded."""


class CorruptFileError(ValueError):
    """A data file exists but is not what it should be (truncated, bad header, bad md5)."""


# idx type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def _corrupt(path, why: str) -> CorruptFileError:
    return CorruptFileError(
        f"{path}: {why}. The file is truncated, corrupt or not an idx file; delete it "
        f"and fetch the original again (or point data_dir=/FUNCNET_DATA_DIR at a good copy).")


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise _corrupt(path, f"bad gzip data ({e})") from None


def _parse_idx(data: bytes, path) -> np.ndarray:
    if len(data) < 4:
        raise _corrupt(path, f"only {len(data)} bytes, shorter than an idx header")
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES or data[3] == 0:
        raise _corrupt(path, f"wrong magic number 0x{data[:4].hex()} (an idx file starts "
                             "with 0x0000, a type code 0x08-0x0E and the number of dimensions)")
    ndim = data[3]
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise _corrupt(path, f"header declares {ndim} dimensions but the file ends after "
                             f"{len(data)} bytes")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - offset != expected:
        raise _corrupt(path, f"size mismatch: the header says shape {dims} of {dtype.name} "
                             f"({expected} bytes of data) but the file has {len(data) - offset}")
    arr = np.frombuffer(data, dtype, offset=offset).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path, *, md5: Optional[str] = None) -> np.ndarray:
    """Reads an idx file (gzip-compressed or raw; detected from the content).

    Args:
      path: the file.
      md5: if given, the expected md5 hex digest of the *uncompressed* content.

    Returns:
      The array in native byte order, shaped as the header says (read-only
      when no byte swap was needed).

    Raises:
      FileNotFoundError: no such file.
      CorruptFileError: bad gzip stream, wrong magic number, a data size that
        disagrees with the header, or an md5 mismatch; the message names the file.
    """
    path = Path(path)
    data = _read_bytes(path)
    if md5 is not None:
        got = hashlib.md5(data).hexdigest()
        if got != md5:
            raise _corrupt(path, f"md5 of the uncompressed content is {got}, expected {md5}")
    return _parse_idx(data, path)


_CACHE: "collections.OrderedDict[tuple, np.ndarray]" = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 8


def _read_cached(path: Path, md5: Optional[str]) -> np.ndarray:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, md5)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    arr = read_idx(path, md5=md5)
    arr.setflags(write=False)  # shared between callers
    with _CACHE_LOCK:
        _CACHE[key] = arr
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return arr


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "funcnet" / "mnist"


def _search_dirs(data_dir) -> list:
    """``[(description, directory)]`` in search order."""
    dirs = []
    for what, root in (("data_dir argument", data_dir),
                       ("$FUNCNET_DATA_DIR", os.environ.get("FUNCNET_DATA_DIR") or None)):
        if root is not None:
            root = Path(root).expanduser()
            dirs += [(what, root), (what, root / "mnist")]
    dirs.append(("repository copy", REPO_DATA_DIR))
    dirs.append(("user cache", _cache_dir()))
    return dirs


def _find(directory: Path, name: str) -> Optional[Path]:
    for candidate in (directory / (name + ".gz"), directory / name):
        if candidate.is_file():
            return candidate
    return None


def _download(url: str, dest: Path, md5: Optional[str]) -> None:
    """Fetches ``url`` to ``dest`` atomically: temp file, checksum, fsync, rename."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(dest, suffix=".part") as (f, tmp):
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
            while True:
                chunk = response.read(1 << 20)
                if not chunk:
                    break
                f.write(chunk)
        f.flush()
        read_idx(tmp, md5=md5)  # verify before it becomes visible


def _fetch(name: str, cache: Path, errors: list) -> bool:
    for mirror in MNIST_MIRRORS:
        url = mirror.rstrip("/") + "/" + name + ".gz"
        try:
            _download(url, cache / (name + ".gz"), MNIST_MD5.get(name))
            return True
        except (OSError, urllib.error.URLError, CorruptFileError, ValueError) as e:
            errors.append(f"{url}: {e}")
    return False


def mnist(split: str = "train", data_dir=None, flatten: bool = False, *,
          download: bool = True):
    """The MNIST digits as numpy arrays.

    Args:
      split: ``"train"`` (60000 examples) or ``"test"`` (10000).
      data_dir: a directory holding the idx files (``.gz`` or uncompressed),
        searched first; see the module docstring for the full search order.
      flatten: return images as ``(N, 784)`` instead of ``(N, 28, 28, 1)``.
      download: allow fetching from :data:`MNIST_MIRRORS` into the user cache
        when no local copy is found.

    Returns:
      ``(images, labels)``: float32 images in ``[0, 1]`` (pixel / 255) and int32
      labels of shape ``(N,)``. Both are fresh arrays the caller may modify.

    Raises:
      MNISTNotFoundError: (a ``FileNotFoundError``) nothing found and the
        download failed or was disabled; lists every place searched.
      CorruptFileError: a file was found but is damaged (names the file).
    """
    if split not in MNIST_FILES:
        raise ValueError(f"mnist: split must be one of {sorted(MNIST_FILES)}, got {split!r}.")
    names = MNIST_FILES[split]
    places = _search_dirs(data_dir)
    found = None
    for _, directory in places:
        paths = [_find(directory, n) for n in names]
        if all(paths):
            found = paths
            break
    if found is None:
        errors: list = []
        cache = _cache_dir()
        if download:
            for n in names:
                if _find(cache, n) is None and not _fetch(n, cache, errors):
                    break
            else:
                found = [_find(cache, n) for n in names]
        if found is None:
            looked = "\n".join(f"  - {d} ({what})" for what, d in places)
            tried = ("\n".join(f"  - {e}" for e in errors) if download
                     else "  (download=False)")
            raise MNISTNotFoundError(
                f"mnist: could not find the {split} files {', '.join(n + '[.gz]' for n in names)}.\n"
                f"Searched:\n{looked}\nDownload attempts:\n{tried}\n"
                f"Put the four idx files in a directory and pass mnist(data_dir=...) or set "
                f"FUNCNET_DATA_DIR to it.")
    image_path, label_path = found
    images = _read_cached(image_path, MNIST_MD5.get(names[0]))
    labels = _read_cached(label_path, MNIST_MD5.get(names[1]))
    if images.ndim != 3 or images.dtype != np.uint8:
        raise _corrupt(image_path, f"expected uint8 images (N, rows, cols), got {images.dtype} "
                                   f"{images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise _corrupt(label_path, f"expected {images.shape[0]} labels to match {image_path.name}, "
                                   f"got shape {labels.shape}")
    x = images.astype(np.float32)
    x /= np.float32(255)  # divide, not multiply by 1/255: exact as torchvision's ToTensor
    x = x.reshape(x.shape[0], -1) if flatten else x[..., None]
    return x, labels.astype(np.int32)


# --------------------------------------------------------------------------- #
# Minibatches
# --------------------------------------------------------------------------- #

def _is_jax_key(rng) -> bool:
    if not isinstance(rng, jax.Array):
        return False
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return True
    return rng.dtype == np.uint32 and rng.shape == (2,)


def epoch_order(n: int, rng, epoch: Optional[int] = None) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(rng, epoch)``.

    Args:
      n: number of examples.
      rng: an int seed, a jax PRNG key (typed ``jax.random.key`` or legacy
        ``uint32[2]``), or a ``numpy.random.Generator``.
      epoch: folded into the seed (``default_rng([seed, epoch])`` for ints,
        ``jax.random.fold_in(key, epoch)`` for keys), so each epoch has its own
        order and any epoch's order can be recomputed after a restart. A
        Generator has no reproducible per-epoch derivation, so it takes no
        epoch and its draws advance its state.

    Returns:
      int64 indices, a permutation of ``range(n)``.
    """
    if isinstance(rng, bool):
        raise TypeError("epoch_order: rng must be an int seed, a jax PRNG key or a "
                        f"numpy Generator, got {rng!r}.")
    if checks.is_int(rng):
        seed = int(rng) if epoch is None else [int(rng), int(epoch)]
        return np.random.default_rng(seed).permutation(n)
    if _is_jax_key(rng):
        key = rng if epoch is None else jax.random.fold_in(rng, int(epoch))
        return np.asarray(jax.random.permutation(key, n), dtype=np.int64)
    if isinstance(rng, np.random.Generator):
        if epoch is not None:
            raise TypeError("epoch_order: epoch= needs an int seed or a jax PRNG key; a numpy "
                            "Generator's order depends on how much it has been used.")
        return rng.permutation(n)
    raise TypeError("epoch_order: rng must be an int seed, a jax PRNG key or a numpy "
                    f"Generator, got {type(rng).__name__}.")


def num_batches(n: int, batch_size: int, drop_remainder: bool = True) -> int:
    """How many batches :func:`batches` yields for ``n`` examples."""
    return n // batch_size if drop_remainder else -(-n // batch_size)


def batches(arrays, batch_size: int, *, shuffle: bool = False, rng=None,
            drop_remainder: bool = True, epoch: Optional[int] = None,
            skip: int = 0) -> Iterator:
    """Minibatches of aligned arrays (one pass, i.e. one epoch).

    Args:
      arrays: a tuple/list or dict of arrays sharing their leading size, or a
        single array. Batches come back in the same container type.
      batch_size: examples per batch.
      shuffle: visit examples in the order ``epoch_order(n, rng, epoch)``;
        otherwise in order (batches are then views into ``arrays``).
      rng: the seed of the shuffle (see :func:`epoch_order`); required with
        ``shuffle``, ignored without it.
      drop_remainder: drop the last, smaller batch (default); with ``False``
        it is yielded.
      epoch: the epoch number folded into ``rng`` (see :func:`epoch_order`).
      skip: skip this many leading batches, e.g. those consumed before a
        restart; the rest are exactly what the uninterrupted run would see.

    Returns:
      An iterator over batches. Arguments are checked when ``batches`` is
      called, not at the first ``next``.
    """
    if isinstance(arrays, dict):
        keys, values, kind = list(arrays), list(arrays.values()), "dict"
    elif isinstance(arrays, (tuple, list)):
        keys, values, kind = None, list(arrays), "tuple"
    else:
        keys, values, kind = None, [arrays], "single"
    if not values:
        raise ValueError("batches: arrays is empty; pass a tuple or dict of arrays.")
    values = [np.asarray(v) for v in values]
    labels = keys if keys is not None else list(range(len(values)))
    if any(v.ndim == 0 for v in values):
        raise ValueError("batches: every array needs a leading (example) axis; got a scalar at "
                         f"{[l for l, v in zip(labels, values) if v.ndim == 0]}.")
    sizes = {l: v.shape[0] for l, v in zip(labels, values)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batches: all arrays need the same leading size, got {sizes}.")
    n = values[0].shape[0]
    batch_size = checks.positive_int("batches", "batch_size", batch_size)
    if drop_remainder and 0 < n < batch_size:
        raise ValueError(f"batches: batch_size={batch_size} is larger than the {n} examples, so "
                         "drop_remainder=True would yield nothing; use a smaller batch_size or "
                         "drop_remainder=False.")
    if skip < 0:
        raise ValueError(f"batches: skip must be >= 0, got {skip}.")
    if shuffle:
        if rng is None:
            raise ValueError("batches: shuffle=True needs rng= (an int seed or a jax PRNG key) "
                             "so the order is reproducible.")
        order = epoch_order(n, rng, epoch)
    else:
        order = None
    total = num_batches(n, batch_size, drop_remainder)

    def pack(batch):
        if kind == "dict":
            return dict(zip(keys, batch))
        if kind == "single":
            return batch[0]
        return tuple(batch)

    def generate():
        for i in range(skip, total):
            if order is None:
                sl = slice(i * batch_size, (i + 1) * batch_size)
                yield pack([v[sl] for v in values])
            else:
                idx = order[i * batch_size:(i + 1) * batch_size]
                yield pack([v[idx] for v in values])

    return generate()


# --------------------------------------------------------------------------- #
# Prefetching
# --------------------------------------------------------------------------- #

def _placement(device):
    if device is None or isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if isinstance(device, (list, tuple)) and device and all(isinstance(d, jax.Device) for d in device):
        mesh = jax.sharding.Mesh(np.array(device), ("devices",))
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
    raise TypeError("prefetch_to_device: device must be None, a jax.Device, a "
                    f"jax.sharding.Sharding or a list of devices, got {device!r}.")


def prefetch_to_device(iterator: Iterable, size: int = 2, device=None,
                       transform: Optional[Callable[[Any], Any]] = None) -> Iterator:
    """Yields the items of ``iterator`` already on device, ``size`` ahead.

    Each item (a pytree of host arrays) goes through ``transform`` (if given)
    and ``jax.device_put``; because ``device_put`` is asynchronous, keeping
    ``size`` items in flight overlaps the host-to-device copy of the next
    batches with the computation on the current one. Order is preserved.

    Args:
      iterator: any iterable of pytrees of arrays.
      size: how many items to keep in flight (>= 1).
      device: where to put them: ``None`` (default device), a ``jax.Device``,
        any ``jax.sharding.Sharding``, or a list of devices, which splits the
        leading axis across them (the layout ``jax.pmap`` consumes).
      transform: applied on the host before the transfer, e.g. reshaping each
        leaf to ``(n_devices, per_device_batch, ...)`` for pmap.
    """
    size = checks.positive_int("prefetch_to_device", "size", size)
    target = _placement(device)
    it = iter(iterator)

    def put(item):
        if transform is not None:
            item = transform(item)
        return jax.device_put(item, target)  # one call for the whole pytree

    def generate():
        queue = collections.deque(put(item) for item in itertools.islice(it, size))
        while queue:
            ready = queue.popleft()
            # Refill before yielding, so `size` transfers run while the consumer
            # computes on `ready`.
            for item in itertools.islice(it, 1):
                queue.append(put(item))
            yield ready

    return generate()
