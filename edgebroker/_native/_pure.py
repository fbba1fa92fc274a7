"""The pure-Python twin of csrc/edgebroker_native.c: same functions, same results, much slower.

Sending (``send_batch``, ``publish_frames``) is in ``_pure_send``, exposed here. Used when
the C build is missing (``EDGEBROKER_NATIVE=auto``) or asked for
(``EDGEBROKER_NATIVE=python``). Each function mirrors its C namesake line for
line where that is reasonable, so a difference found by the twin tests points
at one obvious place.
"""

from __future__ import annotations

import errno
import struct
from array import array

from edgebroker._native._common import (
    ATTR_PROPERTIES, FORMAT_VERSION, INDEX_ENTRY_SIZE, MAX_PAYLOAD, MAX_RECORD,
    PROPERTIES_LENGTH_SIZE, RECORD_HEADER_SIZE,
    RESYNC_CANDIDATE, RESYNC_FOUND, RESYNC_NONE, SCAN_BAD, SCAN_END, SCAN_ENTRY_WORDS, SCAN_FULL,
    SCAN_PARTIAL, SEGMENT_HEADER_SIZE, ResyncResult, ScanResult,
    stage_clear, stage_segment, stage_start,  # noqa: F401  (the same setters for both)
)
from edgebroker._native._pure_send import publish_frames, send_batch  # noqa: F401

NAME = "python"
CRC_METHOD = "table"

HDR = RECORD_HEADER_SIZE
PROPS = ATTR_PROPERTIES
RLEN = PROPERTIES_LENGTH_SIZE
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEAD_TAIL = struct.Struct("<IQQBBHHI")       # record header bytes 4..34
_PLAUS = struct.Struct("<IQQBBHHI")           # same fields, read from position + 4
_ENTRY = struct.Struct("<IIQ")
_HELD = struct.Struct("=Q")  # an appender's held list: native words, as the C build's
_u32_from = _U32.unpack_from
_u64_from = _U64.unpack_from
_u16_from = _U16.unpack_from


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_T = _make_table()


def _update(c: int, data) -> int:
    t = _T
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c


def crc32c(data, crc: int = 0) -> int:
    return _update(crc ^ 0xFFFFFFFF, memoryview(data).cast("B")) ^ 0xFFFFFFFF


def record_header(offset: int, timestamp_ms: int, attributes: int, client_id, topic, payload,
                  properties=b"") -> bytes:
    rl = len(properties)
    head = HDR + RLEN if rl else HDR
    attributes &= ~PROPS & 0xFF
    tail = _HEAD_TAIL.pack(head + len(client_id) + len(topic) + rl + len(payload), offset,
                           timestamp_ms, attributes | PROPS if rl else attributes, 0,
                           len(client_id), len(topic), len(payload))
    if rl:
        tail += _U32.pack(rl)
    c = _update(0xFFFFFFFF, tail)
    c = _update(c, client_id)
    c = _update(c, topic)
    c = _update(c, properties)
    c = _update(c, payload)
    return _U32.pack(c ^ 0xFFFFFFFF) + tail


def header_writer():
    """``record_header`` for one thread's hot path (see the C backend); here it is just that."""
    return record_header


class Appender:
    """The fields of the C struct ``eb_appender``; ``buf`` and ``index`` are the bytearrays."""

    __slots__ = ("buf", "capacity", "used", "index", "index_capacity", "count", "next_offset",
                 "base_offset", "position", "segment_bytes", "first_ts", "segment_ms", "max_ts",
                 "staged_first_ts", "big_payload", "held", "held_capacity", "held_count")

    def __init__(self, buf: bytearray, index: bytearray, held: bytearray):
        self.buf = buf
        self.capacity = len(buf)
        self.index = index
        self.index_capacity = len(index) // INDEX_ENTRY_SIZE
        self.held = held
        self.held_capacity = len(held) // 8
        self.held_count = 0
        self.used = self.count = self.next_offset = self.base_offset = self.position = 0
        self.segment_bytes = self.first_ts = self.segment_ms = self.max_ts = 0
        self.staged_first_ts = self.big_payload = 0


class Staging:
    """The staging area of ``append_record`` (see ``appender``)."""

    __slots__ = ("state", "data", "index", "held")

    def __init__(self, capacity: int, entries: int):
        self.data = bytearray(capacity)
        self.index = bytearray(entries * INDEX_ENTRY_SIZE)
        held = bytearray(entries * 8)
        self.held = memoryview(held).cast("Q")
        self.state = Appender(self.data, self.index, held)


