"""A local[2] SparkSession for the Spark tests and bench/spark_bench.py: no web UI, two shuffle
partitions, everything on loopback, and the settings the ingest job needs (SESSION_CONFIG)."""

from __future__ import annotations

import os
import sys


def local_session(app_name: str, **extra: str):
    """``extra``: more Spark settings, keys as Spark names them
    (``**{"spark.driver.memory": "2g"}``)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable   # the workers need this venv's pyarrow
    from pyspark.sql import SparkSession

    from edgebroker.spark.ingest import SESSION_CONFIG
    settings = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                **SESSION_CONFIG, **extra}
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
