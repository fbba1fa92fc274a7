"""How the ingest job tells a record it holds already from a new one (docs/spark.md).

A record is known by its gateway, offset, timestamp and content (topic, QoS, retain flag,
client id, payload, properties (as JSON, which names each field), as one 64-bit hash:
``_content``). The same record read twice (a
batch uploaded again, copied under another name, re-cut after a lost upload mark, read again
after a lost checkpoint) matches in all of them and adds no row. A record at an offset that
``messages`` holds with another timestamp or content is another record: a gateway whose log
started over (a new data directory) under the same gateway id numbers its records from 0
again. Such a record is added as well, never dropped, and its offset is counted and logged as
reused (``reused_offsets``).
"""

from __future__ import annotations

KEY = ["gateway", "offset", "timestamp", "_content"]


def with_content(df):
    """``df`` (messages rows) with the ``_content`` column of KEY."""
    from pyspark.sql import functions as F
    # Not the properties struct itself: Spark's hash skips null fields, so {content_type: "x"}
    # and {response_topic: "x"} would hash alike. Its JSON names every field it holds ("" for
    # no properties at all: JSON is never empty).
    props = F.coalesce(F.to_json("properties"), F.lit(""))
    return df.withColumn("_content", F.xxhash64("topic", "qos", "retain", "client_id",
                                                "payload", props))


def new_rows(rows, existing):
    """The ``rows`` (decoded messages) that neither an earlier one of ``rows`` nor ``existing``
    (the rows of ``messages`` in the partitions they fall in, or None) holds: compared by KEY.
    A record's partition follows from its timestamp, so a copy of it can only be there."""
    rows = with_content(rows).dropDuplicates(KEY)
    if existing is not None:
        rows = rows.join(with_content(existing).select(*KEY), KEY, "left_anti")
    return rows.drop("_content")


def reused_offsets(spark, added, messages) -> list:
    """Per gateway (gateway, offsets, low, high): the offsets of the ``added`` rows (not yet
    written) that another record has as well, in ``messages`` (any partition of the gateway;
    None when there is no table yet) or among ``added`` itself."""
    from pyspark.sql import functions as F
    keys = added.select("gateway", "offset")
    twice = keys.groupBy("gateway", "offset").count().where("count > 1") \
        .select("gateway", "offset")
    reused = twice
    if messages is not None:
        # The gateways, and one offset range over them all: a filter Parquet skips row groups
        # by (not one condition per gateway: see ingest._in_partitions).
        bounds = keys.groupBy("gateway").agg(F.min("offset").alias("low"),
                                             F.max("offset").alias("high")).collect()
        if bounds:
            held = (messages.where(F.col("gateway").isin([b.gateway for b in bounds])
                                   & F.col("offset").between(min(b.low for b in bounds),
                                                             max(b.high for b in bounds)))
                    .select("gateway", "offset")
                    .join(keys.distinct(), ["gateway", "offset"], "left_semi"))
            reused = reused.unionByName(held)
    return (reused.distinct().groupBy("gateway")
            .agg(F.count(F.lit(1)).alias("offsets"), F.min("offset").alias("low"),
                 F.max("offset").alias("high"))
            .orderBy("gateway").collect())


def clean_batches(batches: list, existing: dict) -> set:
    """The paths of the ``batches`` (rows with path, gateway, batch_first, batch_last) whose
    offset range overlaps no other batch of the list and no range in ``existing`` (gateway ->
    (smallest, largest) offset already ingested). Such a batch adds every one of its records
    (a batch's offsets are strictly increasing, checked when it is decoded), so its rows need
    no deduplication; the others do."""
    by_gateway: dict = {}
    for b in batches:
        by_gateway.setdefault(b.gateway, []).append(b)
    clean = set()
    for gateway, group in by_gateway.items():
        group.sort(key=lambda b: (b.batch_first, b.batch_last))
        low, high = existing.get(gateway, (None, None))
        reach = -1   # the largest last offset of the batches before (sorted by first offset)
        for i, b in enumerate(group):
            overlaps = (reach >= b.batch_first
                        or (i + 1 < len(group) and group[i + 1].batch_first <= b.batch_last)
                        or (low is not None and b.batch_first <= high and b.batch_last >= low))
            reach = max(reach, b.batch_last)
            if not overlaps:
                clean.add(b.path)
    return clean
