"""Appending and writing (core thread): records are staged (small ones built in C by
``_native.append_record`` into the staging area, large payloads held by reference), queued in
groups per segment, handed to the OS by ``write_pending`` (one ``pwritev`` a pass, never an
fsync), and segments are sealed.

The core thread alone appends and writes; the lock is taken only where what was written
becomes visible to readers and the flusher (``_written_to``) and at seal.

The functions take the ``CommitLog`` as ``self`` and are its methods (bound in log.py).
``append`` is the hot path of every PUBLISH: bound as a method, it costs what a method costs.
"""

from __future__ import annotations

import errno
import logging
import os

from edgebroker import _native
from edgebroker.commitlog.errors import LogError, LogFullError, LogWriteError
from edgebroker.commitlog.format import (
    INDEX_ENTRY, INDEX_ENTRY_SIZE, MAX_CLIENT_ID, MAX_PAYLOAD, MAX_TOPIC, PROPERTIES_LENGTH_SIZE,
    RECORD_HEADER_SIZE, RETAIN_BIT, segment_header,
)
from edgebroker.commitlog.segment import Segment

log = logging.getLogger("edgebroker.commitlog")

_pack_entry = INDEX_ENTRY.pack
# Payloads of at least this many bytes are written from where they are, not copied (the caller
# never modifies a payload it appended).
BIG_PAYLOAD = 16 * 1024
# The staging area of append (records built in C): a loop pass's worth of small records.
STAGING_BYTES = 64 * 1024
# Payload types a group refers to instead of copying (see Group).
_HELD_TYPES = (bytes, bytearray)
IOV_MAX = 1024


class Group:
    """Records appended for one segment and not yet written: their bytes and index entries.

    The bytes are ``parts``: bytearrays that small records are copied into, and large payloads
    held by reference (``bytes``, or the ``bytearray`` of a large received PUBLISH, which
    nothing modifies), all written with one ``pwritev``. ``data`` is the bytearray being filled
    (the last of ``parts``; None when the last part is a held payload, or there is none yet)."""

    __slots__ = ("segment", "parts", "data", "nbytes", "index", "count", "last_offset", "first_ts",
                 "max_ts")

    def __init__(self, segment: Segment):
        self.segment = segment
        self.data: bytearray | None = None
        self.parts: list = []
        self.nbytes = 0
        self.index = bytearray()
        self.count = 0
        self.last_offset = -1
        self.first_ts: int | None = None
        self.max_ts = 0

    def open_data(self) -> bytearray:
        """The bytearray being filled; a new last part when there is none."""
        data = self.data
        if data is None:
            self.data = data = bytearray()
            self.parts.append(data)
        return data


def append(self, timestamp_ms: int, qos: int, retain: bool, client_id: bytes, topic: bytes,
           payload: bytes, properties: bytes = b"") -> int:
    """Buffer one record; returns its offset. Nothing reaches the OS until ``write_pending``;
    a large ``payload`` is held by reference until then and must not change. ``properties``:
    the message's MQTT 5.0 properties as the log keeps them (``Record.properties``), stored
    as they are.

    While writes are failing, a record that would take the pending bytes past
    ``options.max_pending_bytes`` is refused with ``LogFullError`` (not taken, no offset)."""
    stage = self._stage
    if stage is not None:
        n = len(payload)
        if n < BIG_PAYLOAD:
            if type(payload) is bytes:
                # The common record: small, bytes, in the open segment. Built in C
                # (header, CRC, index entry) into the staging area, which write_pending
                # writes from.
                try:
                    offset = self._append_record(stage, timestamp_ms, qos, retain, client_id,
                                                 len(client_id), topic, len(topic), payload,
                                                 n, properties, len(properties))
                except (TypeError, OverflowError):  # a client id, topic or properties not
                    offset = -1  # bytes (the C build takes only bytes), a field out of range
                if offset >= 0:
                    return offset
        elif type(payload) in _HELD_TYPES:
            # A large payload (a received one is a bytearray): its header, client id and
            # topic are staged, the payload itself is held and written from where it is.
            try:
                offset = self._append_held(stage, timestamp_ms, qos, retain, client_id,
                                           len(client_id), topic, len(topic), payload, n,
                                           properties, len(properties))
            except (TypeError, OverflowError):
                offset = -1
            if offset >= 0:
                self._held.append(payload)
                self._held_bytes += n
                return offset
    return self._append(timestamp_ms, qos, retain, client_id, topic, payload, properties)


