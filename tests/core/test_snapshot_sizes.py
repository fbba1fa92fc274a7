"""Offline sessions keep Stored refs (log offset + size): the byte limits keep counting them, the
snapshot records the sizes, and snapshots written before sizes existed still load."""

import json

from edgebroker import config
from edgebroker.core import snapshot as snap
from edgebroker.core.broker import Broker
from edgebroker.core.session import (
    EMPTY_DICT, EMPTY_IDS, EMPTY_QUEUE, Message, Stored, as_stored,
)


def test_as_stored_keeps_offset_and_size():
    message = Message("a/b", b"12345", 1, False, offset=42)
    stored = as_stored(message)
    assert type(stored) is Stored and (stored.offset, stored.size) == (42, 3 + 5)
    assert as_stored(stored) is stored
    unlogged = Message("$SYS/x", b"1", 0, False)
    assert as_stored(unlogged) is unlogged


def test_old_snapshot_entries_load_with_size_zero():
    doc = {"format": 1, "written_ms": 0, "log_next_offset": 10, "retained": [],
           "sessions": [{"client_id": "old", "subscriptions": [["a/#", 1]],
                         "inflight": [[3, 4, 1, False, 0]], "queue": [[5, 1, False]],
                         "awaiting_release": [], "next_id": 3},
                        {"client_id": "new", "subscriptions": [],
                         "inflight": [[7, 8, 2, True, 1, 30]], "queue": [[9, 1, False, 40]],
                         "awaiting_release": [2], "next_id": 7}]}
    state = snap.decode(json.dumps(doc).encode())
    old, new = state.sessions
    assert old.inflight == [(3, 4, 1, False, 0, 0)] and old.queue == [(5, 1, False, 0)]
    assert new.inflight == [(7, 8, 2, True, 1, 30)] and new.queue == [(9, 1, False, 40)]


def test_capture_and_restore_keep_sizes_and_byte_counts():
    broker = Broker(config.Config(), lambda: 0.0)
    state = snap.Snapshot(log_next_offset=20, sessions=[
        snap.SessionState("s", {"a/#": 1}, inflight=[(1, 10, 1, False, 0, 30)],
                          queue=[(11, 1, False, 40), (12, 0, False, 50)], next_id=1,
                          offline_ms=0),
        snap.SessionState("idle")])
    broker.restore(state)
    s = broker.sessions["s"]
    assert (s.inflight_bytes, s.queue_bytes) == (30, 90)
    assert (broker.queued_messages, broker.queued_bytes) == (2, 90)
    assert all(type(ref) is Stored for ref, _, _ in s.queue)
    idle = broker.sessions["idle"]
    assert idle.queue is EMPTY_QUEUE and idle.inflight is EMPTY_DICT
    assert idle.subscriptions is EMPTY_DICT and idle.awaiting_release is EMPTY_IDS
    again = snap.decode(snap.encode(broker.capture()))
    by_id = {x.client_id: x for x in again.sessions}
    assert by_id["s"].inflight == [(1, 10, 1, False, 0, 30)]
    assert by_id["s"].queue == [(11, 1, False, 40), (12, 0, False, 50)]


def test_going_offline_keeps_sizes_and_the_shared_empty_queue():
    broker = Broker(config.Config(), lambda: 0.0)
    broker.restore(snap.Snapshot(sessions=[snap.SessionState("empty"),
                                           snap.SessionState("full")]))
    empty, full = broker.sessions["empty"], broker.sessions["full"]
    message = Message("t", b"xyz", 1, False, offset=7)
    full.own_queue().append((message, 1, False))
    full.queue_bytes = message.size
    broker._go_offline(empty)
    broker._go_offline(full)
    assert empty.queue is EMPTY_QUEUE
    (ref, qos, retain), = full.queue
    assert type(ref) is Stored and (ref.offset, ref.size) == (7, message.size)
    assert full.queue_bytes == message.size


