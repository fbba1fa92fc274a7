"""The commit log with real files: append/write/read round trips, rolling, reads by offset, time
and topic filter, locate, retention, the uploaded mark, read-only readers, errors."""

from __future__ import annotations

import errno
import json
import mmap
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import shims

from edgebroker import _native
from edgebroker.commitlog import segment
from edgebroker.commitlog import (
    CommitLog, LogError, LogLockedError, LogOptions, LogWriteError, Record,
)

from .logutil import (
    Clock, append_n, as_tuple, crc32c, expected, open_log, parse_index, parse_segment, payload_for,
    segment_files,
)

T0 = 1_700_000_000_000


def test_round_trip_and_independent_parse(tmp_path):
    log = open_log(tmp_path / "log")
    offsets = append_n(log, 50)
    assert offsets == list(range(50))
    assert log.next_offset == 50 and log.written_offset == 0  # nothing written yet
    assert log.read(0) is None
    assert log.write_pending() == 50
    got = [as_tuple(r) for r in log.read_range(0)]
    assert got == [expected(i, T0 + i * 10) for i in range(50)]
    log.close()
    # The files say the same to a parser that shares no code with the log.
    parsed = [rec for f in segment_files(tmp_path / "log") for rec in parse_segment(f)]
    assert [(r["offset"], r["timestamp_ms"], r["qos"], r["retain"], r["client_id"], r["topic"],
             r["payload"]) for r in parsed] == got
    for seg in segment_files(tmp_path / "log"):
        idx = parse_index(seg.with_suffix(".idx"))
        recs = parse_segment(seg)
        base = int(seg.stem)
        assert [(base + rel, pos) for rel, pos, _ts in idx] == [(r["offset"], r["position"]) for r in recs]


def test_one_write_per_pass(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    append_n(log, 100)
    before = os.fstat(log._tail.fd).st_size if log._tail.fd >= 0 else 0
    assert before == 0  # the file is created by the first write_pending
    log.write_pending()
    size = os.path.getsize(segment_files(tmp_path / "log")[0])
    assert size == log.segments()[0].size_bytes
    assert log.write_pending() == 100  # nothing pending: no-op
    log.close()


def test_read_single_and_missing(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 30)
    log.write_pending()
    assert as_tuple(log.read(17)) == expected(17, T0 + 170)
    assert log.read(30) is None and log.read(-1) is None and log.read(10**12) is None
    assert isinstance(log.read(0), Record)
    log.close()


def test_rolls_by_size_and_records_stay_readable(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 300)
    log.write_pending()
    segs = log.segments()
    assert len(segs) > 3
    assert all(s.size_bytes <= 4096 for s in segs)
    assert [s.base_offset for s in segs] == sorted(s.base_offset for s in segs)
    for a, b in zip(segs, segs[1:]):
        assert a.next_offset == b.base_offset
        assert not a.active
    assert segs[-1].active
    assert [r.offset for r in log.read_range(0)] == list(range(300))
    assert log.counters.segments_rolled == len(segs) - 1
    log.close()


def test_a_sealed_index_is_trimmed_by_the_sync_not_at_the_roll(tmp_path):
    """Cutting the index's preallocated room off frees blocks, which can wait for the disk (a
    discard): the roll only maps the entries read-only; ``sync`` (the flusher thread) trims
    the file before it fsyncs it, and ``close`` trims what no sync did."""
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 300)
    log.write_pending()
    sealed = [s for s in log.segments() if not s.active]
    assert len(sealed) >= 3
    idx = [tmp_path / "log" / (f"{s.base_offset:020d}.idx") for s in sealed]
    assert all(p.stat().st_size > s.records * 16 for p, s in zip(idx, sealed))
    assert [r.offset for r in log.read_range(0)] == list(range(300))  # through the sealed maps
    log.sync()
    assert [p.stat().st_size for p in idx] == [s.records * 16 for s in sealed]
    assert [r.offset for r in log.read_range(0)] == list(range(300))
    append_n(log, 100)
    log.write_pending()
    more = [s for s in log.segments() if not s.active][len(sealed):]
    assert more
    log.close(sync=False)
    for s in more:
        path = tmp_path / "log" / f"{s.base_offset:020d}.idx"
        assert path.stat().st_size == s.records * 16
    log = open_log(tmp_path / "log", segment_bytes=4096)
    assert log.recovery.index_rebuilt == [] and log.next_offset == 400
    log.close()


def test_descriptors_held_counts_what_the_segments_hold(tmp_path):
    """What the broker keeps free for the log (server.app.App.socket_room): every descriptor of
    its segments, the one each index map keeps (an mmap duplicates the descriptor it maps),
    and one for a sync's copy of the directory."""
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 300)
    log.write_pending()
    log.sync()

    def open_on_segments() -> int:
        root = str(tmp_path / "log") + "/"
        n = 0
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            n += target.startswith(root) and target.endswith((".seg", ".idx"))
        return n
    held = open_on_segments()
    assert held >= 3 * (len(log.segments()) - 1)   # sealed ones: data, index, index map
    assert log.descriptors_held() == held + 1
    log.close()


