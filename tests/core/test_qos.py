"""QoS 0/1/2 in both directions, downgrade, packet ids, inbound exactly-once, inflight window."""

import pytest

import mqttraw as m
from mqttraw import PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL


def pair(srv, uid, sub_qos, topic=None):
    topic = topic or f"{uid}/t"
    sub = srv.client(f"{uid}-sub")
    assert sub.subscribe(topic, qos=sub_qos).codes == [sub_qos]
    pub = srv.client(f"{uid}-pub")
    return sub, pub, topic


def test_qos0_roundtrip(srv, uid):
    sub, pub, t = pair(srv, uid, 0)
    pub.publish(t, b"hello", qos=0)
    p = sub.recv_publish()
    assert (p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id) == (t, b"hello", 0, False, False, None)


def test_qos1_inbound_puback_with_same_packet_id(srv, uid):
    c = srv.client(uid)
    for pid in (1, 7, 65535):
        c.send(m.publish(f"{uid}/t", b"x", qos=1, packet_id=pid))
        ack = c.expect(PUBACK)
        assert ack.packet_id == pid and ack.flags == 0


def test_qos1_outbound(srv, uid):
    sub, pub, t = pair(srv, uid, 1)
    pub.publish(t, b"q1", qos=1)
    p = sub.recv_publish(ack=False)
    assert (p.payload, p.qos, p.dup, p.retain) == (b"q1", 1, False, False)
    assert p.packet_id != 0
    sub.send(m.puback(p.packet_id))
    assert sub.ping() == []  # acknowledged: no re-send


def test_qos2_inbound_handshake(srv, uid):
    sub, pub, t = pair(srv, uid, 0)
    pub.send(m.publish(t, b"q2", qos=2, packet_id=42))
    rec = pub.expect(PUBREC)
    assert rec.packet_id == 42 and rec.flags == 0
    pub.send(m.pubrel(42))
    comp = pub.expect(PUBCOMP)
    assert comp.packet_id == 42 and comp.flags == 0
    assert sub.recv_publish().payload == b"q2"


def test_qos2_outbound_handshake(srv, uid):
    sub, pub, t = pair(srv, uid, 2)
    pub.publish(t, b"q2out", qos=2)
    p = sub.recv_publish(ack=False)
    assert (p.payload, p.qos, p.dup) == (b"q2out", 2, False)
    sub.send(m.pubrec(p.packet_id))
    rel = sub.expect(PUBREL)
    assert rel.packet_id == p.packet_id and rel.flags == 0x02
    sub.send(m.pubcomp(p.packet_id))
    assert sub.ping() == []


def test_qos2_inbound_duplicate_before_pubrel_delivered_once(srv, uid):
    """4.3.3 [MQTT-4.3.3-2]: a re-sent PUBLISH with the same packet id before PUBREL must not be
    delivered again."""
    sub, pub, t = pair(srv, uid, 2)
    pub.send(m.publish(t, b"once", qos=2, packet_id=5))
    assert pub.expect(PUBREC).packet_id == 5
    pub.send(m.publish(t, b"once", qos=2, packet_id=5, dup=True))
    assert pub.expect(PUBREC).packet_id == 5
    pub.send(m.publish(t, b"once", qos=2, packet_id=5, dup=True))
    assert pub.expect(PUBREC).packet_id == 5
    pub.send(m.pubrel(5))
    assert pub.expect(PUBCOMP).packet_id == 5
    pub.publish(t, b"marker", qos=1)
    assert sub.recv_publish().payload == b"once"
    assert sub.recv_publish().payload == b"marker"


def test_qos2_publish_without_dup_for_an_id_awaiting_pubrel_is_a_new_message(srv, uid):
    """A re-send sets DUP (MQTT-3.3.1-1): a QoS 2 PUBLISH with DUP 0 and an id still awaiting
    PUBREL is a new message (the client reused the id), and is delivered; logged once."""
    sub, pub, t = pair(srv, uid, 2)
    mark = srv.mark()
    pub.send(m.publish(t, b"one", qos=2, packet_id=5))
    assert pub.expect(PUBREC).packet_id == 5
    pub.send(m.publish(t, b"two", qos=2, packet_id=5))
    assert pub.expect(PUBREC).packet_id == 5
    pub.send(m.pubrel(5))
    assert pub.expect(PUBCOMP).packet_id == 5
    assert [sub.recv_publish().payload for _ in range(2)] == [b"one", b"two"]
    assert srv.wait_log(lambda ln: "packet id 5 (DUP 0)" in ln and f"{uid}-pub" in ln, start=mark)


