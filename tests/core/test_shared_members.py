"""Shared subscriptions: what a persistent member keeps when its group ends under it or the
broker restarts with other limits, and what a hand-over keeps of a message (docs/protocol.md,
"Shared subscriptions")."""

from __future__ import annotations

import signal

import pytest

import mqttraw as m
import mqttraw5 as m5
from conftest import wait_for_snapshot
from core.test_shared import collect, member, payloads, publishes, raw5

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


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "kill"])
@pytest.mark.parametrize("end", ["clean session", "expiry"])
def test_a_restart_keeps_the_group_of_a_qos2_message_in_flight(broker, uid, stop, end):
    """A persistent member holds a group's QoS 2 message unacknowledged; the broker stops
    (its snapshot has the group) or is killed (the exchange journal's record has it). When
    the member's session then ends (its client back with clean session 1, or it expires) the
    message is counted as shared_left and logged (MQTT-4.8.2-5), as without the restart."""
    b = broker()
    share = f"$share/h/{uid}/t"
    keeper = member(b, f"{uid}-keep", share, qos=2, clean=False)
    wait_for_snapshot(b.config["data_dir"], f"{uid}-keep", pred=lambda s: s["subscriptions"])
    b.client(f"{uid}-p").publish(f"{uid}/t", b"one", qos=2)
    assert payloads(publishes(keeper)) == [b"one"]
    keeper.close()
    b.stop(stop)
    b2 = broker(data_dir=b.config["data_dir"],
                limits={"persistent_client_expiration": 1} if end == "expiry" else {})
    if end == "clean session":
        b2.client(f"{uid}-keep", clean=True)
    assert b2.wait_log(f"session '{uid}-keep' ended with 1 unacknowledged messages of shared "
                       f"subscriptions")
    dropped = b2.stats()["dropped"]
    assert dropped["shared_left"] == 1 and dropped.get("session_expired", 0) == 0


def test_qos2_sent_again_after_a_restart_carries_the_shared_subscription_identifier(broker,
                                                                                    uid):
    """A 5.0 member's QoS 2 message of a group, unacknowledged across a restart, is sent
    again with the shared subscription's Subscription Identifier (the snapshot keeps which
    group gave it)."""
    b = broker()
    c = raw5(b)
    c.connect(f"{uid}-m", clean_start=False, props={m5.SESSION_EXPIRY: 600})
    assert c.subscribe(f"$share/g/{uid}/t", qos=2, props={m5.SUBSCRIPTION_ID: 4}).codes == [2]
    b.client(f"{uid}-p").publish(f"{uid}/t", b"once", qos=2)
    (first,) = publishes(c)
    c.close()
    assert b.stop() == 0
    b2 = broker(data_dir=b.config["data_dir"])
    c = raw5(b2)
    assert c.connect(f"{uid}-m", clean_start=False,
                     props={m5.SESSION_EXPIRY: 600}).session_present
    again = c.recv_publish()
    assert (again.payload, again.dup, again.packet_id) == (b"once", True, first.packet_id)
    assert again.properties.get(m5.SUBSCRIPTION_ID) == [4]


@pytest.mark.parametrize("restart", [False, True])
def test_a_retained_message_handed_over_keeps_its_retain_flag_for_retain_as_published(broker,
                                                                                        uid,
                                                                                        restart):
    """Two retained messages sent to a 3.1.1 member (RETAIN 0: no Retain As Published) go,
    when that member's connection ends unacknowledged (with ``restart``: the broker stops, a
    5.0 member offline), to a 5.0 member with Retain As Published: RETAIN 1, as published
    (MQTT-3.3.1-12)."""
    b = broker()
    share = f"$share/g/{uid}/#"
    z = raw5(b)
    z.connect(f"{uid}-Z", clean_start=False, props={m5.SESSION_EXPIRY: 600})
    assert z.subscribe((share, 1 | m5.RETAIN_AS_PUBLISHED)).codes == [1]
    z.disconnect()
    a = member(b, f"{uid}-A", share, clean=False)
    pub = b.client(f"{uid}-p")
    for payload in (b"r1", b"r2"):
        pub.publish(f"{uid}/t", payload, qos=1, retain=True)
    assert [(p.payload, p.retain) for p in publishes(a)] == [(b"r1", False), (b"r2", False)]
    if restart:
        assert b.stop() == 0
        b = broker(data_dir=b.config["data_dir"])
    else:
        a.abort()
    z = raw5(b)
    assert z.connect(f"{uid}-Z", clean_start=False,
                     props={m5.SESSION_EXPIRY: 600}).session_present
    got = collect([z], 2)[z]
    assert [(p.payload, p.retain) for p in got] == [(b"r1", True), (b"r2", True)]


def test_the_replay_after_a_crash_neither_resends_nor_counts_a_groups_qos0(broker, uid):
    """A persistent member got 50 QoS 0 messages of its group after the last snapshot; kill
    -9. The log's replay at the restart does not hand them out again (at most once) and
    does not count them as dropped: before the crash each went to a member (or was
    dropped and counted then). One info line says how many it passed over."""
    b = broker()
    share = f"$share/g/{uid}/#"
    a = member(b, f"{uid}-A", share, clean=False)
    wait_for_snapshot(b.config["data_dir"], f"{uid}-A", pred=lambda s: s["subscriptions"])
    pub = b.client(f"{uid}-p")
    for i in range(50):
        pub.publish(f"{uid}/s", str(i).encode(), qos=0)
    assert len(collect([a], 50)[a]) == 50
    b.stop(signal.SIGKILL)
    b2 = broker(data_dir=b.config["data_dir"])
    assert not any(b2.stats()["dropped"].values())
    assert not any("no member can take a QoS 0 message" in line for line in b2.logs)
    assert b2.wait_log("log replay: 50 QoS 0 messages for shared subscription groups not "
                       "handed out again")
    a = b2.client(f"{uid}-A", clean=False)
    assert a.connack.session_present
    assert publishes(a) == []


def test_a_crash_gives_a_group_back_what_a_clean_member_that_left_it_held(broker, uid):
    """A clean member holds a group's QoS 1 message unacknowledged and unsubscribes (the
    group goes on with an offline persistent member); a snapshot, then kill -9. The clean
    session is gone after the restart, as its disconnect would, the message goes back to
    the group: the persistent member gets it."""
    b = broker()
    share = f"$share/g/{uid}/t"
    p = member(b, f"{uid}-P", share, clean=False)
    p.disconnect()
    c = member(b, f"{uid}-C", share)
    b.client(f"{uid}-pub").publish(f"{uid}/t", b"M", qos=1)
    assert payloads(publishes(c)) == [b"M"]
    assert c.unsubscribe(share).type == m.UNSUBACK
    b.client(f"{uid}-X", clean=False)       # a change that makes the broker write a snapshot
    wait_for_snapshot(b.config["data_dir"], f"{uid}-X")
    b.stop(signal.SIGKILL)
    b2 = broker(data_dir=b.config["data_dir"])
    p = b2.client(f"{uid}-P", clean=False)
    assert p.connack.session_present
    assert payloads(collect([p], 1)[p]) == [b"M"]
