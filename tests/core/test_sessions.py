"""Sessions (3.1.2.4, 4.1, 4.4): clean session, persistence while offline, session present,
re-delivery with DUP on reconnect, client-id takeover, offline queue bounds."""

import pytest

import mqttraw as m
import mqttraw5 as m5
from conftest import _open_clients
from mqttraw import PUBCOMP, PUBREC, PUBREL


def persistent_sub(srv, cid, *filters, qos=1):
    s = srv.client(cid, clean=False)
    s.subscribe(*filters, qos=qos)
    return s


def reconnect(srv, cid, clean=False, expect_sp=True):
    c = srv.client(cid, clean=clean)
    assert c.connack.session_present is expect_sp, f"session present {c.connack.session_present}, expected {expect_sp}"
    return c


def forget(srv, cid):
    """Drop a persistent session by connecting once with clean session 1."""
    srv.client(cid, clean=True).disconnect()


def test_clean_session_never_session_present(srv, uid):
    c = srv.client(uid, clean=True)
    assert c.connack.session_present is False
    c.disconnect()
    assert srv.client(uid, clean=True).connack.session_present is False


def test_new_persistent_session_not_present_then_present(srv, uid):
    """[MQTT-3.2.2-2, -3]."""
    c = srv.client(uid, clean=False)
    assert c.connack.session_present is False
    c.disconnect()
    c = reconnect(srv, uid)
    c.disconnect()
    forget(srv, uid)


def test_clean_session_discards_persistent_session(srv, uid):
    """[MQTT-3.1.2-6]: clean session 1 discards the previous session."""
    s = persistent_sub(srv, uid, f"{uid}/t")
    s.disconnect()
    c = srv.client(uid, clean=True)
    assert c.connack.session_present is False
    c.disconnect()
    c = srv.client(uid, clean=False)
    assert c.connack.session_present is False
    c.subscribe(f"{uid}/marker", qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"old sub", qos=1)
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    assert c.recv_publish().topic == f"{uid}/marker"
    c.disconnect()
    forget(srv, uid)


def test_subscriptions_survive_reconnect(srv, uid):
    s = persistent_sub(srv, uid, f"{uid}/t")
    s.disconnect()
    s = reconnect(srv, uid)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"still subscribed", qos=1)
    assert s.recv_publish().payload == b"still subscribed"
    s.disconnect()
    forget(srv, uid)


@pytest.mark.parametrize("qos", [1, 2])
def test_offline_messages_queued_and_delivered(srv, uid, qos):
    s = persistent_sub(srv, uid, f"{uid}/t", qos=2)
    s.disconnect()
    pub = srv.client(f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/t", f"m{i}", qos=qos)
    s = reconnect(srv, uid)
    got = [s.recv_publish() for _ in range(5)]
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(5)]
    assert {p.qos for p in got} == {qos}
    s.disconnect()
    forget(srv, uid)


def test_offline_qos0_not_queued_by_default(srv, uid):
    s = persistent_sub(srv, uid, f"{uid}/t")
    s.disconnect()
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"qos0 dropped", qos=0)
    pub.publish(f"{uid}/t", b"qos1 kept", qos=1)
    s = reconnect(srv, uid)
    assert s.recv_publish().payload == b"qos1 kept"
    s.disconnect()
    forget(srv, uid)


def test_offline_qos0_queued_when_enabled(broker, uid):
    b = broker(limits={"queue_qos0_messages": True})
    s = persistent_sub(b, uid, f"{uid}/t")
    s.disconnect()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"qos0 kept", qos=0)
    pub.publish(f"{uid}/t", b"qos1 kept", qos=1)
    s = reconnect(b, uid)
    got = [s.recv_publish() for _ in range(2)]
    assert [(p.payload, p.qos) for p in got] == [(b"qos0 kept", 0), (b"qos1 kept", 1)]