def test_qos2_packet_id_reusable_after_pubcomp(srv, uid):
    sub, pub, t = pair(srv, uid, 0)
    for payload in (b"first", b"second"):
        pub.send(m.publish(t, payload, qos=2, packet_id=9))
        assert pub.expect(PUBREC).packet_id == 9
        pub.send(m.pubrel(9))
        assert pub.expect(PUBCOMP).packet_id == 9
    assert sub.recv_publish().payload == b"first"
    assert sub.recv_publish().payload == b"second"


def test_pubrel_for_unknown_packet_id_gets_pubcomp(srv, uid):
    """4.3.3: PUBREL for an id not held (e.g. already completed) is answered with PUBCOMP."""
    c = srv.client(uid)
    c.send(m.pubrel(1234))
    assert c.expect(PUBCOMP).packet_id == 1234


@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_delivered_qos_is_min_of_publish_and_granted(srv, uid, pub_qos, sub_qos):
    """3.8.4 [MQTT-3.8.4-6]: the delivered QoS is min(publish QoS, granted QoS)."""
    sub, pub, t = pair(srv, uid, sub_qos)
    pub.publish(t, b"x", qos=pub_qos)
    p = sub.recv_publish()
    assert p.qos == min(pub_qos, sub_qos)
    assert (p.packet_id is None) == (p.qos == 0)


def test_outbound_packet_ids_distinct_while_in_flight(srv, uid):
    """2.3.1 [MQTT-2.3.1-2]: a new packet id for every unacknowledged QoS>0 message."""
    sub, pub, t = pair(srv, uid, 2)
    for i in range(10):
        pub.publish(t, f"m{i}", qos=1 + i % 2)
    got = [sub.recv_publish(ack=False) for _ in range(10)]
    ids = [p.packet_id for p in got]
    assert 0 not in ids
    assert len(set(ids)) == 10, ids
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(10)]
    for p in got:
        if p.qos == 1:
            sub.send(m.puback(p.packet_id))
        else:
            sub.send(m.pubrec(p.packet_id))
            sub.wait_for(lambda q, pid=p.packet_id: q.type == PUBREL and q.packet_id == pid)
            sub.send(m.pubcomp(p.packet_id))
    assert sub.ping() == []


def test_order_preserved_qos1(srv, uid):
    """4.6: messages from one publisher on one topic arrive in order."""
    sub, pub, t = pair(srv, uid, 1)
    n = 100
    for i in range(n):
        pub.send(m.publish(t, str(i), qos=1, packet_id=i + 1))
    for i in range(n):
        pub.wait_for(lambda p: p.type == PUBACK)
    assert [int(sub.recv_publish().payload) for _ in range(n)] == list(range(n))


def test_each_subscriber_gets_a_copy(srv, uid):
    t = f"{uid}/t"
    subs = [srv.client(f"{uid}-s{i}") for i in range(5)]
    for i, s in enumerate(subs):
        s.subscribe(t, qos=i % 3)
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"fan", qos=2)
    for i, s in enumerate(subs):
        p = s.recv_publish()
        assert (p.payload, p.qos) == (b"fan", i % 3)


def test_publisher_receives_own_message(srv, uid):
    c = srv.client(uid)
    c.subscribe(f"{uid}/t", qos=1)
    c.publish(f"{uid}/t", b"self", qos=1)
    assert c.recv_publish().payload == b"self"


def test_max_inflight_window(broker, uid):
    """A subscriber that does not acknowledge has at most max_inflight_messages QoS 1 messages
    outstanding; the rest arrive one by one as it acknowledges."""
    b = broker(limits={"max_inflight_messages": 3})
    t = f"{uid}/t"
    sub = b.client(f"{uid}-s")
    sub.subscribe(t, qos=1)
    pub = b.client(f"{uid}-p")
    n = 10
    for i in range(n):
        pub.publish(t, str(i), qos=1)  # each PUBACK means the broker has routed the message
    first = [sub.recv_publish(ack=False) for _ in range(3)]
    assert [int(p.payload) for p in first] == [0, 1, 2]
    extra = sub.ping()
    assert extra == [], f"more than 3 messages in flight: {extra}"
    received = list(first)
    outstanding = list(first)
    while len(received) < n:
        done = outstanding.pop(0)
        sub.send(m.puback(done.packet_id))
        p = sub.recv_publish(ack=False)
        received.append(p)
        outstanding.append(p)
        assert len(outstanding) <= 3
        extra = sub.ping()
        assert extra == [], f"more than one new message per acknowledgement: {extra}"
    assert [int(p.payload) for p in received] == list(range(n))
    for p in outstanding:
        sub.send(m.puback(p.packet_id))
    assert sub.ping() == []


