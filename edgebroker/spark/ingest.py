"""The ingest job: a landing area of upload batches
(``<prefix>/gateway=<id>/date=<YYYY-MM-DD>/<first:020>-<last:020>-<life>.ebb.zst``, or without
``-<life>`` for batches cut before life ids: any ``*.ebb.zst``, the gateway, offsets and dates
read from each file's header, never from its name) into Parquet tables under a warehouse folder
(docs/spark.md):

* ``messages`` (gateway, offset, timestamp, date, topic, qos, retain, client_id, payload,
  properties: the MQTT 5.0 ones, a struct, null for none),
  partitioned by date and gateway, one row per record (its gateway, offset, timestamp and
  content: edgebroker.spark.dedup) however often a batch is uploaded, copied or read;
* ``topic_hourly`` (gateway, topic, hour, messages, bytes, first_time, last_time), recomputed
  from ``messages`` for the partitions a run touches;
* ``gaps`` (gateway, gap_first, gap_last, gap_length, batch, batch_time, reason): offsets no
  batch will ever hold, one row per gap and life of the gateway's log: those a batch's header
  reports (reason ``reported``) and those missing inside a batch (``damage``);
* ``quarantine`` (path, moved_to, error, time): batches that could not be read, moved out of
  the landing area to ``<warehouse>/_quarantine/`` (Spark skips names starting with ``_``);
  a file whose length or modification time is no longer what the run read is not moved but
  left for the next run; one whose folder the job cannot change stays where it is, its row's
  ``moved_to`` null (``edgebroker.spark.quarantine``).

A table with no row yet is there all the same, empty, from the end of the first pass on.

Spark 3.5 has no Python data source API (``pyspark.sql.datasource`` arrives in Spark 4), so the
files are read with Spark's ``binaryFile`` source (any Hadoop file system: local, ``s3a://``,
``hdfs://``) and decoded in the executors by ``mapInArrow``, which hands Arrow record batches
to Python and takes Arrow record batches back (``edgebroker.spark.arrow``).

The checkpoint folder holds ``files``: the batch files already ingested, which a run lists and
does not read again; ``unmoved``: the bad files that could not be moved out of the landing
area, skipped while unchanged; ``ingest.lock``: held by the pass working there, when the folder
is local (``edgebroker.spark.files.pass_lock``). The rows themselves are deduplicated against ``messages`` and among the
new batches, so a batch copied under another name, or read again after a crash between the two
writes, adds no row: a batch whose offset range (from its header) overlaps no other new batch,
no offset ``messages`` holds for its gateway in the partitions its rows fall in and no batch of
its gateway in the checkpoint goes in whole, without a shuffle; the rows of the other batches
are deduplicated row by row (dropDuplicates, then an anti-join with ``messages``), and those
added at an offset another record has are counted and logged (``reused_offsets``).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from datetime import datetime, timezone

import pyarrow as pa

from edgebroker.spark.arrow import SCHEMA as MESSAGE_SCHEMA, batch_summary, batch_to_arrow
from edgebroker.spark.dedup import clean_batches, new_rows, reused_offsets
from edgebroker.spark.files import _Fs, check_landing, list_landing, literal as _literal, \
    pass_lock, read_failure
from edgebroker.spark.quarantine import QUARANTINE_DDL, Unreadable, quarantine
from edgebroker.uploader.batch import BatchFormatError

log = logging.getLogger("edgebroker.spark")

MESSAGE_COLUMNS = MESSAGE_SCHEMA.names
# What the job needs of its session: hours and dates in UTC, timestamps written as Parquet
# TIMESTAMP_MICROS rather than the legacy INT96. cli.py sets them; a caller of ingest_once
# with a session of its own sets them too (docs/spark.md).
SESSION_CONFIG = {"spark.sql.session.timeZone": "UTC",
                  "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
# The first pass's rows: per batch file one of kind "batch" (its header) or "error", one of
# kind "date" per day its messages fall in (the partitions the file touches) and one of kind
# "hole" per run of offsets missing inside it (gap_first, gap_length; batch_time: the
# timestamp of the record right after it). Each row has the file's length and modification
# time (ms) as the read saw them.
SUMMARY_SCHEMA = pa.schema([("kind", pa.string()), ("path", pa.string()),
                            ("length", pa.int64()), ("mtime", pa.int64()),
                            ("gateway", pa.string()), ("date", pa.date32()),
                            ("batch_first", pa.int64()), ("batch_last", pa.int64()),
                            ("record_count", pa.int64()), ("gap_first", pa.int64()),
                            ("gap_length", pa.int64()), ("batch_time", pa.int64()),
                            ("error", pa.string())])
_SUMMARY_DDL = ("kind string, path string, length long, mtime long, gateway string, "
                "date date, batch_first long, batch_last long, record_count long, "
                "gap_first long, gap_length long, batch_time long, error string")
# Read back with this schema, not an inferred one: partition discovery would make a gateway id
# of digits an integer.
MESSAGES_DDL = ("gateway string, offset long, timestamp timestamp, date date, topic string, "
                "qos byte, retain boolean, client_id string, payload binary, "
                "properties struct<payload_format: byte, message_expiry: long, "
                "content_type: string, response_topic: string, correlation_data: binary, "
                "user_properties: array<struct<name: string, value: string>>>")
GAPS_DDL = ("gateway string, gap_first long, gap_last long, gap_length long, batch string, "
            "batch_time timestamp, reason string")
HOURLY_DDL = ("date date, gateway string, topic string, hour timestamp, messages long, "
              "bytes long, first_time timestamp, last_time timestamp")


def _summary_row(kind: str, path: str, stamp: tuple, header=None, error: str | None = None,
                 day=None) -> dict:
    row = dict.fromkeys(SUMMARY_SCHEMA.names)
    row.update(kind=kind, path=path, error=error, date=day, length=stamp[0], mtime=stamp[1])
    if header is not None:
        row.update(gateway=header.gateway_id, batch_first=header.first_offset,
                   batch_last=header.last_offset, record_count=header.record_count,
                   gap_first=header.gap_first, gap_length=header.gap_length,
                   batch_time=header.min_timestamp_ms)
    return row


def _files(batches, stamps: bool = False):
    """(path, content bytes) of each file in mapInArrow's (path, content) record batches;
    with ``stamps``, (path, content, (length, modification time in ms)) from (path, length,
    modificationTime, content) ones."""
    for rb in batches:
        contents = rb.column("content")
        if stamps:
            lengths = rb.column("length").to_pylist()
            mtimes = rb.column("modificationTime").cast(pa.int64()).to_pylist()
        for i, path in enumerate(rb.column("path").to_pylist()):
            if stamps:
                yield path, contents[i].as_py(), (lengths[i], mtimes[i] // 1000)
            else:
                yield path, contents[i].as_py()


def summarize_files(batches):
    """mapInArrow function, the first pass: (path, length, modificationTime, content) record
    batches in, a few rows per file out (SUMMARY_SCHEMA): each file is checked whole, its
    columns are not built."""
    for path, blob, stamp in _files(batches, stamps=True):
        try:
            header, days, holes = batch_summary(blob, path)
        except BatchFormatError as exc:
            rows = [_summary_row("error", path, stamp, error=str(exc))]
        except Exception as exc:  # a reader bug, MemoryError: the file alone is set apart
            rows = [_summary_row("error", path, stamp,
                                 error=f"{path}: cannot be read ({exc!r})")]
        else:
            rows = [_summary_row("batch", path, stamp, header)]
            rows += [_summary_row("date", path, stamp, header, day=day) for day in days]
            for first, length, after in holes:
                row = _summary_row("hole", path, stamp, header)
                row.update(gap_first=first, gap_length=length, batch_time=after)
                rows.append(row)
        yield pa.RecordBatch.from_pylist(rows, schema=SUMMARY_SCHEMA)


def decode_files(batches):
    """mapInArrow function, the second pass: (path, content) record batches in, the messages
    of each file out (MESSAGE_SCHEMA). The files are those the first pass found readable: one
    that no longer is (changed in between) fails the job with its error."""
    for path, blob in _files(batches):
        yield from batch_to_arrow(blob, path)[1].to_batches()


def _messages(spark, path: str):
    return spark.read.schema(MESSAGES_DDL).parquet(_literal(path))


def _in_partitions(spark, df, touched):
    """``df`` restricted to the (date, gateway) partitions in ``touched``: first to the days
    and gateways named (a filter Spark prunes partitions by), then to the pairs themselves by a
    semi-join with a small table of them. Not one condition per pair: a thousand of those
    chained with OR overflow the driver's stack when Spark analyses the plan."""
    from pyspark.sql import functions as F
    days = sorted({day for day, _ in touched})
    gateways = sorted({gw for _, gw in touched})
    pairs = spark.createDataFrame(sorted(touched), "date date, gateway string")
    return (df.where(F.col("date").isin(days) & F.col("gateway").isin(gateways))
            .join(F.broadcast(pairs), ["date", "gateway"], "left_semi")
            .select(*df.columns))


