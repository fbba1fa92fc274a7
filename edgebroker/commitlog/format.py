"""The on-disk format (docs/log-format.md) and the small value types of the commit log."""

from __future__ import annotations

import struct

from edgebroker import _native
from edgebroker._native import (  # noqa: F401  (the sizes are defined once, by the native helper)
    ATTR_PROPERTIES, FORMAT_VERSION, INDEX_ENTRY_SIZE, MAX_CLIENT_ID, MAX_PAYLOAD, MAX_TOPIC,
    PROPERTIES_LENGTH_SIZE, RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE,
)
from edgebroker.commitlog.errors import LogFormatError
from edgebroker.records import record

# Segments are written in FORMAT_VERSION (2: records may carry MQTT 5.0 properties); these are
# read. A version 1 record is a version 2 record without properties.
READ_VERSIONS = (1, 2)
MAGIC = b"EDGEBLOG"
SEGMENT_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
NAME_DIGITS = 20

QOS_MASK = 0x03
RETAIN_BIT = 0x04

# magic, version, header length, reserved, base offset, reserved, CRC32C of bytes 0..28
_SEGMENT_HEADER = struct.Struct("<8sHHIQII")
INDEX_ENTRY = struct.Struct("<IIQ")  # relative offset, position, running max timestamp (ms)
RECORD_HEADER = struct.Struct("<IIQQBBHHI")  # crc, length, offset, timestamp, attrs, 0, lengths

MiB = 1024 * 1024
GiB = 1024 * MiB


