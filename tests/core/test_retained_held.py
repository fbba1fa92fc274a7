"""Retained messages for a SUBSCRIBE made while the session is behind (it reads the log from its
cursor: back from offline with a backlog, say): they come after what it is owed from before the
SUBSCRIBE and before what was published after it (MQTT-4.6.0-6), across a reconnect and a
crash too."""

import json
import signal
import time

import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import _open_clients, wait_for_snapshot
from edgebroker.core import snapshot as snap
from mqttraw import CONNACK, PUBLISH, SUBACK


def reconnect_and_subscribe(b, client_id, topic_filter, v5=False):
    """A persistent session's client back, its CONNECT and SUBSCRIBE sent at once (as a client
    that subscribes on every connect)."""
    if v5:
        c = R.RawClient5(b.host, b.port)
        _open_clients.append(c)
        c.send(R.connect5(client_id, clean_start=False, props={R.SESSION_EXPIRY: 3600})
               + R.subscribe5(1, [(topic_filter, 1)]))
    else:
        c = b.raw()
        c.send(m.connect(client_id, clean=False) + m.subscribe(1, [(topic_filter, 1)]))
    assert c.expect(CONNACK).session_present
    return c


def publishes(c, n, ack=True):
    """The next ``n`` PUBLISHes as (value, retain), SUBACKs passed over."""
    got = []
    while len(got) < n:
        p = c.recv_packet()
        if p.type == SUBACK:
            continue
        assert p.type == PUBLISH, p
        got.append((p.payload.split(b" ")[0], p.retain))
        if ack:
            c.ack(p)
    return got


def backlog(b, uid, n):
    """A persistent session subscribed to ``uid/s/#`` goes offline; ``n`` retained QoS 1
    messages to one topic follow (values 0 .. n-1, each with 300 bytes more: a 64 KiB chunk
    of the log holds about 200)."""
    s = b.client(f"{uid}-s", clean=False)
    s.subscribe(f"{uid}/s/#", qos=1)
    s.disconnect()
    pub = b.client(f"{uid}-p")
    pub.send(b"".join(m.publish(f"{uid}/s/t", b"%d " % i + b"." * 300, qos=1, retain=True,
                                packet_id=1 + i) for i in range(n)))
    pub.ping(timeout=20)
    return pub


@pytest.mark.parametrize("v5", [False, True])
def test_a_subscribe_on_reconnect_sends_the_retained_copy_after_the_backlog(broker, uid, v5):
    """Was: the retained copy of the newest value went out after the first window, ahead of
    older messages of the same topic at the same QoS."""
    b = broker()
    n = 1000        # more than one batch read from the log
    backlog(b, uid, n)
    s = reconnect_and_subscribe(b, f"{uid}-s", f"{uid}/s/#", v5)
    got = publishes(s, n + 1)
    assert got == [(b"%d" % i, False) for i in range(n)] + [(b"%d" % (n - 1), True)]
    assert s.ping() == []


def test_messages_published_after_the_subscribe_follow_its_retained_copy(broker, uid):
    """The copies go where the SUBSCRIBE came in the log: after the messages before it, and
    before those after it, though the session is still behind when they arrive."""
    b = broker(limits={"max_inflight_messages": 1})
    pub = backlog(b, uid, 5)
    s = reconnect_and_subscribe(b, f"{uid}-s", f"{uid}/s/#")
    first = publishes(s, 1, ack=False)          # the window of 1 holds the session behind
    assert s.expect(SUBACK).packet_id == 1
    pub.publish(f"{uid}/s/t", b"after", qos=1, retain=True)
    s.send(m.puback(1))
    got = first + publishes(s, 6)
    assert got == [(b"%d" % i, False) for i in range(5)] + [(b"4", True), (b"after", False)]
    assert s.ping() == []


@pytest.mark.parametrize("restart", ["none", "kill"])
def test_retained_copies_held_for_a_session_survive_a_reconnect_and_a_crash(broker, uid,
                                                                            restart):
    """A session goes offline (or the broker is killed) while it holds retained copies for a
    SUBSCRIBE: they come once, after the same backlog, when it is back."""
    b = broker(limits={"max_inflight_messages": 1})
    backlog(b, uid, 5)
    s = reconnect_and_subscribe(b, f"{uid}-s", f"{uid}/s/#")
    first = s.expect(PUBLISH)
    assert (first.payload.split(b" ")[0], first.retain) == (b"0", False)
    assert s.expect(SUBACK).packet_id == 1
    s.close()
    if restart == "kill":
        data_dir = b.config["data_dir"]
        wait_for_snapshot(data_dir, f"{uid}-s",
                          pred=lambda st: st.get("held") and st["offline_ms"] is not None)
        b.stop(signal.SIGKILL)
        b = broker(data_dir=data_dir, limits={"max_inflight_messages": 1})
    again = b.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    dup = again.recv_publish()
    assert (dup.payload, dup.dup, dup.packet_id) == (first.payload, True, first.packet_id)
    got = publishes(again, 5)
    assert got == [(b"%d" % i, False) for i in range(1, 5)] + [(b"4", True)]
    assert again.ping() == []


def test_held_copies_in_the_snapshot_round_trip_and_bad_entries_are_left_out():
    state = snap.SessionState("s", cursor=5, held=[(10, 3, 1, True, 16)])
    data = snap.encode(snap.Snapshot(log_next_offset=12, sessions=[state]))
    assert snap.decode(data).sessions[0].held == [(10, 3, 1, True, 16)]
    doc = json.loads(data)
    doc["sessions"][0]["held"].append([10, 4, 3, True, 16])      # QoS 3
    assert snap.decode(json.dumps(doc).encode()).sessions[0].held == [(10, 3, 1, True, 16)]


