"""Checking a log whole: every segment file read, every record's CRC, each header and each index
compared with the records (``edgebroker inspect verify``); and the flusher's check of one segment
a reader wanted checked (``verify_step``). Changes nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from edgebroker import _native
from edgebroker.commitlog import scanner
from edgebroker.commitlog.errors import LogError
from edgebroker.commitlog.format import (
    FORMAT_VERSION, INDEX_ENTRY_SIZE, SEGMENT_HEADER_SIZE, check_segment_header,
)
from edgebroker.commitlog.segment import Segment
from edgebroker.records import field, record


@record(slots=True)
class VerifyReport:
    """What ``CommitLog.verify`` found."""

    segments: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    damage: list = field(default_factory=list)          # Damage: records that cannot be read
    notes: list = field(default_factory=list)           # Damage: incomplete tail of the last segment
    index_problems: list = field(default_factory=list)  # (path, problem): see compare_index
    header_problems: list = field(default_factory=list) # (path, problem): not the last segment
    header_notes: list = field(default_factory=list)    # (path, problem) of the last segment
    # (start, end, path before, path after): offsets between two segments that neither holds
    missing: list = field(default_factory=list)
    # (path, first offset, last offset): segments before the last with no readable record
    # (RecoveryReport.unreadable)
    unreadable: list = field(default_factory=list)
    # (path, first offset, last offset, path after): offsets a segment holds that a later one
    # (in name order) holds too, once for each later one; the broker reads them from the
    # later segment
    overlaps: list = field(default_factory=list)
    # The recovery point or the uploaded mark past the end of the records, read at open
    # (RecoveryReport.past_end): (file, its value, the end, where the records end, what it
    # says of the records: "fsynced" or "uploaded")
    past_end: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No damage. A damaged header or a torn tail in the last segment is what a crash
        leaves (the broker repairs both at its next start): notes, not damage."""
        return not (self.damage or self.missing or self.header_problems or self.unreadable
                    or self.overlaps or self.past_end)


def verify_log(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """``CommitLog.verify``: its segments (those there when it is called), with what the open
    found (segments with no readable record, offset files past the end)."""
    report = verify_segments(self._segments, progress)
    report.unreadable = list(self.recovery.unreadable)
    report.past_end = list(self.recovery.past_end)
    return report


def verify_segments(segments: list[Segment],
                    progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """The records, headers and indexes of ``segments``, and how their offsets follow."""
    started = time.perf_counter()
    report = VerifyReport()
    segs = list(segments)
    sizes = [os.fstat(s.fd).st_size for s in segs]
    total = sum(sizes)
    done = 0
    prev = None   # (path, the offset after its last valid record)
    spans = []    # (path, base offset, the offset after its last valid record)
    for k, (seg, size) in enumerate(zip(segs, sizes)):
        is_last = k == len(segs) - 1
        if prev is not None and prev[1] < seg.base_offset:
            report.missing.append((prev[1], seg.base_offset, prev[0], seg.path))
        report.segments += 1
        fd = os.dup(seg.fd)
        try:
            headers = report.header_notes if is_last else report.header_problems
            if size < SEGMENT_HEADER_SIZE:
                if size:
                    headers.append((seg.path, f"{size} bytes, no complete header"))
                spans.append((seg.path, seg.base_offset, seg.base_offset))
                done += size
                continue
            version = FORMAT_VERSION
            try:
                problem, version = check_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0),
                                                        seg.path, seg.base_offset)
            except LogError as exc:
                problem = str(exc)
            if problem:
                headers.append((seg.path, problem))
            out = bytearray(INDEX_ENTRY_SIZE * scanner.SCAN_BATCH)
            entries = bytearray()
            base = seg.base_offset
            seg_done = done

            def step(view, avail, base_position, mo, mts):
                res = _native.build_index(view, avail, base_position, base, mo, mts, out,
                                          version=version)
                if progress is not None:
                    progress(seg_done + base_position + res.stop, total)
                return res

            for event in scanner.walk(fd, SEGMENT_HEADER_SIZE, size, base, 0, step, seg.path,
                                      version=version):
                if event[0] == scanner.DATA:
                    entries += out[:event[2].count * INDEX_ENTRY_SIZE]
                elif event[1].kind == "torn" and is_last:
                    report.notes.append(event[1])
                else:
                    report.damage.append(event[1])
            report.records += len(entries) // INDEX_ENTRY_SIZE
            after_last = seg.base_offset
            if entries:  # the last entry's offset (relative to the base), plus one
                after_last += int.from_bytes(entries[-INDEX_ENTRY_SIZE:][:4], "little") + 1
            prev = (seg.path, after_last)
            spans.append((seg.path, seg.base_offset, after_last))
            report.bytes += size
            problem = compare_index(seg, entries, is_last)
            if problem:
                report.index_problems.append((seg.index_path, problem))
        finally:
            os.close(fd)
        done += size
        if progress is not None:
            progress(done, total)
    report.overlaps = overlaps(spans)
    report.seconds = time.perf_counter() - started
    return report