def append_long(self, timestamp_ms: int, qos: int, retain: bool, client_id: bytes, topic: bytes,
                payload: bytes, properties: bytes = b"") -> int:
    """``append`` for what the staging area does not take; opens it again afterwards."""
    if self.readonly or self._closed:
        raise LogError(f"{self.directory}: the log is {'read-only' if self.readonly else 'closed'}")
    self._unstage()
    lc, lt, lp, lr = len(client_id), len(topic), len(payload), len(properties)
    if lc > MAX_CLIENT_ID or lt > MAX_TOPIC or lp > MAX_PAYLOAD or lr > MAX_PAYLOAD \
            or not 0 <= qos <= 2 or timestamp_ms < 0:
        raise ValueError(f"record out of range: qos {qos}, timestamp {timestamp_ms}, "
                         f"client id {lc} bytes, topic {lt} bytes, payload {lp} bytes, "
                         f"properties {lr} bytes")
    length = RECORD_HEADER_SIZE + lc + lt + lp + (PROPERTIES_LENGTH_SIZE + lr if lr else 0)
    if self._failing and self._pending + length > self.options.max_pending_bytes:
        raise LogFullError(f"{self.directory}: {self._pending} bytes are waiting for the "
                           f"disk (max_pending_bytes {self.options.max_pending_bytes}); record "
                           f"not taken")
    seg = self._tail
    if seg.full or seg.sealed or (seg.reserved_count and (
            seg.reserved_size + length > self.options.segment_bytes
            or timestamp_ms - seg.reserved_first_ts >= self.options.segment_ms)):
        seg = self._roll()
    g = self._group(seg, timestamp_ms)
    offset = self._next
    data = g.open_data()
    position = seg.reserved_size
    data += self._header(offset, timestamp_ms, qos | RETAIN_BIT if retain else qos,
                         client_id, topic, payload, properties)
    data += client_id
    data += topic
    data += properties
    if lp >= BIG_PAYLOAD and type(payload) in _HELD_TYPES:
        g.parts.append(payload)
        g.data = None
    else:
        data += payload
    g.nbytes += length
    max_ts = seg.reserved_max_ts
    if timestamp_ms > max_ts:
        seg.reserved_max_ts = max_ts = timestamp_ms
    g.max_ts = max_ts
    g.index += _pack_entry(offset - seg.base_offset, position, max_ts)
    g.count += 1
    g.last_offset = offset
    seg.reserved_size = position + length
    seg.reserved_count += 1
    self._pending += length
    self._next = offset + 1
    if not self._failing:
        self._open_stage(seg)
    return offset


def group(self, seg: Segment, timestamp_ms: int) -> Group:
    """The group that ``seg``'s next record joins (the last one, or a new one)."""
    groups = self._groups
    if groups and groups[-1].segment is seg:
        return groups[-1]
    return self._new_group(seg, timestamp_ms)


def open_stage(self, seg: Segment) -> None:
    """Let ``append`` stage the records that follow in ``seg`` (nothing is staged now)."""
    stage = self._staging.state
    if self._stage_seg is not seg:
        opts = self.options
        _native.stage_segment(stage, seg.base_offset, opts.segment_bytes, seg.reserved_first_ts,
                              opts.segment_ms, BIG_PAYLOAD)
        self._stage_seg = seg
    _native.stage_start(stage, self._next, seg.reserved_size, seg.reserved_max_ts)
    self._stage = stage


def close_stage(self) -> None:
    """Records take the long way until ``_append`` opens the staging area again."""
    self._unstage()
    self._stage = None
    self._stage_seg = None


