"""The ingest job on Spark local[2], on what a landing area holds beyond one life of whole
batches: an empty file is quarantined like any unreadable one, never left unnamed; a gateway
whose log started over under the same gateway id (offsets from 0 again) loses no record; a
batch of a gateway id Spark's partitions cannot hold is quarantined; a crash around a
quarantine move leaves no file unrecorded."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import pytest

from edgebroker.mqtt import properties as P
from edgebroker.spark.ingest import ingest_once
from edgebroker.uploader.batch import object_name

from spark.test_arrow import build, rewrite
from spark.test_ingest import GOLDEN, ms, table

DAY_MS = 86_400_000
T0 = 1_700_000_000_000   # 2023-11-14T22:13:20Z


def land(landing: Path, records: list, name: str | None = None, gateway: str = "gw-a",
         gap: tuple = (0, 0)) -> Path:
    """(offset, timestamp ms, payload[, MQTT 5.0 properties]) records as one batch file of
    ``gateway``, its header reporting ``gap`` (first, length)."""
    header, raw = build([(o, ts, 1, False, b"c", b"t/x", p, *props)
                         for o, ts, p, *props in records], gateway)
    header = dataclasses.replace(header, gap_first=gap[0], gap_length=gap[1])
    path = landing / object_name("", gateway, records[0][0], records[-1][0], records[0][1])
    path = path.with_name(name) if name else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rewrite(header, raw))
    return path


def ingest_watched(spark, landing: Path, warehouse: Path, handler: logging.Handler,
                   caplog) -> dict:
    """One pass, ``handler`` on the job's logger meanwhile (a test acts when a line comes)."""
    logger = logging.getLogger("edgebroker.spark")
    logger.addHandler(handler)
    caplog.set_level(logging.INFO, logger="edgebroker.spark")
    try:
        return ingest_once(spark, str(landing), str(warehouse))
    finally:
        logger.removeHandler(handler)


def test_an_empty_batch_file_is_listed_and_quarantined_naming_it(spark, tmp_path):
    """Spark's file scans skip files of 0 bytes: the listing must still see one, and the run
    quarantine it with an error naming it, as it does a batch cut to 5 bytes."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    empty = day / f"{10:020d}-{19:020d}.ebb.zst"
    empty.write_bytes(b"")
    cut = day / f"{20:020d}-{29:020d}.ebb.zst"
    cut.write_bytes((GOLDEN / "v1-plain.ebb.zst").read_bytes()[:5])

    report = ingest_once(spark, str(landing), str(warehouse))
    assert (report["files_listed"], report["files_new"], report["rows_added"]) == (3, 3, 10)
    by_name = {q["path"].rsplit("/", 1)[-1]: q for q in report["quarantined"]}
    assert sorted(by_name) == [empty.name, cut.name]
    q = by_name[empty.name]
    assert q["error"] == f"{q['path']}: empty file (0 bytes), not a batch"
    moved = warehouse / "_quarantine" / empty.relative_to(landing)
    assert moved.exists() and moved.stat().st_size == 0 and not empty.exists()
    assert q["moved_to"].endswith(str(moved.relative_to(warehouse)))
    assert sorted(r.path.rsplit("/", 1)[-1] for r in table(spark, warehouse, "quarantine")) \
        == [empty.name, cut.name]

    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_listed"], again["files_new"], again["quarantined"]) == (1, 0, [])


def test_a_gateway_whose_log_started_over_keeps_every_record_and_reports_the_reused_offsets(
        spark, tmp_path, caplog):
    """Offsets 0..9 ingested; then the gateway re-imaged (a new data directory, the same
    gateway_id): offsets 0..14 again, days later, other payloads. Every new record is added and
    the reused offsets counted and logged; copies of either life and a lost checkpoint still
    add nothing."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    t1 = T0 + 3 * DAY_MS
    land(landing, [(o, T0 + o * 1000, b"old-%d" % o) for o in range(10)])
    first = ingest_once(spark, str(landing), str(warehouse))
    assert (first["rows_added"], first["reused_offsets"]) == (10, 0)

    second_life = land(landing, [(o, t1 + o * 1000, b"NEW-%d" % o) for o in range(15)])
    caplog.set_level(logging.WARNING, logger="edgebroker.spark")
    second = ingest_once(spark, str(landing), str(warehouse))
    assert (second["records"], second["rows_added"], second["duplicates"],
            second["reused_offsets"]) == (15, 15, 0, 10)
    [warning] = [r.getMessage() for r in caplog.records if "gw-a" in r.getMessage()]
    assert "gateway gw-a: 10 offsets in 0..9 now hold more than one record" in warning
    payloads = sorted(bytes(r.payload) for r in table(spark, warehouse, "messages"))
    assert payloads == sorted([b"old-%d" % o for o in range(10)]
                              + [b"NEW-%d" % o for o in range(15)])

    # The same offset and timestamp as a record of the first life, another payload: another
    # record too.
    land(landing, [(3, T0 + 3000, b"other")], name="other.ebb.zst")
    third = ingest_once(spark, str(landing), str(warehouse))
    assert (third["rows_added"], third["duplicates"], third["reused_offsets"]) == (1, 0, 1)

    # True duplicates stay out: a copy of the second life, then every file read again.
    shutil.copy(second_life, second_life.with_name("copy.ebb.zst"))
    copy = ingest_once(spark, str(landing), str(warehouse))
    assert (copy["rows_added"], copy["duplicates"], copy["reused_offsets"]) == (0, 15, 0)
    shutil.rmtree(warehouse / "_checkpoint")
    lost = ingest_once(spark, str(landing), str(warehouse))
    assert (lost["records"], lost["rows_added"], lost["reused_offsets"]) == (41, 0, 0)
    assert len(table(spark, warehouse, "messages")) == 26
    assert sum(r.messages for r in table(spark, warehouse, "topic_hourly")) == 26

    # Both lives new in one run (a new warehouse): all 26 records, the offsets held twice
    # among them counted once each.
    fresh = ingest_once(spark, str(landing), str(tmp_path / "warehouse2"))
    assert (fresh["rows_added"], fresh["duplicates"], fresh["reused_offsets"]) == (26, 15, 10)


