"""Messages received in the loop pass in which a subscriber's connection ends (its DISCONNECT,
its end of stream, a reset) are routed after its close: it takes none of them. A shared group
gives them to a member still there; a persistent session queues them, QoS 0 too with
queue_qos0_messages. (Routed before the close, a QoS 2 message went to the leaving member of a
group and was dropped with its clean session; a persistent session's QoS 0 message was written
to the closed connection and counted as sent.)"""

import socket
import struct
import time

import pytest

from edgebroker import config
from edgebroker.core.broker import prompt_gap
import mqttraw as m

pytestmark = pytest.mark.timeout(60)
# A publisher quiet for longer than prompt_gap has its pass held while the loop gathers more
# input (coalesce_ms): the subscriber's close, sent right behind, is read in that same pass.
QUIET = 3 * prompt_gap(config.Config())


def _leave(c, how: str) -> None:
    if how == "reset":
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.sock.close()
    elif how == "disconnect":
        c.send(m.disconnect())
    else:
        c.sock.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("how", ["reset", "end of stream", "disconnect"])
def test_a_group_member_leaving_in_the_pass_of_qos2_messages_takes_none(srv, uid, how):
    topic = f"{uid}/t"
    stays = srv.client(f"{uid}-stays")
    stays.subscribe(f"$share/g/{topic}", qos=2)
    leaves = srv.client(f"{uid}-leaves")
    leaves.subscribe(f"$share/g/{topic}", qos=2)
    pub = srv.client(f"{uid}-pub")
    time.sleep(QUIET)
    pub.send(m.publish(topic, b"a", qos=2, packet_id=1)
             + m.publish(topic, b"b", qos=2, packet_id=2))
    _leave(leaves, how)
    assert sorted(pub.expect(m.PUBREC).packet_id for _ in range(2)) == [1, 2]
    assert [stays.recv_publish().payload for _ in range(2)] == [b"a", b"b"]
    assert srv.stats()["dropped"]["shared_left"] == 0


def test_a_persistent_session_reset_in_the_pass_of_a_qos0_message_queues_it(broker, uid):
    b = broker(limits={"queue_qos0_messages": True})
    topic = f"{uid}/t"
    sub = b.client(f"{uid}-sub", clean=False)
    sub.subscribe(topic, qos=1)
    pub = b.client(f"{uid}-pub")
    time.sleep(QUIET)
    # QoS 1 first: it waits for the log write, and the QoS 0 message waits behind it.
    pub.send(m.publish(topic, b"q1", qos=1, packet_id=1) + m.publish(topic, b"q0", qos=0))
    _leave(sub, "reset")
    assert pub.expect(m.PUBACK).packet_id == 1
    back = b.client(f"{uid}-sub", clean=False)
    got = [back.recv_publish() for _ in range(2)]
    assert [(p.payload, p.qos, p.dup) for p in got] == [(b"q1", 1, False), (b"q0", 0, False)]
