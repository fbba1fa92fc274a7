"""What both backends share: constants (equal to csrc/edgebroker_native.h's; the sizes of the log
format are defined here once, and commitlog/format.py takes them from here), result types, and
the setters of a staging area's fields (the C struct ``eb_appender`` and the twin's ``Appender``
have the same field names, so one setter serves both)."""

from __future__ import annotations

from collections import namedtuple

SEGMENT_HEADER_SIZE = 32
RECORD_HEADER_SIZE = 34
INDEX_ENTRY_SIZE = 16
SCAN_ENTRY_WORDS = 5  # offset, timestamp_ms, position, length, meta
FORMAT_VERSION = 2    # of the segments written; version 1 segments are read too
ATTR_PROPERTIES = 0x08  # attributes bit 3 (version 2): the record has properties ...
PROPERTIES_LENGTH_SIZE = 4  # ... and their length (u32) follows the 34-byte header

SCAN_END = 0      # every byte up to `avail` was a valid record
SCAN_PARTIAL = 1  # the record at `stop` continues past the buffer: read `need` bytes from there
SCAN_BAD = 2      # the bytes at `stop` are not a valid record (corrupt or torn)
SCAN_FULL = 3     # the output is full; call again from `stop`

RESYNC_NONE = 0       # no valid record starts in the buffer
RESYNC_FOUND = 1      # a valid record starts at `position`
RESYNC_CANDIDATE = 2  # a plausible header at `position` whose record (`need` bytes) ends past the buffer

MAX_CLIENT_ID = 65535
MAX_TOPIC = 65535
MAX_PAYLOAD = 268_435_455
MAX_RECORD = RECORD_HEADER_SIZE + PROPERTIES_LENGTH_SIZE + MAX_CLIENT_ID + MAX_TOPIC + MAX_PAYLOAD


# The result types: collections.namedtuple, as typing.NamedTuple would be (typing is not
# imported at run time: it costs the broker memory).
ScanResult = namedtuple("ScanResult", (
    "status",          # SCAN_*
    "stop",            # buffer position where the scan stopped
    "need",            # SCAN_PARTIAL: bytes needed from `stop`
    "count",           # valid records passed over
    "matched",         # entries written to the output
    "next_offset",     # one past the last valid record's offset (or the min_offset given)
    "max_timestamp",   # largest timestamp seen (or the value given)
))

ResyncResult = namedtuple("ResyncResult", (
    "status",          # RESYNC_*
    "position",
    "need",
))

SendResult = namedtuple("SendResult", (
    "sent",            # bytes sent by this call
    "item",            # first item not completely sent (len(items) when all were)
    "progress",        # bytes of that item already sent (header first, then the file range)
    "error",           # 0 when all was sent, errno.EAGAIN when the socket is full, else an errno
))


def stage_segment(state, base_offset: int, segment_bytes: int, first_ts: int, segment_ms: int,
                  big_payload: int) -> None:
    """Set up a staging area (``appender(...).state``) for the records of one segment."""
    state.base_offset = base_offset
    state.segment_bytes = segment_bytes
    state.first_ts = first_ts
    state.segment_ms = segment_ms
    state.big_payload = big_payload


def stage_start(state, next_offset: int, position: int, max_ts: int) -> None:
    """Where the next staged record goes: its offset, its position in the segment, and the
    segment's running maximum timestamp so far."""
    state.next_offset = next_offset
    state.position = position
    state.max_ts = max_ts


def stage_clear(state) -> None:
    """Empty a staging area whose records the caller has taken (the segment fields stay)."""
    state.used = 0
    state.count = 0
    state.held_count = 0
