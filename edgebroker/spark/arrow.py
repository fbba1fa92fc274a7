"""One upload batch (docs/upload-format.md) as an Arrow table of messages, for the Spark job,
tests and notebooks: ``read_batch(path)`` or ``batch_to_arrow(blob, name)``.

The checks are those of ``edgebroker.uploader.batch`` (magic, batch and log format versions,
both CRC32Cs, every record's CRC, counts and ranges): a batch format or log format version this
edgebroker does not know is refused there with a ``BatchFormatError`` naming the file.

``batch_to_arrow`` does not go record by record in Python: the records are walked by the
broker's own scanner (``_native.scan``, C: lengths, attributes, offsets in order, every record's
CRC32C), which gives each record's offset, timestamp, position and field lengths; the columns
are then cut out of the raw bytes with numpy over the whole batch. Anything the scan or the
header checks refuse is read again by ``parse_records``, record by record, for its exact error.
``batch_days`` makes the same checks but builds no columns: the header and the days the
messages fall in; ``batch_summary`` adds the holes among its offsets (the ingest job's first
pass).
"""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from edgebroker import _native
from edgebroker.commitlog.format import ATTR_PROPERTIES, PROPERTIES_LENGTH_SIZE, RECORD_HEADER_SIZE
from edgebroker.errors import ProtocolError
from edgebroker.mqtt import properties as mqtt_properties
from edgebroker.uploader.batch import (
    TIMESTAMP_END_MS, BatchFormatError, BatchHeader, parse_records, read_batch_file,
    read_batch_raw,
)

MS_PER_DAY = 86_400_000

# A message's MQTT 5.0 properties (log format version 2; docs/spark.md): null when it has none.
PROPERTIES_TYPE = pa.struct([
    ("payload_format", pa.int8()),
    ("message_expiry", pa.int64()),
    ("content_type", pa.string()),
    ("response_topic", pa.string()),
    ("correlation_data", pa.binary()),
    ("user_properties", pa.list_(pa.struct([("name", pa.string()), ("value", pa.string())]))),
])
_PROPERTY_FIELDS = {mqtt_properties.PAYLOAD_FORMAT: "payload_format",
                    mqtt_properties.MESSAGE_EXPIRY: "message_expiry",
                    mqtt_properties.CONTENT_TYPE: "content_type",
                    mqtt_properties.RESPONSE_TOPIC: "response_topic",
                    mqtt_properties.CORRELATION_DATA: "correlation_data"}

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
    ("properties", PROPERTIES_TYPE),
])


def _times(stamps: pa.Array) -> list[pa.Array]:
    """The timestamp and date columns of milliseconds since the epoch."""
    return [pc.multiply_checked(stamps, 1000).cast(pa.timestamp("us", tz="UTC")),
            pc.divide(stamps, MS_PER_DAY).cast(pa.int32()).cast(pa.date32())]


def _properties_row(raw, offset: int, name: str) -> dict:
    """One message's stored properties as a ``PROPERTIES_TYPE`` value."""
    try:
        props = mqtt_properties.decode_body(raw) or {}
    except ProtocolError as exc:
        raise BatchFormatError(f"{name}: record at offset {offset}: its properties do not "
                               f"decode: {exc}") from None
    row = {field: props.get(ident) for ident, field in _PROPERTY_FIELDS.items()}
    row["user_properties"] = [{"name": k, "value": v}
                              for k, v in props.get(mqtt_properties.USER_PROPERTY, ())]
    return row


