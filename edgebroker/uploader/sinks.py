"""Where batches go: a sink stores one object under a key, idempotently (the same key with the
same bytes again is a success and leaves one object).

A sink is anything with ``name`` (for logs), ``put(key, path, size, throttle, records_id)``,
``object_name(key)`` (the object as its errors name it: the key under the prefix or folder) and
``close()``. ``put`` copies the local batch file ``path`` (``size`` bytes) to the object ``key``,
calling ``throttle(n)`` before it sends ``n`` bytes (the bandwidth cap), ``n`` at most
``piece_size(throttle)``, so that the waits stay short; ``records_id`` names
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
as soon as it returns True, so uploading resumes soon after the link returns. And
``interrupt()``: called from another thread by the broker's stop, it ends a put in flight at once
(with an error) and fails every later one, so a store that does not answer does not hold the stop.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
from typing import Callable, Protocol

from edgebroker.errors import EdgebrokerError
from edgebroker.files import NotRegularFile, open_regular

log = logging.getLogger("edgebroker.upload")
# Another batch under a batch's name. The name holds the gateway id and the log's life id
# (uploader/life.py), so the other batch comes from a gateway with the same gateway_id whose
# log is a copy of this one: a cloned data directory.
OTHER_BYTES = ("already exists with other bytes (another gateway with the same gateway_id and a "
               "copy of this data directory: a cloned image?)")

COPY_CHUNK = 256 * 1024

# Errors a retry will not cure by itself (someone must change the folder or its permissions).
PERMANENT_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                              errno.EROFS, errno.ENAMETOOLONG, errno.EEXIST, errno.ELOOP})
# What os.link answers on a file system without hard links.
NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


class SinkError(EdgebrokerError):
    """A put failed; the message names the object and the cause. ``retry_after``: seconds
    the store asked to wait before a retry (429 or 503 with Retry-After)."""
    retry_after = 0.0


class TransientSinkError(SinkError):
    """Worth retrying as it is (a full disk, an I/O error, a folder not mounted yet)."""
    unreachable = False


class PermanentSinkError(SinkError):
    """Needs someone to act (not a folder, no permission): an alarm."""


class Sink(Protocol):
    name: str

    def put(self, key: str, path: str, size: int, throttle: Callable[[int], None],
            records_id: str = "") -> None: ...

    def object_name(self, key: str) -> str: ...

    def close(self) -> None: ...


class DirSink:
    """A landing folder: each object is written to a temporary name beside its final one,
    unique to the writer (``.<name>.<pid>-<random>.tmp``: two gateways on one mounted folder
    never write the same file), fsynced, and published without replacing anything: a hard link
    to the final name, then the temporary name removed, and the folder fsynced; new folders are
    fsynced into their parents. When the final name exists already, the object there is
    compared: the same bytes, or the same records (``records_id``, by its batch header, all of
    the file checked), is a success; a file that is no whole batch (a torn copy) is replaced
    (a warning); another batch is a PermanentSinkError ("already exists with other bytes"), as
    the s3 sink's conditional put, and so is something there that is not a regular file (a
    FIFO: never opened, its open would wait for good). A temporary file a crash left is
    removed by the next put of its name (the retry). An error names the object's final path,
    never the temporary one, so that the same failure reads the same at each retry (the
    uploader logs each distinct error once)."""

    def __init__(self, root: str):
        self.root = root
        self.name = f"file://{root}"

    def object_name(self, key: str) -> str:
        """The object's path, as the log lines give it."""
        return os.path.join(self.root, key)

    def put(self, key: str, path: str, size: int, throttle: Callable[[int], None],
            records_id: str = "") -> None:
        dest = self.object_name(key)
        folder, base = os.path.split(dest)
        tmp = os.path.join(folder, f".{base}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        where = dest
        try:
            where = folder
            self._make_folders(folder)
            self._remove_leftovers(folder, base)
            try:
                where = dest     # (the temporary name is new at each try: errors name dest)
                with open(path, "rb") as src:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    try:
                        os.fchmod(fd, 0o644)    # whatever the umask (the unit's is 0077)
                        self._copy(src, fd, path, size, throttle)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                self._publish(tmp, dest, path, size, records_id)
            finally:
                _unlink_quietly(tmp)
            where = folder
            self._fsync_dir(folder)
        except OSError as exc:
            kind = PermanentSinkError if exc.errno in PERMANENT_ERRNOS else TransientSinkError
            name = dest if exc.filename == tmp else exc.filename or where
            raise kind(f"{self.name}: cannot write {name}: {exc.strerror or exc}") from None

    @staticmethod
    def _remove_leftovers(folder: str, base: str) -> None:
        """Remove the temporary files of ``base`` that a crash left (``.<base>.*.tmp``): the
        writer that left one retries this very name. Another gateway writing it now has the
        same gateway_id: its link then fails, and its retry finds this object and compares."""
        start = f".{base}."
        for name in os.listdir(folder):
            if name.startswith(start) and name.endswith(".tmp"):
                _unlink_quietly(os.path.join(folder, name))

    @staticmethod
    def _copy(src, fd: int, path: str, size: int, throttle: Callable[[int], None]) -> None:
        copied = 0
        step = piece_size(throttle)
        while copied < size:
            chunk = src.read(min(step, size - copied))
            if not chunk:
                raise TransientSinkError(f"{path}: the batch file ends at {copied} of {size} "
                                         f"bytes")
            throttle(len(chunk))
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            copied += len(chunk)

    def _publish(self, tmp: str, dest: str, path: str, size: int, records_id: str) -> None:
        """``tmp`` under the name ``dest`` unless ``dest`` exists: then it must hold the same
        bytes or the same records as ``path``."""
        try:
            os.link(tmp, dest)
            return
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in NO_LINKS:
                raise
            # A file system without hard links (FAT, some FUSE mounts): look, then rename.
            if not os.path.lexists(dest):
                os.rename(tmp, dest)
                return
        try:   # never opened if not a regular file: a FIFO's open would wait for good
            os.close(open_regular(dest, os.O_RDONLY))
        except NotRegularFile as exc:
            raise PermanentSinkError(f"{self.name}: {dest} is {exc.strerror} at the batch's "
                                     f"name: remove it") from None
        if _same_bytes(dest, path, size):
            return
        theirs, problem = _records_of(dest)
        if records_id and theirs == records_id:
            return
        if problem:
            # No whole batch (a torn or partial copy): its name is this batch's, so this
            # batch takes it (the rename is atomic: readers see the one or the other).
            log.warning("%s: %s is no whole batch (%s); replaced by the batch uploaded now",
                        self.name, dest, problem)
            os.rename(tmp, dest)
            return
        raise PermanentSinkError(f"{self.name}: {dest} {OTHER_BYTES}")

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
                os.chmod(path, 0o755)           # (as the objects: readable by the job's user)
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


def piece_size(throttle) -> int:
    """The most bytes to send between two calls of ``throttle``: its ``piece`` when it has one
    (the uploader's Throttle, so that no wait in the middle of a request lasts long), else
    COPY_CHUNK."""
    return getattr(throttle, "piece", 0) or COPY_CHUNK


def _same_bytes(dest: str, path: str, size: int) -> bool:
    if os.path.getsize(dest) != size:
        return False
    with open(dest, "rb") as theirs, open(path, "rb") as ours:
        while True:
            a = theirs.read(COPY_CHUNK)
            if a != ours.read(COPY_CHUNK):
                return False
            if not a:
                return True


def _records_of(dest: str) -> tuple[str, str]:
    """``(records id, "")`` of the batch file ``dest`` when all of it reads as a batch (frame
    and CRC32C checked), else ``("", what is wrong)``."""
    from edgebroker.uploader.batch import BatchFormatError, check_batch_file, records_id
    try:
        return records_id(check_batch_file(dest)), ""
    except BatchFormatError as exc:
        return "", str(exc)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["Sink", "DirSink", "SinkError", "TransientSinkError",
           "PermanentSinkError", "piece_size", "OTHER_BYTES"]