def unstage(self) -> None:
    """Move the staged records into the write queue (their segment's last group), as if
    ``_append`` had appended them; each held payload goes right after its record."""
    stage = self._stage
    if stage is None or not stage.count:
        return
    n, used = stage.count, stage.used
    seg = self._stage_seg
    g = self._group(seg, stage.staged_first_ts)
    for part in self._staged_parts(stage):
        if type(part) is memoryview:  # staged bytes: copied
            g.open_data().extend(part)
        else:  # a held payload: written from where it is
            g.parts.append(part)
            g.data = None
    g.index += self._staged_index[:n * INDEX_ENTRY_SIZE]
    g.count += n
    g.last_offset = stage.next_offset - 1
    g.max_ts = stage.max_ts
    used += self._take_staged(stage, seg)
    g.nbytes += used
    self._pending += used


def staged_parts(self, stage) -> list:
    """The staged records' bytes in write order: views of the staging area, each held
    payload right after its record's header, client id and topic."""
    staged = self._staged
    held = self._held
    if not held:
        return [staged[:stage.used]]
    where = self._staging.held
    parts = []
    done = 0
    for i, payload in enumerate(held):
        end = where[i]
        parts.append(staged[done:end])
        parts.append(payload)
        done = end
    if done < stage.used:
        parts.append(staged[done:stage.used])
    return parts


def take_staged(self, stage, seg: Segment) -> int:
    """The staged records now count as appended to ``seg`` (the write queue or the file
    has them): empty the staging area. The bytes of the held payloads it let go."""
    seg.reserved_max_ts = stage.max_ts
    seg.reserved_size = stage.position
    seg.reserved_count += stage.count
    self._next = stage.next_offset
    _native.stage_clear(stage)
    nbytes = self._held_bytes
    if nbytes:
        self._held.clear()
        self._held_bytes = 0
    return nbytes


def new_group(self, seg: Segment, timestamp_ms: int) -> Group:
    """Start the group of records bound for ``seg``; its first record is ``timestamp_ms``'s."""
    g = Group(seg)
    g.first_ts = timestamp_ms
    if seg.reserved_first_ts is None:
        seg.reserved_first_ts = timestamp_ms
    self._groups.append(g)
    if seg.reserved_size == 0:
        header = segment_header(seg.base_offset)
        g.open_data().extend(header)
        g.nbytes += len(header)
        seg.reserved_size = len(header)
        self._pending += len(header)
    return g


def write_pending(self) -> int:
    """Hand every record appended since the last call to the OS: one ``pwritev`` (one per
    segment when the records span a roll; more only past 1024 buffers, about 500 large
    payloads). Never fsyncs. Returns ``written_offset``.

    On a write error (disk full, I/O error) the partial write is truncated away, the records
    stay pending for the next call, and ``LogWriteError`` says what and where.
    """
    stage = self._stage
    if stage is not None and stage.count and not self._groups and self._write_stage(stage):
        return self._written
    self._unstage()
    while self._groups:
        g = self._groups[0]
        seg = g.segment
        try:
            if not seg.created:
                seg.create_files(self._spare_files.take() if seg.fd < 0 else None,
                                 self.options.segment_bytes)
            if seg.count + g.count > seg.index_capacity:
                seg.ensure_index_room(seg.count + g.count, self.options.segment_bytes)
            self._write_at(seg, g.parts, g.nbytes, seg.size)
        except LogWriteError as exc:
            self.counters.write_errors += 1
            self._close_stage()  # while failing, every append checks max_pending_bytes
            if not self._failing:
                self._failing = True
                log.error("commit log write failed: %s; %d records (%d bytes) kept in memory "
                          "and retried", exc, self._next - self._written, self._pending)
            raise
        self._written_to(seg, g.index, g.count, g.nbytes, g.last_offset + 1, g.max_ts,
                         g.first_ts)
        self._pending -= g.nbytes
        self._groups.pop(0)
        if seg.full and not (self._groups and self._groups[0].segment is seg):
            self._seal(seg)
    if self._failing:
        self._failing = False
        log.warning("commit log writes work again; everything pending is written")
    return self._written


