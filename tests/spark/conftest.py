"""One local[2] SparkSession for each Spark test module (a JVM costs seconds to start)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable   # the workers need this venv's pyarrow
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("edgebroker-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