def test_cursors_survive_the_snapshot_and_format_1_still_loads(tmp_path):
    """Format 2 keeps a session's cursor, the filters subscribed while behind, its offline
    ranges and drops; a format 1 snapshot (no cursors) still loads."""
    import time

    from edgebroker.commitlog.format import LogOptions
    from edgebroker.commitlog.log import CommitLog

    log = CommitLog.open(str(tmp_path / "log"), LogOptions())
    for i in range(10):
        log.append(i, 1, False, b"c", b"a", b"%d" % i)
    log.write_pending()
    broker = Broker(config.Config(), time.monotonic, commit_log=log, wall_ms=lambda: 0)
    state = snap.Snapshot(log_next_offset=8, sessions=[
        snap.SessionState("behind", {"a": 1, "b": 2}, cursor=3, since={"b": 6},
                          offline=[[2, 4], [7, None]], drops={"log_gap": 2}),
        snap.SessionState("in-step", {"a": 1}),
        snap.SessionState("past-the-end", {"a": 1}, cursor=50)])
    broker.restore(state)
    behind = broker.sessions["behind"].cursor
    assert (behind.offset, behind.since, behind.offline) == (3, {"b": 6}, [[2, 4], [7, None]])
    assert broker.sessions["behind"].drops == {"log_gap": 2}
    # In step when the snapshot was taken: it reads from its offset on, was online up to the
    # log's end (QoS 0 below it may have been sent: not again) and is offline from there.
    in_step = broker.sessions["in-step"].cursor
    assert (in_step.offset, in_step.offline, in_step.unsure_to) == (8, [[10, None]], 10)
    assert broker.sessions["past-the-end"].cursor.offset == 10   # the log ends there
    again = snap.decode(snap.encode(broker.capture()))
    by_id = {s.client_id: s for s in again.sessions}
    assert (by_id["behind"].cursor, by_id["behind"].since) == (3, {"b": 6})
    assert by_id["behind"].offline == [[2, 4], [7, None]]
    assert by_id["behind"].drops == {"log_gap": 2}
    old = snap.decode(b'{"format": 1, "written_ms": 0, "log_next_offset": 0, "retained": [],'
                      b' "sessions": [{"client_id": "x", "subscriptions": [], "inflight": [],'
                      b' "queue": [], "awaiting_release": []}]}')
    assert old.sessions[0].cursor is None and old.sessions[0].offline == []
    log.close()


def test_queued_and_held_qos0_of_a_session_connected_at_the_snapshot_go_no_more(tmp_path):
    """After a crash: a session connected when the snapshot was written may have been sent
    its queue and its held retained copies since. Those at QoS 0 were sent again (QoS 0 is
    at most once); now they are left out, counted as restart_qos0. An offline session's are
    kept: it was sent nothing."""
    import time

    from edgebroker.commitlog.format import LogOptions
    from edgebroker.commitlog.log import CommitLog

    log = CommitLog.open(str(tmp_path / "log"), LogOptions())
    for i in range(10):
        log.append(i, 1, False, b"c", b"a", b"%d" % i)
    log.write_pending()
    broker = Broker(config.Config(), time.monotonic, commit_log=log, wall_ms=lambda: 0)
    queue = [[3, 0, False, 2], [4, 1, False, 2], [5, 0, False, 2]]
    held = [[6, 1, 0, True, 2], [6, 2, 1, True, 2]]
    state = snap.Snapshot(log_next_offset=8, sessions=[
        snap.SessionState("online", {"a": 1}, queue=[list(e) for e in queue], cursor=6,
                          held=[tuple(e) for e in held]),
        snap.SessionState("offline", {"a": 1}, queue=[list(e) for e in queue], cursor=6,
                          held=[tuple(e) for e in held], offline=[[6, None]], offline_ms=0)])
    broker.restore(state)
    online, offline = broker.sessions["online"], broker.sessions["offline"]
    assert [(ref.offset, qos) for ref, qos, _ in online.queue] == [(4, 1)]
    assert [(ref.offset, qos) for _, ref, qos, _ in online.cursor.held] == [(2, 1)]
    assert online.drops == {"restart_qos0": 3} and online.queued_qos0 == 0
    assert [(ref.offset, qos) for ref, qos, _ in offline.queue] == [(3, 0), (4, 1), (5, 0)]
    assert len(offline.cursor.held) == 2 and not offline.drops
    assert broker.queued_messages == 4
    log.close()


def test_done_offsets_past_the_log_end_are_forgotten_at_restore(tmp_path):
    """A power cut took the log's last records (offsets 10 and 11) after the snapshot said a
    session was sent the QoS 2 messages at 9, 10 and 11 (Cursor.done: not sent again). The
    new records that take offsets 10 and 11 are other messages: they were skipped. Now only
    the offsets the log still holds stay done."""
    import time

    from edgebroker.commitlog.format import LogOptions
    from edgebroker.commitlog.log import CommitLog

    log = CommitLog.open(str(tmp_path / "log"), LogOptions())
    for i in range(10):
        log.append(i, 2, False, b"c", b"a", b"%d" % i)
    log.write_pending()
    broker = Broker(config.Config(), time.monotonic, commit_log=log, wall_ms=lambda: 0)
    broker.restore(snap.Snapshot(log_next_offset=12, sessions=[
        snap.SessionState("s", {"a": 2}, cursor=8, done=[9, 10, 11], offline=[[5, None]])]))
    assert broker.sessions["s"].cursor.done == {9}
    again = snap.decode(snap.encode(broker.capture()))
    assert again.sessions[0].done == [9]
    log.close()
