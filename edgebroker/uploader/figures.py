"""The uploader's figures: its side of the stats (``inspect stats``, ``upload status``,
the metrics, ``$SYS``), read from any thread."""

from __future__ import annotations

import time


def figures_of(up) -> dict:
    """The figures of the Uploader ``up`` (any thread)."""
    segments, nbytes, oldest, newest = up.backlog
    now = up.clock_ms()
    with up._lock:
        # Record time from the newest uploaded record to the newest record, at most the age
        # of the oldest waiting one (the backlog's age: a quiet gateway's first record after
        # an idle hour is not an hour late); that age alone when the log holds no uploaded
        # record.
        lag = 0.0
        if nbytes and oldest is not None:
            lag = max(0.0, (now - oldest) / 1000)
            if newest and up.shipped_max_ts:
                lag = min(lag, max(0.0, (newest - up.shipped_max_ts) / 1000))
        return {
            "url": up.sink.name, "gateway_id": up.gateway_id,
            "state": state_of(up),
            "paused": up.paused,
            "uploaded_offset": up.log.uploaded_offset,
            "batches": up.batches, "records": up.records, "bytes": up.bytes_shipped,
            "bytes_raw": up.bytes_raw, "retries": up.retries,
            "permanent_errors": up.permanent_errors, "local_errors": up.local_errors,
            "alarm": up.alarm,
            "last_error": up.last_error, "last_error_time": up.last_error_time,
            "last_success_time": up.last_success_time, "gap_offsets": up.gap_offsets,
            "forced_deletions": up.log.counters.forced_deletions,
            "forced_deleted_records": up.log.counters.forced_deleted_records,
            "mark_unsaved": up.log.counters.uploaded_mark_unsaved,
            "retry_in_seconds": max(0.0, up.retry_at - time.time()) if up.retry_at else 0.0,
            "backlog_segments": segments, "backlog_bytes": nbytes,
            "backlog_batches": backlog_batches(nbytes, segments, up.config.batch_bytes),
            "backlog_age_seconds": max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0,
            "lag_seconds": lag,
        }


def backlog_batches(nbytes: int, sealed: int, batch_bytes: int) -> int:
    """About how many batches the backlog makes: one per ``batch_bytes`` and one more for each
    sealed segment's remainder (a batch never spans two segments)."""
    if not nbytes:
        return 0
    return max(-(-nbytes // batch_bytes), sealed)


__all__ = ["figures_of", "backlog_batches"]


def state_of(up) -> str:
    """``up.state``, but "paused" while paused (an upload already started finishes first), and
    "idle" from a resume until the uploader's thread takes it up (it left "paused" there)."""
    if up.paused:
        return "paused" if up.state != "uploading" else up.state
    return "idle" if up.state == "paused" else up.state