def test_a_batch_of_the_gateway_id_spark_reads_back_as_null_is_quarantined(spark, tmp_path):
    """Its rows would be written to gateway=__HIVE_DEFAULT_PARTITION__ and read back with no
    gateway (deduplication and topic_hourly would never find them): the id is refused."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    bad = land(landing, [(o, T0 + o, b"x") for o in range(3)],
               gateway="__HIVE_DEFAULT_PARTITION__")
    land(landing, [(o, T0 + o, b"x") for o in range(3)])
    report = ingest_once(spark, str(landing), str(warehouse))
    assert report["rows_added"] == 3
    [q] = report["quarantined"]
    assert q["path"].endswith(str(bad.relative_to(landing)))
    assert q["error"].startswith(f"{q['path']}: gateway id '__HIVE_DEFAULT_PARTITION__' is the "
                                 f"name Spark and Hive give a null partition value")
    assert {r.gateway for r in table(spark, warehouse, "messages")} == {"gw-a"}


def test_a_crash_around_the_quarantine_move_leaves_neither_an_unrecorded_file_nor_two_rows(
        spark, tmp_path):
    """The quarantine row is written before the file moves. The row's write failing leaves the
    file in the landing area (not in _quarantine, named nowhere); the move failing after the
    row is written (not failing the pass) lets the next run move it without a second row."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    bad = day / f"{0:020d}-{9:020d}.ebb.zst"
    bad.write_bytes((GOLDEN / "v1-plain.ebb.zst").read_bytes()[:5])
    warehouse.mkdir()
    (warehouse / "quarantine").write_text("a file where the table's folder goes")
    with pytest.raises(Exception):
        ingest_once(spark, str(landing), str(warehouse))
    assert bad.exists() and not (warehouse / "_quarantine").exists()
    (warehouse / "quarantine").unlink()

    blocker = warehouse / "_quarantine" / "gateway=gw-golden"
    blocker.parent.mkdir()
    blocker.write_text("a file where the folder the move needs goes")
    # The move fails after its row: logged with its cause, the pass goes on, the next moves it.
    [left] = ingest_once(spark, str(landing), str(warehouse))["not_moved"]
    assert left["path"].endswith(bad.name) and "cannot move " in left["error"]
    assert bad.exists() and blocker.read_text().startswith("a file")
    blocker.unlink()
    [q] = ingest_once(spark, str(landing), str(warehouse))["quarantined"]
    moved = warehouse / "_quarantine" / bad.relative_to(landing)
    assert moved.exists() and not bad.exists() and q["moved_to"].endswith(
        str(moved.relative_to(warehouse)))
    assert [(r.path, r.moved_to) for r in table(spark, warehouse, "quarantine")] == \
        [(q["path"], q["moved_to"])]
    # A landing area that held only a bad file: the other tables are there, empty.
    assert table(spark, warehouse, "messages") == table(spark, warehouse, "topic_hourly") == \
        table(spark, warehouse, "gaps") == []


