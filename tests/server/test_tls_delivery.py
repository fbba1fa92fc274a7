"""Deliveries over TLS: large payloads and long runs of small messages, a persistent
subscriber's backlog caught up in order, and a burst past max_pending_write_bytes read from
the commit log (or dropped, with max_queued_messages)."""

import pytest

import mqttraw as m
from server.conftest import PASSWORDS, port, tls_client


def test_large_and_many_messages_over_tls(tlssrv, pki, uid):
    """Whole-chunk and partial TLS writes: big payloads and long runs of small ones, in order."""
    sub = tls_client(tlssrv, pki, 1, f"{uid}-s", username="alice", password=PASSWORDS["alice"])
    sub.subscribe(f"{uid}/t", qos=1)
    pub = tlssrv.client(f"{uid}-p", port=port(tlssrv, 0))
    big = [bytes([i]) * 900_000 for i in range(4)]
    for payload in big:
        pub.publish(f"{uid}/t", payload, qos=1)
    for i in range(2000):
        pub.publish(f"{uid}/t", b"%d" % i)
    for payload in big:
        assert sub.recv_publish(timeout=10).payload == payload
    assert [int(sub.recv_publish(timeout=10).payload) for _ in range(2000)] == list(range(2000))


def test_a_persistent_tls_subscriber_catches_up_a_backlog_in_order(tlssrv, pki, uid):
    """An offline QoS 1 backlog drained over TLS: the window's pieces go out as TLS records
    in the middle of a pass (send_now), whole or in part; every message arrives once, in
    order, QoS 1 and QoS 2 alike."""
    kw = {"username": "alice", "password": PASSWORDS["alice"], "clean": False}
    sub = tls_client(tlssrv, pki, 1, f"{uid}-s", **kw)
    sub.subscribe(f"{uid}/t", qos=2)
    sub.disconnect()
    pub = tlssrv.client(f"{uid}-p", port=port(tlssrv, 0))
    n = 3000
    for start in range(0, n, 1000):     # 500 QoS 2 awaiting PUBREL at most (receive_maximum)
        pub.send(b"".join(m.publish(f"{uid}/t", b"%05d" % i + b"." * 1500, 1 + i % 2,
                                    packet_id=i + 1) for i in range(start, start + 1000)))
        recs = [p for p in (pub.recv_packet(10) for _ in range(1000)) if p.type == m.PUBREC]
        assert len(recs) == 500
        pub.send(b"".join(m.pubrel(p.packet_id) for p in recs))
        assert all(pub.recv_packet(10).type == m.PUBCOMP for _ in recs)
    sub = tls_client(tlssrv, pki, 1, f"{uid}-s", **kw)
    assert sub.connack.session_present
    got = [sub.recv_publish(timeout=10) for _ in range(n)]
    assert [int(p.payload[:5]) for p in got] == list(range(n))
    assert [p.qos for p in got] == [1 + i % 2 for i in range(n)]
    assert sub.ping() == []


@pytest.mark.parametrize("mode", ["log", "queue"])
def test_a_burst_past_max_pending_to_a_tls_subscriber_reads_from_the_log(broker, pki, uid, mode):
    """One pass routes more than max_pending_write_bytes to a TLS subscriber whose socket
    takes little (it sends what the socket takes first, as on plain TCP): it falls behind
    and gets the rest from the commit log, in order, nothing dropped. With max_queued_messages
    set (the in-memory queue of Mosquitto's meaning) the QoS 0 messages beyond it are dropped
    and counted instead. Either way the publisher and the broker carry on."""
    limits = {"max_pending_write_bytes": 8192}
    if mode == "queue":
        limits["max_queued_messages"] = 100
    b = broker(limits=limits, listener=[
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
         "keyfile": str(pki.server.key)}])
    sub = tls_client(b, pki, 1, f"{uid}-s", rcvbuf=4096)
    sub.subscribe(f"{uid}/t")
    pub = b.raw(port=port(b, 0))
    pub.connect(f"{uid}-p")
    n = 3000
    pub.send(b"".join(m.publish(f"{uid}/t", b"%04d" % i + b"." * 996) for i in range(n)))
    assert pub.ping(timeout=10) == []           # the publisher's connection is still served
    got = []
    wait = 10 if mode == "log" else 1   # "queue": a second without a message ends the drops
    while len(got) < n:
        try:
            got.append(int(sub.recv_publish(timeout=wait).payload[:4]))
        except (AssertionError, TimeoutError):
            break
    stats = b.stats()
    assert stats["limit_hits"]["max_pending_write_bytes"] > 0
    if mode == "log":
        assert got == list(range(n))
        assert stats["dropped"]["max_pending_write_bytes"] == 0
        assert stats["counters"]["sessions_fell_behind"] >= 1
    else:
        assert got == sorted(got) and 0 < len(got) < n
        assert stats["dropped"]["max_pending_write_bytes"] == n - len(got)
    assert b.alive()
