"""Makes the golden logs in this directory (run it from the repository root after a deliberate
format change, with a new format version):

    python tests/commitlog/golden/make_golden.py

``v1/``            60 records in 2 segments, as the writer leaves them after a clean close
``v1-torn/``       the last record cut in the middle (a crash during a write)
``v1-flipped/``    one byte of record 20's topic flipped (a bad sector): records 19 and 21 survive
``v1-noindex/``    the first segment's index missing
``v1-zerotail/``   4 KiB of zeros after the last record (what some filesystems leave after a crash)

The test (test_golden.py) checks that the writer still produces v1/ byte for byte and that each
variant reads as documented there.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000
N = 60


def record(i: int) -> tuple:
    """(timestamp_ms, qos, retain, client_id, topic, payload) of record i."""
    return (T0 + i * 1000, i % 3, i % 4 == 0, b"dev-%d" % (i % 3), b"golden/%d" % (i % 4),
            (b"payload %d " % i) * (i % 5 + 1))


def write_v1(directory: Path) -> None:
    from edgebroker.commitlog import CommitLog, LogOptions
    log = CommitLog.open(str(directory), LogOptions(segment_bytes=4096))
    for i in range(N):
        log.append(*record(i))
    log.write_pending()
    log.close()
    for extra in (".lock", "recovery-point"):
        (directory / extra).unlink(missing_ok=True)


def segment_records(path: Path) -> list[tuple[int, int]]:
    """(position, length) of each record of a segment (the files here are small and valid)."""
    data = path.read_bytes()
    out, pos = [], 32
    while pos + 34 <= len(data):
        length = int.from_bytes(data[pos + 4:pos + 8], "little")
        out.append((pos, length))
        pos += length
    return out


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    for name in ("v1", "v1-torn", "v1-flipped", "v1-noindex", "v1-zerotail"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    write_v1(HERE / "v1")
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


if __name__ == "__main__":
    main()