def test_a_landing_area_and_warehouse_named_with_glob_characters_are_taken_literally(
        spark, tmp_path):
    """Spark's load() takes [ ] { } * ? for a glob pattern: land[1] matched the folder land1
    (empty here), and the run listed nothing."""
    landing, warehouse = tmp_path / "land[1]", tmp_path / "wh{a,b}"
    (tmp_path / "land1").mkdir()
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    first = ingest_once(spark, str(landing), str(warehouse))
    assert (first["files_listed"], first["rows_added"]) == (1, 10)
    # A copy: read, found in messages (the tables and checkpoint are read back), none added.
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / "copy.ebb.zst")
    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_listed"], again["files_new"], again["duplicates"]) == (2, 1, 10)
    # Read here as the job does, the pattern characters escaped.
    assert len(table(spark, tmp_path / "wh\\{a,b\\}", "messages")) == 10


def test_a_failed_pass_leaves_no_deduplicated_rows_cached(spark, tmp_path):
    """A re-cut batch overlapping what messages holds is deduplicated (its rows cached for the
    pass); the append then fails (a file where Spark's staging folder goes). Each failed pass,
    as --continuous retries them, must leave the cache as it found it."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    land(landing, [(o, T0 + o, b"y" * 100) for o in range(100)])
    ingest_once(spark, str(landing), str(warehouse))
    land(landing, [(o, T0 + o, b"y" * 100) for o in range(90, 400)], name="recut.ebb.zst")
    (warehouse / "messages" / "_temporary").write_text("the append cannot stage its files")
    cached = spark.sparkContext._jsc.getPersistentRDDs
    before = cached().size()
    for _ in range(2):
        with pytest.raises(Exception, match="_temporary"):
            ingest_once(spark, str(landing), str(warehouse))
        assert cached().size() == before
    (warehouse / "messages" / "_temporary").unlink()
    report = ingest_once(spark, str(landing), str(warehouse))
    assert (report["rows_added"], report["duplicates"]) == (300, 10)
    assert cached().size() == before


def test_a_gap_reported_again_by_a_later_life_of_the_gateway_is_recorded_again(spark, tmp_path):
    """Offsets 0..9 lost before the first life's batch 10..12; the gateway re-imaged under the
    same id, days later its new log lost 0..4 (the same gap_first). Both gaps are rows; a copy
    of either batch adds none."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    first = land(landing, [(o, T0 + o, b"a") for o in range(10, 13)], gap=(0, 10))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 1
    land(landing, [(o, T0 + 5 * DAY_MS + o, b"b") for o in range(5, 8)], gap=(0, 5))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 1
    # The first life's gap again in the second life: the same range, another time.
    land(landing, [(o, T0 + 6 * DAY_MS + o, b"c") for o in range(10, 12)], gap=(0, 10))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 1
    shutil.copy(first, first.with_name("copy.ebb.zst"))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 0
    gaps = sorted((r.gap_first, r.gap_last, r.batch.rsplit("/", 1)[-1])
                  for r in table(spark, warehouse, "gaps"))
    assert gaps == [(0, 4, f"{5:020d}-{7:020d}.ebb.zst"), (0, 9, f"{10:020d}-{11:020d}.ebb.zst"),
                    (0, 9, first.name)]