def _write_hourly(spark, tables: dict, touched) -> None:
    """Count ``messages`` again for the ``touched`` partitions into ``topic_hourly``, replacing
    those partitions (dynamic partition overwrite) and no other."""
    from pyspark.sql import functions as F
    hourly = (_in_partitions(spark, _messages(spark, tables["messages"]), touched)
              .groupBy("date", "gateway", "topic", F.date_trunc("hour", "timestamp").alias("hour"))
              .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.length("payload")).alias("bytes"),
                   F.min("timestamp").alias("first_time"), F.max("timestamp").alias("last_time")))
    (hourly.repartition("date", "gateway").write.mode("overwrite")
     .option("partitionOverwriteMode", "dynamic").partitionBy("date", "gateway")
     .parquet(tables["topic_hourly"]))


def ingest_once(spark, landing: str, warehouse: str, checkpoint: str | None = None) -> dict:
    """One pass over ``landing``: every batch file not ingested yet goes into the tables under
    ``warehouse``; what it did, as a dict (files, rows added, duplicates, quarantined, gaps).
    A pass holds the lock of a local checkpoint folder throughout; another pass over it raises
    ``edgebroker.spark.files.PassRunning`` at once, having done nothing.

    For the run, one batch file goes to ``mapInArrow`` in each Arrow record batch (Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 rows by default: here every file
    of a task at once): an executor's Python then decodes a file while its JVM reads the next,
    and holds one file's bytes rather than a whole split's. The setting is put back after."""
    fs = _Fs(spark)
    landing, warehouse = fs.qualify(landing), fs.qualify(warehouse)
    checkpoint = fs.qualify(checkpoint) if checkpoint else f"{warehouse}/_checkpoint"
    check_landing(landing)
    with pass_lock(checkpoint), \
            _settings(spark, {"spark.sql.execution.arrow.maxRecordsPerBatch": "1"}):
        return _ingest(spark, fs, landing, warehouse, checkpoint)


