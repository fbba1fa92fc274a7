"""A server that comes back from an older save of its sessions (a crash of Mosquitto
between autosaves) still has this client's session but has forgotten the QoS 2 exchanges
it started since: it numbers new messages from its older counter, so a new one can come
under a packet id the client still holds awaiting its PUBREL. It is a different message (its
digest, of topic, payload and RETAIN, is not the held one's) and is given out; the client used
to take it for a resend and drop it while sending PUBREC, so the server counted it delivered:
lost. The same message again under a held id is a resend, whatever its DUP: Mosquitto, back
from its save, sends a saved message again with DUP 0; it is given out once. Without a digest
(a state file written before they were kept) DUP decides. The server is played by the test
over a real socket (tests/bridge/helpers.py's FakeRemote, packets from the tests' own
encoder)."""

from __future__ import annotations

import json
import logging
import socket

import pytest

import mqttraw as m
import mqttraw5 as m5
from bridge.helpers import FakeRemote, FakeRemote5
from edgebroker.client.connection import Connection
from edgebroker.client.events import Connected, Message

TOPIC = "t/in"


class Server:
    """The fake server's side for one protocol: its PUBLISH, PUBREL and CONNACK."""

    def __init__(self, protocol: int):
        self.v5 = protocol == 5
        self.remote = FakeRemote5() if self.v5 else FakeRemote()

    def publish(self, pid: int | None, payload: bytes, dup: bool = False, qos: int = 2,
                retain: bool = False, topic: str = TOPIC) -> bytes:
        make = m5.publish5 if self.v5 else m.publish
        return make(topic, payload, qos, retain, dup=dup, packet_id=pid)

    def pubrel(self, pid: int) -> bytes:
        return m5.pubrel5(pid) if self.v5 else m.pubrel(pid)

    def accept(self, session_present: bool):
        if self.v5:
            return self.remote.accept(m5.connack5(session_present))
        return self.remote.accept(session_present, subscribe=False)


def link(conn: Connection, server: Server, session_present: bool):
    """A new connection to the fake server: (client socket, server end), CONNACK read."""
    s = socket.create_connection(("127.0.0.1", server.remote.port), 10)
    s.settimeout(10)
    conn.connect(0.0)
    s.sendall(conn.data_to_send(0.0))
    end = server.accept(session_present)
    events = pump(conn, s, lambda e: isinstance(e, Connected))
    assert events[-1].session_present is session_present
    return s, end


def pump(conn: Connection, s: socket.socket, done) -> list:
    """Read the server's bytes into the connection, sending what it owes, until an event is
    ``done`` (bounded)."""
    events: list = []
    for _ in range(200):
        if any(done(e) for e in events):
            return events
        got = s.recv(4096)
        assert got, "the fake server closed the connection"
        events += conn.receive_data(got, 0.0)
        s.sendall(conn.data_to_send(0.0))
    raise AssertionError(f"not done: {events}")


def given(conn, s, end, server, *packets) -> list:
    """``packets`` sent by the server, then a QoS 0 marker: the messages given out before it."""
    end.send(b"".join(packets) + server.publish(None, b"marker", qos=0))
    events = pump(conn, s, lambda e: isinstance(e, Message) and e.payload == b"marker")
    return [e for e in events if isinstance(e, Message) and e.payload != b"marker"]


def acked(conn, s, messages) -> None:
    for msg in messages:
        assert conn.ack(msg)
    s.sendall(conn.data_to_send(0.0))


def pubrecs(end, n: int) -> list:
    return [end.expect(m.PUBREC).packet_id for _ in range(n)]


