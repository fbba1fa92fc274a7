"""The session across a reconnect against real servers (edgebroker and Mosquitto): the
sans-I/O connection driven over a plain socket, a subscriber speaking MQTT through the tests'
own encoder (tests/mqttraw.py). With Session Present 1 a QoS 2 publish past PUBREC is
finished with PUBREL; with Session Present 0 the server has forgotten it, so the client sends
it again as a new PUBLISH: it arrives (at least once) instead of being lost. A QoS 2 message
the server sends again on the next connection is given out once. Each in 3.1.1 and in 3.1,
whose CONNACK has no Session Present flag (the session is taken as kept)."""

from __future__ import annotations

import socket

import pytest

import mqttraw as m
from edgebroker.client.connection import Connection
from edgebroker.client.events import Acked, Connected, Message, Subscribed

TIMEOUT = 10.0


def link(conn: Connection, remote, now: float) -> tuple[socket.socket, list]:
    """A new socket to ``remote``, CONNECT sent, events until the CONNACK."""
    s = socket.create_connection((remote.host, remote.port), TIMEOUT)
    s.settimeout(TIMEOUT)
    conn.connect(now)
    s.sendall(conn.data_to_send(now))
    events = []
    while conn.state == "connecting":
        data = s.recv(4096)
        assert data, "the server closed the connection before CONNACK"
        events += conn.receive_data(data, now)
    return s, events


def until_acked(conn: Connection, s: socket.socket, now: float, request) -> list:
    """Write what the connection has to send and read until ``request`` is acknowledged."""
    return exchange(conn, s, now, lambda e: isinstance(e, Acked) and e.request is request)


def received(sub: m.RawClient, last: bytes) -> list:
    """The payloads the QoS 2 subscriber gets, up to ``last`` (PUBREC and PUBCOMP sent)."""
    payloads = []
    while not payloads or payloads[-1] != last:
        p = sub.recv_packet(TIMEOUT)
        if p.type == m.PUBREL:
            sub.send(m.pubcomp(p.packet_id))
            continue
        assert (p.type, p.qos) == (m.PUBLISH, 2)
        sub.send(m.pubrec(p.packet_id))
        payloads.append(p.payload)
    return payloads


# 3.1 (level 3): its CONNACK has no Session Present flag, yet the server keeps the session
# of a client connecting with cleansession 0; the client takes it as kept.
PROTOCOLS = pytest.mark.parametrize("protocol", [4, 3], ids=["3.1.1", "3.1"])


@PROTOCOLS
@pytest.mark.parametrize("clean_start", [True, False], ids=["session-present-0",
                                                            "session-present-1"])
def test_qos2_past_pubrec_survives_a_reconnect(remote, uid, clean_start, protocol):
    topic = f"{uid}/t"
    sub = m.RawClient(remote.host, remote.port)
    sub.send(m.connect(f"{uid}s"))
    sub.expect(m.CONNACK)
    sub.send(m.subscribe(1, [(topic, 2)]))
    sub.expect(m.SUBACK)

    conn = Connection(f"{uid}p", protocol, keepalive=0, clean_start=clean_start)
    s, _ = link(conn, remote, 0.0)
    req = conn.publish(topic, b"hello", qos=2)
    s.sendall(conn.data_to_send(0.0))
    pubrec = m.split_frames(bytearray(s.recv(4096)))
    assert [p.type for p in pubrec] == [m.PUBREC]
    conn.receive_data(m.pubrec(pubrec[0].packet_id), 0.0)
    assert [p.type for p in m.split_frames(bytearray(conn.data_to_send(0.0)))] == [m.PUBREL]
    s.close()                        # the PUBREL is lost with the link
    conn.connection_lost()

    s, events = link(conn, remote, 1.0)
    assert [type(e) for e in events] == [Connected]
    assert events[0].session_present is not clean_start
    first = m.split_frames(bytearray(conn.data_to_send(1.0)))
    if clean_start:                  # no session: the message again, as a new one
        assert [(p.type, p.qos, p.dup, p.payload) for p in first] == [
            (m.PUBLISH, 2, False, b"hello")]
    else:                            # the server has it: PUBREL finishes the exchange
        assert [(p.type, p.packet_id) for p in first] == [(m.PUBREL, req.packet_id)]
    s.sendall(b"".join(m.packet(p.type, p.flags, p.body) for p in first))
    until_acked(conn, s, 1.0, req)
    marker = conn.publish(topic, b"marker", qos=2)
    until_acked(conn, s, 1.0, marker)

    got = received(sub, b"marker")
    if clean_start and remote.kind == "edgebroker":
        # edgebroker gives a QoS 2 message out on its PUBLISH: the first one was delivered,
        # and the one sent again (a new message to the new session) too: at least once.
        assert got[-1] == b"marker" and set(got[:-1]) == {b"hello"}
    else:
        # Mosquitto gives a QoS 2 message out on PUBREL (lost here); with the session the
        # PUBREL finishes it: exactly once either way.
        assert got == [b"hello", b"marker"]
    s.close()
    sub.close()


@PROTOCOLS
def test_incoming_qos2_sent_again_after_a_reconnect_is_given_out_once(remote, uid, protocol):
    """The link breaks after a QoS 2 message was given out and before its PUBREC went out;
    the server, which kept the session (cleansession 0), sends it again (DUP) on the next
    connection: it is dropped as a duplicate (PUBREC, PUBREL, PUBCOMP), not given out
    twice. (3.1: the CONNACK's 0 was read as "session lost", the identifier forgotten.)"""
    topic = f"{uid}/in"
    conn = Connection(f"{uid}s", protocol, keepalive=0, clean_start=False)
    s, _ = link(conn, remote, 0.0)
    conn.subscribe([(topic, 2)])
    exchange(conn, s, 0.0, lambda e: isinstance(e, Subscribed))
    pub = m.RawClient(remote.host, remote.port)
    pub.connect(f"{uid}p")
    pub.publish(topic, b"once", qos=2)
    given = exchange(conn, s, 0.0, lambda e: isinstance(e, Message), send_last=False)
    s.close()                        # the PUBREC owed is lost with the link
    conn.connection_lost()

    s, events = link(conn, remote, 1.0)
    given += events
    if not any(isinstance(e, Message) for e in events):      # the resent PUBLISH
        given += exchange(conn, s, 1.0, lambda e: isinstance(e, Message),
                          until=lambda: conn.duplicates_dropped)
    pub.publish(topic, b"marker", qos=2)
    given += exchange(conn, s, 1.0, lambda e: isinstance(e, Message) and e.payload == b"marker")
    assert [e.payload for e in given if isinstance(e, Message)] == [b"once", b"marker"]
    assert conn.duplicates_dropped == 1
    assert [e.session_present for e in events if isinstance(e, Connected)] == [True]
    s.close()
    pub.close()


def exchange(conn: Connection, s: socket.socket, now: float, done, until=None,
             send_last: bool = True) -> list:
    """Write what the connection has to send and read until an event is ``done`` (or
    ``until()``); what it owes then is sent unless not ``send_last``."""
    events: list = []
    while not any(done(e) for e in events) and not (until and until()):
        data = conn.data_to_send(now)
        if data:
            s.sendall(data)
        got = s.recv(4096)
        assert got, "the server closed the connection"
        events += conn.receive_data(got, now)
    if send_last:
        s.sendall(conn.data_to_send(now))
    return events
