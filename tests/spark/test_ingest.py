"""The ingest job on Spark local[2], on batches written by a real broker's uploader: the tables
hold every record once; a re-run, a batch copied under another name and a lost checkpoint add
no row; topic_hourly equals a count done in Python, also after a crash between the two writes;
a run over more than a thousand partitions works; a corrupt batch, one of an unknown log format
version and odd files (bytes after the frame, impossible headers, far timestamps) are
quarantined and the rest ingested; header gaps and offsets missing inside a batch land in
`gaps`."""

from __future__ import annotations

import shutil
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgebroker.spark.ingest import GAPS_DDL, HOURLY_DDL, MESSAGES_DDL, QUARANTINE_DDL, \
    clean_batches, ingest_once
from edgebroker.uploader.batch import BatchHeader, object_name, read_batch_file

from spark.test_arrow import build, golden_raw, good_blob, rewrite
from uploader.test_uploader import GATEWAY, publish, upload_config, uploaded, wait_until

GOLDEN = Path(__file__).resolve().parents[1] / "uploader" / "golden"


def batches(landing: Path) -> list[Path]:
    return sorted(landing.rglob("*.ebb.zst"))


def table(spark, warehouse: Path, name: str) -> list:
    schema = {"messages": MESSAGES_DDL, "topic_hourly": HOURLY_DDL, "gaps": GAPS_DDL,
              "quarantine": QUARANTINE_DDL}.get(name)
    reader = spark.read.schema(schema) if schema else spark.read
    return reader.parquet(str(warehouse / name)).collect()


def expected_hourly(landing_batches: list[Path]) -> dict:
    """(gateway, topic, hour) -> [messages, bytes, first ms, last ms], counted in Python."""
    out: dict = defaultdict(lambda: [0, 0, None, None])
    for path in landing_batches:
        header, records = read_batch_file(str(path))
        for r in records:
            hour = r.timestamp_ms // 3_600_000 * 3_600_000
            e = out[(header.gateway_id, r.topic.decode(), hour)]
            e[0] += 1
            e[1] += len(r.payload)
            e[2] = r.timestamp_ms if e[2] is None else min(e[2], r.timestamp_ms)
            e[3] = r.timestamp_ms if e[3] is None else max(e[3], r.timestamp_ms)
    return dict(out)


def ms(t: datetime) -> int:
    return round(t.timestamp() * 1000)


