"""The sans-I/O client connection (edgebroker/client/connection.py), driven with the server's
bytes built by the independent encoders tests/mqttraw.py and tests/mqttraw5.py; what the
client sends is read back with their parsers. Every state move, both QoS flows, the window,
retransmission, refusal, server limits and malformed server bytes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import mqttraw as m
import mqttraw5 as m5
from edgebroker.client.connection import ClientError, Connection, QueueFull
from edgebroker.client.requests import RESUBSCRIBE
from edgebroker.client.events import (
    Acked, ConnectFailed, Connected, Disconnected, Message, PingTimeout, Subscribed,
    Unsubscribed,
)
from edgebroker.mqtt.packets import Will

GOLDEN = Path(__file__).parent / "golden"


def sent(c: Connection, now: float | None = 0.0) -> list:
    """What the connection hands out, parsed by the independent decoder."""
    buf = bytearray(c.data_to_send(now))
    frames = m5.split_frames5(buf) if c.protocol == 5 else m.split_frames(buf)
    assert not buf, f"a partial frame handed out: {bytes(buf)!r}"
    return frames


def pid(p) -> int:
    """A packet's identifier (the 3.1.1 parser leaves SUBSCRIBE's in the body)."""
    return p.packet_id if p.packet_id is not None else int.from_bytes(p.body[:2], "big")


def connected(protocol: int = 4, connack: bytes | None = None, **kw) -> Connection:
    c = Connection("c1", protocol, **kw)
    c.connect(0.0)
    c.data_to_send(0.0)
    if connack is None:
        connack = m5.connack5() if protocol == 5 else m.connack()
    events = c.receive_data(connack, 0.0)
    assert [type(e) for e in events] == [Connected]
    assert c.state == "connected"
    return c


# -- CONNECT and CONNACK --------------------------------------------------------------------

def test_connect_bytes_311_31_and_5():
    c = Connection("dev-1", 4, keepalive=30, clean_start=False, username="u", password="p",
                   will=Will("w/t", b"gone", 1, True))
    c.connect(0.0)
    assert c.state == "connecting"
    assert c.data_to_send() == m.connect("dev-1", clean=False, keepalive=30,
                                         will=("w/t", b"gone", 1, True), username="u",
                                         password="p")
    c = Connection("old", 3)
    c.connect(0.0)
    assert c.data_to_send() == m.connect_v31("old")
    c = Connection("five", 5, properties={0x11: 300, 0x22: 4})
    c.connect(0.0)
    (p,) = sent(c)
    assert (p.type, p.level, p.client_id, p.properties) == (
        m.CONNECT, 5, "five", {m5.SESSION_EXPIRY: 300, m5.TOPIC_ALIAS_MAXIMUM: 4})


def test_connack_refused_311_and_5():
    c = Connection("c", 4)
    c.connect(0.0)
    c.data_to_send()
    assert c.receive_data(m.connack(rc=5), 1.0) == [ConnectFailed(5, "not authorized")]
    assert c.state == "disconnected" and c.data_to_send() == b""
    c = Connection("c", 5)
    c.connect(0.0)
    c.data_to_send()
    events = c.receive_data(m5.connack5(reason=0x86, props={m5.REASON_STRING: "no"}), 1.0)
    assert events == [ConnectFailed(0x86, "Bad User Name or Password: no")]
    assert c.state == "disconnected"
    # Connecting again on a new transport is allowed.
    c.connect(2.0)
    assert c.state == "connecting"


@pytest.mark.parametrize("protocol", [3, 4])
def test_a_password_without_a_user_name_is_refused_over_3_1_and_3_1_1(protocol):
    """MQTT-3.1.2-22: over 3.1/3.1.1 a CONNECT with the Password Flag and no User Name Flag
    is a protocol error (the server closes without a CONNACK): refused when the Connection is
    made, the event loop's and the asyncio client's too. 5.0 allows a password alone."""
    from edgebroker.client.aio import AsyncClient
    from edgebroker.client.loop import EventLoop
    words = ("CONNECT: password given without a user name: MQTT 3.1/3.1.1 do not allow it "
             "(MQTT-3.1.2-22; 5.0 does)")
    for make in (lambda **kw: Connection("c", protocol, **kw),
                 lambda **kw: EventLoop("127.0.0.1", 1, protocol=protocol, **kw),
                 lambda **kw: AsyncClient("mqtt://127.0.0.1:1", protocol=protocol, **kw)):
        for password in ("pw", b"", b"\xff"):
            with pytest.raises(ClientError) as info:
                make(password=password)
            assert str(info.value) == words
    c = Connection("c", protocol, username="u", password="pw")
    c.connect(0.0)
    flags = c.data_to_send(0.0)[11 if protocol == 3 else 9]   # after "MQIsdp" / "MQTT"
    assert flags & 0xC0 == 0xC0                          # both flags
    five = Connection("c", 5, password="pw")
    five.connect(0.0)
    assert five.data_to_send(0.0)[9] & 0xC0 == 0x40      # Password Flag, no User Name Flag


def test_no_connack_in_time():
    c = Connection("c", 4, connect_timeout=5)
    c.connect(10.0)
    c.data_to_send(10.0)
    assert c.next_deadline() == 15.0
    assert c.tick(14.9) == []
    assert c.tick(15.0) == [ConnectFailed(None, "no CONNACK within 5 s")]
    assert c.state == "disconnected" and c.next_deadline() is None


def test_connack_properties_5():
    c = connected(5, m5.connack5(props={m5.RECEIVE_MAXIMUM: 1, m5.SERVER_KEEP_ALIVE: 7,
                                        m5.ASSIGNED_CLIENT_ID: "auto-1"}))
    assert c.window == 1 and c.client_id == "auto-1"
    assert c.next_deadline() == 7.0


def test_connack_with_receive_maximum_0_is_a_protocol_error_5():
    """MQTT-3.2.2.3.3: a window of 0 could never send a QoS 1/2 PUBLISH; the connection
    does not go "connected": DISCONNECT 0x82 is handed out, the caller closes."""
    c = Connection("c1", 5)
    c.connect(0.0)
    c.data_to_send(0.0)
    events = c.receive_data(m5.connack5(props={m5.RECEIVE_MAXIMUM: 0}), 1.0)
    assert [type(e) for e in events] == [Disconnected]
    assert events[0].reason_code == 0x82 and "Receive Maximum is 0" in events[0].reason
    assert c.state == "disconnected"
    (out,) = sent(c)
    assert (out.type, out.reason) == (m5.DISCONNECT, 0x82)


def test_illegal_moves_are_the_callers_error():
    c = connected()
    with pytest.raises(ClientError, match="from connected to connecting"):
        c.connect(1.0)
    with pytest.raises(ClientError, match="protocol must be"):
        Connection("c", 6)


def test_packets_out_of_state_are_protocol_errors():
    c = Connection("c", 5)
    c.connect(0.0)
    c.data_to_send()
    events = c.receive_data(m5.puback5(1), 1.0)     # before CONNACK
    assert [type(e) for e in events] == [Disconnected] and events[0].reason_code == 0x82
    assert "PUBACK from the server while connecting" in events[0].reason
    assert [(p.type, p.reason) for p in sent(c)] == [(m.DISCONNECT, 0x82)]
    c = connected(5)
    events = c.receive_data(m5.connack5(), 1.0)     # a second CONNACK
    assert events[0].reason_code == 0x82 and c.state == "disconnected"
    c = connected(4)
    events = c.receive_data(m.subscribe(1, ["a"]), 1.0)   # a client's packet
    assert type(events[0]) is Disconnected and c.state == "disconnected"
    assert c.data_to_send() == b""       # 3.1.1 has no DISCONNECT from the client for it


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("split", [False, True])
def test_an_http_answer_before_the_connack_is_named(protocol, split):
    """A WebSocket port answers an MQTT CONNECT with HTTP 400: its first byte, H (0x48), reads
    as a PUBACK with bad flags. Before the CONNACK it is said to be HTTP, with the status
    line when it came, whole or as its first byte alone; nothing is sent to it."""
    answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    c = Connection("c", protocol)
    c.connect(0.0)
    c.data_to_send()
    events = c.receive_data(answer[:1] if split else answer, 1.0)
    assert [type(e) for e in events] == [Disconnected] and c.state == "disconnected"
    line = "'H'" if split else "'HTTP/1.1 400 Bad Request'"
    assert events[0].reason == (f"the server answered with HTTP, not MQTT ({line}): "
                                f"a WebSocket port? use ws://")
    assert c.data_to_send() == b""
    c = connected(protocol)             # once connected, an H is a PUBACK that broke the rules
    events = c.receive_data(answer, 1.0)
    assert events[0].reason.startswith("the server broke the protocol: PUBACK with")


# -- publishing -------------------------------------------------------------------------------

def test_qos0_bytes_and_acked_once_handed_out():
    c = connected()
    req = c.publish("a/b", b"x", token="t0")
    assert c.acked_qos0() == []                      # not handed out yet
    assert c.data_to_send() == m.publish("a/b", b"x")
    assert c.acked_qos0() == [Acked(req, 0)]
    assert req.packet_id is None and req.token == "t0"
    c.publish("a/b", "text", retain=True)
    assert c.data_to_send() == m.publish("a/b", b"text", retain=True)
    assert [type(e) for e in c.receive_data(m.pingresp(), 1.0)] == [Acked]


def test_qos1_flow():
    c = connected()
    req = c.publish("t", b"p", qos=1)
    assert c.data_to_send() == m.publish("t", b"p", qos=1, packet_id=1)
    assert c.inflight == 1
    assert c.receive_data(m.puback(2), 1.0) == [] and c.unexpected_acks == 1
    assert c.receive_data(m.puback(1), 1.0) == [Acked(req, 0)]
    assert c.inflight == 0


def test_qos2_flow_and_refused_pubrec_5():
    c = connected()
    req = c.publish("t", b"p", qos=2)
    assert c.data_to_send() == m.publish("t", b"p", qos=2, packet_id=1)
    assert c.receive_data(m.pubrec(1), 1.0) == []
    assert c.data_to_send() == m.pubrel(1)
    assert c.receive_data(m.pubcomp(1), 1.0) == [Acked(req, 0)]
    assert c.inflight == 0
    c = connected(5)
    req = c.publish("t", b"p", qos=2)
    sent(c)
    assert c.receive_data(m5.pubrec5(1, 0x87), 1.0) == [Acked(req, 0x87)]
    assert c.data_to_send() == b"" and c.inflight == 0
    # A PUBREC for no exchange of ours: PUBREL "not found", so the server can finish.
    c.receive_data(m5.pubrec5(9), 1.0)
    assert [(p.type, p.packet_id, p.reason) for p in sent(c)] == [(m.PUBREL, 9, 0x92)]


def test_puback_with_reason_5():
    c = connected(5)
    req = c.publish("t", b"p", qos=1, properties={m5.CONTENT_TYPE: "text/plain"})
    (p,) = sent(c)
    assert p.properties == {m5.CONTENT_TYPE: "text/plain"}
    assert c.receive_data(m5.puback5(1, 0x10), 1.0) == [Acked(req, 0x10)]


def test_window_and_queue_bound():
    c = connected(max_inflight=2, max_queued=2)
    reqs = [c.publish("t", str(i), qos=1) for i in range(4)]
    assert [p.packet_id for p in sent(c)] == [1, 2]
    assert (c.inflight, c.queued, c.can_publish) == (2, 2, False)
    with pytest.raises(QueueFull):
        c.publish("t", b"more", qos=1)
    with pytest.raises(QueueFull):
        c.subscribe(["x"])
    assert c.receive_data(m.puback(1), 1.0) == [Acked(reqs[0], 0)]
    assert [(p.packet_id, p.payload) for p in sent(c)] == [(3, b"2")]
    # A QoS 0 behind a waiting QoS 1 waits too: the order is kept.
    q0 = c.publish("t", b"zero")
    assert c.data_to_send() == b""
    c.receive_data(m.puback(2) + m.puback(3), 1.0)
    assert [(p.qos, p.payload) for p in sent(c)] == [(1, b"3"), (0, b"zero")]
    assert Acked(q0, 0) in c.acked_qos0()


def test_server_receive_maximum_is_the_window():
    c = connected(5, m5.connack5(props={m5.RECEIVE_MAXIMUM: 1}), max_inflight=10)
    c.publish("t", b"1", qos=1)
    c.publish("t", b"2", qos=2)
    assert [p.payload for p in sent(c)] == [b"1"]
    c.receive_data(m5.puback5(1), 1.0)
    assert [p.payload for p in sent(c)] == [b"2"]


def test_packet_ids_in_use_are_skipped():
    state = Connection("c", 4).save()
    state["inflight"] = [{"kind": "publish", "packet_id": pid, "topic": "t", "payload": "",
                          "qos": 1, "retain": False} for pid in (65535, 1, 2)]
    state["next_packet_id"] = 65535
    c = Connection.load(state)
    c.connect(0.0)
    c.data_to_send()
    c.receive_data(m.connack(), 0.0)
    assert [p.packet_id for p in sent(c)] == [65535, 1, 2]   # resent
    c.publish("t", b"new", qos=1)
    assert [p.packet_id for p in sent(c)] == [3]


def test_bad_requests_name_what_is_wrong():
    c = connected()
    for args, what in [(("a/+", b""), "wildcard"), (("", b""), "empty"),
                       (("t", 5), "payload must be"), ((b"t", b""), "topic must be a str")]:
        with pytest.raises(ClientError, match=what):
            c.publish(*args)
    with pytest.raises(ClientError, match="QoS must be"):
        c.publish("t", b"", qos=3)
    with pytest.raises(ClientError, match="needs protocol 5"):
        c.publish("t", b"", properties={m5.CONTENT_TYPE: "x"})
    with pytest.raises(ClientError, match="needs protocol 5"):
        c.subscribe([("a", 1 | m5.NO_LOCAL)])
    with pytest.raises(ClientError, match="not valid"):
        c.subscribe([("a/#/b", 0)])
    with pytest.raises(ClientError, match="options"):
        c.subscribe([("a", 4)])
    with pytest.raises(ClientError, match="at least one"):
        c.unsubscribe([])
    with pytest.raises(ClientError, match="max_queued 0 is below 1"):
        Connection("c", 4, max_queued=0)       # would refuse every request (QueueFull)


def test_a_payload_over_mqtts_largest_packet_is_a_bad_request():
    """MQTT's remaining length is at most 268,435,455 bytes (256 MiB): a payload that cannot
    fit with its topic and packet id raises ClientError when the request is made (not a
    refusal logged when the connection fails to make its packet); one that just fits is a
    request (3.1.1: nothing more to add to it)."""
    c = connected()
    most = 268_435_455 - 2 - len("t") - 2
    big = bytes(most + 3)             # over QoS 1's room by 3 bytes, QoS 0's by 1
    with pytest.raises(ClientError, match=r"publish to 't': 268,435,453 bytes of payload, "
                                          r"over MQTT's largest message: 268,435,450 bytes"):
        c.publish("t", big, qos=1)
    with pytest.raises(ClientError, match="268,435,452 bytes with this topic"):
        c.publish("t", memoryview(big), qos=0)
    assert c.queued == c.inflight == 0
    del big
    req = c.publish("t", bytes(most), qos=1)
    assert (req.packet_id, len(req.payload)) == (1, most)


def test_server_limits_refuse_before_sending_5():
    c = connected(5, m5.connack5(props={m5.MAXIMUM_QOS: 1, m5.RETAIN_AVAILABLE: 0,
                                        m5.MAXIMUM_PACKET_SIZE: 64}))
    r2 = c.publish("t", b"", qos=2)
    rr = c.publish("t", b"", retain=True)
    big = c.publish("t", b"x" * 100, qos=1)
    ok = c.publish("t", b"fine", qos=1)
    assert [(p.qos, p.payload) for p in sent(c)] == [(1, b"fine")]
    assert c.acked_qos0() == [Acked(r2, 0x9B), Acked(rr, 0x9A), Acked(big, 0x95)]
    assert ok.packet_id == 1 and c.inflight == 1


def test_a_topic_alias_above_the_servers_maximum_is_refused_before_sending():
    """A Topic Alias the caller set itself, above the Topic Alias Maximum of the CONNACK (0
    when it says none): answered 0x94, as the server would (it would close the connection)."""
    c = connected(5, m5.connack5(props={m5.TOPIC_ALIAS_MAXIMUM: 2}))
    over = c.publish("t", b"a", qos=1, properties={m5.TOPIC_ALIAS: 3})
    ok = c.publish("t", b"b", qos=1, properties={m5.TOPIC_ALIAS: 2})
    assert [(p.payload, p.properties) for p in sent(c)] == [(b"b", {m5.TOPIC_ALIAS: 2})]
    assert c.acked_qos0() == [Acked(over, 0x94)] and ok.packet_id == 1
    none = connected(5, m5.connack5())
    refused = none.publish("t", b"c", properties={m5.TOPIC_ALIAS: 1})
    assert sent(none) == [] and none.acked_qos0() == [Acked(refused, 0x94)]


# -- receiving --------------------------------------------------------------------------------

def test_incoming_qos0_1_2():
    c = connected()
    assert c.receive_data(m.publish("a", b"0", retain=True), 1.0) == [
        Message("a", b"0", 0, True, False, None, None)]
    assert c.receive_data(m.publish("a", b"1", qos=1, packet_id=7), 1.0) == [
        Message("a", b"1", 1, False, False, None, 7)]
    assert c.data_to_send() == m.puback(7)
    first = c.receive_data(m.publish("a", b"2", qos=2, packet_id=8), 1.0)
    assert first == [Message("a", b"2", 2, False, False, None, 8)]
    assert c.data_to_send() == m.pubrec(8)
    # Sent again before PUBREL: not given out again; PUBREC again.
    assert c.receive_data(m.publish("a", b"2", qos=2, dup=True, packet_id=8), 1.0) == []
    assert c.data_to_send() == m.pubrec(8) and c.duplicates_dropped == 1
    assert c.receive_data(m.pubrel(8), 1.0) == []
    assert c.data_to_send() == m.pubcomp(8)
    # After PUBREL the id is free: a new message.
    assert len(c.receive_data(m.publish("a", b"3", qos=2, packet_id=8), 1.0)) == 1


def test_incoming_qos2_survives_reconnect_with_session():
    c = connected(clean_start=False)
    c.receive_data(m.publish("a", b"2", qos=2, packet_id=8), 1.0)
    c.connection_lost()
    c.connect(2.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=True), 2.0)
    assert c.receive_data(m.publish("a", b"2", qos=2, dup=True, packet_id=8), 2.0) == []
    # Without a session the server sends no PUBREL: the ids are forgotten.
    c.connection_lost()
    c.connect(3.0)
    c.receive_data(m.connack(session_present=False), 3.0)
    assert c.save()["incoming_qos2"] == []


def test_auto_ack_false_acknowledges_on_ack_only():
    """auto_ack=False: a QoS 1/2 message is acknowledged by ack(message) (PUBACK, PUBREC),
    not on arrival; QoS 2 is still given out once; ack() of QoS 0 or twice does nothing."""
    c = connected(auto_ack=False)
    (m0,) = c.receive_data(m.publish("a", b"0"), 1.0)
    (m1,) = c.receive_data(m.publish("a", b"1", qos=1, packet_id=7), 1.0)
    (m2,) = c.receive_data(m.publish("a", b"2", qos=2, packet_id=8), 1.0)
    assert (m1.packet_id, m2.packet_id, c.unacked) == (7, 8, 2)
    assert c.data_to_send() == b"", "nothing acknowledged before ack()"
    # Sent again before it was acknowledged: not given out again, and no PUBREC yet.
    assert c.receive_data(m.publish("a", b"2", qos=2, dup=True, packet_id=8), 1.0) == []
    assert c.data_to_send() == b"" and c.duplicates_dropped == 1
    assert c.ack(m0) is False
    assert c.ack(m2) is True and c.ack(m1) is True
    assert [(p.type, p.packet_id) for p in sent(c)] == [(m.PUBREC, 8), (m.PUBACK, 7)]
    assert c.ack(m1) is False and c.ack(m2) is False and c.unacked == 0
    assert c.data_to_send() == b""
    # Acknowledged, sent again before PUBREL (our PUBREC lost): PUBREC at once, as usual.
    assert c.receive_data(m.publish("a", b"2", qos=2, dup=True, packet_id=8), 1.0) == []
    assert c.data_to_send() == m.pubrec(8)
    assert c.receive_data(m.pubrel(8), 1.0) == [] and c.data_to_send() == m.pubcomp(8)
    c5 = connected(5, auto_ack=False)
    (m5_1,) = c5.receive_data(m5.publish5("b", b"x", qos=1, packet_id=3), 1.0)
    assert c5.data_to_send() == b"" and c5.ack(m5_1)
    assert [(p.type, p.packet_id) for p in sent(c5)] == [(m.PUBACK, 3)]


def test_auto_ack_false_across_a_lost_connection():
    """A QoS 1 message of a lost connection is not acknowledged on the next one (the server
    sends it again: that one is acknowledged); a QoS 2 one acknowledged while down is
    answered when it is sent again; one not acknowledged is not in the state file."""
    c = connected(auto_ack=False, clean_start=False)
    (old1,) = c.receive_data(m.publish("a", b"1", qos=1, packet_id=7), 1.0)
    (old2,) = c.receive_data(m.publish("a", b"2", qos=2, packet_id=8), 1.0)
    assert c.save()["incoming_qos2"] == [], "given out, not acknowledged: not kept"
    c.connection_lost()
    assert c.ack(old2) is True and c.ack(old1) is False
    c.connect(2.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=True), 2.0)
    # The server uses id 7 again for the QoS 1 message it sends again (its resend).
    (new1,) = c.receive_data(m.publish("a", b"1", qos=1, dup=True, packet_id=7), 2.0)
    assert c.receive_data(m.publish("a", b"2", qos=2, dup=True, packet_id=8), 2.0) == []
    assert c.data_to_send() == m.pubrec(8), "QoS 1 waits for its ack(); QoS 2 is answered"
    assert c.ack(old1) is False and c.ack(new1) is True
    assert c.data_to_send() == m.puback(7)
    assert c.save()["incoming_qos2"] == [8]
    # A QoS 2 message not acknowledged when the session is gone: nothing to acknowledge.
    (m3,) = c.receive_data(m.publish("a", b"3", qos=2, packet_id=9), 2.0)
    c.connection_lost()
    c.connect(3.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=False), 3.0)
    assert c.ack(m3) is False and c.unacked == 0 and c.data_to_send() == b""


def test_pubrel_for_unknown_id():
    c = connected(5)
    c.receive_data(m5.pubrel5(4), 1.0)
    assert [(p.type, p.packet_id, p.reason) for p in sent(c)] == [(m.PUBCOMP, 4, 0x92)]


def test_topic_alias_from_the_server_5():
    c = connected(5, properties={m5.TOPIC_ALIAS_MAXIMUM: 2})
    first = c.receive_data(m5.publish5("long/topic", b"1", props={m5.TOPIC_ALIAS: 2}), 1.0)
    again = c.receive_data(m5.publish5("", b"2", props={m5.TOPIC_ALIAS: 2}), 1.0)
    assert [e.topic for e in first + again] == ["long/topic", "long/topic"]
    events = c.receive_data(m5.publish5("x", b"3", props={m5.TOPIC_ALIAS: 3}), 1.0)
    assert [(type(e), e.reason_code) for e in events] == [(Disconnected, 0x94)]
    assert [(p.type, p.reason) for p in sent(c)] == [(m.DISCONNECT, 0x94)]
    c = connected(5, properties={m5.TOPIC_ALIAS_MAXIMUM: 2})
    events = c.receive_data(m5.publish5("", b"3", props={m5.TOPIC_ALIAS: 1}), 1.0)
    assert events[0].reason_code == 0x82 and "names no topic yet" in events[0].reason


def test_subscribe_and_unsubscribe_311():
    c = connected()
    sub = c.subscribe([("a/#", 1), "b"], token="s")
    assert c.data_to_send() == m.subscribe(1, [("a/#", 1), ("b", 0)])
    assert c.receive_data(m.suback(1, (1, 0x80)), 1.0) == [Subscribed(sub, [1, 0x80])]
    uns = c.unsubscribe(["a/#"])
    assert c.data_to_send() == m.unsubscribe(2, ["a/#"])
    assert c.receive_data(m.unsuback(2), 1.0) == [Unsubscribed(uns, [])]
    c.subscribe(["a", "b"])
    events = c.receive_data(m.suback(3, (0,)), 1.0)       # one code for two filters
    assert events[0].reason_code == 0x82 and "MQTT-3.9.3-1" in events[0].reason


def test_subscribe_and_unsubscribe_5():
    c = connected(5)
    sub = c.subscribe([("a", 1 | m5.NO_LOCAL)], properties={m5.SUBSCRIPTION_ID: 5})
    (p,) = sent(c)
    assert (p.topics, p.properties) == ([("a", 5)], {m5.SUBSCRIPTION_ID: 5})
    assert c.receive_data(m5.suback5(1, (1,)), 1.0) == [Subscribed(sub, [1])]
    uns = c.unsubscribe(["a"])
    sent(c)
    assert c.receive_data(m5.unsuback5(2, (0x11,)), 1.0) == [Unsubscribed(uns, [0x11])]


def test_server_disconnect():
    c = connected(5)
    c.publish("t", b"", qos=1)
    events = c.receive_data(m5.disconnect5(0x8B, {m5.REASON_STRING: "bye"}), 1.0)
    assert events == [Disconnected(0x8B, "Server shutting down: bye")]
    assert c.state == "disconnected" and c.inflight == 1   # kept for the next connection
    c = connected(4)
    assert c.receive_data(m.disconnect(), 1.0) == [Disconnected(0, "DISCONNECT from the server")]


@pytest.mark.parametrize("bad, rule", [
    (m.packet(0, 0, b""), "MQTT-2.2.1"),                          # reserved type
    (m.publish("a", b"", flags=0x06), "MQTT-3.3.1-4"),             # QoS 3
    (m.publish("a/+", b""), "MQTT-3.3.2-2"),                       # wildcard topic
    (m.puback(0), "MQTT-2.3.1-1"),                                 # packet id 0
    (m.packet(m.PUBACK, 0, b"\x00\x01\x00"), "MQTT-2.2.3"),        # 3.1.1 PUBACK too long
    (m.frame(0x30, b"\xff\xff\xff\xff"), "MQTT-2.2.3"),            # 5-byte remaining length
    (m.pubrel(1, flags=0), "MQTT-2.2.2-1"),                        # reserved flags
])
def test_malformed_server_bytes_311(bad, rule):
    c = connected()
    c.publish("t", b"", qos=1)
    c.data_to_send()
    before = m.publish("ok", b"1")
    events = c.receive_data(before + bad + m.puback(1), 1.0)
    assert events[0] == Message("ok", b"1", 0, False, False, None, None)
    assert [type(e) for e in events[1:]] == [Disconnected]
    assert rule in events[1].reason and events[1].reason_code in (0x81, 0x82, 0x90)
    assert c.state == "disconnected" and c.inflight == 1     # the PUBACK after it is not read
    assert c.receive_data(m.puback(1), 2.0) == []             # nothing more is read


def test_malformed_5_gets_a_disconnect_with_the_reason():
    c = connected(5)
    events = c.receive_data(m5.puback5(1, 0x05), 1.0)     # a reason PUBACK cannot carry
    assert events[0].reason_code == 0x82
    assert [(p.type, p.reason) for p in sent(c)] == [(m.DISCONNECT, 0x82)]


@pytest.mark.parametrize("protocol", [4, 5])
def test_pubcomp_before_pubrec_is_a_protocol_error(protocol):
    """A PUBCOMP for a QoS 2 publish still awaiting its PUBREC (no PUBREL sent) does not
    end it: the server broke the protocol."""
    c = connected(protocol)
    req = c.publish("t", b"x", qos=2)
    sent(c)
    events = c.receive_data(m5.pubcomp5(1) if protocol == 5 else m.pubcomp(1), 1.0)
    assert [type(e) for e in events] == [Disconnected]
    assert events[0].reason_code == 0x82 and "before its PUBREC" in events[0].reason
    assert c.state == "disconnected" and c.inflight == 1 and req.packet_id == 1
    assert [(p.type, p.reason) for p in sent(c)] == ([(m.DISCONNECT, 0x82)] if protocol == 5
                                                     else [])


@pytest.mark.parametrize("protocol", [4, 5])
def test_session_present_in_answer_to_a_clean_start_is_a_protocol_error(protocol):
    """MQTT-3.2.2-4: a client with no session that gets Session Present 1 closes."""
    c = Connection("c", protocol)              # clean_start=True
    c.connect(0.0)
    sent(c)
    events = c.receive_data(m5.connack5(True) if protocol == 5 else m.connack(True), 0.0)
    assert [type(e) for e in events] == [Disconnected]
    assert events[0].reason_code == 0x82 and "Session Present 1" in events[0].reason
    assert c.state == "disconnected"
    assert [(p.type, p.reason) for p in sent(c)] == ([(m.DISCONNECT, 0x82)] if protocol == 5
                                                     else [])
    d = Connection("c", protocol, clean_start=False)
    d.connect(0.0)
    sent(d)
    assert d.receive_data(m5.connack5(True) if protocol == 5 else m.connack(True),
                          0.0) == [Connected(True, 0, None)]


def test_any_split_of_the_stream_gives_the_same_events():
    stream = (m.connack() + m.publish("a", b"x" * 300, qos=1, packet_id=3) + m.puback(1)
              + m.publish("b", b"", qos=2, packet_id=4) + m.pubrel(4) + m.pingresp())

    def run(chunks):
        c = Connection("c", 4)
        c.connect(0.0)
        c.data_to_send()
        c.publish("t", b"", qos=1)
        events, out = [], b""
        for chunk in chunks:
            events += c.receive_data(chunk, 1.0)
            out += c.data_to_send()
        return [repr(e) for e in events], out

    whole = run([stream])
    assert whole == run([stream[i:i + 1] for i in range(len(stream))])
    assert whole == run([stream[:7], stream[7:200], stream[200:]])
    assert len(whole[0]) == 4      # Connected, Message, Acked, Message


def test_many_pubacks_in_one_read():
    c = connected(max_inflight=50)
    reqs = [c.publish("t", b"", qos=1) for i in range(50)]
    c.data_to_send()
    events = c.receive_data(b"".join(m.puback(i) for i in range(1, 51)), 1.0)
    assert events == [Acked(r, 0) for r in reqs]


# -- keepalive --------------------------------------------------------------------------------

def test_pingreq_when_nothing_went_out_even_while_messages_come_in():
    c = connected(keepalive=10)
    assert c.next_deadline() == 10.0
    for t in range(1, 10):
        c.receive_data(m.publish("a", b"m"), float(t))
        assert c.tick(float(t)) == [] and c.data_to_send(float(t)) == b""
    c.tick(10.0)
    assert c.data_to_send(10.0) == m.pingreq()
    assert c.next_deadline() == 20.0                         # the PINGRESP is due
    c.receive_data(m.pingresp(), 11.0)
    assert c.next_deadline() == 20.0                         # min(sent 10, received 11) + 10


def test_pingreq_when_nothing_came_in():
    c = connected(keepalive=10)
    for t in range(1, 11):
        c.publish("t", b"", qos=0)
        c.data_to_send(float(t))
    c.tick(10.0)
    assert c.data_to_send(10.0) == m.pingreq()


def test_no_pingresp_is_a_dead_link():
    c = connected(keepalive=10)
    c.publish("t", b"", qos=1)
    c.data_to_send(0.0)
    c.tick(10.0)
    assert c.data_to_send(10.0) == m.pingreq()
    assert c.tick(19.9) == []
    assert c.tick(20.0) == [PingTimeout()]
    assert c.state == "disconnected" and c.inflight == 1
    c.connection_lost()                                      # the loop's call: no harm
    assert c.state == "disconnected"


def test_pingreq_behind_bytes_still_moving_is_not_late():
    """On a slow link the PINGREQ may wait behind other bytes in the loop's buffer: while bytes
    keep leaving (``moved_at``, set by the loop) or coming in, its PINGRESP is not late; a
    keepalive with neither is a dead link."""
    c = connected(keepalive=10)
    c.publish("t", b"", qos=1)
    c.data_to_send(0.0)
    c.tick(10.0)
    assert c.data_to_send(10.0) == m.pingreq()
    c.moved_at = 14.0                       # the transport took more of the buffer
    assert c.tick(20.0) == [] and c.state == "connected"
    assert c.next_deadline() == 24.0
    c.receive_data(m.suback(99, [0])[:1], 22.0)      # a byte of something coming in
    assert c.tick(24.0) == [] and c.next_deadline() == 32.0
    assert c.tick(32.0) == [PingTimeout()] and c.state == "disconnected"


def test_keepalive_0_never_pings():
    c = connected(keepalive=0)
    assert c.next_deadline() is None and c.tick(1e6) == [] and c.data_to_send() == b""


# -- reconnection and retransmission ------------------------------------------------------------

def test_resent_with_dup_in_order_after_reconnect():
    c = connected(max_inflight=4, clean_start=False)
    a = c.publish("t", b"a", qos=1)
    b = c.publish("t", b"b", qos=2)
    s = c.subscribe([("f", 1)])
    d = c.publish("t", b"d", qos=2)
    e = c.publish("t", b"e", qos=1)
    c.publish("t", b"z", qos=1)        # queued: the window is 4
    sent(c)
    c.receive_data(m.pubrec(2), 1.0)       # b: the server has it
    c.connection_lost()
    assert c.state == "disconnected"
    c.publish("t", b"late", qos=0)  # kept in the queue while disconnected
    c.connect(2.0)
    assert [p.type for p in sent(c)] == [m.CONNECT]
    assert c.receive_data(m.connack(session_present=True), 2.0) == [Connected(True, 0, None)]
    got = [(p.type, pid(p), getattr(p, "dup", None), getattr(p, "payload", None))
           for p in sent(c)]
    assert got == [(m.PUBLISH, 1, True, b"a"), (m.PUBREL, 2, None, None),
                   (m.SUBSCRIBE, 3, None, None), (m.PUBLISH, 4, True, b"d"),
                   (m.PUBLISH, 5, True, b"e")]
    c.receive_data(m.puback(1), 3.0)
    assert [(p.packet_id, p.payload, p.dup) for p in sent(c)] == [(6, b"z", False),
                                                                 (None, b"late", False)]
    assert [a.packet_id, b.packet_id, s.packet_id, d.packet_id, e.packet_id] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("protocol", [4, 5])
def test_session_present_0_sends_what_was_unanswered_as_new_requests(protocol):
    """No session on the server (Session Present 0): ours is discarded, and every request
    not answered goes out again as a new one, in order, before the queued ones: PUBLISH
    with DUP=0 and a new packet id, a QoS 2 publish past PUBREC from its PUBLISH too (at
    least once), SUBSCRIBE again. The server's QoS 2 ids awaiting PUBREL are forgotten."""
    v5 = protocol == 5
    pubrec, puback, pubcomp = ((m5.pubrec5, m5.puback5, m5.pubcomp5) if v5
                               else (m.pubrec, m.puback, m.pubcomp))
    publish = m5.publish5 if v5 else m.publish
    c = connected(protocol, max_inflight=3)
    a = c.publish("t", b"a", qos=2)
    s = c.subscribe([("f", 1)])
    b = c.publish("t", b"b", qos=1)
    c.publish("t", b"c", qos=1)
    z = c.publish("t", b"z", qos=1)     # queued: the window is 3
    sent(c)
    c.receive_data(pubrec(1), 0.0)       # a: the server has it, PUBREL sent
    assert [p.type for p in sent(c)] == [m.PUBREL]
    c.receive_data(puback(3), 0.0)       # b answered; z goes out (5)
    assert [(pid(p), p.payload) for p in sent(c)] == [(5, b"z")]
    c.receive_data(publish("in", b"", qos=2, packet_id=9), 0.0)
    c.connection_lost()
    c.connect(1.0)
    sent(c)
    assert c.receive_data(m5.connack5() if v5 else m.connack(), 1.0) == [
        Connected(False, 0, None)]
    got = [(p.type, pid(p), getattr(p, "dup", None), getattr(p, "payload", None))
           for p in sent(c)]
    assert got == [(m.PUBLISH, 6, False, b"a"), (m.SUBSCRIBE, 7, None, None),
                   (m.PUBLISH, 8, False, b"c"), (m.PUBLISH, 9, False, b"z")]
    assert a.stage == 0 and c.inflight == 4 and c.queued == 0
    assert c.receive_data(pubrec(6), 1.0) == []
    assert [(p.type, pid(p)) for p in sent(c)] == [(m.PUBREL, 6)]
    assert c.receive_data(pubcomp(6), 1.0) == [Acked(a, 0)]
    assert [z.packet_id, s.packet_id, b.packet_id] == [9, 7, 3]
    events = c.receive_data(publish("in", b"new", qos=2, packet_id=9), 1.0)
    assert [(type(e), e.payload) for e in events] == [(Message, b"new")]


