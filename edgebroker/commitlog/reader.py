"""Reading the log: one record, a range, from a time on, by topic filter, and where a payload
lies in its file (for ``sendfile``). Any thread; readers take the lock only to ask the flusher
to check a segment (``locate``).

The functions take the ``CommitLog`` as ``self`` and are its methods (bound in log.py): they
read its segment list and offsets, and report damage through it.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from array import array
from collections.abc import Iterator

from edgebroker import _native
from edgebroker.commitlog import scanner
from edgebroker.commitlog.format import (
    ATTR_PROPERTIES, INDEX_ENTRY_SIZE, PROPERTIES_LENGTH_SIZE, RECORD_HEADER, RECORD_HEADER_SIZE,
    RETAIN_BIT, SEGMENT_HEADER_SIZE, Damage, Location, Record,
)
from edgebroker.commitlog.segment import Segment

log = logging.getLogger("edgebroker.commitlog")
_unpack_record_header = RECORD_HEADER.unpack_from
_u32_from = struct.Struct("<I").unpack_from


def read(self, offset: int) -> Record | None:
    """The record at ``offset``; None when there is none (not written yet, deleted by
    retention, or damaged: damage is logged once and counted)."""
    found = self._find(offset)
    if found is None:
        return None
    return self._read_entry(*found)


def read_entry(self, seg: Segment, j: int, retry: bool = True) -> Record | None:
    offset, position, _ = seg.entry(j)
    end = seg.end_of(j)
    data = os.pread(seg.fd, end - position, position)
    out = array("Q", bytes(8 * _native.SCAN_ENTRY_WORDS))
    res = _native.scan(data, len(data), position, offset, None, out, 0, seg.version)
    if res.matched and out[0] == offset:
        return next(scanner.records_from(memoryview(data), out, 1, position))
    if retry and self._repair_index(seg, offset):
        found = self._find(offset)
        return self._read_entry(*found, retry=False) if found else None
    self._report(Damage(seg.path, position, end - position, offset, "corrupt", offset + 1))
    return None


def repair_index(self, seg: Segment, offset: int) -> bool:
    """An index entry did not lead to its record: rebuild that index by scanning. True when
    the index changed.

    The core thread does this while the uploader's thread may read the same segment's index
    (``upload_source``, under the log's lock): the new entries are made aside and put in
    place under the lock, so that thread never sees a closed map or a half-made index. A
    segment is scanned so at most once (``_index_repaired``): a damaged record whose entry is
    right does not have the whole segment scanned at each read of it."""
    if seg is self._tail and not self.readonly:
        return False
    if seg.base_offset in self._index_repaired:
        return False
    self._index_repaired.add(seg.base_offset)
    entries = bytearray()
    _added, damage = self._index_walk(seg, seg.fd, SEGMENT_HEADER_SIZE, seg.size,
                                      seg.base_offset, 0, entries)
    for d in damage:
        if d.kind != "torn":
            self._report(d)
    count = len(entries) // INDEX_ENTRY_SIZE
    if bytes(entries) == bytes(seg.index[:seg.count * INDEX_ENTRY_SIZE]):
        return False
    with self._lock:
        seg.set_index(entries, count)      # (closes the old map)
        seg.verified = not damage
    self.counters.index_rebuilds += 1
    log.warning("%s: an entry did not match its record (offset %d); index rebuilt",
                seg.index_path, offset)
    if not self.readonly:
        # Under the lock: the flusher takes the index file's descriptor (and its trim) there.
        # The file written is whole and fsynced: nothing is left for the flusher to do.
        with self._lock:
            try:
                seg.write_index_file(entries, count, self._dir_fd)
            except OSError as exc:
                log.warning("%s: cannot save the index (%s); its %d entries are kept in "
                            "memory", seg.index_path, exc.strerror or exc, count)
                return True
            seg.index_trim = -1
            seg.index_dirty = False
            if seg.sealed:
                seg.map_index_readonly()
    return True


def start_position(self, seg: Segment, start: int) -> int | None:
    """Where the first record of ``seg`` at or after offset ``start`` begins (None when the
    segment holds none), by its index, checked against that record's header first: a reader
    that started inside a record would skip it as damage. An entry that does not lead to a
    record with its offset (a damaged index file: the check at open looks at the index's
    structure and its last entry only) has the index rebuilt by scanning (``repair_index``:
    a sealed segment; logged and counted once), and the lookup is made again."""
    for retry in (True, False):
        j = seg.find_offset(start)
        if j >= seg.count:
            return None
        offset, position, _ = seg.entry(j)
        if not retry or scanner.starts_record(seg.fd, position, seg.end_of(j), offset):
            return position
        if not self._repair_index(seg, offset):
            return position   # (the walk from there reports what it finds)
    return None


def read_range(self, start: int, end: int | None = None) -> Iterator[Record]:
    """Records with ``start <= offset < end`` (to the end of what is written when ``end`` is
    None), oldest first, damaged records skipped. Records written while iterating are
    included as long as the iteration has not passed them."""
    return self._iterate(start, end, None)


def read_since(self, timestamp_ms: int) -> Iterator[Record]:
    """Records from the first one whose timestamp is >= ``timestamp_ms`` on (later records
    follow in log order, whatever their timestamps)."""
    for seg in list(self._segments):
        if seg.count and seg.max_timestamp >= timestamp_ms:
            j = seg.find_time(timestamp_ms)
            if j < seg.count:
                return self._iterate(seg.entry(j)[0], None, None)
    return iter(())


def scan(self, topic_filter: bytes | str, start: int | None = None,
         end: int | None = None) -> Iterator[Record]:
    """Records whose topic matches the MQTT ``topic_filter`` (matching done by the native
    helper over the raw segment bytes), oldest first."""
    if isinstance(topic_filter, str):
        topic_filter = topic_filter.encode("utf-8")
    return self._iterate(self.first_offset if start is None else start, end, topic_filter)


def iterate(self, start: int, end: int | None, topic_filter: bytes | None) -> Iterator[Record]:
    i = max(self._segment_index(start), 0)
    while i < len(self._segments):
        seg = self._segments[i]
        if end is not None and seg.base_offset >= end:
            return
        position = self._start_position(seg, start)
        if position is not None:
            fd = os.dup(seg.fd)
            try:
                while True:
                    limit = seg.size
                    for rec in self._walk_records(seg, fd, position, limit, max(start, seg.base_offset),
                                                  topic_filter):
                        if end is not None and rec.offset >= end:
                            return
                        start = rec.offset + 1
                        yield rec
                    position = limit
                    if seg.size == limit or seg.deleted:
                        break
                    if self.readonly:
                        break
            finally:
                os.close(fd)
        start = max(start, seg.next_offset)
        i = bisect.bisect_right(self._bases, seg.base_offset)


def walk_records(self, seg: Segment, fd: int, position: int, limit: int, min_offset: int,
                  topic_filter: bytes | None) -> Iterator[Record]:
    out = scanner.new_scan_buffer()
    step = scanner.scan_step(topic_filter, out, seg.version)
    quiet_tail = self.readonly and seg is self._segments[-1]
    for event in scanner.walk(fd, position, limit, min_offset, 0, step, seg.path,
                              version=seg.version):
        if event[0] == scanner.DATA:
            _, view, res, base = event
            yield from scanner.records_from(view, out, res.matched, base)
        elif not (quiet_tail and event[1].kind == "torn"):
            self._report(event[1])


def locate(self, offset: int) -> Location | None:
    """Where the payload of ``offset`` is, to send it with ``sendfile`` (see
    ``_native.send_batch``): the topic, QoS, retain flag and properties for the header, and
    the file range of the payload. None like ``read``. The record is checked (CRC) first unless its
    segment was checked whole since open."""
    found = self._find(offset)
    if found is None:
        return None
    seg, j = found
    if not seg.verified:
        rec = self._read_entry(seg, j)
        if rec is None:
            return None
        found = self._find(offset)
        if found is None:
            return None
        seg, j = found
        with self._lock:
            self._verify_wanted.add(seg)
        position = seg.entry(j)[1]
        props = rec.properties
        payload_position = (position + RECORD_HEADER_SIZE + len(rec.client_id) + len(rec.topic)
                            + (PROPERTIES_LENGTH_SIZE + len(props) if props else 0))
        return Location(offset, rec.timestamp_ms, rec.qos, rec.retain, rec.topic, seg.fd,
                        payload_position, len(rec.payload), props, rec.client_id)
    position = self._start_position(seg, offset)   # (a damaged index entry: rebuilt)
    j = seg.find_offset(offset)
    if position is None or j >= seg.count:
        return None
    want = min(seg.end_of(j) - position, RECORD_HEADER_SIZE + 256)
    head = os.pread(seg.fd, want, position)
    if len(head) < RECORD_HEADER_SIZE:
        return None
    _crc, length, rec_offset, ts, attrs, _r, cl, tl, pl = _unpack_record_header(head)
    if rec_offset != offset:
        return None
    client_start = RECORD_HEADER_SIZE    # (after the properties' length, when there are some)
    rl = 0
    if attrs & ATTR_PROPERTIES:
        rl = length - PROPERTIES_LENGTH_SIZE - RECORD_HEADER_SIZE - cl - tl - pl  # (scan-checked)
        client_start += PROPERTIES_LENGTH_SIZE
    topic_start = client_start + cl
    payload_start = topic_start + tl + rl
    if payload_start > len(head):
        head = os.pread(seg.fd, payload_start, position)
    return Location(offset, ts, attrs & 3, bool(attrs & RETAIN_BIT),
                    bytes(head[topic_start:topic_start + tl]), seg.fd,
                    position + payload_start, pl,
                    bytes(head[topic_start + tl:payload_start]) if rl else b"",
                    bytes(head[client_start:topic_start]))


# A payload this large or larger is not copied by ``read_batch``: it is sent from the segment
# file (``locate`` and sendfile).
COPY_LIMIT = 16 * 1024
BATCH_CHUNK = 64 * 1024


def scanned_chunks(self, start: int, topic_filter: bytes | None, out) -> Iterator[tuple]:
    """The segments from ``start`` on, up to what is written, read in chunks and scanned into
    ``out`` (``scanner.new_scan_buffer``): ``(view, result, base)`` after each scan (``view`` is
    reused: use it before resuming), and ``(None, next, None)`` at the end of each segment
    (``next``: the offset a reader goes on from). Damaged records are skipped (reported
    once, as by every reader). Core thread."""
    written = self.written_offset
    i = max(self._segment_index(start), 0)
    segments = self._segments
    while i < len(segments) and start < written:
        seg = segments[i]
        if start < seg.base_offset:
            start = seg.base_offset
        position = self._start_position(seg, start)
        if position is not None:
            step = scanner.scan_step(topic_filter, out, seg.version)
            for event in scanner.walk(seg.fd, position, seg.size, start, 0, step,
                                      seg.path, BATCH_CHUNK, seg.version):
                if event[0] != scanner.DATA:
                    self._report(event[1])
                    continue
                _, view, res, base = event
                start = res.next_offset
                yield view, res, base
        start = max(start, seg.next_offset)
        yield None, start, None
        i += 1


def read_batch(self, start: int, topic_filter: bytes | None, max_records: int, max_bytes: int,
               max_scan: int, copy_limit: int = COPY_LIMIT,
               client_ids: bool = False) -> tuple[list[tuple], int]:
    """The records from ``start`` on whose topic matches ``topic_filter`` (None: all), for a
    session catching up (core.catchup): ``(records, next)``, where each record is ``(offset,
    timestamp_ms, qos, retain, topic, payload, payload_length, properties)`` (``payload`` None
    when it is ``copy_limit`` bytes or more: send it from the file; ``properties`` as in
    ``Record``), with ``client_ids`` the publisher's client id after them, and ``next`` is the
    offset the next call starts from.

    Whole chunks of the segment are read and validated (CRC) by the native scanner; reading
    stops after the chunk that reaches ``max_records`` matches, ``max_bytes`` of copied
    payloads or ``max_scan`` bytes read, and at the end of what is written. Damaged records
    are skipped (reported once, as by every reader). Core thread."""
    records: list[tuple] = []
    copied = 0
    scanned = 0
    start = max(start, self.first_offset)
    out = scanner.new_scan_buffer(1024)
    hdr = RECORD_HEADER_SIZE
    words = _native.SCAN_ENTRY_WORDS
    for view, res, base in self._scanned_chunks(start, topic_filter, out):
        if view is None:
            start = res
            continue
        for k in range(0, res.matched * words, words):
            offset, ts, position, length, meta = out[k:k + words]
            p = position - base + hdr
            r = 0
            if meta & ATTR_PROPERTIES:
                r = _u32_from(view, p)[0]
                p += PROPERTIES_LENGTH_SIZE
            topic_start = p + (meta >> 8 & 0xFFFF)
            topic_end = topic_start + (meta >> 24)
            payload_start = topic_end + r
            n = position - base + length - payload_start
            if n < copy_limit:
                payload = bytes(view[payload_start:payload_start + n])
                copied += n
            else:
                payload = None
            record = (offset, ts, meta & 3, bool(meta & 4), bytes(view[topic_start:topic_end]),
                      payload, n, bytes(view[topic_end:payload_start]) if r else b"")
            if client_ids:
                record += (bytes(view[p:p + (meta >> 8 & 0xFFFF)]),)
            records.append(record)
        start = res.next_offset
        scanned += res.stop
        if len(records) >= max_records or copied >= max_bytes or scanned >= max_scan:
            break
    return records, start


def read_run(self, start: int, topic_filter: bytes | None, max_scan: int,
             copy_limit: int = COPY_LIMIT) -> tuple[tuple | None, int] | None:
    """The matching records of the first chunk from ``start`` on that holds any, as the
    native scanner found them, for a session catching up (core.catchup): ``((data, base,
    entries, count), next)``, where ``data`` holds the chunk read from file position ``base``,
    ``entries`` the scanner's ``count`` entries (``_native.SCAN_ENTRY_WORDS`` words each:
    offset, timestamp, position, length, meta) and ``next`` is the offset the next call
    starts from; ``(None, next)`` when nothing matched in ``max_scan`` bytes or up to what is
    written. None when a matching record's payload may be ``copy_limit`` bytes or more (such
    payloads are sent from the file: ``read_batch`` reads them). One chunk is read per call
    and nothing is made per record. Damaged records are skipped (reported once). Core thread."""
    scanned = 0
    start = max(start, self.first_offset)
    out = scanner.new_scan_buffer(1024)
    words = _native.SCAN_ENTRY_WORDS
    for view, res, base in self._scanned_chunks(start, topic_filter, out):
        if view is None:
            start = res
            continue
        if res.matched:
            # The chunks' buffer is not read into again once the walk is left here: the run
            # keeps it.
            used = res.matched * words
            if (max(out[3:used:words]) - RECORD_HEADER_SIZE >= copy_limit
                    or any(meta & ATTR_PROPERTIES for meta in out[4:used:words])):
                return None   # (records with properties: read_batch reads them)
            if len(view.obj) > BATCH_CHUNK:
                # The walk's buffer grew for a large record of another topic: keep their span
                # only, not that buffer.
                low, high = out[2] - base, out[used - 3] + out[used - 2] - base
                view, base = bytes(view[low:high]), base + low
            return (view, base, out[:used], res.matched), res.next_offset
        start = res.next_offset
        scanned += res.stop
        if scanned >= max_scan:
            break
    return None, start


def missing_between(self, start: int, end: int) -> list[tuple[int, int]]:
    """The ranges of offsets in [start, end) that no segment held when the log was opened (a
    segment missing from the middle of the log): the reads above pass over them, and a reader
    that went from ``start`` to ``end`` lost them. Any thread."""
    return [(max(a, start), min(b, end)) for a, b in self._holes if a < end and b > start]


def damaged_between(self, start: int, end: int) -> list[tuple[int, int, str]]:
    """The ranges of offsets in [start, end) whose records are damaged (found so far by any
    reader, the open or the background check; the first ``MAX_DAMAGE_KEPT``), with the file:
    a reader that went from ``start`` to ``end`` passed over them. Any thread."""
    return [(max(a, start), min(b, end), path) for a, b, path in self._damaged
            if a < end and b > start]


def bytes_after(self, offset: int) -> int:
    """Bytes of the segment files from the record ``offset`` (or the first one after it) to
    the end of what is written: how far a reader at ``offset`` is behind. Core thread."""
    i = max(self._segment_index(offset), 0)
    segments = self._segments
    total = 0
    for seg in segments[i:]:
        j = seg.find_offset(offset) if offset > seg.base_offset else 0
        total += seg.size - (seg.entry(j)[1] if j < seg.count else seg.size)
    return total


def offset_at_time(self, timestamp_ms: int) -> int:
    """The offset of the first record whose timestamp is >= ``timestamp_ms`` (by the running
    maximum the index keeps), or ``written_offset`` when no written record is: records
    appended and not yet written are not indexed, so they count as new enough."""
    for seg in list(self._segments):
        if seg.count and seg.max_timestamp >= timestamp_ms:
            j = seg.find_time(timestamp_ms)
            if j < seg.count:
                return seg.entry(j)[0]
    return self._written


def lag(self, cursor: int, now_ms: int) -> dict:
    """How far a reader at ``cursor`` is behind the head: ``lag_records`` (offsets, whatever
    their topics), ``lag_bytes`` (of the segment files) and ``lag_seconds`` (the age of the
    record at the cursor), all three from the first record still in the log (those before it
    are gone: the reader's gap, not its lag)."""
    offset = max(cursor, self.first_offset)
    record = self.read(offset) if offset < self.written_offset else None
    return {"lag_records": max(0, self.next_offset - offset),
            "lag_bytes": self.bytes_after(offset),
            "lag_seconds": max(0.0, (now_ms - record.timestamp_ms) / 1000) if record else 0.0}


# The checks are verify.py's, imported when one runs (an idle broker does not hold that code:
# docs/deploy.md, idle RSS).

def verify(self, progress=None):
    """Read every segment file whole and check every record's CRC, each header and each
    index against the records, and that no offset file (as read at open) names records past
    the end: a ``verify.VerifyReport``. Changes nothing. ``progress(bytes_done,
    bytes_total)`` is called as it goes. Works on a log the broker is writing (up to what
    exists at the start)."""
    from edgebroker.commitlog.verify import verify_log
    return verify_log(self, progress)


def verify_step(self) -> bool:
    """Check every record of one segment a reader wanted checked (``locate``; the flusher,
    when idle): False when there was nothing to do."""
    if not self._verify_wanted:     # (one a reader adds meanwhile: the next call)
        return False
    from edgebroker.commitlog.verify import verify_step
    return verify_step(self)
