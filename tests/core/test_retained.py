"""Retained messages: store, replace, clear, flags on subscribe vs live delivery (3.3.1.3)."""

import signal
import time

import pytest

from conftest import _open_clients, wait_for_snapshot
from mqttraw import PUBLISH, SUBACK
import mqttraw as m
import mqttraw5 as R


def subscribe_raw(c, *topics, qos=0):
    """SUBSCRIBE and return the packets up to and including the SUBACK, which must come first."""
    pid = c.next_pid()
    c.send(m.subscribe(pid, [(t, qos) for t in topics]))
    first = c.recv_packet()
    assert first.type == SUBACK and first.packet_id == pid, f"SUBACK must come first, got {first!r}"
    return first


def marker(sub, pub, topic):
    pub.publish(topic, b"MARKER", qos=1)
    p = sub.recv_publish()
    assert (p.topic, p.payload, p.retain) == (topic, b"MARKER", False), f"unexpected {p!r}"


def test_retained_delivered_on_subscribe_with_retain_flag_after_suback(srv, uid):
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"kept", qos=1, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, f"{uid}/marker", qos=1)
    p = sub.recv_publish()
    assert (p.topic, p.payload, p.retain) == (t, b"kept", True)
    marker(sub, pub, f"{uid}/marker")


def test_live_delivery_has_retain_flag_clear(srv, uid):
    """3.3.1.3 [MQTT-3.3.1-9]: retain 0 when sent because of an established subscription."""
    t = f"{uid}/r"
    sub = srv.client(f"{uid}-s")
    sub.subscribe(t, qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"live", qos=1, retain=True)
    p = sub.recv_publish()
    assert (p.payload, p.retain) == (b"live", False)


def test_retained_replaced(srv, uid):
    """[MQTT-3.3.1-5]: a new retained message replaces the old one."""
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    for v in (b"v1", b"v2", b"v3"):
        pub.publish(t, v, qos=1, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, f"{uid}/marker", qos=1)
    p = sub.recv_publish()
    assert (p.payload, p.retain) == (b"v3", True)
    marker(sub, pub, f"{uid}/marker")


def test_retained_cleared_by_empty_payload(srv, uid):
    """[MQTT-3.3.1-10, -11]: zero-byte retained payload removes it; not stored itself."""
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"soon gone", qos=1, retain=True)
    pub.publish(t, b"", qos=1, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, f"{uid}/marker", qos=1)
    marker(sub, pub, f"{uid}/marker")


def test_empty_retained_publish_delivered_to_existing_subscribers(srv, uid):
    """3.3.1.3: the zero-byte retained PUBLISH is processed as normal and sent to subscribers."""
    t = f"{uid}/r"
    sub = srv.client(f"{uid}-s")
    sub.subscribe(t, qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"", qos=1, retain=True)
    p = sub.recv_publish()
    assert (p.topic, p.payload, p.retain) == (t, b"", False)


def test_non_retained_publish_does_not_replace_retained(srv, uid):
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"retained", qos=1, retain=True)
    pub.publish(t, b"plain", qos=1, retain=False)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, f"{uid}/marker", qos=1)
    assert sub.recv_publish().payload == b"retained"
    marker(sub, pub, f"{uid}/marker")


def test_retained_qos0_publish_is_stored(srv, uid):
    """[MQTT-3.3.1-7]: a retained QoS 0 message replaces any retained message for the topic."""
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"old", qos=1, retain=True)
    pub.publish(t, b"q0", qos=0, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, qos=1)
    p = sub.recv_publish()
    assert (p.payload, p.retain, p.qos) == (b"q0", True, 0)


def test_retained_qos_is_min_of_stored_and_granted(srv, uid):
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/q2", b"two", qos=2, retain=True)
    pub.publish(f"{uid}/q1", b"one", qos=1, retain=True)
    for granted, expected in ((0, {"q2": 0, "q1": 0}), (1, {"q2": 1, "q1": 1}), (2, {"q2": 2, "q1": 1})):
        sub = srv.client(f"{uid}-s{granted}")
        subscribe_raw(sub, f"{uid}/+", qos=granted)
        got = {}
        for _ in range(2):
            p = sub.recv_publish()
            assert p.retain
            got[p.topic.rsplit("/", 1)[1]] = p.qos
        assert got == expected, (granted, got)


