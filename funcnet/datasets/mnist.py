"""MNIST: the four idx files, found, checked and (when allowed) downloaded.

``load(split)`` finds the four idx files (gzip or raw) in this order:

```
1. the ``data_dir`` argument          (the directory itself, then data_dir/mnist)
2. ``$FUNCNET_DATA_DIR``              (the directory itself, then .../mnist)
3. the repository's ``data/mnist/``   (a source checkout only; an installed wheel has no data/)
4. the user cache                     ($XDG_CACHE_HOME/funcnet/mnist or ~/.cache/funcnet/mnist)
5. a download from the mirrors into the user cache: ``$FUNCNET_MNIST_MIRRORS`` if set
   (base URLs separated by spaces or commas, e.g. an internal mirror or a local
   ``python -m http.server``), else :data:`MNIST_MIRRORS`
```

The first directory that holds both files of a split wins (images and labels
never come from different places). Every file's *uncompressed* content is
checked against the md5 of the original MNIST release (so any gzip
recompression is fine), and a truncated, damaged or substituted file is an
error naming that file, never a silently wrong array. Parsed files are cached in-process, keyed by path,
size and modification time.
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from funcnet.datasets.idx import CorruptFileError, read_idx, read_idx_cached
from funcnet.fileio import atomic_write
from funcnet.errors import MNISTNotFoundError

__all__ = ["load", "MNISTNotFoundError", "MNIST_FILES", "MNIST_MD5", "MNIST_MIRRORS", "REPO_DATA_DIR"]

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
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "mnist"

# Seconds without a byte before a mirror counts as unreachable. Offline, a firewall that drops packets
# costs this once per mirror (30 s for the two), instead of minutes, before the error says what to do.
_DOWNLOAD_TIMEOUT_S = 15


def _mirrors() -> tuple:
    """``$FUNCNET_MNIST_MIRRORS`` (spaces or commas between URLs) if set, else :data:`MNIST_MIRRORS`."""
    env = os.environ.get("FUNCNET_MNIST_MIRRORS", "").replace(",", " ").split()
    return tuple(env) or MNIST_MIRRORS


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "funcnet" / "mnist"


def _search_dirs(data_dir) -> list:
    """``[(description, directory)]`` in search order."""
    dirs = []
    for what, root in (
        ("data_dir argument", data_dir),
        ("$FUNCNET_DATA_DIR", os.environ.get("FUNCNET_DATA_DIR") or None),
    ):
        if root is not None:
            root = Path(root).expanduser()
            dirs += [(what, root), (what, root / "mnist")]
    if REPO_DATA_DIR.parent.is_dir():  # the checkout's data/: an installed wheel has none
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
    for mirror in _mirrors():
        url = mirror.rstrip("/") + "/" + name + ".gz"
        try:
            _download(url, cache / (name + ".gz"), MNIST_MD5.get(name))
            return True
        # HTTPException (BadStatusLine: the port speaks something other than HTTP) is not an OSError
        except (OSError, urllib.error.URLError, http.client.HTTPException, CorruptFileError, ValueError) as e:
            errors.append(f"{url}: {e}")
    return False


def _not_found(split, names, places, errors, cache) -> MNISTNotFoundError:
    """The error of a failed search: the files, every place searched, every download tried, the fixes."""
    looked = "\n".join(f"  - {d} ({what})" for what, d in places)
    tried = "\n".join(f"  - {e}" for e in errors) if errors is not None else "  (download=False)"
    mirrors = _mirrors()
    fetch = (
        f"download {' and '.join(mirrors[0].rstrip('/') + '/' + n + '.gz' for n in names)} into {cache}"
        if mirrors
        else f"put {' and '.join(names)} (.gz or raw) into {cache}"
    )
    return MNISTNotFoundError(
        f"mnist.load: could not find the {split} files {', '.join(n + '[.gz]' for n in names)}.\n"
        f"Searched:\n{looked}\nDownload attempts:\n{tried}\n"
        f"To fix: {fetch} (or into any directory, then pass load(data_dir=...) or set FUNCNET_DATA_DIR to "
        f"it); or, if a mirror is reachable from here, set FUNCNET_MNIST_MIRRORS to its base URL "
        f"and call load(download=True)."
    )


def load(
    split: str = "train", data_dir: Optional[str | os.PathLike] = None, flatten: bool = False, *, download: bool = True
) -> Tuple[np.ndarray, np.ndarray]:
    """The MNIST digits as numpy arrays.

    Args:
      split: ``"train"`` (60000 examples) or ``"test"`` (10000).
      data_dir: a directory holding the idx files (``.gz`` or uncompressed),
        searched first; see the module docstring for the full search order.
      flatten: return images as ``(N, 784)`` instead of ``(N, 28, 28, 1)``.
      download: allow fetching from the mirrors (``$FUNCNET_MNIST_MIRRORS``,
        else :data:`MNIST_MIRRORS`) into the user cache when no local copy is found.

    Returns:
      ``(images, labels)``: float32 images in ``[0, 1]`` (pixel / 255) and int32
      labels of shape ``(N,)``. Both are fresh arrays the caller may modify.

    Raises:
      MNISTNotFoundError: (a ``FileNotFoundError``) nothing found and the
        download failed or was disabled; lists every place searched.
      CorruptFileError: a file was found but is damaged (names the file).
      ValueError: ``split`` is neither ``"train"`` nor ``"test"``.

    Examples:
      >>> images, labels = load("test", download=False)  # e.g. the repository's copy
      >>> images.shape, images.dtype, labels.shape, labels.dtype
      ((10000, 28, 28, 1), dtype('float32'), (10000,), dtype('int32'))
      >>> float(images.min()), float(images.max()), labels[:5].tolist()
      (0.0, 1.0, [7, 2, 1, 0, 4])
      >>> load("valid")
      Traceback (most recent call last):
      ValueError: mnist.load: split must be one of ['test', 'train'], got 'valid'.
    """
    if split not in MNIST_FILES:
        raise ValueError(f"mnist.load: split must be one of {sorted(MNIST_FILES)}, got {split!r}.")
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
            raise _not_found(split, names, places, errors if download else None, cache)
    image_path, label_path = found
    images = read_idx_cached(image_path, MNIST_MD5.get(names[0]))
    labels = read_idx_cached(label_path, MNIST_MD5.get(names[1]))
    if images.ndim != 3 or images.dtype != np.uint8:
        raise CorruptFileError.at(
            image_path, f"expected uint8 images (N, rows, cols), got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise CorruptFileError.at(
            label_path, f"expected {images.shape[0]} labels to match {image_path.name}, got shape {labels.shape}"
        )
    x = images.astype(np.float32)
    x /= np.float32(255)  # divide, not multiply by 1/255: exact as torchvision's ToTensor
    x = x.reshape(x.shape[0], -1) if flatten else x[..., None]
    return x, labels.astype(np.int32)
