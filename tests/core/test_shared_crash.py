"""Shared subscriptions across a crash (kill -9): QoS 2 messages a group gave out are not given
out again, and the group's backlog keeps what it did not give (docs/persistence.md, "Exactly
once across a crash"; docs/protocol.md, "Shared subscriptions")."""

from __future__ import annotations

import signal

import pytest

import mqttraw as m
from conftest import wait_for_snapshot
from core.test_shared import collect, member, payloads, publishes

pytestmark = pytest.mark.timeout(90)


def _restart(broker, b):
    data_dir = b.config["data_dir"]
    b.stop(signal.SIGKILL)
    return broker(data_dir=data_dir)


def _in_snapshot(b, *client_ids):
    for client_id in client_ids:
        wait_for_snapshot(b.config["data_dir"], client_id, pred=lambda s: s["subscriptions"])


def test_a_qos2_message_sent_to_a_plain_subscriber_still_waits_for_the_group(broker, uid):
    """N (plain subscription, persistent) is sent M at QoS 2; the same M waits in the group's
    backlog for its offline member P. After the crash the exchange journal's record of N's
    delivery does not take M out of the group's backlog: P gets it, once."""
    b = broker()
    share = f"$share/g/{uid}/#"
    p = member(b, f"{uid}-P", share, qos=2, clean=False)
    p.disconnect()
    n = member(b, f"{uid}-N", f"{uid}/#", qos=2, clean=False)
    _in_snapshot(b, f"{uid}-P", f"{uid}-N")
    b.client(f"{uid}-pub").publish(f"{uid}/x", b"M", qos=2)
    got = n.recv_publish()                         # PUBREC, PUBREL, PUBCOMP
    assert got.payload == b"M"
    b2 = _restart(broker, b)
    p = b2.client(f"{uid}-P", clean=False)
    assert p.connack.session_present
    assert p.recv_publish().payload == b"M"
    assert publishes(p) == []
    n = b2.client(f"{uid}-N", clean=False)
    assert publishes(n) == []                      # N finished its exchange before the crash


def test_a_qos2_message_a_group_gave_a_member_is_not_given_again(broker, uid):
    """P1 (persistent) is sent M by the group and does not acknowledge it; crash. After the
    restart P1 gets M again with its packet id and DUP, and the other member P2 never."""
    b = broker()
    share = f"$share/g/{uid}/#"
    p2 = member(b, f"{uid}-P2", share, qos=2, clean=False)
    p2.disconnect()
    p1 = member(b, f"{uid}-P1", share, qos=2, clean=False)
    _in_snapshot(b, f"{uid}-P1", f"{uid}-P2")
    b.client(f"{uid}-pub").publish(f"{uid}/x", b"M", qos=2)
    (first,) = publishes(p1)
    assert first.payload == b"M"
    b2 = _restart(broker, b)
    p2 = b2.client(f"{uid}-P2", clean=False)
    assert publishes(p2) == []
    p1 = b2.client(f"{uid}-P1", clean=False)
    again = p1.recv_publish()
    assert (again.payload, again.dup, again.packet_id) == (b"M", True, first.packet_id)
    assert publishes(p1) == [] and publishes(p2) == []


def _three_to_a_clean_member(b, uid):
    """An offline persistent member P, and a clean member C that finishes the exchange of
    the first of three QoS 2 messages, answers the second's PUBLISH with PUBREC only, and
    leaves the third unacknowledged. Returns C."""
    share = f"$share/g/{uid}/#"
    p = member(b, f"{uid}-P", share, qos=2, clean=False)
    p.disconnect()
    _in_snapshot(b, f"{uid}-P")
    c = member(b, f"{uid}-C", share, qos=2)
    pub = b.client(f"{uid}-pub")
    for text in (b"done", b"received", b"in flight"):
        pub.publish(f"{uid}/x", text, qos=2)
    done, received, flying = publishes(c)
    assert [done.payload, received.payload, flying.payload] == [b"done", b"received",
                                                                b"in flight"]
    c.ack(done)
    c.send(m.pubrec(received.packet_id))
    assert c.expect(m.PUBREL).packet_id == received.packet_id
    assert c.ping() == []
    return c