def test_a_sync_in_the_middle_of_a_seal_leaves_the_trim_to_the_next(tmp_path, monkeypatch):
    """The flusher may sync while the core is sealing a segment (after its index is mapped
    read-only, before the seal is recorded): that sync does not take the trim, the next does."""
    log = open_log(tmp_path / "log", segment_bytes=4096)
    seal_index = segment.Segment.seal_index

    def seal_then_sync(seg):
        seal_index(seg)
        log.sync()                                    # the flusher, at the worst moment
    monkeypatch.setattr(segment.Segment, "seal_index", seal_then_sync)
    append_n(log, 300)
    log.write_pending()
    monkeypatch.undo()
    log.sync()
    sealed = [s for s in log.segments() if not s.active]
    assert len(sealed) >= 3
    for seg in sealed:
        idx = tmp_path / "log" / f"{seg.base_offset:020d}.idx"
        assert idx.stat().st_size == seg.records * 16
    log.close()


def test_an_untrimmed_sealed_index_is_no_damage(tmp_path, caplog):
    """Between a roll and the flusher's trim, a sealed segment's index file still has its
    unused room (zero entries): a read-only reader (``inspect`` while the broker runs) uses the
    entries quietly, and a writer opening the log after a stop in that window trims it."""
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 300)
    log.write_pending()
    sealed = [s for s in log.segments() if not s.active]
    ro = CommitLog.open(str(tmp_path / "log"), readonly=True)   # before the trim
    assert [r.offset for r in ro.read_range(0)] == list(range(300))
    assert ro.recovery.index_rebuilt == [] and ro.counters.index_rebuilds == 0
    ro.close()
    log.close()
    idx = tmp_path / "log" / f"{sealed[0].base_offset:020d}.idx"
    with open(idx, "ab") as fh:                                 # a stop before the trim
        fh.write(bytes(16 * 100))
    with caplog.at_level("INFO", logger="edgebroker.commitlog"):
        log = open_log(tmp_path / "log", segment_bytes=4096)
    assert idx.stat().st_size == sealed[0].records * 16
    assert log.recovery.index_rebuilt == [] and log.recovery.damage == []
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.offset for r in log.read_range(0)] == list(range(300))
    log.close()


def test_record_bigger_than_a_segment_gets_its_own(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    log.append(T0, 1, False, b"c", b"t", b"a" * 100)
    big = log.append(T0, 1, False, b"c", b"t", b"b" * 10000)
    log.append(T0, 1, False, b"c", b"t", b"c" * 100)
    log.write_pending()
    segs = log.segments()
    assert [s.records for s in segs] == [1, 1, 1]
    assert log.read(big).payload == b"b" * 10000
    log.close()


def test_large_payloads_are_written_from_where_they_are(tmp_path):
    """Payloads of 16 KiB and more (as bytes) are not copied into the pending buffer but written
    with pwritev, more than IOV_MAX buffers in a pass included; other buffer types are copied,
    so a caller may reuse its buffer after append."""
    log = open_log(tmp_path / "log", segment_bytes=64 << 20)
    big = [os.urandom(16384 + i) for i in range(700)]  # > 1024 iovecs in one write_pending
    for i, p in enumerate(big):
        log.append(T0, 1, False, b"c", b"t/%d" % i, p)
        if i % 3 == 0:
            log.append(T0, 0, False, b"c", b"small", b"s%d" % i)
    scratch = bytearray(b"A" * 20000)
    off = log.append(T0, 0, False, b"c", b"reused", memoryview(scratch))
    scratch[:] = b"B" * 20000  # the caller reuses its buffer before the write
    log.write_pending()
    assert log.read(off).payload == b"A" * 20000
    got = [r.payload for r in log.read_range(0) if r.topic.startswith(b"t/")]
    assert got == big
    log.close()
    log = open_log(tmp_path / "log", segment_bytes=64 << 20)
    assert log.recovery.damage == [] and log.next_offset == off + 1
    log.close()


def test_rolls_by_age(tmp_path):
    clock = Clock(T0)
    log = open_log(tmp_path / "log", clock, segment_ms=60_000, segment_bytes=1 << 20)
    log.append(T0, 0, False, b"c", b"t", b"1")
    log.append(T0 + 59_999, 0, False, b"c", b"t", b"2")
    log.append(T0 + 60_000, 0, False, b"c", b"t", b"3")  # a record's timestamp rolls it
    log.write_pending()
    assert [s.records for s in log.segments()] == [2, 1]
    # An idle segment is rolled by housekeeping once it is old.
    clock.now = T0 + 60_000 + 59_999
    log.housekeeping()
    assert log.segments()[-1].active
    clock.now = T0 + 120_000
    log.housekeeping()
    assert not any(s.active for s in log.segments())
    log.append(clock.now, 0, False, b"c", b"t", b"4")
    log.write_pending()
    assert [s.records for s in log.segments()] == [2, 1, 1]
    assert log.segments()[-1].active
    log.close()


def test_reopen_continues_offsets(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 120)
    log.write_pending()
    log.close()
    log = open_log(tmp_path / "log")
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, 120, 120)
    assert log.append(T0, 0, False, b"c", b"t", b"x") == 120
    log.write_pending()
    assert [r.offset for r in log.read_range(115)] == [115, 116, 117, 118, 119, 120]
    log.close()


