"""The ingest job: a landing area of upload batches
(``<prefix>/gateway=<id>/date=<YYYY-MM-DD>/<first:020>-<last:020>.ebb.zst``) into Parquet tables
under a warehouse folder (docs/spark.md):

* ``messages`` (gateway, offset, timestamp, date, topic, qos, retain, client_id, payload,
  properties: the MQTT 5.0 ones, a struct, null for none),
  partitioned by date and gateway, one row per (gateway, offset) however often a batch is
  uploaded, copied or read;
* ``topic_hourly`` (gateway, topic, hour, messages, bytes, first_time, last_time), recomputed
  from ``messages`` for the partitions a run touches;
* ``gaps`` (gateway, gap_first, gap_last, gap_length, batch): offsets a gateway reported that no
  batch will ever hold;
* ``quarantine`` (path, moved_to, error, time): batches that could not be read, moved out of
  the landing area to ``<warehouse>/_quarantine/`` (Spark skips names starting with ``_``).

Spark 3.5 has no Python data source API (``pyspark.sql.datasource`` arrives in Spark 4), so the
files are read with Spark's ``binaryFile`` source (any Hadoop file system: local, ``s3a://``,
``hdfs://``) and decoded in the executors by ``mapInArrow``, which hands Arrow record batches
to Python and takes Arrow record batches back (``edgebroker.spark.arrow``).

The checkpoint folder holds ``files``: the batch files already ingested, which a run lists and
does not read again. The rows themselves are deduplicated against ``messages`` (an anti-join on
(gateway, offset) over the partitions the new rows fall in), so a batch copied under another
name, or read again after a crash between the two writes, adds no row.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from edgebroker.spark.arrow import SCHEMA as MESSAGE_SCHEMA, batch_to_arrow
from edgebroker.uploader.batch import SUFFIX, BatchFormatError

log = logging.getLogger("edgebroker.spark")

MESSAGE_COLUMNS = MESSAGE_SCHEMA.names
# What the job needs of its session: hours and dates in UTC, timestamps written as Parquet
# TIMESTAMP_MICROS rather than the legacy INT96. cli.py sets them; a caller of ingest_once
# with a session of its own sets them too (docs/spark.md).
SESSION_CONFIG = {"spark.sql.session.timeZone": "UTC",
                  "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
# One row per batch file (kind "batch" or "error") besides the message rows (kind "message").
_BATCH_FIELDS = [("kind", pa.string()), ("path", pa.string()), ("batch_first", pa.int64()),
                 ("batch_last", pa.int64()), ("record_count", pa.int64()),
                 ("gap_first", pa.int64()), ("gap_length", pa.int64()), ("error", pa.string())]
DECODED_SCHEMA = pa.schema(list(MESSAGE_SCHEMA) + _BATCH_FIELDS)
# Read back with this schema, not an inferred one: partition discovery would make a gateway id
# of digits an integer.
MESSAGES_DDL = ("gateway string, offset long, timestamp timestamp, date date, topic string, "
                "qos byte, retain boolean, client_id string, payload binary, "
                "properties struct<payload_format: byte, message_expiry: long, "
                "content_type: string, response_topic: string, correlation_data: binary, "
                "user_properties: array<struct<name: string, value: string>>>")
HOURLY_DDL = ("date date, gateway string, topic string, hour timestamp, messages long, "
              "bytes long, first_time timestamp, last_time timestamp")
_DECODED_DDL = (MESSAGES_DDL + ", kind string, path string, batch_first long, batch_last long, "
                "record_count long, gap_first long, gap_length long, error string")


def _summary_row(kind: str, path: str, header=None, error: str | None = None,
                 day=None) -> pa.RecordBatch:
    row = {name: [None] for name in DECODED_SCHEMA.names}
    row.update(kind=[kind], path=[path], error=[error], date=[day])
    if header is not None:
        row.update(gateway=[header.gateway_id], batch_first=[header.first_offset],
                   batch_last=[header.last_offset], record_count=[header.record_count],
                   gap_first=[header.gap_first], gap_length=[header.gap_length])
    return pa.RecordBatch.from_pydict(row, schema=DECODED_SCHEMA)


def decode_files(batches):
    """mapInArrow function: (path, content) record batches in, decoded rows out: the messages of
    each readable batch file, one summary row per file (kind "batch" or "error") and one row
    of kind "date" per day the file's messages fall in (the partitions the run touches)."""
    for rb in batches:
        paths = rb.column("path").to_pylist()
        contents = rb.column("content")
        for i, path in enumerate(paths):
            try:
                header, table = batch_to_arrow(contents[i].as_py(), path)
            except BatchFormatError as exc:
                yield _summary_row("error", path, error=str(exc))
                continue
            n = table.num_rows
            # A message row's path is null (its batch's summary row has it): 2M copies of a
            # long URI would only weigh on the shuffles.
            extra = [pa.repeat(pa.scalar("message", pa.string()), n)]
            extra += [pa.nulls(n, t) for _, t in _BATCH_FIELDS[1:]]
            for rb_out in pa.Table.from_arrays(table.columns + extra,
                                               schema=DECODED_SCHEMA).to_batches():
                yield rb_out
            for day in pc.unique(table.column("date")).to_pylist():
                yield _summary_row("date", path, header, day=day)
            yield _summary_row("batch", path, header)


class _Fs:
    """The few Hadoop FileSystem calls the driver makes (exists, rename, qualify)."""

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

    def move(self, src: str, dst: str) -> str:
        """Move ``src`` to ``dst``, or to ``dst.1``, ``dst.2``... when that name is taken (the
        same bad batch uploaded again); the name it got."""
        s = self._path(src)
        fs = s.getFileSystem(self.conf)
        fs.mkdirs(self._path(dst).getParent())
        name, n = dst, 0
        while fs.exists(self._path(name)):
            n += 1
            name = f"{dst}.{n}"
        if not fs.rename(s, self._path(name)):
            raise OSError(f"cannot move {src} to {name}")
        return name


