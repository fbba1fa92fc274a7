"""Making what was written durable: fsync (on duplicated descriptors, outside the lock, one sync
at a time), the recovery point, and freeing the room allocated ahead past a sealed segment.
The flusher thread calls ``sync``; ``close`` calls it last.

The functions that take the ``CommitLog`` as ``self`` are its methods (bound in log.py).
"""

from __future__ import annotations

import json
import logging
import os

from edgebroker.commitlog.errors import LogWriteError
from edgebroker.files import read_small_file, write_small_file

log = logging.getLogger("edgebroker.commitlog")
RECOVERY_POINT_FILE = "recovery-point"


class SyncStillRunning(LogWriteError):
    """``sync(wait=...)``: the sync another thread runs did not finish in time."""


def sync(self, sealed_only: bool = False, wait: float | None = None) -> int:
    """fsync what was written (``sealed_only``: only sealed segments); -> ``durable_offset``.

    Safe to call from another thread while the core appends, writes and rolls: the lock is
    held only to take a snapshot; the fsyncs run on duplicated descriptors outside it.
    Syncs run one at a time; ``wait``: seconds to wait for one that is running (None: as
    long as it takes), then ``SyncStillRunning``.
    """
    if not self._sync_lock.acquire(timeout=-1 if wait is None else wait):
        raise SyncStillRunning(f"{self.directory}: an fsync of the log has not finished "
                               f"after {wait:g} s (the disk does not answer); not waiting "
                               f"longer")
    try:
        return self._sync(sealed_only)
    finally:
        self._sync_lock.release()


def run_sync(self, sealed_only: bool) -> int:
    """``sync`` with the sync lock held."""
    with self._lock:
        if self._closed:
            return self._durable
        todo = [s for s in self._unsynced.values() if s.sealed or not sealed_only]
        for s in todo:
            del self._unsynced[s.base_offset]
        self._needs_sync = bool(self._unsynced)
        target = None if sealed_only else self._written
        open_segments = [s.base_offset for s in self._segments if not s.sealed]
        recovery_point = min(open_segments) if open_segments else self._written
        jobs = []
        path = self.directory
        try:
            for s in todo:
                if s.fd < 0:
                    continue
                path = s.path
                fd = os.dup(s.fd)
                try:
                    path = s.index_path
                    ifd = os.dup(s.index_fd) if s.index_dirty and s.index_fd >= 0 else -1
                except OSError:
                    os.close(fd)
                    raise
                room = s.size if s.sealed and s.preallocated else -1
                jobs.append((s, fd, ifd, s.new_file, s.sealed,
                             s.index_trim if ifd >= 0 else -1, room))
                s.index_dirty = s.new_file = False
                if room >= 0:
                    s.preallocated = False
                if ifd >= 0:
                    s.index_trim = -1
            path = self.directory
            dir_fd = os.dup(self._dir_fd) if any(j[3] for j in jobs) else -1
        except OSError as exc:   # EMFILE: no descriptor free for the duplicate
            for j in jobs:
                close_quietly(j[1], j[2])
            self._requeue(jobs, todo)
            self.counters.fsync_errors += 1
            raise LogWriteError.from_os("cannot duplicate a descriptor to fsync", path,
                                        exc) from None
    try:
        for seg, fd, ifd, _new, sealed, trim, room in jobs:
            path = seg.path
            if room >= 0 and free_room(fd, room, path):  # first: its last block changes
                seg.allocated = 0
            os.fdatasync(fd)
            if sealed:
                drop_cached(fd)
            if ifd >= 0:
                path = seg.index_path
                if trim >= 0:
                    os.ftruncate(ifd, trim)
                    with self._lock:  # (a reader may have written a new index file meanwhile)
                        seg.index_file_bytes = min(seg.index_file_bytes, trim)
                os.fsync(ifd)
        if dir_fd >= 0:
            path = self.directory
            os.fsync(dir_fd)
    except OSError as exc:
        self.counters.fsync_errors += 1
        with self._lock:
            self._requeue(jobs, todo)
        raise LogWriteError.from_os("cannot fsync", path, exc) from None
    finally:
        for _seg, fd, ifd, *_ in jobs:
            close_quietly(fd, ifd)
        if dir_fd >= 0:
            close_quietly(dir_fd)
    self.counters.fsyncs += len(jobs)
    with self._lock:
        if target is not None and target > self._durable:
            self._durable = target
        durable = self._durable
    if any(seg.sealed for seg, *_ in jobs):
        self._set_recovery_point(recovery_point)
    return durable