def _after_the_crash(broker, b, uid):
    """Restart after kill -9: the group's persistent member gets none of the three; the one
    in flight to the clean member (whose session is gone) is counted lost, once."""
    b2 = _restart(broker, b)
    assert b2.stats()["dropped"]["shared_left"] == 1
    assert b2.wait_log("1 QoS 2 messages of shared subscriptions were in flight to members "
                       "whose sessions the restart does not keep")
    p = b2.client(f"{uid}-P", clean=False)
    assert p.connack.session_present
    assert publishes(p) == []


def test_qos2_messages_a_clean_member_was_given_are_not_given_again_after_a_crash(broker,
                                                                                    uid):
    """The exchange journal records a group's QoS 2 hand-outs to clean members too: the log's
    replay after the snapshot does not give them to another member (exactly once; one in
    flight to the clean member stays with it, MQTT-4.8.2-5, and is lost with its session)."""
    b = broker()
    _three_to_a_clean_member(b, uid)
    _after_the_crash(broker, b, uid)


def test_a_snapshot_keeps_the_record_of_a_qos2_message_in_flight_to_a_clean_member(broker,
                                                                                    uid):
    """A snapshot taken while the clean member holds the messages (a new journal file) still
    lets the restart count the one in flight as lost, and give none of them again."""
    b = broker()
    _three_to_a_clean_member(b, uid)
    later = b.client(f"{uid}-later", clean=False)   # a change: the next snapshot lists it
    later.subscribe(f"{uid}/other", qos=1)
    wait_for_snapshot(b.config["data_dir"], f"{uid}-later", pred=lambda s: s["subscriptions"])
    _after_the_crash(broker, b, uid)


def _drain(c, limit: int = 500) -> list:
    """Every PUBLISH ``c`` is sent until a second passes without one (acknowledged)."""
    got = []
    while len(got) < limit:
        try:
            got.append(c.recv_publish(timeout=1.0))
        except TimeoutError:
            return got
    return got


def test_qos2_messages_a_group_completed_stay_done_across_a_second_restart(broker, uid):
    """After a crash the exchange journal tells the group which QoS 2 messages it gave out
    (the log's replay puts them in its backlog again, here past what it keeps in memory, so
    it reads them from the log). The snapshot the recovering broker wrote did not keep that,
    and the journal file went with it: a stop and a third start handed them out again, as
    new messages. The snapshot keeps them now (the group's done offsets)."""
    b = broker()
    share = f"$share/g/{uid}/#"
    p = member(b, f"{uid}-P", share, qos=2, clean=False)
    _in_snapshot(b, f"{uid}-P")
    pub = b.client(f"{uid}-pub")
    for i in range(300):
        pub.publish(f"{uid}/q1", b"q%d" % i, qos=1)
    for i in range(5):
        pub.publish(f"{uid}/q2", b"m%d" % i, qos=2)      # PUBREC and PUBCOMP received
    got = _drain(p)                                      # every exchange completed
    assert sorted(x.payload for x in got if x.qos == 2) == [b"m%d" % i for i in range(5)]
    b2 = _restart(broker, b)                             # kill -9; the journal is applied
    data_dir = b2.config["data_dir"]
    assert b2.stop() == 0                                # its snapshot, the journal gone
    b3 = broker(data_dir=data_dir)
    p = b3.client(f"{uid}-P", clean=False)
    again = _drain(p)
    assert [x.payload for x in again if x.qos == 2] == []
    assert all(x.payload.startswith(b"q") for x in again)   # QoS 1 may come again


def _mixed(b, uid, low: int, h_online: bool = True):
    """H (granted 2) and L (granted ``low``), persistent members of one group, both in the
    snapshot; H offline unless ``h_online``. Returns (H or None, L)."""
    share = f"$share/g/{uid}/#"
    h = member(b, f"{uid}-H", share, qos=2, clean=False)
    if not h_online:
        h.disconnect()
        h = None
    low_member = member(b, f"{uid}-L", share, qos=low, clean=False)
    _in_snapshot(b, f"{uid}-H", f"{uid}-L")
    return h, low_member


def _nothing_after_the_crash(broker, b, uid):
    """kill -9, restart, both members back: neither is sent anything."""
    b2 = _restart(broker, b)
    h = b2.client(f"{uid}-H", clean=False)
    low_member = b2.client(f"{uid}-L", clean=False)
    assert h.connack.session_present and low_member.connack.session_present
    assert payloads(_drain(h)) == [] and payloads(_drain(low_member)) == []