def _messages(spark, path: str):
    return spark.read.schema(MESSAGES_DDL).parquet(path)


def _in_partitions(df, touched):
    """``df`` restricted to the (date, gateway) partitions in ``touched`` (pruned by Spark)."""
    from pyspark.sql import functions as F
    cond = None
    for day, gw in touched:
        c = (F.col("date") == F.lit(day)) & (F.col("gateway") == F.lit(gw))
        cond = c if cond is None else cond | c
    return df.where(cond)


def ingest_once(spark, landing: str, warehouse: str, checkpoint: str | None = None) -> dict:
    """One pass over ``landing``: every batch file not ingested yet goes into the tables under
    ``warehouse``; what it did, as a dict (files, rows added, duplicates, quarantined, gaps)."""
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

    listed = (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
              .option("pathGlobFilter", f"*{SUFFIX}").load(landing_q)
              .select("path", "length").collect())
    done = set()
    if fs.exists(files_table):
        done = {r.path for r in spark.read.parquet(files_table).select("path").collect()}
    new = sorted(r.path for r in listed if r.path not in done)
    report = {"files_listed": len(listed), "files_new": len(new), "batches": 0, "records": 0,
              "rows_added": 0, "duplicates": 0, "gaps_added": 0, "quarantined": []}
    if not new:
        report["seconds"] = round(time.monotonic() - t0, 3)
        return report

    # Not cached: decoding again (about 1M records/s per core) costs less than caching every
    # message; the first pass keeps only the summary and date rows.
    decoded = (spark.read.format("binaryFile").load(new).select("path", "content")
               .mapInArrow(decode_files, _DECODED_DDL))
    summary = (decoded.where(F.col("kind") != "message")
               .drop(*(c for c in MESSAGE_COLUMNS if c not in ("gateway", "date"))).collect())
    good = [r for r in summary if r.kind == "batch"]
    bad = [r for r in summary if r.kind == "error"]
    touched = sorted({(r.date, r.gateway) for r in summary if r.kind == "date"})
    report["batches"] = len(good)
    report["records"] = sum(r.record_count for r in good)

    msgs = (decoded.where(F.col("kind") == "message").select(*MESSAGE_COLUMNS)
            .dropDuplicates(["gateway", "offset"]))
    if touched and fs.exists(tables["messages"]):
        existing = _in_partitions(_messages(spark, tables["messages"]), touched)
        msgs = msgs.join(existing.select("gateway", "offset"), ["gateway", "offset"], "left_anti")
    msgs = msgs.persist(StorageLevel.MEMORY_AND_DISK)
    added = msgs.count()
    report["rows_added"] = added
    report["duplicates"] = report["records"] - added
    if added:
        (msgs.repartition("date", "gateway").write.mode("append").partitionBy("date", "gateway")
         .parquet(tables["messages"]))
        hourly = (_in_partitions(_messages(spark, tables["messages"]), touched)
                  .groupBy("date", "gateway", "topic",
                           F.date_trunc("hour", "timestamp").alias("hour"))
                  .agg(F.count(F.lit(1)).alias("messages"),
                       F.sum(F.length("payload")).alias("bytes"),
                       F.min("timestamp").alias("first_time"),
                       F.max("timestamp").alias("last_time")))
        (hourly.repartition("date", "gateway").write.mode("overwrite")
         .option("partitionOverwriteMode", "dynamic").partitionBy("date", "gateway")
         .parquet(tables["topic_hourly"]))
    msgs.unpersist()

    gaps = {(r.gateway, r.gap_first): (r.gap_length, r.path) for r in good if r.gap_length}
    if gaps and fs.exists(tables["gaps"]):
        for r in spark.read.parquet(tables["gaps"]).select("gateway", "gap_first").collect():
            gaps.pop((r.gateway, r.gap_first), None)
    if gaps:
        rows = [(gw, first, first + length - 1, length, path)
                for (gw, first), (length, path) in sorted(gaps.items())]
        (spark.createDataFrame(rows, "gateway string, gap_first long, gap_last long, "
                                     "gap_length long, batch string")
         .coalesce(1).write.mode("append").parquet(tables["gaps"]))
        for row in rows:
            log.warning("gateway %s reports offsets %d..%d lost (%d), in %s", *row[:3], row[3],
                        row[4])
    report["gaps_added"] = len(gaps)

    now = datetime.now(timezone.utc)
    moved = []
    for r in bad:
        rel = r.path[len(landing_q) + 1:] if r.path.startswith(landing_q + "/") else \
            r.path.rsplit("/", 1)[-1]
        dst = fs.move(r.path, f"{warehouse}/_quarantine/{rel}")
        log.error("quarantined %s (moved to %s): %s", r.path, dst, r.error)
        moved.append((r.path, dst, r.error, now))
        report["quarantined"].append({"path": r.path, "moved_to": dst, "error": r.error})
    if moved:
        (spark.createDataFrame(moved, "path string, moved_to string, error string, "
                                      "time timestamp")
         .coalesce(1).write.mode("append").parquet(tables["quarantine"]))

    if good:
        (spark.createDataFrame([(r.path, r.gateway, r.batch_first, r.batch_last, r.record_count,
                                 now) for r in good],
                               "path string, gateway string, batch_first long, batch_last long, "
                               "record_count long, ingested_at timestamp")
         .coalesce(1).write.mode("append").parquet(files_table))
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report