@pytest.mark.parametrize("auto_ack", [True, False], ids=["auto-ack", "ack-later"])
@pytest.mark.parametrize("protocol", [4, 5], ids=["3.1.1", "5.0"])
def test_a_new_qos2_message_under_a_held_id_is_given_out_a_resend_is_not(protocol, auto_ack,
                                                                       caplog):
    server = Server(protocol)
    conn = Connection("reuser", protocol, keepalive=0, clean_start=False, auto_ack=auto_ack,
                      properties={0x11: 3600} if protocol == 5 else None)
    caplog.set_level(logging.WARNING, "edgebroker.client")
    try:
        # 1. Ids 1 and 2 given out; their PUBREL withheld. ack-later: only 1 acknowledged.
        s, end = link(conn, server, False)
        got = given(conn, s, end, server, server.publish(1, b"old1"), server.publish(2, b"old2"))
        assert [(e.payload, e.packet_id, e.dup) for e in got] == [
            (b"old1", 1, False), (b"old2", 2, False)]
        old2 = got[1]
        if not auto_ack:
            acked(conn, s, got[:1])
        assert pubrecs(end, 2 if auto_ack else 1) == ([1, 2] if auto_ack else [1])
        s.close()
        end.close()
        conn.connection_lost()

        # 2. The server restarted from an older save: the session, not the exchanges. New
        # messages come (DUP 0) under ids 1 and 2: given out, each; a warning, once.
        s, end = link(conn, server, True)
        got = given(conn, s, end, server, server.publish(1, b"new1"), server.publish(2, b"new2"))
        assert [(e.payload, e.packet_id) for e in got] == [(b"new1", 1), (b"new2", 2)]
        assert conn.ids_reused == 2 and conn.duplicates_dropped == 0
        if not auto_ack:
            assert not conn.ack(old2)    # the server forgot it: the new one is acknowledged
            acked(conn, s, got)
        assert pubrecs(end, 2) == [1, 2]
        warned = [r for r in caplog.records if "awaited its PUBREL" in r.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert "packet id 1" in warned[0].getMessage()

        # 3. A resend (DUP 1) of a held id: not given out again, PUBREC again; then the
        # PUBRELs end the exchanges (PUBCOMP).
        assert given(conn, s, end, server, server.publish(1, b"new1", dup=True)) == []
        assert conn.duplicates_dropped == 1 and conn.ids_reused == 2
        assert pubrecs(end, 1) == [1]
        end.send(server.pubrel(1) + server.pubrel(2))
        given(conn, s, end, server)
        assert [end.expect(m.PUBCOMP).packet_id for _ in range(2)] == [1, 2]

        # 4. Id 3 held, then another restart from an older save: logged again (once per
        # connection).
        got = given(conn, s, end, server, server.publish(3, b"held3"))
        if not auto_ack:
            acked(conn, s, got)
        assert pubrecs(end, 1) == [3]
        s.close()
        end.close()
        conn.connection_lost()
        s, end = link(conn, server, True)
        got = given(conn, s, end, server, server.publish(3, b"new3"))
        assert [e.payload for e in got] == [b"new3"] and conn.ids_reused == 3
        warned = [r for r in caplog.records if "awaited its PUBREL" in r.getMessage()]
        assert len(warned) == 2
        s.close()
    finally:
        server.remote.close()


@pytest.mark.parametrize("auto_ack", [True, False], ids=["auto-ack", "ack-later"])
@pytest.mark.parametrize("protocol", [4, 5], ids=["3.1.1", "5.0"])
def test_the_same_message_under_a_held_id_is_a_resend_a_different_one_is_new_whatever_dup(
        protocol, auto_ack, caplog):
    server = Server(protocol)
    conn = Connection("resender", protocol, keepalive=0, clean_start=False, auto_ack=auto_ack,
                      properties={0x11: 3600} if protocol == 5 else None)
    caplog.set_level(logging.WARNING, "edgebroker.client")
    try:
        # 1. Ids 1 to 4 given out and acknowledged; their PUBREL withheld.
        s, end = link(conn, server, False)
        got = given(conn, s, end, server, *(server.publish(i, b"m%d" % i) for i in (1, 2, 3, 4)))
        assert [e.payload for e in got] == [b"m1", b"m2", b"m3", b"m4"]
        if not auto_ack:
            acked(conn, s, got)
        assert pubrecs(end, 4) == [1, 2, 3, 4]
        s.close()
        end.close()
        conn.connection_lost()

        # 2. The server, back from its save, sends the saved m1 again with DUP 0: a resend,
        # PUBREC again, not given out. A different message under id 2 with DUP 1, and under
        # id 3 the same payload with another RETAIN, under id 4 another topic: new, given out.
        s, end = link(conn, server, True)
        got = given(conn, s, end, server, server.publish(1, b"m1"),
                    server.publish(2, b"other2", dup=True), server.publish(3, b"m3", retain=True),
                    server.publish(4, b"m4", topic="t/other"))
        assert [(e.topic, e.payload, e.retain, e.packet_id) for e in got] == [
            (TOPIC, b"other2", False, 2), (TOPIC, b"m3", True, 3), ("t/other", b"m4", False, 4)]
        assert (conn.duplicates_dropped, conn.ids_reused) == (1, 3)
        if not auto_ack:
            acked(conn, s, got)
        assert pubrecs(end, 4) == [1, 2, 3, 4]
        warned = [r.getMessage() for r in caplog.records if "awaited its PUBREL" in r.getMessage()]
        assert len(warned) == 1
        assert "a different QoS 2 message (DUP 1) under packet id 2" in warned[0]

        # 3. The held ids and digests outlive the process (the state file): the same messages
        # again with DUP 0 are resends; m2, no longer held under id 2, is new there.
        s.close()
        end.close()
        conn.connection_lost()
        doc = json.loads(json.dumps(conn.save()))
        assert doc["incoming_qos2"] == [1, 2, 3, 4] and len(doc["incoming_qos2_digests"]) == 4
        conn = Connection.load(doc, auto_ack=auto_ack)
        s, end = link(conn, server, True)
        got = given(conn, s, end, server, server.publish(1, b"m1"), server.publish(2, b"other2"),
                    server.publish(3, b"m3", retain=True), server.publish(2, b"m2"))
        assert [(e.payload, e.packet_id) for e in got] == [(b"m2", 2)]
        assert (conn.duplicates_dropped, conn.ids_reused) == (3, 1)
        if not auto_ack:
            acked(conn, s, got)
        assert pubrecs(end, 4) == [1, 2, 3, 2]
        s.close()
    finally:
        server.remote.close()


@pytest.mark.parametrize("protocol", [4, 5], ids=["3.1.1", "5.0"])
def test_ids_of_a_state_file_without_digests_follow_the_dup_rule(protocol, caplog):
    server = Server(protocol)
    old = Connection("old-state", protocol, keepalive=0, clean_start=False,
                     properties={0x11: 3600} if protocol == 5 else None).save()
    old["incoming_qos2"] = [1, 2]          # as written before digests were kept: ids only
    assert "incoming_qos2_digests" not in old
    conn = Connection.load(old)
    caplog.set_level(logging.WARNING, "edgebroker.client")
    try:
        s, end = link(conn, server, True)
        # DUP 1 under id 1: a resend. DUP 0 under id 2: new (nothing to compare it with).
        got = given(conn, s, end, server, server.publish(1, b"m1", dup=True),
                    server.publish(2, b"m2"))
        assert [(e.payload, e.packet_id) for e in got] == [(b"m2", 2)]
        assert (conn.duplicates_dropped, conn.ids_reused) == (1, 1)
        warned = [r.getMessage() for r in caplog.records if "awaited its PUBREL" in r.getMessage()]
        assert len(warned) == 1 and "no digest" in warned[0]
        # Id 2 now holds m2's digest: m2 again with DUP 0 is a resend.
        assert given(conn, s, end, server, server.publish(2, b"m2")) == []
        assert (conn.duplicates_dropped, conn.ids_reused) == (2, 1)
        assert pubrecs(end, 3) == [1, 2, 2]
        s.close()
    finally:
        server.remote.close()


@pytest.mark.parametrize("bad", [[], {"1": 5}, {"3": 5}, {"x": 5}, {"1.0": 5}, {"2": -1},
                                 {"2": 1 << 32}, {"2": "5"}])
def test_state_file_digests_of_another_form_are_refused(bad):
    doc = Connection("c", 4, clean_start=False).save()
    doc["incoming_qos2"] = [2]
    doc["incoming_qos2_digests"] = bad
    with pytest.raises(ValueError, match="incoming_qos2_digests"):
        Connection.load(doc)