def free_room(fd: int, size: int, path: str) -> bool:
    """A segment's blocks allocated ahead past its ``size`` are not needed (it is sealed,
    or the log closes): free them; whether they were. A failure only leaves them allocated
    (the next start tries again, once the segment is sealed)."""
    try:
        os.ftruncate(fd, size)
        return True
    except OSError as exc:
        log.warning("%s: cannot free the blocks allocated ahead past its %d bytes: %s",
                    path, size, exc.strerror)
        return False


def drop_cached(fd: int) -> None:
    """A sealed segment is on disk: let the OS drop its pages from the page cache. The log
    is written once and read seldom (a backlog, the uploader); kept cached it would push
    out what the gateway's other programs need, and new pages cost more to write into
    than recycled ones."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # advice only


def requeue(self, jobs, todo) -> None:
    for s in todo:
        self._unsynced.setdefault(s.base_offset, s)
    for s, _fd, ifd, new, _sealed, trim, room in jobs:
        if room >= 0:
            s.preallocated = True  # freed again (or for the first time) by the retry
        if ifd >= 0:
            s.index_dirty = True
        if trim >= 0 and s.index_trim < 0:
            s.index_trim = trim
        if new:
            s.new_file = True
    self._needs_sync = bool(self._unsynced)


def close_quietly(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def read_offset_file(path: str, key: str) -> tuple[int, str | None]:
    """(value, problem) of the recovery point's or the uploaded mark's file: 0 and a
    description when the file is missing or unreadable."""
    try:
        value = json.loads(read_small_file(path))[key]    # a FIFO there: a problem, no wait
        if type(value) is not int or not 0 <= value < 1 << 63:     # (true, 10**30: not offsets)
            raise ValueError(f"{key} is {value!r:.40}")
        return value, None
    except FileNotFoundError:
        return 0, None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return 0, f"{path}: unreadable ({exc}); using 0"


def check_offset_files(self, end: int) -> int:
    """At open, the log's records end at ``end``: a recovery point or uploaded mark past it
    (records durable once, and gone since: the last segment truncated or deleted after the
    stop; or a wrong number in the file) is logged, naming the file, its value and the end.
    The recovery point is lowered to ``end`` (it only claims durability). The uploaded mark is
    kept: its offsets are in the sink, and a new record under it would be uploaded again
    under the name of a batch already there (docs/upload-format.md, "Object name"), so
    offsets ``end`` to the mark - 1 become a hole (sessions count it as log_gap).
    -> the offset new records take from; with no segment left at all (the log emptied by
    hand), the higher of ``end`` and the two files' offsets. Each file past the end goes into
    ``self.recovery.past_end`` too (``inspect verify`` reports them)."""
    if not self._segments:
        return max(end, self._recovery_point, self._uploaded)
    where = f"offset {end}, in {self._segments[-1].path}"
    if self._recovery_point > end:
        rp_path = os.path.join(self.directory, RECOVERY_POINT_FILE)
        self.recovery.past_end.append((rp_path, self._recovery_point, end,
                                       self._segments[-1].path, "fsynced"))
        log.warning("%s: %d is past the end of the commit log (%s): records %d to %d were "
                    "fsynced once and are gone (the last segment truncated or deleted since?), "
                    "or the file is wrong; using %d", rp_path, self._recovery_point, where, end,
                    self._recovery_point - 1, end)
        self._recovery_point = end
    nxt = max(end, self._uploaded)
    if nxt > end:
        uploaded = os.path.join(self.directory, "uploaded")
        self.recovery.past_end.append((uploaded, nxt, end, self._segments[-1].path, "uploaded"))
        log.warning("%s: %d is past the end of the commit log (%s): records %d to %d were "
                    "uploaded and are gone (the last segment truncated or deleted since?), or "
                    "the file is wrong; new records take offsets from %d, not again those "
                    "uploaded (readers pass over %d to %d, sessions count them as log_gap)",
                    uploaded, nxt, where, end, nxt - 1, nxt, end, nxt - 1)
        self._holes.append((end, nxt))
    return nxt


def set_recovery_point(self, offset: int) -> None:
    """Record that every segment below ``offset`` is fsynced (so the next start skips
    scanning them record by record)."""
    with self._rp_lock:
        if offset <= self._recovery_point or self.readonly or self._closed:
            return
        path = os.path.join(self.directory, RECOVERY_POINT_FILE)
        try:
            write_small_file(path, json.dumps({"recovery_point": offset}).encode() + b"\n",
                             self._dir_fd)
        except OSError as exc:
            log.warning("cannot write %s: %s (the next start scans more)", path, exc.strerror)
            return
        self._recovery_point = offset
