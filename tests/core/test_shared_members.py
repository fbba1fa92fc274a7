"""Shared subscriptions: what a persistent member keeps when its group ends under it or the
broker restarts with other limits, and what a hand-over keeps of a message (docs/protocol.md,
"Shared subscriptions")."""

from __future__ import annotations

import pytest

import mqttraw as m
from core.test_shared import member, publishes

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("again", [False, True])
def test_a_qos1_message_of_a_group_that_ended_stays_with_the_persistent_member(broker, uid,
                                                                               again):
    """A persistent member, the group's only one, is sent a QoS 1 message, unsubscribes
    (delivery is still to be completed, MQTT-3.10.4-3: the group ends) and loses its
    connection; with ``again`` it subscribed anew first (a new group of the same name). The
    message is sent again (DUP, the same packet id) when it is back (MQTT-4.4.0-1), as a
    plain subscription's is; nothing is counted as lost."""
    b = broker()
    share = f"$share/g/{uid}/#"
    a = member(b, f"{uid}-A", share, clean=False)
    b.client(f"{uid}-pub").publish(f"{uid}/1", b"job-1", qos=1)
    (first,) = publishes(a)
    assert a.unsubscribe(share).type == m.UNSUBACK
    if again:
        assert a.subscribe(share, qos=1).codes == [1]
    a.close()
    a = b.client(f"{uid}-A", clean=False)
    assert a.connack.session_present
    resent = a.recv_publish()
    assert (resent.payload, resent.dup, resent.packet_id) == (b"job-1", True, first.packet_id)
    assert publishes(a) == []
    assert b.stats()["dropped"].get("shared_left", 0) == 0
