"""Where batches go: a sink stores one object under a key, idempotently (the same key with the
same bytes again is a success and leaves one object).

A sink is anything with ``name`` (for logs), ``put(key, path, size, throttle, records_id)`` and
``close()``. ``put`` copies the local batch file ``path`` (``size`` bytes) to the object ``key``,
calling ``throttle(n)`` before it sends ``n`` bytes (the bandwidth cap); ``records_id`` names
the records the batch holds (offsets, raw length, CRC32C), so a sink that finds an object with
other bytes under the name can tell the same records compressed by another zstd release from
a conflict. It raises
``TransientSinkError`` (retried without limit) or ``PermanentSinkError`` (an alarm; retried
rarely, the data kept). ``open_sink(config)`` (uploader/configure.py) picks the sink from
``[upload] url``:

* ``file:///path/to/landing``: ``DirSink``, a local or mounted folder.
* ``s3://bucket/prefix``: ``S3Sink`` (s3.py), any S3-compatible object store.

A sink may also have ``reachable()``: after a ``TransientSinkError`` whose ``unreachable`` is
true (no answer at all), the uploader calls it every few seconds while it backs off and retries
as soon as it returns True, so uploading resumes soon after the link returns.
"""

from __future__ import annotations

import errno
import os
from typing import Callable, Protocol

from edgebroker.errors import EdgebrokerError

COPY_CHUNK = 256 * 1024

# Errors a retry will not cure by itself (someone must change the folder or its permissions).
PERMANENT_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                              errno.EROFS, errno.ENAMETOOLONG, errno.EEXIST, errno.ELOOP})


class SinkError(EdgebrokerError):
    """A put failed; the message names the object and the cause."""


class TransientSinkError(SinkError):
    """Worth retrying as it is (a full disk, an I/O error, a folder not mounted yet)."""
    unreachable = False


class PermanentSinkError(SinkError):
    """Needs someone to act (not a folder, no permission): an alarm."""


class Sink(Protocol):
    name: str

    def put(self, key: str, path: str, size: int, throttle: Callable[[int], None],
            records_id: str = "") -> None: ...

    def close(self) -> None: ...


class DirSink:
    """A landing folder: each object is written as ``.<name>.tmp`` beside its final name,
    fsynced, renamed over the final name, and the folder fsynced; new folders are fsynced into
    their parents. A retry writes the same temporary name again, so a crash leaves at most one
    temporary file per batch, replaced by the retry."""

    def __init__(self, root: str):
        self.root = root
        self.name = f"file://{root}"

    def put(self, key: str, path: str, size: int, throttle: Callable[[int], None],
            records_id: str = "") -> None:
        dest = os.path.join(self.root, key)
        folder, base = os.path.split(dest)
        tmp = os.path.join(folder, f".{base}.tmp")
        where = dest
        try:
            where = folder
            self._make_folders(folder)
            where = tmp
            with open(path, "rb") as src:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    copied = 0
                    while copied < size:
                        chunk = src.read(min(COPY_CHUNK, size - copied))
                        if not chunk:
                            raise TransientSinkError(f"{path}: the batch file ends at {copied} "
                                                     f"of {size} bytes")
                        throttle(len(chunk))
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                        copied += len(chunk)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            where = dest
            os.rename(tmp, dest)
            where = folder
            self._fsync_dir(folder)
        except OSError as exc:
            kind = PermanentSinkError if exc.errno in PERMANENT_ERRNOS else TransientSinkError
            raise kind(f"{self.name}: cannot write {exc.filename or where}: "
                       f"{exc.strerror or exc}") from None

    def _make_folders(self, folder: str) -> None:
        """Make the folders of a key under the root; the root itself is never made (a landing
        folder not mounted yet is a transient error, not a folder to fill the local disk)."""
        if not os.path.isdir(self.root):
            if os.path.lexists(self.root):
                raise OSError(errno.ENOTDIR, "the landing folder is not a folder", self.root)
            raise OSError(errno.ENOENT, "the landing folder does not exist (not mounted?)",
                          self.root)
        missing = []
        while not os.path.isdir(folder):
            if os.path.lexists(folder):
                raise OSError(errno.ENOTDIR, "exists and is not a folder", folder)
            missing.append(folder)
            folder = os.path.dirname(folder)
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if not os.path.isdir(path):
                    raise
            self._fsync_dir(os.path.dirname(path))

    @staticmethod
    def _fsync_dir(folder: str) -> None:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        pass


__all__ = ["Sink", "DirSink", "SinkError", "TransientSinkError",
           "PermanentSinkError"]