def test_read_range_bounds_and_live_appends(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 200)
    log.write_pending()
    assert [r.offset for r in log.read_range(10, 15)] == [10, 11, 12, 13, 14]
    assert [r.offset for r in log.read_range(195)] == [195, 196, 197, 198, 199]
    assert list(log.read_range(200)) == []
    assert list(log.read_range(50, 50)) == []
    # Records written while an iteration runs are included when it has not passed them.
    it = log.read_range(198)
    assert next(it).offset == 198
    append_n(log, 3)
    log.write_pending()
    assert [r.offset for r in it] == [199, 200, 201, 202]
    log.close()


def test_read_since_uses_the_time_index(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 300, step_ms=1000)
    log.write_pending()
    assert next(iter(log.read_since(T0 + 150_000))).offset == 150
    assert next(iter(log.read_since(T0 + 150_500))).offset == 151
    assert next(iter(log.read_since(0))).offset == 0
    assert list(log.read_since(T0 + 10**9)) == []
    assert [r.offset for r in log.read_since(T0 + 298_000)] == [298, 299]
    log.close()


def test_read_since_with_a_clock_that_went_back(tmp_path):
    log = open_log(tmp_path / "log")
    for ts in (100, 200, 150, 300, 250):
        log.append(ts, 0, False, b"c", b"t", b"")
    log.write_pending()
    # The index keeps the running maximum, so "since 200" starts at the first record >= 200
    # and what follows comes in log order.
    assert [r.timestamp_ms for r in log.read_since(200)] == [200, 150, 300, 250]
    assert [r.timestamp_ms for r in log.read_since(260)] == [300, 250]
    log.close()


@pytest.mark.parametrize("flt", ["site/1/#", "site/+/sensor/2", "#", "+/0/sensor/0", "nope/#",
                                 "site/2/sensor/4"])
def test_scan_by_topic_filter(tmp_path, flt):
    from edgebroker.mqtt.topics import topic_matches
    log = open_log(tmp_path / "log")
    append_n(log, 150)
    log.write_pending()
    want = [i for i in range(150) if topic_matches(flt, (b"site/%d/sensor/%d" % (i % 3, i % 5)).decode())]
    assert [r.offset for r in log.scan(flt)] == want
    assert [r.offset for r in log.scan(flt.encode(), start=40, end=90)] == [i for i in want if 40 <= i < 90]
    log.close()


def test_scan_dollar_topics_not_matched_by_leading_wildcard(tmp_path):
    log = open_log(tmp_path / "log")
    log.append(T0, 0, False, b"c", b"$SYS/x", b"")
    log.append(T0, 0, False, b"c", b"a/x", b"")
    log.write_pending()
    assert [r.topic for r in log.scan("#")] == [b"a/x"]
    assert [r.topic for r in log.scan("+/x")] == [b"a/x"]
    assert [r.topic for r in log.scan("$SYS/#")] == [b"$SYS/x"]
    log.close()


def test_locate_and_sendfile_the_payload(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 40)
    log.write_pending()
    loc = log.locate(33)
    assert (loc.offset, loc.qos, loc.retain, loc.topic) == (33, 0, False, b"site/0/sensor/3")
    assert os.pread(loc.fd, loc.payload_length, loc.payload_position) == payload_for(33)
    assert log.locate(40) is None
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        items = [(b"H%d:" % o, loc.fd, loc.payload_position, loc.payload_length)
                 for o in (3, 9, 33) for loc in [log.locate(o)]]
        res = _native.send_batch(a, items)
        assert res.error == 0 and res.item == 3
        got = b.recv(65536)
        assert got == b"".join(b"H%d:" % o + payload_for(o) for o in (3, 9, 33))
    finally:
        a.close()
        b.close()
    log.close()


def test_locate_gives_the_publisher_of_a_record_with_properties(tmp_path):
    """A record with 5.0 properties has their length right after the header, before the
    publisher's client id: locate (which a 5.0 session's No Local check reads the id from)
    gave the length's bytes and a cut id."""
    log = open_log(tmp_path / "log")
    props = b"\x03\x00\x10application/json"
    log.append(1_700_000_000_000, 1, False, b"sensor-17", b"a/big", bytes(20_000), props)
    log.append(1_700_000_000_000, 1, False, b"sensor-17", b"a/small", b"x", props)
    log.append(1_700_000_000_000, 1, False, b"sensor-17", b"a/none", b"x")
    log.write_pending()
    for offset, topic, properties, payload in ((0, b"a/big", props, bytes(20_000)),
                                               (1, b"a/small", props, b"x"),
                                               (2, b"a/none", b"", b"x")):
        loc = log.locate(offset)
        assert (loc.client_id, loc.topic, loc.properties) == (b"sensor-17", topic, properties)
        assert os.pread(loc.fd, loc.payload_length, loc.payload_position) == payload
    log.close()


def test_locate_after_reopen_checks_the_record(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 200)
    log.write_pending()
    log.close()
    log = open_log(tmp_path / "log", segment_bytes=4096)
    seg = log._segments[0]
    assert not seg.verified  # below the recovery point: only its index was checked at open
    loc = log.locate(5)
    assert os.pread(loc.fd, loc.payload_length, loc.payload_position) == payload_for(5)
    assert log.verify_step() is True  # the flusher checks that segment whole when idle
    assert seg.verified and log.verify_step() is False
    log.close()


