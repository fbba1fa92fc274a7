"""The commit log: every message, in order, in segment files that survive a crash.

    log = CommitLog.open(data_dir + "/log", LogOptions(...))
    offset = log.append(timestamp_ms, qos, retain, client_id, topic, payload)   # core thread
    log.write_pending()                                                          # once per pass
    flusher = Flusher(log, "batch", 100, on_durable=...); flusher.start()        # fsyncs
    log.read(offset), log.read_range(a, b), log.read_since(ms), log.scan("a/+")
    log.locate(offset)                     # payload file range, for _native.send_batch
    log.housekeeping()                     # every second or so: age roll, retention
    log.mark_uploaded(offset)              # the uploader
    flusher.stop(); log.close()

docs/log-format.md describes the files byte by byte.
"""

from edgebroker.commitlog.errors import (
    LogError, LogFormatError, LogFullError, LogLockedError, LogWriteError,
)
from edgebroker.commitlog.flusher import DURABILITY, Flusher
from edgebroker.commitlog.format import (
    FORMAT_VERSION, Damage, Location, LogOptions, Record, SegmentInfo,
)
from edgebroker.commitlog.log import CommitLog, LogCounters, RecoveryReport

__all__ = [
    "CommitLog", "LogOptions", "Record", "Location", "SegmentInfo", "Damage", "LogCounters",
    "RecoveryReport", "Flusher", "DURABILITY", "FORMAT_VERSION", "LogError", "LogFormatError",
    "LogFullError", "LogLockedError", "LogWriteError",
]