def test_resending_keeps_to_a_smaller_window():
    """After a reconnect the window may be smaller (the server's Receive Maximum, or a state
    loaded with a smaller max_inflight): only that many are sent again at once, the rest in
    order as acknowledgements make room, then the queued requests."""
    c = connected(5, clean_start=False, max_inflight=10)
    reqs = [c.publish("t", b"%d" % i, qos=1 if i != 2 else 2) for i in range(6)]
    s = c.subscribe([("f", 1)])
    c.publish("t", b"6", qos=1)
    assert len(sent(c)) == 8
    c.connection_lost()
    c.publish("t", b"late", qos=1)
    c.connect(1.0)
    sent(c)
    c.receive_data(m5.connack5(True, props={m5.RECEIVE_MAXIMUM: 2}), 1.0)
    assert c.window == 2
    assert [(pid(p), p.dup) for p in sent(c)] == [(1, True), (2, True)]
    assert c.publish("t", b"later", qos=0) and sent(c) == []     # behind them, in order
    c.receive_data(m5.puback5(2), 1.0)
    assert [(pid(p), p.dup) for p in sent(c)] == [(3, True)]
    c.receive_data(m5.pubrec5(3), 1.0)
    assert [(p.type, pid(p)) for p in sent(c)] == [(m.PUBREL, 3)]
    c.receive_data(m5.puback5(1) + m5.pubcomp5(3), 1.0)
    assert [(pid(p), p.dup) for p in sent(c)] == [(4, True), (5, True)]
    events = c.receive_data(m5.puback5(4) + m5.puback5(5), 1.0)
    assert [e.request for e in events] == reqs[3:5]
    got = [(p.type, pid(p), getattr(p, "dup", None), getattr(p, "payload", None))
           for p in sent(c)]
    assert got == [(m.PUBLISH, 6, True, b"5"), (m.SUBSCRIBE, 7, None, None),
                   (m.PUBLISH, 8, True, b"6")]
    c.receive_data(m5.puback5(6) + m5.suback5(7, [1]), 1.0)
    assert [(p.packet_id, p.dup, p.payload) for p in sent(c)] == [(9, False, b"late"),
                                                                 (None, False, b"later")]
    assert s.packet_id == 7 and c.inflight == 2

    saved = connected(4, clean_start=False, max_inflight=5)
    for i in range(5):
        saved.publish("t", b"%d" % i, qos=1)
    sent(saved)
    c = Connection.load(saved.save(), max_inflight=2)      # a smaller window on load
    c.connect(0.0)
    sent(c)
    c.receive_data(m.connack(session_present=True), 0.0)
    assert [(pid(p), p.dup) for p in sent(c)] == [(1, True), (2, True)]
    c.receive_data(m.puback(1), 0.0)
    assert [(pid(p), p.dup) for p in sent(c)] == [(3, True)]