def test_offline_queue_bounded_excess_dropped(broker, uid):
    """Up to max_queued_messages (plus at most the inflight window) kept while offline; the
    excess is dropped, and what is kept is the oldest part, in order."""
    b = broker(limits={"max_queued_messages": 5, "max_inflight_messages": 2})
    s = persistent_sub(b, uid, f"{uid}/t", f"{uid}/end")
    s.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(30):
        pub.publish(f"{uid}/t", str(i), qos=1)
    s = reconnect(b, uid)
    pub.publish(f"{uid}/end", b"END", qos=1)
    got = []
    while True:
        p = s.recv_publish()
        if p.topic == f"{uid}/end":
            break
        got.append(int(p.payload))
    assert 5 <= len(got) <= 7, f"kept {len(got)} of 30 with max_queued_messages=5: {got}"
    assert got == list(range(len(got))), f"not the oldest messages in order: {got}"


def test_unacked_qos1_resent_with_dup_on_reconnect(srv, uid):
    """4.4 [MQTT-4.4.0-1]: unacknowledged PUBLISH re-sent with DUP=1 and the same packet id."""
    s = persistent_sub(srv, uid, f"{uid}/t")
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"unacked", qos=1)
    first = s.recv_publish(ack=False)
    assert first.dup is False
    s.close()
    s = reconnect(srv, uid)
    again = s.recv_publish(ack=False)
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"unacked", 1, True, first.packet_id)
    s.send(m.puback(again.packet_id))
    pub.publish(f"{uid}/t", b"next", qos=1)
    nxt = s.recv_publish()
    assert (nxt.payload, nxt.dup) == (b"next", False)
    s.disconnect()
    forget(srv, uid)


def test_resend_keeps_order_before_new_messages(srv, uid):
    s = persistent_sub(srv, uid, f"{uid}/t")
    pub = srv.client(f"{uid}-p")
    for i in range(3):
        pub.publish(f"{uid}/t", f"a{i}", qos=1)
    firsts = [s.recv_publish(ack=False) for _ in range(3)]
    s.close()
    for i in range(2):
        pub.publish(f"{uid}/t", f"b{i}", qos=1)
    s = reconnect(srv, uid)
    got = [s.recv_publish() for _ in range(5)]
    assert [p.payload for p in got] == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    assert [p.dup for p in got[:3]] == [True] * 3
    assert [p.packet_id for p in got[:3]] == [p.packet_id for p in firsts]
    s.disconnect()
    forget(srv, uid)


def test_unacked_qos2_publish_resent_with_dup(srv, uid):
    s = persistent_sub(srv, uid, f"{uid}/t", qos=2)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"q2", qos=2)
    first = s.recv_publish(ack=False)
    s.close()
    s = reconnect(srv, uid)
    again = s.recv_publish(ack=False)
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"q2", 2, True, first.packet_id)
    s.ack(again)
    s.disconnect()
    forget(srv, uid)


def test_pubrel_resent_after_pubrec(srv, uid):
    """4.4: after PUBREC the server re-sends PUBREL (not the PUBLISH) on reconnect."""
    s = persistent_sub(srv, uid, f"{uid}/t", f"{uid}/marker", qos=2)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"q2", qos=2)
    p = s.recv_publish(ack=False)
    s.send(m.pubrec(p.packet_id))
    assert s.expect(PUBREL).packet_id == p.packet_id
    s.close()
    s = reconnect(srv, uid)
    rel = s.recv_packet()
    assert (rel.type, rel.packet_id, rel.flags) == (PUBREL, p.packet_id, 0x02), rel
    s.send(m.pubcomp(p.packet_id))
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    nxt = s.recv_publish()
    assert nxt.topic == f"{uid}/marker", f"message delivered twice: {nxt!r}"
    s.disconnect()
    forget(srv, uid)


