"""Makes the golden upload batches in this directory (run it from the repository root after a
deliberate change of the batch format, with a new batch format version):

    python tests/uploader/golden/make_golden.py

``v1-plain.ebb.zst``  records 0..9 of gateway ``gw-golden``, no gap (log format version 1)
``v1-gap.ebb.zst``    records 20, 21, 23 and 24 (22 was damaged in the log), after a gap of
                      offsets 12..19 (deleted by retention_bytes before upload) (log format 1)
``v2-props.ebb.zst``  records 30..39 of log format version 2, two of every three with MQTT 5.0
                      properties (``properties(i)``)

The test (test_batch_format.py) checks that the writer still produces them byte for byte and
that the reader decodes them as listed here.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000
GATEWAY = "gw-golden"
# name: (offsets, gap_first, gap_length, log format version)
BATCHES = {"v1-plain.ebb.zst": (list(range(10)), 0, 0, 1),
           "v1-gap.ebb.zst": ([20, 21, 23, 24], 12, 8, 1),
           "v2-props.ebb.zst": (list(range(30, 40)), 0, 0, 2)}


def record(i: int) -> tuple:
    """(timestamp_ms, qos, retain, client_id, topic, payload) of record i."""
    return (T0 + i * 1000, i % 3, i % 4 == 0, b"dev-%d" % (i % 3), b"golden/%d" % (i % 4),
            (b"payload %d " % i) * (i % 5 + 1))


def properties(i: int, version: int) -> dict | None:
    """The MQTT 5.0 properties of record i in a batch of log format ``version`` (None: none)."""
    from edgebroker.mqtt import properties as p
    if version < 2 or i % 3 == 0:
        return None
    props = {p.CONTENT_TYPE: "application/json", p.USER_PROPERTY: [("unit", "C"), ("seq", str(i))]}
    if i % 3 == 1:
        props.update({p.PAYLOAD_FORMAT: 1, p.MESSAGE_EXPIRY: 600 + i,
                      p.RESPONSE_TOPIC: "reply/%d" % i, p.CORRELATION_DATA: bytes((0xC0, i))})
    return props


def record_bytes(i: int, version: int) -> bytes:
    from edgebroker import _native
    from edgebroker.mqtt.properties import encode_body
    ts, qos, retain, cid, topic, payload = record(i)
    props = encode_body(properties(i, version))
    return bytes(_native.record_header(i, ts, qos | (4 if retain else 0), cid, topic, payload,
                                       props)) + cid + topic + props + payload


def write(name: str, path: Path) -> None:
    from edgebroker import _native
    from edgebroker.uploader.batch import BatchHeader, write_batch
    offsets, gap_first, gap_length, version = BATCHES[name]
    raw = b"".join(record_bytes(i, version) for i in offsets)
    stamps = [record(i)[0] for i in offsets]
    header = BatchHeader(GATEWAY, offsets[0], offsets[-1], len(offsets), min(stamps), max(stamps),
                         len(raw), _native.crc32c(raw), gap_first, gap_length, version)
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