def test_qos0_not_handed_out_before_the_loss_is_sent_after():
    c = connected()
    c.publish("t", b"lost?")
    c.connection_lost()
    assert c.queued == 1 and c.acked_qos0() == []
    c.connect(1.0)
    c.data_to_send()
    c.receive_data(m.connack(), 1.0)
    assert c.data_to_send() == m.publish("t", b"lost?")


def test_requests_made_while_connecting_wait_for_connack():
    c = Connection("c", 4)
    c.connect(0.0)
    c.publish("t", b"early", qos=1)
    assert c.data_to_send() == m.connect("c")
    c.receive_data(m.connack(), 1.0)
    assert c.data_to_send() == m.publish("t", b"early", qos=1, packet_id=1)


# -- disconnect ---------------------------------------------------------------------------------

def test_disconnect_is_sent_last_then_closed():
    c = connected(5)
    c.publish("t", b"x")
    c.disconnect(0x04)
    c.publish("t", b"after", qos=1)        # kept, not sent
    assert [(p.type, p.reason) for p in sent(c)] == [(m.PUBLISH, None), (m.DISCONNECT, 0x04)]
    assert c.state == "closed" and c.queued == 1
    q0 = c.acked_qos0()
    assert [(type(e), e.request.payload) for e in q0] == [(Acked, b"x")]
    assert c.receive_data(m5.puback5(1), 1.0) == []      # closed: nothing more is read
    c.connect(2.0)                          # closed -> connecting
    assert c.state == "connecting"
    d = Connection("c", 4)
    d.disconnect()
    assert d.state == "closed"