def test_lock_excludes_a_second_writer_not_readers(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 3)
    log.write_pending()
    with pytest.raises(LogLockedError, match="in use by another edgebroker process"):
        open_log(tmp_path / "log")
    ro = CommitLog.open(str(tmp_path / "log"), readonly=True)
    assert [r.offset for r in ro.read_range(0)] == [0, 1, 2]
    with pytest.raises(LogError, match="read-only"):
        ro.append(T0, 0, False, b"", b"t", b"")
    ro.close()
    log.close()


def test_reader_follows_a_writer_across_rolls(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 10)
    log.write_pending()
    ro = CommitLog.open(str(tmp_path / "log"), readonly=True)
    assert [r.offset for r in ro.read_range(0)] == list(range(10))
    append_n(log, 200)  # several rolls
    log.write_pending()
    assert ro.next_offset == 10
    ro.refresh()
    assert ro.next_offset == 210
    assert [r.offset for r in ro.read_range(5)] == list(range(5, 210))
    assert len(ro.segments()) == len(log.segments())
    ro.close()
    log.close()


def test_reader_ignores_a_half_written_record(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    append_n(log, 5)
    log.write_pending()
    seg = segment_files(tmp_path / "log")[0]
    with open(seg, "ab") as fh:  # what a reader may see while a write is in progress
        fh.write(b"\x01\x02\x03\x04\x40\x00\x00\x00")
    ro = CommitLog.open(str(tmp_path / "log"), readonly=True)
    assert ro.next_offset == 5 and ro.damage == []
    ro.close()
    log.close()


def test_bad_arguments(tmp_path):
    log = open_log(tmp_path / "log")
    for bad in [dict(qos=3), dict(client_id=b"x" * 65536), dict(topic=b"t" * 65536), dict(ts=-1)]:
        args = dict(ts=T0, qos=0, retain=False, client_id=b"c", topic=b"t", payload=b"")
        args.update(bad)
        with pytest.raises(ValueError):
            log.append(args["ts"], args["qos"], args["retain"], args["client_id"], args["topic"],
                       args["payload"])
    assert log.next_offset == 0
    log.close()
    with pytest.raises(ValueError, match="segment_bytes"):
        LogOptions(segment_bytes=100)
    with pytest.raises(ValueError, match="retention_bytes"):
        LogOptions(segment_bytes=8192, retention_bytes=4096)


def test_pending_bytes_are_not_limited_while_writes_work(tmp_path):
    """max_pending_bytes bounds memory only while the disk fails (test_diskfull covers that);
    a busy pass may append more than that before its one write."""
    log = open_log(tmp_path / "log", max_pending_bytes=5000, segment_bytes=1 << 20)
    for _ in range(4):
        log.append(T0, 0, False, b"c", b"t", b"x" * 3000)
    assert log.pending_bytes > 12000
    assert log.write_pending() == 4 and log.pending_bytes == 0
    log.close()


# ----------------------------------------------------------------------------------- retention

def test_retention_keeps_segments_until_uploaded(tmp_path):
    clock = Clock(T0)
    log = open_log(tmp_path / "log", clock, segment_bytes=4096, retention_ms=1000)
    append_n(log, 300, start_ts=T0, step_ms=0)
    log.write_pending()
    n = len(log.segments())
    clock.now = T0 + 10_000
    log.housekeeping()
    assert len(log.segments()) == n  # old, but nothing uploaded
    second = log.segments()[2].base_offset
    log.mark_uploaded(second)  # the first two segments are uploaded
    log.housekeeping()
    assert [s.base_offset for s in log.segments()][0] == second
    assert log.first_offset == second
    assert log.counters.segments_deleted == 2 and log.counters.forced_deletions == 0
    assert log.read(0) is None and log.read(second).offset == second
    assert not (tmp_path / "log" / "00000000000000000000.seg").exists()
    assert not (tmp_path / "log" / "00000000000000000000.idx").exists()
    # The mark is persisted.
    log.close()
    assert json.loads((tmp_path / "log" / "uploaded").read_text()) == {"uploaded_offset": second}
    log = open_log(tmp_path / "log", clock, segment_bytes=4096, retention_ms=1000)
    assert log.uploaded_offset == second
    assert log.segments()[0].uploaded is False and log.first_offset == second
    log.close()


def test_retention_by_age_waits_for_the_newest_record(tmp_path):
    clock = Clock(T0)
    log = open_log(tmp_path / "log", clock, segment_bytes=4096, retention_ms=60_000)
    append_n(log, 300, start_ts=T0, step_ms=1000)
    log.write_pending()
    log.mark_uploaded(log.next_offset)
    segs = log.segments()
    clock.now = segs[0].last_timestamp_ms + 59_999
    log.housekeeping()
    assert log.segments()[0].base_offset == 0
    clock.now = segs[0].last_timestamp_ms + 60_000
    log.housekeeping()
    assert log.segments()[0].base_offset == segs[1].base_offset
    clock.now = T0 + 10**9
    log.housekeeping()
    assert len(log.segments()) == 1  # never the last segment
    assert log.next_offset == 300
    log.close()


def test_a_forced_deletion_counts_only_the_records_not_uploaded(tmp_path):
    """The uploaded mark in the middle of the first segment: a deletion by retention_bytes
    counts the records from the mark on as lost to the upload, not the whole segment."""
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=1 << 30)
    append_n(log, 600)
    log.write_pending()
    first = log.segments()[0]
    mark = first.base_offset + first.records // 2
    log.mark_uploaded(mark)
    log.close()
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=12288)
    log.housekeeping()
    assert log.counters.forced_deletions >= 1
    assert log.counters.forced_deleted_records == log.first_offset - mark
    log.close()


