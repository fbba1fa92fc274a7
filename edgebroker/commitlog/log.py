"""The commit log: one append-only log of every message, in segments, crash-safe.

``CommitLog`` is the facade: its state (the locks, the offsets, the segment list, the staging
area) and the public methods the rest of the broker calls. The work lives in one module per
concept, as functions that take the log as ``self`` and are bound onto ``CommitLog`` as its
methods (mostly under their own names; ``_open``, ``_append`` and ``_sync`` are ``open_log``,
``append_long`` and ``run_sync``; ``make_spares``, ``prepare_spare`` and ``verify`` are small
wrappers), so a call costs what a method call costs, and ``append``, the hot path of every
PUBLISH, is no wrapper:

    recovery.py  open: directory lock, offset files, segment scan, index check/rebuild; refresh
    file_set.py  the ordered segments: find, new, roll, housekeeping, retention, deletion,
                 descriptor accounting, the uploaded mark
    appender.py  append (staging), write_pending, seal
    sync.py      sync (fsync), the recovery point, freeing the room allocated ahead
    spare.py     SpareFiles: the next segment's file, made ahead (its own state, the log's lock)
    reader.py    read, read_range, read_since, scan, locate
    verify.py    verify, verify_step (one segment readers wanted checked): imported when one runs

Threads. The core thread appends, writes, reads, rolls and runs retention; it never fsyncs.
The flusher thread calls ``sync()`` (fsync, outside the lock) and ``verify_step()``; the
segment-ahead thread ``prepare_spare()``; the uploader thread ``mark_uploaded()``. One lock
guards what they share: the set of segments written but not yet synced, the written and durable
offsets, the segment list, the uploaded mark and the file made ahead. The flusher
syncs through duplicated file descriptors, so the core may seal or delete a segment meanwhile.

Who calls what, and the locks held:

    core thread      append, write_pending and write_before_stop (``_lock`` only in
                     _written_to and _seal, where written records and sealed segments
                     become visible), housekeeping and
                     _roll (``_lock`` in _new_segment and _delete_segment), taking the
                     spare (``_lock``, in SpareFiles.take), read*/scan/locate (``_lock`` in
                     locate to queue a check), descriptors_held (``_lock``), close
                     (``_rp_lock`` to set ``_closed`` and the spare files' ``closed``)
    flusher          sync: ``_sync_lock`` (one sync at a time; ``wait``), ``_lock`` for the
                     snapshot and again to requeue or to raise the durable offset, fsyncs with
                     no lock; _set_recovery_point: ``_rp_lock`` (it also guards ``_closed``);
                     verify_step (``_lock`` around the pick and the result, scan without);
                     close_retired (``_lock``)
    segment-ahead    prepare_spare (``_lock`` to check and to install; the allocation without)
    uploader         mark_uploaded: ``_upload_lock``, inside it ``_lock`` around the reads and
                     writes of ``_uploaded``; the file is written between the two;
                     upload_source and upload_backlog (``_lock``)
    damage           _remember_damage (``_lock``), from readers, recovery and verify_step

Nesting: ``_lock`` and ``_rp_lock`` are taken inside ``_sync_lock``, ``_lock`` inside
``_upload_lock``; no other lock is taken while one is held.

Read-only opens (``readonly=True``: ``edgebroker inspect``, ``edgebroker upload status``) take
no lock, change no file, and see what the writer has written so far; ``refresh()`` picks up more.
They cannot advance the uploaded mark: the uploader is a thread of the broker that writes the
log (edgebroker/uploader/), which reads sealed segments through ``upload_source`` and calls
``mark_uploaded``.

The format is documented byte by byte in docs/log-format.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from edgebroker import _native
from edgebroker.commitlog import appender, file_set, reader, recovery
from edgebroker.commitlog import sync as syncing
from edgebroker.commitlog.appender import STAGING_BYTES, Group
from edgebroker.commitlog.errors import LogError
from edgebroker.commitlog.format import Damage, LogOptions
from edgebroker.commitlog.recovery import RecoveryReport
from edgebroker.commitlog.segment import Segment
from edgebroker.commitlog.spare import SpareFiles
from edgebroker.commitlog.sync import SyncStillRunning
from edgebroker.records import record

log = logging.getLogger("edgebroker.commitlog")

# How long close() waits for an fsync another thread started (the flusher, stopped already,
# may still wait for the disk).
CLOSE_SYNC_WAIT = 10.0
MAX_DAMAGE_KEPT = 1000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@record(slots=True)
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
    forced_deleted_records: int = 0    # their records past the uploaded mark then
    unsaved_deleted_records: int = 0   # deleted at or past ``saved_offset`` (retention.py)
    uploaded_mark_unsaved: int = 0     # times the uploaded mark's file found no room (file_set)
    corrupt_regions: int = 0           # damaged regions found (each counted once)
    torn_bytes_truncated: int = 0
    index_rebuilds: int = 0


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
        # Offsets no segment held at open (start, end); of damaged records (start, end, file)
        self._holes: list[tuple[int, int]] = []
        self._damaged: list[tuple[int, int, str]] = []
        self._groups: list[Group] = []
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
        self.uploaded_unsaved = False   # the mark moved but its file could not be written
        # Age-based retention keeps the segments holding this offset and later ones: the
        # oldest record a session's cursor still needs (set by the core; the disk limit,
        # retention_bytes, still deletes them).
        self.hold_offset = 1 << 63
        # Retention deletes no segment holding records at or past this offset: the broker's
        # session snapshot on disk does not cover them yet (set by the core). ``retention_waits``
        # (set by retention): the disk limit wants such a segment; ``unsaved_may_go`` (set by
        # the core): it may take it all the same (counted in ``unsaved_deleted_records``).
        self.saved_offset = 1 << 63
        self.retention_waits = False
        self.unsaved_may_go = False
        # Set by the broker when it uploads (``[upload] batch_max_age``): housekeeping also seals
        # the segment being written once its first record is this old, so a batch cut by age
        # is a sealed segment's end.
        self.upload_age_ms: int | None = None
        self._tail_seen: tuple[Segment, int] | None = None   # file_set.tail_age
        self._recovery_point = 0
        self._dir_fd = -1
        self._lock_fd = -1
        self._reported: set[tuple[str, int]] = set()
        # Segments (base offsets) whose index a read had rebuilt by scanning (reader.py)
        self._index_repaired: set[int] = set()
        self._verify_wanted: set[Segment] = set()
        self._failing = False
        self._closed = False
        self._tail: Segment | None = None
        # Descriptors of deleted segments, closed by the flusher thread (see defer_closes).
        self._retired: list[int] | None = None
        self._on_retired: Callable[[], None] | None = None
        # The next segment's file, allocated ahead off the core thread (see prepare_spare).
        self._spare_files = SpareFiles(directory, options, self._lock, readonly)
        self.spare_ready = self._spare_files.ready

    # =========================================================================================
    # Opening and recovery
    # =========================================================================================

    @classmethod
    def open(cls, directory: str, options: LogOptions | None = None,
             clock_ms: Callable[[], int] | None = None, *, readonly: bool = False) -> "CommitLog":
        """Open (creating it unless ``readonly``) the log in ``directory`` and recover it.

        Recovery (recovery.py): the segments above the recovery point are scanned record by
        record; a torn tail is truncated; a corrupt record with valid ones after it is reported
        and skipped by readers; a bad index is rebuilt. Read-only opens change nothing.
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
    _torn_segments = recovery.torn_segments
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
                if d.next_offset is not None and d.next_offset > d.offset:
                    self._damaged.append((d.offset, d.next_offset, d.path))
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
        """The oldest record's offset still in the log. With no record written it is
        ``written_offset``: the first record appended and not yet written (held while the disk
        fails, or waiting for the pass's write), else the next one. Never ``next_offset``
        past such records: a reader behind would take them for deleted (issue 22)."""
        for seg in self._segments:
            if seg.count:
                return seg.entry(0)[0]
        return self._written

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

    # appender.py
    append = appender.append
    _append = appender.append_long
    _group = appender.group
    _open_stage = appender.open_stage
    _close_stage = appender.close_stage
    _unstage = appender.unstage
    _staged_parts = appender.staged_parts
    _take_staged = appender.take_staged
    _new_group = appender.new_group
    write_pending = appender.write_pending
    _write_stage = appender.write_stage
    _written_to = appender.written_to
    _write_at = appender.write_at
    _seal = appender.seal

    # -- the next segment's file, allocated ahead (spare.py) ---------------------------------------
    def make_spares(self, on_spare_taken: Callable[[], None] | None = None) -> None:
        """From now on new segments take the file ``prepare_spare`` made ahead, when there is
        one; ``on_spare_taken`` is called (on the core thread) when one was taken, to have
        the next made (see ``SpareFiles.make``)."""
        self._spare_files.make(on_spare_taken)

    def prepare_spare(self) -> bool | None:
        """Make the next segment's file ahead (the segment-ahead thread): ``SpareFiles.prepare``."""
        return self._spare_files.prepare()

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
    upload_source = file_set.upload_source
    upload_backlog = file_set.upload_backlog
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
    _start_position = reader.start_position
    read_range = reader.read_range
    read_since = reader.read_since
    scan = reader.scan
    _iterate = reader.iterate
    _walk_records = reader.walk_records
    locate = reader.locate
    _scanned_chunks = reader.scanned_chunks
    read_batch = reader.read_batch
    read_run = reader.read_run
    missing_between = reader.missing_between
    damaged_between = reader.damaged_between
    bytes_after = reader.bytes_after
    offset_at_time = reader.offset_at_time
    lag = reader.lag

    # =========================================================================================
    # Inspection
    # =========================================================================================

    verify = reader.verify
    verify_step = reader.verify_step

    # =========================================================================================
    # Closing
    # =========================================================================================

    def write_before_stop(self, wait: float,
                          sleep: Callable[[float], None] = time.sleep) -> LogError | None:
        """At a stop, while writes fail (a full disk): write what is pending. First the file
        made ahead for the next segment (see spare.py) gives its blocks back, the room the
        write needs most likely; then the write is tried every 0.1 s for up to ``wait``
        seconds (room may come back meanwhile). None once nothing is left pending, else the
        last write's error (core thread)."""
        deadline = time.monotonic() + wait
        freed = False
        while True:
            self._close_stage()
            if not self._groups:
                return None
            try:
                self.write_pending()
                return None
            except LogError as exc:
                if not freed and self._spare_files.fd >= 0:
                    freed = True
                    self._spare_files.drop()
                    log.warning("closing the commit log: %s; freed the next segment's file "
                                "made ahead and trying again", exc)
                    continue
                if time.monotonic() >= deadline:
                    return exc
            sleep(0.1)

    def close(self, sync: bool = True) -> None:
        """Write what is pending (best effort), fsync (unless ``sync`` is False), trim the index,
        release the directory."""
        if self._closed:
            return
        disk_answers = True
        if not self.readonly:
            try:
                failed = self.write_before_stop(0)
                if failed is not None:
                    log.error("closing the commit log: %d records (offsets %d..%d, %d bytes) "
                              "are lost, none of them acknowledged: %s",
                              self._next - self._written, self._written, self._next - 1,
                              self._pending, failed)
                if sync:
                    self.sync(wait=CLOSE_SYNC_WAIT)
            except SyncStillRunning as exc:
                # The disk does not answer: trimming and syncing the indexes would hang too
                # (an untrimmed index is no damage at the next start), and no recovery point
                # may claim what that sync has not finished.
                log.error("closing the commit log: %s", exc)
                disk_answers = False
            except (LogError, OSError) as exc:    # the stop goes on: trim, close the files
                log.error("closing the commit log: %s", exc)
            tail = self._tail
            for seg in self._segments if disk_answers else ():
                if seg.preallocated and seg.fd >= 0:
                    seg.preallocated = False
                    if self._free_room(seg.fd, seg.size, seg.path):
                        seg.allocated = 0
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
                self._set_recovery_point(self._written)   # (the next start checks the end)
        with self._rp_lock:  # a sync finishing late writes no recovery point from now on
            self._closed = True
            self._spare_files.closed = True
        self._spare_files.drop(unlink=disk_answers)
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


__all__ = ["CommitLog", "LogCounters", "RecoveryReport", "wall_clock_ms"]
