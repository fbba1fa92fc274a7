"""A power cut's torn tail of whole segments: the directory's fsyncs (a new segment's, the
recovery point's, the uploaded mark's) make the names of the segments created since durable
before their data, so a cut while writing runs ahead of the flusher leaves empty segment files
after the last one with records. That is a torn tail (nothing of it was known durable), not
offsets lost from the middle of the log: no hole, the next records take those offsets, and the
log verifies. Empty segments with records after them, or past the recovery point, are still
reported missing."""

from __future__ import annotations

import json

from edgebroker.commitlog import CommitLog

from .logutil import Clock, append_n, open_log, segment_files

T0 = 1_700_000_000_000


def _cut_log(path, n=300):
    """A log of ``n`` records closed as a power cut after a few more rolls would leave it:
    its files, and the recovery point at the last segment with records."""
    log = open_log(path, segment_bytes=4096)
    append_n(log, n)
    log.write_pending()
    log.close()
    return path, segment_files(path)[-1]


def _empty_segments(path, *bases):
    for base in bases:
        (path / f"{base:020d}.seg").write_bytes(b"")
        (path / f"{base:020d}.idx").write_bytes(b"")


def _check_reads_on(path, n, removed):
    log = open_log(path, segment_bytes=4096)
    try:
        assert log.recovery.missing == [] and log.missing_between(0, n) == []
        assert sorted(p for p, why in log.recovery.removed if why == "torn tail") == removed
        assert log.next_offset == n
        assert log.append(T0, 1, False, b"c", b"t", b"after the cut") == n
        log.write_pending()
        assert [r.offset for r in log.read_range(0)] == list(range(n + 1))
        assert log.verify().ok
    finally:
        log.close()
    again = open_log(path, segment_bytes=4096)
    try:
        assert again.recovery.missing == [] and again.recovery.removed == []
        assert [r.offset for r in again.read_range(0)] == list(range(n + 1))
    finally:
        again.close()


def test_empty_segments_after_the_last_records_are_a_torn_tail(tmp_path, caplog):
    """They were removed as holding no records, and the offsets between the last record and
    the last empty one reported missing (sessions counted them as log_gap drops; verify
    failed). The first one, which starts where the records end, is kept to append to."""
    d, _last = _cut_log(tmp_path / "log")
    _empty_segments(d, 300, 321, 345)
    removed = [str(d / f"{b:020d}.seg") for b in (321, 345)]
    _check_reads_on(d, 300, removed)
    assert not any("missing" in r.getMessage() for r in caplog.records)
    warned = [r.getMessage() for r in caplog.records if "torn tail" in r.getMessage()]
    assert len(warned) == 1 and "the last 2 segment files" in warned[0], warned
    assert "new records take offsets from 300" in warned[0]


def test_a_torn_tail_that_took_the_last_records_with_it(tmp_path):
    """The records at the end of the last segment with records were lost too (the empty
    segments start after them): the segment with records is appended to again."""
    d, last = _cut_log(tmp_path / "log")
    _empty_segments(d, 305, 330)
    _check_reads_on(d, 300, [str(d / f"{b:020d}.seg") for b in (305, 330)])
    assert segment_files(d)[-1] == last


def test_empty_segments_past_the_recovery_point_are_missing_offsets(tmp_path):
    """The recovery point says the records up to the last empty segment were fsynced: they
    were lost after they were durable, which no power cut does. Reported missing."""
    d, _last = _cut_log(tmp_path / "log")
    _empty_segments(d, 300, 321, 345)
    (d / "recovery-point").write_text(json.dumps({"recovery_point": 345}))
    log = CommitLog.open(str(d), None, Clock())
    try:
        assert [m[:2] for m in log.recovery.missing] == [(300, 345)]
        assert not any(why == "torn tail" for _p, why in log.recovery.removed)
    finally:
        log.close()


def test_an_empty_segment_with_records_after_it_is_still_missing_offsets(tmp_path):
    d, _last = _cut_log(tmp_path / "log", n=300)
    segs = segment_files(d)
    middle = segs[len(segs) // 2]
    middle.write_bytes(b"")
    log = open_log(d, segment_bytes=4096)
    try:
        assert len(log.recovery.missing) == 1
        assert (str(middle), "no records") in log.recovery.removed
    finally:
        log.close()
