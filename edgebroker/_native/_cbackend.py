"""Thin wrappers around the compiled C helper: convert arguments, call, shape the result.

Importing this module raises ImportError when the extension was not built.
Nothing outside edgebroker._native touches ``ffi`` or ``lib``.
"""

from __future__ import annotations

from array import array

from edgebroker._native._common import (
    FORMAT_VERSION, INDEX_ENTRY_SIZE, PROPERTIES_LENGTH_SIZE, RECORD_HEADER_SIZE,
    SCAN_ENTRY_WORDS, ResyncResult, ScanResult,
    SendResult, stage_clear, stage_segment, stage_start,  # noqa: F401  (stage_*: for both)
)
from edgebroker._native._edgebroker_c import ffi, lib  # noqa: F401  (ImportError when not built)

NAME = "c"
CRC_METHOD = ffi.string(lib.eb_crc32c_method()).decode()

_from_buffer = ffi.from_buffer
_new = ffi.new
_EMPTY = b"\0"


def _ro(data):
    return _from_buffer("uint8_t[]", data if len(data) else _EMPTY)


def crc32c(data, crc: int = 0) -> int:
    return lib.eb_crc32c(crc, _ro(data), len(data))


def _chars(data):
    # bytes go to a `const char *` parameter as they are; other buffers through from_buffer
    return data if type(data) is bytes else _from_buffer("char[]", data if len(data) else _EMPTY)


_unpack = ffi.unpack
_buffer = ffi.buffer
_eb_record_header = lib.eb_record_header


_HEAD_MAX = RECORD_HEADER_SIZE + PROPERTIES_LENGTH_SIZE


def record_header(offset: int, timestamp_ms: int, attributes: int, client_id, topic, payload,
                  properties=b"") -> bytes:
    out = _new("char[]", _HEAD_MAX)
    n = _eb_record_header(out, offset, timestamp_ms, attributes, _chars(client_id),
                          len(client_id), _chars(topic), len(topic), _chars(payload),
                          len(payload), _chars(properties), len(properties))
    return _unpack(out, n)


def header_writer():
    """``record_header`` for one thread's hot path: the header is written into one buffer
    kept for the purpose, and the result is a view of it, valid until the next call."""
    out = _new("char[]", _HEAD_MAX)
    whole = memoryview(ffi.buffer(out))
    views = {RECORD_HEADER_SIZE: whole[:RECORD_HEADER_SIZE], _HEAD_MAX: whole}  # by its size

    def header(offset: int, timestamp_ms: int, attributes: int, client_id, topic, payload,
               properties=b""):
        return views[_eb_record_header(
            out, offset, timestamp_ms, attributes,
            client_id if type(client_id) is bytes else _chars(client_id),
            len(client_id), topic if type(topic) is bytes else _chars(topic),
            len(topic), payload if type(payload) is bytes else _chars(payload),
            len(payload), properties if type(properties) is bytes else _chars(properties),
            len(properties))]
    return header


class Staging:
    """The staging area of ``append_record`` (see ``appender``)."""

    __slots__ = ("state", "data", "index", "held", "_pins")

    def __init__(self, capacity: int, entries: int):
        self.data = bytearray(capacity)
        self.index = bytearray(entries * INDEX_ENTRY_SIZE)
        held = bytearray(entries * 8)
        self.held = memoryview(held).cast("Q")
        # The struct points into the bytearrays: keep them exported (so never resized) for as
        # long as it lives.
        self._pins = (_from_buffer("uint8_t[]", self.data, require_writable=True),
                      _from_buffer("uint8_t[]", self.index, require_writable=True),
                      _from_buffer("uint64_t[]", held, require_writable=True))
        state = self.state = _new("eb_appender *")
        state.buf, state.index, state.held = self._pins
        state.capacity = capacity
        state.index_capacity = entries
        state.held_capacity = entries


def appender(capacity: int, entries: int) -> Staging:
    return Staging(capacity, entries)


append_record = lib.eb_append_record
_eb_append_held = lib.eb_append_held


def append_held(state, timestamp_ms: int, qos: int, retain, client_id, client_id_len: int, topic,
                topic_len: int, payload, payload_len: int, properties, properties_len: int) -> int:
    # A received payload is a bytearray: its address through from_buffer.
    return _eb_append_held(state, timestamp_ms, qos, retain, client_id, client_id_len, topic,
                           topic_len, payload if type(payload) is bytes else _chars(payload),
                           payload_len, properties, properties_len)


def topic_matches(topic_filter: bytes, topic: bytes) -> bool:
    return bool(lib.eb_topic_matches(_ro(topic_filter), len(topic_filter), _ro(topic), len(topic)))


def _result(res) -> ScanResult:
    return ScanResult(res.status, res.stop, res.need, res.count, res.matched, res.next_offset,
                      res.max_timestamp)


