"""edgebroker.spark.arrow: one batch file into Arrow, checked as batch.py checks it."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgebroker.spark.arrow import SCHEMA, batch_to_arrow, read_batch
from edgebroker.uploader.batch import BatchFormatError, BatchHeader, read_batch_file, write_batch

GOLDEN = Path(__file__).resolve().parents[1] / "uploader" / "golden"


@pytest.mark.parametrize("name", ["v1-plain.ebb.zst", "v1-gap.ebb.zst"])
def test_golden_batches_read_into_arrow_equal_the_records(name):
    path = str(GOLDEN / name)
    header, table = read_batch(path)
    _, records = read_batch_file(path)
    assert table.schema == SCHEMA and table.num_rows == len(records) == header.record_count
    rows = table.to_pylist()
    for row, r in zip(rows, records):
        assert row["gateway"] == header.gateway_id == "gw-golden"
        assert row["offset"] == r.offset
        assert row["timestamp"] == datetime.fromtimestamp(r.timestamp_ms / 1000, timezone.utc)
        assert row["date"] == row["timestamp"].date()
        assert (row["topic"], row["client_id"]) == (r.topic.decode(), r.client_id.decode())
        assert (row["qos"], row["retain"], row["payload"]) == (r.qos, r.retain, r.payload)
    blob = (GOLDEN / name).read_bytes()
    assert batch_to_arrow(blob, name)[1].equals(table)


def rewrite(header: BatchHeader, raw: bytes) -> bytes:
    out = io.BytesIO()
    write_batch(out, header, [raw])
    return out.getvalue()


def golden_raw() -> tuple[BatchHeader, bytes]:
    import zstandard
    data = zstandard.ZstdDecompressor().decompress((GOLDEN / "v1-plain.ebb.zst").read_bytes())
    header, _ = read_batch_file(str(GOLDEN / "v1-plain.ebb.zst"))
    return header, data[len(data) - header.raw_length:]


def test_an_unknown_log_format_version_is_refused_naming_the_file_and_version():
    header, raw = golden_raw()
    fields = {f: getattr(header, f) for f in header.__dataclass_fields__}
    blob = rewrite(BatchHeader(**{**fields, "log_format_version": 2}), raw)
    with pytest.raises(BatchFormatError, match=r"^future\.ebb\.zst: records of log format "
                                               r"version 2; this edgebroker reads version 1"):
        batch_to_arrow(blob, "future.ebb.zst")


def test_damage_is_refused_naming_the_file():
    header, raw = golden_raw()
    damaged = bytearray(raw)
    damaged[-1] ^= 0xFF   # the last payload byte: the records' CRC no longer matches
    with pytest.raises(BatchFormatError, match=r"^bad\.ebb\.zst: the records' checksum"):
        batch_to_arrow(rewrite(header, bytes(damaged)), "bad.ebb.zst")
    with pytest.raises(BatchFormatError, match=r"^cut\.ebb\.zst: not a valid zstd stream"):
        batch_to_arrow((GOLDEN / "v1-plain.ebb.zst").read_bytes()[:-20], "cut.ebb.zst")
