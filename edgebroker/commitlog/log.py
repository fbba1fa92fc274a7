"""The commit log: one append-only log of every message, in segments, crash-safe.

Threads. The core thread appends, writes, reads, rolls and runs retention; it never fsyncs.
The flusher thread calls ``sync()`` (fsync, outside the lock) and ``verify_step()``; the
segment-ahead thread ``prepare_spare()``. Any thread may call ``mark_uploaded()``. One lock
guards what they share: the set of segments written but not yet synced, the written and durable
offsets, the segment list, the uploaded mark and the file made ahead. The flusher
syncs through duplicated file descriptors, so the core may seal or delete a segment meanwhile.

Read-only opens (``readonly=True``: ``edgebroker inspect``, the uploader in another process) take
no lock, change no file, and see what the writer has written so far; ``refresh()`` picks up more.

The format is documented byte by byte in docs/log-format.md.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from edgebroker import _native
from edgebroker.commitlog import file_set, reader, recovery, spare
from edgebroker.commitlog.errors import LogError, LogFullError, LogWriteError
from edgebroker.commitlog.format import (
    INDEX_ENTRY, INDEX_ENTRY_SIZE, MAX_CLIENT_ID, MAX_PAYLOAD, MAX_TOPIC, RECORD_HEADER_SIZE,
    RETAIN_BIT, Damage, LogOptions, segment_header,
)
from edgebroker.commitlog.segment import Segment
from edgebroker.commitlog import sync as syncing
from edgebroker.commitlog import verify as verifying
from edgebroker.commitlog.recovery import RecoveryReport
from edgebroker.commitlog.sync import SyncStillRunning
from edgebroker.commitlog.verify import VerifyReport

log = logging.getLogger("edgebroker.commitlog")

# How long close() waits for an fsync another thread started (the flusher, stopped already,
# may still wait for the disk).
CLOSE_SYNC_WAIT = 10.0
MAX_DAMAGE_KEPT = 1000

_pack_entry = INDEX_ENTRY.pack
# Payloads of at least this many bytes are written from where they are, not copied (the caller
# never modifies a payload it appended).
BIG_PAYLOAD = 16 * 1024
# The staging area of append (records built in C): a loop pass's worth of small records.
STAGING_BYTES = 64 * 1024
# Payload types a group refers to instead of copying (see _Group).
_HELD_TYPES = (bytes, bytearray)
IOV_MAX = 1024


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class LogCounters:
    """Everything the log counts (for $SYS and metrics)."""

    appended_records: int = 0
    appended_bytes: int = 0
    writes: int = 0                    # pwrite/pwritev calls that handed records to the OS
    write_errors: int = 0
    fsyncs: int = 0
    fsync_errors: int = 0
    segments_rolled: int = 0
    segments_deleted: int = 0
    forced_deletions: int = 0          # segments deleted before they were uploaded
    forced_deleted_records: int = 0
    corrupt_regions: int = 0           # damaged regions found (each counted once)
    torn_bytes_truncated: int = 0
    index_rebuilds: int = 0


class _Group:
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


class CommitLog:
    """Use ``CommitLog.open(directory, options)``."""

    def __init__(self, directory: str, options: LogOptions, clock_ms: Callable[[], int],
                 readonly: bool):
        self.directory = directory
        self.options = options
        self.readonly = readonly
        self.counters = LogCounters()
        self.recovery = RecoveryReport()
        self.damage: list[Damage] = []
        self._clock = clock_ms
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()
        self._rp_lock = threading.Lock()
        # One sync at a time: a second one (close() while the flusher's fsync still waits for
        # the disk) would find nothing left to sync and report as durable what is not yet.
        self._sync_lock = threading.Lock()
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._groups: list[_Group] = []
        self._header = _native.header_writer()  # record headers of append() (core thread)
        # Small records are built in C into a staging area (core thread; see append).
        # ``_stage`` is the open staging area's state, None while records take the long way.
        self._staging = _native.appender(STAGING_BYTES, STAGING_BYTES // 32)
        # Views of its records and their index entries (fixed sizes: exported for its life).
        self._staged = memoryview(self._staging.data)
        self._staged_index = memoryview(self._staging.index)
        self._append_record = _native.append_record
        self._append_held = _native.append_held
        self._held: list = []   # the payloads of the staged records of _append_held, in order
        self._held_bytes = 0
        self._stage = None
        self._stage_seg: Segment | None = None
        self._pending = 0  # appended bytes not yet written (piles up while the disk fails)
        self._next = 0
        self._written = 0
        self._durable = 0
        self._unsynced: dict[int, Segment] = {}
        self._needs_sync = False
        self._uploaded = 0
        self._recovery_point = 0
        self._dir_fd = -1
        self._lock_fd = -1
        self._reported: set[tuple[str, int]] = set()
        self._verify_wanted: set[Segment] = set()
        self._failing = False
        self._closed = False
        self._tail: Segment | None = None
        # Descriptors of deleted segments, closed by the flusher thread (see defer_closes).
        self._retired: list[int] | None = None
        self._on_retired: Callable[[], None] | None = None
        # The next segment's file, allocated ahead off the core thread (see prepare_spare).
        self._spare = -1
        self._spare_path = ""
        self._spare_count = 0
        self._spares = False
        self._on_spare_taken: Callable[[], None] | None = None
        self.spare_ready = threading.Event()

    # =========================================================================================
    # Opening and recovery
    # =========================================================================================

    @classmethod
    def open(cls, directory: str, options: LogOptions | None = None,
             clock_ms: Callable[[], int] | None = None, *, readonly: bool = False) -> "CommitLog":
        """Open (creating it unless ``readonly``) the log in ``directory`` and recover it.

        Recovery: the last segment, and any segment not known to be fsynced, is scanned record
        by record; a torn or corrupt tail is truncated; a corrupt record with valid ones after it
        is reported (offset, file) and skipped by readers; a missing, short or corrupt index is
        rebuilt from its segment. The time it took is logged. Read-only opens change nothing.
        """
        self = cls(directory, options or LogOptions(), clock_ms or wall_clock_ms, readonly)
        try:
            self._open()
        except OSError as exc:
            self._close_files()
            where = f" ({exc.filename})" if exc.filename else ""
            raise LogError(f"cannot open the commit log in {directory}: "
                           f"{exc.strerror or exc}{where}") from None
        except BaseException:
            self._close_files()
            raise
        return self

    # recovery.py
    _open = recovery.open_log
    _remove_leftovers = recovery.remove_leftovers
    _remove_files = recovery.remove_files
    _open_segment = recovery.open_segment
    _check_index = recovery.check_index
    _valid_record_end = recovery.valid_record_end
    _index_walk = recovery.index_walk
    _rebuild_index = recovery.rebuild_index
    _extend_index = recovery.extend_index
    _save_rebuilt_index = recovery.save_rebuilt_index
    _start_appending = recovery.start_appending
    _open_for_append = recovery.open_for_append
    _log_recovery = recovery.log_recovery
    refresh = recovery.refresh

    # =========================================================================================
    # Damage bookkeeping
    # =========================================================================================

    def _remember_damage(self, d: Damage, log_it: bool) -> bool:
        key = (d.path, d.position)
        with self._lock:
            if key in self._reported:
                return False
            self._reported.add(key)
            self.counters.corrupt_regions += 1
            if len(self.damage) < MAX_DAMAGE_KEPT:
                self.damage.append(d)
        if log_it:
            log.warning("%s; readers skip it", d.describe())
        return True

    def _report(self, d: Damage) -> None:
        self._remember_damage(d, log_it=True)

    # =========================================================================================
    # Properties
    # =========================================================================================

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        stage = self._stage
        return stage.next_offset if stage is not None else self._next

    @property
    def pending_bytes(self) -> int:
        """Bytes appended and not yet handed to the OS (they pile up while the disk fails)."""
        stage = self._stage
        return (self._pending + stage.used + self._held_bytes if stage is not None
                else self._pending)

    @property
    def written_offset(self) -> int:
        """One past the last record handed to the OS (readable from here on)."""
        return self._written

    @property
    def durable_offset(self) -> int:
        """Every record below this offset is fsynced."""
        return self._durable

    @property
    def first_offset(self) -> int:
        """The oldest record's offset still in the log (``next_offset`` when it is empty)."""
        for seg in self._segments:
            if seg.count:
                return seg.entry(0)[0]
        return self.next_offset

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def uploaded_offset(self) -> int:
        return self._uploaded

    def needs_sync(self) -> bool:
        return self._needs_sync

    # =========================================================================================
    # Appending and writing (core thread)
    # =========================================================================================

    def append(self, timestamp_ms: int, qos: int, retain: bool, client_id: bytes, topic: bytes,
               payload: bytes) -> int:
        """Buffer one record; returns its offset. Nothing reaches the OS until ``write_pending``;
        a large ``payload`` is held by reference until then and must not change.

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
                                                     n)
                    except (TypeError, OverflowError):  # a client id or topic that is not
                        offset = -1  # bytes (the C build takes only bytes), a field out of range
                    if offset >= 0:
                        return offset
            elif type(payload) in _HELD_TYPES:
                # A large payload (a received one is a bytearray): its header, client id and
                # topic are staged, the payload itself is held and written from where it is.
                try:
                    offset = self._append_held(stage, timestamp_ms, qos, retain, client_id,
                                               len(client_id), topic, len(topic), payload, n)
                except (TypeError, OverflowError):
                    offset = -1
                if offset >= 0:
                    self._held.append(payload)
                    self._held_bytes += n
                    return offset
        return self._append(timestamp_ms, qos, retain, client_id, topic, payload)

    def _append(self, timestamp_ms: int, qos: int, retain: bool, client_id: bytes, topic: bytes,
                payload: bytes) -> int:
        """``append`` for what the staging area does not take; opens it again afterwards."""
        if self.readonly or self._closed:
            raise LogError(f"{self.directory}: the log is {'read-only' if self.readonly else 'closed'}")
        self._unstage()
        lc, lt, lp = len(client_id), len(topic), len(payload)
        if lc > MAX_CLIENT_ID or lt > MAX_TOPIC or lp > MAX_PAYLOAD or not 0 <= qos <= 2 \
                or timestamp_ms < 0:
            raise ValueError(f"record out of range: qos {qos}, timestamp {timestamp_ms}, "
                             f"client id {lc} bytes, topic {lt} bytes, payload {lp} bytes")
        length = RECORD_HEADER_SIZE + lc + lt + lp
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
                             client_id, topic, payload)
        data += client_id
        data += topic
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

    def _group(self, seg: Segment, timestamp_ms: int) -> _Group:
        """The group that ``seg``'s next record joins (the last one, or a new one)."""
        groups = self._groups
        if groups and groups[-1].segment is seg:
            return groups[-1]
        return self._new_group(seg, timestamp_ms)

    def _open_stage(self, seg: Segment) -> None:
        """Let ``append`` stage the records that follow in ``seg`` (nothing is staged now)."""
        stage = self._staging.state
        if self._stage_seg is not seg:
            opts = self.options
            stage.base_offset = seg.base_offset
            stage.segment_bytes = opts.segment_bytes
            stage.first_ts = seg.reserved_first_ts
            stage.segment_ms = opts.segment_ms
            stage.big_payload = BIG_PAYLOAD
            self._stage_seg = seg
        stage.next_offset = self._next
        stage.position = seg.reserved_size
        stage.max_ts = seg.reserved_max_ts
        self._stage = stage

    def _close_stage(self) -> None:
        """Records take the long way until ``_append`` opens the staging area again."""
        self._unstage()
        self._stage = None
        self._stage_seg = None

    def _unstage(self) -> None:
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

    def _staged_parts(self, stage) -> list:
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

    def _take_staged(self, stage, seg: Segment) -> int:
        """The staged records now count as appended to ``seg`` (the write queue or the file
        has them): empty the staging area. The bytes of the held payloads it let go."""
        seg.reserved_max_ts = stage.max_ts
        seg.reserved_size = stage.position
        seg.reserved_count += stage.count
        self._next = stage.next_offset
        stage.used = 0
        stage.count = 0
        nbytes = self._held_bytes
        if nbytes:
            self._held.clear()
            self._held_bytes = 0
            stage.held_count = 0
        return nbytes

    def _new_group(self, seg: Segment, timestamp_ms: int) -> _Group:
        """Start the group of records bound for ``seg``; its first record is ``timestamp_ms``'s."""
        g = _Group(seg)
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

    # -- the next segment's file, allocated ahead (spare.py) ---------------------------------------
    make_spares = spare.make_spares
    prepare_spare = spare.prepare_spare
    _spare_failed = spare.spare_failed
    _take_spare = spare.take_spare
    _drop_spare = spare.drop_spare

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
                    seg.create_files(self._take_spare() if seg.fd < 0 else None)
                if seg.count + g.count > seg.index_capacity:
                    seg.ensure_index_room(seg.count + g.count)
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

    def _write_stage(self, stage) -> bool:
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

    def _written_to(self, seg: Segment, index, count: int, nbytes: int, next_offset: int,
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

    def _write_at(self, seg: Segment, parts: list, nbytes: int, position: int) -> None:
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

    def _seal(self, seg: Segment) -> None:
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
            trim = seg.index_file_bytes
        with self._lock:
            seg.sealed = True
            if seg.created:
                seg.index_dirty = True
                seg.index_trim = trim  # with index_dirty: one sync job takes both
                self._unsynced[seg.base_offset] = seg
                self._needs_sync = True
        self.counters.segments_rolled += 1
        self._apply_retention(self._clock())

    # =========================================================================================
    # Syncing (flusher thread)
    # =========================================================================================

    # sync.py: fsync, the recovery point, freeing the room allocated ahead
    sync = syncing.sync
    _sync = syncing.run_sync
    _requeue = syncing.requeue
    _set_recovery_point = syncing.set_recovery_point
    _free_room = staticmethod(syncing.free_room)
    _close_quietly = staticmethod(syncing.close_quietly)

    # =========================================================================================
    # The segments: find, roll, retention, deletion, descriptors (file_set.py; core thread
    # but for mark_uploaded, the uploader's, and close_retired, the flusher's)
    # =========================================================================================

    _segment_index = file_set.segment_index
    _find = file_set.find
    _new_segment = file_set.new_segment
    _roll = file_set.roll
    housekeeping = file_set.housekeeping
    _apply_retention = file_set.apply_retention
    _delete_segment = file_set.delete_segment
    defer_closes = file_set.defer_closes
    close_retired = file_set.close_retired
    mark_uploaded = file_set.mark_uploaded
    descriptors_at_retention = file_set.descriptors_at_retention
    descriptors_held = file_set.descriptors_held
    segments = file_set.segments

    # =========================================================================================
    # Reading
    # =========================================================================================

    # reader.py: read, read_range, read_since, scan, locate (any thread)
    read = reader.read
    _read_entry = reader.read_entry
    _repair_index = reader.repair_index
    read_range = reader.read_range
    read_since = reader.read_since
    scan = reader.scan
    _iterate = reader.iterate
    _walk_records = reader.walk_records
    locate = reader.locate

    # =========================================================================================
    # Inspection
    # =========================================================================================

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Read every segment file whole and check every record's CRC, each header and each
        index against the records. Changes nothing. ``progress(bytes_done, bytes_total)`` is
        called as it goes. Works on a log the broker is writing (up to what exists at the start)."""
        return verifying.verify_segments(self._segments, progress)

    verify_step = verifying.verify_step

    # =========================================================================================
    # Closing
    # =========================================================================================

    def close(self, sync: bool = True) -> None:
        """Write what is pending (best effort), fsync (unless ``sync`` is False), trim the index,
        release the directory."""
        if self._closed:
            return
        disk_answers = True
        if not self.readonly:
            try:
                self._close_stage()
                if self._groups:
                    self.write_pending()
                if sync:
                    self.sync(wait=CLOSE_SYNC_WAIT)
            except SyncStillRunning as exc:
                # The disk does not answer: trimming and syncing the indexes would hang too
                # (an untrimmed index is no damage at the next start), and no recovery point
                # may claim what that sync has not finished.
                log.error("closing the commit log: %s", exc)
                disk_answers = False
            except LogError as exc:
                log.error("closing the commit log: %s", exc)
            tail = self._tail
            for seg in self._segments if disk_answers else ():
                if seg.preallocated and seg.fd >= 0:
                    seg.preallocated = False
                    self._free_room(seg.fd, seg.size, seg.path)
                writing = seg is tail and seg.created and not seg.sealed
                if seg.index_fd < 0 or not (writing or seg.index_trim >= 0):
                    continue    # only the tail and sealed ones no sync trimmed
                try:
                    seg.trim_index()
                    if sync:
                        os.fsync(seg.index_fd)
                except OSError as exc:
                    log.warning("%s: %s", seg.index_path, exc.strerror)
            if (disk_answers and tail is not None and not self._groups
                    and self._durable >= self._written):
                self._set_recovery_point(tail.base_offset)
        with self._rp_lock:  # a sync finishing late writes no recovery point from now on
            self._closed = True
        self._drop_spare(unlink=disk_answers)
        self.close_retired(stop=True)
        self._close_files()

    def _close_files(self) -> None:
        for seg in self._segments:
            seg.close()
        self._close_quietly(self._dir_fd, self._lock_fd)
        self._dir_fd = self._lock_fd = -1

    def __enter__(self) -> "CommitLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["CommitLog", "LogCounters", "RecoveryReport", "VerifyReport", "wall_clock_ms"]