def scan(buf, avail: int, base_position: int, min_offset: int, topic_filter, out: array,
         max_timestamp: int = 0, version: int = FORMAT_VERSION) -> ScanResult:
    res = _new("eb_scan_result *")
    res.max_timestamp = max_timestamp
    max_out = len(out) // SCAN_ENTRY_WORDS
    out_c = _from_buffer("uint64_t[]", out, require_writable=True) if max_out else ffi.NULL
    if topic_filter is None:
        lib.eb_scan(_ro(buf), len(buf), avail, base_position, min_offset, version, ffi.NULL, 0,
                    0, out_c, max_out, res)
    else:
        lib.eb_scan(_ro(buf), len(buf), avail, base_position, min_offset, version,
                    _ro(topic_filter), len(topic_filter), 1, out_c, max_out, res)
    return _result(res)


def build_index(buf, avail: int, base_position: int, base_offset: int, min_offset: int,
                max_timestamp: int, out, max_entries: int | None = None,
                version: int = FORMAT_VERSION) -> ScanResult:
    res = _new("eb_scan_result *")
    if max_entries is None:
        max_entries = len(out) // INDEX_ENTRY_SIZE
    elif max_entries * INDEX_ENTRY_SIZE > len(out):
        raise ValueError(f"max_entries {max_entries}: out holds {len(out)} bytes")
    out_c = _from_buffer("uint8_t[]", out, require_writable=True) if len(out) else ffi.NULL
    lib.eb_build_index(_ro(buf), len(buf), avail, base_position, base_offset, min_offset,
                       version, max_timestamp, out_c, max_entries, res)
    return _result(res)


def resync(buf, avail: int, start: int, min_offset: int,
           version: int = FORMAT_VERSION) -> ResyncResult:
    pos = _new("uint64_t *")
    need = _new("uint64_t *")
    status = lib.eb_resync(_ro(buf), len(buf), avail, start, min_offset, version, pos, need)
    return ResyncResult(status, pos[0], need[0])


def _entries(index, count: int) -> None:
    """The C functions read ``count`` entries: ``index`` must hold them (the twin's struct
    raises past its end; C would read beyond the buffer)."""
    if count * INDEX_ENTRY_SIZE > len(index):
        raise ValueError(f"{count} index entries asked of {len(index)} bytes")


def index_check(index, count: int, segment_size: int) -> tuple[int, int]:
    _entries(index, count)
    nonzero = _new("size_t *")
    valid = lib.eb_index_check(_ro(index), count, segment_size, nonzero)
    return valid, nonzero[0]


def index_find_offset(index, count: int, relative_offset: int) -> int:
    _entries(index, count)
    return lib.eb_index_find_offset(_ro(index), count, relative_offset)


def index_find_time(index, count: int, timestamp_ms: int) -> int:
    _entries(index, count)
    return lib.eb_index_find_time(_ro(index), count, timestamp_ms)


_eb_publish_frames = lib.eb_publish_frames


def publish_frames(buf, base_position: int, entries: array, first: int, n: int, qos, pids,
                   capacity: int) -> bytes:
    if first < 0 or n < 0 or (first + n) * SCAN_ENTRY_WORDS > len(entries) or \
            first + n > len(qos) or first + n > len(pids):
        raise ValueError(f"publish_frames: entries {first} to {first + n} are not all there")
    if not n:
        return b""
    out = _new("uint8_t[]", capacity or 1)
    used = _eb_publish_frames(_ro(buf), len(buf), base_position,
                              _from_buffer("uint64_t[]", entries) + first * SCAN_ENTRY_WORDS, n,
                              _from_buffer("uint8_t[]", qos) + first,
                              _from_buffer("uint16_t[]", pids) + first, out, capacity)
    if used < 0:
        raise ValueError("publish_frames: an entry outside the buffer, a QoS not 0 to 2 or "
                         "255, or too small a capacity")
    return _buffer(out, used)[:]


fallocate = lib.eb_fallocate_keep_size
keep_freed_memory = lib.eb_keep_freed_memory
release_freed_memory = lib.eb_release_freed_memory


def send_batch(sock, items, start_item: int = 0, start_progress: int = 0,
               cork: bool = False) -> SendResult:
    n = len(items)
    c_items = _new("eb_send_item[]", n or 1)
    keep = []
    for i, (head, fd, file_pos, file_len) in enumerate(items):
        it = c_items[i]
        if len(head):
            h = _from_buffer("uint8_t[]", head)
            keep.append(h)
            it.head = h
        it.head_len = len(head)
        it.fd = fd
        it.file_pos = file_pos
        it.file_len = file_len
    res = _new("eb_send_result *")
    lib.eb_send_batch(sock.fileno(), c_items, n, start_item, start_progress, 1 if cork else 0, res)
    return SendResult(res.sent, res.item, res.progress, res.error)
