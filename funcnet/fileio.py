"""Atomic file writes, shared by ``checkpoint`` (saves) and ``datasets`` (downloads).

A reader sees either the old file or the complete new one, never a partial
write: the bytes go to a temporary file in the destination's directory, are
flushed and fsync-ed, and ``os.replace`` swaps it in (atomic on POSIX); the
directory is fsync-ed so the rename itself survives a crash. If the writer
fails or is killed, only the temporary file is left behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator, Tuple

__all__ = ["atomic_write", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike) -> None:
    """Makes a rename in ``directory`` durable (best effort where unsupported).

    Args:
      directory: the directory whose entries (a rename, a new file) to make durable.

    Returns:
      None. Errors are ignored: where a directory cannot be opened or fsync-ed (e.g. on
        Windows) the rename is as durable as the platform makes it.

    Examples:
      >>> import tempfile
      >>> fsync_dir(tempfile.mkdtemp())  # returns None; errors are ignored
    """
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(
    dest: str | os.PathLike, *, prefix: str | None = None, suffix: str = ".tmp"
) -> Iterator[Tuple[BinaryIO, Path]]:
    """Yields ``(file, temp_path)`` opened for binary writing; on success it becomes ``dest``.

    Verify the content inside the ``with`` block (flush first) to keep a bad
    file from ever becoming visible: an exception removes the temporary file.

    Args:
      dest: the file to write (its directory must exist).
      prefix: the temporary file's name prefix (default ``.<dest name>.``).
      suffix: the temporary file's name suffix.

    Yields:
      ``(file, temp_path)``: the open binary file and its temporary path.

    Raises:
      FileNotFoundError: ``dest``'s directory does not exist.

    Examples:
      >>> import os, tempfile
      >>> dest = os.path.join(tempfile.mkdtemp(), "weights.bin")
      >>> with atomic_write(dest) as (f, tmp):
      ...     _ = f.write(b"1234")
      >>> open(dest, "rb").read(), os.path.exists(tmp)
      (b'1234', False)
    """
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=prefix or f".{dest.name}.", suffix=suffix)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask).
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(dest.parent)