def appender(capacity: int, entries: int) -> Staging:
    return Staging(capacity, entries)


def _begin_record(a: Appender, timestamp_ms: int, qos: int, retain, client_id, client_id_len: int,
                  topic, topic_len: int, payload, properties, properties_len: int, nbytes: int,
                  length: int) -> int:
    """The checks every staged record passes (``nbytes`` of it staged, ``length`` in the
    segment; -1 when it fails one), then its header, client id, topic and properties at the
    end of the staging area; where it starts there."""
    offset = a.next_offset
    rel = offset - a.base_offset
    if (timestamp_ms < 0 or qos < 0 or qos > 2 or client_id_len > 0xFFFF or topic_len > 0xFFFF
            or properties_len > MAX_PAYLOAD
            or a.used + nbytes > a.capacity
            or a.count >= a.index_capacity or a.position + length > a.segment_bytes
            or timestamp_ms - a.first_ts >= a.segment_ms
            or rel > 0xFFFFFFFF or a.position > 0xFFFFFFFF):
        return -1
    out = a.used
    head = record_header(offset, timestamp_ms, qos | (0x04 if retain else 0), client_id, topic,
                         payload, properties) + bytes(client_id) + bytes(topic) + bytes(properties)
    a.buf[out:out + len(head)] = head
    return out


def _prefix(client_id_len: int, topic_len: int, properties_len: int) -> int:
    """Bytes of a record before its payload: header, client id, topic, properties."""
    return HDR + client_id_len + topic_len + (RLEN + properties_len if properties_len else 0)


def append_record(a: Appender, timestamp_ms: int, qos: int, retain, client_id, client_id_len: int,
                  topic, topic_len: int, payload, payload_len: int, properties,
                  properties_len: int) -> int:
    length = _prefix(client_id_len, topic_len, properties_len) + payload_len
    if payload_len >= a.big_payload:
        return -1
    out = _begin_record(a, timestamp_ms, qos, retain, client_id, client_id_len, topic, topic_len,
                        payload, properties, properties_len, length, length)
    if out < 0:
        return -1
    a.buf[out + length - payload_len:out + length] = bytes(payload)
    return _staged(a, timestamp_ms, length, length)


def _staged(a: Appender, timestamp_ms: int, nbytes: int, length: int) -> int:
    """The record just built at the end of the staging area (``nbytes`` of it there,
    ``length`` in the segment): its index entry and the running fields. Its offset."""
    offset = a.next_offset
    if timestamp_ms > a.max_ts:
        a.max_ts = timestamp_ms
    if a.count == 0:
        a.staged_first_ts = timestamp_ms
    e = a.count * INDEX_ENTRY_SIZE
    a.index[e:e + INDEX_ENTRY_SIZE] = _ENTRY.pack(offset - a.base_offset, a.position, a.max_ts)
    a.used += nbytes
    a.count += 1
    a.position += length
    a.next_offset = offset + 1
    return offset


def append_held(a: Appender, timestamp_ms: int, qos: int, retain, client_id, client_id_len: int,
                topic, topic_len: int, payload, payload_len: int, properties,
                properties_len: int) -> int:
    prefix = _prefix(client_id_len, topic_len, properties_len)
    length = prefix + payload_len
    if payload_len > MAX_PAYLOAD or a.held_count >= a.held_capacity:
        return -1
    out = _begin_record(a, timestamp_ms, qos, retain, client_id, client_id_len, topic, topic_len,
                        payload, properties, properties_len, prefix, length)
    if out < 0:
        return -1
    _HELD.pack_into(a.held, 8 * a.held_count, out + prefix)
    a.held_count += 1
    return _staged(a, timestamp_ms, prefix, length)


def topic_matches(topic_filter: bytes, topic: bytes) -> bool:
    """mqtt.topics.topic_matches on bytes."""
    if b"+" not in topic_filter and b"#" not in topic_filter:
        return topic_filter == topic
    if topic[:1] == b"$" and topic_filter[:1] in (b"+", b"#"):
        return False
    f_levels = topic_filter.split(b"/")
    t_levels = topic.split(b"/")
    n_topic = len(t_levels)
    for i, level in enumerate(f_levels):
        if level == b"#":
            return True
        if i >= n_topic:
            return False
        if level != b"+" and level != t_levels[i]:
            return False
    return len(f_levels) == n_topic


