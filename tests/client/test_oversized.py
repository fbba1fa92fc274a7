"""A PUBLISH from the server over the client's max_packet_size: read past (its payload never
held), acknowledged and given out as ``Oversized``; the connection goes on. The sans-I/O
connection fed any split, then the event loop against real brokers (edgebroker, Mosquitto)."""

from __future__ import annotations

import time
import tracemalloc

import pytest

import mqttraw as m
import mqttraw5 as m5
from edgebroker.client.connection import Connection
from edgebroker.client.events import Disconnected, Message, Oversized, Subscribed
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import make_publish, make_subscribe

LIMIT = 1000


def connected(protocol: int = 4, **kw) -> Connection:
    c = Connection("c", protocol, max_packet_size=LIMIT, **kw)
    c.connect(0.0)
    c.data_to_send()
    c.receive_data(m5.connack5() if protocol == 5 else m.connack(False), 0.0)
    return c


def feed(c: Connection, data: bytes, step: int) -> list:
    events = []
    for i in range(0, len(data), step):
        events += c.receive_data(data[i:i + step], 0.0)
    return events


def kinds(events) -> list:
    return [(type(e).__name__, e.topic, e.qos, e.packet_id) for e in events]


@pytest.mark.parametrize("step", [1, 3, 700, 1 << 20])
@pytest.mark.parametrize("protocol", [4, 5])
def test_an_oversized_publish_is_read_past_and_acknowledged_in_order(protocol, step):
    pub = m5.publish5 if protocol == 5 else m.publish
    long_topic = "big/" + "t" * 400
    big = [pub(long_topic, b"x" * 5000, qos=1, packet_id=2), pub("big0", b"y" * 3000),
           pub("big2", b"z" * 2000, qos=2, packet_id=4)]
    data = (pub("a", b"1", qos=1, packet_id=1) + big[0] + pub("b", b"2", qos=2, packet_id=3)
            + big[1] + big[2] + pub("c", b"3", qos=1, packet_id=5))
    c = connected(protocol)
    events = feed(c, data, step)
    assert kinds(events) == [("Message", "a", 1, 1),
                             ("Oversized", long_topic[:256] + "...", 1, 2),
                             ("Message", "b", 2, 3), ("Oversized", "big0", 0, None),
                             ("Oversized", "big2", 2, 4), ("Message", "c", 1, 5)]
    assert [e.size for e in events if type(e) is Oversized] == list(map(len, big))
    assert all(e.limit == LIMIT for e in events if type(e) is Oversized)
    assert c.state == "connected" and c.oversized_dropped == 3
    acks = m.split_frames(bytearray(c.data_to_send()))
    assert [(a.type, a.packet_id) for a in acks] == [
        (m.PUBACK, 1), (m.PUBACK, 2), (m.PUBREC, 3), (m.PUBREC, 4), (m.PUBACK, 5)]
    # QoS 2: given out once however often it comes; PUBREL ends it.
    assert c.receive_data(pub("big2", b"z" * 2000, qos=2, packet_id=4, dup=True), 0.0) == []
    assert m.split_frames(bytearray(c.data_to_send()))[0].type == m.PUBREC
    c.receive_data(m.pubrel(4), 0.0)
    assert m.split_frames(bytearray(c.data_to_send()))[0].type == m.PUBCOMP


def test_with_auto_ack_off_it_is_acknowledged_by_ack_in_its_turn():
    c = connected(auto_ack=False)
    first, big = c.receive_data(m.publish("a", b"1", qos=1, packet_id=1)
                                + m.publish("big", b"x" * 5000, qos=1, packet_id=2), 0.0)
    assert type(big) is Oversized and c.unacked == 2 and c.data_to_send() == b""
    assert c.ack(first) and c.ack(big) and not c.ack(big)
    acks = m.split_frames(bytearray(c.data_to_send()))
    assert [(a.type, a.packet_id) for a in acks] == [(m.PUBACK, 1), (m.PUBACK, 2)]


def test_its_body_is_never_held():
    c = connected()
    (event,) = c.receive_data(m.publish("t", b"", qos=1, packet_id=9), 0.0)
    header = b"\x32\xff\xff\xff\x7f" + b"\x00\x01t\x00\x07"    # 256 MiB follow
    chunk = bytes(65536)
    tracemalloc.start()
    try:
        assert c.receive_data(header, 0.0) == []
        for _ in range(200):      # 13 MB of its body
            assert c.receive_data(chunk, 0.0) == []
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    assert c.state == "connected" and c.data_to_send() == m.puback(9)


def test_what_is_not_read_past_still_ends_the_connection():
    # Another packet type.
    c = connected()
    (event,) = c.receive_data(b"\x90\xff\xff\xff\x7f", 0.0)
    assert type(event) is Disconnected and event.reason_code == 0x95
    # A 5.0 client taking topic aliases (the skipped properties might set one).
    c = connected(5, properties={0x22: 10})
    (event,) = c.receive_data(m5.publish5("big", b"x" * 5000, qos=1, packet_id=1), 0.0)
    assert type(event) is Disconnected and event.reason_code == 0x95
    # A body too short to hold its packet identifier.
    c = Connection("c", max_packet_size=4)
    c.connect(0.0)
    c.receive_data(m.connack(False), 0.0)
    (event,) = c.receive_data(m.packet(m.PUBLISH, 2, b"\x00\x00\x01"), 0.0)
    assert type(event) is Disconnected and "packet identifier" in event.reason


@pytest.mark.parametrize("protocol", [4, 5])
def test_the_event_loop_gets_it_and_stays_connected(remote, protocol, uid):
    sub = EventLoop(remote.host, remote.port, client_id=f"{uid}s", protocol=protocol,
                    max_packet_size=LIMIT, clean_start=False)
    pub = EventLoop(remote.host, remote.port, client_id=f"{uid}p", protocol=protocol)
    try:
        res = sub.run([make_subscribe([(f"{uid}/#", 1)])], timeout=10)
        assert res.complete and type(res.done[0]) is Subscribed, res.events
        res = pub.run([make_publish(f"{uid}/big", b"x" * 5000, qos=1),
                       make_publish(f"{uid}/small", b"ok", qos=1)], timeout=10)
        assert res.complete, res
        got = []
        deadline = time.monotonic() + 10
        while not any(type(e) is Message for e in got):
            assert time.monotonic() < deadline, got
            event = sub.poll(deadline - time.monotonic())
            if event is not None:
                got.append(event)
        if protocol == 5:     # told the Maximum Packet Size: the server drops it itself
            assert [type(e) for e in got] == [Message], got
        else:
            assert [type(e) for e in got] == [Oversized, Message], got
            assert got[0].topic == f"{uid}/big" and got[0].size > LIMIT
        assert got[-1].payload == b"ok" and sub.conn.state == "connected"
    finally:
        sub.close()
        pub.close()
