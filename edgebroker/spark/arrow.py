"""One upload batch (docs/upload-format.md) as an Arrow table of messages, for the Spark job,
tests and notebooks: ``read_batch(path)`` or ``batch_to_arrow(blob, name)``.

The checks are those of ``edgebroker.uploader.batch`` (magic, batch and log format versions,
both CRC32Cs, every record's CRC, counts and ranges): a batch format or log format version this
edgebroker does not know is refused there with a ``BatchFormatError`` naming the file. The
columns are built from whole arrays (one conversion per column, the date and the timestamp
computed on the arrays), not row by row.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from edgebroker.uploader.batch import (
    BatchFormatError, BatchHeader, read_batch_bytes, read_batch_file,
)

MS_PER_DAY = 86_400_000

SCHEMA = pa.schema([
    ("gateway", pa.string()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("date", pa.date32()),
    ("topic", pa.string()),
    ("qos", pa.int8()),
    ("retain", pa.bool_()),
    ("client_id", pa.string()),
    ("payload", pa.binary()),
])


def _table(header: BatchHeader, records: list, name: str) -> pa.Table:
    stamps = pa.array([r.timestamp_ms for r in records], pa.int64())
    try:
        topics = pa.array([r.topic for r in records], pa.binary()).cast(pa.string())
        clients = pa.array([r.client_id for r in records], pa.binary()).cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise BatchFormatError(f"{name}: a topic or client id is not UTF-8: {exc}") from None
    columns = [
        pa.array([header.gateway_id] * len(records), pa.string()),
        pa.array([r.offset for r in records], pa.int64()),
        pc.multiply(stamps, 1000).cast(pa.timestamp("us", tz="UTC")),
        pc.divide(stamps, MS_PER_DAY).cast(pa.int32()).cast(pa.date32()),
        topics,
        pa.array([r.qos for r in records], pa.int8()),
        pa.array([r.retain for r in records], pa.bool_()),
        clients,
        pa.array([r.payload for r in records], pa.binary()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def batch_to_arrow(blob: bytes, name: str) -> tuple[BatchHeader, pa.Table]:
    """The header and the messages of the batch file whose bytes are ``blob`` (``name`` names
    it in errors); ``BatchFormatError`` for anything wrong."""
    header, records = read_batch_bytes(blob, name)
    return header, _table(header, records, name)


def read_batch(path: str) -> tuple[BatchHeader, pa.Table]:
    """The header and the messages of the batch file at ``path``."""
    header, records = read_batch_file(path)
    return header, _table(header, records, path)
