"""The ingest job: a landing area of upload batches
(``<prefix>/gateway=<id>/date=<YYYY-MM-DD>/<first:020>-<last:020>.ebb.zst``) into Parquet tables
under a warehouse folder (docs/spark.md):

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
  left for the next run (``edgebroker.spark.quarantine``).

Spark 3.5 has no Python data source API (``pyspark.sql.datasource`` arrives in Spark 4), so the
files are read with Spark's ``binaryFile`` source (any Hadoop file system: local, ``s3a://``,
``hdfs://``) and decoded in the executors by ``mapInArrow``, which hands Arrow record batches
to Python and takes Arrow record batches back (``edgebroker.spark.arrow``).

The checkpoint folder holds ``files``: the batch files already ingested, which a run lists and
does not read again. The rows themselves are deduplicated against ``messages`` and among the
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
from datetime import datetime, timezone

import pyarrow as pa

from edgebroker.spark.arrow import SCHEMA as MESSAGE_SCHEMA, batch_summary, batch_to_arrow
from edgebroker.spark.dedup import clean_batches, new_rows, reused_offsets
from edgebroker.spark.quarantine import Unreadable, quarantine
from edgebroker.uploader.batch import SUFFIX, BatchFormatError

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


class _Fs:
    """The few Hadoop FileSystem calls the driver makes (exists, status, rename, qualify)."""

    def __init__(self, spark):
        self.jvm = spark._jvm
        self.conf = spark._jsc.hadoopConfiguration()

    def _path(self, p: str):
        return self.jvm.org.apache.hadoop.fs.Path(p)

    def qualify(self, p: str) -> str:
        path = self._path(p)
        return str(path.getFileSystem(self.conf).makeQualified(path).toString()).rstrip("/")

    def exists(self, p: str) -> bool:
        path = self._path(p)
        return bool(path.getFileSystem(self.conf).exists(path))

    def status(self, uri: str) -> tuple[str, int, int]:
        """(path as Spark's scans name it, length, modification time in ms) of the file at
        ``uri``."""
        path = self.jvm.org.apache.hadoop.fs.Path(self.jvm.java.net.URI(uri))
        st = path.getFileSystem(self.conf).getFileStatus(path)
        return str(st.getPath().toString()), int(st.getLen()), int(st.getModificationTime())

    def stamp(self, p: str) -> tuple[int, int] | None:
        """(length, modification time in ms) of the file at ``p``; None when there is none."""
        from py4j.protocol import Py4JJavaError
        path = self._path(p)
        try:
            st = path.getFileSystem(self.conf).getFileStatus(path)
        except Py4JJavaError as exc:
            if "FileNotFoundException" in str(exc.java_exception.getClass().getName()):
                return None
            raise
        return int(st.getLen()), int(st.getModificationTime())

    def free_name(self, dst: str) -> str:
        """``dst``, or ``dst.1``, ``dst.2``... when that name is taken (the same bad batch
        uploaded again)."""
        fs = self._path(dst).getFileSystem(self.conf)
        name, n = dst, 0
        while fs.exists(self._path(name)):
            n += 1
            name = f"{dst}.{n}"
        return name

    def move(self, src: str, dst: str) -> None:
        s = self._path(src)
        fs = s.getFileSystem(self.conf)
        fs.mkdirs(self._path(dst).getParent())
        if not fs.rename(s, self._path(dst)):
            raise OSError(f"cannot move {src} to {dst}")


def _list_landing(spark, fs, landing: str) -> tuple[list, list]:
    """The batch files under ``landing``: (paths of those with bytes, (path, modification
    time in ms) of empty ones).
    Spark's file scans drop empty files, so those are the files the listing (``inputFiles``,
    which keeps them; URIs there) names beyond the scan's rows, each confirmed empty by the
    file system. The names skipped are Spark's: starting with ``.`` or ``_``."""
    df = (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
          .option("pathGlobFilter", f"*{SUFFIX}").load(_literal(landing)))
    listed = [r.path for r in df.select("path").collect()]
    have = {_path_key(p) for p in listed}
    empty = []
    for uri in df.inputFiles():
        if _uri_key(uri) not in have:
            path, length, mtime = fs.status(uri)
            if length == 0:
                empty.append((path, mtime))
    return listed, sorted(empty)


