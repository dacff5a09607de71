"""The idx file format of MNIST-style data sets: reading, checking, caching.

A file is a big-endian header (magic ``0x0000``, a type code, the number of
dimensions, the sizes) followed by the data; it may be gzip-compressed, which is
detected from the content. Damaged files are an error naming the file, never a
silently wrong array.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import os
import threading
import zlib
from pathlib import Path
from typing import Optional

import numpy as np

from funcnet.errors import CorruptFileError

__all__ = ["read_idx", "read_idx_cached", "CorruptFileError"]


# idx type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise CorruptFileError.at(path, f"bad gzip data ({e})") from None


def _parse_idx(data: bytes, path) -> np.ndarray:
    if len(data) < 4:
        raise CorruptFileError.at(path, f"only {len(data)} bytes, shorter than an idx header")
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES or data[3] == 0:
        raise CorruptFileError.at(
            path,
            f"wrong magic number 0x{data[:4].hex()} (an idx file starts "
            "with 0x0000, a type code 0x08-0x0E and the number of dimensions)",
        )
    ndim = data[3]
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise CorruptFileError.at(path, f"header declares {ndim} dimensions but the file ends after {len(data)} bytes")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - offset != expected:
        raise CorruptFileError.at(
            path,
            f"size mismatch: the header says shape {dims} of {dtype.name} "
            f"({expected} bytes of data) but the file has {len(data) - offset}",
        )
    arr = np.frombuffer(data, dtype, offset=offset).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str | os.PathLike, *, md5: Optional[str] = None) -> np.ndarray:
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

    Examples:
      >>> import gzip, pathlib, tempfile
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny-idx2-ubyte.gz"
      >>> header = bytes([0, 0, 0x08, 2]) + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
      >>> _ = path.write_bytes(gzip.compress(header + bytes(range(6))))
      >>> read_idx(path).tolist()  # uint8 (type 0x08), shape (2, 3)
      [[0, 1, 2], [3, 4, 5]]
      >>> _ = path.write_bytes(header + bytes(5))  # one byte short
      >>> read_idx(path)
      Traceback (most recent call last):
      funcnet.errors.CorruptFileError: ...tiny-idx2-ubyte.gz: size mismatch: ...
      >>> import shutil; shutil.rmtree(path.parent)
    """
    path = Path(path)
    data = _read_bytes(path)
    if md5 is not None:
        got = hashlib.md5(data).hexdigest()
        if got != md5:
            raise CorruptFileError.at(path, f"md5 of the uncompressed content is {got}, expected {md5}")
    return _parse_idx(data, path)


_CACHE: "collections.OrderedDict[tuple, np.ndarray]" = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 8


def read_idx_cached(path: Path, md5: Optional[str] = None) -> np.ndarray:
    """:func:`read_idx`, cached in-process by path, size, mtime and md5; read-only.

    The last 8 files read stay cached; a file rewritten since (another size or
    modification time) is read again.

    Args:
      path: the file, a :class:`pathlib.Path` or a string.
      md5: as for :func:`read_idx`.

    Returns:
      The array, read-only (one array shared by every caller).

    Raises:
      FileNotFoundError: no such file.
      CorruptFileError: as for :func:`read_idx`.

    Examples:
      >>> import pathlib, tempfile
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "labels-idx1-ubyte"
      >>> _ = path.write_bytes(bytes([0, 0, 0x08, 1]) + (3).to_bytes(4, "big") + bytes([7, 2, 1]))
      >>> labels = read_idx_cached(path)
      >>> labels.tolist(), labels.flags.writeable, read_idx_cached(path) is labels
      ([7, 2, 1], False, True)
      >>> import shutil; shutil.rmtree(path.parent)
    """
    path = Path(path)  # a str too, as read_idx takes
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
