"""The hand-over between reading the log and live routing, driven in-process with a real
commit log and fake transports: a subscriber falls behind, publishing goes on while it
catches up, and it receives every message once, in order, then is routed to again."""

import time

import pytest

import mqttraw as m
import mqttraw5 as R
from edgebroker import config
from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.log import CommitLog
from edgebroker.core.broker import Broker
from edgebroker.core.catchup import QUEUE_MESSAGES
from edgebroker.core.testing import FakeTransport


@pytest.fixture
def core(tmp_path):
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(segment_bytes=64 * 1024))
    broker = Broker(config.Config(), time.monotonic, commit_log=log,
                    wall_ms=lambda: time.time_ns() // 1_000_000)
    yield broker
    log.close()


def _connect(broker, client_id: str, clean: bool = True, max_pending: int = 1 << 20):
    transport = FakeTransport(client_id, max_pending=max_pending)
    client = transport.client = broker.connection_made(transport)
    client.data_received(m.connect(client_id, clean=clean))
    return client, transport


class Reader:
    """The subscriber's side: takes what the broker wrote, acknowledges QoS 1."""

    def __init__(self, client, transport):
        self.client, self.transport = client, transport
        self.got: list[int] = []

    def read(self, ack: bool = True) -> None:
        data = b"".join(bytes(x) for x in self.transport.out)
        assert not self.transport.files      # small payloads come from memory
        self.transport.flush()
        acks = []
        for p in m.split_frames(bytearray(data)):
            if p.type == m.PUBLISH:
                self.got.append(int(p.payload))
                if p.qos == 1:
                    acks.append(m.puback(p.packet_id))
        if ack and acks:
            self.client.data_received(b"".join(acks))


@pytest.mark.parametrize("qos", [0, 1])
def test_a_subscriber_behind_catches_up_while_publishing_goes_on(core, qos):
    sub, sub_t = _connect(core, "sub", max_pending=4096)
    sub.data_received(m.subscribe(1, [("t/#", 1)]))
    sub_t.flush()
    reader = Reader(sub, sub_t)
    pub, pub_t = _connect(core, "pub")
    sent = 0

    def publish(k: int) -> None:
        nonlocal sent
        pub.data_received(b"".join(m.publish(f"t/{i % 3}", b"%d" % i, qos=qos, packet_id=1
                                             if qos else None) for i in range(sent, sent + k)))
        core.end_pass()                      # the loop pass ends: QoS 1/2 is routed once written
        pub_t.flush()
        sent += k

    publish(QUEUE_MESSAGES * 4)              # more than the window, the queue and max_pending
    session = core.sessions["sub"]
    assert session.cursor is not None, "the subscriber should be reading from the log"
    assert len(session.queue) <= QUEUE_MESSAGES
    rounds = 0
    while (session.cursor is not None or len(reader.got) < sent) and rounds < 10_000:
        reader.read()
        if rounds % 2 == 0 and sent < 5000:
            publish(7)                       # live traffic during the catch-up
        core.end_pass()
        rounds += 1
    reader.read()
    assert session.cursor is None and core.behind == set()
    assert reader.got == list(range(sent)), "every message once, in order"
    # Routed live again.
    publish(1)
    reader.read()
    assert reader.got[-1] == sent - 1
    assert core.stats.sessions_fell_behind >= 1 and core.stats.sessions_caught_up >= 1
    assert sum(core.dropped.values()) == 0


def test_unsubscribed_filter_stops_matching_at_once_subscribed_one_from_its_offset(core):
    sub, sub_t = _connect(core, "sub", clean=False)
    sub.data_received(m.subscribe(1, [("a", 1), ("b", 1)]))
    sub.data_received(m.disconnect())
    pub, pub_t = _connect(core, "pub")
    n = 3000
    for i in range(n):
        pub.data_received(m.publish("a", b"%d" % i, qos=1, packet_id=1))
        pub.data_received(m.publish("b", b"%d" % (100_000 + i), qos=1, packet_id=1))
    pub.data_received(m.publish("c", b"999999", qos=1, packet_id=1))  # before subscribing
    core.end_pass()                          # the loop pass ends: the records are written
    back, back_t = _connect(core, "sub", clean=False)
    session = core.sessions["sub"]
    assert session.cursor is not None and session.cursor.offset < 2 * n  # one batch read
    # Drop "b", add "c"; publish to "c" after that.
    back.data_received(m.unsubscribe(2, ["b"]))
    back.data_received(m.subscribe(3, [("c", 1)]))
    pub.data_received(m.publish("c", b"200000", qos=1, packet_id=1))
    reader = Reader(back, back_t)
    for _ in range(1000):
        reader.read()
        core.end_pass()
        if session.cursor is None and not session.queue and not session.inflight:
            break
    got = reader.got
    assert [g for g in got if g < 100_000] == list(range(n))
    bs = [g - 100_000 for g in got if 100_000 <= g < 200_000]
    # Those read before the UNSUBSCRIBE still come; none after it.
    assert bs == list(range(len(bs))) and 0 < len(bs) < n
    assert got[-1] == 200_000 and 999_999 not in got
    assert session.cursor is None


def _frames(transport) -> list:
    data = bytearray(b"".join(bytes(x) for x in transport.out))
    assert not transport.files               # small payloads come from memory
    transport.flush()
    return m.split_frames(data)


def test_a_returning_session_drains_its_backlog_in_runs_at_the_granted_qos(core):
    """One subscription: the backlog is read as runs (core.catchup_run.Run) and sent as the window
    allows, QoS 2 records downgraded to the granted 1, QoS 0 published while the session was
    offline left out (queue_qos0_messages is off); each read's PUBACKs are handled together;
    the snapshot's cursor is the first record read and not yet sent."""
    sub, _ = _connect(core, "sub", clean=False)
    sub.data_received(m.subscribe(1, [("d/+", 1)]))
    sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    n = 3000
    for i in range(n):
        qos = (0, 1, 2)[i % 3]
        pub.data_received(m.publish(f"d/{i % 5}", b"%d" % i, qos=qos,
                                    packet_id=1 + i % 1000 if qos else None))
        pub.data_received(m.publish("other", b"x", qos=1, packet_id=1))   # not matched
        if qos == 2:
            pub.data_received(m.pubrel(1 + i % 1000))
    core.end_pass()
    back, back_t = _connect(core, "sub", clean=False)
    session = core.sessions["sub"]
    window = core.limits.max_inflight_messages
    got, rounds, largest = [], 0, 0
    while (session.cursor is not None or session.inflight) and rounds < 10_000:
        frames = [f for f in _frames(back_t) if f.type == m.PUBLISH]
        largest = max(largest, len(frames))
        if rounds == 3:
            cursor = session.cursor
            assert cursor.run is not None and cursor.run.i < cursor.run.n
            saved = [s for s in core.capture().sessions if s.client_id == "sub"][0]
            assert saved.cursor == cursor.run.offsets[cursor.run.i] < cursor.offset
        got += [(int(f.payload), f.qos, f.topic) for f in frames]
        if frames:
            back.data_received(b"".join(m.puback(f.packet_id) for f in frames))
        core.end_pass()
        rounds += 1
    want = [i for i in range(n) if i % 3]
    assert [g[0] for g in got] == want, "the QoS 1 and 2 messages, once each, in order"
    assert {g[1] for g in got} == {1} and all(g[2] == f"d/{g[0] % 5}" for g in got)
    assert largest == window, "the window filled, never overfilled"
    assert session.cursor is None and not session.inflight and session.inflight_bytes == 0
    assert core.stats.packets_received >= len(want)


def test_a_puback_for_a_qos2_message_among_others_closes_the_connection(core):
    sub, sub_t = _connect(core, "sub")
    sub.data_received(m.subscribe(1, [("q", 2)]))
    pub, _ = _connect(core, "pub")
    pub.data_received(m.publish("q", b"1", qos=1, packet_id=1))
    pub.data_received(m.publish("q", b"2", qos=2, packet_id=2))
    core.end_pass()
    frames = [f for f in _frames(sub_t) if f.type == m.PUBLISH]
    assert [f.qos for f in frames] == [1, 2]
    errors = core.stats.protocol_errors
    sub.data_received(b"".join(m.puback(f.packet_id) for f in frames))
    assert core.stats.protocol_errors == errors + 1 and sub_t.closing


def test_records_appended_not_yet_written_never_skip_a_session_behind(tmp_path):
    """Issue 22: the periodic cursor check may run in a pass whose records are appended and
    not yet written (the loop's timers run before its end_pass). An offline session behind at
    an empty log, and one behind older records than max_session_lag_age, must keep those
    records: no log_gap, every QoS 1 message delivered once the session is back."""
    wall = [1_700_000_000_000]
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(segment_bytes=64 * 1024))
    conf = config.from_dict({"limits": {"max_session_lag_age": 60.0}})
    core = Broker(conf, time.monotonic, commit_log=log, wall_ms=lambda: wall[0])
    try:
        for name in ("empty", "aged"):
            sub, _ = _connect(core, name, clean=False)
            sub.data_received(m.subscribe(1, [(f"{name}/#", 1)]))
            sub.data_received(m.disconnect())
        assert log.next_offset == 0 and all(core.sessions[n].cursor is not None
                                            for n in ("empty", "aged"))
        pub, _ = _connect(core, "pub")

        def publish(topic: str, start: int, end: int) -> None:
            pub.data_received(b"".join(m.publish(topic, b"%d" % i, qos=1, packet_id=1)
                                       for i in range(start, end)))

        def read_back(name: str) -> list[int]:
            back, back_t = _connect(core, name, clean=False)
            reader = Reader(back, back_t)
            for _ in range(20):
                reader.read()
                core.end_pass()
            return reader.got

        # 1. The log is empty; three records are appended, the check runs before the write.
        publish("empty/t", 0, 3)
        assert log.written_offset == 0 and log.next_offset == 3
        core.check_cursors(time.monotonic())
        core.end_pass()
        assert core.sessions["empty"].cursor.offset == 0
        assert core.dropped.get("log_gap", 0) == 0
        assert read_back("empty") == [0, 1, 2]
        # 2. Written records, all older than max_session_lag_age, then new ones appended and
        # checked before their write: the old ones go (a counted gap), the new ones stay.
        publish("aged/t", 3, 8)
        core.end_pass()
        wall[0] += 120_000
        publish("aged/t", 8, 11)
        assert log.written_offset == 8 and log.next_offset == 11
        core.check_cursors(time.monotonic())
        core.end_pass()
        assert core.sessions["aged"].cursor.offset == 8, "only the aged records are skipped"
        assert core.dropped.get("log_gap", 0) == 8      # offsets 0..7
        assert read_back("aged") == [8, 9, 10]
    finally:
        log.close()