def test_retention_bytes_forces_deletion_counted_and_logged(tmp_path, caplog):
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=12288)
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        append_n(log, 600)
        log.write_pending()
    total = sum(s.size_bytes + s.index_bytes for s in log.segments())
    assert total <= 12288 + 4096 + 65536  # within the limit, plus the segment being written
    assert log.counters.forced_deletions >= 1
    assert log.counters.forced_deleted_records == log.first_offset
    warnings = [r.getMessage() for r in caplog.records if "before it was uploaded" in r.getMessage()]
    assert len(warnings) == log.counters.forced_deletions  # once per segment
    assert "over retention_bytes" in warnings[0]
    assert [r.offset for r in log.read_range(0)] == list(range(log.first_offset, 600))
    log.close()


def test_uploaded_mark_survives_and_never_goes_back(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 10)
    log.write_pending()
    log.mark_uploaded(7)
    log.mark_uploaded(3)
    log.mark_uploaded(10**9)  # clamped to what is written
    assert log.uploaded_offset == 10
    log.close()


def test_corrupt_uploaded_file_is_reported_and_treated_as_nothing_uploaded(tmp_path, caplog):
    log = open_log(tmp_path / "log")
    append_n(log, 10)
    log.write_pending()
    log.close()
    (tmp_path / "log" / "uploaded").write_text("{garbage")
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(tmp_path / "log")
    assert log.uploaded_offset == 0
    assert any("uploaded: unreadable" in r.getMessage() for r in caplog.records)
    log.close()


@pytest.mark.parametrize("name, key", [("uploaded", "uploaded_offset"),
                                       ("recovery-point", "recovery_point")])
@pytest.mark.parametrize("value", ["1000000000000000000000000000000", "true"])
def test_an_offset_file_holding_no_offset_is_unreadable(tmp_path, caplog, name, key, value):
    """10**30 in log/uploaded was taken: the next offset went past 64 bits and every append
    failed (OverflowError in the record header); true was taken as offset 1."""
    log = open_log(tmp_path / "log")
    append_n(log, 10)
    log.write_pending()
    log.close()
    (tmp_path / "log" / name).write_text(f'{{"{key}": {value}}}')
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(tmp_path / "log")
    assert any(f"{name}: unreadable ({key} is " in r.getMessage() for r in caplog.records)
    assert log.next_offset == 10
    append_n(log, 1)
    log.write_pending()
    assert [r.offset for r in log.read_range(0)] == list(range(11))
    log.close()


def test_offsets_never_go_back_even_if_every_segment_is_removed(tmp_path):
    log = open_log(tmp_path / "log")
    append_n(log, 10)
    log.write_pending()
    log.mark_uploaded(10)
    log.close()
    for f in (tmp_path / "log").glob("0*"):
        f.unlink()
    log = open_log(tmp_path / "log")
    assert log.next_offset == 10
    log.close()


