"""Small files replaced whole: a crash leaves the old file or the new one, never a mixture
(the commit log's recovery point and indexes, the uploader's checkpoint, the broker's snapshot,
a bridge's checkpoint, the client's state file)."""

from __future__ import annotations

import errno
import os


def write_small_file(path: str, data: bytes, dir_fd: int | None = None,
                     mode: int = 0o640) -> None:
    """Replace ``path`` atomically: write a temporary file, fsync it, rename it, and fsync
    the directory open as ``dir_fd`` (none given: the caller does not need the rename
    durable, as for an index the log can rebuild)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except OSError:
        try:
            os.unlink(tmp)  # (its blocks: a full disk needs them back)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if dir_fd is not None:
        os.fsync(dir_fd)


def replace_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """``write_small_file`` with the rename made durable: the directory is opened, fsynced
    after the rename, and closed."""
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        write_small_file(path, data, dir_fd, mode)
    finally:
        os.close(dir_fd)


def write_zeros(fd: int, nbytes: int) -> int:
    """Make the file ``nbytes`` long by writing zeros and fsync it (room taken on a file
    system that cannot allocate ahead: the file's size then counts it); 0 or the errno."""
    block = bytes(64 << 10)
    try:
        size = os.fstat(fd).st_size
        while size < nbytes:
            size += os.pwrite(fd, block[:nbytes - size], size)
        os.fsync(fd)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0

