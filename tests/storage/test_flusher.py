"""The flusher thread and ``sync()`` from another thread while the core thread appends, writes,
rolls and deletes segments."""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest

from edgebroker.commitlog import Flusher

from .logutil import append_n, open_log


def durable_queue():
    q: queue.Queue = queue.Queue()
    return q, q.put


@pytest.mark.parametrize("durability", ["batch", "sync"])
def test_written_records_become_durable_and_are_reported(tmp_path, durability):
    log = open_log(tmp_path / "log")
    q, on_durable = durable_queue()
    fl = Flusher(log, durability, flush_interval_ms=50, on_durable=on_durable)
    fl.start()
    try:
        append_n(log, 10)
        log.write_pending()
        fl.notify_written()
        assert q.get(timeout=5) == 10
        assert log.durable_offset == 10
        append_n(log, 5)
        log.write_pending()
        fl.notify_written()
        assert q.get(timeout=5) == 15
    finally:
        fl.stop()
    assert not fl.is_alive()
    log.close()


def test_batch_groups_fsyncs_by_the_interval(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    fl = Flusher(log, "batch", flush_interval_ms=100)
    fl.start()
    try:
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            append_n(log, 5)
            log.write_pending()
            fl.notify_written()
            time.sleep(0.002)
        elapsed = time.monotonic() - start
    finally:
        fl.stop()
    assert fl.syncs <= elapsed / 0.1 + 3  # not one per write (there were hundreds)
    assert log.durable_offset == log.written_offset
    log.close()


def test_sync_mode_syncs_each_notification_promptly(tmp_path):
    log = open_log(tmp_path / "log")
    q, on_durable = durable_queue()
    fl = Flusher(log, "sync", flush_interval_ms=10_000, on_durable=on_durable)
    fl.start()
    try:
        for i in range(1, 6):
            append_n(log, 1)
            log.write_pending()
            t0 = time.monotonic()
            fl.notify_written()
            assert q.get(timeout=5) == i
            assert time.monotonic() - t0 < 2.0  # not waiting for the (long) interval
    finally:
        fl.stop()
    log.close()


def test_none_only_syncs_rolled_segments_and_at_stop(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    q, on_durable = durable_queue()
    fl = Flusher(log, "none", flush_interval_ms=20, on_durable=on_durable)
    fl.start()
    try:
        append_n(log, 300)  # several rolls
        log.write_pending()
        fl.notify_written()
        rp = tmp_path / "log" / "recovery-point"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if rp.exists() and json.loads(rp.read_text())["recovery_point"] == log.segments()[-1].base_offset:
                break
            time.sleep(0.02)
        # Rolled segments were fsynced (the recovery point moved past them) ...
        assert json.loads(rp.read_text())["recovery_point"] == log.segments()[-1].base_offset
        # ... but nothing was reported durable for acknowledgements.
        assert log.durable_offset == 0 and q.empty()
    finally:
        fl.stop()
    assert q.get(timeout=1) == 300  # the final sync at stop
    assert log.durable_offset == 300
    log.close()


def test_stop_makes_everything_durable(tmp_path):
    log = open_log(tmp_path / "log")
    fl = Flusher(log, "batch", flush_interval_ms=60_000)
    fl.start()
    append_n(log, 7)
    log.write_pending()
    fl.stop()
    assert log.durable_offset == 7
    log.close()


def test_bad_settings():
    with pytest.raises(ValueError, match="durability"):
        Flusher(None, "sometimes")
    with pytest.raises(ValueError, match="flush_interval_ms"):
        Flusher(None, "batch", 0)


def test_sync_from_another_thread_while_appending_rolling_and_deleting(tmp_path):
    """The core thread appends, writes, rolls (small segments) and runs retention (which deletes
    segments) while a second thread calls sync() as fast as it can. No errors, the durable
    offset only grows and never passes what was written, every record is readable."""
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=40_000)
    stop = threading.Event()
    seen = []
    errors = []

    def syncer():
        try:
            while not stop.is_set():
                written_before = log.written_offset
                d = log.sync()
                assert d >= written_before
                seen.append(d)
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=syncer)
    t.start()
    try:
        for _ in range(300):
            append_n(log, 7)
            log.write_pending()
            log.housekeeping()
            assert log.durable_offset <= log.written_offset
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors
    assert seen == sorted(seen) and len(seen) > 10
    assert log.sync() == log.written_offset == 2100
    assert log.counters.segments_deleted > 0 and log.counters.segments_rolled > 20
    assert [r.offset for r in log.read_range(0)] == list(range(log.first_offset, 2100))
    log.close()
