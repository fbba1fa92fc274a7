"""A connection the broker closes for a protocol violation (or because it sent DISCONNECT, or
ended its side of the stream) gets the acknowledgements of the messages it published earlier in
the same read: they were accepted (logged and routed), but
their PUBACK/PUBREC waited for the pass's log write, and the close dropped them, so the
client sent them again after reconnecting (a QoS 1 duplicate)."""

import socket
import time

import pytest

from edgebroker import config
from edgebroker.core.broker import prompt_gap
import mqttraw as m
import mqttraw5 as R
from conftest import _open_clients

pytestmark = pytest.mark.timeout(60)
# A connection quiet for longer than prompt_gap (at the default coalesce_ms) has its
# acknowledgements held while the loop gathers more input: the end of its stream, come
# meanwhile, is read before they are released.
QUIET = 3 * prompt_gap(config.Config())


def test_a_3_1_1_client_closed_mid_read_gets_the_acknowledgements_before_the_close(srv, uid):
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    c = srv.client(f"{uid}-c")
    c.send(m.publish(f"{uid}/t", b"one", qos=1, packet_id=1)
           + m.publish(f"{uid}/t", b"two", qos=2, packet_id=2)
           + m.packet(0xF, 0, b""))                # packet type 15 is reserved in 3.1.1
    assert c.expect_closed(10)
    assert [(p.type, p.packet_id) for p in c.before_close] == [(m.PUBACK, 1), (m.PUBREC, 2)]
    assert [sub.recv_publish().payload for _ in range(2)] == [b"one", b"two"]


def test_a_5_0_client_gets_them_before_its_disconnect(srv, uid):
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    c = R.RawClient5(srv.host, srv.port)
    _open_clients.append(c)
    assert c.connect(f"{uid}-c").reason == 0
    c.send(R.publish5(f"{uid}/t", b"one", qos=1, packet_id=1)
           + R.publish5(f"{uid}/t", b"two", qos=2, packet_id=2)
           + R.publish5(f"{uid}/t", b"bad", qos=3, packet_id=3))      # QoS 3: malformed
    d = c.expect_disconnect(10)
    assert d.reason == 0x81, d
    assert [(p.type, p.packet_id) for p in c.before_close[:2]] == [(R.PUBACK, 1), (R.PUBREC, 2)]
    assert [sub.recv_publish().payload for _ in range(2)] == [b"one", b"two"]


@pytest.mark.parametrize("version", [4, 5])
def test_a_disconnect_behind_messages_in_the_same_read_gets_their_acknowledgements(
        srv, uid, version):
    """As Mosquitto: every packet before the DISCONNECT is answered."""
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    if version == 5:
        c = R.RawClient5(srv.host, srv.port)
        _open_clients.append(c)
        assert c.connect(f"{uid}-c").reason == 0
        publish, disconnect = R.publish5, R.disconnect5
    else:
        c = srv.client(f"{uid}-c")
        publish, disconnect = m.publish, m.disconnect
    c.send(publish(f"{uid}/t", b"one", qos=1, packet_id=1)
           + publish(f"{uid}/t", b"two", qos=2, packet_id=2) + disconnect())
    assert c.expect_closed(10)
    assert [(p.type, p.packet_id) for p in c.before_close] == [(m.PUBACK, 1), (m.PUBREC, 2)]
    assert [sub.recv_publish().payload for _ in range(2)] == [b"one", b"two"]


@pytest.mark.parametrize("version", [4, 5])
def test_messages_then_the_end_of_the_stream_get_their_acknowledgements(srv, uid, version):
    """A TCP half-close (shutdown(SHUT_WR)) right behind them, in the same segment (TCP_CORK
    holds the bytes until the FIN joins them): the broker reads the end of the stream before
    the pass's log write. The client still reads."""
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    if version == 5:
        c = R.RawClient5(srv.host, srv.port)
        _open_clients.append(c)
        assert c.connect(f"{uid}-c").reason == 0
        publish = R.publish5
    else:
        c = srv.client(f"{uid}-c")
        publish = m.publish
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    time.sleep(QUIET)
    c.send(publish(f"{uid}/t", b"one", qos=1, packet_id=1)
           + publish(f"{uid}/t", b"two", qos=2, packet_id=2))
    c.sock.shutdown(socket.SHUT_WR)
    assert c.expect_closed(10)
    assert [(p.type, p.packet_id) for p in c.before_close] == [(m.PUBACK, 1), (m.PUBREC, 2)]
    assert [sub.recv_publish().payload for _ in range(2)] == [b"one", b"two"]


N = 50      # QoS 1/2 PUBLISHes in one write before the refused one


def _burst(publish, topic: str, refused: str, qos: int, pid0: int = 1) -> bytes:
    return (b"".join(publish(topic, b"%d" % i, qos=qos, packet_id=pid0 + i) for i in range(N))
            + publish(refused, b"refused", qos=qos, packet_id=pid0 + N))


@pytest.mark.parametrize("limit,value,refused", [
    ("max_topic_levels", 4, "/a/b/c/d/e/f"),
    ("max_topics_per_client", 1, "/new"),
])
def test_a_3_1_1_publish_a_topic_limit_refuses_closes_after_the_earlier_acknowledgements(
        broker, uid, limit, value, refused):
    """50 QoS 1 (then QoS 2) PUBLISHes and one to a topic a limit refuses, in one write: the
    connection closes for the last one (3.1.1 has no negative acknowledgement), after the
    PUBACKs/PUBRECs of the 50 taken (logged and delivered): without them the client would
    send them again and subscribers would get duplicates."""
    b = broker(limits={limit: value})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=1)
    for qos, ack in ((1, m.PUBACK), (2, m.PUBREC)):
        c = b.client(f"{uid}-c{qos}")
        topic = f"{uid}/ok{qos}"
        c.publish(topic, b"first", qos=1)   # the topic admitted (max_topics_per_client: its one)
        assert sub.recv_publish().payload == b"first"
        c.send(_burst(m.publish, topic, f"{uid}{refused}{qos}", qos, pid0=10))
        assert c.expect_closed(10)
        assert [(p.type, p.packet_id) for p in c.before_close] == [
            (ack, 10 + i) for i in range(N)]
        assert [sub.recv_publish().payload for _ in range(N)] == [b"%d" % i for i in range(N)]
    assert b.stats()["limit_hits"][limit] == 2


def test_a_5_0_client_gets_the_earlier_acknowledgements_then_0x97(broker, uid):
    """5.0 has a negative acknowledgement: PUBACK 0x97 (quota exceeded) after the 50, and the
    connection stays."""
    b = broker(limits={"max_topic_levels": 4})
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(f"{uid}-c").reason == 0
    c.send(_burst(R.publish5, f"{uid}/ok", f"{uid}/a/b/c/d/e", 1))
    acks = [c.expect(R.PUBACK) for _ in range(N + 1)]
    assert [(p.packet_id, p.reason) for p in acks] == [(1 + i, 0) for i in range(N)] + [
        (N + 1, 0x97)]
    assert c.ping() == []
