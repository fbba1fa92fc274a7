"""The upload batch format (docs/upload-format.md): one zstd frame holding a header and the
exact record bytes of one contiguous offset range of the commit log.

``write_batch`` streams the records through the compressor (memory bounded by the chunks it is
given); ``read_batch_file`` reads one batch file back, checking everything it can (one zstd
frame and nothing after it, magic, version, both CRC32Cs, every record's CRC, the counts and
ranges the header claims), and names the file in every error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import BinaryIO, Iterable

import zstandard

from edgebroker import _native
from edgebroker.commitlog.format import (
    ATTR_PROPERTIES, FORMAT_VERSION as LOG_FORMAT_VERSION, PROPERTIES_LENGTH_SIZE, READ_VERSIONS,
    RECORD_HEADER, RECORD_HEADER_SIZE, Record,
)
from edgebroker.upload_config import check_gateway_id
from edgebroker.errors import EdgebrokerError

MAGIC = b"EDGEBBAT"
BATCH_VERSION = 1
SUFFIX = ".ebb.zst"
ZSTD_LEVEL = 3
# magic, batch version, header length, log format version, gateway id length, first offset,
# last offset, record count, min timestamp, max timestamp, raw length, gap first, gap length,
# CRC32C of the raw bytes, CRC32C of the header (bytes 0-83 and the gateway id)
_FIXED = struct.Struct("<8sHHHHQQQQQQQQII")
FIXED_SIZE = _FIXED.size  # 88
READ_CHUNK = 1024 * 1024
# The most record bytes a batch holds: the upper bound of batch_bytes (docs/config.md); a record
# alone, which may make a batch of its own, is smaller (an MQTT packet is at most 256 MiB).
MAX_RAW_LENGTH = 1024 * 1024 * 1024
# The most bytes a batch file decompresses to: the longest header and MAX_RAW_LENGTH.
MAX_BATCH_SIZE = FIXED_SIZE + 64 + MAX_RAW_LENGTH
# Record timestamps (ms since the epoch, UTC) are before this one, 10000-01-01T00:00:00Z: a
# date or timestamp column of Python, Arrow or Spark holds them.
TIMESTAMP_END_MS = 253_402_300_800_000
# Compressed bytes given to the decompressor at a time for a frame that does not say its size:
# a step gives at most some tens of MiB, so the size is checked before much is held.
_UNSIZED_STEP = 1024


class BatchFormatError(EdgebrokerError):
    """A batch file that cannot be read as it is; the message names the file."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    gateway_id: str
    first_offset: int
    last_offset: int
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    raw_length: int
    raw_crc32c: int
    gap_first: int = 0    # offsets before this batch that no batch holds: [gap_first,
    gap_length: int = 0   # gap_first + gap_length); 0: none
    log_format_version: int = LOG_FORMAT_VERSION  # of the segment its records come from
    version: int = BATCH_VERSION

    def encode(self) -> bytes:
        gid = self.gateway_id.encode("ascii")
        fixed = _FIXED.pack(MAGIC, self.version, FIXED_SIZE + len(gid), self.log_format_version,
                            len(gid), self.first_offset, self.last_offset, self.record_count,
                            self.min_timestamp_ms, self.max_timestamp_ms, self.raw_length,
                            self.gap_first, self.gap_length, self.raw_crc32c, 0)
        crc = _native.crc32c(gid, _native.crc32c(fixed[:84]))
        return fixed[:84] + struct.pack("<I", crc) + gid


def object_name(prefix: str, gateway_id: str, first: int, last: int, first_ts_ms: int,
                life: str = "") -> str:
    """``<prefix>/gateway=<id>/date=<YYYY-MM-DD>/<first:020>-<last:020>-<life>.ebb.zst``, the
    date (UTC) from ``first_ts_ms``, the first record's timestamp; ``life`` the log's life id
    (uploader/life.py). Without it, the name of a batch cut before life ids
    (``<first:020>-<last:020>.ebb.zst``)."""
    day = datetime.fromtimestamp(first_ts_ms / 1000, timezone.utc).strftime("%Y-%m-%d")
    life = f"-{life}" if life else ""
    name = f"gateway={gateway_id}/date={day}/{first:020d}-{last:020d}{life}{SUFFIX}"
    prefix = prefix.strip("/")
    return f"{prefix}/{name}" if prefix else name


def _compressor() -> zstandard.ZstdCompressor:
    # Fixed parameters: the same records always compress to the same bytes (with the same
    # zstd library), so a retry rewrites an object with the very bytes it has.
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True,
                                    write_content_size=True, threads=0)


