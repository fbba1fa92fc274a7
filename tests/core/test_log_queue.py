"""The log is the queue (core.catchup, docs/persistence.md): a subscriber that falls behind, or
is offline, reads from the commit log at its cursor. Nothing acknowledged is dropped at the
default configuration, memory stays flat, and the hand-over back to live routing has no gap
and no duplicate."""

import os
import re
import signal
import threading
import time

import psutil
import pytest

import mqttraw as m
from conftest import wait_for_snapshot
from loadclients import BulkSubscriber, run_publishers, tagged, untag, window_publisher


def _peak_rss(proc, stop: threading.Event, out: list) -> None:
    ps = psutil.Process(proc.pid)
    while not stop.wait(0.1):
        try:
            out.append(ps.memory_info().rss)
        except psutil.Error:
            return


def test_burst_qos1_to_one_subscriber_all_delivered_none_twice_memory_flat(broker, uid):
    """Four publishers, window 100 each, send 1,000,000 QoS 1 messages of 64 bytes to one QoS 1
    subscriber at the default configuration: every acknowledged message is delivered, none
    twice, and the broker's RSS stays under 64 MB."""
    publishers, each = 4, int(os.environ.get("EDGEBROKER_BURST_EACH", 250_000))
    total = publishers * each
    b = broker()
    sub = BulkSubscriber(b.host, b.port, f"{uid}-sub")
    assert sub.subscribe((f"{uid}/burst", 1)) == [1]
    seen = bytearray(total)
    dups = []

    def got(topic, payload, qos, retain, dup):
        k, i = untag(payload)
        index = k * each + i
        if seen[index]:
            dups.append(index)
        seen[index] = 1

    deadline = time.monotonic() + 300
    rss, stop = [], threading.Event()
    sampler = threading.Thread(target=_peak_rss, args=(b.proc, stop, rss))
    sampler.start()
    reader = threading.Thread(target=sub.run, args=(got, lambda: sub.count >= total, deadline))
    reader.start()
    try:
        acked = run_publishers(b.host, b.port, f"{uid}-pub", f"{uid}/burst", publishers, each,
                               64, 100, deadline)
        reader.join(max(0.0, deadline - time.monotonic()) + 5)
    finally:
        stop.set()
        sampler.join()
    assert acked == [each] * publishers
    assert sub.count == total and not dups, (sub.count, dups[:10])
    assert all(seen)
    assert max(rss) < 64 * 2 ** 20, f"peak RSS {max(rss) / 2 ** 20:.1f} MB"
    stats = b.stats()
    assert all(v == 0 for v in stats["dropped"].values()), stats["dropped"]
    assert stats["counters"]["sessions_fell_behind"] >= 1
    sub.close()


def test_offline_for_500k_messages_then_all_in_order_and_live_without_a_gap(broker, uid):
    """A persistent subscriber offline while 500,000 messages arrive gets all of them in
    order when it comes back, while a publisher goes on publishing; the live stream follows
    without a gap or a duplicate."""
    n = int(os.environ.get("EDGEBROKER_BACKLOG", 500_000))
    b = broker()
    sub = BulkSubscriber(b.host, b.port, f"{uid}-sub", clean=False)
    sub.subscribe((f"{uid}/t", 1))
    sub.close()
    deadline = time.monotonic() + 300
    assert window_publisher(b.host, b.port, f"{uid}-pub", f"{uid}/t",
                            (tagged(0, i, 64) for i in range(n)), deadline=deadline) == n
    rss_offline = psutil.Process(b.proc.pid).memory_info().rss
    more = 20_000
    received = []
    back = BulkSubscriber(b.host, b.port, f"{uid}-sub", clean=False)
    assert back.session_present
    reader = threading.Thread(target=back.run, args=(
        lambda t, p, q, r, d: received.append(untag(p)[1]),
        lambda: back.count >= n + more, deadline))
    reader.start()
    # Publishing goes on during the catch-up: these follow the backlog.
    assert window_publisher(b.host, b.port, f"{uid}-pub", f"{uid}/t",
                            (tagged(0, n + i, 64) for i in range(more)), deadline=deadline) == more
    reader.join(max(0.0, deadline - time.monotonic()) + 5)
    assert len(received) == n + more, len(received)
    assert received == list(range(n + more))
    stats = b.stats()
    assert stats["sessions_behind"] == 0
    assert stats["counters"]["sessions_caught_up"] >= 1
    # The backlog cost no memory while offline.
    assert rss_offline < 64 * 2 ** 20
    back.close()


