"""The next segment's file, made ahead: created under a temporary name with its blocks allocated
up to ``segment_bytes`` by the segment-ahead thread (``SpareFiles.prepare``, called
through ``CommitLog.prepare_spare`` by ``flusher.SpareMaker``), taken by the core thread when it
creates a new segment (``take``). The log's lock, shared with ``SpareFiles``, guards the file
made ahead (``fd``, ``path``).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable

from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.segment import preallocate
from edgebroker.commitlog.sync import close_quietly

log = logging.getLogger("edgebroker.commitlog")
# The next segment's file, created and allocated ahead by the segment-ahead thread (see
# prepare_spare), named by process and number so that it never reuses the name of one a roll
# is taking; a leftover of a crash is removed at start like any ".tmp" file.
SPARE_FILE = "next-segment-{}-{}.tmp"
# Errors after which making a segment file ahead is tried again later (else: never again).
_SPARE_RETRY = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EINTR))


class SpareFiles:
    """The next segment's file, made ahead off the core thread (see ``prepare``)."""

    def __init__(self, directory: str, options: LogOptions, lock: threading.Lock,
                 readonly: bool):
        self.directory = directory
        self.options = options
        self.readonly = readonly
        self._lock = lock        # the log's lock
        self.fd = -1
        self.path = ""
        self.count = 0
        self.enabled = False
        self.on_taken: Callable[[], None] | None = None
        self.ready = threading.Event()
        self.closed = False      # set with the log's ``_closed``

    def make(self, on_spare_taken: Callable[[], None] | None = None) -> None:
        """From now on new segments take the file ``prepare_spare`` made ahead, when there is
        one; ``on_spare_taken`` is called (on the core thread) when one was taken, to have
        the next made. Without spares a new segment's blocks are allocated as it is written."""
        with self._lock:
            self.enabled = True
            self.on_taken = on_spare_taken

    def prepare(self) -> bool | None:
        """Make the next segment's file ahead, unless there is one: created under a temporary
        name with its blocks allocated up to ``segment_bytes`` (``segment.preallocate``), so
        that neither the allocation (which may read block bitmaps from the disk) nor its
        writes' allocations fall on the core thread. The ``segment-ahead`` thread (see
        ``flusher.SpareMaker``). True when one is ready; False when not now (less free space
        than twice ``segment_bytes``, so the last free blocks stay for the files that need
        them; no descriptor free): nothing is kept, a later call tries again; None when never
        again (closed, or the file system cannot allocate ahead: logged once)."""
        with self._lock:
            if self.closed or self.readonly or not self.enabled:
                return None
            if self.fd >= 0:
                return True
        room = self.options.segment_bytes
        try:
            st = os.statvfs(self.directory)
            if st.f_bavail * st.f_frsize < 2 * room:
                return False
        except OSError:
            return False
        self.count += 1
        path = os.path.join(self.directory, SPARE_FILE.format(os.getpid(), self.count))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            return self._failed(exc.errno)
        err = preallocate(fd, room)
        if err:
            close_quietly(fd)
            _unlink_quietly(path)
            return self._failed(err)
        with self._lock:
            if not self.closed and self.fd < 0:
                self.fd = fd
                self.path = path
                self.ready.set()
                return True
        close_quietly(fd)
        _unlink_quietly(path)
        return None if self.closed else True

    def _failed(self, err: int) -> bool | None:
        if err in _SPARE_RETRY:
            return False
        self.enabled = False
        log.warning("%s: not making segment files ahead from now on: %s (each new segment's "
                    "blocks are allocated as it is written)", self.directory, os.strerror(err))
        return None

    def take(self) -> tuple[int, str] | None:
        """The file ``prepare`` made, for a new segment to take (core thread)."""
        with self._lock:
            fd = self.fd
            if fd < 0:
                return None
            path = self.path
            self.fd = -1
            self.ready.clear()
            callback = self.on_taken
        if callback is not None:
            try:
                callback()
            except Exception:  # the spare is taken all the same
                log.exception("asking for the next segment's file failed")
        return fd, path

    def drop(self, unlink: bool = True) -> None:
        """Close the file made ahead and remove it (``unlink`` False: a disk that does not
        answer; the next start removes it)."""
        with self._lock:
            fd = self.fd
            path = self.path
            self.fd = -1
            self.ready.clear()
        if fd >= 0:
            close_quietly(fd)
            if unlink:
                _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
