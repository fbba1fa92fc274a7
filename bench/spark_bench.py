"""Spark ingest rows/s against Spark's own JSON reader, on local[2], in the same run.

    PYSPARK_PYTHON=/work/main/.venv/bin/python PYTHONPATH=. \
        /work/main/.venv/bin/python bench/spark_bench.py [--records 2000000] [--rounds 3]

Writes ``--records`` records (100-byte payloads, 20 topics, 4 clients, qos 0-2, one gateway,
timestamps 10 ms apart) as upload batches of about 8 MiB raw with the project's own writer
(``write_batch``), and the same records as JSON lines (gateway, offset, timestamp, topic, qos,
retain, client_id, payload base64) in files of the same row counts. After a warm-up of every step
on 100,000 records, alternating, for a few rounds:

* end to end: ``ingest_once`` into a fresh warehouse (decode, messages table, topic_hourly)
  against ``spark.read.json`` with an explicit schema writing the same ``messages`` table
  (partitioned by date and gateway, deduplicated on (gateway, offset)) and the same hourly
  aggregate. The same session for both (2 shuffle partitions, Parquet with Spark's default
  snappy), both write ``messages`` without a shuffle to group rows by partition first, both
  recompute ``topic_hourly`` from the written ``messages``. Deduplication differs by what each
  input knows: ``ingest_once`` checks the batches' header offset ranges (these do not overlap,
  so no row-level pass); JSON lines carry no ranges, so ``dropDuplicates``. The warehouse is
  new, so neither anti-joins with an existing table. ``ingest_once`` also does its own
  bookkeeping (listing, the files checkpoint);
* decode only: the count of the ``mapInArrow`` output against the count of ``spark.read.json``
  with the schema (every column materialised: the count is of a non-null-filtered projection).

Prints rows/s of each (median of the rounds), the ratio ours/JSON of the medians, and the ratio
of each round with their median; the target (issue 23) is ours >= 1.5x the JSON reader end to
end.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from edgebroker import _native  # noqa: E402
from edgebroker.uploader.batch import BatchHeader, object_name, write_batch  # noqa: E402
from sparklocal import local_session  # noqa: E402  (the tests' local[2] session)

GATEWAY = "gw-bench"
BATCH_RAW = 8 * 1024 * 1024
T0_MS = 1_767_225_600_000   # 2026-01-01T00:00:00Z
WARM_UP = 100_000           # records of the warm-up inputs
JSON_DDL = ("gateway string, offset long, timestamp timestamp, topic string, qos byte, "
            "retain boolean, client_id string, payload string")


def record(i: int) -> tuple:
    ts = T0_MS + i * 10
    qos = i % 3
    retain = i % 50 == 0
    cid = f"sensor-{i % 4}".encode()
    topic = f"site/line{i % 5}/cell{i % 4}/temp".encode()
    payload = (b"%08d" % i) * 12 + b"%04d" % (i % 10000)   # 100 bytes
    return i, ts, qos, retain, cid, topic, payload


def make_inputs(root: Path, n: int) -> tuple[Path, Path, int]:
    """Landing folder of batches and folder of JSON-lines files; the number of batches. Made
    once for each number of records in a --dir, then reused."""
    root.mkdir(parents=True, exist_ok=True)
    landing, jdir, made = root / "landing", root / "json", root / f"made-{n}"
    if made.exists():
        return landing, jdir, int(made.read_text())
    shutil.rmtree(landing, ignore_errors=True)
    shutil.rmtree(jdir, ignore_errors=True)
    landing.mkdir()
    jdir.mkdir()
    batches = 0
    i = 0
    while i < n:
        chunks, size, rows, stamps = [], 0, [], []
        while i < n and size < BATCH_RAW:
            off, ts, qos, retain, cid, topic, payload = record(i)
            head = bytes(_native.record_header(off, ts, qos | (4 if retain else 0), cid, topic,
                                               payload))
            rec = head + cid + topic + payload
            chunks.append(rec)
            size += len(rec)
            stamps.append(ts)
            rows.append(json.dumps({
                "gateway": GATEWAY, "offset": off,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts // 1000))
                + f".{ts % 1000:03d}Z",
                "topic": topic.decode(), "qos": qos, "retain": retain,
                "client_id": cid.decode(), "payload": base64.b64encode(payload).decode()}))
            i += 1
        first, last = i - len(chunks), i - 1
        raw = b"".join(chunks)
        header = BatchHeader(GATEWAY, first, last, len(chunks), min(stamps), max(stamps),
                             len(raw), _native.crc32c(raw))
        path = landing / object_name("", GATEWAY, first, last, stamps[0])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            write_batch(fh, header, [raw])
        (jdir / f"{first:020d}.json").write_text("\n".join(rows) + "\n")
        batches += 1
    made.write_text(str(batches))
    return landing, jdir, batches


def session():
    return local_session("edgebroker-spark-bench", **{"spark.ui.showConsoleProgress": "false",
                                                      "spark.driver.memory": "2g"})


def ours_e2e(spark, landing: Path, warehouse: Path) -> int:
    from edgebroker.spark.ingest import ingest_once
    return ingest_once(spark, str(landing), str(warehouse))["rows_added"]


def json_e2e(spark, jdir: Path, warehouse: Path) -> int:
    """The JSON equivalent of ingest_once's table work: messages (deduplicated, partitioned
    by date and gateway) and topic_hourly from it. Like ingest_once it writes the messages
    without a shuffle to group them by partition first (files per partition: the writing
    tasks that hold some of its rows), and counts the rows it added from what it wrote."""
    from pyspark.sql import functions as F
    from edgebroker.spark.ingest import MESSAGE_COLUMNS, MESSAGES_DDL
    properties = spark.createDataFrame([], MESSAGES_DDL).schema["properties"].dataType
    msgs = (spark.read.schema(JSON_DDL).json(str(jdir))
            .withColumn("payload", F.unbase64("payload"))
            .withColumn("date", F.to_date("timestamp"))
            # 3.1.1 records: no 5.0 properties (ours writes the column null for them too)
            .withColumn("properties", F.lit(None).cast(properties))
            .select(*MESSAGE_COLUMNS).dropDuplicates(["gateway", "offset"]))
    msgs.write.mode("append").partitionBy("date", "gateway").parquet(str(warehouse / "messages"))
    written = spark.read.schema(MESSAGES_DDL).parquet(str(warehouse / "messages"))
    hourly = (written
              .groupBy("date", "gateway", "topic", F.date_trunc("hour", "timestamp").alias("hour"))
              .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.length("payload")).alias("bytes"),
                   F.min("timestamp").alias("first_time"), F.max("timestamp").alias("last_time")))
    (hourly.repartition("date", "gateway").write.mode("overwrite")
     .option("partitionOverwriteMode", "dynamic").partitionBy("date", "gateway")
     .parquet(str(warehouse / "topic_hourly")))
    return written.count()   # the warehouse is new: every row in it was added


def ours_decode(spark, landing: Path) -> int:
    from edgebroker.spark.ingest import MESSAGES_DDL, decode_files
    return (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
            .load(str(landing)).select("path", "content")
            .mapInArrow(decode_files, MESSAGES_DDL).count())


def json_decode(spark, jdir: Path) -> int:
    from pyspark.sql import functions as F
    df = spark.read.schema(JSON_DDL).json(str(jdir))
    # A bare count() would let the JSON reader skip parsing the columns; ask for all of them.
    return df.where(F.greatest(*[F.col(c).isNotNull().cast("int") for c in df.columns]) >= 0) \
        .count()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="work directory, kept with its inputs for the next run "
                    "(default: a temporary one, removed after)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="spark-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t = time.monotonic()
        landing, jdir, batches = make_inputs(root, args.records)
        print(f"inputs: {args.records} records, {batches} batches, "
              f"{sum(p.stat().st_size for p in landing.rglob('*.zst')) / 2**20:.1f} MiB zstd, "
              f"{sum(p.stat().st_size for p in jdir.glob('*.json')) / 2**20:.1f} MiB JSON "
              f"({time.monotonic() - t:.0f} s to make)", flush=True)
        spark = session()
        # Warm up the JVM (its JIT, the Parquet writer) and the Python workers: every timed
        # step once on a small copy of the inputs, so the first round is not the slowest.
        wlanding, wjdir, _ = make_inputs(root / "warm-up", WARM_UP)
        ours_e2e(spark, wlanding, root / "warm-up" / "wh-ours")
        json_e2e(spark, wjdir, root / "warm-up" / "wh-json")
        ours_decode(spark, wlanding)
        json_decode(spark, wjdir)
        for wh in ("wh-ours", "wh-json"):
            shutil.rmtree(root / "warm-up" / wh)
        rates = {k: [] for k in ("ours_e2e", "json_e2e", "ours_decode", "json_decode")}
        for rnd in range(args.rounds):
            runs = [("ours_e2e", lambda w: ours_e2e(spark, landing, w)),
                    ("json_e2e", lambda w: json_e2e(spark, jdir, w)),
                    ("ours_decode", lambda w: ours_decode(spark, landing)),
                    ("json_decode", lambda w: json_decode(spark, jdir))]
            if rnd % 2:
                runs = [runs[1], runs[0], runs[3], runs[2]]
            for key, fn in runs:
                wh = root / f"wh-{key}-{rnd}"
                t = time.monotonic()
                rows = fn(wh)
                dt = time.monotonic() - t
                if rows != args.records:
                    raise SystemExit(f"{key}: {rows} rows, expected {args.records}")
                rates[key].append(rows / dt)
                print(f"round {rnd + 1} {key:12s} {dt:6.1f} s {rows / dt:10,.0f} rows/s",
                      flush=True)
                shutil.rmtree(wh, ignore_errors=True)
        spark.stop()
        med = {k: statistics.median(v) for k, v in rates.items()}
        for what, key in (("end to end", "e2e"), ("decode only", "decode")):
            ours, other = med[f"ours_{key}"], med[f"json_{key}"]
            # The two sides of a round run back to back: their ratio drifts less with the
            # machine's load than the rates do.
            rounds = [a / b for a, b in zip(rates[f"ours_{key}"], rates[f"json_{key}"])]
            verdict = ""
            if key == "e2e":
                verdict = f" (target >= 1.5x: {'met' if ours / other >= 1.5 else 'NOT met'})"
            each = " ".join(f"{r:.2f}" for r in rounds)
            print(f"{what}: ours {ours:,.0f} rows/s, JSON {other:,.0f} rows/s, ratio "
                  f"{ours / other:.2f}x{verdict}; per round {each}, median "
                  f"{statistics.median(rounds):.2f}x")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