def test_open_errors_name_the_directory(tmp_path):
    with pytest.raises(LogError, match="no commit log at"):
        CommitLog.open(str(tmp_path / "missing"), readonly=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(LogError, match=str(tmp_path / "file")):
        CommitLog.open(str(tmp_path / "file"))


def test_segment_written_by_a_newer_version_is_refused(tmp_path):
    from edgebroker.commitlog import LogFormatError
    log = open_log(tmp_path / "log")
    append_n(log, 3)
    log.close()
    seg = segment_files(tmp_path / "log")[0]
    data = bytearray(seg.read_bytes())
    data[8] = 3  # version 3, with a matching header checksum
    data[28:32] = crc32c(bytes(data[:28])).to_bytes(4, "little")
    seg.write_bytes(bytes(data))
    with pytest.raises(LogFormatError, match=r"format version 3; this edgebroker reads versions "
                                             r"1, 2 \(written by a newer edgebroker\?\)"):
        open_log(tmp_path / "log")


def test_staged_appends_write_what_the_long_way_writes(tmp_path):
    """Small records are built in C into a staging area, large ones staged without their payload
    (which follows, its CRC filled in at the write); a log that takes every record the long
    way (staging off) must write the same bytes: segments, indexes, offsets, pending counts."""
    import random
    rnd = random.Random(7)
    clock = Clock(T0)
    logs = [open_log(tmp_path / name, clock, segment_bytes=48 * 1024, segment_ms=500)
            for name in ("staged", "long")]
    logs[1]._open_stage = lambda seg: None
    staged_some = held_some = False
    ts = T0
    for i in range(600):
        ts += rnd.choice([0, 1, 7, 40, -30])  # the wall clock may step back
        kind = rnd.random()
        if kind < 0.05:  # large: staged without its payload, which is written from where it is
            payload = bytes(rnd.randrange(256) for _ in range(16 * 1024 + rnd.randrange(50)))
        elif kind < 0.08:  # large and received (a bytearray): the same
            payload = bytearray(rnd.randbytes(16 * 1024 + rnd.randrange(9000)))
        elif kind < 0.1:
            payload = bytearray(b"b%d" % i) * rnd.randrange(5)  # not bytes: the long way
        else:
            payload = b"p%d-" % i * rnd.randrange(30)
        props = rnd.choice([b"", b"", b"\x01\x01", b"\x26\x00\x01k\x00\x03v%02d" % (i % 100),
                            bytearray(b"\x02\x00\x00\x0e\x10")])  # (not bytes: the long way)
        args = (max(ts, 0), rnd.randrange(3), rnd.random() < 0.2, b"dev-%d" % (i % 9),
                b"site/%d/x" % (i % 4), payload, props)
        got = [log.append(*args) for log in logs]
        assert got[0] == got[1] == i
        staged_some = staged_some or logs[0]._stage is not None and logs[0]._stage.count > 0
        held_some = held_some or bool(logs[0]._held)
        assert logs[0].pending_bytes == logs[1].pending_bytes
        assert logs[0].next_offset == logs[1].next_offset == i + 1
        if rnd.random() < 0.15:
            assert logs[0].write_pending() == logs[1].write_pending() == i + 1
            assert logs[0].pending_bytes == logs[1].pending_bytes == 0
        if rnd.random() < 0.02:
            clock.now = ts + 600  # housekeeping seals a segment this old
            for log in logs:
                log.housekeeping()
    assert staged_some and held_some
    reads = [[(*as_tuple(r), r.properties) for r in (log.write_pending(), log.read_range(0))[1]]
             for log in logs]
    assert reads[0] == reads[1] and len(reads[0]) == 600
    assert sum(1 for r in reads[0] if r[7]) > 200
    for log in logs:
        log.close()
    files = [sorted(p.name for p in (tmp_path / name).iterdir()) for name in ("staged", "long")]
    assert files[0] == files[1] and len([f for f in files[0] if f.endswith(".seg")]) > 3
    for name in files[0]:
        assert (tmp_path / "staged" / name).read_bytes() == (tmp_path / "long" / name).read_bytes(), name
    parsed = [(rec["offset"], rec["properties"], rec["payload"])
              for f in segment_files(tmp_path / "staged") for rec in parse_segment(f)]
    assert parsed == [(r[0], r[7], r[6]) for r in reads[0]]


def test_properties_round_trip_through_every_append_and_read_path(tmp_path):
    """Properties of a small record (staged in C), of a large one (staged, payload held), of
    one taken the long way, and none at all: read back by read, read_range, scan, read_batch
    and locate; the records without are byte for byte version 1 records."""
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    props = b"\x03\x00\x10application/json\x26\x00\x04unit\x00\x01C"
    big = os.urandom(20_000)
    log.append(T0, 1, False, b"c", b"a/small", b"{}", props)
    log.append(T0, 2, True, b"c", b"a/big", bytearray(big), props)
    log.append(T0, 0, False, b"c", b"a/none", b"plain")
    log.append(T0, 0, False, b"c", b"a/long", b"x", bytearray(props))
    log.write_pending()
    want = [(0, props, b"{}"), (1, props, big), (2, b"", b"plain"), (3, props, b"x")]
    assert [(r.offset, r.properties, r.payload) for r in log.read_range(0)] == want
    assert [(r.offset, r.properties) for r in log.scan(b"a/+")] == [w[:2] for w in want]
    assert (log.read(1).properties, log.read(1).retain, log.read(1).qos) == (props, True, 2)
    records, _ = log.read_batch(0, b"a/#", 10, 1 << 20, 1 << 20, copy_limit=4096)
    assert [(r[0], r[4], r[5], r[6], r[7]) for r in records] == [
        (0, b"a/small", b"{}", 2, props), (1, b"a/big", None, 20_000, props),
        (2, b"a/none", b"plain", 5, b""), (3, b"a/long", b"x", 1, props)]
    where = log.locate(1)
    assert (where.topic, where.properties, where.payload_length) == (b"a/big", props, 20_000)
    assert os.pread(where.fd, 20_000, where.payload_position) == big
    log.close()
    recs = parse_segment(segment_files(tmp_path / "log")[0])
    assert [(r["offset"], r["properties"]) for r in recs] == [w[:2] for w in want]
    seg = segment_files(tmp_path / "log")[0].read_bytes()
    assert seg[8:10] == b"\x02\x00"  # format version 2
    plain = recs[2]
    assert seg[plain["position"]:plain["payload_position"] + 5] == _native.record_header(
        2, T0, 0, b"c", b"a/none", b"plain") + b"ca/noneplain"



def test_a_deleted_segment_can_be_closed_by_another_thread(tmp_path):
    """With ``defer_closes``, a segment that retention deletes keeps its (unlinked) files open
    until ``close_retired`` (the flusher's job): the last close frees the blocks, which can
    wait for the disk."""
    log = open_log(tmp_path / "log", segment_bytes=64 * 1024, retention_bytes=64 * 1024)
    log.defer_closes()
    big = [os.urandom(40_000) for _ in range(4)]
    for i, p in enumerate(big):
        log.append(T0 + i, 1, False, b"c", b"t", bytearray(p))
        log.write_pending()
    assert log.counters.segments_deleted >= 1
    retired = list(log._retired)
    assert len(retired) == 2 * log.counters.segments_deleted
    assert all(os.fstat(fd).st_nlink == 0 for fd in retired)  # deleted, still open
    log.close_retired()
    for fd in retired:
        with pytest.raises(OSError):
            os.fstat(fd)
    log.close()
    log = open_log(tmp_path / "log", segment_bytes=64 * 1024, retention_bytes=64 * 1024)
    got = [r.payload for r in log.read_range(0)]  # what retention left: the newest records
    assert got and got == big[len(big) - len(got):] and log.next_offset == 4
    assert log.recovery.damage == []
    log.close()


def test_no_descriptor_free_at_a_roll_fails_the_write_and_it_recovers(tmp_path):
    """The index of a new segment is mapped with mmap, which takes a descriptor of its own.
    When the two files open but that fails (EMFILE: the process is at its descriptor limit,
    clients can bring it there), the write fails as a disk error does (LogWriteError, the
    records kept) instead of escaping as an OSError; once descriptors are free it goes on."""
    import resource
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 10)
    log.write_pending()
    first_segments = len(log.segments())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
        while True:             # every descriptor taken ...
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        for _ in range(2):      # ... but the two files of the next segment
            os.close(held.pop())
        append_n(log, 200, start_ts=T0 + 100)   # several rolls' worth
        with pytest.raises(LogWriteError) as info:
            log.write_pending()
        assert "cannot map index" in str(info.value) and info.value.path.endswith(".idx")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert log.write_pending() == 210
    assert [as_tuple(r) for r in log.read_range(0)] == [expected(i, T0 + i * 10) for i in range(210)]
    assert len(log.segments()) > first_segments
    log.close()