def test_a_catch_up_that_sent_qos1_asks_the_loop_to_wait_for_acknowledgements(core):
    """``awaiting_acks`` (the loop's busy poll, server.loop.BusyPoll): set when a session
    catching up was sent QoS 1 messages, not for QoS 0 alone nor for live routing."""
    for name, qos in (("s1", 1), ("s0", 0)):
        sub, _ = _connect(core, name, clean=False)
        sub.data_received(m.subscribe(1, [(f"{name}/x", qos)]))
        sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    for i in range(100):
        pub.data_received(m.publish("s1/x", b"%d" % i, qos=1, packet_id=1 + i))
        pub.data_received(m.publish("s0/x", b"%d" % i, qos=1, packet_id=1 + i))
    core.end_pass()
    assert core.awaiting_acks is None, "nobody was sent anything"
    _connect(core, "s0", clean=False)
    assert core.sessions["s0"].cursor is None or core.sessions["s0"].cursor.run is None
    assert core.awaiting_acks is None, "QoS 0 needs no acknowledgement"
    back, back_t = _connect(core, "s1", clean=False)
    assert core.awaiting_acks is back_t
    core.awaiting_acks = None
    frames = [f for f in _frames(back_t) if f.type == m.PUBLISH]
    assert len(frames) == core.limits.max_inflight_messages
    back.data_received(b"".join(m.puback(f.packet_id) for f in frames))
    assert core.awaiting_acks is back_t, "the acknowledgements let the next ones out"