def test_overlapping_wildcards_deliver_once_at_the_highest_qos(broker, uid):
    """Read from the log, a message matching several of a session's filters comes once, at
    the highest QoS granted among them (capped by its own QoS), as live routing does."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe((f"{uid}/a/#", 1), (f"{uid}/a/b", 2), (f"{uid}/+/b", 0))
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/a/b", b"q2", qos=2)      # matches all three: QoS 2
    pub.publish(f"{uid}/a/c", b"q2-to-1", qos=2)  # only a/#: QoS 1
    pub.publish(f"{uid}/x/b", b"q1-to-0", qos=1)  # only +/b: QoS 0 while offline: not kept
    pub.publish(f"{uid}/a/b", b"q0", qos=0)      # QoS 0 published while offline: not kept
    pub.publish(f"{uid}/a/b", b"q1", qos=1)
    again = b.client(f"{uid}-s", clean=False)
    got = [again.recv_publish() for _ in range(3)]
    assert [(p.payload, p.qos) for p in got] == [(b"q2", 2), (b"q2-to-1", 1), (b"q1", 1)]
    assert not any(p.retain for p in got)
    assert again.ping() == []


@pytest.mark.parametrize("change", ["resubscribe", "unsubscribe_overlap"])
def test_qos1_from_an_offline_spell_comes_after_the_subscription_is_lowered(broker, uid,
                                                                           change):
    """A persistent session misses 3,000 QoS 1 messages while offline, comes back and lowers
    its subscription to QoS 0 (SUBSCRIBE again, MQTT-3.8.4-3: the flow of publications must
    not be interrupted), or leaves the QoS 1 filter of two overlapping ones. Every message
    comes (those past the first chunk read were once skipped as "QoS 0 published while
    offline", uncounted): SUBSCRIBE again, at QoS 1 still (published before it); leaving the
    filter, at QoS 0 from some point on."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    if change == "resubscribe":
        sub.subscribe((f"{uid}/t/a", 1))
    else:
        sub.subscribe((f"{uid}/t/a", 0), (f"{uid}/t/#", 1))
    sub.disconnect()
    n = 3000
    deadline = time.monotonic() + 120
    assert window_publisher(b.host, b.port, f"{uid}-p", f"{uid}/t/a",
                            (tagged(0, i, 16) for i in range(n)), deadline=deadline) == n
    back = BulkSubscriber(b.host, b.port, f"{uid}-s", clean=False)
    assert back.session_present
    # (Sent without waiting for the answer: the backlog is coming already; run reads past it.)
    back.sock.sendall(m.subscribe(1, [(f"{uid}/t/a", 0)]) if change == "resubscribe"
                      else m.unsubscribe(1, [f"{uid}/t/#"]))
    got, qos = [], set()
    back.run(lambda t, p, q, r, d: (got.append(untag(p)[1]), qos.add(q)),
             lambda: back.count >= n, min(deadline, time.monotonic() + 30))
    assert got == list(range(n)), f"{len(got)} of {n}"
    assert qos == {1} if change == "resubscribe" else 0 in qos
    assert b.client_row(f"{uid}-s")["dropped"] == 0
    back.close()


@pytest.mark.parametrize("filters", [1, 2])
def test_an_offline_qos0_subscription_gets_nothing_published_meanwhile_as_mosquitto(
        broker, mosquitto_broker, uid, filters):
    """queue_qos0_messages off (the default): a persistent session is not given what it would
    take at QoS 0 of what was published while it was offline, QoS 1 and 2 messages to a QoS 0
    subscription included (one filter: the log is read as a run; two: record by record), as
    Mosquitto does; what comes once it is back reaches it at QoS 0. Nothing counts as dropped:
    nothing was kept for it."""
    def scenario(host, port) -> list:
        def client(client_id, clean=True):
            c = m.RawClient(host, port)
            assert c.connect(client_id, clean=clean).rc == 0
            return c
        sub = client(f"{uid}-s", clean=False)
        sub.subscribe(*[(f"{uid}/t", 0), (f"{uid}/+", 0)][:filters])
        sub.send(m.disconnect())
        assert sub.expect_closed()      # offline from here on
        sub.close()
        pub = client(f"{uid}-p")
        for qos in (0, 1, 2):
            pub.publish(f"{uid}/t", b"offline-%d" % qos, qos=qos)
        back = client(f"{uid}-s", clean=False)
        pub.publish(f"{uid}/t", b"back", qos=1)
        got = [(p.payload, p.qos) for p in back.ping() if p.type == m.PUBLISH]
        back.disconnect()
        pub.disconnect()
        return got

    b = broker()
    assert scenario(b.host, b.port) == [(b"back", 0)]
    assert not any(b.stats()["dropped"].values())
    mosquitto = mosquitto_broker()
    assert scenario(mosquitto.host, mosquitto.port) == [(b"back", 0)]


def test_offline_qos0_kept_with_queue_qos0_messages(broker, uid):
    b = broker(limits={"queue_qos0_messages": True})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/t", b"%d" % i, qos=i % 2)
    again = b.client(f"{uid}-s", clean=False)
    got = [again.recv_publish() for _ in range(5)]
    assert [(p.payload, p.qos) for p in got] == [(b"%d" % i, i % 2) for i in range(5)]


def test_a_subscriber_behind_gets_retained_then_only_newer_messages_of_a_new_filter(broker, uid):
    """A session that subscribes while behind gets the retained message of the new filter
    (retain set) and, from the log, only what was published after the subscription."""
    b = broker(limits={"max_inflight_messages": 1})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/old", qos=1)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/new", b"retained", qos=1, retain=True)
    pub.publish(f"{uid}/new", b"before the subscription", qos=1)
    # Behind: the window is 1 and it does not acknowledge; 300 fill the small queue.
    for i in range(300):
        pub.publish(f"{uid}/old", b"%d" % i, qos=1)
    assert b.stats()["sessions_behind"] == 1
    sub.send(m.subscribe(9, [(f"{uid}/new", 1)]))
    pub.publish(f"{uid}/new", b"after the subscription", qos=1)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 302 and time.monotonic() < deadline:
        p = sub.recv_packet(timeout=10)
        if p.type == m.PUBLISH:
            got.append((p.topic, p.payload, p.retain))
            sub.ack(p)
    olds = [int(p) for t, p, _ in got if t == f"{uid}/old"]
    news = [(p, r) for t, p, r in got if t == f"{uid}/new"]
    assert olds == list(range(300))
    assert news == [(b"retained", True), (b"after the subscription", False)]