def test_records_whose_properties_differ_only_in_which_field_holds_a_value_are_two(
        spark, tmp_path):
    """A log that started over: the same offset, timestamp, topic and payload, properties with
    the same values in other fields (content type "x" / response topic "x"; content type
    "unit" and response topic "C" / the user property unit=C). Each is another record, kept;
    the same records read again add none."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    one = [P.encode_body({P.CONTENT_TYPE: "x", P.CORRELATION_DATA: b"\x00\xff"}),
           P.encode_body({P.CONTENT_TYPE: "unit", P.RESPONSE_TOPIC: "C"})]
    two = [P.encode_body({P.RESPONSE_TOPIC: "x", P.CORRELATION_DATA: b"\x00\xff"}),
           P.encode_body({P.USER_PROPERTY: [("unit", "C")]})]
    land(landing, [(o, T0 + o, b"p", one[o]) for o in range(2)], name="life1.ebb.zst")
    assert ingest_once(spark, str(landing), str(warehouse))["rows_added"] == 2
    land(landing, [(o, T0 + o, b"p", two[o]) for o in range(2)], name="life2.ebb.zst")
    second = ingest_once(spark, str(landing), str(warehouse))
    assert (second["rows_added"], second["duplicates"], second["reused_offsets"]) == (2, 0, 2)
    shutil.rmtree(warehouse / "_checkpoint")
    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["rows_added"], again["duplicates"]) == (0, 4)
    props = sorted((r.offset, r.properties.content_type or "", r.properties.response_topic or "",
                    [tuple(u) for u in r.properties.user_properties],
                    bytes(r.properties.correlation_data or b""))
                   for r in table(spark, warehouse, "messages"))
    assert props == [(0, "", "x", [], b"\x00\xff"), (0, "x", "", [], b"\x00\xff"),
                     (1, "", "", [("unit", "C")], b""), (1, "unit", "C", [], b"")]


def test_after_a_lost_checkpoint_a_new_life_on_another_day_still_reports_reused_offsets(
        spark, tmp_path, caplog):
    """Offsets 0..9 ingested; the checkpoint and the landing area lost; the gateway re-imaged,
    its offsets 0..4 days later (other partitions): all five are added, and counted and
    logged as reused, as with the checkpoint."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    land(landing, [(o, T0 + o, b"old") for o in range(10)])
    ingest_once(spark, str(landing), str(warehouse))
    shutil.rmtree(warehouse / "_checkpoint")
    shutil.rmtree(landing)
    land(landing, [(o, T0 + 4 * DAY_MS + o, b"new") for o in range(5)])
    caplog.set_level(logging.WARNING, logger="edgebroker.spark")
    report = ingest_once(spark, str(landing), str(warehouse))
    assert (report["rows_added"], report["duplicates"], report["reused_offsets"]) == (5, 0, 5)
    [warning] = [r.getMessage() for r in caplog.records if "now hold" in r.getMessage()]
    assert "gateway gw-a: 5 offsets in 0..4 now hold more than one record" in warning
    assert len(table(spark, warehouse, "messages")) == 15


@pytest.mark.parametrize("name", ["land#1", "land%41", "land 1?x"])
def test_the_listing_names_each_file_alike_in_the_scan_and_in_input_files(
        spark, tmp_path, name):
    """The scan's rows name a file as a path (not escaped), inputFiles as a URI: with `#`, `%`,
    `?` or a space in the landing area's name both must still give one key per file, or every
    file listed is looked up on the file system again each run (a request each on S3)."""
    from edgebroker.spark.files import literal as _literal, path_key as _path_key, \
        uri_key as _uri_key
    landing = tmp_path / name
    for o in range(3):
        land(landing, [(o, T0 + o, b"a")])
    df = spark.read.format("binaryFile").option("recursiveFileLookup", "true") \
        .load(_literal(str(landing)))
    rows = {_path_key(r.path) for r in df.select("path").collect()}
    assert len(rows) == 3 and rows == {_uri_key(uri) for uri in df.inputFiles()}