def write_batch(out: BinaryIO, header: BatchHeader, chunks: Iterable[bytes]) -> int:
    """Write the batch (header, then ``chunks``: the raw record bytes, ``header.raw_length`` in
    all) to ``out`` as one zstd frame; the number of compressed bytes written."""
    head = header.encode()
    total = len(head) + header.raw_length
    start = out.tell()
    writer = _compressor().stream_writer(out, size=total, closefd=False)
    writer.write(head)
    given = 0
    for chunk in chunks:
        given += len(chunk)
        writer.write(chunk)
    if given != header.raw_length:
        raise ValueError(f"the header says {header.raw_length} raw bytes, {given} were given")
    # close() ends the frame; flush(FLUSH_FRAME) before it would make close() add a second,
    # empty frame after it.
    writer.close()
    return out.tell() - start


def _read_exactly(reader, n: int, path: str, what: str) -> bytes:
    parts = []
    left = n
    while left:
        chunk = reader.read(min(left, READ_CHUNK))
        if not chunk:
            raise BatchFormatError(f"{path}: ends inside {what} ({n - left} of {n} bytes)")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def decode_header(data: bytes, path: str) -> BatchHeader:
    """The header at the start of ``data`` (the decompressed batch)."""
    if len(data) < FIXED_SIZE:
        raise BatchFormatError(f"{path}: {len(data)} bytes, shorter than a batch header")
    (magic, version, hlen, log_version, gid_len, first, last, count, min_ts, max_ts, raw_len,
     gap_first, gap_len, raw_crc, head_crc) = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise BatchFormatError(f"{path}: not an edgebroker upload batch (magic {magic!r})")
    if version != BATCH_VERSION:
        raise BatchFormatError(f"{path}: batch format version {version}; this edgebroker reads "
                               f"version {BATCH_VERSION} (written by a newer edgebroker?)")
    if hlen != FIXED_SIZE + gid_len or len(data) < hlen:
        raise BatchFormatError(f"{path}: header length {hlen} does not fit a gateway id of "
                               f"{gid_len} bytes")
    gid = bytes(data[FIXED_SIZE:hlen])
    if _native.crc32c(gid, _native.crc32c(bytes(data[:84]))) != head_crc:
        raise BatchFormatError(f"{path}: header checksum mismatch")
    if log_version not in READ_VERSIONS:
        raise BatchFormatError(f"{path}: records of log format version {log_version}; this "
                               f"edgebroker reads versions "
                               f"{', '.join(map(str, READ_VERSIONS))}")
    gateway = gid.decode("ascii", "replace")
    problem = check_gateway_id(gateway)
    if problem:
        raise BatchFormatError(f"{path}: gateway id {gateway!r} {problem}")
    # Before anything is allocated by them: the count and the raw length must be possible.
    if not count:
        raise BatchFormatError(f"{path}: no records (a batch holds at least one)")
    if raw_len > MAX_RAW_LENGTH:
        raise BatchFormatError(f"{path}: raw length {raw_len}, more than a batch holds "
                               f"({MAX_RAW_LENGTH})")
    if count * RECORD_HEADER_SIZE > raw_len:
        raise BatchFormatError(f"{path}: {count} records cannot lie in {raw_len} raw bytes (a "
                               f"record takes at least {RECORD_HEADER_SIZE})")
    # Offsets fit a signed 64-bit column; a gap lies before the batch's first offset.
    if not first <= last < 2**63 or gap_len and gap_first + gap_len > first:
        raise BatchFormatError(f"{path}: offsets {first}..{last} with a gap of {gap_len} from "
                               f"{gap_first} are not possible")
    return BatchHeader(gateway, first, last, count, min_ts, max_ts,
                       raw_len, raw_crc, gap_first, gap_len, log_version, version)


