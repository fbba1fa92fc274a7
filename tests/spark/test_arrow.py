"""edgebroker.spark.arrow: one batch file into Arrow, checked as batch.py checks it."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgebroker.spark.arrow import SCHEMA, batch_days, batch_summary, batch_to_arrow, read_batch
from edgebroker.uploader.batch import BatchFormatError, BatchHeader, read_batch_file, write_batch

GOLDEN = Path(__file__).resolve().parents[1] / "uploader" / "golden"


@pytest.mark.parametrize("name", ["v1-plain.ebb.zst", "v1-gap.ebb.zst", "v2-props.ebb.zst"])
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
        assert row["properties"] == properties_row(r.properties)
    blob = (GOLDEN / name).read_bytes()
    assert batch_to_arrow(blob, name)[1].equals(table)


def properties_row(stored: bytes) -> dict | None:
    """What the ``properties`` column should hold, from the stored bytes by the mqtt module."""
    from edgebroker.mqtt import properties as p
    props = p.decode_body(stored)
    if props is None:
        return None
    return {"payload_format": props.get(p.PAYLOAD_FORMAT),
            "message_expiry": props.get(p.MESSAGE_EXPIRY),
            "content_type": props.get(p.CONTENT_TYPE),
            "response_topic": props.get(p.RESPONSE_TOPIC),
            "correlation_data": props.get(p.CORRELATION_DATA),
            "user_properties": [{"name": k, "value": v}
                                for k, v in props.get(p.USER_PROPERTY, [])]}


def test_golden_v2_batch_has_the_properties_column_filled():
    header, table = read_batch(str(GOLDEN / "v2-props.ebb.zst"))
    assert header.log_format_version == 2
    rows = {row["offset"]: row["properties"] for row in table.to_pylist()}
    assert rows[30] is None                      # one in three has none
    assert rows[31] == {"payload_format": 1, "message_expiry": 631,
                        "content_type": "application/json", "response_topic": "reply/31",
                        "correlation_data": b"\xc0\x1f",
                        "user_properties": [{"name": "unit", "value": "C"},
                                            {"name": "seq", "value": "31"}]}
    assert rows[32]["content_type"] == "application/json" and rows[32]["message_expiry"] is None
    # The version 1 batches: the column is there, all null.
    _, old = read_batch(str(GOLDEN / "v1-plain.ebb.zst"))
    assert old.column("properties").null_count == old.num_rows


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
    blob = rewrite(BatchHeader(**{**fields, "log_format_version": 3}), raw)
    with pytest.raises(BatchFormatError, match=r"^future\.ebb\.zst: records of log format "
                                               r"version 3; this edgebroker reads versions 1, 2"):
        batch_to_arrow(blob, "future.ebb.zst")


def test_damage_is_refused_naming_the_file():
    header, raw = golden_raw()
    damaged = bytearray(raw)
    damaged[-1] ^= 0xFF   # the last payload byte: the records' CRC no longer matches
    with pytest.raises(BatchFormatError, match=r"^bad\.ebb\.zst: the records' checksum"):
        batch_to_arrow(rewrite(header, bytes(damaged)), "bad.ebb.zst")
    with pytest.raises(BatchFormatError, match=r"^cut\.ebb\.zst: not a valid zstd stream"):
        batch_to_arrow((GOLDEN / "v1-plain.ebb.zst").read_bytes()[:-20], "cut.ebb.zst")


def build(records: list[tuple], gateway: str = "gw-1") -> tuple[BatchHeader, bytes]:
    """(offset, timestamp ms, qos, retain, client id, topic, payload[, properties]) tuples as
    a batch's raw bytes (log format version 2), each record laid out as docs/log-format.md
    says."""
    from edgebroker import _native
    raw = b"".join(bytes(_native.record_header(o, ts, q | (4 if r else 0), c, t, p, *props)) + c
                   + t + b"".join(props) + p for o, ts, q, r, c, t, p, *props in records)
    stamps = [rec[1] for rec in records]
    return BatchHeader(gateway, records[0][0], records[-1][0], len(records), min(stamps),
                       max(stamps), len(raw), _native.crc32c(raw)), raw


def test_the_whole_batch_decode_equals_the_record_by_record_one():
    from edgebroker.spark.arrow import _table
    from edgebroker.uploader.batch import parse_records
    from edgebroker.mqtt import properties as p
    records = [(10 + 2 * i, 1_700_000_000_000 + (i * 7919) % 100_000 * 1000, i % 3, i % 5 == 0,
                b"" if i % 7 == 0 else f"client-{i}".encode(),
                f"t/\u00e9t\u00e9/{i % 13}".encode() * (1 + i % 3),
                bytes(range(i % 256)) * (i % 4),
                p.encode_body({p.MESSAGE_EXPIRY: i, p.USER_PROPERTY: [("k", "v" * (i % 9))]}
                              if i % 4 else None)) for i in range(500)]
    header, raw = build(records)
    _, table = batch_to_arrow(rewrite(header, raw), "many.ebb.zst")
    assert table.equals(_table(header, parse_records(raw, header, "many.ebb.zst"), "x"))
    assert table.column("properties")[0].as_py() is None
    assert table.column("properties")[5].as_py()["user_properties"] == [
        {"name": "k", "value": "v" * 5}]
    assert table.column("payload")[5].as_py() == bytes(range(5))
    assert table.column("payload")[0].as_py() == b"" and table.column("client_id")[0].as_py() == ""
    assert table.column("topic")[1].as_py() == "t/\u00e9t\u00e9/1" * 2
    # The first pass's check: the same header, the days of the records (spread over three).
    days_header, days = batch_days(rewrite(header, raw), "many.ebb.zst")
    assert days_header == header
    assert days == sorted(set(table.column("date").to_pylist())) and len(days) == 3


def test_the_offsets_missing_inside_a_batch_are_its_holes(monkeypatch):
    """Records left out of a batch (damaged when it was cut): each run of missing offsets
    with the timestamp of the record after it, by the scan and by the record-by-record read."""
    from edgebroker.spark import arrow
    t = 1_700_000_000_000
    header, raw = build([(o, t + o, 0, False, b"c", b"t", b"p") for o in (0, 1, 4, 5, 9)])
    want = [(2, 2, t + 4), (6, 3, t + 9)]
    assert batch_summary(rewrite(header, raw), "h.ebb.zst")[2] == want
    monkeypatch.setattr(arrow, "_scan", lambda header, raw: None)
    assert batch_summary(rewrite(header, raw), "h.ebb.zst")[2] == want
    whole, raw = build([(o, t, 0, False, b"c", b"t", b"p") for o in range(3)])
    assert batch_summary(rewrite(whole, raw), "w.ebb.zst")[2] == []


@pytest.mark.parametrize("damage, message", [
    ("record_crc", r"^d\.ebb\.zst: record at raw position \d+ \(offset 3\): checksum mismatch"),
    ("count", r"^d\.ebb\.zst: 5 records, the header says 6"),
    ("max_ts", r"^d\.ebb\.zst: timestamps 1000\.\.1004, the header says 1000\.\.1005"),
    ("not_utf8", r"^d\.ebb\.zst: a topic or client id is not UTF-8"),
])
def test_a_bad_record_in_a_good_frame_is_refused_with_what_and_where(damage, message):
    records = [(i, 1000 + i, 1, False, b"c", b"t/\xff" if damage == "not_utf8" and i == 2
                else b"t", b"payload") for i in range(5)]
    header, raw = build(records)
    fields = {f: getattr(header, f) for f in header.__dataclass_fields__}
    if damage == "record_crc":
        raw = bytearray(raw)
        raw[3 * len(raw) // 5 + 40] ^= 1   # a byte of record 3 (all records are the same size)
        raw = bytes(raw)
        from edgebroker import _native
        fields["raw_crc32c"] = _native.crc32c(raw)
    elif damage == "count":
        fields["record_count"] = 6
    elif damage == "max_ts":
        fields["max_timestamp_ms"] = 1005
    blob = rewrite(BatchHeader(**fields), raw)
    with pytest.raises(BatchFormatError, match=message):
        batch_to_arrow(blob, "d.ebb.zst")
    with pytest.raises(BatchFormatError, match=message):   # the ingest job's first pass
        batch_days(blob, "d.ebb.zst")


def test_properties_that_do_not_decode_are_refused_naming_the_file_and_offset():
    """The log stores properties as the core gave them; a reader that shows them says where
    bytes that are not MQTT 5.0 properties are (the batch is then quarantined by ingest)."""
    records = [(i, 1000 + i, 0, False, b"c", b"t", b"x", b"\x7f\x00" if i == 2 else b"")
               for i in range(4)]
    header, raw = build(records)
    with pytest.raises(BatchFormatError, match=r"^p\.ebb\.zst: record at offset 2: its "
                                               r"properties do not decode: .*0x7f"):
        batch_to_arrow(rewrite(header, raw), "p.ebb.zst")
    with pytest.raises(BatchFormatError, match=r"^p\.ebb\.zst: record at offset 2: its "
                                               r"properties do not decode"):
        batch_days(rewrite(header, raw), "p.ebb.zst")    # the ingest job's first pass


def good_blob(gateway: str = "gw-1", stamp: int = 1_700_000_000_000) -> bytes:
    return rewrite(*build([(0, stamp, 0, False, b"c", b"t", b"p"),
                           (1, stamp + 1, 0, False, b"c", b"t", b"q")], gateway))


def refused_by_both(blob: bytes, message: str) -> None:
    """Both readers of the ingest job (the first pass and the decode) refuse ``blob`` with a
    BatchFormatError naming it, not some other exception."""
    for reader in (batch_days, batch_to_arrow):
        with pytest.raises(BatchFormatError, match=r"^odd\.ebb\.zst: " + message):
            reader(blob, "odd.ebb.zst")


def test_bytes_after_the_frame_are_refused():
    """Two batches one after the other, or junk after one, once read as the first alone."""
    good = good_blob()
    assert batch_to_arrow(good, "g.ebb.zst")[1].num_rows == 2
    refused_by_both(good + b"JUNK", r"not a valid zstd stream: 4 bytes after its frame$")
    refused_by_both(good + good, r"not a valid zstd stream: \d+ bytes after its frame$")


def test_a_frame_declaring_more_than_a_batch_holds_is_refused_before_allocating():
    # A zstd frame header declaring 2**45 content bytes (8-byte size field), then one empty
    # last raw block: decompressing would first allocate 32 TiB.
    frame = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xE0]) + (1 << 45).to_bytes(8, "little") + \
        bytes([1, 0, 0])
    refused_by_both(frame, r"its zstd frame declares 35184372088832 bytes, more than a batch "
                           r"holds \(1073741976\)")


def test_a_frame_without_its_size_is_read_with_a_bound(monkeypatch):
    import zstandard
    from edgebroker.uploader import batch
    plain = zstandard.ZstdDecompressor().decompress(good_blob())
    unsized = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    unsized = unsized.compress(plain) + unsized.flush()
    assert zstandard.frame_content_size(unsized) == -1
    assert batch_to_arrow(unsized, "u.ebb.zst")[1].num_rows == 2
    refused_by_both(unsized + b"JUNK", r"not a valid zstd stream: 4 bytes after its frame")
    refused_by_both(unsized[:-3], r"not a valid zstd stream: it ends inside its frame")
    monkeypatch.setattr(batch, "MAX_BATCH_SIZE", len(plain) - 1)
    refused_by_both(unsized, rf"its zstd frame holds more than a batch \({len(plain) - 1} ")


def test_a_header_with_impossible_counts_or_a_bad_gateway_id_is_refused():
    header, raw = build([(5, 1000, 0, False, b"c", b"t", b"p")])
    fields = {f: getattr(header, f) for f in header.__dataclass_fields__}
    for change, message in [
            ({"record_count": 1 << 40}, r"1099511627776 records cannot lie in 37 raw bytes"),
            ({"record_count": 0}, r"no records \(a batch holds at least one\)"),
            ({"gateway_id": ""}, r"gateway id '' must not be empty"),
            ({"gateway_id": "../../x"}, r"gateway id '\.\./\.\./x' must be 1 to 64 of"),
            ({"first_offset": 1 << 63, "last_offset": 1 << 63}, r"offsets 9223372036854775808"),
            ({"gap_first": 3, "gap_length": 3}, r"offsets 5\.\.5 with a gap of 3 from 3 are "
                                                r"not possible")]:
        refused_by_both(rewrite(BatchHeader(**{**fields, **change}), raw), message)


@pytest.mark.parametrize("stamp", [253_402_300_800_000, 10**17, 1 << 63])
def test_a_timestamp_in_the_year_10000_or_later_is_refused_naming_the_record(stamp):
    """Such a timestamp has no date (Python's and Spark's stop at 9999) and, from about 10**16
    ms, no timestamp in microseconds: one reader raised OverflowError, the other wrapped it."""
    good = 253_402_300_799_999     # 9999-12-31T23:59:59.999Z is read
    assert batch_days(good_blob(stamp=good - 1), "g.ebb.zst")[1][-1].year == 9999
    records = [(0, good, 0, False, b"c", b"t", b"p"), (1, stamp, 0, False, b"c", b"t", b"p")]
    header, raw = build(records)
    refused_by_both(rewrite(header, raw), rf"record at raw position 37 \(offset 1\): timestamp "
                                          rf"{stamp} ms is not before the year 10000")