@record(slots=True)
class LogOptions:
    """How the log rolls and what it keeps. Defaults suit a Raspberry Pi with an SD card
    (docs/config.md explains each; ``[log]`` in the configuration file sets them)."""

    segment_bytes: int = 16 * MiB
    segment_ms: int = 10 * 60 * 1000
    retention_bytes: int = 1 * GiB
    retention_ms: int = 7 * 24 * 3600 * 1000
    # While writes fail, records beyond this many pending bytes are refused (LogFullError).
    max_pending_bytes: int = 32 * MiB
    # Retention waits for the uploaded mark (an uploader is configured); False: it does not.
    wait_for_upload: bool = True

    def __post_init__(self):
        if not 4096 <= self.segment_bytes <= GiB:
            raise ValueError(f"segment_bytes must be between 4096 and {GiB}, got {self.segment_bytes}")
        for name in ("segment_ms", "retention_ms", "max_pending_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.retention_bytes < self.segment_bytes:
            raise ValueError(f"retention_bytes ({self.retention_bytes}) must be at least "
                             f"segment_bytes ({self.segment_bytes})")

    @classmethod
    def from_config(cls, log_config, uploading: bool = True) -> "LogOptions":
        """From the ``[log]`` table of edgebroker.config (a ``config.LogConfig``); ``uploading``:
        an uploader is configured (``[upload] url``), so retention waits for it."""
        return cls(segment_bytes=log_config.segment_bytes, segment_ms=log_config.segment_ms,
                   retention_bytes=log_config.retention_bytes, retention_ms=log_config.retention_ms,
                   wait_for_upload=uploading)


@record(slots=True)
class Record:
    """One message in the log."""

    offset: int
    timestamp_ms: int
    qos: int
    retain: bool
    client_id: bytes
    topic: bytes
    payload: bytes
    # The message's MQTT 5.0 properties as stored (the property encoding without its length
    # in front; mqtt.properties.decode_body reads them); b"" when it has none.
    properties: bytes = b""


@record(slots=True)
class Location:
    """Where a record's payload lies in its segment file, for ``sendfile``, and the rest of
    what a PUBLISH of it needs (topic, QoS, retain flag, properties as in ``Record``).

    ``fd`` stays open until the segment is deleted by retention, which only happens in
    ``housekeeping()``: use a Location before the next call of it."""

    offset: int
    timestamp_ms: int
    qos: int
    retain: bool
    topic: bytes
    fd: int
    payload_position: int
    payload_length: int
    properties: bytes = b""
    client_id: bytes = b""      # the publisher's


@record(slots=True)
class SegmentInfo:
    """One segment, as ``CommitLog.segments()`` and ``edgebroker inspect segments`` show it."""

    base_offset: int
    next_offset: int          # one past the last record's offset (base_offset when empty)
    records: int
    size_bytes: int           # the segment file (valid records and header)
    index_bytes: int
    first_timestamp_ms: int | None
    last_timestamp_ms: int | None  # the largest timestamp in the segment
    active: bool              # the segment being appended to
    uploaded: bool
    path: str


@record(slots=True)
class UploadSource:
    """A sealed, fsynced segment for the uploader: ``fd`` is a duplicate of its descriptor
    (the caller closes it; the file stays readable if retention deletes it meanwhile),
    ``position`` where the first record to upload starts, ``size`` where its records end."""

    path: str
    fd: int
    position: int
    size: int
    next_offset: int
    rolled: bool    # a newer segment follows (False: sealed by age, the log's last one)
    version: int = FORMAT_VERSION  # the segment's format version (its records' rules)


@record(slots=True)
class Damage:
    """A region of a segment that is not a valid record, found by a scan."""

    path: str
    position: int
    length: int | None   # bytes skipped; None for a tail that runs to the end of the file
    offset: int          # the offset the next valid record was expected to have at least
    kind: str            # "corrupt" (valid records follow) or "torn" (nothing valid follows)
    next_offset: int | None = None   # "corrupt": the offset of the valid record after it

    def describe(self) -> str:
        if self.kind == "torn":
            return (f"{self.path}: incomplete tail at position {self.position} (from offset "
                    f"{self.offset}, {self.length} bytes)")
        return (f"{self.path}: corrupt record at position {self.position} (offset {self.offset}), "
                f"{self.length} bytes skipped")


def segment_name(base_offset: int) -> str:
    return f"{base_offset:0{NAME_DIGITS}d}"


# The largest base offset a segment's name may give: no log reaches 2^62 (146,000 years at a
# million messages a second), so offsets stay far below 2^63 (the C helper returns them as
# signed 64-bit numbers) and 2^64 - 1 (which readers take for damage).
MAX_BASE_OFFSET = (1 << 62) - 1


def parse_offset_name(stem: str) -> int | None:
    """The offset a segment or index file's name (without its suffix) gives: 20 ASCII digits
    up to MAX_BASE_OFFSET, else None (the file is not the log's, and is left alone)."""
    if len(stem) == NAME_DIGITS and stem.isascii() and stem.isdigit():
        base = int(stem)
        return base if base <= MAX_BASE_OFFSET else None
    return None


def parse_segment_name(filename: str) -> int | None:
    """The base offset of a ``<20 digits>.seg`` name (parse_offset_name), else None."""
    stem, dot, ext = filename.partition(".")
    if dot and "." + ext == SEGMENT_SUFFIX:
        return parse_offset_name(stem)
    return None


def segment_header(base_offset: int) -> bytes:
    head = _SEGMENT_HEADER.pack(MAGIC, FORMAT_VERSION, SEGMENT_HEADER_SIZE, 0, base_offset, 0, 0)
    crc = _native.crc32c(head[:28])
    return head[:28] + struct.pack("<I", crc)


def check_segment_header(data: bytes, path: str, base_offset: int) -> tuple[str | None, int]:
    """(problem, version): problem None when the header is right, a description when it is
    damaged; version the segment's format version, by whose rules its records are read
    (FORMAT_VERSION for a damaged header: version 2 reads every version 1 record too).
    Raises LogFormatError for a header that is intact but says something this code cannot
    use."""
    if len(data) < SEGMENT_HEADER_SIZE:
        check_short_segment(data, path)
        return f"header is {len(data)} bytes, expected {SEGMENT_HEADER_SIZE}", FORMAT_VERSION
    magic, version, hlen, _r1, base, _r2, crc = _SEGMENT_HEADER.unpack_from(data)
    if _native.crc32c(data[:28]) != crc:
        head = bytes(data[:SEGMENT_HEADER_SIZE])
        if head.strip(b"\0") and head.strip(b"\xff") and magic != MAGIC and not (
                version in READ_VERSIONS and hlen == SEGMENT_HEADER_SIZE
                and base == base_offset):
            # Not a damaged header of ours (the rest of it would still say so), nor one a
            # crash left as zeros (the file system's fill) or erased flash (0xff): a file
            # from somewhere else with a segment's name. Refused, never repaired or removed.
            raise LogFormatError(f"{path}: not an edgebroker log segment (magic {magic!r}, "
                                 f"header checksum mismatch); move the file out of the log "
                                 f"directory")
        return ("header checksum mismatch" + (f" (magic {magic!r})" if magic != MAGIC else ""),
                FORMAT_VERSION)
    if magic != MAGIC:
        raise LogFormatError(f"{path}: not an edgebroker log segment (magic {magic!r}); move "
                             f"the file out of the log directory")
    if version not in READ_VERSIONS:
        raise LogFormatError(f"{path}: segment format version {version}; this edgebroker reads "
                             f"versions {', '.join(map(str, READ_VERSIONS))} (written by a "
                             f"newer edgebroker?)")
    if hlen != SEGMENT_HEADER_SIZE:
        raise LogFormatError(f"{path}: header length {hlen}, expected {SEGMENT_HEADER_SIZE}")
    if base != base_offset:
        raise LogFormatError(f"{path}: the header says base offset {base}, the file name "
                             f"{base_offset}; was the file renamed?")
    return None, version


def check_short_segment(data: bytes, path: str) -> None:
    """A segment file shorter than its header: a crash while it was being made left the start
    of a header (or zeros the file system filled in), else it is a file from somewhere else
    (LogFormatError)."""
    if data.strip(b"\0") and not MAGIC.startswith(data[:len(MAGIC)]):
        raise LogFormatError(f"{path}: not an edgebroker log segment ({len(data)} bytes, no "
                             f"segment header); move the file out of the log directory")