def test_max_inflight_window_qos2(broker, uid):
    b = broker(limits={"max_inflight_messages": 2})
    t = f"{uid}/t"
    sub = b.client(f"{uid}-s")
    sub.subscribe(t, qos=2)
    pub = b.client(f"{uid}-p")
    for i in range(5):
        pub.publish(t, str(i), qos=2)
    first = [sub.recv_publish(ack=False) for _ in range(2)]
    assert sub.ping() == []
    sub.ack(first[0])  # PUBREC, PUBREL, PUBCOMP
    third = sub.recv_publish(ack=False)
    assert third.payload == b"2"
    for p in (first[1], third):
        sub.ack(p)
    rest = [sub.recv_publish() for _ in range(2)]
    assert [p.payload for p in rest] == [b"3", b"4"]


def test_qos0_not_limited_by_inflight_window(broker, uid):
    b = broker(limits={"max_inflight_messages": 1})
    t = f"{uid}/t"
    sub = b.client(f"{uid}-s")
    sub.subscribe(t, qos=0)
    pub = b.client(f"{uid}-p")
    for i in range(20):
        pub.publish(t, str(i), qos=0)
    assert [int(sub.recv_publish().payload) for _ in range(20)] == list(range(20))


def test_forwarded_publish_has_dup_clear(srv, uid):
    """3.3.1.1 [MQTT-3.3.1-3]: the DUP flag of an outgoing PUBLISH is set independently of the
    incoming one: a first delivery has DUP 0."""
    sub, pub, t = pair(srv, uid, 1)
    pub.send(m.publish(t, b"retry", qos=1, packet_id=3, dup=True))
    assert pub.expect(PUBACK).packet_id == 3
    p = sub.recv_publish()
    assert (p.payload, p.dup) == (b"retry", False)


def test_acks_for_unknown_packet_ids(srv, uid):
    """PUBACK/PUBREC/PUBCOMP for ids the server does not hold are not a protocol violation
    (e.g. a late ack after a re-send); the connection stays up. A PUBREC is answered with
    PUBREL, so a client that lost track can finish its side (MQTT-4.3.3-1); as Mosquitto."""
    c = srv.client(uid)
    c.send(m.puback(4321) + m.pubcomp(4322) + m.pubrec(4323))
    rel = c.expect(m.PUBREL)
    assert (rel.packet_id, rel.flags) == (4323, 0x02)
    assert c.ping() == []


@pytest.mark.parametrize("sub_qos, ack", [(1, "pubrec"), (1, "pubcomp"), (2, "puback"),
                                          (2, "pubcomp")])
def test_ack_of_the_wrong_kind_closes_the_connection(srv, uid, sub_qos, ack):
    """An acknowledgement that does not fit the message sent with its id (PUBREC for QoS 1,
    PUBACK for QoS 2, PUBCOMP before PUBREC) is a protocol violation, as in Mosquitto."""
    sub, pub, t = pair(srv, uid, sub_qos)
    mark = srv.mark()
    pub.publish(t, b"x", qos=sub_qos)
    p = sub.recv_publish(ack=False)
    sub.send(getattr(m, ack)(p.packet_id))
    assert sub.expect_closed(5)
    line = srv.wait_log(lambda ln: "protocol violation" in ln and f"{uid}-sub" in ln, start=mark)
    assert line and f"for packet id {p.packet_id}, which is a QoS {sub_qos} message" in line, line


def test_online_queue_beyond_inflight_window_bounded(broker, uid):
    """A connected subscriber that does not acknowledge: inflight window, then up to
    max_queued_messages queued, the excess dropped; what is kept is delivered in order."""
    b = broker(limits={"max_inflight_messages": 1, "max_queued_messages": 3})
    t = f"{uid}/t"
    sub = b.client(f"{uid}-s")
    sub.subscribe(t, qos=1)
    pub = b.client(f"{uid}-p")
    for i in range(10):
        pub.publish(t, str(i), qos=1)
    got = []
    while True:
        extra = sub.ping()
        if not extra:
            break
        for p in extra:
            assert p.type == PUBLISH
            got.append(int(p.payload))
            sub.send(m.puback(p.packet_id))
    assert 3 <= len(got) <= 4, f"kept {len(got)} of 10 with inflight 1 + queue 3: {got}"
    assert got == list(range(len(got)))


def test_pubrel_resent_in_pubrec_order(broker, uid):
    """MQTT-4.6.0-4: after reconnect, PUBRELs come in the order the PUBRECs were sent."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"1", qos=2)
    pub.publish(f"{uid}/t", b"2", qos=2)
    first, second = sub.expect(PUBLISH), sub.expect(PUBLISH)
    sub.send(m.pubrec(second.packet_id))
    sub.send(m.pubrec(first.packet_id))
    live = [sub.expect(PUBREL).packet_id, sub.expect(PUBREL).packet_id]
    assert live == [second.packet_id, first.packet_id]
    sub.close()
    again = b.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    resent = [again.expect(PUBREL).packet_id, again.expect(PUBREL).packet_id]
    assert resent == [second.packet_id, first.packet_id]