def test_retained_matched_by_wildcards(srv, uid):
    pub = srv.client(f"{uid}-p")
    topics = [f"{uid}/a", f"{uid}/a/b", f"{uid}/a/b/c", f"{uid}/x/b"]
    for t in topics:
        pub.publish(t, t, qos=1, retain=True)
    for flt, expected in ((f"{uid}/#", set(topics)), (f"{uid}/+/b", {f"{uid}/a/b", f"{uid}/x/b"}),
                          (f"{uid}/a/#", set(topics[:3]))):
        sub = srv.client(f"{uid}-s")
        subscribe_raw(sub, flt, f"{uid}/marker", qos=1)
        got = set()
        for _ in expected:
            p = sub.recv_publish()
            assert p.retain and p.payload == p.topic.encode()
            got.add(p.topic)
        assert got == expected
        marker(sub, pub, f"{uid}/marker")
        sub.disconnect()


def test_resubscribe_resends_retained(srv, uid):
    """3.8.4 [MQTT-3.8.4-3]: re-subscribing re-sends the retained messages."""
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"again", qos=1, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, qos=1)
    assert sub.recv_publish().payload == b"again"
    subscribe_raw(sub, t, qos=0)
    p = sub.recv_publish()
    assert (p.payload, p.retain, p.qos) == (b"again", True, 0)


def test_retained_dollar_topic_not_sent_to_leading_wildcard(broker, uid):
    srv = broker()  # a fresh broker: '#' must see no other retained messages
    d = f"${uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(d, b"dollar", qos=1, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, "#", "+/r", qos=1)
    marker(sub, pub, f"{uid}/marker")
    sub2 = srv.client(f"{uid}-s2")
    subscribe_raw(sub2, f"${uid}/#", qos=1)
    assert sub2.recv_publish().payload == b"dollar"


def test_retained_then_live_order(srv, uid):
    t = f"{uid}/r"
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"stored", qos=1, retain=True)
    sub = srv.client(f"{uid}-s")
    subscribe_raw(sub, t, qos=1)
    pub.publish(t, b"live", qos=1)
    a, b = sub.recv_publish(), sub.recv_publish()
    assert [(a.payload, a.retain), (b.payload, b.retain)] == [(b"stored", True), (b"live", False)]
    assert a.type == b.type == PUBLISH


def test_a_filter_asked_for_again_does_not_queue_its_retained_messages_twice(broker, uid):
    """A client that does not read lists '#' 50 times in one SUBSCRIBE, then subscribes to it
    twice more: the retained messages past max_pending_write_bytes wait in its queue once
    each (was: once per filter, 50 x 2,000 entries from a 300-byte packet), and every one of
    them arrives when it reads."""
    b = broker(limits={"max_pending_write_bytes": 16 * 1024})
    pub = b.client(f"{uid}-p")
    n = 2000
    pub.send(b"".join(m.publish(f"{uid}/r/{i}", b"v" * 2000, retain=True) for i in range(n)))
    assert pub.ping(timeout=30) == []
    lazy = b.client(f"{uid}-lazy", rcvbuf=4096)
    lazy.send(m.subscribe(1, [(f"{uid}/#", 0)] * 50) + m.subscribe(2, [(f"{uid}/#", 0)])
              + m.subscribe(3, [(f"{uid}/r/#", 0)]))
    deadline = time.monotonic() + 10
    while (row := b.client_row(f"{uid}-lazy"))["subscriptions"] < 2:   # the last one handled
        assert time.monotonic() < deadline, row
        time.sleep(0.05)
    assert 0 < row["queued"] <= n, row
    topics = set()
    subacks = 0
    while len(topics) < n or subacks < 3:
        p = lazy.recv_packet(timeout=10)
        if p.type == SUBACK:
            subacks += 1
            continue
        assert p.type == PUBLISH and p.retain, p
        topics.add(p.topic)
    assert topics == {f"{uid}/r/{i}" for i in range(n)}


def test_a_retained_message_a_full_queue_dropped_is_sent_for_a_later_subscription(broker,
                                                                                  uid):
    """queue_full = "drop_old" drops a retained message queued for a subscription; a later
    SUBSCRIBE that matches it sends it (it is no longer taken for queued already)."""
    b = broker(limits={"max_queued_messages": 3, "queue_full": "drop_old",
                       "max_inflight_messages": 1})
    pub = b.client(f"{uid}-p")
    for i in range(1, 6):
        pub.publish(f"{uid}/t/{i}", b"v%d" % i, qos=1, retain=True)
    s = b.client(f"{uid}-s")
    s.send(m.subscribe(1, [(f"{uid}/t/#", 1)]))
    assert s.recv_packet().type == SUBACK
    first = s.recv_publish(ack=False)           # in flight; four wait for the window of 1
    assert b.stats()["dropped"]["max_queued_messages"] == 1
    s.send(m.subscribe(2, [(f"{uid}/t/4", 1)]))
    assert s.recv_packet().type == SUBACK
    s.send(m.puback(first.packet_id))
    got = [first.topic]
    for _ in range(3):      # the queue of 3 (t/4 queued again pushed the oldest one out)
        p = s.recv_publish(ack=False)
        got.append(p.topic)
        s.send(m.puback(p.packet_id))
    assert f"{uid}/t/4" in got, got
    assert b.stats()["dropped"]["max_queued_messages"] == 2
    assert s.ping() == []


