"""What a session reading the log at a cursor asks of it (core.catchup): ``read_batch``,
``bytes_after``, ``offset_at_time``, ``lag``, and age retention held for cursors (both
native backends)."""

from __future__ import annotations

from array import array

import mqttraw
from edgebroker import _native
from edgebroker.commitlog import retention

from .logutil import Clock, append_n, open_log, payload_for, topic_for

T0 = 1_700_000_000_000


def _all(log, start=0, topic_filter=None, copy_limit=16384):
    """Every record from ``start`` by repeated read_batch calls, as (offset, topic, payload)."""
    got = []
    while start < log.next_offset:
        records, start = log.read_batch(start, topic_filter, 50, 4096, 8192, copy_limit)
        got += [(r[0], r[4], r[5], r[6]) for r in records]
    return got


def test_read_batch_reads_every_record_across_segments_in_order(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 500)
    log.write_pending()
    assert len(log.segments()) > 3
    got = _all(log)
    assert [g[0] for g in got] == list(range(500))
    assert all(g[1] == topic_for(g[0]) and g[2] == payload_for(g[0]) for g in got)
    assert all(g[3] == len(payload_for(g[0])) for g in got)
    log.close()


def test_read_batch_filters_by_topic_and_stops_at_its_bounds(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    append_n(log, 400)
    log.write_pending()
    got = _all(log, 10, b"site/1/#")
    assert [g[0] for g in got] == [i for i in range(10, 400) if i % 3 == 1]
    # One call: whole chunks, stopping once max_records are reached.
    records, nxt = log.read_batch(0, None, 5, 1 << 20, 1 << 20)
    assert len(records) >= 5 and nxt == records[-1][0] + 1
    log.close()


def test_read_batch_leaves_large_payloads_in_the_file(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    log.append(T0, 1, False, b"c", b"big", b"B" * 5000)
    log.append(T0, 1, False, b"c", b"small", b"s" * 10)
    log.write_pending()
    records, nxt = log.read_batch(0, None, 10, 1 << 20, 1 << 20, copy_limit=4096)
    assert [(r[0], r[4], r[5], r[6]) for r in records] == [(0, b"big", None, 5000),
                                                            (1, b"small", b"s" * 10, 10)]
    assert nxt == 2
    where = log.locate(0)
    assert where.payload_length == 5000
    log.close()


def _runs(log, start=0, topic_filter=None, copy_limit=16384):
    """Every record from ``start`` by repeated read_run calls, as (offset, topic, payload)."""
    got, spans = [], []
    while start < log.next_offset:
        found = log.read_run(start, topic_filter, 1 << 20, copy_limit)
        assert found is not None
        run, start = found
        if run is None:
            continue
        data, base, entries, n = run
        spans.append(len(data.obj) if isinstance(data, memoryview) else len(data))  # held
        frames = _native.publish_frames(data, base, entries, 0, n, bytearray(n), array("H", bytes(2 * n)),
                                        len(data))
        for f in mqttraw.split_frames(bytearray(frames)):
            got.append((f.topic.encode(), f.payload))
        got_offsets = list(entries[0::_native.SCAN_ENTRY_WORDS])
        assert got_offsets == sorted(got_offsets)
    return got, spans


def test_read_run_reads_what_read_batch_reads_and_keeps_only_the_chunk(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    append_n(log, 300)
    log.append(T0, 1, False, b"c", b"other", b"O" * 200_000)   # read with the run, not kept
    append_n(log, 300)
    log.write_pending()
    want = [(topic_for(i), payload_for(i)) for i in range(601) if i != 300 and i % 3 == 1]
    got, spans = _runs(log, 0, b"site/1/#")
    assert got == want
    assert max(spans) <= 64 * 1024, "a run holds at most one chunk's memory"
    # A matching payload of copy_limit bytes or more: read_batch's (sendfile) path.
    assert log.read_run(300, b"other", 8192, copy_limit=4096) is None
    log.close()


def test_read_batch_starts_at_the_first_record_kept(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=12288)
    append_n(log, 600)
    log.write_pending()
    first = log.first_offset
    assert first > 0
    records, _ = log.read_batch(0, None, 1, 1 << 20, 1 << 20)
    assert records[0][0] == first
    log.close()


def test_bytes_after_offset_at_time_and_lag(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 300, start_ts=T0, step_ms=1000)
    log.write_pending()
    total = sum(s.size_bytes for s in log.segments()) - 32 * len(log.segments())
    assert log.bytes_after(0) == total
    assert log.bytes_after(log.next_offset) == 0
    assert 0 < log.bytes_after(150) < total
    assert log.offset_at_time(T0 + 100_500) == 101
    assert log.offset_at_time(T0 + 10 ** 9) == log.next_offset
    lag = log.lag(200, T0 + 300_000)
    assert lag == {"lag_records": 100, "lag_bytes": log.bytes_after(200), "lag_seconds": 100.0}
    log.close()


def test_age_retention_waits_for_the_oldest_cursor_the_disk_limit_does_not(tmp_path):
    clock = Clock(T0)
    log = open_log(tmp_path / "log", clock, segment_bytes=4096, retention_ms=1000)
    append_n(log, 300, start_ts=T0, step_ms=0)
    log.write_pending()
    log.mark_uploaded(log.next_offset)
    segments = log.segments()
    held = segments[2].base_offset + 1      # a cursor inside the third segment
    log.hold_offset = held
    clock.now = T0 + 10_000
    log.housekeeping()
    assert log.first_offset == segments[2].base_offset   # the two before it went
    # The plan itself: the disk limit deletes under a cursor (forced when not uploaded).
    plan, _ = retention.plan(log._segments, 0, clock.now, 4096, 1000, hold_offset=0)
    assert plan and all(forced for _, forced, _ in plan)
    log.close()