def test_disconnect_while_the_link_is_down_before_it_went_out():
    c = connected()
    c.disconnect()
    c.connection_lost()
    assert c.state == "closed"


# -- state across processes ---------------------------------------------------------------------

def _busy_connection() -> Connection:
    c = Connection("gw-1", 5, clean_start=False, keepalive=30, username="dev",
                   properties={0x11: 3600, 0x26: [("site", "north")]}, max_inflight=2)
    c.connect(0.0)
    c.data_to_send()
    c.receive_data(m5.connack5(), 0.0)
    c.publish("s/1", b"\x00\x01", qos=1, token="r1")
    c.publish("s/2", b"two", qos=2, token=7, properties={m5.CORRELATION_DATA: b"\xff"})
    c.publish("s/3", b"three", qos=1, token=object())      # not a JSON token: left out
    c.subscribe([("cmd/#", 2)], token="sub")
    c.receive_data(m5.publish5("in", b"", qos=2, packet_id=9), 0.0)
    c.receive_data(m5.pubrec5(2), 0.0)
    c.data_to_send()
    return c


def test_state_golden_file():
    doc = _busy_connection().save()
    golden = json.loads((GOLDEN / "state-v1.json").read_text())
    assert doc == golden
    assert json.loads(json.dumps(doc)) == doc
    assert Connection.load(golden).save() == golden