@pytest.mark.parametrize("v5", [False, True])
def test_a_held_copy_the_store_let_go_of_is_checked_for_expiry_from_the_log(broker, uid, v5):
    """The session goes offline holding the copy (kept as a log offset), the message expires
    and another SUBSCRIBE deletes it from the store: the copy's expiry could no longer be
    read, and it went to a 3.1.1 subscriber from the log. It is read from the log record."""
    b = broker()
    n = 1000
    pub = backlog(b, uid, n)
    p5 = R.RawClient5(b.host, b.port)
    _open_clients.append(p5)
    p5.connect(f"{uid}-p5")
    p5.publish(f"{uid}/r", b"short-lived", qos=1, retain=True, props={R.MESSAGE_EXPIRY: 1})
    s = reconnect_and_subscribe(b, f"{uid}-s", f"{uid}/r", v5)
    while s.recv_packet().type != SUBACK:
        pass                        # the window's PUBLISHes, unacknowledged
    s.abort()                       # offline, behind, the copy held
    time.sleep(1.1)                 # its expiry passes
    fresh = b.client(f"{uid}-f")
    fresh.subscribe(f"{uid}/r", qos=1)
    assert fresh.ping() == []       # the store deleted it (expired)
    expired = b.stats()["dropped"]["message_expired"]
    if v5:
        back = R.RawClient5(b.host, b.port)
        _open_clients.append(back)
        back.send(R.connect5(f"{uid}-s", clean_start=False, props={R.SESSION_EXPIRY: 3600}))
    else:
        back = b.raw()
        back.send(m.connect(f"{uid}-s", clean=False))
    assert back.expect(CONNACK).session_present
    assert publishes(back, n) == [(b"%d" % i, False) for i in range(n)]
    pub.publish(f"{uid}/s/t", b"marker", qos=1)
    assert publishes(back, 1) == [(b"marker", False)]     # the copy would come before it
    assert b.stats()["dropped"]["message_expired"] == expired + 1


@pytest.mark.parametrize("v5", [False, True])
def test_a_held_retained_copy_past_its_expiry_is_not_sent_to_any_subscriber(broker, uid, v5):
    """The expiry of a retained copy was checked only when the SUBSCRIBE held it: one that
    expired while the session worked through its backlog still went to a 3.1.1 subscriber.
    It is checked when the cursor reaches it too: not sent, deleted, counted once."""
    b = broker()
    n = 1000        # more than one batch read from the log: the session stays behind
    backlog(b, uid, n)
    pub = R.RawClient5(b.host, b.port)
    _open_clients.append(pub)
    pub.connect(f"{uid}-p5")
    pub.publish(f"{uid}/r", b"short-lived", qos=1, retain=True, props={R.MESSAGE_EXPIRY: 1})
    s = reconnect_and_subscribe(b, f"{uid}-s", f"{uid}/r", v5)
    window = []
    while True:                     # the window's PUBLISHes, unacknowledged, up to the SUBACK
        p = s.recv_packet()
        if p.type == SUBACK:
            break
        window.append(p)
    expired = b.stats()["dropped"]["message_expired"]
    time.sleep(1.1)                 # the held copy's expiry passes while the session is behind
    got = []
    for p in window:
        got.append((p.payload.split(b" ")[0], p.retain))
        s.ack(p)
    got += publishes(s, n - len(window))
    assert got == [(b"%d" % i, False) for i in range(n)]
    assert s.ping() == []
    assert b.stats()["dropped"]["message_expired"] == expired + 1
    fresh = b.client(f"{uid}-f")
    fresh.subscribe(f"{uid}/r", qos=1)
    assert fresh.ping() == []       # deleted from the store


def test_subscribing_again_while_behind_holds_one_copy_per_retained_topic(broker, uid):
    """A session behind that subscribes again and again while its retained topics change held
    a copy per SUBSCRIBE (10 rounds of 5 topics: 50 copies, and memory and the snapshot grew
    with every round); only the copy for the latest SUBSCRIBE of each topic is held now."""
    b = broker(limits={"max_inflight_messages": 1})
    pub = backlog(b, uid, 5)
    s = reconnect_and_subscribe(b, f"{uid}-s", f"{uid}/s/#")
    first = s.expect(PUBLISH)                   # the window of 1 holds the session behind
    assert s.expect(SUBACK).packet_id == 1
    for rnd in range(10):
        for k in range(5):
            pub.publish(f"{uid}/s/k{k}", b"v%d " % rnd, qos=1, retain=True)
        s.send(m.subscribe(2 + rnd, [(f"{uid}/s/#", 1)]))
        assert s.expect(SUBACK).packet_id == 2 + rnd
    b.stop()                                    # the snapshot holds what the session held
    state = next(x for x in json.loads(open(f"{b.config['data_dir']}/sessions.json").read())
                 ["sessions"] if x["client_id"] == f"{uid}-s")
    held = {tuple(e) for e in state.get("held", [])}
    assert len(held) == 6, held                 # k0..k4, and s/t for the first SUBSCRIBE
    b = broker(data_dir=b.config["data_dir"], limits={"max_inflight_messages": 1})
    again = b.client(f"{uid}-s", clean=False)
    dup = again.recv_publish()
    assert (dup.payload, dup.dup) == (first.payload, True)
    got = publishes(again, 4 + 50 + 6)
    live = [(b"v%d" % r, False) for r in range(10) for _ in range(5)]
    assert got[:4] == [(b"%d" % i, False) for i in range(1, 5)]
    assert sorted(v for v in got[4:] if v[1]) == [(b"4", True)] + [(b"v9", True)] * 5
    assert [v for v in got[4:] if not v[1]] == live
    assert again.ping() == []
