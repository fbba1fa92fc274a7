"""Makes the golden logs in this directory (run it from the repository root after a deliberate
format change, with a new format version):

    python tests/commitlog/golden/make_golden.py

Format version 1 (written by edgebroker before format version 2; the writer no longer makes
them, so ``v1/`` is kept as it is and only its damaged copies are made again from it):

``v1/``            60 records in 2 segments, as the writer left them after a clean close
``v1-torn/``       the last record cut in the middle (a crash during a write)
``v1-flipped/``    one byte of record 20's topic flipped (a bad sector): records 19 and 21 survive
``v1-noindex/``    the first segment's index missing
``v1-zerotail/``   4 KiB of zeros after the last record (what some filesystems leave after a crash)

Format version 2 (records may carry MQTT 5.0 properties):

``v2/``            60 records in 2 segments, two of every three with properties (``record2``)
``v2-badr/``       record 10's properties length R one too small, its CRC made right again:
                   only the rule that R is what the other lengths leave finds it
``v2-flipped/``    one byte of record 20's properties flipped: its CRC no longer matches
``mixed/``         ``v1/`` opened by the current writer and 30 records more appended
                   (``record2(60..89)``): the two version 1 segments stay as they are, the new
                   records go to version 2 segments after them (the upgrade)

The test (test_golden.py) checks that the writer produces ``v2/`` and ``mixed/`` byte for
byte, that each log reads as documented there, and ``v1/`` still does.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000
N = 60
N_MIXED = 30


def record(i: int) -> tuple:
    """(timestamp_ms, qos, retain, client_id, topic, payload) of record i."""
    return (T0 + i * 1000, i % 3, i % 4 == 0, b"dev-%d" % (i % 3), b"golden/%d" % (i % 4),
            (b"payload %d " % i) * (i % 5 + 1))


def properties(i: int) -> dict | None:
    """The MQTT 5.0 properties of record i of the version 2 logs (None for one in three)."""
    from edgebroker.mqtt import properties as p
    if i % 3 == 0:
        return None
    props = {p.CONTENT_TYPE: "text/plain", p.USER_PROPERTY: [("unit", "C"), ("seq", str(i))]}
    if i % 3 == 1:
        props.update({p.PAYLOAD_FORMAT: 1, p.MESSAGE_EXPIRY: 3600 + i,
                      p.RESPONSE_TOPIC: "reply/dev-%d" % (i % 3),
                      p.CORRELATION_DATA: bytes((0, i))})
    return props


def record2(i: int) -> tuple:
    """``record(i)`` and its properties as the log keeps them (b"" for none)."""
    from edgebroker.mqtt.properties import encode_body
    return (*record(i), encode_body(properties(i)))


def _finish(directory: Path) -> None:
    for extra in (".lock", "recovery-point"):
        (directory / extra).unlink(missing_ok=True)


def write_v2(directory: Path) -> None:
    from edgebroker.commitlog import CommitLog, LogOptions
    log = CommitLog.open(str(directory), LogOptions(segment_bytes=4096))
    for i in range(N):
        log.append(*record2(i))
    log.write_pending()
    log.close()
    _finish(directory)


def write_mixed(directory: Path) -> None:
    """A copy of ``v1/`` with ``N_MIXED`` records appended by the current writer."""
    from edgebroker.commitlog import CommitLog, LogOptions
    shutil.copytree(HERE / "v1", directory)
    log = CommitLog.open(str(directory), LogOptions(segment_bytes=4096))
    for i in range(N, N + N_MIXED):
        log.append(*record2(i))
    log.write_pending()
    log.close()
    _finish(directory)


def segment_records(path: Path) -> list[tuple[int, int]]:
    """(position, length) of each record of a segment (the files here are small and valid)."""
    data = path.read_bytes()
    out, pos = [], 32
    while pos + 34 <= len(data):
        length = int.from_bytes(data[pos + 4:pos + 8], "little")
        out.append((pos, length))
        pos += length
    return out


def find_record(directory: Path, offset: int) -> tuple[Path, int, int]:
    """(segment file, position, length) of the record ``offset`` in a valid log."""
    for seg in sorted(directory.glob("*.seg")):
        for pos, length in segment_records(seg):
            if int.from_bytes(seg.read_bytes()[pos + 8:pos + 16], "little") == offset:
                return seg, pos, length
    raise LookupError(offset)


def _damage(directory: Path, offset: int, change) -> None:
    """Apply ``change(bytearray of the record)`` to record ``offset`` in place."""
    seg, pos, length = find_record(directory, offset)
    data = bytearray(seg.read_bytes())
    rec = data[pos:pos + length]
    change(rec)
    data[pos:pos + length] = rec
    seg.write_bytes(bytes(data))


def _bad_r(rec: bytearray) -> None:
    from edgebroker import _native
    r = int.from_bytes(rec[34:38], "little")
    rec[34:38] = (r - 1).to_bytes(4, "little")
    rec[:4] = _native.crc32c(bytes(rec[4:])).to_bytes(4, "little")


def _flip_property(rec: bytearray) -> None:
    cl, tl = (int.from_bytes(rec[k:k + 2], "little") for k in (26, 28))
    rec[38 + cl + tl + 3] ^= 0xFF  # inside the first property's value


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    for name in ("v1-torn", "v1-flipped", "v1-noindex", "v1-zerotail", "v2", "v2-badr",
                 "v2-flipped", "mixed"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    segs = sorted((HERE / "v1").glob("*.seg"))
    for name in ("v1-torn", "v1-flipped", "v1-noindex", "v1-zerotail"):
        shutil.copytree(HERE / "v1", HERE / name)
    last = HERE / "v1-torn" / segs[-1].name
    pos, length = segment_records(last)[-1]
    os.truncate(last, pos + length // 2)
    first = HERE / "v1-flipped" / segs[0].name
    pos, length = segment_records(first)[20]
    data = bytearray(first.read_bytes())
    data[pos + 34 + 5 + 3] ^= 0xFF  # in "golden/N", after the 5-byte client id
    first.write_bytes(bytes(data))
    (HERE / "v1-noindex" / segs[0].with_suffix(".idx").name).unlink()
    with open(HERE / "v1-zerotail" / segs[-1].name, "ab") as fh:
        fh.write(bytes(4096))

    write_v2(HERE / "v2")
    for name, offset, change in (("v2-badr", 10, _bad_r), ("v2-flipped", 20, _flip_property)):
        shutil.copytree(HERE / "v2", HERE / name)
        _damage(HERE / name, offset, change)
    write_mixed(HERE / "mixed")


if __name__ == "__main__":
    main()