def test_loaded_state_resumes_in_another_connection():
    state = json.loads(json.dumps(_busy_connection().save()))
    c = Connection.load(state, password=b"secret")
    assert (c.client_id, c.protocol, c.inflight, c.queued, c.password) == (
        "gw-1", 5, 2, 2, b"secret")
    c.connect(5.0)
    (p,) = sent(c)
    assert (p.clean_start, p.password, p.properties[m5.SESSION_EXPIRY]) == (False, b"secret", 3600)
    c.receive_data(m5.connack5(session_present=True), 5.0)
    got = [(p.type, p.packet_id, getattr(p, "payload", None)) for p in sent(c)]
    assert got == [(m.PUBLISH, 1, b"\x00\x01"), (m.PUBREL, 2, None)]
    # The server's QoS 2 message given out before the restart is not given out again.
    assert c.receive_data(m5.publish5("in", b"", qos=2, dup=True, packet_id=9), 5.0) == []
    assert [(p.type, p.packet_id) for p in sent(c)] == [(m.PUBREC, 9)]
    events = c.receive_data(m5.puback5(1) + m5.pubcomp5(2), 6.0)
    assert [(e.request.token, e.request.payload) for e in events] == [("r1", b"\x00\x01"),
                                                                     (7, b"two")]
    assert events[1].request.properties == {m5.CORRELATION_DATA: b"\xff"}
    got = [(p.type, p.packet_id) for p in sent(c)]
    assert got == [(m.PUBLISH, 3), (m.SUBSCRIBE, 4)]


