"""Shared subscriptions: what a persistent member keeps when its group ends under it or the
broker restarts with other limits, and what a hand-over keeps of a message (docs/protocol.md,
"Shared subscriptions")."""

from __future__ import annotations

import pytest

import mqttraw as m
from core.test_shared import collect, member, payloads, publishes

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


def test_lower_limits_at_a_restart_keep_a_persistent_members_shared_subscriptions(broker, uid):
    """A persistent member of two groups, each with a backlog of 5; the broker restarts with
    max_subscriptions_per_client and max_topic_levels below what the member has: its
    subscriptions are kept, as its plain ones are (the limits apply to new subscriptions),
    and it gets all 10 messages; nothing is counted as dropped or as a limit hit."""
    b = broker(limits={"max_subscriptions_per_client": 10})
    shares = [f"$share/a/{uid}/x/#", f"$share/g/{uid}/t/#"]
    a = b.client(f"{uid}-A", clean=False)
    assert a.subscribe(*shares, qos=1).codes == [1, 1]
    a.disconnect()
    pub = b.client(f"{uid}-pub")
    sent = []
    for i in range(5):
        for level in ("x", "t"):
            pub.publish(f"{uid}/{level}/1", f"{level}{i}".encode(), qos=1)
            sent.append(f"{level}{i}".encode())
    assert b.stop() == 0
    b2 = broker(data_dir=b.config["data_dir"],
                limits={"max_subscriptions_per_client": 1, "max_topic_levels": 2})
    stats = b2.stats()
    assert (stats["shared_groups"], stats["shared_subscriptions"]) == (2, 2)
    a = b2.client(f"{uid}-A", clean=False)
    assert a.connack.session_present
    got = collect([a], 10)[a]
    assert sorted(payloads(got)) == sorted(sent)
    stats = b2.stats()
    assert not any(stats["limit_hits"].values()) and not any(stats["dropped"].values())
