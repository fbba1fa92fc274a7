"""The central side of uploading (docs/spark.md): reading upload batches into Arrow
(``arrow.py``) and the PySpark job that turns a landing area of batches into Parquet tables
(``ingest.py``, ``edgebroker-spark ingest``). Installed with ``pip install edgebroker[spark]``;
nothing in the gateway imports it.
"""