@pytest.mark.parametrize("change, what", [
    ({"format": "other"}, "not a client state"),
    ({"version": 2}, "version 2"),
    ({"inflight": [{"kind": "publish", "topic": "t", "payload": "", "qos": 1,
                    "retain": False}]}, "no packet_id"),
    ({"queued": [{"kind": "nope"}]}, "unknown request kind"),
    ({"queued": [{"kind": "publish", "topic": "t", "payload": "!!", "qos": 0,
                  "retain": False}]}, "state file request"),
    ({"incoming_qos2": [float("inf")]}, "incoming_qos2"),      # OverflowError from int()
    ({"incoming_qos2": [[1]]}, "incoming_qos2"),               # TypeError
    ({"incoming_qos2": [70000]}, "incoming_qos2"),             # taken as it was
])
def test_bad_state_is_refused_with_a_reason(change, what):
    doc = {**Connection("c", 4).save(), **change}
    with pytest.raises(ValueError, match=what):
        Connection.load(doc)


# -- no I/O ---------------------------------------------------------------------------------------

def test_the_sans_io_modules_import_no_io():
    root = Path(__file__).resolve().parents[2] / "edgebroker" / "client"
    banned = {"socket", "selectors", "threading", "time", "ssl", "asyncio", "select", "os"}
    for name in ("connection.py", "events.py", "requests.py", "incoming.py", "state.py",
                 "states.py", "resume.py"):
        tree = ast.parse((root / name).read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
        assert not imported & banned, f"{name} imports {imported & banned}"


def test_disconnect_and_loss_before_connack():
    c = Connection("c", 5)
    c.connect(0.0)
    c.disconnect(0x04)
    assert [(p.type, getattr(p, "reason", None)) for p in sent(c)] == [
        (m.CONNECT, None), (m.DISCONNECT, 0x04)]
    assert c.state == "closed"
    c = Connection("c", 4)
    c.connect(0.0)
    c.publish("t", b"q", qos=1)
    c.connection_lost()
    assert (c.state, c.queued, c.data_to_send()) == ("disconnected", 1, b"")


def test_incoming_qos2_beyond_our_receive_maximum_5():
    c = connected(5, properties={m5.RECEIVE_MAXIMUM: 2})
    c.receive_data(m5.publish5("a", b"", qos=2, packet_id=1)
                   + m5.publish5("a", b"", qos=2, packet_id=2), 1.0)
    events = c.receive_data(m5.publish5("a", b"", qos=2, packet_id=3), 1.0)
    assert [(type(e), e.reason_code) for e in events] == [(Disconnected, 0x93)]


def test_subscriptions_made_again_when_the_server_has_no_session():
    c = connected(resubscribe=True, clean_start=False)
    c.subscribe([("a/#", 1), ("b", 2), ("no", 1)])
    (p,) = sent(c)
    c.receive_data(m.suback(pid(p), (1, 2, 0x80)), 1.0)      # "no" refused
    c.unsubscribe(["b"])
    (p,) = sent(c)
    c.receive_data(m.unsuback(pid(p)), 1.0)
    c.publish("t", b"x", 1)                                   # in flight across the losses
    sent(c)
    c.connection_lost()
    c.connect(2.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=True), 2.0)     # the session is kept: no need
    assert [p.type for p in sent(c)] == [m.PUBLISH]
    c.connection_lost()
    c.connect(3.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=False), 3.0)    # forgotten: made again
    data = c.data_to_send()
    frames = m.split_frames(bytearray(data))
    # The subscriptions first; the publish not answered follows as a new one (no session).
    assert [f.type for f in frames] == [m.SUBSCRIBE, m.PUBLISH] and not frames[1].dup
    assert data.startswith(m.subscribe(pid(frames[0]), [("a/#", 1)]))
    (event,) = c.receive_data(m.suback(pid(frames[0]), (1,)), 3.0)
    assert type(event) is Subscribed and event.granted == [1]
    assert event.request.token == RESUBSCRIBE
    # Connection's default (the bridge subscribes on Connected itself): not made again.
    c = connected()
    c.subscribe([("a/#", 1)])
    (p,) = sent(c)
    c.receive_data(m.suback(pid(p), (1,)), 1.0)
    c.connection_lost()
    c.connect(2.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=False), 2.0)
    assert sent(c) == []
    # An UNSUBSCRIBE in flight across the loss is sent again; its filter is not subscribed.
    c = connected(resubscribe=True)
    c.subscribe([("a/#", 1), ("b", 1)])
    (p,) = sent(c)
    c.receive_data(m.suback(pid(p), (1, 1)), 1.0)
    c.unsubscribe(["a/#"])
    (p,) = sent(c)
    c.connection_lost()
    c.connect(2.0)
    c.data_to_send()
    c.receive_data(m.connack(session_present=False), 2.0)
    data = c.data_to_send()
    frames = m.split_frames(bytearray(data))
    assert [f.type for f in frames] == [m.SUBSCRIBE, m.UNSUBSCRIBE]
    assert data.startswith(m.subscribe(pid(frames[0]), [("b", 1)]))


