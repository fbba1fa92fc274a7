"""Keepalive (3.1.2.10) and the CONNECT timeout. Timing is measured by waiting on the socket
closing, with a timeout; nothing sleeps."""

import time

import mqttraw as m
from mqttraw import PINGRESP


def test_pingreq_gets_pingresp(srv, uid):
    """3.12.4 [MQTT-3.12.4-1]."""
    c = srv.client(uid)
    c.send(m.pingreq())
    p = c.recv_packet()
    assert (p.type, p.flags, p.body) == (PINGRESP, 0, b"")


def test_silent_client_closed_after_one_and_a_half_keepalive(srv, uid):
    """[MQTT-3.1.2-24]: no packet within 1.5 x keepalive -> disconnect."""
    c = srv.client(uid, keepalive=1)
    t0 = time.monotonic()
    assert c.expect_closed(4.0), "not disconnected within 4 s with keepalive=1"
    elapsed = time.monotonic() - t0
    assert 1.3 <= elapsed <= 2.6, f"disconnected after {elapsed:.2f} s with keepalive=1 (expected ~1.5 s)"


def test_keepalive_two_seconds(srv, uid):
    c = srv.client(uid, keepalive=2)
    t0 = time.monotonic()
    assert c.expect_closed(5.0)
    elapsed = time.monotonic() - t0
    assert 2.8 <= elapsed <= 3.8, f"disconnected after {elapsed:.2f} s with keepalive=2 (expected ~3 s)"


def test_pings_keep_connection_alive(srv, uid):
    c = srv.client(uid, keepalive=1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.5:
        assert c.ping() == []
        assert not c.expect_closed(0.7), "closed although a PINGREQ came every 0.7 s"


def test_any_packet_resets_keepalive(srv, uid):
    c = srv.client(uid, keepalive=1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.5:
        c.send(m.publish(f"{uid}/t", b"alive"))
        assert not c.expect_closed(0.7), "closed although a PUBLISH came every 0.7 s"
    assert c.ping() == []


def test_keepalive_zero_never_times_out(srv, uid):
    """Keepalive 0 turns the mechanism off: still connected long after 1.5 s."""
    c = srv.client(uid, keepalive=0)
    assert not c.expect_closed(3.0), "closed a client with keepalive 0"
    assert c.ping() == []


def test_keepalive_expiry_does_not_affect_others(srv, uid):
    quiet = srv.client(f"{uid}-q", keepalive=1)
    busy = srv.client(f"{uid}-b", keepalive=60)
    assert quiet.expect_closed(4.0)
    assert busy.ping() == []


def test_many_clients_expire_independently(srv, uid):
    clients = [srv.client(f"{uid}-{i}", keepalive=1) for i in range(20)]
    survivor = srv.client(f"{uid}-alive", keepalive=1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.2:
        assert survivor.ping() == []
        assert not survivor.expect_closed(0.5)
    for c in clients:
        assert c.expect_closed(2.0)
    assert survivor.ping() == []


def test_connect_timeout_closes_silent_socket(broker):
    b = broker(limits={"connect_timeout": 0.5})
    c = b.raw()
    t0 = time.monotonic()
    assert c.expect_closed(4.0), "a connection that never sent CONNECT was not closed"
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed <= 2.5, f"closed after {elapsed:.2f} s with connect_timeout=0.5"
    assert c.before_close == []


def test_connect_timeout_closes_partial_connect(broker):
    b = broker(limits={"connect_timeout": 0.5})
    c = b.raw()
    c.send(m.connect("partial")[:7])
    assert c.expect_closed(4.0)
    assert c.before_close == []


def test_connect_timeout_does_not_close_connected_client(broker, uid):
    b = broker(limits={"connect_timeout": 0.5})
    c = b.client(uid)
    assert not c.expect_closed(1.5)
    assert c.ping() == []


def test_keepalive_above_max_keepalive_refused(broker, uid):
    """A keepalive larger than limits.max_keepalive, or 0 once it is set, gets CONNACK 2
    (identifier rejected, as Mosquitto does for 3.1.1) and the connection is closed."""
    b = broker(limits={"max_keepalive": 10})
    assert b.client(f"{uid}-ok", keepalive=10).ping() == []
    for keepalive in (11, 0):           # 0: none at all, once max_keepalive is set
        c = b.raw()
        c.send(m.connect(f"{uid}-k{keepalive}", keepalive=keepalive))
        assert c.expect_closed(5)
        assert [(p.type, p.rc) for p in c.before_close] == [(m.CONNACK, 2)]
    assert b.wait_log(f"client '{uid}-k0' from 127.0.0.1:{c.local_port}: refused (CONNACK 2): "
                      f"keepalive 0 (none) and max_keepalive is 10 s")
    # At the default (65535) a keepalive of 0 is accepted.
    assert broker().client(f"{uid}-none", keepalive=0).ping() == []


def test_a_5_0_client_over_max_keepalive_is_told_the_servers(broker, uid):
    """5.0: Server Keep Alive in the CONNACK instead of a refusal; also for keepalive 0."""
    import mqttraw5 as R
    from conftest import _open_clients
    b = broker(limits={"max_keepalive": 10})
    for keepalive, told in ((5, None), (11, 10), (0, 10)):
        c = R.RawClient5(b.host, b.port)
        _open_clients.append(c)
        ack = c.connect(f"{uid}-{keepalive}", keepalive=keepalive)
        assert ack.reason == 0 and ack.properties.get(R.SERVER_KEEP_ALIVE) == told, ack


def test_keepalive_counts_packets_not_bytes(broker, uid):
    """Dribbling one byte at a time used to reset keepalive forever."""
    b = broker()
    c = b.client(uid, keepalive=1)
    frame = m.publish(f"{uid}/t", b"x" * 50)
    start = time.monotonic()
    closed = False
    for byte in frame:
        c.send(bytes([byte]))
        if c.expect_closed(0.4):
            closed = True
            break
    assert closed, "connection kept open by single bytes without a complete packet"
    assert time.monotonic() - start < 3.0