# Small segments that age out at once: retention deletes a retained message's record while the
# retained store (and the snapshot) keep the message.
AGING_LOG = {"segment_bytes": 4096, "segment_ms": 1000, "retention_ms": 1000}


def retained_older_than_the_log(b, uid):
    """Two retained messages (offsets 0 and 1) whose segment retention then deletes."""
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/r/1", b"one", qos=1, retain=True)
    pub.publish(f"{uid}/r/2", b"two", qos=1, retain=True)
    for _ in range(8):                                  # the first segment rolls
        pub.publish(f"{uid}/noise", b"n" * 1000, qos=1)
    b.client(f"{uid}-d", clean=False).disconnect()      # a snapshot covers them (retention waits)
    assert b.wait_log(lambda ln: "deleted segment" in ln
                      and "00000000000000000000.seg (offsets 0.." in ln, timeout=10), b.log_text()
    return pub


def persistent(b, client_id, v5=False):
    """A 3.1.1 client with clean session 0, or a 5.0 one whose session outlives it."""
    if not v5:
        return b.client(client_id, clean=False)
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id, clean_start=False, props={R.SESSION_EXPIRY: 3600}).reason == 0
    return c


def send_retained_unacknowledged(b, uid, v5=False):
    """A persistent session subscribes: one retained message in its window (of 1), the other
    queued behind it; its connection ends before it acknowledges."""
    s = persistent(b, f"{uid}-s", v5)
    s.send((R.subscribe5 if v5 else m.subscribe)(1, [(f"{uid}/r/#", 1)]))
    assert s.recv_packet().type == SUBACK
    first = s.recv_publish(ack=False)
    assert first.retain and not first.dup
    s.close()
    return first


@pytest.mark.parametrize("restart,v5", [("none", False), ("kill", False), ("none", True)])
def test_retained_messages_sent_at_subscribe_survive_their_deleted_records(broker, uid, restart,
                                                                           v5):
    """A retained message sent at SUBSCRIBE whose log record retention deleted is sent again
    from the retained store after the client reconnects (3.1.1 and 5.0), and after a crash
    (was: lost, its queue entry an offset that pointed at nothing, MQTT-4.4.0-1)."""
    b = broker(log=AGING_LOG, limits={"max_inflight_messages": 1})
    retained_older_than_the_log(b, uid)
    first = send_retained_unacknowledged(b, uid, v5)
    if restart == "kill":
        data_dir = b.config["data_dir"]
        wait_for_snapshot(data_dir, f"{uid}-s",
                          pred=lambda s: s["inflight"] and s["offline_ms"] is not None)
        b.stop(signal.SIGKILL)
        b = broker(data_dir=data_dir, log=AGING_LOG, limits={"max_inflight_messages": 1})
    mark = b.mark()
    s = persistent(b, f"{uid}-s", v5)
    again = s.recv_publish()
    assert (again.topic, again.payload, again.dup, again.retain, again.packet_id) == (
        first.topic, first.payload, True, True, first.packet_id)
    other = s.recv_publish()
    assert other.retain and not other.dup
    assert {(p.topic, p.payload) for p in (again, other)} == {
        (f"{uid}/r/1", b"one"), (f"{uid}/r/2", b"two")}
    assert s.ping() == []
    assert b.stats()["counters"]["publish_lost"] == 0
    assert not [ln for ln in b.logs[mark:] if "no longer in the log" in ln]


def test_a_retained_message_replaced_while_its_session_is_offline_is_counted_lost(broker, uid):
    """The retained store no longer holds the message and the log lost its record: what was
    queued is lost, counted and logged; the new value comes from the log as any message."""
    b = broker(log=AGING_LOG, limits={"max_inflight_messages": 1})
    pub = retained_older_than_the_log(b, uid)
    first = send_retained_unacknowledged(b, uid)
    queued = f"{uid}/r/2" if first.topic == f"{uid}/r/1" else f"{uid}/r/1"
    pub.publish(queued, b"new", qos=1, retain=True)
    mark = b.mark()
    s = b.client(f"{uid}-s", clean=False)
    again = s.recv_publish()
    assert (again.topic, again.payload, again.dup, again.retain) == (
        first.topic, first.payload, True, True)
    new = s.recv_publish()
    assert (new.topic, new.payload, new.retain) == (queued, b"new", False)
    assert s.ping() == []
    assert b.stats()["counters"]["publish_lost"] == 1
    assert b.wait_log(lambda ln: "no longer in the log" in ln, start=mark)