def write_stage(self, stage) -> bool:
    """``write_pending``'s common pass: every pending record is staged (no group waits),
    so they are written straight from the staging area and their held payloads, with no
    group between. False, having changed nothing, when that pass cannot be taken or the
    write fails; the long way then writes the same bytes again."""
    seg = self._stage_seg
    n = stage.count
    if not seg.created or seg.count + n > seg.index_capacity:
        return False
    nbytes = stage.used + self._held_bytes
    try:
        self._write_at(seg, self._staged_parts(stage), nbytes, seg.size)
    except LogWriteError:
        return False  # the long way tries again, and reports
    self._written_to(seg, self._staged_index[:n * INDEX_ENTRY_SIZE], n, nbytes,
                     stage.next_offset, stage.max_ts, stage.staged_first_ts)
    self._take_staged(stage, seg)
    return True


def written_to(self, seg: Segment, index, count: int, nbytes: int, next_offset: int,
                max_ts: int, first_ts: int) -> None:
    """``count`` records (``nbytes``, their ``index`` entries) were just written at the end
    of ``seg``: readers, the flusher and the counters may see them."""
    start = seg.count * INDEX_ENTRY_SIZE
    seg.index[start:start + len(index)] = index
    with self._lock:
        seg.size += nbytes
        seg.count += count
        seg.next_offset = next_offset
        seg.max_timestamp = max_ts
        if seg.first_timestamp is None:
            seg.first_timestamp = first_ts
        self._written = next_offset
        self._unsynced[seg.base_offset] = seg
        self._needs_sync = True
    counters = self.counters
    counters.writes += 1
    counters.appended_records += count
    counters.appended_bytes += nbytes


def write_at(self, seg: Segment, parts: list, nbytes: int, position: int) -> None:
    if len(parts) <= IOV_MAX:
        # The common pass: one call (one buffer when the records are small). A short
        # write or an error goes the long way below, which writes the same bytes again
        # from the start.
        try:
            if (os.pwrite(seg.fd, parts[0], position) if len(parts) == 1 else
                    os.pwritev(seg.fd, parts, position)) == nbytes:
                return
        except OSError:
            pass
    views = [memoryview(p) for p in parts if len(p)]
    first = 0
    done = 0
    try:
        while first < len(views):
            n = os.pwritev(seg.fd, views[first:first + IOV_MAX], position + done)
            if n <= 0:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            done += n
            while first < len(views) and n >= len(views[first]):
                n -= len(views[first])
                first += 1
            if n:
                views[first] = views[first][n:]
    except OSError as exc:
        try:
            os.ftruncate(seg.fd, position)
        except OSError as exc2:
            log.error("%s: cannot truncate the partial write back to %d bytes: %s (readers "
                      "stop at the last valid record; the next start truncates it)",
                      seg.path, position, exc2.strerror)
        raise LogWriteError.from_os(f"cannot write {nbytes} bytes at position {position} of",
                                    seg.path, exc) from None
    finally:
        for v in views:
            v.release()


def seal(self, seg: Segment) -> None:
    """No more appends to ``seg``: map its index read-only; the flusher trims the index
    file and fsyncs both files."""
    if seg is self._stage_seg:
        self._close_stage()
    trim = -1
    if seg.created and seg.index_fd >= 0:
        problem = seg.seal_index()
        if problem is not None:
            log.warning("%s: cannot map the sealed index (%s); its %d entries are kept in "
                        "memory", seg.index_path, problem, seg.count)
        trim = seg.count * INDEX_ENTRY_SIZE
    with self._lock:
        seg.sealed = True
        if seg.created:
            seg.index_dirty = True
            seg.index_trim = trim  # with index_dirty: one sync job takes both
            self._unsynced[seg.base_offset] = seg
            self._needs_sync = True
    self.counters.segments_rolled += 1
    self._apply_retention(self._clock())