def test_broker_batches_ingested_once_however_often_they_are_read(spark, broker, tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    landing.mkdir()
    b = broker(upload=upload_config(landing, batch_max_age=1))
    publish(b, 0, 300, size=80)
    wait_until(lambda: uploaded(b) == 300, what="the first batch")
    publish(b, 300, 200, size=120)
    wait_until(lambda: uploaded(b) == 500, what="the second batch")
    b.stop()
    files = batches(landing)
    assert len(files) >= 2

    report = ingest_once(spark, str(landing), str(warehouse))
    assert report["files_new"] == len(files) and report["batches"] == len(files)
    assert (report["records"], report["rows_added"], report["duplicates"]) == (500, 500, 0)
    assert report["quarantined"] == [] and report["gaps_added"] == 0
    # No gap, nothing quarantined: both tables are there, empty (their documented reads
    # failed with PATH_NOT_FOUND until their first row).
    assert table(spark, warehouse, "gaps") == table(spark, warehouse, "quarantine") == []

    rows = sorted(table(spark, warehouse, "messages"), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(500))
    want = {r.offset: r for f in files for r in read_batch_file(str(f))[1]}
    for row in rows:
        r = want[row.offset]
        assert row.gateway == GATEWAY and ms(row.timestamp) == r.timestamp_ms
        assert row.date == datetime.fromtimestamp(r.timestamp_ms / 1000, timezone.utc).date()
        assert (row.topic, row.client_id) == (r.topic.decode(), r.client_id.decode())
        assert (row.qos, row.retain, bytes(row.payload)) == (r.qos, r.retain, r.payload)

    hourly = {(r.gateway, r.topic, ms(r.hour)): [r.messages, r.bytes, ms(r.first_time),
                                                 ms(r.last_time)]
              for r in table(spark, warehouse, "topic_hourly")}
    assert hourly == expected_hourly(files)

    # A re-run finds nothing new.
    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_listed"], again["files_new"], again["rows_added"]) == (len(files), 0, 0)

    # The same batch under another name (a copy, or a re-upload under another prefix): read,
    # every row a duplicate, none added.
    copy = landing / "gateway=elsewhere" / "copy.ebb.zst"
    copy.parent.mkdir()
    shutil.copy(files[0], copy)
    dup = ingest_once(spark, str(landing), str(warehouse))
    first_count = read_batch_file(str(files[0]))[0].record_count
    assert (dup["files_new"], dup["batches"], dup["rows_added"], dup["duplicates"]) == \
        (1, 1, 0, first_count)

    # The checkpoint lost: every file is read again, the anti-join on (gateway, offset) adds
    # nothing.
    shutil.rmtree(warehouse / "_checkpoint")
    lost = ingest_once(spark, str(landing), str(warehouse))
    assert (lost["files_new"], lost["records"], lost["rows_added"], lost["duplicates"]) == \
        (len(files) + 1, 500 + first_count, 0, 500 + first_count)
    assert spark.read.parquet(str(warehouse / "messages")).count() == 500
    assert {(r.gateway, r.topic, ms(r.hour)): r.messages
            for r in table(spark, warehouse, "topic_hourly")} == \
        {k: v[0] for k, v in expected_hourly(files).items()}


def test_corrupt_batches_are_quarantined_the_rest_ingested_and_gaps_reported(spark, tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    shutil.copy(GOLDEN / "v1-gap.ebb.zst", day / f"{20:020d}-{23:020d}.ebb.zst")
    damaged = bytearray((GOLDEN / "v1-plain.ebb.zst").read_bytes())
    damaged[len(damaged) // 2] ^= 0x55
    (day / f"{30:020d}-{39:020d}.ebb.zst").write_bytes(bytes(damaged))
    header, raw = golden_raw()
    fields = {f: getattr(header, f) for f in header.__dataclass_fields__}
    future = day / f"{40:020d}-{49:020d}.ebb.zst"   # records of a log format this one predates
    future.write_bytes(rewrite(BatchHeader(**{**fields, "log_format_version": 3}), raw))
    # Log format version 2, with MQTT 5.0 properties, beside the version 1 batches.
    shutil.copy(GOLDEN / "v2-props.ebb.zst", day / f"{30:020d}-{39:020d}-v2.ebb.zst")

    report = ingest_once(spark, str(landing), str(warehouse))
    gap_header, gap_records = read_batch_file(str(GOLDEN / "v1-gap.ebb.zst"))
    assert report["batches"] == 3 and report["rows_added"] == 20 + len(gap_records)
    q, qf = report["quarantined"]
    assert qf["error"] == (f"{qf['path']}: records of log format version 3; this edgebroker "
                           f"reads versions 1, 2")
    assert (warehouse / "_quarantine" / future.relative_to(landing)).exists()
    assert q["path"].endswith(f"{30:020d}-{39:020d}.ebb.zst")
    assert q["error"].startswith(q["path"] + ": ")
    moved = warehouse / "_quarantine" / "gateway=gw-golden" / "date=2023-11-14" / \
        f"{30:020d}-{39:020d}.ebb.zst"
    assert moved.read_bytes() == bytes(damaged) and not (day / moved.name).exists()
    assert sorted((r.path, r.error) for r in table(spark, warehouse, "quarantine")) == \
        [(q["path"], q["error"]), (qf["path"], qf["error"])]

    # The header's gap (12..19), and offset 22, missing inside the batch 20..24.
    assert report["gaps_added"] == 2
    assert sorted((g.gateway, g.gap_first, g.gap_length, g.gap_last, g.reason)
                  for g in table(spark, warehouse, "gaps")) == \
        [("gw-golden", gap_header.gap_first, gap_header.gap_length,
          gap_header.gap_first + gap_header.gap_length - 1, "reported"),
         ("gw-golden", 22, 1, 22, "damage")]
    messages = {r.offset: r for r in table(spark, warehouse, "messages")}
    assert sorted(messages) == list(range(10)) + [r.offset for r in gap_records] + \
        list(range(30, 40))
    assert all(messages[i].properties is None for i in range(10))
    props = messages[31].properties
    assert (props.payload_format, props.message_expiry, props.content_type,
            props.response_topic, bytes(props.correlation_data)) == \
        (1, 631, "application/json", "reply/31", b"\xc0\x1f")
    assert [(u.name, u.value) for u in props.user_properties] == [("unit", "C"), ("seq", "31")]
    assert messages[30].properties is None and messages[32].properties.message_expiry is None

    # A gateway id of digits stays a string in the partitioned tables: its batch and then a
    # copy of it (the copy's rows are all found in messages).
    numeric = landing / "gateway=4711" / "date=2023-11-14"
    numeric.mkdir(parents=True)
    (numeric / f"{0:020d}-{9:020d}.ebb.zst").write_bytes(
        rewrite(BatchHeader(**{**fields, "gateway_id": "4711"}), raw))
    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_new"], again["rows_added"], again["gaps_added"], again["quarantined"]) \
        == (1, 10, 0, [])
    shutil.copy(numeric / f"{0:020d}-{9:020d}.ebb.zst", numeric / "copy.ebb.zst")
    copied = ingest_once(spark, str(landing), str(warehouse))
    assert (copied["files_new"], copied["rows_added"], copied["duplicates"]) == (1, 0, 10)
    assert len(table(spark, warehouse, "gaps")) == 2
    # The same bad batch uploaded again: quarantined beside the first one, under a new name.
    (day / moved.name).write_bytes(bytes(damaged))
    [q2] = ingest_once(spark, str(landing), str(warehouse))["quarantined"]
    assert q2["moved_to"] == q["moved_to"] + ".1" and moved.read_bytes() == bytes(damaged)
    assert Path(str(moved) + ".1").read_bytes() == bytes(damaged)
    assert sum(r.messages for r in table(spark, warehouse, "topic_hourly")
               if r.gateway == "4711") == 10


def test_batches_that_overlap_in_part_add_only_their_new_offsets(spark, tmp_path):
    """Range-level deduplication: a batch whose range overlaps nothing goes in whole; one that
    overlaps rows already in messages, or another new batch, adds only the offsets not there."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    t0 = 1_700_000_000_000

    def land(first: int, last: int, gateway: str = "gw-a") -> None:
        records = [(o, t0 + o * 60_000, o % 3, False, b"c", f"t/{o % 2}".encode(),
                    b"p" * (o % 7)) for o in range(first, last + 1)]
        header, raw = build(records, gateway)
        path = landing / object_name("", gateway, first, last, t0 + first * 60_000)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rewrite(header, raw))

    def offsets(gateway: str) -> list:
        return sorted(r.offset for r in table(spark, warehouse, "messages") if r.gateway == gateway)

    land(0, 9)
    first = ingest_once(spark, str(landing), str(warehouse))
    assert (first["rows_added"], first["duplicates"]) == (10, 0)
    # 5..14 overlaps 0..9 in messages; 30..39 and 35..44 overlap each other; 20..24 and the
    # other gateway's 0..9 overlap nothing.
    land(5, 14)
    land(20, 24)
    land(30, 39)
    land(35, 44)
    land(0, 9, "gw-b")
    second = ingest_once(spark, str(landing), str(warehouse))
    assert (second["files_new"], second["records"]) == (5, 10 + 5 + 10 + 10 + 10)
    assert (second["rows_added"], second["duplicates"]) == (5 + 5 + 15 + 10, 5 + 5)
    assert offsets("gw-a") == list(range(15)) + list(range(20, 25)) + list(range(30, 45))
    assert offsets("gw-b") == list(range(10))
    want: dict = defaultdict(lambda: [0, 0])
    for gateway, offs in (("gw-a", offsets("gw-a")), ("gw-b", range(10))):
        for o in offs:
            e = want[(gateway, f"t/{o % 2}", (t0 + o * 60_000) // 3_600_000 * 3_600_000)]
            e[0] += 1
            e[1] += o % 7
    assert {(r.gateway, r.topic, ms(r.hour)): [r.messages, r.bytes]
            for r in table(spark, warehouse, "topic_hourly")} == dict(want)



def test_topic_hourly_is_repaired_by_the_run_after_a_crash_that_left_only_messages(
        spark, tmp_path):
    """A crash after the `messages` append and before topic_hourly is written: the next run
    reads the files again, finds every row in messages (adds none) and still recounts
    topic_hourly for the partitions its batches touch."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    t0 = 1_700_006_399_000   # 2023-11-14 23:59:59 UTC: the records fall in two days
    records = [(0, t0, 0, False, b"c", b"a", b"xy"), (1, t0 + 500, 1, False, b"c", b"b", b"z"),
               (2, t0 + 1500, 0, False, b"c", b"a", b"")]
    header, raw = build(records, "gw-a")
    path = landing / object_name("", "gw-a", 0, 2, t0)
    path.parent.mkdir(parents=True)
    path.write_bytes(rewrite(header, raw))
    warehouse.mkdir()
    (warehouse / "topic_hourly").write_text("a file where the table's folder goes: the "
                                            "topic_hourly write fails")
    with pytest.raises(Exception):
        ingest_once(spark, str(landing), str(warehouse))
    assert spark.read.parquet(str(warehouse / "messages")).count() == 3
    (warehouse / "topic_hourly").unlink()

    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_new"], again["rows_added"], again["duplicates"]) == (1, 0, 3)
    hourly = {(r.gateway, r.topic, ms(r.hour)): [r.messages, r.bytes, ms(r.first_time),
                                                 ms(r.last_time)]
              for r in table(spark, warehouse, "topic_hourly")}
    assert hourly == expected_hourly([path])


def test_odd_files_are_quarantined_each_with_its_reason_and_the_good_one_ingested(
        spark, tmp_path):
    """Files that once stopped the whole run (MemoryError, OverflowError in an executor) or
    went in wrong (bytes after the frame ignored): each is quarantined naming what is wrong."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-1" / "date=2023-11-14"
    day.mkdir(parents=True)
    good = good_blob()
    (day / "good.ebb.zst").write_bytes(good)
    header, raw = build([(5, 1_700_000_000_000, 0, False, b"c", b"t", b"p")])
    fields = {f: getattr(header, f) for f in header.__dataclass_fields__}
    odd = {
        "junk-after": (good + b"JUNK", "bytes after its frame"),
        "two-batches": (good + rewrite(header, raw), "bytes after its frame"),
        "huge-frame": (bytes([0x28, 0xB5, 0x2F, 0xFD, 0xE0]) + (1 << 45).to_bytes(8, "little")
                       + bytes([1, 0, 0]), "its zstd frame declares 35184372088832 bytes"),
        "huge-count": (rewrite(BatchHeader(**{**fields, "record_count": 1 << 40}), raw),
                       "1099511627776 records cannot lie in 37 raw bytes"),
        "no-records": (rewrite(BatchHeader(**{**fields, "record_count": 0}), raw),
                       "no records"),
        "gateway": (rewrite(BatchHeader(**{**fields, "gateway_id": "../../x"}), raw),
                    "gateway id '../../x' must be"),
        "year-10000": (rewrite(*build([(0, 253_402_300_800_000, 0, False, b"c", b"t", b"p")])),
                       "record at raw position 0 (offset 0): timestamp 253402300800000 ms is "
                       "not before the year 10000"),
    }
    for name, (blob, _) in odd.items():
        (day / f"{name}.ebb.zst").write_bytes(blob)

    report = ingest_once(spark, str(landing), str(warehouse))
    assert (report["batches"], report["rows_added"]) == (1, 2)
    errors = {Path(q["path"]).name[:-len(".ebb.zst")]: q["error"] for q in report["quarantined"]}
    assert sorted(errors) == sorted(odd)
    for name, (_, reason) in odd.items():
        path = next(q["path"] for q in report["quarantined"] if q["path"].endswith(f"/{name}"
                                                                                   ".ebb.zst"))
        assert errors[name].startswith(f"{path}: ") and reason in errors[name], name
        assert not (day / f"{name}.ebb.zst").exists()
    assert sorted(r.offset for r in table(spark, warehouse, "messages")) == [0, 1]
    assert len(table(spark, warehouse, "quarantine")) == len(odd)


def test_any_other_error_from_a_file_makes_an_error_row_naming_it(monkeypatch):
    """The first pass's function, without Spark: an exception that is not a BatchFormatError
    (a reader bug, MemoryError) quarantines that file, and the files after it are read. Each
    row carries the file's length and modification time (ms) as the read saw them."""
    import pyarrow as pa
    from edgebroker.spark import ingest

    def summary(blob, path):
        if blob == b"bad":
            raise MemoryError("no room")
        return real(blob, path)
    real = ingest.batch_summary
    monkeypatch.setattr(ingest, "batch_summary", summary)
    when = datetime(2024, 1, 2, tzinfo=timezone.utc)
    files = pa.RecordBatch.from_pylist(
        [{"path": "a/bad.ebb.zst", "length": 3, "modificationTime": when, "content": b"bad"},
         {"path": "a/good.ebb.zst", "length": len(good_blob()), "modificationTime": when,
          "content": good_blob()}],
        schema=pa.schema([("path", pa.string()), ("length", pa.int64()),
                          ("modificationTime", pa.timestamp("us", tz="UTC")),
                          ("content", pa.binary())]))
    rows = [row for rb in ingest.summarize_files([files]) for row in rb.to_pylist()]
    assert [(r["kind"], r["path"], r["error"]) for r in rows] == [
        ("error", "a/bad.ebb.zst", "a/bad.ebb.zst: cannot be read (MemoryError('no room'))"),
        ("batch", "a/good.ebb.zst", None), ("date", "a/good.ebb.zst", None)]
    assert [(r["length"], r["mtime"]) for r in rows][:2] == \
        [(3, ms(when)), (len(good_blob()), ms(when))]


def test_a_batch_goes_in_without_deduplication_only_when_its_range_overlaps_nothing():
    from collections import namedtuple
    B = namedtuple("B", "path gateway batch_first batch_last")
    batches = [B("a", "g1", 0, 9), B("b", "g1", 10, 19), B("c", "g1", 19, 25),
               B("d", "g1", 40, 49), B("e", "g1", 30, 100), B("f", "g1", 200, 210),
               B("g", "g2", 0, 9), B("h", "g2", 100, 109), B("i", "g3", 5, 5)]
    # Offsets already in messages: g1 150..199 (f starts after), g2 5..50 (g reaches into it).
    assert clean_batches(batches, {"g1": (150, 199), "g2": (5, 50)}) == {"a", "f", "h", "i"}
    assert clean_batches(batches, {}) == {"a", "f", "g", "h", "i"}
    assert clean_batches([], {"g1": (0, 1)}) == set()


@pytest.mark.timeout(300)
def test_a_run_touching_over_a_thousand_partitions_succeeds_and_a_rerun_adds_nothing(
        spark, tmp_path):
    """1200 (date, gateway) partitions: 30 gateways, one record a day for 40 days each, gateway
    g from day g on (so not every pair of a day and a gateway named is touched). The partitions
    are looked up in `messages` (the second run, checkpoint gone) and in the recount of
    topic_hourly (both runs); one condition per partition once overflowed the driver's stack."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    t0 = 1_700_000_000_000
    for g in range(30):
        gateway = f"gw-{g:02d}"
        records = [(d, t0 + (g + d) * 86_400_000, 0, False, b"c", b"t", b"p" * g)
                   for d in range(40)]
        header, raw = build(records, gateway)
        path = landing / object_name("", gateway, 0, 39, records[0][1])
        path.parent.mkdir(parents=True)
        path.write_bytes(rewrite(header, raw))

    first = ingest_once(spark, str(landing), str(warehouse))
    assert (first["files_new"], first["rows_added"], first["quarantined"]) == (30, 1200, [])
    shutil.rmtree(warehouse / "_checkpoint")     # every file read again, found in messages
    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_new"], again["rows_added"], again["duplicates"]) == (30, 0, 1200)
    assert spark.read.parquet(str(warehouse / "messages")).count() == 1200
    hourly = table(spark, warehouse, "topic_hourly")
    assert sorted((r.gateway, r.date, r.messages, r.bytes) for r in hourly) == sorted(
        (f"gw-{g:02d}", datetime.fromtimestamp((t0 + (g + d) * 86_400_000) / 1000,
                                               timezone.utc).date(), 1, g)
        for g in range(30) for d in range(40))