def test_a_seal_at_the_descriptor_limit_still_maps_its_index(tmp_path, caplog):
    """The read-only map of a sealed index takes a descriptor of its own; when none is free,
    the seal lets the writable map (which holds one) go first and maps again: a seal never
    needs more descriptors than the segment already had."""
    import resource
    from edgebroker.commitlog import LogWriteError
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 10)
    log.write_pending()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
        while True:             # every descriptor taken
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        append_n(log, 200, start_ts=T0 + 100)       # several rolls' worth
        with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
            # The first segment's records are written and it is sealed; the next segment's
            # files cannot open.
            with pytest.raises(LogWriteError):
                log.write_pending()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert log._segments[0].sealed and isinstance(log._segments[0].index, mmap.mmap)
    assert not any("sealed index" in r.getMessage() for r in caplog.records)
    assert log.write_pending() == 210
    assert [as_tuple(r) for r in log.read_range(0)] == [expected(i, T0 + i * 10) for i in range(210)]
    log.close()


MMAP_FAULT_SCRIPT = r'''
import json, logging, os, sys
sys.path.insert(0, os.environ["EB_TESTS"])
from commitlog.logutil import append_n, as_tuple, expected, open_log
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
log = open_log(sys.argv[1], segment_bytes=4096)
open(os.environ["EB_FAULT_FLAG"], "w").close()   # read-only maps of indexes fail from now on
append_n(log, 300)
written = log.write_pending()
sealed = [s for s in log._segments if s.sealed]
kinds = sorted({type(s.index).__name__ for s in sealed})
ok = [as_tuple(r) for r in log.read_range(0)] == [expected(i, 1_700_000_000_000 + i * 10)
                                                    for i in range(300)]
log.sync()
sizes = [(os.path.getsize(s.index_path), s.count * 16) for s in sealed]
log.close()
print(json.dumps({"written": written, "sealed": len(sealed), "kinds": kinds, "reads": ok,
                  "sizes": sizes}))
'''