def _literal(path: str) -> str:
    """``path`` with the characters Spark's ``load`` would take for a glob pattern escaped
    (Hadoop's ``\\``): a landing area named ``land[1]`` is that folder, not ``land1``."""
    return "".join("\\" + ch if ch in "\\{}[]*?" else ch for ch in path)


def _path_key(p: str) -> str:
    """A path as the scan's rows name it (Hadoop's ``Path.toString``: ``file:/a b#1%41``, not
    escaped) in the form ``_uri_key`` gives."""
    scheme, _, rest = p.partition(":")
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        return f"{scheme}://{authority}{slash}{path}"
    return f"{scheme}://{rest}"


def _uri_key(uri: str) -> str:
    """A path as ``inputFiles`` names it (a URI: ``file:///a%20b%231%2541``), in one form with
    ``_path_key``'s, to compare them by: a file both name is not looked up again."""
    from urllib.parse import unquote, urlsplit
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"


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

    For the run, one batch file goes to ``mapInArrow`` in each Arrow record batch (Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 rows by default: here every file
    of a task at once): an executor's Python then decodes a file while its JVM reads the next,
    and holds one file's bytes rather than a whole split's. The setting is put back after."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "1")
    try:
        return _ingest(spark, landing, warehouse, checkpoint)
    finally:
        spark.conf.set(key, before)


def _ingest(spark, landing: str, warehouse: str, checkpoint: str | None) -> dict:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    fs = _Fs(spark)
    warehouse = fs.qualify(warehouse)
    checkpoint = fs.qualify(checkpoint) if checkpoint else f"{warehouse}/_checkpoint"
    landing_q = fs.qualify(landing)
    t0 = time.monotonic()
    tables = {name: f"{warehouse}/{name}"
              for name in ("messages", "topic_hourly", "gaps", "quarantine")}
    files_table = f"{checkpoint}/files"

    listed, empty = _list_landing(spark, fs, landing_q)
    done = set()
    if fs.exists(files_table):
        done = {r.path for r in spark.read.parquet(_literal(files_table)).select("path").collect()}
    new = sorted(path for path in listed if path not in done)
    report = {"files_listed": len(listed) + len(empty), "files_new": len(new) + len(empty),
              "batches": 0, "records": 0, "rows_added": 0, "duplicates": 0, "reused_offsets": 0,
              "gaps_added": 0, "quarantined": [], "changed_since_read": []}
    if not new and not empty:
        report["seconds"] = round(time.monotonic() - t0, 3)
        return report

    # Two passes over the new files, nothing cached: the first checks every file whole
    # (batch_days: no columns built) and keeps only its summary rows; the second decodes the
    # readable ones (about 1M records/s per core) straight into the write.
    summary = []
    if new:
        files = spark.read.format("binaryFile").load([_literal(p) for p in new])
        summary = files.select("path", "length", "modificationTime", "content") \
            .mapInArrow(summarize_files, _SUMMARY_DDL).collect()
        files = files.select("path", "content")
    good = [r for r in summary if r.kind == "batch"]
    bad = [r for r in summary if r.kind == "error"]
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
    # of the record right after them: a batch re-cut to begin there reports the same gap. A
    # damage gap and a reported one of the same range are one gap whatever their times (the
    # batch's earliest timestamp is not the record's after the hole when the clock went back).
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
    kinds = {(r.gateway, r.gap_first, r.gap_length, r.reason) for r in held}
    for key, (path, reason) in sorted(gaps.items()):
        other = "reported" if reason == "damage" else "damage"
        if (*key[:3], other) in kinds:
            del gaps[key]
        else:
            kinds.add((*key[:3], reason))
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
               (tables["quarantine"], _literal(tables["quarantine"])), report)

    now = datetime.now(timezone.utc)
    if good:
        (spark.createDataFrame([(r.path, r.gateway, r.batch_first, r.batch_last, r.record_count,
                                 now) for r in good],
                               "path string, gateway string, batch_first long, batch_last long, "
                               "record_count long, ingested_at timestamp")
         .coalesce(1).write.mode("append").parquet(files_table))
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report