def overlaps(spans: list[tuple[str, int, int]]) -> list[tuple[str, int, int, str]]:
    """Each pair of segments that hold the same offsets: (the earlier, the first and the last
    offset both hold, the later). ``spans``: (path, base offset, the offset after its last
    record) in name order. A later segment with no record yet (the last one, to be appended
    to) shares the offsets from its base to the earlier one's end: the next records take them.
    One that overlaps several later segments is named with each, and the offsets each holds."""
    found = []
    ahead: list[tuple[str, int]] = []   # earlier segments holding offsets at or past a base
    for path, base, after in spans:
        ahead = [(p, end) for p, end in ahead if end > base]
        for p, end in ahead:
            found.append((p, base, (min(end, after) if after > base else end) - 1, path))
        ahead.append((path, after))
    return found


def compare_index(seg: Segment, entries: bytearray, is_last: bool) -> str | None:
    """None when the index file holds ``entries`` (the tail's may hold fewer); else what is wrong."""
    try:
        with open(seg.index_path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return "missing" if entries else None
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    n = len(data) // INDEX_ENTRY_SIZE
    while n and data[(n - 1) * INDEX_ENTRY_SIZE:n * INDEX_ENTRY_SIZE] == bytes(INDEX_ENTRY_SIZE):
        n -= 1  # room preallocated by the writer
    have = data[:n * INDEX_ENTRY_SIZE]
    if have == entries or (is_last and entries.startswith(have)):
        return None
    for i in range(min(len(have), len(entries)) // INDEX_ENTRY_SIZE):
        a = have[i * INDEX_ENTRY_SIZE:(i + 1) * INDEX_ENTRY_SIZE]
        if a != entries[i * INDEX_ENTRY_SIZE:(i + 1) * INDEX_ENTRY_SIZE]:
            return (f"entry {i} does not match the records (the records are read right: a "
                    f"read that starts at the entry checks it and has the index rebuilt)")
    return (f"{len(have) // INDEX_ENTRY_SIZE} entries for "
            f"{len(entries) // INDEX_ENTRY_SIZE} records (rebuilt at the next start)")


def verify_step(self) -> bool:
    """Check every record of one segment that a reader wanted checked (flusher, when idle).
    Returns False when there was nothing to do."""
    with self._lock:
        seg = next((s for s in self._verify_wanted if not s.deleted and not s.verified), None)
        self._verify_wanted = {s for s in self._verify_wanted if not s.deleted and not s.verified}
        if seg is None or seg.fd < 0:
            return False
        fd = os.dup(seg.fd)
        end = seg.size
    try:
        entries = bytearray()
        _added, damage = self._index_walk(seg, fd, SEGMENT_HEADER_SIZE, end, seg.base_offset,
                                          0, entries)
    finally:
        os.close(fd)
    for d in damage:
        self._report(d)
    with self._lock:
        self._verify_wanted.discard(seg)
        if not damage:
            seg.verified = True
    return True