def test_a_sealed_index_that_cannot_be_mapped_is_kept_in_memory(tmp_path):
    """When the read-only map of a sealed index fails (here ENOMEM, as when the process has
    used up its memory maps, made real by an LD_PRELOAD shim: tests/faults/mmap_fault.c), the
    segment keeps a copy of its entries in memory (logged) and stays readable; its index file
    is still trimmed and synced, so the next start uses it as it is."""
    lib = shims.build("mmap_fault", tmp_path)
    env = dict(os.environ, LD_PRELOAD=str(lib), EB_FAULT_FLAG=str(tmp_path / "fail-mmap"),
               EB_FAULT_PATH=".idx", EB_TESTS=str(Path(__file__).parent.parent))
    proc = subprocess.run([sys.executable, "-c", MMAP_FAULT_SCRIPT, str(tmp_path / "log")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["written"] == 300 and out["sealed"] >= 3 and out["kinds"] == ["bytes"], out
    assert out["reads"] and all(a == b for a, b in out["sizes"]), out
    warnings = [x for x in proc.stderr.splitlines() if "cannot map the sealed index" in x]
    assert len(warnings) == out["sealed"], proc.stderr
    assert "Cannot allocate memory" in warnings[0] and "kept in memory" in warnings[0]
    log = open_log(tmp_path / "log", segment_bytes=4096)
    assert log.recovery.index_rebuilt == [] and log.recovery.damage == []
    assert [as_tuple(r) for r in log.read_range(0)] == [expected(i, T0 + i * 10) for i in range(300)]
    log.close()


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def _spares(log) -> list[str]:
    return sorted(n for n in os.listdir(log.directory) if n.startswith("next-segment-"))


def test_a_new_segment_takes_the_file_made_ahead_and_its_room_goes_once_sealed(tmp_path):
    seg_bytes = 1 << 20
    log = open_log(tmp_path / "log", segment_bytes=seg_bytes)
    taken = []
    log.make_spares(lambda: taken.append(1))
    assert log.prepare_spare()     # the flusher's part: an empty file, allocated ahead
    [spare] = _spares(log)
    assert os.path.getsize(tmp_path / "log" / spare) == 0
    assert _allocated(tmp_path / "log" / spare) >= seg_bytes
    for i in range(10):
        log.append(T0 + i, 1, False, b"dev", b"t", bytes([i]) * 10_000)
    log.write_pending()
    first = segment_files(tmp_path / "log")[0]
    assert _spares(log) == [] and taken == [1]   # taken, and the flusher told
    size = os.path.getsize(first)
    assert 100_000 < size < 110_000          # its size is what was written...
    assert _allocated(first) >= seg_bytes     # ...its blocks reach segment_bytes
    assert log.prepare_spare()
    for i in range(10, 150):                 # past a roll
        log.append(T0 + i, 1, False, b"dev", b"t", bytes([i]) * 10_000)
    log.write_pending()
    assert len(segment_files(tmp_path / "log")) == 2 and taken == [1, 1]
    log.sync()
    # Sealed and synced: the room past its size is freed.
    assert _allocated(first) < os.path.getsize(first) + 8192
    tail = segment_files(tmp_path / "log")[1]
    assert _allocated(tail) >= seg_bytes
    assert log.prepare_spare() and len(_spares(log)) == 1
    log.close()
    assert _allocated(tail) < os.path.getsize(tail) + 8192   # freed at close too...
    assert _spares(log) == []                                # ...and the spare removed
    log = open_log(tmp_path / "log", segment_bytes=seg_bytes)
    assert _allocated(tail) >= seg_bytes                     # appended to again: room again
    assert [log.read(i).payload for i in range(150)] == [bytes([i]) * 10_000
                                                          for i in range(150)]
    log.close()


def test_without_a_file_made_ahead_a_new_segment_is_allocated_as_it_is_written(tmp_path):
    # The core thread never allocates a new segment's blocks itself (that can wait for the
    # disk to read block bitmaps): with no spare ready, a roll creates the file as before.
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    log.make_spares()
    append_n(log, 20)
    log.write_pending()
    first = segment_files(tmp_path / "log")[0]
    assert _allocated(first) < os.path.getsize(first) + 8192
    assert [r.offset for r in log.read_range(0)] == list(range(20))
    log.close()


def test_a_file_made_ahead_that_a_crash_left_is_removed_at_start(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    append_n(log, 5)
    log.close()
    spare = tmp_path / "log" / "next-segment-3.tmp"   # what a crash leaves behind
    fd = os.open(spare, os.O_RDWR | os.O_CREAT)
    assert segment.preallocate(fd, 1 << 20) == 0
    os.close(fd)
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    assert not spare.exists()
    assert log.recovery.removed == [(str(spare), "unfinished temporary file")]
    assert [r.offset for r in log.read_range(0)] == list(range(5))
    log.close()


def test_a_sync_that_fails_leaves_freeing_the_room_to_its_retry(tmp_path, monkeypatch):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    log.make_spares(lambda: log.prepare_spare())  # the next one at once, as the flusher would
    assert log.prepare_spare()
    for i in range(3):  # two sealed segments of about 1 MiB, their room past a few bytes
        log.append(T0 + i, 1, False, b"dev", b"t", bytes([i]) * 1_000_000)
    log.write_pending()
    files = segment_files(tmp_path / "log")
    assert len(files) == 3 and all(_allocated(f) >= 1 << 20 for f in files)
    fdatasync = os.fdatasync
    calls = []

    def first_fails(fd):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "I/O error")
        fdatasync(fd)
    monkeypatch.setattr(os, "fdatasync", first_fails)  # the disk fails the first one
    with pytest.raises(LogWriteError):
        log.sync()
    monkeypatch.undo()
    assert log.sync() == 3
    for f in files[:2]:
        assert _allocated(f) < os.path.getsize(f) + 8192, f
    log.close()


def test_room_a_crash_left_allocated_past_a_sealed_segment_is_freed_at_the_next_start(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=64 * 1024)
    for i in range(30):
        log.append(1_700_000_000_000 + i, 1, False, b"dev", b"t", bytes([i]) * 5_000)
    log.write_pending()
    log.close()
    first = segment_files(tmp_path / "log")[0]
    size = os.path.getsize(first)
    # What a crash between the seal and the flusher's sync leaves: the room still allocated.
    fd = os.open(first, os.O_RDWR)
    assert segment.preallocate(fd, 1 << 20) == 0
    os.close(fd)
    assert _allocated(first) >= 1 << 20 and os.path.getsize(first) == size
    log = open_log(tmp_path / "log", segment_bytes=64 * 1024)
    assert _allocated(first) < size + 8192 and os.path.getsize(first) == size
    assert [log.read(i).payload for i in range(30)] == [bytes([i]) * 5_000 for i in range(30)]
    assert log.recovery.damage == [] and log.recovery.index_rebuilt == []
    log.close()