def _create_missing(spark, fs, tables: dict) -> None:
    """Write each table of ``tables`` whose folder is not there yet, empty, with its schema:
    its documented read (``spark.read.schema(GAPS_DDL)``) then finds no row rather than
    failing (PATH_NOT_FOUND) until its first row. An empty table is one Parquet file of no
    row, or for a partitioned one a folder of ``_SUCCESS`` alone. Appended: a pass that does
    the same at once (a warehouse on S3 takes no lock) adds one more file of no row."""
    for name, ddl in (("messages", MESSAGES_DDL), ("topic_hourly", HOURLY_DDL),
                      ("gaps", GAPS_DDL), ("quarantine", QUARANTINE_DDL)):
        if fs.exists(tables[name]):
            continue
        writer = spark.createDataFrame([], ddl).coalesce(1).write.mode("append")
        if name in ("messages", "topic_hourly"):
            writer = writer.partitionBy("date", "gateway")
        writer.parquet(tables[name])


@contextmanager
def _settings(spark, settings: dict):
    """``settings`` (Spark's session configuration) for the block, put back after."""
    before = {key: spark.conf.get(key) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)


def _unopened(fs, paths, report: dict) -> list:
    """The files of ``paths`` that the first pass's scan passed over (the files it could not
    open are skipped there, not failing the pass): those the driver cannot open either, as
    ``Unreadable`` (the error names the cause); one that is gone or reads whole now is logged and
    left for the next run (``changed_since_read``)."""
    bad = []
    for path in paths:
        stamp = fs.stamp(path)
        cause = None if stamp is None else fs.open_error(path)
        if cause is None:
            log.warning("%s was not read by this run (%s): left for the next run", path,
                        "gone" if stamp is None else "it reads whole now")
            report["changed_since_read"].append(path)
        else:
            bad.append(Unreadable(path, f"{path}: cannot be opened ({cause})", *stamp))
    return bad


