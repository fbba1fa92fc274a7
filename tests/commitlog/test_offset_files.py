"""The recovery point and the uploaded mark against the log's real end at open.

A clean close records every written record as fsynced (the recovery point is the log's end),
so the next start tells records lost from the end after the stop (the last segment truncated
or deleted) from a power cut's torn tail. A value past the end, whatever the cause, is logged
with the file, the value and the log's end. A recovery point is lowered to the end; an uploaded
mark is kept, and new records take offsets from it: offsets already uploaded are not given to
other records."""

from __future__ import annotations

import json
import os

from .logutil import append_n, open_log, segment_files

PAST = "is past the end of the commit log"


def _clean_log(path, n=100):
    log = open_log(path, segment_bytes=4096)
    append_n(log, n)
    log.write_pending()
    log.close()
    return path


def _delete_the_last_two(d) -> int:
    """Delete the log's last two segments and their indexes: the first offset they held."""
    segs = segment_files(d)
    for seg in segs[-2:]:
        seg.unlink()
        seg.with_suffix(".idx").unlink()
    return int(segs[-2].name[:20])


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if PAST in r.getMessage()]


def test_last_segment_truncated_after_a_clean_stop_is_named(tmp_path, caplog):
    """Before, the clean close wrote the tail's base offset as the recovery point, and the
    next start truncated or dropped that segment's records without a line."""
    d = _clean_log(tmp_path / "log")
    last = segment_files(d)[-1]
    base = int(last.name[:20])
    os.truncate(last, 0)
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=4096)
    try:
        [line] = _warnings(caplog)
        assert str(d / "recovery-point") in line and ": 100 " in line, line
        assert f"records {base} to 99" in line and last.name in line, line
        assert log.next_offset == base
    finally:
        log.close()


def test_last_two_segments_deleted_after_a_clean_stop_are_named(tmp_path, caplog):
    d = _clean_log(tmp_path / "log")
    lost_from = _delete_the_last_two(d)
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=4096)
    try:
        [line] = _warnings(caplog)
        assert f"records {lost_from} to 99" in line and segment_files(d)[-1].name in line, line
    finally:
        log.close()


def test_a_torn_tail_after_a_crash_stays_quiet(tmp_path, caplog):
    """No close (a crash): the recovery point is only what a sync of sealed segments wrote,
    and a torn last record is truncated with no line about the offset files."""
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 100)
    log.write_pending()
    log.sync()
    log._close_files()           # the process dies: nothing of close() runs
    last = segment_files(tmp_path / "log")[-1]
    os.truncate(last, os.path.getsize(last) - 3)
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(tmp_path / "log", segment_bytes=4096)
    try:
        assert _warnings(caplog) == []
        assert log.next_offset == 99 and log.counters.torn_bytes_truncated > 0
    finally:
        log.close()


def test_a_wrong_recovery_point_past_the_end_is_ignored_with_a_warning(tmp_path, caplog):
    """Before, a recovery point of 10^9 moved the next offset there: sessions counted 10^9
    records that never existed as lost."""
    d = _clean_log(tmp_path / "log")
    (d / "recovery-point").write_text(json.dumps({"recovery_point": 1_000_000_000}))
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=4096)
    try:
        [line] = _warnings(caplog)
        assert str(d / "recovery-point") in line and "1000000000" in line, line
        assert log.next_offset == 100 and log.missing_between(0, 101) == []
        append_n(log, 1)
        log.write_pending()
        assert [r.offset for r in log.read_range(98)] == [98, 99, 100]
    finally:
        log.close()
    assert json.loads((d / "recovery-point").read_text())["recovery_point"] == 101


def test_offsets_below_an_uploaded_mark_past_the_end_are_not_given_again(tmp_path, caplog):
    """The uploaded mark past the end (the last segments lost after a stop, all uploaded) is
    kept: new records take offsets from it, not those already in the sink (a batch with the
    same first and last offsets would have an uploaded batch's name: the sink refuses it and
    the uploader stops there). The offsets between are a hole, counted as log_gap."""
    d = _clean_log(tmp_path / "log")
    (d / "uploaded").write_text(json.dumps({"uploaded_offset": 100}))
    end = _delete_the_last_two(d)
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=4096)
    try:
        rp, up = _warnings(caplog)
        assert str(d / "recovery-point") in rp and f"records {end} to 99" in rp, rp
        assert str(d / "uploaded") in up and ": 100 " in up and f"offset {end}," in up, up
        assert segment_files(d)[-1].name in up and "new records take offsets from 100" in up, up
        assert log.next_offset == 100 and log.uploaded_offset == 100
        assert log.missing_between(0, 101) == [(end, 100)]
        assert append_n(log, 2) == [100, 101]
        log.write_pending()
        assert [r.offset for r in log.read_range(end - 1)] == [end - 1, 100, 101]
    finally:
        log.close()
    assert segment_files(d)[-1].name == "%020d.seg" % 100
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=4096)
    try:   # the next start finds the hole between two segments, and nothing past the end
        assert _warnings(caplog) == []
        assert log.next_offset == 102 and log.missing_between(0, 102) == [(end, 100)]
    finally:
        log.close()


def test_a_wrong_uploaded_mark_past_the_end_is_kept(tmp_path, caplog):
    """As the uploader wrote it: its offsets are never given again (a gap, with a warning)."""
    d = _clean_log(tmp_path / "log")
    (d / "uploaded").write_text(json.dumps({"uploaded_offset": 5000}))
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=4096)
    try:
        [line] = _warnings(caplog)
        assert str(d / "uploaded") in line and "5000" in line and "offset 100," in line, line
        assert log.next_offset == 5000 and log.uploaded_offset == 5000
        append_n(log, 1)
        log.write_pending()
        assert [r.offset for r in log.read_range(98)] == [98, 99, 5000]
    finally:
        log.close()
    assert json.loads((d / "recovery-point").read_text())["recovery_point"] == 5001
