"""The native helper: the C build (csrc/, through cffi) or its pure-Python twin.

``EDGEBROKER_NATIVE`` chooses, when this package is first imported:

* ``auto`` (default): the C build when it is importable, else the Python twin
  (``FALLBACK_REASON`` says why; ``log_backend`` logs it once at start);
* ``c``: the C build, or ``NativeUnavailableError`` saying what is missing;
* ``python``: the twin, always.

``BACKEND`` is ``"c"`` or ``"python"``; ``edgebroker.__native_backend__`` is the
same value. Callers use the functions through this module
(``from edgebroker import _native; _native.scan(...)``), never ``ffi``.

Functions (identical results in both backends; the on-disk layout they parse is
docs/log-format.md):

``crc32c(data, crc=0)``
    CRC32C (Castagnoli) of ``data``, continuing from ``crc``.
``record_header(offset, timestamp_ms, attributes, client_id, topic, payload, properties=b"")``
    The header of a log record, CRC included: 34 bytes, or 38 with ``properties`` (format
    version 2: the properties bit set in the attributes, their length after the 34 bytes).
``header_writer()``
    A ``record_header`` for one thread's hot path, whose result (bytes-like) is valid only
    until its next call.
``appender(capacity, entries)``
    A staging area for ``append_record``: ``.state`` (its fields are those of the C struct
    ``eb_appender``: read them, set them only through the three ``stage_*`` below), ``.data``
    and ``.index`` (bytearrays of
    ``capacity`` bytes and ``entries`` index entries that the records are built into), and
    ``.held`` (native 64-bit words, one per record of ``append_held``: where in ``.data`` its
    payload goes; ``state.held_count`` of them, room for ``entries``).
``stage_segment(state, base_offset, segment_bytes, first_ts, segment_ms, big_payload)``
    Set up a staging area for the records of one segment (its first offset and timestamp, when
    it rolls, which payloads are not staged).
``stage_start(state, next_offset, position, max_ts)``
    Where the next staged record goes: its offset, its position in the segment, the running
    maximum timestamp.
``stage_clear(state)``
    Empty the staging area once the caller has taken its records.
``append_record(state, timestamp_ms, qos, retain, client_id, client_id_len, topic, topic_len, payload, payload_len, properties, properties_len)``
    Build one record (header, client id, topic, properties, payload; ``properties`` ``b""``
    for none) and its index entry at the end of
    the staging area; its offset, or -1 when it is not taken (no room, the segment must roll,
    payload of ``big_payload`` bytes or more, a field out of range). ``client_id``, ``topic``,
    ``payload`` and ``properties`` must be ``bytes`` in the C build (``TypeError`` otherwise).
``append_held(state, timestamp_ms, qos, retain, client_id, client_id_len, topic, topic_len, payload, payload_len, properties, properties_len)``
    Stage a record whose payload the caller holds and writes right after it (a large one):
    its header (CRC included), client id, topic and properties, and list it in ``.held``. Its
    offset, or -1 as for ``append_record`` (never for the payload's size), or when ``.held``
    is full. ``client_id``, ``topic`` and ``properties`` must be ``bytes`` in the C build
    (``TypeError`` otherwise);
    ``payload`` may be any buffer (``append_held`` of the C build converts it).
``topic_matches(topic_filter, topic)``
    MQTT filter matching on bytes, like ``mqtt.topics.topic_matches``.
``scan(buf, avail, base_position, min_offset, topic_filter, out, max_timestamp=0, version=2)``
    Validate the records in ``buf`` (``avail`` = bytes that exist from buf[0] on, in
    the file; may exceed ``len(buf)``) by the rules of segment format ``version`` (a record
    with properties is damage in version 1); write 5 words per record whose topic matches
    into ``out`` (``array('Q')``): offset, timestamp, position, length, meta
    (attributes | client id length << 8 | topic length << 24). A record whose attributes
    have ``ATTR_PROPERTIES`` has its properties length (u32) at position + 34, and its
    client id starts 4 bytes later. -> ``ScanResult``
``build_index(buf, avail, base_position, base_offset, min_offset, max_timestamp, out, max_entries=None, version=2)``
    The same walk, writing 16-byte index entries into ``out``. -> ``ScanResult``
``resync(buf, avail, start, min_offset, version=2)``
    The first position >= ``start`` where a valid record begins. -> ``ResyncResult``
``index_check(index, count, segment_size)``
    (consistent leading entries, entries before the first all-zero one).
``index_find_offset(index, count, relative_offset)`` / ``index_find_time(index, count, ts)``
    Binary search (lower bound) over index entries.
``publish_frames(buf, base_position, entries, first, n, qos, pids, capacity)``
    MQTT PUBLISH frames, one after another, for the ``n`` scan entries from ``first`` on
    (``entries``: ``scan`` output over ``buf``, which starts at file position
    ``base_position``): entry i with QoS ``qos[i]`` (a bytearray: 0, 1, 2, or 255 to skip it;
    retain and DUP 0), its record's topic, packet identifier ``pids[i]`` (``array('H')``;
    QoS 1 and 2) and its record's payload. ``capacity``: at least the records' total length
    (every frame is shorter than its record). ``ValueError`` for an entry outside ``buf`` or
    the arrays, a QoS not 0 to 2 or 255, or too small a capacity.
``send_batch(sock, items, start_item=0, start_progress=0, cork=False)``
    ``items``: (header bytes, file fd, file position, length); sends each header then its
    file range (sendfile) to the non-blocking ``sock``, until done or EAGAIN. -> ``SendResult``
``fallocate(fd, nbytes)``
    Allocate the blocks of the file's first ``nbytes`` ahead, keeping its size (Linux
    ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``): 0, or the errno when it cannot (``ENOSYS``
    where there is no ``fallocate``).
``keep_freed_memory(trim_threshold, mmap_threshold)``
    glibc's malloc keeps up to ``trim_threshold`` bytes of freed heap for reuse instead of
    giving them back to the kernel, and takes allocations below ``mmap_threshold`` from the
    heap (``mallopt``): 0, ``EINVAL`` for a value it refuses, ``ENOSYS`` without glibc.
``release_freed_memory()``
    glibc's malloc gives the kernel back every whole page of freed heap, whatever the trim
    threshold (``malloc_trim(0)``): 0, ``ENOSYS`` without glibc.
"""