def _plausible(buf, p: int, min_offset: int, version: int) -> int:
    length, offset, _ts, attrs, reserved, cid_len, topic_len, payload_len = _PLAUS.unpack_from(buf, p + 4)
    fields = HDR + cid_len + topic_len + payload_len
    if length < HDR or length > MAX_RECORD:
        return 0
    if attrs & PROPS:
        if version < 2 or fields + RLEN >= length:  # (R >= 1: the bit means properties)
            return 0
    elif fields != length:
        return 0
    if attrs & 0xF0 or attrs & 3 == 3 or reserved:
        return 0
    if offset < min_offset or offset - min_offset > 0xFFFFFFFF or offset == 0xFFFFFFFFFFFFFFFF:
        return 0        # (the last: the next record's offset would not fit in 64 bits)
    return length


def _props_ok(buf, p: int, length: int) -> bool:
    """A whole record that passed ``_plausible``: R is what the other lengths leave of it."""
    if not buf[p + 24] & PROPS:
        return True
    return _u32_from(buf, p + HDR)[0] == (length - HDR - RLEN - _u16_from(buf, p + 26)[0]
                                          - _u16_from(buf, p + 28)[0] - _u32_from(buf, p + 30)[0])


def _crc_ok(buf, p: int, length: int) -> bool:
    return _update(0xFFFFFFFF, buf[p + 4:p + length]) ^ 0xFFFFFFFF == _u32_from(buf, p)[0]


def _step(buf, buf_len: int, avail: int, pos: int, min_offset: int, version: int):
    """(status, length, need) for the bytes at ``pos``; status SCAN_END means a valid record."""
    left = avail - pos
    if buf_len - pos < HDR:
        if left < HDR:
            return SCAN_BAD, 0, 0
        return SCAN_PARTIAL, 0, HDR
    length = _plausible(buf, pos, min_offset, version)
    if not length or length > left:
        return SCAN_BAD, 0, 0
    if length > buf_len - pos:
        return SCAN_PARTIAL, 0, length
    if not _props_ok(buf, pos, length) or not _crc_ok(buf, pos, length):
        return SCAN_BAD, 0, 0
    return SCAN_END, length, 0


def scan(buf, avail: int, base_position: int, min_offset: int, topic_filter, out: array,
         max_timestamp: int = 0, version: int = FORMAT_VERSION) -> ScanResult:
    mv = memoryview(buf).cast("B")
    buf_len = min(len(mv), avail)
    max_out = len(out) // SCAN_ENTRY_WORDS
    pos = count = matched = need = 0
    while True:
        if pos == avail:
            status = SCAN_END
            break
        status, length, need = _step(mv, buf_len, avail, pos, min_offset, version)
        if status != SCAN_END:
            break
        offset, ts = _u64_from(mv, pos + 8)[0], _u64_from(mv, pos + 16)[0]
        cid_len, topic_len = _u16_from(mv, pos + 26)[0], _u16_from(mv, pos + 28)[0]
        t = pos + HDR + (RLEN if mv[pos + 24] & PROPS else 0) + cid_len
        if topic_filter is None or topic_matches(topic_filter, bytes(mv[t:t + topic_len])):
            if matched == max_out:
                status = SCAN_FULL
                break
            e = matched * SCAN_ENTRY_WORDS
            out[e] = offset
            out[e + 1] = ts
            out[e + 2] = base_position + pos
            out[e + 3] = length
            out[e + 4] = mv[pos + 24] | cid_len << 8 | topic_len << 24
            matched += 1
        count += 1
        min_offset = offset + 1
        if ts > max_timestamp:
            max_timestamp = ts
        pos += length
    return ScanResult(status, pos, need if status == SCAN_PARTIAL else 0, count, matched,
                      min_offset, max_timestamp)


