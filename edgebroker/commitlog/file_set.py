"""The ordered segments of a log: finding the one that holds an offset, new segments, rolling
(by size in ``_roll``, by age in ``housekeeping``), retention and deleting segments (their
descriptors closed by the flusher thread once ``defer_closes`` is on), the descriptors the
segments hold, and the uploaded mark retention waits for.

The lock guards the segment list (``_segments`` and ``_bases``, changed only by the core
thread, or by ``refresh`` in a read-only log), ``_retired`` and ``_uploaded``.

The functions take the ``CommitLog`` as ``self`` and are its methods (bound in log.py).
"""

from __future__ import annotations

import bisect
import errno
import json
import logging
import mmap
import os
import time
from collections.abc import Callable

from edgebroker.commitlog import retention, scanner
from edgebroker.commitlog.errors import LogError
from edgebroker.commitlog.format import (
    SEGMENT_HEADER_SIZE, SegmentInfo, UploadSource,
)
from edgebroker.commitlog.recovery import UPLOADED_FILE
from edgebroker.commitlog.segment import Segment
from edgebroker.files import write_small_file

log = logging.getLogger("edgebroker.commitlog")
# The errors of a disk without room: the uploaded mark then moves in memory only.
NO_ROOM = frozenset((errno.ENOSPC, errno.EDQUOT))
# Descriptors a segment holds: its data and index files, and its index map (an mmap keeps a
# duplicate of the descriptor it maps).
SEGMENT_DESCRIPTORS = 3


def segment_index(self, offset: int) -> int:
    return bisect.bisect_right(self._bases, offset) - 1


def find(self, offset: int) -> tuple[Segment, int] | None:
    i = self._segment_index(offset)
    if i < 0:
        return None
    seg = self._segments[i]
    j = seg.find_offset(offset)
    if j >= seg.count or seg.entry(j)[0] != offset:
        return None
    return seg, j


def new_segment(self, base_offset: int) -> Segment:
    seg = Segment(self.directory, base_offset)
    seg.verified = True  # everything in it is written by this process
    with self._lock:
        self._segments.append(seg)
        self._bases.append(base_offset)
    return seg


def roll(self) -> Segment:
    self._close_stage()
    old = self._tail
    old.full = True
    if not old.sealed and not any(g.segment is old for g in self._groups):
        self._seal(old)
    self._tail = self._new_segment(self._next)
    return self._tail


def housekeeping(self) -> None:
    """Seal the segment being appended to once it is ``segment_ms`` old, and apply retention.
    Call it now and then from the core (every second or so). Cheap when there is nothing
    to do; deleting a segment closes its descriptors (see ``Location``)."""
    if self.readonly or self._closed:
        return
    self._unstage()  # staged records count as pending (keep the segment open)
    now = self._clock()
    tail = self._tail
    max_age = self.options.segment_ms
    if self.upload_age_ms is not None:
        max_age = min(max_age, self.upload_age_ms)
    if (tail.count and not tail.sealed and not tail.full and tail.first_timestamp is not None
            and tail_age(self, tail, now) >= max_age
            and not any(g.segment is tail for g in self._groups)):
        tail.full = True
        self._seal(tail)
        return
    self._apply_retention(now)


def tail_age(self, tail: Segment, now: int) -> int:
    """Milliseconds since the first record of ``tail``: by the wall clock (its timestamp), but
    never less than the monotonic clock has counted since housekeeping first saw it, less the
    age it had then. A wall clock stepped back (NTP) would else hold the segment open, and
    a batch cut by age, until the clock caught up again (an hour for a step of an hour)."""
    wall = now - tail.first_timestamp
    mono = time.monotonic_ns() // 1_000_000
    seen = self._tail_seen
    if seen is None or seen[0] is not tail:
        seen = self._tail_seen = (tail, mono - max(wall, 0))
    return max(wall, mono - seen[1])


def apply_retention(self, now: int) -> None:
    opts = self.options
    # Without an uploader nothing is ever uploaded: retention by age applies to every segment.
    uploaded = self._uploaded if opts.wait_for_upload else 1 << 63
    victims, self.retention_waits = retention.plan(
        self._segments, uploaded, now, opts.retention_bytes, opts.retention_ms,
        self.hold_offset, 1 << 63 if self.unsaved_may_go else self.saved_offset)
    for seg, forced, reason in victims:
        self._delete_segment(seg, forced, reason)


