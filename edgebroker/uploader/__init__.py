"""Shipping the commit log upstream in batches: the batch format (batch.py, docs/upload-format.md),
cutting batches from sealed segments (cutter.py), the sinks that store them (sinks.py) and the
uploader thread of ``edgebroker serve`` (uploader.py)."""
