"""Makes the golden upload batches in this directory (run it from the repository root after a
deliberate change of the batch format, with a new batch format version):

    python tests/uploader/golden/make_golden.py

``v1-plain.ebb.zst``  records 0..9 of gateway ``gw-golden``, no gap
``v1-gap.ebb.zst``    records 20, 21, 23 and 24 (22 was damaged in the log), after a gap of
                      offsets 12..19 (deleted by retention_bytes before upload)

The test (test_batch_format.py) checks that the writer still produces them byte for byte and
that the reader decodes them as listed here.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000
GATEWAY = "gw-golden"
# name: (offsets, gap_first, gap_length)
BATCHES = {"v1-plain.ebb.zst": (list(range(10)), 0, 0),
           "v1-gap.ebb.zst": ([20, 21, 23, 24], 12, 8)}


def record(i: int) -> tuple:
    """(timestamp_ms, qos, retain, client_id, topic, payload) of record i."""
    return (T0 + i * 1000, i % 3, i % 4 == 0, b"dev-%d" % (i % 3), b"golden/%d" % (i % 4),
            (b"payload %d " % i) * (i % 5 + 1))


def record_bytes(i: int) -> bytes:
    from edgebroker import _native
    ts, qos, retain, cid, topic, payload = record(i)
    return bytes(_native.record_header(i, ts, qos | (4 if retain else 0), cid, topic, payload)) \
        + cid + topic + payload


def write(name: str, path: Path) -> None:
    from edgebroker import _native
    from edgebroker.uploader.batch import BatchHeader, write_batch
    offsets, gap_first, gap_length = BATCHES[name]
    raw = b"".join(record_bytes(i) for i in offsets)
    stamps = [record(i)[0] for i in offsets]
    header = BatchHeader(GATEWAY, offsets[0], offsets[-1], len(offsets), min(stamps), max(stamps),
                         len(raw), _native.crc32c(raw), gap_first, gap_length)
    with open(path, "wb") as fh:
        # in uneven pieces, as the uploader's reads fall: the output must not depend on them
        write_batch(fh, header, [raw[:7], raw[7:100], raw[100:]])


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    for name in BATCHES:
        write(name, HERE / name)
        print(HERE / name)


if __name__ == "__main__":
    main()