def delete_segment(self, seg: Segment, forced: bool, reason: str) -> None:
    try:
        os.unlink(seg.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("cannot delete %s (%s): %s", seg.path, reason, exc.strerror)
        return
    try:
        os.unlink(seg.index_path)
    except OSError:
        pass
    span = (f"offsets {seg.entry(0)[0]}..{seg.next_offset - 1}, {seg.count} records"
            if seg.count else "empty") + f", {seg.size} bytes"
    unsaved = min(seg.count, max(0, seg.next_offset - self.saved_offset))
    if unsaved:
        self.counters.unsaved_deleted_records += unsaved
        span += f"; {unsaved} of them not yet covered by the session snapshot"
    with self._lock:
        i = self._segments.index(seg)
        del self._segments[i]
        del self._bases[i]
        self._unsynced.pop(seg.base_offset, None)
        seg.deleted = True
        retired = self._retired is not None
        if retired:
            self._retired += seg.detach()
    if retired and self._on_retired is not None:
        self._on_retired()
    seg.close()
    self.counters.segments_deleted += 1
    if forced:
        # the records at or past the uploaded mark (the segment may hold the mark)
        lost = min(seg.count, max(0, seg.next_offset - self._uploaded))
        self.counters.forced_deletions += 1
        self.counters.forced_deleted_records += lost
        log.warning("deleted segment %s (%s) before it was uploaded: %s; %d of its records "
                    "were not uploaded yet (a batch being uploaded may still carry some of them; "
                    "the batches' gaps tell what was lost)", seg.path, span, reason, lost)
    else:
        log.info("deleted segment %s (%s): %s", seg.path, span, reason)


def defer_closes(self, on_retired: Callable[[], None] | None = None) -> None:
    """From now on, the descriptors of a deleted segment are closed by ``close_retired``
    (the flusher thread) rather than by the thread that deletes it (the core), which calls
    ``on_retired`` to say there are some. Closing the last descriptor of a deleted file
    frees its blocks, which can wait for the disk (a discard, for instance)."""
    with self._lock:
        if self._retired is None:
            self._retired = []
        self._on_retired = on_retired


def close_retired(self, stop: bool = False) -> None:
    """Close the descriptors that deleted segments left (see ``defer_closes``); ``stop``:
    and from now on the thread that deletes a segment closes its files again (the flusher
    thread ends)."""
    with self._lock:
        fds = self._retired
        if stop:
            self._retired = None
            self._on_retired = None
        elif fds:
            self._retired = []
    if fds:
        self._close_quietly(*fds)


def mark_uploaded(self, up_to_offset: int) -> None:
    """Every record below ``up_to_offset`` has been uploaded; persisted (fsynced file), so
    retention may delete those segments. Any thread; not the core (it writes a file): the
    uploader thread of the broker that writes the log. A read-only log refuses (LogError): the
    mark belongs to the process that holds the log's lock.

    A disk without room for the file (ENOSPC, EDQUOT) does not hold the mark back: it moves
    in memory, so that retention may free room (see ``apply_retention``), and the file is
    written by the next call (the uploader calls again while ``uploaded_unsaved``). Counted in
    ``uploaded_mark_unsaved`` and logged once per episode; other errors raise."""
    if self.readonly:
        raise LogError(f"{self.directory}: the log is open read-only; only the broker that "
                       f"writes it advances the uploaded mark")
    with self._upload_lock:
        with self._lock:
            up_to_offset = max(min(up_to_offset, self._written), self._uploaded)
            if up_to_offset == self._uploaded and not self.uploaded_unsaved:
                return
        path = os.path.join(self.directory, UPLOADED_FILE)
        try:
            write_small_file(path, json.dumps({"uploaded_offset": up_to_offset}).encode()
                             + b"\n", self._dir_fd)
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            if not self.uploaded_unsaved:
                self.counters.uploaded_mark_unsaved += 1
                log.warning("cannot write the uploaded mark %s (%s): offsets up to %d are "
                            "uploaded, kept in memory (retention may delete them) and written "
                            "once there is room", path, exc.strerror, up_to_offset - 1)
            self.uploaded_unsaved = True
        else:
            if self.uploaded_unsaved:
                log.info("the uploaded mark %s is written again (offset %d)", path,
                         up_to_offset)
            self.uploaded_unsaved = False
        with self._lock:
            self._uploaded = max(self._uploaded, up_to_offset)


def upload_source(self, start: int) -> UploadSource | None:
    """The sealed and fsynced segment holding the first record at or after ``start``, for the
    uploader (any thread): None when that record is not in such a segment yet.

    The position its index gives is checked against the record's header first; when the
    entry does not lead to its record (a damaged index file), the position is found by
    walking the segment from its first record (logged once for the segment; the index is
    left to the core thread's readers to rebuild, see ``reader.start_position``: they may be
    reading it)."""
    with self._lock:
        durable = self._durable
        for seg in self._segments:
            if seg.next_offset <= start or not seg.count:
                continue
            if not seg.sealed or seg.next_offset > durable or seg.fd < 0:
                return None
            j = seg.find_offset(start)
            if j >= seg.count:
                continue
            offset, position, _ = seg.entry(j)
            src = UploadSource(seg.path, os.dup(seg.fd), position, seg.size, seg.next_offset,
                               self._tail is not seg, seg.version)
            end = seg.end_of(j)
            break
        else:
            return None
    if not scanner.starts_record(src.fd, position, end, offset):
        src.position = scanner.first_position(src.fd, src.size, seg.base_offset, start,
                                              src.path, src.version) or src.size
        with self._lock:
            first = (seg.index_path, -1) not in self._reported
            self._reported.add((seg.index_path, -1))
        if first:
            log.warning("%s: entry for offset %d does not lead to its record (a damaged "
                        "index); the upload found its records by walking the segment",
                        seg.index_path, offset)
    return src


def upload_backlog(self, start: int) -> tuple[int, int, int | None, int]:
    """What is not uploaded from ``start`` on (any thread): ``(sealed segments, bytes of the
    segment files, timestamp of the oldest record or None, largest timestamp)``."""
    segments = 0
    nbytes = 0
    oldest = None
    newest = 0
    with self._lock:
        for seg in self._segments:
            if seg.next_offset <= start or not seg.count:
                continue
            if seg.base_offset >= start or not seg.sealed:
                position, ts = SEGMENT_HEADER_SIZE, seg.first_timestamp
            else:
                j = seg.find_offset(start)
                if j >= seg.count:
                    continue
                _, position, ts = seg.entry(j)
            segments += seg.sealed
            nbytes += max(seg.size - position, 0)
            if oldest is None:
                oldest = ts
            newest = max(newest, seg.max_timestamp)
    return segments, nbytes, oldest, newest


def descriptors_at_retention(self) -> tuple[int, int]:
    """(segments, descriptors) of the log once it holds as many segments as
    ``retention_bytes`` allows, and those it may hold past it while retention waits for a
    session snapshot (retention.py; at least what it holds now)."""
    opts = self.options
    segments = max(len(self._segments), opts.retention_bytes // opts.segment_bytes + 1
                   + retention.SNAPSHOT_WAIT_SEGMENTS)
    return segments, max(self.descriptors_held(), SEGMENT_DESCRIPTORS * segments + 1)


def descriptors_held(self) -> int:
    """Descriptors the log's segments hold now, or may soon: each segment's data and index
    files and its index map (an mmap keeps a duplicate of the descriptor it maps), those of
    deleted segments the flusher has not closed yet, the duplicates a sync makes of what it
    fsyncs (two per segment waiting for one, and the directory's), and the next segment's
    file made ahead (see make_spares)."""
    with self._lock:
        n = (1 + 2 * len(self._unsynced) + (len(self._retired) if self._retired else 0)
             + self._spare_files.enabled)
        for seg in self._segments:
            n += (seg.fd >= 0) + (seg.index_fd >= 0) + isinstance(seg.index, mmap.mmap)
    return n


def segments(self) -> list[SegmentInfo]:
    infos = []
    tail = self._segments[-1] if self._segments else None
    for seg in list(self._segments):
        if not seg.created and not seg.count:
            continue
        last_ts = seg.max_timestamp if seg.count else None
        infos.append(SegmentInfo(
            seg.base_offset, seg.next_offset, seg.count, seg.size, seg.index_file_bytes,
            seg.first_timestamp if seg.count else None, last_ts,
            seg is tail and not seg.sealed, seg.count > 0 and seg.next_offset <= self._uploaded,
            seg.path))
    return infos