def test_a_window_of_a_run_is_written_in_pieces_each_sent_at_once(core):
    """core.catchup_run.WINDOW_PIECES: the window of 20 is written as three writes of 7, 7 and
    6 PUBLISHes, the first two sent at once (``send_now``) so the subscriber can start on
    them; acknowledging 7 lets one piece of 7 out, in order and without a gap."""
    sub, _ = _connect(core, "s", clean=False)
    sub.data_received(m.subscribe(1, [("s/x", 1)]))
    sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    for i in range(100):
        pub.data_received(m.publish("s/x", b"%d" % i, qos=1, packet_id=1 + i))
    core.end_pass()
    back, back_t = _connect(core, "s", clean=False)
    writes = [[p for p in m.split_frames(bytearray(bytes(x))) if p.type == m.PUBLISH]
              for x in back_t.out]
    pieces = [len(w) for w in writes if w]
    assert pieces == [7, 7, 6]
    assert back_t.sent_now == 2, "the last piece waits for the pass's flush"
    first = [p for w in writes for p in w]
    assert [int(p.payload) for p in first] == list(range(20))
    back_t.flush()
    back.data_received(b"".join(m.puback(p.packet_id) for p in first[:7]))
    more = [p for p in _frames(back_t) if p.type == m.PUBLISH]
    assert [int(p.payload) for p in more] == list(range(20, 27))
    assert back_t.sent_now == 2, "one piece fills the window: nothing sent early"


