"""The session across a reconnect against real servers (edgebroker and Mosquitto): the
sans-I/O connection driven over a plain socket, a subscriber speaking MQTT through the tests'
own encoder (tests/mqttraw.py). With Session Present 1 a QoS 2 publish past PUBREC is
finished with PUBREL; with Session Present 0 the server has forgotten it, so the client sends
it again as a new PUBLISH: it arrives (at least once) instead of being lost."""

from __future__ import annotations

import socket

import pytest

import mqttraw as m
from edgebroker.client.connection import Connection
from edgebroker.client.events import Acked, Connected

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
    events: list = []
    while not any(isinstance(e, Acked) and e.request is request for e in events):
        data = conn.data_to_send(now)
        if data:
            s.sendall(data)
        got = s.recv(4096)
        assert got, "the server closed the connection"
        events += conn.receive_data(got, now)
    s.sendall(conn.data_to_send(now))
    return events


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


@pytest.mark.parametrize("clean_start", [True, False], ids=["session-present-0",
                                                            "session-present-1"])
def test_qos2_past_pubrec_survives_a_reconnect(remote, uid, clean_start):
    topic = f"{uid}/t"
    sub = m.RawClient(remote.host, remote.port)
    sub.send(m.connect(f"{uid}s"))
    sub.expect(m.CONNACK)
    sub.send(m.subscribe(1, [(topic, 2)]))
    sub.expect(m.SUBACK)

    conn = Connection(f"{uid}p", 4, keepalive=0, clean_start=clean_start)
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
