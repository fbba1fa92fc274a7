"""Walking the records of a segment file in chunks, with the native helper doing the byte work.

A segment is read with ``pread`` into a reused buffer (never mmapped: a file that another
process truncates under a mapping kills the reader with SIGBUS). ``walk`` validates every record
(structure and CRC32C), hands out what the step function produced, and when it meets bytes that
are not a valid record it looks for the next valid record after them and reports the region in
between: ``corrupt`` when a valid record follows, ``torn`` when nothing valid follows.

Where to go on after damage (docs/log-format.md, "Damage"): first right after the damaged record,
by its own length field, when a valid record with the next offset starts there (a flipped bit in
a payload or a CRC); otherwise byte by byte (``resync``), taking only a record whose offset the
bytes skipped can explain, so that bytes shaped like a record inside a payload are not taken for
one with an offset far ahead. A tail in which no such record is found but that still holds valid
records (of lower offsets) is reported ``corrupt``, not ``torn``: it is not truncated.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Callable, Iterator

from edgebroker import _native
from edgebroker._native import (
    RESYNC_FOUND, RESYNC_NONE, SCAN_BAD, SCAN_END, SCAN_ENTRY_WORDS, SCAN_FULL, SCAN_PARTIAL,
    ScanResult,
)
from edgebroker.commitlog.format import (
    ATTR_PROPERTIES, FORMAT_VERSION, PROPERTIES_LENGTH_SIZE, RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE, Damage, Record,
)

_u32_from = struct.Struct("<I").unpack_from
_u64_from = struct.Struct("<Q").unpack_from
CHUNK = 1024 * 1024
SCAN_BATCH = 4096  # entries per scan call

DATA = "data"
BAD = "bad"

# step(view, avail, base_position, min_offset, max_timestamp) -> ScanResult
Step = Callable[[memoryview, int, int, int, int], ScanResult]


def _pread_into(fd: int, buf: bytearray, want: int, pos: int) -> int:
    view = memoryview(buf)
    got = 0
    while got < want:
        n = os.preadv(fd, [view[got:want]], pos + got)
        if n == 0:
            break
        got += n
    return got


def find_next_valid(fd: int, start: int, end: int, min_offset: int, chunk: int = CHUNK,
                    version: int = FORMAT_VERSION, origin: int | None = None) -> int | None:
    """The position of the first valid record in [start, end) with offset >= min_offset, by
    the rules of segment format ``version``. With ``origin`` (where the damage starts), only a
    record whose offset the bytes skipped can explain: at most ``min_offset`` + (bytes from
    ``origin`` to it) // 34 + 1, 34 bytes being the smallest record."""
    buf = bytearray(chunk)
    pos = start
    while pos < end:
        want = min(chunk, end - pos)
        n = _pread_into(fd, buf, want, pos)
        if n < RECORD_HEADER_SIZE:
            return None
        view = memoryview(buf)[:n]
        rel = 0
        while True:
            res = _native.resync(view, end - pos, rel, min_offset, version)
            if res.status == RESYNC_NONE:
                break
            at = pos + res.position
            rel = res.position + 1
            if origin is not None and (_u64_from(view, res.position + 8)[0] - min_offset
                                       > (at - origin) // RECORD_HEADER_SIZE + 1):
                continue   # more records skipped than the bytes could hold: not a record
            if res.status == RESYNC_FOUND:
                return at
            # A plausible header whose record continues past this chunk: read it whole.
            whole = bytearray(res.need)
            if _pread_into(fd, whole, res.need, at) == res.need:
                check = _native.resync(whole, res.need, 0, min_offset, version)
                if check.status == RESYNC_FOUND and check.position == 0:
                    return at
        if pos + n >= end:
            return None
        # Overlap so a header that straddles the chunk boundary is seen whole.
        pos += n - (RECORD_HEADER_SIZE - 1)
    return None


def record_at(fd: int, position: int, end: int, offset: int, version: int) -> int | None:
    """The end of the record at ``position`` if a valid one with exactly ``offset`` starts
    there and ends by ``end``, else None."""
    head = os.pread(fd, RECORD_HEADER_SIZE, position)
    if len(head) < RECORD_HEADER_SIZE:
        return None
    length = _u32_from(head, 4)[0]
    if length < RECORD_HEADER_SIZE or position + length > end:
        return None
    data = os.pread(fd, length, position)
    out = array("Q", bytes(8 * SCAN_ENTRY_WORDS))
    res = _native.scan(data, len(data), position, offset, None, out, 0, version)
    if res.matched != 1 or out[0] != offset or res.stop != length:
        return None
    return position + length


def starts_record(fd: int, position: int, end: int, offset: int) -> bool:
    """Whether a record header with ``offset``, and a length that ends by ``end``, starts at
    ``position``: a cheap check of an index entry (the record's CRC is checked by the walk
    that reads it)."""
    head = os.pread(fd, RECORD_HEADER_SIZE, position)
    if len(head) < RECORD_HEADER_SIZE:
        return False
    length = _u32_from(head, 4)[0]
    return _u64_from(head, 8)[0] == offset and RECORD_HEADER_SIZE <= length <= end - position


def after_damaged_record(fd: int, pos: int, end: int, min_offset: int, version: int) -> int | None:
    """Where the record after the damaged one at ``pos`` starts, by the damaged record's own
    length field, when a valid record with the next offset (``min_offset`` + 1) is there."""
    head = os.pread(fd, RECORD_HEADER_SIZE, pos)
    if len(head) < RECORD_HEADER_SIZE:
        return None
    nxt = pos + _u32_from(head, 4)[0]
    if nxt - pos < RECORD_HEADER_SIZE or nxt + RECORD_HEADER_SIZE > end:
        return None
    return nxt if record_at(fd, nxt, end, min_offset + 1, version) is not None else None


def walk(fd: int, start: int, end: int, min_offset: int, max_timestamp: int, step: Step,
         path: str = "", chunk: int = CHUNK, version: int = FORMAT_VERSION) -> Iterator[tuple]:
    """Walk the records in [start, end) of ``fd``, a segment of format ``version`` (``step``
    validates by the same version's rules).

    Yields ``(DATA, view, result, base_position)`` after each step call that passed over records
    (``view`` is reused: use it before resuming) and ``(BAD, Damage)`` for each invalid region.
    """
    buf = bytearray(min(chunk, max(end - start, 0)) or 1)
    pos = start
    need = 0
    first_min = min_offset
    while pos < end:
        want = max(min(chunk, end - pos), need)
        if want > len(buf):
            buf = bytearray(want)
        n = _pread_into(fd, buf, want, pos)
        if n < want:
            end = pos + n  # the file is shorter than we were told: it ends here
            if n == 0:
                break
        view = memoryview(buf)[:n]
        res = step(view, end - pos, pos, min_offset, max_timestamp)
        if res.count or res.matched:
            yield DATA, view, res, pos
        min_offset, max_timestamp = res.next_offset, res.max_timestamp
        pos += res.stop
        need = 0
        if res.status == SCAN_END:
            break
        if res.status == SCAN_PARTIAL:
            need = res.need
            continue
        if res.status == SCAN_FULL:
            continue
        assert res.status == SCAN_BAD
        nxt = after_damaged_record(fd, pos, end, min_offset, version)
        if nxt is None:
            nxt = find_next_valid(fd, pos + 1, end, min_offset, chunk, version, origin=pos)
        if nxt is None:
            # Valid records of lower offsets after bytes taken for a record: not a torn tail.
            held = find_next_valid(fd, pos, end, first_min, chunk, version) is not None
            yield BAD, Damage(path, pos, end - pos, min_offset, "corrupt" if held else "torn")
            break
        yield BAD, Damage(path, pos, nxt - pos, min_offset, "corrupt",
                          _u64_from(os.pread(fd, 16, nxt), 8)[0])
        pos = nxt


def first_position(fd: int, end: int, base_offset: int, start: int, path: str = "",
                   version: int = FORMAT_VERSION) -> int | None:
    """Where the first valid record with an offset >= ``start`` begins in a segment of
    ``end`` bytes (None when there is none), found by walking it from its first record: for a
    reader whose index entry does not lead to its record. Damage met is not reported here
    (the reader that reads the records reports it)."""
    out = new_scan_buffer()
    step = scan_step(None, out, version)
    for event in walk(fd, SEGMENT_HEADER_SIZE, end, base_offset, 0, step, path,
                      version=version):
        if event[0] == DATA:
            res = event[2]
            for k in range(0, res.matched * SCAN_ENTRY_WORDS, SCAN_ENTRY_WORDS):
                if out[k] >= start:
                    return out[k + 2]
    return None


def scan_step(topic_filter: bytes | None, out: array, version: int = FORMAT_VERSION) -> Step:
    def step(view, avail, base_position, min_offset, max_timestamp):
        return _native.scan(view, avail, base_position, min_offset, topic_filter, out,
                            max_timestamp, version)
    return step


def new_scan_buffer(entries: int = SCAN_BATCH) -> array:
    return array("Q", bytes(8 * SCAN_ENTRY_WORDS * entries))


def records_from(view: memoryview, out: array, matched: int, base_position: int) -> Iterator[Record]:
    """Records for the ``matched`` scan entries in ``out`` over ``view``."""
    hdr = RECORD_HEADER_SIZE
    for i in range(0, matched * SCAN_ENTRY_WORDS, SCAN_ENTRY_WORDS):
        offset, ts, position, length, meta = out[i:i + SCAN_ENTRY_WORDS]
        start = position - base_position
        p = start + hdr
        r = 0
        if meta & ATTR_PROPERTIES:  # R, then the client id
            r = _u32_from(view, p)[0]
            p += PROPERTIES_LENGTH_SIZE
        cid_end = p + (meta >> 8 & 0xFFFF)
        topic_end = cid_end + (meta >> 24)
        yield Record(offset, ts, meta & 3, bool(meta & 4), bytes(view[p:cid_end]),
                     bytes(view[cid_end:topic_end]), bytes(view[topic_end + r:start + length]),
                     bytes(view[topic_end:topic_end + r]))


__all__ = ["walk", "find_next_valid", "first_position", "starts_record", "record_at",
           "after_damaged_record", "scan_step",
           "new_scan_buffer", "records_from", "DATA", "BAD",
           "SCAN_BAD"]
