"""Cutting a batch out of a sealed segment and writing it as a batch file.

``plan`` walks the segment's records from the first one to upload (every record's structure and
CRC checked by the native scanner; damaged regions are left out and reported through the log)
and decides where the batch ends: at ``max_bytes`` of records (at least one record), at the
segment's end, or at the offset an intent file recorded. It keeps only the file ranges the
records lie in, so memory does not grow with the batch. ``build`` reads those ranges twice
(once for the CRC32C the header carries, once through the compressor) and writes the file,
fsynced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from edgebroker import _native
from edgebroker.commitlog import scanner
from edgebroker.commitlog.format import FORMAT_VERSION, Damage, UploadSource
from edgebroker.files import open_replaced
from edgebroker.uploader.batch import BatchHeader, object_name, write_batch

READ_CHUNK = 1024 * 1024


@dataclass(slots=True)
class Plan:
    """One batch: its offsets, figures and where its record bytes lie in the segment file."""

    first: int = -1
    last: int = -1
    count: int = 0
    first_ts: int = 0
    min_ts: int = 0
    max_ts: int = 0
    raw_length: int = 0
    spans: list[list[int]] = field(default_factory=list)  # [position, length], in file order
    log_format_version: int = FORMAT_VERSION  # of the segment the records come from

    def add(self, offset: int, ts: int, position: int, length: int) -> None:
        if self.count == 0:
            self.first, self.first_ts, self.min_ts, self.max_ts = offset, ts, ts, ts
        self.last = offset
        self.count += 1
        self.min_ts = min(self.min_ts, ts)
        self.max_ts = max(self.max_ts, ts)
        self.raw_length += length
        if self.spans and sum(self.spans[-1]) == position:
            self.spans[-1][1] += length
        else:
            self.spans.append([position, length])


def plan(src: UploadSource, start: int, max_bytes: int, last: int | None,
         report=lambda damage: None) -> Plan:
    """The batch from the first record at or after ``start`` in ``src``: up to ``last``
    included when given (an intent's range), else as many records as fit in ``max_bytes``
    (at least one) up to the segment's end. ``report(Damage)`` is told of damaged regions."""
    out = scanner.new_scan_buffer()
    step = scanner.scan_step(None, out, src.version)
    words = _native.SCAN_ENTRY_WORDS
    batch = Plan(log_format_version=src.version)
    for event in scanner.walk(src.fd, src.position, src.size, start, 0, step, src.path,
                              version=src.version):
        if event[0] != scanner.DATA:
            report(event[1])
            continue
        res = event[2]
        for k in range(0, res.matched * words, words):
            offset, ts, position, length, _meta = out[k:k + words]
            if last is not None:
                if offset > last:
                    return batch
            elif batch.count and batch.raw_length + length > max_bytes:
                return batch
            batch.add(offset, ts, position, length)
            if offset == last:
                return batch
    return batch


def _chunks(fd: int, spans: list[list[int]]):
    for position, length in spans:
        end = position + length
        while position < end:
            data = os.pread(fd, min(READ_CHUNK, end - position), position)
            if not data:
                raise OSError(f"segment file ends at {position}, expected data up to {end}")
            position += len(data)
            yield data


def header_for(batch: Plan, fd: int, gateway_id: str, gap_first: int, gap_length: int) -> BatchHeader:
    crc = 0
    for chunk in _chunks(fd, batch.spans):
        crc = _native.crc32c(chunk, crc)
    return BatchHeader(gateway_id, batch.first, batch.last, batch.count, batch.min_ts,
                       batch.max_ts, batch.raw_length, crc, gap_first, gap_length,
                       batch.log_format_version)


def build(batch: Plan, fd: int, header: BatchHeader, path: str, dir_fd: int = -1) -> int:
    """Write the batch file ``path`` (replaced), fsynced, and its folder ``dir_fd`` fsynced
    (when given) for a name new there; its size. Durable before the put, as the intent file
    is: after a power cut between the put and the mark, the batch is shipped again from this
    file when ``retention_bytes`` has deleted its records meanwhile (uploader.py)."""
    with os.fdopen(open_replaced(path, 0o644), "wb") as fh:     # (a FIFO there: replaced)
        size = write_batch(fh, header, _chunks(fd, batch.spans))
        fh.flush()
        os.fsync(fh.fileno())
    if dir_fd >= 0:
        os.fsync(dir_fd)
    return size


def key_for(batch: Plan, prefix: str, gateway_id: str, life: str,
            recorded: str | None = None) -> str:
    """The batch's object name, with the log's ``life`` id; ``recorded`` (the name an intent
    file holds for the batch) when it is this batch's name from before life ids: the batch may
    be stored under it already."""
    if recorded == object_name(prefix, gateway_id, batch.first, batch.last, batch.first_ts):
        return recorded
    return object_name(prefix, gateway_id, batch.first, batch.last, batch.first_ts, life)


__all__ = ["Plan", "plan", "header_for", "build", "key_for", "Damage"]