def test_a_window_from_the_queue_is_sent_in_pieces_too(core):
    """A session with two subscriptions catches up through its queue (a batch read from the
    log, not a run): Router.pump sends each third of the window at once as well."""
    sub, _ = _connect(core, "s", clean=False)
    sub.data_received(m.subscribe(1, [("s/x", 1), ("s/y", 1)]))
    sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    for i in range(100):
        pub.data_received(m.publish("s/x" if i % 2 else "s/y", b"%d" % i, qos=1,
                                    packet_id=1 + i))
    core.end_pass()
    back, back_t = _connect(core, "s", clean=False)
    assert back_t.sent_now == 2         # after 7 and after 14 of the window of 20
    first = [p for p in _frames(back_t) if p.type == m.PUBLISH]
    assert [int(p.payload) for p in first] == list(range(20))
    back.data_received(b"".join(m.puback(p.packet_id) for p in first[:7]))
    assert back_t.sent_now == 2, "one piece fills the window: nothing sent early"
    assert [int(p.payload) for p in _frames(back_t) if p.type == m.PUBLISH] == list(range(20, 27))


def test_pieces_count_qos_1_and_2_only_and_skip_what_an_offline_session_does_not_keep(core):
    """A run mixing QoS 0 records (published while the session was offline: not kept, as
    Mosquitto does by default) with QoS 1 ones: the skipped records are not sent and do not
    count in a piece, which still holds 7 QoS 1 messages, in order."""
    sub, _ = _connect(core, "s", clean=False)
    sub.data_received(m.subscribe(1, [("s/x", 1)]))
    sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    for i in range(100):
        pub.data_received(m.publish("s/x", b"%d" % i, qos=i % 2, packet_id=1 + i))
    core.end_pass()
    back, back_t = _connect(core, "s", clean=False)
    writes = [[p for p in m.split_frames(bytearray(bytes(x))) if p.type == m.PUBLISH]
              for x in back_t.out]
    assert [len(w) for w in writes if w] == [7, 7, 6]
    got = [p for w in writes for p in w]
    assert [int(p.payload) for p in got] == list(range(1, 40, 2))
    assert {p.qos for p in got} == {1}
    assert len({p.packet_id for p in got}) == 20


def test_an_unlogged_message_for_a_session_behind_is_dropped_as_not_logged(core):
    """A session behind loses nothing the log holds; a message the log does not hold ($SYS)
    that its full connection cannot take is dropped as ``not_logged`` (docs/limits.md), not
    as ``max_pending_write_bytes``."""
    sub, sub_t = _connect(core, "sub", max_pending=2000)
    sub.data_received(m.subscribe(1, [("t", 0), ("$SYS/x", 0)]))
    sub_t.flush()
    pub, _ = _connect(core, "pub")
    for i in range(50):
        pub.data_received(m.publish("t", b"%d" % i + b"." * 100, qos=0))
    assert core.sessions["sub"].cursor is not None       # behind: its output is full
    before = dict(core.dropped)
    core.route("$SYS/x", b"figures", 0, False)
    assert {k: n - before.get(k, 0) for k, n in core.dropped.items()
            if n != before.get(k, 0)} == {"not_logged": 1}


