"""The next segment's file, made ahead: created under a temporary name with its blocks allocated
up to ``segment_bytes`` by the segment-ahead thread (``prepare_spare``, run by
``flusher.SpareMaker``), taken by the core thread when it creates a new segment
(``_take_spare``). The lock guards the file made ahead (``_spare``, ``_spare_path``).

The functions take the ``CommitLog`` as ``self`` and are its methods (bound in log.py).
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Callable

from edgebroker.commitlog.segment import preallocate

log = logging.getLogger("edgebroker.commitlog")
# The next segment's file, created and allocated ahead by the segment-ahead thread (see
# prepare_spare), named by process and number so that it never reuses the name of one a roll
# is taking; a leftover of a crash is removed at start like any ".tmp" file.
SPARE_FILE = "next-segment-{}-{}.tmp"
# Errors after which making a segment file ahead is tried again later (else: never again).
_SPARE_RETRY = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EINTR))


def make_spares(self, on_spare_taken: Callable[[], None] | None = None) -> None:
    """From now on new segments take the file ``prepare_spare`` made ahead, when there is
    one; ``on_spare_taken`` is called (on the core thread) when one was taken, to have
    the next made. Without spares a new segment's blocks are allocated as it is written."""
    with self._lock:
        self._spares = True
        self._on_spare_taken = on_spare_taken


def prepare_spare(self) -> bool | None:
    """Make the next segment's file ahead, unless there is one: created under a temporary
    name with its blocks allocated up to ``segment_bytes`` (``segment.preallocate``), so
    that neither the allocation (which may read block bitmaps from the disk) nor its
    writes' allocations fall on the core thread. The ``segment-ahead`` thread (see
    ``flusher.SpareMaker``). True when one is ready; False when not now (less free space
    than twice ``segment_bytes``, so the last free blocks stay for the files that need
    them; no descriptor free): nothing is kept, a later call tries again; None when never
    again (closed, or the file system cannot allocate ahead: logged once)."""
    with self._lock:
        if self._closed or self.readonly or not self._spares:
            return None
        if self._spare >= 0:
            return True
    room = self.options.segment_bytes
    try:
        st = os.statvfs(self.directory)
        if st.f_bavail * st.f_frsize < 2 * room:
            return False
    except OSError:
        return False
    self._spare_count += 1
    path = os.path.join(self.directory, SPARE_FILE.format(os.getpid(), self._spare_count))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        return self._spare_failed(exc.errno)
    err = preallocate(fd, room)
    if err:
        self._close_quietly(fd)
        _unlink_quietly(path)
        return self._spare_failed(err)
    with self._lock:
        if not self._closed and self._spare < 0:
            self._spare = fd
            self._spare_path = path
            self.spare_ready.set()
            return True
    self._close_quietly(fd)
    _unlink_quietly(path)
    return None if self._closed else True


def spare_failed(self, err: int) -> bool | None:
    if err in _SPARE_RETRY:
        return False
    self._spares = False
    log.warning("%s: not making segment files ahead from now on: %s (each new segment's "
                "blocks are allocated as it is written)", self.directory, os.strerror(err))
    return None


def take_spare(self) -> tuple[int, str] | None:
    """The file ``prepare_spare`` made, for a new segment to take (core thread)."""
    with self._lock:
        fd = self._spare
        if fd < 0:
            return None
        path = self._spare_path
        self._spare = -1
        self.spare_ready.clear()
        callback = self._on_spare_taken
    if callback is not None:
        try:
            callback()
        except Exception:  # the spare is taken all the same
            log.exception("asking for the next segment's file failed")
    return fd, path


def drop_spare(self, unlink: bool = True) -> None:
    """Close the file made ahead and remove it (``unlink`` False: a disk that does not
    answer; the next start removes it)."""
    with self._lock:
        fd = self._spare
        path = self._spare_path
        self._spare = -1
        self.spare_ready.clear()
    if fd >= 0:
        self._close_quietly(fd)
        if unlink:
            _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