from __future__ import annotations

import logging
import os

from edgebroker._native._common import *  # noqa: F401,F403  (constants and result types)
from edgebroker.errors import ConfigError

FUNCTIONS = ("crc32c", "record_header", "header_writer", "appender", "stage_segment",
             "stage_start", "stage_clear", "append_record", "append_held",
             "topic_matches", "scan", "build_index", "resync",
             "index_check", "index_find_offset", "index_find_time", "publish_frames", "send_batch",
             "fallocate", "keep_freed_memory", "release_freed_memory")
CHOICES = ("auto", "c", "python")


class NativeUnavailableError(ConfigError):
    """EDGEBROKER_NATIVE asked for something this installation cannot give (a configuration
    error: the commands say it in one line and exit with 2)."""


def _import_c():
    from edgebroker._native import _cbackend
    return _cbackend


def _import_python():
    from edgebroker._native import _pure
    return _pure


def _choose(choice: str):
    """(backend module, reason the C build is not used or None)."""
    if choice not in CHOICES:
        raise NativeUnavailableError(
            f"EDGEBROKER_NATIVE={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "python":
        return _import_python(), "EDGEBROKER_NATIVE=python"
    try:
        return _import_c(), None
    except ImportError as exc:
        reason = f"the C helper is not built ({exc})"
        if choice == "c":
            raise NativeUnavailableError(
                f"EDGEBROKER_NATIVE=c but {reason}; install with a C compiler present "
                f"(pip install -e .), or set EDGEBROKER_NATIVE=auto to run on the pure-Python "
                f"fallback") from None
        return _import_python(), reason


def set_backend(choice: str) -> str:
    """Switch every function of this module to ``choice``; returns BACKEND. For tests and benchmarks."""
    global BACKEND, CRC_METHOD, FALLBACK_REASON, _impl
    impl, reason = _choose(choice)
    _impl = impl
    BACKEND = impl.NAME
    CRC_METHOD = impl.CRC_METHOD
    FALLBACK_REASON = reason
    g = globals()
    for name in FUNCTIONS:
        g[name] = getattr(impl, name)
    return BACKEND


def c_available() -> bool:
    try:
        _import_c()
    except ImportError:
        return False
    return True


def describe() -> str:
    """One line for the start-up log."""
    if BACKEND == "c":
        return f"native helper: C (CRC32C: {CRC_METHOD})"
    return f"native helper: pure Python, much slower: {FALLBACK_REASON}"


def log_backend(logger: logging.Logger | None = None) -> None:
    """Say once which backend runs: info for C, a warning for the fallback."""
    logger = logger or logging.getLogger("edgebroker")
    if BACKEND == "c":
        logger.info("%s", describe())
    elif FALLBACK_REASON == "EDGEBROKER_NATIVE=python":
        logger.info("%s", describe())
    else:
        logger.warning("%s", describe())


BACKEND = ""
CRC_METHOD = ""
FALLBACK_REASON: str | None = None
set_backend(os.environ.get("EDGEBROKER_NATIVE", "auto").strip().lower() or "auto")