@pytest.mark.parametrize("low", [1, 0])
def test_qos2_messages_a_group_gave_a_lower_member_are_not_given_again_after_a_crash(
        broker, uid, low):
    """A QoS 2 message the group gives a member granted QoS 1 or 0 goes out at that QoS
    (MQTT-3.8.4-8). The exchange journal records that the group gave it (``G``): after a
    crash the log's replay does not hand it out again, neither to that member nor at QoS 2
    to the other (it came again, as a new message: twice for the group)."""
    b = broker()
    h, low_member = _mixed(b, uid, low)
    pub = b.client(f"{uid}-pub")
    sent = [b"m%d" % i for i in range(6)]
    for payload in sent:
        pub.publish(f"{uid}/x", payload, qos=2)
    got = collect([h, low_member], len(sent))       # each acknowledged
    assert sorted(payloads(got[h] + got[low_member])) == sent
    assert {p.qos for p in got[h]} == {2} and {p.qos for p in got[low_member]} == {low}
    assert h.ping() == [] and low_member.ping() == []   # the acknowledgements handled
    _nothing_after_the_crash(broker, b, uid)


def test_a_snapshot_while_the_lower_member_holds_the_message_keeps_its_record(broker, uid):
    """A snapshot taken while the member granted 1 has not acknowledged the QoS 2 message puts
    it back in the group's backlog (a restart would give it out again); the journal's new
    file records again that the group gave it, so after it is acknowledged a crash does not
    hand it out a second time."""
    b = broker()
    _, low_member = _mixed(b, uid, 1, h_online=False)
    b.client(f"{uid}-pub").publish(f"{uid}/x", b"M", qos=2)
    (got,) = publishes(low_member)
    assert (got.payload, got.qos) == (b"M", 1)
    later = b.client(f"{uid}-later", clean=False)   # a change: the next snapshot lists it
    later.subscribe(f"{uid}/other", qos=1)
    wait_for_snapshot(b.config["data_dir"], f"{uid}-later", pred=lambda s: s["subscriptions"])
    low_member.ack(got)
    assert low_member.ping() == []
    _nothing_after_the_crash(broker, b, uid)


def test_a_qos2_message_handed_over_unacknowledged_is_still_handed_out_after_a_crash(
        broker, uid):
    """The member granted 1 leaves without acknowledging: the message goes back to the
    group's backlog (H is offline), and nothing in the journal says the group gave it: after
    a crash H gets it, at QoS 2, once."""
    b = broker()
    _, low_member = _mixed(b, uid, 1, h_online=False)
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/x", b"M", qos=2)
    (got,) = publishes(low_member)
    assert got.qos == 1
    low_member.disconnect()
    assert b.wait_log(f"left shared subscription '$share/g/{uid}/#' with 1 unacknowledged QoS 1")
    assert pub.ping() == []     # the pass that handed it over ended: its records are written
    b2 = _restart(broker, b)
    h = b2.client(f"{uid}-H", clean=False)
    again = _drain(h)
    assert [(p.payload, p.qos) for p in again] == [(b"M", 2)]


@pytest.mark.parametrize("snapshot", [False, True], ids=["no-snapshot", "snapshot"])
def test_a_copy_the_lower_member_had_not_acknowledged_at_a_crash_comes_again(broker, uid,
                                                                             snapshot):
    """The member granted 1 holds the QoS 2 message unacknowledged at a crash (with or
    without a snapshot since): the group gives it out again after the restart (at least once
    for the QoS 1 copy, MQTT-4.4.0-1). It was journaled as given when sent, so it reached no
    one (the member was not sent it again, H was not given it)."""
    b = broker()
    _, low_member = _mixed(b, uid, 1, h_online=False)
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/x", b"M", qos=2)
    (got,) = publishes(low_member)
    assert (got.payload, got.qos) == (b"M", 1)      # not acknowledged
    if snapshot:
        later = b.client(f"{uid}-later", clean=False)
        later.subscribe(f"{uid}/other", qos=1)
        wait_for_snapshot(b.config["data_dir"], f"{uid}-later",
                          pred=lambda s: s["subscriptions"])
    assert pub.ping() == []
    b2 = _restart(broker, b)
    low_member = b2.client(f"{uid}-L", clean=False)
    h = b2.client(f"{uid}-H", clean=False)
    again = _drain(low_member) + _drain(h)
    assert [p.payload for p in again] == [b"M"], again
