"""QoS 2 over MQTT 3.1.1 to a real Mosquitto: it takes ``max_inflight_messages`` (20 by default)
unfinished QoS 2 messages from one client and, from a 3.1.1 client, answers one more with a
plain PUBREC and drops it. The client library keeps at most ``max_qos2_inflight`` of them
unfinished (20 by default over 3.1/3.1.1) whatever ``max_inflight`` says: every message
arrives."""

from __future__ import annotations

import pytest

from bridge.helpers import Received
from edgebroker.client.connection import Connection
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import ClientError, make_publish
from edgebroker.mqtt import packets as P

N = 200


def _publish_all(port: int, topic: str, protocol: int = 4, **options) -> list:
    loop = EventLoop("127.0.0.1", port, client_id=f"q2-{topic}", protocol=protocol, **options)
    try:
        result = loop.run([make_publish(topic, str(i).encode(), qos=2) for i in range(N)],
                          timeout=30)
    finally:
        loop.shutdown()
    assert result.complete, result
    return [event.reason_code for event in result.done]


def test_the_defaults_lose_no_qos_2_message_to_a_default_mosquitto(mosquitto_broker, paho):
    # Mosquitto's defaults: max_inflight_messages 20 (max_queued_messages 1000, more than N).
    remote = mosquitto_broker()
    sub = paho(remote.port, client_id="q2-sub")
    assert sub.subscribe("d/#", 1) == [1]
    got = Received(sub)
    # EventLoop's defaults: protocol 4 (3.1.1), max_inflight 100.
    assert _publish_all(remote.port, "d/311") == [0] * N
    assert got.wait_distinct(N, 30), f"{len(got.seen)} of {N} arrived"
    assert got.duplicates() == []


def test_max_qos2_inflight_follows_a_lower_mosquitto_limit(mosquitto_broker, paho):
    remote = mosquitto_broker(extra=["max_inflight_messages 5"])
    sub = paho(remote.port, client_id="q2-sub5")
    assert sub.subscribe("d/#", 1) == [1]
    got = Received(sub)
    assert _publish_all(remote.port, "d/five", max_qos2_inflight=5) == [0] * N
    assert got.wait_distinct(N, 30), f"{len(got.seen)} of {N} arrived"


def test_the_qos_2_cap_holds_what_follows_in_order():
    """Sans-I/O: over 3.1.1 the 21st QoS 2 publish waits (and the QoS 1 one behind it) until a
    PUBCOMP, and the QoS 1 one until another; over 5.0 only the window (and the server's
    Receive Maximum) counts."""
    conn = Connection("c", P.PROTOCOL_311)
    conn.connect(0.0)
    conn.data_to_send()
    conn.receive_data(b"\x20\x02\x00\x00", 0.0)
    assert conn.state == "connected"
    sent = [conn.publish("t", b"x", 2) for _ in range(21)]
    behind = conn.publish("t", b"y", 1)
    assert conn.inflight == 20 and conn.queued == 2 and conn.qos2_full
    first = sent[0].packet_id
    conn.receive_data(bytes([0x50, 2, 0, first]), 0.0)         # PUBREC
    assert conn.inflight == 20 and conn.qos2_full
    conn.receive_data(bytes([0x70, 2, 0, first]), 0.0)         # PUBCOMP
    # the 21st goes; the QoS 1 one waits while 20 QoS 2 are unfinished again
    assert sent[20].packet_id is not None and behind.packet_id is None
    conn.receive_data(bytes([0x50, 2, 0, sent[1].packet_id]), 0.0)
    conn.receive_data(bytes([0x70, 2, 0, sent[1].packet_id]), 0.0)
    assert behind.packet_id is not None
    assert conn.queued == 0 and conn.inflight == 20

    v5 = Connection("c", P.PROTOCOL_5)
    v5.connect(0.0)
    v5.data_to_send()
    v5.receive_data(b"\x20\x03\x00\x00\x00", 0.0)
    for _ in range(50):
        v5.publish("t", b"x", 2)
    assert v5.inflight == 50 and not v5.qos2_full


def test_qos_1_behind_20_unfinished_qos_2_is_not_lost_at_a_default_mosquitto(mosquitto_broker,
                                                                            paho):
    """While 20 QoS 2 messages from a client await their PUBREL, Mosquitto answers its QoS 1
    PUBLISH with a plain PUBACK (3.1.1) and drops it: a QoS 1 publish waits while the QoS 2
    cap is reached (a 3.1.1 bridge with a QoS 1 and a QoS 2 `out` rule lost some of every
    drained backlog)."""
    remote = mosquitto_broker()
    sub = paho(remote.port, client_id="q1-sub")
    assert sub.subscribe("m/#", 1) == [1]
    got = Received(sub)
    loop = EventLoop("127.0.0.1", remote.port, client_id="q1-mixed", protocol=4)
    try:
        requests = [make_publish("m/two", b"%d" % i, qos=2) for i in range(20)]
        requests += [make_publish("m/one", b"%d" % (100 + i), qos=1) for i in range(N)]
        result = loop.run(requests, timeout=30)
    finally:
        loop.shutdown()
    assert result.complete, result
    assert got.wait_distinct(N + 20, 30), f"{len(got.seen)} of {N + 20} arrived"


def test_a_qos_1_publish_waits_while_the_qos_2_cap_is_reached():
    """Sans-I/O, over 3.1.1: with 20 QoS 2 publishes unfinished a QoS 1 one waits (Mosquitto
    would drop it), until a PUBCOMP frees a place."""
    conn = Connection("c", P.PROTOCOL_311)
    conn.connect(0.0)
    conn.data_to_send()
    conn.receive_data(b"\x20\x02\x00\x00", 0.0)
    sent = [conn.publish("t", b"x", 2) for _ in range(20)]
    behind = conn.publish("t", b"y", 1)
    assert conn.inflight == 20 and conn.queued == 1 and behind.packet_id is None
    first = sent[0].packet_id
    conn.receive_data(bytes([0x50, 2, 0, first]), 0.0)         # PUBREC
    conn.receive_data(bytes([0x70, 2, 0, first]), 0.0)         # PUBCOMP
    assert behind.packet_id is not None and conn.queued == 0


def test_max_qos2_inflight_is_checked_and_kept_in_the_state_file():
    with pytest.raises(ClientError, match="max_qos2_inflight 0 is outside 1..65535"):
        Connection("c", max_qos2_inflight=0)
    doc = Connection("c", max_qos2_inflight=3).save()
    assert doc["max_qos2_inflight"] == 3
    assert Connection.load(doc).max_qos2_inflight == 3
    assert "max_qos2_inflight" not in Connection("c").save()