def _properties_column(rows: list) -> pa.Array:
    """``rows``: (offset, stored properties) of the messages that have some, or None."""
    if all(row is None for row in rows):
        return pa.nulls(len(rows), PROPERTIES_TYPE)
    return pa.array([None if row is None else _properties_row(*row) for row in rows],
                    PROPERTIES_TYPE)


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
        *_times(stamps),
        topics,
        pa.array([r.qos for r in records], pa.int8()),
        pa.array([r.retain for r in records], pa.bool_()),
        clients,
        pa.array([r.payload for r in records], pa.binary()),
        _properties_column([(r.properties, r.offset, name) if r.properties else None
                            for r in records]),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def _cut(raw: pa.Buffer, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of the byte ranges [starts, starts + lengths) of ``raw``, in order and
    apart: seen with the gaps between them, they make one binary array over ``raw`` without a
    copy (offsets start, end, next start...), of which Arrow takes every other value."""
    bounds = np.empty(2 * len(starts), np.int32)
    bounds[0::2] = starts
    bounds[1::2] = starts + lengths
    spans = pa.Array.from_buffers(pa.binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), raw])
    return spans.take(pa.array(np.arange(0, len(bounds), 2)))


def _scan(header: BatchHeader, raw: bytes) -> np.ndarray | None:
    """One row per record (offset, timestamp, position, length, meta) from one scan of
    ``raw``; None when there are no records, or when the scan or a header check refuses them
    (``parse_records`` then reads them or says why)."""
    count = header.record_count
    words = _native.SCAN_ENTRY_WORDS
    out = array("Q", bytes(8 * words * (count + 1)))
    res = _native.scan(raw, len(raw), 0, header.first_offset, None, out, 0,
                       header.log_format_version)
    if (not count or res.status != _native.SCAN_END or res.matched != count
            or len(raw) >= 2**31):
        return None
    entries = np.frombuffer(out, np.int64, words * count).reshape(count, words)
    if (entries[-1, 0] != header.last_offset or entries[0, 0] != header.first_offset
            or entries[:, 1].min() != header.min_timestamp_ms
            or entries[:, 1].max() != header.max_timestamp_ms
            or entries[:, 1].min() < 0 or entries[:, 1].max() >= TIMESTAMP_END_MS):
        return None
    return entries


def _layout(raw: bytes, entries: np.ndarray) -> tuple:
    """Where each scanned record's fields lie in ``raw``: (client id, topic, properties,
    payload) start positions, with the client id and topic lengths and which records have
    properties (log format version 2: R, a u32 right after the 34-byte header)."""
    position, meta = entries[:, 2], entries[:, 4]
    cid_len = (meta >> 8) & 0xFFFF
    topic_len = (meta >> 24) & 0xFFFF
    has_props = ((meta & 0xFF) & ATTR_PROPERTIES) != 0
    props_len = np.zeros(len(entries), np.int64)
    if has_props.any():
        at = position[has_props] + RECORD_HEADER_SIZE
        b = np.frombuffer(raw, np.uint8)
        props_len[has_props] = sum(b[at + k].astype(np.int64) << (8 * k) for k in range(4))
    cid_at = position + RECORD_HEADER_SIZE + PROPERTIES_LENGTH_SIZE * has_props
    topic_at = cid_at + cid_len
    props_at = topic_at + topic_len
    return cid_at, cid_len, topic_at, topic_len, props_at, props_at + props_len, has_props


def _texts(buf: pa.Buffer, layout: tuple, name: str) -> tuple[pa.Array, pa.Array]:
    """The topics and client ids of the scanned records, checked to be UTF-8."""
    cid_at, cid_len, topic_at, topic_len = layout[:4]
    try:
        return (_cut(buf, topic_at, topic_len).cast(pa.string()),
                _cut(buf, cid_at, cid_len).cast(pa.string()))
    except pa.ArrowInvalid as exc:
        raise BatchFormatError(f"{name}: a topic or client id is not UTF-8: {exc}") from None


def _scanned_table(header: BatchHeader, entries: np.ndarray, raw: bytes, name: str) -> pa.Table:
    """The messages of ``raw`` from its scan ``entries``."""
    count = len(entries)
    offsets, stamps = entries[:, 0], entries[:, 1]
    position, length, meta = entries[:, 2], entries[:, 3], entries[:, 4]
    attrs = meta & 0xFF
    layout = _layout(raw, entries)
    props_at, payload_at, has_props = layout[4:]
    buf = pa.py_buffer(raw)
    topics, clients = _texts(buf, layout, name)
    columns = [
        pa.repeat(pa.scalar(header.gateway_id, pa.string()), count),
        pa.array(offsets),
        *_times(pa.array(stamps)),
        topics,
        pa.array((attrs & 3).astype(np.int8)),
        pa.array((attrs & 4) != 0),
        clients,
        _cut(buf, payload_at, position + length - payload_at),
        _properties_column([(raw[props_at[i]:payload_at[i]], int(offsets[i]), name)
                            if has_props[i] else None for i in range(count)]
                           if has_props.any() else [None] * count),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def batch_to_arrow(blob: bytes, name: str) -> tuple[BatchHeader, pa.Table]:
    """The header and the messages of the batch file whose bytes are ``blob`` (``name`` names
    it in errors); ``BatchFormatError`` for anything wrong."""
    header, raw = read_batch_raw(blob, name)
    entries = _scan(header, raw)
    if entries is None:
        return header, _table(header, parse_records(raw, header, name), name)
    return header, _scanned_table(header, entries, raw, name)


def batch_days(blob: bytes, name: str) -> tuple[BatchHeader, list]:
    """The header of the batch file whose bytes are ``blob`` and the UTC days its messages
    fall in (``datetime.date``, sorted), with every check ``batch_to_arrow`` makes but
    without building the columns; ``BatchFormatError`` for anything wrong."""
    return batch_summary(blob, name)[:2]


def batch_summary(blob: bytes, name: str) -> tuple[BatchHeader, list, list]:
    """``batch_days``, and the holes among the batch's offsets: (first, length, timestamp ms
    of the record right after it) for each run of offsets in first..last that no record of
    the batch holds (records left out as damaged when the batch was cut)."""
    header, raw = read_batch_raw(blob, name)
    entries = _scan(header, raw)
    if entries is None:
        records = parse_records(raw, header, name)
        dates = _table(header, records, name).column("date")
        offsets = np.array([r.offset for r in records], np.int64)
        stamps = np.array([r.timestamp_ms for r in records], np.int64)
    else:
        layout = _layout(raw, entries)
        _texts(pa.py_buffer(raw), layout, name)
        props_at, payload_at, has_props = layout[4:]
        if has_props.any():  # properties that do not decode refuse the batch here too
            _properties_column([(raw[props_at[i]:payload_at[i]], int(entries[i, 0]), name)
                                for i in np.flatnonzero(has_props)])
        dates = _times(pa.array(entries[:, 1]))[1]
        offsets, stamps = entries[:, 0], entries[:, 1]
    steps = np.diff(offsets)
    holes = [(int(offsets[i]) + 1, int(steps[i]) - 1, int(stamps[i + 1]))
             for i in np.flatnonzero(steps > 1)]
    return header, sorted(pc.unique(dates).to_pylist()), holes


def read_batch(path: str) -> tuple[BatchHeader, pa.Table]:
    """The header and the messages of the batch file at ``path``."""
    header, records = read_batch_file(path)
    return header, _table(header, records, path)