def test_an_online_subscriber_behind_skips_qos0_past_max_lag_bytes(broker, uid):
    """QoS 0 for a subscriber that reads but is far behind is skipped past max_lag_bytes
    (counted as max_lag, logged once for the episode); QoS 1 is never skipped."""
    # A window of 1 that it does not acknowledge yet: it falls behind once its small queue
    # of QoS 1 is full, and reads the rest (QoS 0 too) from the log.
    b = broker(limits={"max_lag_bytes": 20_000, "max_inflight_messages": 1})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    pub = b.client(f"{uid}-p")
    mark = b.mark()
    n = 6000
    pub.send(b"".join(m.publish(f"{uid}/t", b"%04d" % i + b"." * 100, qos=1 if i % 10 == 0 else 0,
                                packet_id=i // 10 % 65535 + 1 if i % 10 == 0 else None)
                      for i in range(n)))
    pub.ping(timeout=20)                         # the broker has routed them all
    got = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            p = sub.recv_publish(timeout=2)
        except (AssertionError, TimeoutError):
            break
        got.append((int(p.payload[:4]), p.qos))
    qos1 = [i for i, q in got if q == 1]
    qos0 = [i for i, q in got if q == 0]
    assert qos1 == list(range(0, n, 10))
    assert qos0 == sorted(qos0)    # in order per QoS (a QoS 0 may pass a QoS 1 that waits)
    stats = b.stats()
    skipped = n - len(got)
    assert skipped > 0 and stats["dropped"]["max_lag"] == skipped
    assert stats["limit_hits"]["max_lag_bytes"] > 0
    lines = [ln for ln in b.logs[mark:] if "behind the head of the log" in ln]
    assert 1 <= len(lines) <= stats["counters"]["sessions_fell_behind"], lines
    assert f"{uid}-s" in lines[0] and "max_lag_bytes" in lines[0]


def test_retention_forced_under_a_cursor_reports_the_gap_and_delivery_goes_on(broker, uid):
    """The disk limit deletes segments an offline session still needs: its cursor moves to
    the oldest record kept, the gap is counted for the session and logged with the offsets
    lost, and it gets everything from there on."""
    b = broker(log={"segment_bytes": 4096, "retention_bytes": 16384})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    mark = b.mark()
    pub = b.client(f"{uid}-p")
    n = 600                                      # about 90 KB: most of it goes
    for i in range(n):
        pub.publish(f"{uid}/t", b"%04d" % i + b"." * 100, qos=1)
    line = b.wait_log(lambda ln: "are lost to it" in ln and f"{uid}-s" in ln, timeout=10,
                      start=mark)
    assert line and "log records 0 to " in line and "retention_bytes" in line, line
    first_kept = int(line.split("goes on from ")[1].split()[0])
    again = b.client(f"{uid}-s", clean=False)
    got = []
    while True:
        try:
            got.append(int(again.recv_publish(timeout=2).payload[:4]))
        except (AssertionError, TimeoutError):
            break
    assert got and got == list(range(got[0], n)) and got[0] >= first_kept - 1, got[:5]
    row = b.client_row(f"{uid}-s")
    assert row["drops"]["log_gap"] >= first_kept - 1
    assert b.stats()["dropped"]["log_gap"] == row["drops"]["log_gap"]
    pub.publish(f"{uid}/t", b"live", qos=1)
    assert again.recv_publish().payload == b"live"


def test_age_retention_frees_what_a_session_behind_has_read_and_had_acknowledged(broker, uid):
    """A session that is still behind holds from age retention only what it still needs
    (its cursor, its window): the segments it has read past and had acknowledged go."""
    b = broker(log={"segment_bytes": 4096, "segment_ms": 1000, "retention_ms": 1000})
    log_dir = os.path.join(b.config["data_dir"], "log")

    def segments():
        return sorted(n for n in os.listdir(log_dir) if n.endswith(".seg"))

    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    n = 1000
    pub.send(b"".join(m.publish(f"{uid}/t", b"%04d" % i + b"." * 100, qos=1,
                                packet_id=1 + i) for i in range(n)))
    pub.ping(timeout=20)
    before = segments()
    # Back: it reads and acknowledges 900, then stops acknowledging (so it stays behind).
    again = b.client(f"{uid}-s", clean=False)
    got = [int(again.recv_publish(timeout=5, ack=True).payload[:4]) for _ in range(900)]
    assert got == list(range(900))
    deadline = time.monotonic() + 20
    while len(segments()) >= len(before) // 2:
        assert time.monotonic() < deadline, (len(before), segments())
        time.sleep(0.1)
    assert b.client_row(f"{uid}-s")["cursor"] is not None       # still behind
    # What it still needs was kept: the rest comes, once it acknowledges again.
    rest = []
    while len(rest) < n - 900:
        rest.append(int(again.recv_publish(timeout=5, ack=True).payload[:4]))
    assert rest == list(range(900, n))


def test_age_retention_right_after_a_restart_keeps_what_a_restored_session_needs(broker, uid):
    """The first publish after a restart rolls the tail segment by age, and the roll applies
    age retention: at that moment the cursors restored from the snapshot hold their segments
    already (they were deleted when the hold waited for the broker's first maintenance)."""
    opts = {"segment_bytes": 4096, "segment_ms": 1000, "retention_ms": 1000}
    b = broker(log=opts)
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    n = 100                                      # about 5 segments
    for i in range(n):
        pub.publish(f"{uid}/t", b"%04d" % i + b"." * 200, qos=1)
    b.stop()
    time.sleep(1.2)                              # every record is now past retention_ms
    b2 = broker(data_dir=data_dir, log=opts)
    mark = b2.mark()
    b2.client(f"{uid}-p").publish(f"{uid}/other", b"rolls the tail", qos=1)
    again = b2.client(f"{uid}-s", clean=False)
    got = [int(again.recv_publish(timeout=5, ack=True).payload[:4]) for _ in range(n)]
    assert got == list(range(n))
    assert not [ln for ln in b2.logs[mark:] if "lost to it" in ln]
    assert b2.client_row(f"{uid}-s")["drops"] == {}


def test_age_retention_holds_what_a_connected_sessions_window_goes_back_to(broker, uid):
    """A connected session in step (not behind) that does not acknowledge keeps its window
    and queue in memory, but only their offsets once it goes offline: age retention deleted
    their records meanwhile, and the reconnecting client got none of the 30 again."""
    b = broker(log={"segment_bytes": 4096, "segment_ms": 1000, "retention_ms": 1000})
    log_dir = os.path.join(b.config["data_dir"], "log")
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t/#", qos=1)
    pub = b.client(f"{uid}-p")
    for i in range(30):
        pub.publish(f"{uid}/t/x", b"M%02d" % i, qos=1)
    first = [sub.recv_publish(timeout=5, ack=False).payload for _ in range(20)]  # its window
    assert first == [b"M%02d" % i for i in range(20)]
    first_segment = min(n for n in os.listdir(log_dir) if n.endswith(".seg"))
    deadline = time.monotonic() + 4            # segments roll and age past retention_ms
    i = 0
    while time.monotonic() < deadline:
        pub.publish(f"{uid}/other", b"filler %d" % i, qos=1)
        i += 1
        time.sleep(0.2)
        sub.ping()
    assert first_segment in os.listdir(log_dir)
    sub.abort()
    again = b.client(f"{uid}-s", clean=False)
    got = [again.recv_publish(timeout=5, ack=True) for _ in range(30)]
    assert [p.payload for p in got] == [b"M%02d" % i for i in range(30)]
    assert [p.dup for p in got] == [True] * 20 + [False] * 10
    assert b.client_row(f"{uid}-s")["drops"] == {}


def test_max_session_lag_age_moves_an_old_cursor_forward(broker, uid):
    b = broker(limits={"max_session_lag_age": 1.0})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    mark = b.mark()
    b.client(f"{uid}-p").publish(f"{uid}/t", b"too old", qos=1)
    line = b.wait_log(lambda ln: "max_session_lag_age" in ln and f"{uid}-s" in ln, timeout=10,
                      start=mark)
    assert line and "log records 0 to 0 are lost" in line, line
    again = b.client(f"{uid}-s", clean=False)
    assert again.ping() == []
    assert b.client_row(f"{uid}-s")["drops"] == {"log_gap": 1}
    b.client(f"{uid}-p").publish(f"{uid}/t", b"fresh", qos=1)
    assert again.recv_publish().payload == b"fresh"


def test_max_session_lag_age_logs_once_per_episode(broker, uid):
    """An offline session's cursor is moved every second while messages keep coming: each
    move wrote a warning (per offline session, per second, for as long as it stays away).
    The first move is logged, the next ones counted; the number is logged when it catches
    up."""
    b = broker(limits={"max_session_lag_age": 1.0})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    mark = b.mark()
    pub = b.client(f"{uid}-p")
    for i in range(16):                         # 4 s: the cursor is moved several times
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
        time.sleep(0.25)
    lines = [ln for ln in b.logs[mark:] if f"{uid}-s" in ln and "lost to it" in ln]
    assert len(lines) == 1 and "the next moves are counted" in lines[0], lines
    again = b.client(f"{uid}-s", clean=False)
    got = [int(p.payload) for p in again.ping() if p.type == m.PUBLISH]
    gap = b.client_row(f"{uid}-s")["drops"]["log_gap"]
    assert gap >= 8 and got == list(range(gap, 16)), (gap, got)
    first = int(re.search(r"log records \d+ to (\d+) are lost", lines[0]).group(1)) + 1
    line = b.wait_log("caught up with the log;", start=mark)
    assert line and f"session '{uid}-s' caught up with the log; {gap - first} more records" \
        in line, line


@pytest.mark.parametrize("qos", [1, 2])
def test_sigkill_during_a_catch_up_then_restart_delivers_the_rest(broker, uid, qos):
    """The broker is killed while a returning session works through its backlog: after the
    restart the session gets every message it had not received, in order: QoS 1 at least
    once (what was sent after the last snapshot is sent again), QoS 2 exactly once (its
    exchanges are journaled: the subscriber, keeping the ids it holds as a client keeps its
    session, never gets a message twice)."""
    n = 20_000
    b = broker(limits={"max_inflight_messages": 10})
    data_dir = b.config["data_dir"]
    held = set() if qos == 2 else None         # the subscriber's QoS 2 ids awaiting PUBREL
    sub = BulkSubscriber(b.host, b.port, f"{uid}-s", clean=False)
    sub.subscribe((f"{uid}/t", qos))
    sub.close()
    deadline = time.monotonic() + 120
    assert window_publisher(b.host, b.port, f"{uid}-p", f"{uid}/t",
                            (tagged(0, i, 64) for i in range(n)), deadline=deadline,
                            qos=qos) == n
    first = []
    back = BulkSubscriber(b.host, b.port, f"{uid}-s", clean=False, qos2_ids=held)
    back.run(lambda t, p, q, r, d: first.append(untag(p)[1]), lambda: back.count >= n // 3,
             deadline)
    # A snapshot taken during the catch-up (the cursor moves it); then more is delivered and
    # acknowledged (snapshots follow at most once a second: the crash comes before the next
    # one covers all of it), then the crash.
    wait_for_snapshot(data_dir, f"{uid}-s", timeout=10,
                      pred=lambda s: s["cursor"] is not None and s["cursor"] >= n // 3)
    back.run(lambda t, p, q, r, d: first.append(untag(p)[1]), lambda: back.count >= 2 * n // 3,
             deadline)
    b.stop(signal.SIGKILL)
    back.abort()
    b2 = broker(data_dir=data_dir, limits={"max_inflight_messages": 10})
    second = []
    again = BulkSubscriber(b2.host, b2.port, f"{uid}-s", clean=False, qos2_ids=held)
    assert again.session_present
    again.run(lambda t, p, q, r, d: second.append(untag(p)[1]),
              lambda: set(first) | set(second) >= set(range(n)), deadline)
    assert set(first) | set(second) == set(range(n))
    # In order after the restart (the window re-sent first, then the log from the cursor).
    assert second == sorted(second) and len(second) == len(set(second))
    if qos == 2:
        twice = sorted(set(first) & set(second))
        assert not twice, f"{len(twice)} QoS 2 messages delivered twice, from {twice[:5]}"
        assert len(first) + len(second) == n
    again.close()
