"""The outbound side over a real commit log: which records go out under which names, the cursor
only past the contiguous acknowledged prefix, the origin marker, resends counted after a
restart, a gap when the records under the cursor are gone."""

from __future__ import annotations

from edgebroker.bridge.outbound import Outbound
from edgebroker.bridge.rules import Rules
from edgebroker.bridge_config import TopicRule
from edgebroker.commitlog import CommitLog, LogOptions

BRIDGE_ID = b"edgebroker-bridge-up"


def _log(path, records, **options) -> CommitLog:
    """A log holding ``records``: (publisher id, topic) each, payload its offset."""
    base = dict(segment_bytes=4096, segment_ms=3_600_000, retention_bytes=1 << 30,
                retention_ms=7 * 86_400_000)
    log = CommitLog.open(str(path), LogOptions(**{**base, **options}), lambda: 1_700_000_000_000)
    for publisher, topic in records:
        log.append(1_700_000_000_000, 1, False, publisher, topic,
                   str(log.next_offset).encode())
    log.write_pending()
    return log


def _drain(outbound: Outbound) -> list[tuple]:
    out = []
    while True:
        record = outbound.take()
        if record is None:
            if not outbound.read():
                return out
            continue
        out.append(record)


def test_rules_map_topics_and_the_origin_marker_keeps_own_records(tmp_path):
    log = _log(tmp_path / "log", [(b"dev", b"dev/1/temp"), (b"dev", b"dev/1/hum"),
                                  (BRIDGE_ID, b"dev/2/temp"), (b"dev", b"other/temp"),
                                  (b"dev", b"dev/3/temp")])
    rules = Rules([TopicRule(pattern="+/temp", direction="both", qos=2, local_prefix="dev/",
                             remote_prefix="site/"),
                   TopicRule(pattern="#", direction="in")])
    out = Outbound("up", log, rules, BRIDGE_ID, 0, 0)
    sent = _drain(out)
    assert [(r[0], r[1], r[2], r[3]) for r in sent] == [
        (0, "site/1/temp", b"0", 2), (4, "site/3/temp", b"4", 2)]
    assert out.skipped_own == 1 and out.read_at == 5
    assert rules.incoming("site/9/temp") == "dev/9/temp" and rules.incoming("x/y") == "x/y"
    log.close()


def test_the_cursor_moves_only_past_the_contiguous_acknowledged_prefix(tmp_path):
    log = _log(tmp_path / "log", [(b"dev", b"a/%d" % i) for i in range(6)]
               + [(b"dev", b"b/0")] + [(b"dev", b"a/7")])
    out = Outbound("up", log, Rules([TopicRule(pattern="a/#")]), BRIDGE_ID, 0, 0)
    offsets = [r[0] for r in _drain(out)]
    assert offsets == [0, 1, 2, 3, 4, 5, 7]   # b/0 is not forwarded
    assert out.cursor == 0
    for offset in (1, 2, 4):                  # acknowledged out of order
        out.acked(offset)
    assert out.cursor == 0
    out.acked(0)
    assert out.cursor == 3
    out.acked(3)
    out.acked(5)
    assert out.cursor == 7                    # past 6, which no rule takes
    out.acked(7)
    assert out.cursor == 8 and out.forwarded == 7 and out.hold() == 0
    out.saved = out.cursor                    # written to the checkpoint
    assert out.hold() == 8
    log.close()


def test_after_a_restart_what_was_sent_is_counted_as_resent(tmp_path):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 10)
    # The checkpoint: acknowledged below 4, sent up to 7.
    out = Outbound("up", log, Rules([TopicRule(pattern="a/#")]), BRIDGE_ID, 4, 7)
    assert [r[0] for r in _drain(out)] == [4, 5, 6, 7, 8, 9]
    assert out.resent == 3
    log.close()


def test_records_deleted_under_the_cursor_are_a_gap(tmp_path, caplog):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 400, retention_bytes=8192)
    out = Outbound("up", log, Rules([TopicRule(pattern="a/#")]), BRIDGE_ID, 0, 0)
    log.housekeeping()        # over retention_bytes: the oldest segments go
    first = log.first_offset
    assert first > 0
    sent = _drain(out)
    assert sent[0][0] == first and out.gaps == 1 and out.gap_offsets == first
    assert f"log records 0 to {first - 1} were deleted before it forwarded them" in caplog.text
    log.close()


def test_records_not_yet_written_in_an_empty_log_are_no_gap(tmp_path):
    log = _log(tmp_path / "log", [])
    out = Outbound("up", log, Rules([TopicRule(pattern="a/#")]), BRIDGE_ID, 0, 0)
    for _ in range(3):
        log.append(1_700_000_000_000, 1, False, b"dev", b"a/x", b"p")
    assert log.written_offset == 0 and log.next_offset == 3   # appended, not yet written
    assert log.first_offset == 0     # the first record appended (issue 22)
    out.check_gap()
    assert out.gaps == 0 and out.read_at == 0
    log.write_pending()
    assert [r[0] for r in _drain(out)] == [0, 1, 2]
    log.close()


def test_rules_match_as_their_filters_and_a_topic_that_maps_to_nothing_is_unsendable(tmp_path):
    """``a/$x``, ``a/`` and ``a`` match the filter ``a/#`` (only a *first* ``$`` is kept from
    wildcards); ``p`` matches ``p/#`` but has no remote name under an empty remote_prefix:
    skipped as unsendable, the cursor past it."""
    log = _log(tmp_path / "log", [(b"dev", t) for t in (
        b"a/x", b"a/$x", b"a/", b"a", b"$a/x", b"ab", b"p", b"p/q")])
    rules = Rules([TopicRule(pattern="#", direction="both", local_prefix="a/",
                             remote_prefix="b/"),
                   TopicRule(pattern="#", local_prefix="p/")])
    out = Outbound("up", log, rules, BRIDGE_ID, 0, 0)
    sent = _drain(out)
    assert [(r[0], r[1]) for r in sent] == [
        (0, "b/x"), (1, "b/$x"), (2, "b/"), (3, "b"), (7, "q")]
    assert out.unsendable == 1
    for offset in (0, 1, 2, 3, 7):
        out.acked(offset)
    assert out.cursor == 8
    assert [rules.incoming(t) for t in ("b/$in", "b/", "b", "$b/x", "bc")] == [
        "a/$in", "a/", "a", None, None]
    log.close()


def test_a_segment_missing_from_the_middle_is_a_counted_logged_gap(tmp_path, caplog):
    """A segment lost between two others (deleted by hand, or by the file system): the
    bridge's read passes over its offsets; they are lost to the remote, counted as a gap and
    logged with the offsets. Before, the read went past them silently."""
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 300)
    log.close()
    segs = sorted((tmp_path / "log").glob("*.seg"))
    assert len(segs) >= 4
    gone, after = segs[1], segs[2]
    lo, hi = int(gone.name[:20]), int(after.name[:20])
    gone.unlink()
    gone.with_suffix(".idx").unlink()
    log = _log(tmp_path / "log", [])
    out = Outbound("up", log, Rules([TopicRule(pattern="a/#")]), BRIDGE_ID, 0, 0)
    offsets = [r[0] for r in _drain(out)]
    assert offsets == [i for i in range(300) if not lo <= i < hi]
    assert out.gaps == 1 and out.gap_offsets == hi - lo
    assert f"log records {lo} to {hi - 1} are lost to the remote (missing" in caplog.text
    log.close()