def parse_records(raw: bytes, header: BatchHeader, path: str) -> list[Record]:
    """The records of a batch's raw bytes, each checked (lengths, CRC) against the header."""
    records = []
    view = memoryview(raw)
    pos = 0
    previous = -1
    while pos < len(raw):
        if len(raw) - pos < RECORD_HEADER_SIZE:
            raise BatchFormatError(f"{path}: record at raw position {pos} is cut short")
        crc, length, offset, ts, attrs, reserved, cl, tl, pl = RECORD_HEADER.unpack_from(raw, pos)
        where = f"{path}: record at raw position {pos} (offset {offset})"
        p = pos + RECORD_HEADER_SIZE
        rl = 0
        if attrs & ATTR_PROPERTIES and header.log_format_version >= 2 \
                and len(raw) - p >= PROPERTIES_LENGTH_SIZE:
            rl = int.from_bytes(raw[p:p + PROPERTIES_LENGTH_SIZE], "little")
            p += PROPERTIES_LENGTH_SIZE
        if (length != p - pos + cl + tl + rl + pl or pos + length > len(raw)
                or attrs & ATTR_PROPERTIES and not rl
                or attrs & 0xF0 or attrs & 3 == 3 or reserved):
            raise BatchFormatError(f"{where}: malformed header")
        if _native.crc32c(view[pos + 4:pos + length]) != crc:
            raise BatchFormatError(f"{where}: checksum mismatch")
        if offset <= previous or not header.first_offset <= offset <= header.last_offset:
            raise BatchFormatError(f"{where}: offset out of order or outside "
                                   f"{header.first_offset}..{header.last_offset}")
        previous = offset
        if ts >= TIMESTAMP_END_MS:
            raise BatchFormatError(f"{where}: timestamp {ts} ms is not before the year 10000")
        t, q = p + cl, p + cl + tl
        records.append(Record(offset, ts, attrs & 3, bool(attrs & 4), bytes(view[p:t]),
                              bytes(view[t:q]), bytes(view[q + rl:pos + length]),
                              bytes(view[q:q + rl])))
        pos += length
    if len(records) != header.record_count:
        raise BatchFormatError(f"{path}: {len(records)} records, the header says "
                               f"{header.record_count}")
    if records and (records[0].offset != header.first_offset
                    or records[-1].offset != header.last_offset):
        raise BatchFormatError(f"{path}: records {records[0].offset}..{records[-1].offset}, the "
                               f"header says {header.first_offset}..{header.last_offset}")
    stamps = [r.timestamp_ms for r in records]
    if stamps and (min(stamps) != header.min_timestamp_ms or max(stamps) != header.max_timestamp_ms):
        raise BatchFormatError(f"{path}: timestamps {min(stamps)}..{max(stamps)}, the header says "
                               f"{header.min_timestamp_ms}..{header.max_timestamp_ms}")
    return records


def read_batch_file(path: str) -> tuple[BatchHeader, list[Record]]:
    """Read the batch file at ``path``: its header and its records, everything checked, as
    ``read_batch_raw`` checks a batch (one zstd frame and nothing after it, not even a
    skippable frame); ``BatchFormatError`` naming the file for anything wrong (an unknown
    batch or log format version included)."""
    try:
        with open(path, "rb") as fh:
            blob = fh.read()
    except OSError as exc:
        raise BatchFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    header, raw = read_batch_raw(blob, path)
    del blob
    return header, parse_records(raw, header, path)


def read_header_file(path: str) -> BatchHeader:
    """The header of the batch file at ``path`` (checked; the records are not read)."""
    try:
        with open(path, "rb") as fh:
            reader = zstandard.ZstdDecompressor().stream_reader(fh)
            first = _read_exactly(reader, FIXED_SIZE, path, "the header")
            hlen = struct.unpack_from("<H", first, 10)[0]
            return decode_header(first + _read_exactly(reader, max(hlen - FIXED_SIZE, 0), path,
                                                        "the header"), path)
    except zstandard.ZstdError as exc:
        raise BatchFormatError(f"{path}: not a valid zstd stream: {exc}") from None
    except OSError as exc:
        raise BatchFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None


def check_batch_file(path: str) -> BatchHeader:
    """The header of the batch file at ``path`` once all of it is checked as ``read_batch_raw``
    checks a batch (one zstd frame and nothing after it, the raw length, the records' CRC32C;
    not each record), streamed: memory stays small whatever the batch's size (fed to zstd in
    ``_UNSIZED_STEP`` pieces, so no piece expands to more than some MiB). BatchFormatError,
    naming the file and what is wrong, for anything else (a torn copy)."""
    d = zstandard.ZstdDecompressor().decompressobj(read_across_frames=False)
    head, header, crc, raw, extra = b"", None, 0, 0, 0
    try:
        with open(path, "rb") as fh:
            while not d.eof and (block := fh.read(64 * _UNSIZED_STEP)):
                for i in range(0, len(block), _UNSIZED_STEP):
                    if d.eof:
                        extra += len(block) - i
                        break
                    out = d.decompress(block[i:i + _UNSIZED_STEP])
                    if header is None:
                        head += out
                        hlen = max(struct.unpack_from("<H", head, 10)[0], FIXED_SIZE) \
                            if len(head) >= FIXED_SIZE else 1 << 16
                        if len(head) < hlen:
                            continue
                        header = decode_header(head[:hlen], path)
                        out = head[hlen:]
                    raw += len(out)
                    if raw > header.raw_length:
                        raise BatchFormatError(f"{path}: more than the {header.raw_length} raw "
                                               f"bytes the header announces")
                    crc = _native.crc32c(out, crc)
            extra += len(d.unused_data) + len(fh.read(1))
    except zstandard.ZstdError as exc:
        raise BatchFormatError(f"{path}: not a valid zstd stream: {exc}") from None
    except OSError as exc:
        raise BatchFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not d.eof:
        raise BatchFormatError(f"{path}: not a valid zstd stream: it ends inside its frame")
    if extra:
        raise BatchFormatError(f"{path}: not a valid zstd stream: bytes after its frame")
    if header is None:
        raise BatchFormatError(f"{path}: ends inside the header")
    if raw < header.raw_length:
        raise BatchFormatError(f"{path}: ends inside the records ({raw} of the "
                               f"{header.raw_length} bytes the header announces)")
    if crc != header.raw_crc32c:
        raise BatchFormatError(f"{path}: the records' checksum does not match the header")
    return header


