"""Opening a log: the directory lock, the offset files, the scan of the segments (record by
record above the recovery point, a cheap index check below it), index rebuilds, truncating a
torn tail, and making the last segment the one appended to; the ``RecoveryReport`` of what was
found and done. Read-only opens (and ``refresh``) change no file.

The functions taking the ``CommitLog`` as ``self`` are its methods (bound in log.py), run in
``CommitLog.open`` before any other thread uses the log, but ``refresh`` and index repairs.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import time
from array import array

from edgebroker import _native
from edgebroker.commitlog import scanner
from edgebroker.commitlog.errors import LogError, LogLockedError, LogWriteError
from edgebroker.commitlog.format import (
    FORMAT_VERSION, INDEX_ENTRY_SIZE, INDEX_SUFFIX, RECORD_HEADER, RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE, Damage, check_segment_header, check_short_segment, parse_offset_name,
    parse_segment_name, segment_header,
)
from edgebroker.commitlog.segment import Segment
from edgebroker.commitlog import sync as syncing
from edgebroker.commitlog.sync import RECOVERY_POINT_FILE
from edgebroker.files import open_regular
from edgebroker.records import field, record

log = logging.getLogger("edgebroker.commitlog")
LOCK_FILE = ".lock"
UPLOADED_FILE = "uploaded"
# A sealed segment file with more blocks than this past its size still has the room allocated
# ahead for its writes (a crash came before the flusher freed it).
ROOM_SLACK = 64 * 1024
_unpack_record_header = RECORD_HEADER.unpack_from


@record(slots=True)
class RecoveryReport:
    """What ``open`` found and did."""

    seconds: float = 0.0
    segments: int = 0
    full_scans: int = 0
    damage: list = field(default_factory=list)          # Damage, corrupt and torn regions
    index_rebuilt: list = field(default_factory=list)   # (path, reason)
    header_damage: list = field(default_factory=list)   # (path, problem)
    removed: list = field(default_factory=list)         # (path, reason)
    # Read-only: segments with no readable record that are not the last, left out of the
    # segment list (the broker removes them at start): (path, first offset, last offset).
    unreadable: list = field(default_factory=list)
    missing: list = field(default_factory=list)         # (start, end, path before, path after)
    # An offset file past the end of the records: (its path, its value, the end, where the
    # records end, "fsynced" or "uploaded") (sync.check_offset_files)
    past_end: list = field(default_factory=list)


def open_log(self) -> None:
    """The body of ``CommitLog.open``: recover the log in ``self.directory``."""
    started = time.perf_counter()
    d = self.directory
    if self.readonly:
        if not os.path.isdir(d):
            raise LogError(f"no commit log at {d}")
    else:
        try:
            os.makedirs(d, mode=0o750, exist_ok=True)
            self._lock_fd = os.open(os.path.join(d, LOCK_FILE),
                                    os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:      # (naming the lock file: '.lock' made a folder, say)
            what = exc.strerror + (f" ({exc.filename})" if exc.filename not in (None, d) else "")
            raise LogError(f"cannot open the commit log directory {d}: {what}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LogLockedError(f"{d} is in use by another edgebroker process") from None
    self._dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    for name, attr, key in ((UPLOADED_FILE, "_uploaded", "uploaded_offset"),
                            (RECOVERY_POINT_FILE, "_recovery_point", "recovery_point")):
        value, problem = syncing.read_offset_file(os.path.join(d, name), key)
        if problem:
            log.warning("%s", problem)
        setattr(self, attr, value)

    names = os.listdir(d)
    bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
    if not self.readonly:
        self._remove_leftovers(names, set(bases))
    report = self.recovery
    opened = []
    for i, base in enumerate(bases):
        seg = Segment(d, base)
        is_last = i == len(bases) - 1
        below_recovery_point = not is_last and bases[i + 1] <= self._recovery_point
        try:
            self._open_segment(seg, is_last, full_scan=is_last or not below_recovery_point)
        except FileNotFoundError:
            if not self.readonly:
                raise
        opened.append(seg)
    if self.readonly:   # the writer's retention deleted the oldest since the listing: drop them
        listed = set(os.listdir(d))
        opened = [s for s in opened if os.path.basename(s.path) in listed or s.close()]
    torn = self._torn_segments(opened)
    for i, seg in enumerate(opened):
        if seg in torn:
            if not self.readonly:
                self._remove_files(seg, "torn tail", quiet=True)
            seg.close()
        elif seg.count == 0 and i < len(opened) - 1 and opened[i + 1] not in torn:
            nxt = opened[i + 1].base_offset
            if not self.readonly:
                self._remove_files(seg, "no records", f" (offsets {seg.base_offset} to "
                                                      f"{nxt - 1}: none readable)")
            else:
                report.unreadable.append((seg.path, seg.base_offset, nxt - 1))
            seg.close()
        else:
            self._segments.append(seg)
    self._bases = [s.base_offset for s in self._segments]
    for prev, nxt in zip(self._segments, self._segments[1:]):
        if prev.next_offset > nxt.base_offset:
            log.warning("%s holds offsets up to %d, beyond the next segment's base %d; "
                        "reads of those offsets use the later segment",
                        prev.path, prev.next_offset - 1, nxt.base_offset)
        elif prev.next_offset < nxt.base_offset:
            hole = (prev.next_offset, nxt.base_offset)
            self._holes.append(hole)
            report.missing.append(hole + (prev.path, nxt.path))
            log.warning("commit log %s: offsets %d to %d are missing: no segment holds them "
                        "(%s ends before them, %s starts after them; a segment deleted or "
                        "lost?); readers pass over them, sessions count them as log_gap",
                        d, hole[0], hole[1] - 1, prev.path, nxt.path)

    end = self._segments[-1].next_offset if self._segments else 0
    self._next = self._written = self._durable = syncing.check_offset_files(self, end)
    if not self.readonly:
        self._start_appending()
    report.segments = len(self._segments)
    report.seconds = time.perf_counter() - started
    self._log_recovery()


def torn_segments(self, opened: list[Segment]) -> list[Segment]:
    """The segments of a torn tail (none when there is none): after the last segment that
    holds records, those that hold none, when no record past that segment's end was known to
    be durable (the recovery point and the uploaded mark are no further). A power cut leaves
    them: the log directory's fsyncs (for a new segment, the recovery point, the uploaded
    mark) make the names of the segments created since durable, while their data waits for
    its own fsync. An empty segment that starts right where the records end is kept (it
    becomes the one appended to), so nothing is missing; the rest are removed and the next
    records take their offsets. Logged once, with the offsets."""
    k = max((i for i, seg in enumerate(opened) if seg.count), default=0)
    end = opened[k].next_offset if opened else 0
    run = opened[k + 1:]
    if run and run[0].base_offset == end:
        run = run[1:]
    if not run or max(self._recovery_point, self._uploaded) > end:
        return []
    log.warning("commit log %s: the last %d segment files (%s to %s) hold no records: a "
                "power cut kept their names, not their data, and no record in them was known "
                "to be durable (a torn tail); %s: new records take offsets from %d",
                self.directory, len(run), os.path.basename(run[0].path),
                os.path.basename(run[-1].path),
                "the broker removes them at start" if self.readonly else "removed", end)
    return run


def remove_leftovers(self, names: list[str], bases: set[int]) -> None:
    for name in names:
        path = os.path.join(self.directory, name)
        stem, _, ext = name.partition(".")
        leftover = None
        if name.endswith(".tmp"):
            leftover = "unfinished temporary file"
        elif ("." + ext == INDEX_SUFFIX and (base := parse_offset_name(stem)) is not None
              and base not in bases):
            leftover = "index without its segment"
        if leftover:
            try:
                os.unlink(path)
                self.recovery.removed.append((path, leftover))
            except OSError as exc:
                log.warning("cannot remove %s (%s): %s", path, leftover, exc.strerror)


def remove_files(self, seg: Segment, reason: str, detail: str = "", quiet: bool = False) -> None:
    for path in (seg.path, seg.index_path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s (%s): %s", path, reason, exc.strerror)
            return
    self.recovery.removed.append((seg.path, reason))
    if not quiet:
        log.warning("removed %s: %s%s", seg.path, reason, detail)


def open_segment(self, seg: Segment, is_last: bool, full_scan: bool) -> None:
    try:
        _open_segment(self, seg, is_last, full_scan)
    finally:
        if self.readonly and seg.index_fd >= 0:
            # A reader writes no index: it reads its map (a descriptor of its own) or copy.
            os.close(seg.index_fd)
            seg.index_fd = -1


def _open_segment(self, seg: Segment, is_last: bool, full_scan: bool) -> None:
    flags = os.O_RDONLY if self.readonly else os.O_RDWR    # (a FIFO there: refused, named)
    seg.fd = open_regular(seg.path, flags)
    try:
        seg.index_fd = open_regular(seg.index_path, flags)
    except FileNotFoundError:
        seg.index_fd = -1
    seg.created = True
    seg.sealed = not is_last
    st = os.fstat(seg.fd)
    size = st.st_size
    if not is_last and not self.readonly and st.st_blocks * 512 > size + ROOM_SLACK:
        # Sealed before a crash that came before the flusher freed its room.
        self._free_room(seg.fd, size, seg.path)
    if size < SEGMENT_HEADER_SIZE:
        check_short_segment(os.pread(seg.fd, size, 0), seg.path)
        # Crashed while creating it: no records. The writer rewrites it at the first append.
        if size and not self.readonly and is_last:
            os.ftruncate(seg.fd, 0)
            self.counters.torn_bytes_truncated += size
        seg.size = 0
        seg.set_index(bytearray(), 0)
        seg.verified = True
        return
    problem, seg.version = check_segment_header(os.pread(seg.fd, SEGMENT_HEADER_SIZE, 0),
                                                seg.path, seg.base_offset)
    if problem:
        self.recovery.header_damage.append((seg.path, problem))
        log.warning("%s: segment header damaged (%s); its records are still read, each by "
                    "its own checksum (by the rules of format version %d)", seg.path, problem,
                    seg.version)
        if is_last and not self.readonly:
            os.pwrite(seg.fd, segment_header(seg.base_offset), 0)
    seg.size = size
    if is_last and self.readonly:
        # The writer may be appending: index what is complete now, quietly.
        self._rebuild_index(seg, None, report_tail=False)
    elif full_scan:
        self.recovery.full_scans += 1
        self._rebuild_index(seg, None, report_tail=True)
    else:
        self._check_index(seg)


def check_index(self, seg: Segment) -> None:
    """A sealed segment below the recovery point: check its index cheaply (structure, and the
    last entry against its record); rebuild or complete it when that fails."""
    if seg.index_fd < 0:
        return self._rebuild_index(seg, "missing", report_tail=True)
    nbytes = os.fstat(seg.index_fd).st_size
    if nbytes % INDEX_ENTRY_SIZE:
        return self._rebuild_index(seg, f"size {nbytes} is not a multiple of {INDEX_ENTRY_SIZE}",
                                   report_tail=True)
    n = nbytes // INDEX_ENTRY_SIZE
    if n == 0:
        if seg.size > SEGMENT_HEADER_SIZE:
            return self._rebuild_index(seg, "empty", report_tail=True)
        seg.set_index(b"", 0)
        seg.verified = True
        return None
    seg.index_file_bytes = nbytes
    mapped = mmap.mmap(seg.index_fd, n * INDEX_ENTRY_SIZE, access=mmap.ACCESS_READ)
    valid, nonzero = _native.index_check(mapped, n, seg.size)
    if valid != nonzero or nonzero == 0:
        mapped.close()
        return self._rebuild_index(seg, f"entry {valid} is inconsistent", report_tail=True)
    seg.set_index(mapped, valid)
    last_offset, last_pos, last_ts = seg.entry(valid - 1)
    record_end = self._valid_record_end(seg, last_pos, last_offset)
    if record_end is None:
        return self._rebuild_index(seg, f"its last entry (offset {last_offset}) does not "
                                        f"point at that record", report_tail=True)
    # Its timestamp, the records' running maximum, is what age retention goes by.
    record_ts = _unpack_record_header(os.pread(seg.fd, RECORD_HEADER_SIZE, last_pos))[3]
    if last_ts != max(seg.entry(valid - 2)[2] if valid > 1 else 0, record_ts):
        return self._rebuild_index(seg, f"its last entry's timestamp {last_ts} is not the "
                                        f"records' largest", report_tail=True)
    if nonzero < n or record_end < seg.size:
        # Entries missing at the end (or unused room never trimmed): index the rest.
        entries = bytearray(mapped[:valid * INDEX_ENTRY_SIZE])
        seg.set_index(entries, valid)
        added = self._extend_index(seg, record_end, report_tail=True)
        # Only room never trimmed (a stop between a roll and the flusher's trim): no damage,
        # rewritten quietly (a read-only reader keeps the entries in memory).
        self._save_rebuilt_index(seg, f"short by {added} entries" if added else None)
        return None
    seg.verified = False
    return None


def valid_record_end(self, seg: Segment, position: int, offset: int) -> int | None:
    """The end of the record at ``position`` if it is valid and has ``offset``, else None."""
    head = os.pread(seg.fd, RECORD_HEADER_SIZE, position)
    if len(head) < RECORD_HEADER_SIZE:
        return None
    length = _unpack_record_header(head)[1]
    if position + length > seg.size or length < RECORD_HEADER_SIZE:
        return None
    data = os.pread(seg.fd, length, position)
    out = array("Q", bytes(8 * _native.SCAN_ENTRY_WORDS))
    res = _native.scan(data, len(data), position, offset, None, out, 0, seg.version)
    if res.matched != 1 or out[0] != offset or res.stop != length:
        return None
    return position + length


def index_walk(self, seg: Segment, fd: int, start: int, end: int, min_offset: int,
                max_ts: int, entries: bytearray) -> tuple[int, list[Damage]]:
    """Scan [start, end) of ``fd`` appending index entries; -> (entries added, damage)."""
    out = bytearray(INDEX_ENTRY_SIZE * scanner.SCAN_BATCH)
    base = seg.base_offset
    version = seg.version

    def step(view, avail, base_position, mo, mts):
        return _native.build_index(view, avail, base_position, base, mo, mts, out,
                                   version=version)

    added = 0
    damage = []
    for event in scanner.walk(fd, start, end, min_offset, max_ts, step, seg.path,
                              version=version):
        if event[0] == scanner.DATA:
            res = event[2]
            entries += out[:res.count * INDEX_ENTRY_SIZE]
            added += res.count
        else:
            damage.append(event[1])
    return added, damage


def rebuild_index(self, seg: Segment, reason: str | None, report_tail: bool) -> None:
    """Index the whole segment by scanning it (every CRC checked)."""
    entries = bytearray()
    seg.set_index(entries, 0)
    seg.next_offset = seg.base_offset
    seg.max_timestamp = 0
    self._extend_index(seg, SEGMENT_HEADER_SIZE, report_tail)
    seg.verified = True
    self._save_rebuilt_index(seg, reason)


def extend_index(self, seg: Segment, start: int, report_tail: bool) -> int:
    """Scan from ``start`` to the end of the file; index valid records; handle damage."""
    entries = seg.index
    assert isinstance(entries, bytearray)
    end = os.fstat(seg.fd).st_size
    added, damage = self._index_walk(seg, seg.fd, start, end, seg.next_offset,
                                     seg.max_timestamp, entries)
    valid_end = end
    for d in damage:
        if d.kind == "torn":
            valid_end = d.position
            if not report_tail:
                continue
            if not self.readonly:
                os.ftruncate(seg.fd, d.position)
                self.counters.torn_bytes_truncated += d.length
                log.warning("%s: truncated an incomplete tail of %d bytes at position %d "
                            "(records from offset %d were never completely written)",
                            seg.path, d.length, d.position, d.offset)
            self.recovery.damage.append(d)
            self._remember_damage(d, log_it=self.readonly)
        else:
            self.recovery.damage.append(d)
            self._report(d)
    seg.size = valid_end
    seg.set_index(entries, len(entries) // INDEX_ENTRY_SIZE)
    return added


def save_rebuilt_index(self, seg: Segment, reason: str | None) -> None:
    if reason is not None:
        self.counters.index_rebuilds += 1
        self.recovery.index_rebuilt.append((seg.index_path, reason))
        log.warning("%s: index %s; rebuilt from the segment%s", seg.index_path, reason,
                    "" if not self.readonly else " (in memory; the file is left as it is)")
    if self.readonly:
        return
    try:
        seg.write_index_file(seg.index, seg.count, self._dir_fd)
    except OSError as exc:
        # A full disk: the entries stay in memory; the next start that has room writes it.
        log.warning("%s: cannot save the index (%s); its %d entries are kept in memory",
                    seg.index_path, exc.strerror or exc, seg.count)
        return
    if seg.sealed:
        seg.map_index_readonly()


def start_appending(self) -> None:
    """Make the last segment the one appended to, and make what recovery kept durable. A last
    segment of an older format version with records in it, or one the next offset is past (an
    uploaded mark past the end), stays as it is (sealed): new records go to a new segment."""
    if self._segments:
        tail = self._segments[-1]
        for seg in self._segments:
            if seg.verified:  # scanned at open: it may hold data that was never fsynced
                try:
                    os.fdatasync(seg.fd)
                except OSError as exc:
                    raise LogWriteError.from_os("cannot fsync", seg.path, exc) from None
        os.fsync(self._dir_fd)
        if self._next > tail.next_offset or tail.version != FORMAT_VERSION and tail.count:
            if self._next == tail.next_offset:
                log.info("commit log %s: %s is format version %d (an older edgebroker's): kept "
                         "as it is; new records start a version %d segment", self.directory,
                         tail.path, tail.version, FORMAT_VERSION)
            tail.sealed = True
            self._tail = self._new_segment(self._next)
            self._set_recovery_point(self._tail.base_offset)
            return
        if tail.version != FORMAT_VERSION:  # a header and no records: made current
            os.pwrite(tail.fd, segment_header(tail.base_offset), 0)
            tail.version = FORMAT_VERSION
        self._tail = tail
        tail.sealed = False
        try:
            self._open_for_append(tail)
        except LogWriteError as exc:
            # Started on a full disk: serve all the same. The first write fails as it would
            # in a running broker, and the journal then holds records and acknowledgements
            # until the retries find room (docs/persistence.md, "A full disk").
            log.warning("commit log %s: no room to append yet (%s); starting anyway: "
                        "records wait in memory until writes work", self.directory, exc)
        self._set_recovery_point(tail.base_offset)
    else:
        self._tail = self._new_segment(self._next)


def open_for_append(self, seg: Segment) -> None:
    seg.open_for_append(self.options.segment_bytes)


def log_recovery(self) -> None:
    r = self.recovery
    first, nxt = self.first_offset, self._next
    held = f"offsets {first}..{nxt - 1}" if nxt > first else f"empty (next offset {nxt})"
    log.info("commit log %s: %d segments, %s, opened%s in %.3f s "
             "(%d scanned record by record, %d damaged regions, %d indexes rebuilt)",
             self.directory, r.segments, held, " read-only" if self.readonly else "",
             r.seconds, r.full_scans, len(r.damage), len(r.index_rebuilt))


def refresh(self) -> None:
    """Read-only logs: pick up what the writer added (records, segments) and forget
    segments retention deleted. Writers: nothing to do."""
    if not self.readonly:
        return
    names = os.listdir(self.directory)
    bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
    present = set(bases)
    for seg in list(self._segments):
        if seg.base_offset not in present:
            i = self._segments.index(seg)
            del self._segments[i], self._bases[i]
            seg.deleted = True
            seg.close()
    known = set(self._bases)
    if self._segments:
        self._extend_index(self._segments[-1], self._segments[-1].size or SEGMENT_HEADER_SIZE,
                           report_tail=False)
    new = [b for b in bases if b not in known and (not self._bases or b > self._bases[-1])]
    for k, base in enumerate(new):
        seg = Segment(self.directory, base)
        try:
            self._open_segment(seg, k == len(new) - 1, full_scan=True)
        except FileNotFoundError:
            continue
        if self._segments:
            self._segments[-1].sealed = True
        self._segments.append(seg)
        self._bases.append(base)
    if self._segments:
        self._next = self._written = max(self._next, self._segments[-1].next_offset)