def test_no_local_holds_while_a_session_a_5_0_client_made_catches_up_over_3_1_1(core):
    """A session made by a 5.0 client with No Local on its one filter, resumed by a 3.1.1
    client: catching up, it is not sent its own messages (the run path, which leaves the
    decision to the scanner's filter, is not taken for it)."""
    t5 = FakeTransport("s")
    c5 = t5.client = core.connection_made(t5)
    c5.data_received(R.connect5("s", clean_start=True, props={R.SESSION_EXPIRY: 300}))
    c5.data_received(R.subscribe5(1, [("t", 1 | R.NO_LOCAL)]))
    c5.data_received(R.disconnect5())
    back, back_t = _connect(core, "s", clean=False)
    other, _ = _connect(core, "other")
    for i in range(600):                  # window and queue full: it reads the log
        other.data_received(m.publish("t", b"%d" % (1000 + i), qos=1, packet_id=1 + i))
    core.end_pass()
    assert core.sessions["s"].cursor is not None
    for i in range(5):                    # its own, read back from the log
        back.data_received(m.publish("t", b"%d" % i, qos=1, packet_id=1 + i))
    core.end_pass()
    reader = Reader(back, back_t)
    for _ in range(300):
        reader.read()
        core.end_pass()
    assert reader.got == list(range(1000, 1600))


def test_a_cursor_left_to_a_session_that_can_take_nothing_is_retired(core):
    """A session behind that unsubscribes from everything and goes offline keeps its cursor
    (as does one restored from an older snapshot): the next maintenance tick puts it in step,
    so it shows no lag and holds nothing; back and subscribing, it gets what follows."""
    sub, sub_t = _connect(core, "sub", clean=False, max_pending=4096)
    sub.data_received(m.subscribe(1, [("t/#", 0)]))
    pub, _ = _connect(core, "pub")
    for i in range(100):        # not read: past max_pending, it reads from the log
        pub.data_received(m.publish("t/x", b"%d" % i + b"." * 100))
        core.end_pass()
    session = core.sessions["sub"]
    assert session.cursor is not None and not session.queue and not session.inflight
    sub.data_received(m.unsubscribe(2, ["t/#"]))
    sub.data_received(m.disconnect())
    for i in range(100):
        pub.data_received(m.publish("t/x", b"more", qos=1, packet_id=1))
        core.end_pass()
    core.check_cursors(time.monotonic())
    assert session.cursor is None and not core.behind
    assert core.lag(session)["lag_records"] == 0
    back, back_t = _connect(core, "sub", clean=False)
    back.data_received(m.subscribe(3, [("t/#", 1)]))
    pub.data_received(m.publish("t/x", b"after", qos=1, packet_id=1))
    core.end_pass()
    got = [f.payload for f in _frames(back_t) if f.type == m.PUBLISH]
    assert got == [b"after"]


def test_an_offline_session_that_can_take_nothing_holds_no_segment(tmp_path):
    """A persistent session subscribed to nothing (a device that only publishes), or only to
    shared subscriptions (their groups read their own backlogs), can be sent nothing from
    the log. Offline, it has no cursor (it stays in step): it holds no segment from age
    retention, and a disk-limit deletion is no gap to it. A session with a subscription
    keeps both."""
    wall = [1_700_000_000_000]
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(
        segment_bytes=4096, retention_bytes=3 * 4096, retention_ms=1000))
    core = Broker(config.Config(), time.monotonic, commit_log=log, wall_ms=lambda: wall[0])
    try:
        for name, filters in (("dev", []), ("grp", ["$share/g/t/#"]), ("sub", ["t/#"])):
            client, _ = _connect(core, name, clean=False)
            if filters:
                client.data_received(m.subscribe(1, [(f, 1) for f in filters]))
            client.data_received(m.disconnect())
        pub, _ = _connect(core, "pub")
        for i in range(3):
            pub.data_received(m.publish("t/x", b"%d" % i, qos=1, packet_id=1))
        core.end_pass()
        wall[0] += 5000     # the three records are past retention_ms
        pub.data_received(m.publish("t/x", b"3", qos=1, packet_id=1))
        core.end_pass()
        core.check_cursors(time.monotonic())
        cursors = {n: core.sessions[n].cursor for n in ("dev", "grp", "sub")}
        assert cursors["dev"] is None and cursors["grp"] is None
        assert core.behind == {core.sessions["sub"]}
        assert cursors["sub"].offset == 0 and log.hold_offset == 0, "sub still needs them"
        # The disk limit deletes segments under every cursor: a gap for "sub" alone.
        for i in range(4, 40):
            pub.data_received(m.publish("t/x", b"%d" % i + b"." * 1000, qos=1, packet_id=1))
            core.end_pass()
        first = log.first_offset
        assert first > 4
        core.check_cursors(time.monotonic())
        assert core.dropped["log_gap"] == first, "records 0..first-1 lost to 'sub' only"
        assert core.sessions["dev"].cursor is None and core.sessions["grp"].cursor is None
        assert cursors["sub"].offset == first
        # Back and subscribing, the device is sent what comes from then on.
        back, back_t = _connect(core, "dev", clean=False)
        back.data_received(m.subscribe(2, [("t/#", 1)]))
        pub.data_received(m.publish("t/x", b"after", qos=1, packet_id=1))
        core.end_pass()
        got = [f.payload for f in _frames(back_t) if f.type == m.PUBLISH]
        assert got == [b"after"]
    finally:
        log.close()