def _first_pass(spark, fs, files, paths: list, report: dict) -> tuple[list, list]:
    """The first pass over ``paths`` (``files``: their binaryFile scan): its summary rows, and
    the files set apart unread. A file it cannot open, or that is gone, is skipped by the scan
    (then looked at by ``_unopened``). A read error Spark does not skip (Hadoop's local
    FSError, a disk's EIO) fails the scan whole: its files are then scanned again in halves,
    and halves of those, down to the files that fail alone, each set apart with the read's
    error (one gone by then is left for the next run); a failure of any other kind is the
    run's own, and raised. k such files among n take at most about 2k·log2(n) more scans."""
    from py4j.protocol import Py4JJavaError
    summary, failed, groups, scans = [], {}, [paths], 0
    while groups:
        group = groups.pop()
        scans += 1
        if group is not paths:
            files = spark.read.format("binaryFile").load([_literal(p) for p in group])
        try:
            with _settings(spark, {"spark.sql.files.ignoreCorruptFiles": "true",
                                   "spark.sql.files.ignoreMissingFiles": "true"}):
                summary += files.select("path", "length", "modificationTime", "content") \
                    .mapInArrow(summarize_files, _SUMMARY_DDL).collect()
        except Py4JJavaError as exc:
            cause = read_failure(exc)
            if cause is None:
                raise
            if len(group) == 1:
                failed[group[0]] = cause
            else:
                groups += [group[len(group) // 2:], group[:len(group) // 2]]
    bad = []
    for path, cause in sorted(failed.items()):
        stamp = fs.stamp(path)
        if stamp is None:
            log.warning("%s was not read by this run (gone): left for the next run", path)
            report["changed_since_read"].append(path)
        else:
            bad.append(Unreadable(path, f"{path}: cannot be read ({cause})", *stamp))
    if scans > 1:
        log.warning("the first pass failed reading a file: %d more scans to find the files "
                    "that fail alone (%d)", scans - 1, len(failed))
    read = {r.path for r in summary} | set(failed)
    return summary, bad + _unopened(fs, sorted(set(paths) - read), report)


def _ingest(spark, fs, landing_q: str, warehouse: str, checkpoint: str) -> dict:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    tables = {name: f"{warehouse}/{name}"
              for name in ("messages", "topic_hourly", "gaps", "quarantine")}
    files_table, unmoved_table = f"{checkpoint}/files", f"{checkpoint}/unmoved"

    listed, empty = list_landing(spark, fs, landing_q)
    done = set()
    if fs.exists(files_table):
        done = {r.path for r in spark.read.parquet(_literal(files_table)).select("path").collect()}
    if fs.exists(unmoved_table):   # bad files that could not be moved: skipped while unchanged
        done |= {(r.path, r.length, r.mtime) for r in spark.read.parquet(
            _literal(unmoved_table)).select("path", "length", "mtime").collect()}
    new = sorted(path for path, *stamp in listed
                 if path not in done and (path, *stamp) not in done)
    empty = [(path, mtime) for path, mtime in empty if (path, 0, mtime) not in done]
    report = {"files_listed": len(listed) + len(empty), "files_new": len(new) + len(empty),
              "batches": 0, "records": 0, "rows_added": 0, "duplicates": 0, "reused_offsets": 0,
              "gaps_added": 0, "quarantined": [], "not_moved": [], "changed_since_read": []}
    if not new and not empty:
        _create_missing(spark, fs, tables)
        report["seconds"] = round(time.monotonic() - t0, 3)
        return report

    # Two passes over the new files, nothing cached: the first checks every file whole
    # (batch_days: no columns built) and keeps only its summary rows; the second decodes the
    # readable ones (about 1M records/s per core) straight into the write. The first skips a
    # file it cannot open (or that is gone), which the driver then looks at; the second does
    # not: a file read there is one the first pass read.
    summary, bad, files = [], [], None
    if new:
        files = spark.read.format("binaryFile").load([_literal(p) for p in new])
        summary, bad = _first_pass(spark, fs, files, new, report)
        files = files.select("path", "content")
    good = [r for r in summary if r.kind == "batch"]
    bad += [r for r in summary if r.kind == "error"]
    bad += [Unreadable(path, f"{path}: empty file (0 bytes), not a batch", 0, mtime)
            for path, mtime in empty]
    touched = sorted({(r.date, r.gateway) for r in summary if r.kind == "date"})
    report["batches"] = len(good)
    report["records"] = sum(r.record_count for r in good)

    # Deduplication (edgebroker.spark.dedup) by offset ranges first: the offsets already in
    # `messages` in the partitions the new rows fall in (a record's partition is fixed by its
    # own timestamp, so a copy of it can only be there), and those of every batch of the
    # gateway the checkpoint names, or else those `messages` holds for it (any partition: a new
    # record at an offset ingested before must be looked at), as one range per gateway.
    existing = None
    if touched and fs.exists(tables["messages"]):
        existing = _in_partitions(spark, _messages(spark, tables["messages"]), touched)
    spans = []
    if existing is not None:
        spans = existing.groupBy("gateway").agg(F.min("offset").alias("low"),
                                                F.max("offset").alias("high")).collect()
    named = []
    if good and done:
        named = (spark.read.parquet(_literal(files_table))
                 .where(F.col("gateway").isin(sorted({r.gateway for r in good})))
                 .groupBy("gateway").agg(F.min("batch_first").alias("low"),
                                         F.max("batch_last").alias("high")).collect())
    spans += named
    # A gateway the checkpoint does not name (a new one, or the checkpoint was lost): the span
    # of its offsets in `messages` on any day. Nothing is read for a new gateway (its partitions
    # are pruned), a gateway's whole offset column only after a lost checkpoint.
    unnamed = sorted({r.gateway for r in good} - {r.gateway for r in named})
    if unnamed and fs.exists(tables["messages"]):
        spans += (_messages(spark, tables["messages"]).where(F.col("gateway").isin(unnamed))
                  .groupBy("gateway").agg(F.min("offset").alias("low"),
                                          F.max("offset").alias("high")).collect())
    ranges: dict = {}
    for r in spans:
        if r.low is not None:
            low, high = ranges.get(r.gateway, (r.low, r.high))
            ranges[r.gateway] = (min(low, r.low), max(high, r.high))
    clean = clean_batches(good, ranges)
    overlapping = sorted(r.path for r in good if r.path not in clean)
    log.info("%d new batches: %d need no deduplication, %d overlap another batch or messages",
             len(good), len(clean), len(overlapping))

    def decoded(paths):
        # The files listed once more (a Spark job of its own beyond 32 paths) only for a part.
        chosen = files if len(paths) == len(new) else \
            spark.read.format("binaryFile").load([_literal(p) for p in paths]) \
            .select("path", "content")
        return chosen.mapInArrow(decode_files, MESSAGES_DDL)

    # The rows of a batch that overlaps nothing all go in as they are (no shuffle); the rows of
    # the others are deduplicated among themselves and anti-joined with `messages`, and those
    # left that reuse an offset another record has are counted and logged (kept all the same).
    added = sum(r.record_count for r in good if r.path in clean)
    parts, dedup, reused = [], None, []
    try:
        if clean:
            parts.append(decoded(sorted(clean)))
        if overlapping:
            dedup = new_rows(decoded(overlapping), existing).persist(StorageLevel.MEMORY_AND_DISK)
            added += dedup.count()
            parts.append(dedup)
            all_messages = None
            if fs.exists(tables["messages"]):
                all_messages = _messages(spark, tables["messages"])
            reused = reused_offsets(spark, dedup, all_messages)
        report["rows_added"] = added
        report["duplicates"] = report["records"] - added
        report["reused_offsets"] = sum(r.offsets for r in reused)
        for r in reused:
            log.warning("gateway %s: %d offsets in %d..%d now hold more than one record (other "
                        "timestamps or contents: its log started over under the same gateway "
                        "id?); all are kept", r.gateway, r.offsets, r.low, r.high)
        if added:
            rows = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
            rows.write.mode("append").partitionBy("date", "gateway").parquet(tables["messages"])
        if touched:
            # Also when nothing was added: a run that crashed between the append above and
            # this write left messages ahead of topic_hourly, and its files are read again.
            _write_hourly(spark, tables, touched)
    finally:   # also when a write fails: --continuous retries, each pass caching its rows
        if dedup is not None:
            dedup.unpersist()

    # A gap is known by its gateway, range and the earliest timestamp of the batch reporting it
    # (batch_time): the same gap reported again (a batch copied, re-cut, read again) adds no
    # row; a log that started over under the same gateway id reports its gaps at other times.
    # Rows written before batch_time existed (null there) match any time. The offsets missing
    # inside a batch (records damaged when it was cut, left out) are gaps too, their time that
    # of the record right after them: a batch re-cut to begin there reports the same gap, at
    # that time or earlier (its earliest timestamp, which is another record's when the clock
    # went back). So a damage gap and a reported one of the same range are one gap when the
    # reported one's time is not after the damage one's; reported later, it is a later life's.
    gaps: dict = {}
    for r in good + [r for r in summary if r.kind == "hole"]:
        if r.gap_length:
            gaps.setdefault((r.gateway, r.gap_first, r.gap_length, r.batch_time),
                            (r.path, "reported" if r.kind == "batch" else "damage"))
    held = []
    if gaps and fs.exists(tables["gaps"]):
        held = (spark.read.schema(GAPS_DDL).parquet(_literal(tables["gaps"]))
                .selectExpr("gateway", "gap_first", "gap_length", "unix_millis(batch_time) AS t",
                            "coalesce(reason, 'reported') AS reason")
                .collect())
        timeless = {(r.gateway, r.gap_first, r.gap_length) for r in held if r.t is None}
        known = {(r.gateway, r.gap_first, r.gap_length, r.t) for r in held}
        gaps = {k: v for k, v in gaps.items() if k not in known and k[:3] not in timeless}
    times: dict = {}   # (gateway, gap_first, gap_length, reason) -> the times held
    for r in held:
        times.setdefault((r.gateway, r.gap_first, r.gap_length, r.reason), []).append(r.t)
    for key, (path, reason) in sorted(gaps.items()):
        t = key[3]
        if reason == "reported":
            same = any(d is None or t <= d for d in times.get((*key[:3], "damage"), ()))
        else:
            same = any(r is None or r <= t for r in times.get((*key[:3], "reported"), ()))
        if same:
            del gaps[key]
        else:
            times.setdefault((*key[:3], reason), []).append(t)
    if gaps:
        rows = [(gw, first, first + length - 1, length, path,
                 datetime.fromtimestamp(t / 1000, timezone.utc), reason)
                for (gw, first, length, t), (path, reason) in sorted(gaps.items())]
        (spark.createDataFrame(rows, GAPS_DDL).coalesce(1).write.mode("append")
         .parquet(tables["gaps"]))
        for row in rows:
            log.warning("gateway %s: offsets %d..%d (%d) lost, %s in %s", *row[:4],
                        "reported" if row[6] == "reported" else "missing (damage)", row[4])
    report["gaps_added"] = len(gaps)

    quarantine(spark, fs, bad, landing_q, warehouse,
               (tables["quarantine"], _literal(tables["quarantine"])), unmoved_table, report)

    _create_missing(spark, fs, tables)
    now = datetime.now(timezone.utc)
    if good:
        (spark.createDataFrame([(r.path, r.gateway, r.batch_first, r.batch_last, r.record_count,
                                 now) for r in good],
                               "path string, gateway string, batch_first long, batch_last long, "
                               "record_count long, ingested_at timestamp")
         .coalesce(1).write.mode("append").parquet(files_table))
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report
