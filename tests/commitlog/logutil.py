"""Helpers for the commit log tests: a settable clock, records made from an index, an
independent reader of the on-disk format (struct + the stdlib, not the code under test)."""

from __future__ import annotations

import struct
from pathlib import Path

from edgebroker.commitlog import CommitLog, LogOptions

HEADER = 32
REC = struct.Struct("<IIQQBBHHI")
ENTRY = struct.Struct("<IIQ")


class Clock:
    def __init__(self, now: int = 1_700_000_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def options(**kw) -> LogOptions:
    base = dict(segment_bytes=4096, segment_ms=3_600_000, retention_bytes=1 << 30,
                retention_ms=7 * 86_400_000)
    base.update(kw)
    return LogOptions(**base)


def open_log(path: Path, clock: Clock | None = None, **kw) -> CommitLog:
    return CommitLog.open(str(path), options(**kw), clock or Clock())


def payload_for(i: int) -> bytes:
    return (b"payload-%d-" % i) * (i % 7)


def topic_for(i: int) -> bytes:
    return b"site/%d/sensor/%d" % (i % 3, i % 5)


def append_n(log: CommitLog, n: int, start_ts: int = 1_700_000_000_000, step_ms: int = 10) -> list:
    offsets = []
    for k in range(n):
        i = log.next_offset
        offsets.append(log.append(start_ts + k * step_ms, i % 3, i % 4 == 0, b"dev-%d" % (i % 11),
                                  topic_for(i), payload_for(i)))
    return offsets


def expected(i: int, ts: int) -> tuple:
    return (i, ts, i % 3, i % 4 == 0, b"dev-%d" % (i % 11), topic_for(i), payload_for(i))


def as_tuple(r) -> tuple:
    return (r.offset, r.timestamp_ms, r.qos, r.retain, r.client_id, r.topic, r.payload)


def segment_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*.seg"))


def parse_segment(path: Path) -> list[dict]:
    """Records of a segment file, read by this independent parser (stops at the first bad one).
    CRC32C is not in the stdlib, so it has its own small table version below."""
    data = path.read_bytes()
    assert data[:8] == b"EDGEBLOG"
    out = []
    pos = HEADER
    while pos + 34 <= len(data):
        crc, length, offset, ts, attrs, reserved, cl, tl, pl = REC.unpack_from(data, pos)
        if length < 34 or pos + length > len(data) or crc != crc32c(data[pos + 4:pos + length]):
            break
        head = 34
        rl = 0
        if attrs & 8:  # format version 2: properties, their length R after the 34 bytes
            rl = int.from_bytes(data[pos + 34:pos + 38], "little")
            head = 38
        body = data[pos + head:pos + length]
        out.append(dict(offset=offset, timestamp_ms=ts, qos=attrs & 3, retain=bool(attrs & 4),
                        client_id=body[:cl], topic=body[cl:cl + tl],
                        properties=body[cl + tl:cl + tl + rl], payload=body[cl + tl + rl:],
                        position=pos, payload_position=pos + head + cl + tl + rl))
        pos += length
    return out


def parse_index(path: Path) -> list[tuple[int, int, int]]:
    data = path.read_bytes()
    return [ENTRY.unpack_from(data, i) for i in range(0, len(data) - len(data) % 16, 16)]


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(position)
        b = fh.read(1)
        fh.seek(position)
        fh.write(bytes([b[0] ^ 0x5A]))