def test_the_lag_counts_records_read_into_the_queue_and_not_sent_as_not_read(core):
    """A session with two filters (or a 5.0 client's) catches up through batches read into
    its queue, not runs: its cursor and lag figures (inspect sessions, metrics) start at the
    first record it has not been sent, not past the batch read ahead."""
    from edgebroker.core.metrics import _max_lag
    sub, _ = _connect(core, "two", clean=False)
    sub.data_received(m.subscribe(1, [("a/#", 1), ("b/#", 1)]))
    sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    pub.data_received(b"".join(m.publish("a/x", b"%d" % i, qos=1, packet_id=1)
                               for i in range(3000)))
    core.end_pass()
    back, back_t = _connect(core, "two", clean=False)
    core.end_pass()
    session = core.sessions["two"]
    window = core.limits.max_inflight_messages
    assert len([f for f in _frames(back_t) if f.type == m.PUBLISH]) == window
    assert session.cursor is not None and session.cursor.run is None and session.queue
    assert session.cursor.offset > window, "a batch was read ahead into the queue"
    lag = core.lag(session)
    assert (lag["cursor"], lag["lag_records"]) == (window, 3000 - window)
    assert _max_lag(core) == 3000 - window


def test_a_takeover_leaves_no_empty_offline_range(core):
    """A takeover closes the old connection (the session goes offline) and the new one brings
    it back at the same log offset: no range of records was missed, so none is kept (eight
    such ranges used to push out the real ones, whose QoS 0 was then sent after all)."""
    sub, _ = _connect(core, "s", clean=False)
    sub.data_received(m.subscribe(1, [("t/#", 1)]))
    sub.data_received(m.disconnect())
    pub, _ = _connect(core, "pub")
    pub.data_received(b"".join(m.publish("t/x", b"%d" % i, qos=1, packet_id=1)
                               for i in range(2000)))
    core.end_pass()
    for _ in range(10):     # takeovers, nothing published meanwhile, nothing acknowledged
        _connect(core, "s", clean=False)
        core.end_pass()
    cursor = core.sessions["s"].cursor
    assert cursor is not None, "still behind: it acknowledged nothing"
    assert cursor.offline == [[0, 2000]], cursor.offline


def test_the_lag_counts_what_was_queued_before_the_session_fell_behind(core):
    """Live routing queued messages the window could not take; past QUEUE_MESSAGES the session
    fell behind with its cursor after them: its figures start at the first queued one."""
    from edgebroker.core.metrics import _max_lag
    sub, sub_t = _connect(core, "live")
    sub.data_received(m.subscribe(1, [("a/#", 1)]))
    pub, _ = _connect(core, "pub")
    n = 1500
    pub.data_received(b"".join(m.publish("a/x", b"%d" % i, qos=1, packet_id=1)
                               for i in range(n)))
    core.end_pass()
    session = core.sessions["live"]
    window = core.limits.max_inflight_messages
    assert len([f for f in _frames(sub_t) if f.type == m.PUBLISH]) == window
    assert session.cursor is not None and session.cursor.offset > window
    lag = core.lag(session)
    assert (lag["cursor"], lag["lag_records"]) == (window, n - window)
    assert _max_lag(core) == n - window