def records_id(header: BatchHeader) -> str:
    """What names a batch's records whatever their compression: first and last offset, raw
    length and raw CRC32C (``5-42-6144-1a2b3c4d``)."""
    return (f"{header.first_offset}-{header.last_offset}-{header.raw_length}-"
            f"{header.raw_crc32c:08x}")


def _check_raw(raw: bytes, header: BatchHeader, path: str) -> None:
    if _native.crc32c(raw) != header.raw_crc32c:
        raise BatchFormatError(f"{path}: the records' checksum does not match the header")


def _decompress(blob: bytes, path: str) -> bytes:
    """The content of the one zstd frame ``blob`` must be, refused when the frame declares or
    holds more than a batch can (before that much is allocated) or when bytes follow it."""
    size = zstandard.frame_content_size(blob)
    if size > MAX_BATCH_SIZE:
        raise BatchFormatError(f"{path}: its zstd frame declares {size} bytes, more than a "
                               f"batch holds ({MAX_BATCH_SIZE})")
    if size >= 0:
        try:
            return zstandard.ZstdDecompressor().decompress(blob, allow_extra_data=False)
        except zstandard.ZstdError:
            pass   # the bounded read below tells what is wrong (bytes after the frame?)
    # A frame that does not declare its size (edgebroker always writes it): a bounded read.
    d = zstandard.ZstdDecompressor().decompressobj(read_across_frames=False)
    view, parts, total, pos = memoryview(blob), [], 0, 0
    while not d.eof and pos < len(view):
        part = d.decompress(view[pos:pos + _UNSIZED_STEP])
        pos += _UNSIZED_STEP
        total += len(part)
        if total > MAX_BATCH_SIZE:
            raise BatchFormatError(f"{path}: its zstd frame holds more than a batch "
                                   f"({MAX_BATCH_SIZE} bytes)")
        parts.append(part)
    if not d.eof:
        raise BatchFormatError(f"{path}: not a valid zstd stream: it ends inside its frame")
    extra = len(d.unused_data) + max(len(view) - pos, 0)
    if extra:
        raise BatchFormatError(f"{path}: not a valid zstd stream: {extra} bytes after its "
                               f"frame")
    return b"".join(parts)


def read_batch_raw(blob: bytes, path: str) -> tuple[BatchHeader, memoryview]:
    """The header and the raw record bytes of the batch in ``blob``, everything but the
    records themselves checked (the records' CRC32C included); ``parse_records`` or a faster
    walk of its own does the rest."""
    try:
        data = _decompress(blob, path)
    except zstandard.ZstdError as exc:
        raise BatchFormatError(f"{path}: not a valid zstd stream: {exc}") from None
    header = decode_header(data, path)
    hlen = struct.unpack_from("<H", data, 10)[0]   # checked by decode_header
    held = len(data) - hlen
    if held < header.raw_length:
        raise BatchFormatError(f"{path}: ends inside the records ({held} of the "
                               f"{header.raw_length} bytes the header announces)")
    if held > header.raw_length:
        raise BatchFormatError(f"{path}: {held - header.raw_length} bytes after the "
                               f"{header.raw_length} raw bytes the header announces")
    raw = memoryview(data)[hlen:]   # not copied
    _check_raw(raw, header, path)
    return header, raw


__all__ = ["BatchHeader", "BatchFormatError", "read_batch_file", "read_header_file", "records_id",
           "check_batch_file",
           "read_batch_raw", "parse_records", "write_batch", "object_name", "check_gateway_id",
           "MAGIC", "BATCH_VERSION", "SUFFIX"]