def test_offsets_missing_inside_a_batch_are_gaps_counted_and_logged(spark, tmp_path, caplog):
    """A batch 0..9 without 3, 4, 7 and 8 (damaged records left out when it was cut): two rows
    in `gaps`, reason damage, beside the gap a header reports (reason reported); counted and
    logged. A re-cut batch 5..9 (the same hole 7..8) and a copy add none."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    holed = [(o, T0 + o, b"h") for o in (0, 1, 2, 5, 6, 9)]
    land(landing, holed)
    land(landing, [(o, T0 + o, b"r") for o in (15, 16)], gap=(10, 5))
    caplog.set_level(logging.WARNING, logger="edgebroker.spark")
    report = ingest_once(spark, str(landing), str(warehouse))
    assert (report["rows_added"], report["gaps_added"]) == (8, 3)
    gaps = sorted((r.gap_first, r.gap_last, r.gap_length, r.reason, r.batch.rsplit("/", 1)[-1])
                  for r in table(spark, warehouse, "gaps"))
    name = f"{0:020d}-{9:020d}.ebb.zst"
    assert gaps == [(3, 4, 2, "damage", name), (7, 8, 2, "damage", name),
                    (10, 14, 5, "reported", f"{15:020d}-{16:020d}.ebb.zst")]
    times = {r.gap_first: r.batch_time for r in table(spark, warehouse, "gaps")}
    assert (ms(times[3]), ms(times[7])) == (T0 + 5, T0 + 9)
    warnings = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(warnings) == 3 and any(
        w.startswith("gateway gw-a: offsets 7..8 (2) lost, missing (damage) in ") for w in warnings)

    land(landing, holed[3:], name="recut.ebb.zst")
    land(landing, holed, name="copy.ebb.zst")
    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_new"], again["rows_added"], again["gaps_added"]) == (2, 0, 0)
    assert len(table(spark, warehouse, "gaps")) == 3


def test_a_damage_gap_and_the_same_gap_reported_by_a_re_cut_batch_are_one_row(spark,
                                                                              tmp_path):
    """The clock went back inside the batch: the re-cut batch's header reports the hole with
    its earliest timestamp, not that of the record after the hole, and the two were two rows
    (damage, then reported) of the same offsets, counted and logged twice."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    ts = {o: T0 + o for o in range(10)}
    ts[6] = T0 + 2                                  # 3 ms behind offset 5's
    land(landing, [(o, ts[o], b"h") for o in (0, 1, 2, 5, 6, 7, 8, 9)])
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 1
    land(landing, [(o, ts[o], b"h") for o in (5, 6, 7, 8, 9)], name="recut.ebb.zst",
         gap=(3, 2))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 0
    assert [(r.gap_first, r.gap_length, r.reason)
            for r in table(spark, warehouse, "gaps")] == [(3, 2, "damage")]


def test_a_bad_file_replaced_after_the_run_read_it_is_left_for_the_next_run(
        spark, tmp_path, caplog):
    """A torn copy and an empty file at batch names, judged unreadable by the first pass; the
    dir sink then replaces each by its whole batch (a new file renamed over the name) before
    the run's quarantine step. Neither is moved: both are left, logged and named in the
    report, and the next run ingests them. A bad file that did not change is quarantined."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    torn = land(landing, [(o, T0 + o, b"a") for o in range(10)])
    whole_torn = torn.read_bytes()
    torn.write_bytes(whole_torn[:5])
    empty = land(landing, [(o, T0 + o, b"b") for o in range(10, 20)])
    whole_empty = empty.read_bytes()
    empty.write_bytes(b"")
    stays = land(landing, [(o, T0 + o, b"c") for o in range(20, 30)], name="stays.ebb.zst")
    stays.write_bytes(stays.read_bytes()[:7])

    class Replace(logging.Handler):
        done = False

        def emit(self, record):
            # Logged once the first pass is over, before anything is written or moved.
            if not Replace.done and "new batches" in record.getMessage():
                Replace.done = True
                for path, blob in ((torn, whole_torn), (empty, whole_empty)):
                    tmp = path.with_name("." + path.name + ".tmp")
                    tmp.write_bytes(blob)
                    tmp.replace(path)
    report = ingest_watched(spark, landing, warehouse, Replace(), caplog)
    assert Replace.done
    assert [Path(q["path"]).name for q in report["quarantined"]] == [stays.name]
    assert sorted(Path(p).name for p in report["changed_since_read"]) == \
        sorted([torn.name, empty.name])
    assert torn.read_bytes() == whole_torn and empty.read_bytes() == whole_empty
    moved = sorted(p.name for p in (warehouse / "_quarantine").rglob("*.ebb.zst*"))
    assert moved == [stays.name]
    assert [r.path.rsplit("/", 1)[-1] for r in table(spark, warehouse, "quarantine")] == \
        [stays.name]
    left = [r.getMessage() for r in caplog.records if "changed since this run read" in
            r.getMessage()]
    assert len(left) == 2 and all("left for the next run" in m for m in left)

    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_new"], again["rows_added"], again["quarantined"],
            again["changed_since_read"]) == (2, 20, [], [])
    assert sorted(r.offset for r in table(spark, warehouse, "messages")) == list(range(20))