def test_inbound_qos2_exactly_once_across_reconnect(srv, uid):
    """The publisher's QoS 2 state survives its reconnect: the re-sent PUBLISH is not delivered
    again, and the PUBREL completes it."""
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", f"{uid}/marker", qos=2)
    pub = srv.client(f"{uid}-p", clean=False)
    pub.send(m.publish(f"{uid}/t", b"exactly once", qos=2, packet_id=77))
    assert pub.expect(PUBREC).packet_id == 77
    pub.close()
    pub = reconnect(srv, f"{uid}-p")
    pub.send(m.publish(f"{uid}/t", b"exactly once", qos=2, packet_id=77, dup=True))
    assert pub.expect(PUBREC).packet_id == 77
    pub.send(m.pubrel(77))
    assert pub.expect(PUBCOMP).packet_id == 77
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    assert sub.recv_publish().payload == b"exactly once"
    assert sub.recv_publish().topic == f"{uid}/marker"
    pub.disconnect()
    forget(srv, f"{uid}-p")


def test_takeover_closes_older_connection(srv, uid):
    """3.1.4 [MQTT-3.1.4-2]: the server disconnects the existing client with the same id."""
    old = srv.client(uid)
    new = srv.client(uid)
    assert old.expect_closed(5)
    assert new.ping() == []


def test_takeover_does_not_tell_the_old_client_the_new_ones_address(srv, uid):
    """A 5.0 client thrown off by a takeover was told the new connection's IP:port in the
    DISCONNECT's Reason String; the log keeps both addresses."""
    old = m5.RawClient5(srv.host, srv.port)
    _open_clients.append(old)
    assert old.connect(uid).reason == 0
    mark = srv.mark()
    new = srv.client(uid)
    d = old.expect_disconnect()
    assert d.reason == 0x8E
    assert d.properties == {m5.REASON_STRING: f"client id {uid!r} connected again"}, d
    assert srv.wait_log(f"client {uid!r} from 127.0.0.1:{new.local_port} takes over the "
                        f"session; closing the connection from 127.0.0.1:{old.local_port}",
                        start=mark)


def test_takeover_keeps_persistent_session(srv, uid):
    old = persistent_sub(srv, uid, f"{uid}/t")
    new = reconnect(srv, uid, expect_sp=True)
    assert old.expect_closed(5)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"to new", qos=1)
    assert new.recv_publish().payload == b"to new"
    new.disconnect()
    forget(srv, uid)


def test_takeover_repeatedly(srv, uid):
    conns = [srv.client(uid)]
    for _ in range(5):
        conns.append(srv.client(uid))
        assert conns[-2].expect_closed(5)
    assert conns[-1].ping() == []


def test_inflight_messages_resent_in_window_after_reconnect(broker, uid):
    b = broker(limits={"max_inflight_messages": 2})
    s = persistent_sub(b, uid, f"{uid}/t")
    pub = b.client(f"{uid}-p")
    for i in range(6):
        pub.publish(f"{uid}/t", str(i), qos=1)
    firsts = [s.recv_publish(ack=False) for _ in range(2)]
    assert s.ping() == []
    s.close()
    s = reconnect(b, uid)
    got = []
    while len(got) < 6:
        p = s.recv_publish(ack=False)
        got.append(p)
        s.send(m.puback(p.packet_id))
    assert [int(p.payload) for p in got] == list(range(6))
    assert [p.dup for p in got[:2]] == [True, True]
    assert [p.packet_id for p in got[:2]] == [p.packet_id for p in firsts]
    assert s.ping() == []


def test_qos0_keeps_order_behind_a_backlog(broker, uid):
    """MQTT-4.6.0-6 with queue_qos0_messages: live QoS 0 must not overtake queued QoS 0."""
    b = broker(limits={"queue_qos0_messages": True, "max_inflight_messages": 1})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.close()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"q1-a", qos=1)
    pub.publish(f"{uid}/t", b"q1-b", qos=1)
    pub.publish(f"{uid}/t", b"q0-old", qos=0)
    again = b.client(f"{uid}-s", clean=False)   # window of 1: q1-a in flight, rest queued
    pub.publish(f"{uid}/t", b"q0-new", qos=0)
    pub.publish(f"{uid}/t", b"marker", qos=1)
    got = [again.recv_publish().payload for _ in range(5)]
    assert got.index(b"q0-old") < got.index(b"q0-new"), got