@pytest.mark.parametrize("protocol", [4, 5])
def test_max_packet_size_bounds_what_the_server_may_send(protocol):
    c = Connection("c", protocol, max_packet_size=64)
    c.connect(0.0)
    (connect,) = sent(c)
    if protocol == 5:
        assert connect.properties[0x27] == 64        # Maximum Packet Size told to the server
    c.receive_data(m5.connack5() if protocol == 5 else m.connack(False), 0.0)
    # A header saying 256 MiB follow: refused at once, nothing buffered (a PUBLISH is read
    # past instead: test_oversized.py).
    (event,) = c.receive_data(b"\x90\xff\xff\xff\x7f", 0.0)
    assert type(event) is Disconnected and event.reason_code == 0x95
    assert "exceeds the maximum packet size 64" in event.reason
    with pytest.raises(ClientError, match="max_packet_size 1 is outside"):
        Connection("c", protocol, max_packet_size=1)


@pytest.mark.parametrize("qos, ack", [(1, m5.puback5), (2, m5.pubrec5)])
def test_a_refusal_code_5_0_does_not_list_for_the_ack_is_taken_as_a_refusal(qos, ack):
    """Mosquitto 2.0 answers 0x95 to a message over its message_size_limit, in a PUBACK (or
    PUBREC) that MQTT 5.0 does not let carry it: the client takes it as the server's refusal
    (``unlisted``), not as a protocol error; listed codes are not marked."""
    c = connected(5)
    big = c.publish("t", b"x" * 50, qos=qos)
    denied = c.publish("t", b"y", qos=qos)
    after = c.publish("t", b"z", qos=qos)
    sent(c)
    events = c.receive_data(ack(1, 0x95) + ack(2, 0x87), 1.0)
    assert events == [Acked(big, 0x95, True), Acked(denied, 0x87, False)]
    assert c.state == "connected" and c.inflight == 1 and sent(c) == []   # no PUBREL either
    if qos == 2:
        events = c.receive_data(m5.pubrec5(3), 1.0)
        assert [(p.type, p.packet_id) for p in sent(c)] == [(m.PUBREL, 3)]
        events = c.receive_data(m5.pubcomp5(3), 1.0)
    else:
        events = c.receive_data(m5.puback5(3), 1.0)
    assert events == [Acked(after, 0, False)]


def test_the_broker_keeps_to_the_listed_codes_in_a_subscribers_puback(broker):
    """The leniency is the client's: a 5.0 subscriber that answers the broker's PUBLISH with
    PUBACK 0x95 still broke the protocol (DISCONNECT 0x82)."""
    srv = broker()
    sub = m5.RawClient5(srv.host, srv.port)
    try:
        assert sub.connect("strict-sub").reason == 0
        sub.subscribe("t", qos=1)
        srv.client("pub").publish("t", b"x", qos=1)
        p = sub.expect(m5.PUBLISH)
        sub.send(m5.puback5(p.packet_id, 0x95))
        end = sub.expect(m5.DISCONNECT)
        assert end.reason == 0x82, end
    finally:
        sub.close()