def build_index(buf, avail: int, base_position: int, base_offset: int, min_offset: int,
                max_timestamp: int, out, max_entries: int | None = None,
                version: int = FORMAT_VERSION) -> ScanResult:
    mv = memoryview(buf).cast("B")
    buf_len = min(len(mv), avail)
    if max_entries is None:
        max_entries = len(out) // INDEX_ENTRY_SIZE
    if min_offset < base_offset:
        min_offset = base_offset
    pos = count = need = 0
    pack_into = _ENTRY.pack_into
    while True:
        if pos == avail:
            status = SCAN_END
            break
        if count == max_entries:
            status = SCAN_FULL
            break
        status, length, need = _step(mv, buf_len, avail, pos, min_offset, version)
        if status != SCAN_END:
            break
        offset, ts = _u64_from(mv, pos + 8)[0], _u64_from(mv, pos + 16)[0]
        if offset - base_offset > 0xFFFFFFFF or base_position + pos > 0xFFFFFFFF:
            status = SCAN_BAD
            break
        if ts > max_timestamp:
            max_timestamp = ts
        pack_into(out, count * INDEX_ENTRY_SIZE, offset - base_offset, base_position + pos, max_timestamp)
        count += 1
        min_offset = offset + 1
        pos += length
    return ScanResult(status, pos, need if status == SCAN_PARTIAL else 0, count, count,
                      min_offset, max_timestamp)


def resync(buf, avail: int, start: int, min_offset: int,
           version: int = FORMAT_VERSION) -> ResyncResult:
    mv = memoryview(buf).cast("B")
    buf_len = min(len(mv), avail)
    for p in range(start, buf_len - HDR + 1):
        length = _plausible(mv, p, min_offset, version)
        if not length or length > avail - p:
            continue
        if length > buf_len - p:
            return ResyncResult(RESYNC_CANDIDATE, p, length)
        if _props_ok(mv, p, length) and _crc_ok(mv, p, length):
            return ResyncResult(RESYNC_FOUND, p, 0)
    return ResyncResult(RESYNC_NONE, 0, 0)


def index_check(index, count: int, segment_size: int) -> tuple[int, int]:
    """(consistent leading entries, entries before the first all-zero one)."""
    valid = nonzero = 0
    still_valid = True
    prev_rel = prev_pos = prev_ts = 0
    unpack = _ENTRY.unpack_from
    for i in range(count):
        rel, pos, ts = unpack(index, i * INDEX_ENTRY_SIZE)
        if not rel and not pos and not ts:
            break
        nonzero += 1
        if still_valid:
            if (pos < SEGMENT_HEADER_SIZE or pos >= segment_size
                    or (i > 0 and (rel <= prev_rel or pos <= prev_pos or ts < prev_ts))):
                still_valid = False
            else:
                valid += 1
        prev_rel, prev_pos, prev_ts = rel, pos, ts
    return valid, nonzero


def index_find_offset(index, count: int, relative_offset: int) -> int:
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        if _u32_from(index, mid * INDEX_ENTRY_SIZE)[0] < relative_offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


def index_find_time(index, count: int, timestamp_ms: int) -> int:
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        if _u64_from(index, mid * INDEX_ENTRY_SIZE + 8)[0] < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h

try:
    import ctypes
except ImportError:   # the one-file binary is built without it (its C build runs there)
    ctypes = None


def _libc_function(names: tuple[str, ...], argtypes: tuple[str, ...]):
    """The first of ``names`` that the C library has, typed (``argtypes``: names of ctypes
    types), returning int; None without it (or without ctypes)."""
    if ctypes is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = next(getattr(libc, name) for name in names if hasattr(libc, name))
    except (OSError, StopIteration):
        return None
    call.argtypes = tuple(getattr(ctypes, name) for name in argtypes)
    call.restype = ctypes.c_int
    return call


_fallocate = _libc_function(("fallocate64", "fallocate"), ("c_int", "c_int", "c_int64", "c_int64"))


def fallocate(fd: int, nbytes: int) -> int:
    """The C build's eb_fallocate_keep_size, through ctypes."""
    if _fallocate is None:
        return errno.ENOSYS
    if _fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, nbytes) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_mallopt = _libc_function(("mallopt",), ("c_int", "c_int"))
_malloc_trim = _libc_function(("malloc_trim",), ("c_size_t",))


def keep_freed_memory(trim_threshold: int, mmap_threshold: int) -> int:
    """The C build's eb_keep_freed_memory, through ctypes."""
    if _mallopt is None:
        return errno.ENOSYS
    if not (0 <= trim_threshold <= 0x7FFFFFFF and 0 <= mmap_threshold <= 0x7FFFFFFF):
        return errno.EINVAL
    if not _mallopt(_M_TRIM_THRESHOLD, trim_threshold) or \
            not _mallopt(_M_MMAP_THRESHOLD, mmap_threshold):
        return errno.EINVAL
    return 0


def release_freed_memory() -> int:
    """The C build's eb_release_freed_memory, through ctypes."""
    if _malloc_trim is None:
        return errno.ENOSYS
    _malloc_trim(0)
    return 0
