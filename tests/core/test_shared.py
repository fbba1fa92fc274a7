"""Shared subscriptions ($share/<group>/<filter>) on the real broker, with raw 3.1.1 and 5.0
clients from the independent encoders (tests/mqttraw.py, tests/mqttraw5.py) and paho:
distribution, hand-over, slow members, backlogs read from the log, ACLs, bad share names,
configuration, a restart, unsubscribing (docs/protocol.md, "Shared subscriptions")."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import mqttraw as m
import mqttraw5 as m5
from conftest import REPO, _open_clients
from core.test_mqtt5 import V5
from secfiles import write_acl, write_passwords

pytestmark = pytest.mark.timeout(90)


def raw5(b) -> m5.RawClient5:
    """A raw 5.0 client socket (closed after the test)."""
    c = m5.RawClient5(b.host, b.port)
    _open_clients.append(c)
    return c


def member(b, client_id, topic_filter, qos=1, v5=False, **connect):
    """A raw client (5.0 with ``v5``) subscribed to ``topic_filter``."""
    if v5:
        c = raw5(b)
        ack = c.connect(client_id, **connect)
        assert ack.reason == 0, ack
        c.connack = ack
        assert c.subscribe(topic_filter, qos=qos).codes == [qos]
    else:
        c = b.client(client_id, **connect)
        assert c.subscribe(topic_filter, qos=qos).codes == [qos]
    return c


def collect(clients, want: int, ack=True, timeout: float = 20.0) -> dict:
    """The PUBLISH packets each client gets until ``want`` arrived in all (each PINGREQ is a
    barrier: what the broker queued before it comes first); acknowledged with ``ack`` (True,
    False, or the clients that acknowledge)."""
    got = {c: [] for c in clients}
    deadline = time.monotonic() + timeout
    while sum(map(len, got.values())) < want:
        assert time.monotonic() < deadline, (
            f"{sum(map(len, got.values()))} of {want} messages within {timeout} s")
        for c in clients:
            for p in c.ping():
                if p.type == m.PUBLISH:
                    got[c].append(p)
                    if ack is True or ack and c in ack:
                        c.ack(p)
    return got


def publishes(c) -> list:
    return [p for p in c.ping() if p.type == m.PUBLISH]


def payloads(packets) -> list[bytes]:
    return [p.payload for p in packets]


def test_round_robin_over_three_members_each_message_once(srv, uid):
    """Two 3.1.1 members and a 5.0 one; 30 QoS 1 messages: 10 each, none twice."""
    share = f"$share/g/{uid}/#"
    members = [member(srv, f"{uid}-a", share), member(srv, f"{uid}-b", share),
               member(srv, f"{uid}-c", share, v5=True)]
    pub = srv.client(f"{uid}-p")
    sent = [f"m{i}".encode() for i in range(30)]
    for payload in sent:
        pub.publish(f"{uid}/t", payload, qos=1)
    got = collect(members, 30)
    everything = [p.payload for packets in got.values() for p in packets]
    assert sorted(everything) == sorted(sent)                  # each exactly once
    assert [len(got[c]) for c in members] == [10, 10, 10]     # round-robin
    assert all(p.qos == 1 and not p.dup and not p.retain for ps in got.values() for p in ps)
    # Within one member, in the order they were published.
    for c in members:
        assert payloads(got[c]) == [x for x in sent if x in set(payloads(got[c]))]
    assert all(publishes(c) == [] for c in members)
    stats = srv.stats()
    assert stats["shared_groups"] >= 1 and stats["shared_subscriptions"] >= 3
    assert srv.client_row(f"{uid}-a")["subscriptions"] == 1


def test_qos_is_the_lower_of_message_and_member(srv, uid):
    share = f"$share/q/{uid}/t"
    low = member(srv, f"{uid}-0", share, qos=0)
    high = member(srv, f"{uid}-2", share, qos=2)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"x", qos=1)
    pub.publish(f"{uid}/t", b"y", qos=1)
    got = collect([low, high], 2)
    assert [(p.payload, p.qos) for p in got[low]] == [(b"x", 0)]
    assert [(p.payload, p.qos) for p in got[high]] == [(b"y", 1)]


def test_hand_over_when_a_member_disconnects_without_acknowledging(srv, uid):
    """A member that does not acknowledge disconnects: its messages go to the other, DUP 0."""
    share = f"$share/g/{uid}/t"
    silent = member(srv, f"{uid}-silent", share)
    other = member(srv, f"{uid}-other", share, v5=True)
    before = srv.stats()["counters"]["shared_handed_over"]
    pub = srv.client(f"{uid}-p")
    sent = [f"m{i}".encode() for i in range(10)]
    for payload in sent:
        pub.publish(f"{uid}/t", payload, qos=1)
    got = collect([silent, other], 10, ack=False)
    unacked = payloads(got[silent])
    assert len(unacked) == 5 and len(got[other]) == 5
    for p in got[other]:
        other.ack(p)
    mark = srv.mark()
    silent.abort()
    again = collect([other], 5)[other]
    assert sorted(payloads(again)) == sorted(unacked)
    assert all(p.qos == 1 and not p.dup for p in again)            # new deliveries
    assert sorted(payloads(got[other]) + payloads(again)) == sorted(sent)
    assert publishes(other) == []
    assert srv.stats()["counters"]["shared_handed_over"] == before + 5
    assert srv.wait_log(f"session '{uid}-silent' left shared subscription '{share}' with 5 "
                        f"unacknowledged QoS 1 messages: they go to another member", start=mark)


def test_a_message_handed_over_keeps_the_qos_the_group_had_it_at(srv, uid):
    """A QoS 2 message went to a member granted QoS 1, which left without acknowledging it:
    the next member, granted QoS 2, gets it at QoS 2 (MQTT-3.8.4-8; it came at QoS 1)."""
    share = f"$share/g/{uid}/t"
    low = member(srv, f"{uid}-low", share, qos=1)
    high = member(srv, f"{uid}-high", share, qos=2)
    pub = srv.client(f"{uid}-p")
    for payload in (b"0", b"1"):
        pub.publish(f"{uid}/t", payload, qos=2)
    got = collect([low, high], 2, ack=False)
    (unacked,) = got[low]
    assert unacked.qos == 1 and [p.qos for p in got[high]] == [2]
    low.abort()
    (again,) = collect([high], 1, ack=False)[high]
    assert again.payload == unacked.payload and again.qos == 2


def test_a_member_with_a_full_window_does_not_stall_the_group(broker, uid):
    b = broker(limits={"max_inflight_messages": 3})
    share = f"$share/g/{uid}/t"
    slow = member(b, f"{uid}-slow", share)
    fast = member(b, f"{uid}-fast", share)
    pub = b.client(f"{uid}-p")
    sent = [f"m{i}".encode() for i in range(20)]
    for payload in sent:
        pub.publish(f"{uid}/t", payload, qos=1)
    got = collect([slow, fast], 20, ack={fast})
    assert len(got[slow]) == 3            # its window, never acknowledged
    assert len(got[fast]) == 17
    assert sorted(payloads(got[slow]) + payloads(got[fast])) == sorted(sent)
    assert publishes(slow) == []


def test_backlog_beyond_memory_is_read_from_the_log_in_order(broker, uid):
    """No member has room: the group's backlog fills its memory bound (256) and then reads
    the rest from the commit log; every message arrives once, in order, as the member acks."""
    b = broker(limits={"max_inflight_messages": 2})
    share = f"$share/g/{uid}/t"
    c = member(b, f"{uid}-m", share)
    pub = b.client(f"{uid}-p")
    sent = [f"m{i:03d}".encode() for i in range(400)]
    for payload in sent:
        pub.publish(f"{uid}/t", payload, qos=1)
        pub.publish(f"{uid}/other", b"not for the group", qos=1)
    stats = b.stats()
    assert stats["shared_groups_behind"] == 1
    assert stats["counters"]["shared_fell_behind"] == 1
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent):
        assert time.monotonic() < deadline, f"{len(got)} of {len(sent)}"
        p = c.recv_publish()
        got.append(p.payload)
    assert got == sent
    assert publishes(c) == []
    stats = b.stats()
    assert stats["shared_groups_behind"] == 0 and stats["shared_queued_messages"] == 0
    assert stats["counters"]["shared_caught_up"] == 1
    # Live again: the next message goes straight to the member.
    pub.publish(f"{uid}/t", b"live", qos=1)
    assert c.recv_publish().payload == b"live"


def test_max_session_lag_age_moves_a_group_cursor_logged_once_per_episode(broker, uid):
    """A group reading its backlog from the log while its member is away has its cursor
    moved every second by max_session_lag_age: each move wrote a warning. The first is
    logged, the next ones counted, their number logged when the group catches up."""
    b = broker(limits={"max_session_lag_age": 1.0})
    share = f"$share/g/{uid}/t"
    c = member(b, f"{uid}-m", share, clean=False)
    c.disconnect()
    pub = b.client(f"{uid}-p")
    mark = b.mark()
    for i in range(300):                    # past the 256 in memory: read from the log
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    for i in range(300, 316):               # 4 s: the cursor is moved several times
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
        time.sleep(0.25)
    lines = [ln for ln in b.logs[mark:] if share in ln and "lost to it" in ln]
    assert len(lines) == 1 and "the next moves are counted" in lines[0], lines
    back = member(b, f"{uid}-m", share, clean=False)
    got = []
    deadline = time.monotonic() + 20
    while not got or int(got[-1]) < 315:
        assert time.monotonic() < deadline, got[-3:]
        got.append(back.recv_publish().payload)
    assert b.wait_log(lambda ln: f"shared subscription {share!r} caught up with the log; "
                      in ln and "more records were lost to it" in ln, start=mark)


def test_a_group_ending_counts_the_backlog_it_had_still_to_read_from_the_log(broker, uid):
    """The last member's session ends while the group reads its backlog from the log: every
    message it had not handed out is counted as shared_left, not only those in memory."""
    b = broker()
    share = f"$share/g/{uid}/t"
    member(b, f"{uid}-m", share, clean=False).disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(400):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    assert b.stats()["shared_groups_behind"] == 1
    mark = b.mark()
    b.client(f"{uid}-m", clean=True)             # ends the session, and the group with it
    line = b.wait_log("its last member left", start=mark)
    assert b.stats()["dropped"]["shared_left"] == 400
    assert line and "256 queued messages dropped, and the 144 log records" in line, line


def test_a_5_0_backlog_read_from_the_log_keeps_its_properties(broker, uid):
    """Large messages overflow the backlog's 256 KiB: the rest is read back from the log
    (log format 2), each with its publisher's properties and the member's identifier."""
    b = broker(limits={"max_inflight_messages": 1})
    c = raw5(b)
    c.connect(f"{uid}-m")
    assert c.subscribe(f"$share/g/{uid}/t", qos=1, props={m5.SUBSCRIPTION_ID: 3}).codes == [1]
    pub = raw5(b)
    pub.connect(f"{uid}-p")
    for i in range(6):
        pub.publish(f"{uid}/t", bytes([i]) * 100_000, qos=1,
                    props={m5.USER_PROPERTY: [("n", str(i))], m5.CONTENT_TYPE: "x/y"})
    assert b.stats()["counters"]["shared_fell_behind"] == 1
    got = []
    for _ in range(6):
        p = c.recv_publish()          # acknowledged: the next one may come
        got.append(p)
    assert [p.payload[:1] for p in got] == [bytes([i]) for i in range(6)]
    for i, p in enumerate(got):
        assert p.properties[m5.USER_PROPERTY] == [("n", str(i))]
        assert p.properties[m5.CONTENT_TYPE] == "x/y"
        assert p.properties[m5.SUBSCRIPTION_ID] == [3]
    assert publishes(c) == []


def test_qos0_with_no_member_online_is_dropped_counted_and_logged(broker, uid):
    """Counted each; logged when the dropping starts and, with the count, when it ends."""
    b = broker()
    share = f"$share/g/{uid}/t"
    c = member(b, f"{uid}-m", share, clean=False)
    c.disconnect()
    mark = b.mark()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"q0", qos=0)
    pub.publish(f"{uid}/t", b"q0 again", qos=0)
    pub.publish(f"{uid}/t", b"q1", qos=1)
    assert pub.ping() == []
    assert b.stats()["dropped"]["shared_no_room"] == 2
    back = b.client(f"{uid}-m", clean=False)
    assert back.connack.session_present
    assert payloads([back.recv_publish()]) == [b"q1"]      # the QoS 1 one waited
    pub.publish(f"{uid}/t", b"q0 taken", qos=0)
    assert payloads([back.recv_publish()]) == [b"q0 taken"]
    assert publishes(back) == []
    lines = [ln for ln in b.logs[mark:] if f"shared subscription '{share}'" in ln]
    assert len(lines) == 2, lines
    assert "no member can take a QoS 0 message" in lines[0]
    assert "takes QoS 0 messages again; 2 were dropped" in lines[1]


def test_a_full_backlog_drops_counts_and_logs_once_per_episode(broker, uid):
    """max_queued_messages bounds a group's backlog (set, the log is not the queue): each
    message past it is counted; the episode is logged when it starts and, with the count,
    when the backlog drains."""
    b = broker(limits={"max_queued_messages": 2})
    share = f"$share/g/{uid}/t"
    c = member(b, f"{uid}-m", share, clean=False)
    c.disconnect()
    mark = b.mark()
    pub = b.client(f"{uid}-p")
    for i in range(10):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    s = b.stats()
    assert s["dropped"]["max_queued_messages"] == 8 and s["limit_hits"]["max_queued_messages"] == 8
    back = b.client(f"{uid}-m", clean=False)
    assert payloads(collect([back], 2)[back]) == [b"0", b"1"]
    line = b.wait_log("its backlog drained", start=mark)
    assert line and "8 messages were dropped" in line
    lines = [ln for ln in b.logs[mark:] if f"shared subscription '{share}'" in ln]
    assert len(lines) == 2 and "its backlog is full (2 messages" in lines[0], lines
    assert "max_queued_messages 2" in lines[0]


def test_qos2_stays_with_its_member_and_is_lost_with_its_session(broker, uid):
    """MQTT-4.8.2-4/5: a QoS 2 message in flight is completed with the same member when it
    comes back, and is not sent to another member when its session ends."""
    b = broker()
    share = f"$share/g/{uid}/t"
    keeper = member(b, f"{uid}-keep", share, qos=2, clean=False)
    other = member(b, f"{uid}-other", share, qos=2)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"one", qos=2)
    (first,) = publishes(keeper)
    keeper.close()
    assert publishes(other) == []
    keeper = b.client(f"{uid}-keep", clean=False)
    again = keeper.recv_publish()
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"one", 2, True,
                                                                      first.packet_id)
    # A clean member's session ends with its connection: its QoS 2 message is lost.
    keeper.disconnect()
    gone = member(b, f"{uid}-gone", share, qos=2)
    other.disconnect()
    pub.publish(f"{uid}/t", b"two", qos=2)
    assert payloads(publishes(gone)) == [b"two"]
    mark = b.mark()
    gone.abort()
    assert b.wait_log(f"session '{uid}-gone' ended with 1 unacknowledged messages of shared "
                      f"subscriptions", start=mark)
    assert b.stats()["dropped"]["shared_left"] == 1
    keeper = b.client(f"{uid}-keep", clean=False)
    assert publishes(keeper) == []


@pytest.mark.parametrize("end", ["clean session", "expiry"])
def test_qos2_of_an_offline_member_whose_session_ends_is_counted(broker, uid, end):
    """An offline persistent member holds a group's QoS 2 message unacknowledged; its session
    ends (its client comes back with clean session 1, or it expires): the message goes to no
    other member (MQTT-4.8.2-5) and is counted as shared_left, and logged."""
    b = broker(limits={"persistent_client_expiration": 1} if end == "expiry" else {})
    share = f"$share/g/{uid}/t"
    keeper = member(b, f"{uid}-keep", share, qos=2, clean=False)
    other = member(b, f"{uid}-other", share, qos=2)
    b.client(f"{uid}-p").publish(f"{uid}/t", b"one", qos=2)
    assert payloads(publishes(keeper)) == [b"one"]
    mark = b.mark()
    keeper.close()
    if end == "clean session":
        b.client(f"{uid}-keep", clean=True)
    assert b.wait_log(f"session '{uid}-keep' ended with 1 unacknowledged messages of shared "
                      f"subscriptions", start=mark)
    dropped = b.stats()["dropped"]
    assert dropped["shared_left"] == 1 and dropped.get("session_expired", 0) == 0
    assert publishes(other) == []


def test_qos2_sent_again_to_a_5_0_member_carries_its_identifier(srv, uid):
    c = raw5(srv)
    c.connect(f"{uid}-m", clean_start=False, props={m5.SESSION_EXPIRY: 60})
    assert c.subscribe(f"$share/g/{uid}/t", qos=2, props={m5.SUBSCRIPTION_ID: 4}).codes == [2]
    srv.client(f"{uid}-p").publish(f"{uid}/t", b"once", qos=2)
    (first,) = publishes(c)
    assert first.properties[m5.SUBSCRIPTION_ID] == [4]
    c.close()
    c = raw5(srv)
    assert c.connect(f"{uid}-m", clean_start=False,
                     props={m5.SESSION_EXPIRY: 60}).session_present
    again = c.recv_publish()
    assert (again.payload, again.dup, again.packet_id) == (b"once", True, first.packet_id)
    assert again.properties[m5.SUBSCRIPTION_ID] == [4]
    c.disconnect(props={m5.SESSION_EXPIRY: 0})


def test_mixed_3_1_1_and_5_0_paho_members(srv, paho, uid):
    """paho 3.1.1 and 5.0 clients in one group: each gets half, the 5.0 one with its own
    Subscription Identifier only."""
    share = f"$share/mix/{uid}/#"
    old = paho(srv.port, client_id=f"{uid}-old")
    assert old.subscribe(share, 1) == [1]
    new = V5(srv.port, client_id=f"{uid}-new")
    try:
        assert new.subscribe(share, qos=1, sub_id=7) == [1]
        assert new.subscribe(f"{uid}/plain/#", qos=1, sub_id=9) == [1]
        pub = srv.client(f"{uid}-p")
        for i in range(6):
            pub.publish(f"{uid}/t", f"m{i}", qos=1)
        got_old = sorted(old.get().payload for _ in range(3))
        got_new = [new.get() for _ in range(3)]
        assert sorted(got_old + [x.payload for x in got_new]) == [f"m{i}".encode()
                                                                  for i in range(6)]
        assert all(x.properties.SubscriptionIdentifier == [7] for x in got_new)
        assert new.none()
        with pytest.raises(TimeoutError):
            old.get(timeout=0.3)
    finally:
        new.close()


def test_overlapping_plain_and_shared_subscriptions_deliver_twice(srv, uid):
    c = srv.client(f"{uid}-c")
    assert c.subscribe((f"{uid}/#", 1), (f"$share/g/{uid}/#", 1)).codes == [1, 1]
    srv.client(f"{uid}-p").publish(f"{uid}/t", b"x", qos=1)
    got = collect([c], 2)[c]
    assert payloads(got) == [b"x", b"x"]


def test_retained_messages_are_not_sent_for_a_shared_subscription(srv, uid):
    srv.client(f"{uid}-p").publish(f"{uid}/r", b"kept", qos=1, retain=True)
    c = srv.client(f"{uid}-c")
    assert c.subscribe(f"$share/g/{uid}/#", qos=1).codes == [1]
    assert publishes(c) == []
    c5 = raw5(srv)
    c5.connect(f"{uid}-c5")
    assert c5.subscribe(f"$share/h/{uid}/#", qos=1).codes == [1]
    assert publishes(c5) == []
    assert c.subscribe(f"{uid}/#", qos=1).codes == [1]
    assert [(p.payload, p.retain) for p in publishes(c)] == [(b"kept", True)]


def test_unsubscribe_leaves_the_group_and_keeps_what_it_was_sent(srv, uid):
    share = f"$share/g/{uid}/t"
    a = member(srv, f"{uid}-a", share)
    z = member(srv, f"{uid}-z", share, v5=True)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"1", qos=1)
    (held,) = publishes(a)
    groups = srv.stats()["shared_groups"]
    assert a.unsubscribe(share).type == m.UNSUBACK
    a.ack(held)                               # still acknowledged normally
    for i in range(3):
        pub.publish(f"{uid}/t", f"after{i}", qos=1)
    assert publishes(a) == []
    assert sorted(payloads(collect([z], 3)[z])) == [b"after0", b"after1", b"after2"]
    assert z.unsubscribe(share, f"$share/other/{uid}/t").codes == [0x00, 0x11]
    assert srv.stats()["shared_groups"] == groups - 1
    pub.publish(f"{uid}/t", b"nobody", qos=1)
    assert publishes(z) == [] and publishes(a) == []


@pytest.mark.parametrize("bad", ["$share//a", "$share/+/a", "$share/#", "$share/g",
                                 "$share/g/"])
def test_bad_share_names_are_refused_in_the_suback(srv, uid, bad):
    c5 = raw5(srv)
    c5.connect(f"{uid}-5")
    mark = srv.mark()
    assert c5.subscribe(bad, (f"$share/ok/{uid}", 1), qos=1).codes == [0x8F, 1]
    assert srv.wait_log(lambda ln: f"'{uid}-5'" in ln and "MQTT-4.8.2-" in ln
                        and "refused in the SUBACK" in ln, start=mark)
    c = srv.client(f"{uid}-3")
    assert c.subscribe(bad, (f"$share/ok/{uid}", 1), qos=1).codes == [0x80, 1]


def test_no_local_on_a_shared_subscription_is_a_protocol_error(srv, uid):
    c5 = raw5(srv)
    c5.connect(f"{uid}-5")
    c5.send(m5.subscribe5(1, [(f"$share/g/{uid}", 0x04 | 1)]))
    assert c5.expect_disconnect().reason == 0x82


def test_turned_off_by_configuration(broker, uid):
    b = broker(shared_subscriptions=False)
    c5 = raw5(b)
    ack = c5.connect(f"{uid}-5")
    assert ack.properties[m5.SHARED_SUB_AVAILABLE] == 0
    assert c5.subscribe(f"$share/g/{uid}", f"{uid}/plain", qos=1).codes == [0x9E, 1]
    c = b.client(f"{uid}-3")
    assert c.subscribe(f"$share/g/{uid}", f"{uid}/plain", qos=1).codes == [0x80, 1]
    assert b.stats()["shared_groups"] == 0
    # Each refused filter wrote a line with the whole filter (2,000 of 20 KB: 40 MB of log):
    # the first 16 of a connection (one was above), shortened, then one line that more
    # are not.
    mark = b.mark()
    many = [f"$share/g{i}/{uid}/" + "x" * 20000 for i in range(30)]
    assert c.subscribe(*many).codes == [0x80] * 30
    b.wait_log("more subscriptions refused", start=mark)
    lines = [ln for ln in b.logs[mark:] if f"'{uid}-3'" in ln]
    assert len(lines) == 16 and "shared_subscriptions is off" in lines[0], lines[-2:]
    assert max(len(ln) for ln in lines) < 500
    # Turned on (the default), the CONNACK leaves the property out: available.
    on = broker()
    c5 = raw5(on)
    assert m5.SHARED_SUB_AVAILABLE not in c5.connect(f"{uid}-on").properties


ACL = """\
user alice
topic read sensors/#
topic readwrite alice/#

pattern readwrite devices/%c/#
"""


def test_acl_applies_to_the_filter_inside_the_share(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw", "pub": "pub-pw"})
    acl = write_acl(tmp_path / "acl", ACL + "\nuser pub\ntopic readwrite #\n")
    b = broker(password_file=str(pw), acl_file=str(acl))
    alice = b.client(f"{uid}-a", username="alice", password="alice-pw")
    assert alice.subscribe("$share/g/sensors/#", "$share/g/secret/#", "$share/h/alice/+",
                           qos=1).codes == [1, 0x80, 1]
    a5 = raw5(b)
    a5.connect(f"{uid}-a5", username="alice", password=b"alice-pw")
    assert a5.subscribe("$share/g/sensors/#", "$share/g/secret/#", qos=1).codes == [1, 0x87]
    # A pattern ACL (readwrite #-like rules per client): the share prefix does not count.
    dev = b.client(f"{uid}-d", username="alice", password="alice-pw")
    assert dev.subscribe(f"$share/g/devices/{uid}-d/#", qos=1).codes == [1]
    pub = b.client(f"{uid}-p", username="pub", password="pub-pw")
    pub.publish("sensors/1", b"s", qos=1)
    got = collect([alice, a5], 1)
    assert [p.payload for ps in got.values() for p in ps] == [b"s"]


def test_acl_applies_to_a_backlog_held_as_log_offsets(broker, tmp_path, uid):
    """A group's backlog restored from the snapshot holds log offsets, not topics: each is
    still checked against the member it would go to (it was sent unchecked). Here bob may
    read jobs/secret and alice may not: while only alice is back it waits for bob, and
    alice gets the message behind it that she may read."""
    pw = write_passwords(tmp_path / "passwd", {"alice": "a-pw", "bob": "b-pw", "pub": "p-pw"})
    acl = write_acl(tmp_path / "acl", "user alice\ntopic read jobs/#\ntopic deny jobs/secret\n"
                                      "user bob\ntopic read jobs/#\n"
                                      "user pub\ntopic readwrite #\n")
    config = {"password_file": str(pw), "acl_file": str(acl)}
    b = broker(**config)
    for user, password in (("alice", "a-pw"), ("bob", "b-pw")):
        c = b.client(f"{uid}-{user}", username=user, password=password, clean=False)
        assert c.subscribe("$share/g/jobs/#", qos=1).codes == [1]
        c.disconnect()
    pub = b.client(f"{uid}-p", username="pub", password="p-pw")
    for topic in ("jobs/secret", "jobs/ok"):
        pub.publish(topic, topic.encode(), qos=1)     # nobody online: the group's backlog
    assert b.stop() == 0
    b2 = broker(data_dir=b.config["data_dir"], **config)
    alice = b2.client(f"{uid}-alice", username="alice", password="a-pw", clean=False)
    assert alice.connack.session_present
    assert payloads(collect([alice], 1)[alice]) == [b"jobs/ok"]
    bob = b2.client(f"{uid}-bob", username="bob", password="b-pw", clean=False)
    assert payloads(collect([bob], 1)[bob]) == [b"jobs/secret"]
    assert publishes(alice) == []


def test_acl_pattern_readwrite_hash_allows_shared_subscriptions(broker, tmp_path, uid):
    """The issue's case: `pattern readwrite #` refused every $share/... subscription."""
    acl = write_acl(tmp_path / "acl", "pattern readwrite #\n")
    b = broker(acl_file=str(acl))
    c = b.client(f"{uid}-c")
    assert c.subscribe(f"$share/g/{uid}/#", qos=1).codes == [1]
    b.client(f"{uid}-p").publish(f"{uid}/x", b"ok", qos=1)
    assert payloads([c.recv_publish()]) == [b"ok"]


def test_shared_subscriptions_and_their_backlog_survive_a_restart(broker, uid):
    b = broker()
    share = f"$share/g/{uid}/t"
    c = b.client(f"{uid}-m", clean=False)
    assert c.subscribe(share, qos=1).codes == [1]
    c5 = raw5(b)
    c5.connect(f"{uid}-m5", clean_start=False, props={m5.SESSION_EXPIRY: 600})
    assert c5.subscribe(share, qos=1, props={m5.SUBSCRIPTION_ID: 5}).codes == [1]
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"to-m", qos=1)
    (held,) = publishes(c)          # in flight to the 3.1.1 member, never acknowledged
    c.disconnect()
    c5.disconnect()
    for i in range(4):
        pub.publish(f"{uid}/t", f"q{i}", qos=1)    # nobody online: the group's backlog
    assert b.stop() == 0
    inspect = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "sessions",
                              "--data-dir", b.config["data_dir"], "--format", "json"],
                             cwd=REPO, capture_output=True, text=True, timeout=30)
    assert inspect.returncode == 0, inspect.stderr
    rows = {s["client_id"]: s for s in json.loads(inspect.stdout)["sessions"]}
    assert rows[f"{uid}-m"]["subscriptions"] == {share: 1}
    assert rows[f"{uid}-m5"]["subscriptions"] == {share: 1}
    b2 = broker(data_dir=b.config["data_dir"])
    stats = b2.stats()
    assert stats["shared_groups"] == 1 and stats["shared_subscriptions"] == 2
    back = raw5(b2)
    assert back.connect(f"{uid}-m5", clean_start=False,
                        props={m5.SESSION_EXPIRY: 600}).session_present
    got = collect([back], 5)[back]
    # The message the 3.1.1 member had not acknowledged went back to the group at the stop.
    assert sorted(payloads(got)) == sorted([held.payload] + [f"q{i}".encode() for i in range(4)])
    assert all(p.properties.get(m5.SUBSCRIPTION_ID) == [5] for p in got)
    # The 3.1.1 member is still a member: new messages are shared between the two again.
    m311 = b2.client(f"{uid}-m", clean=False)
    assert m311.connack.session_present
    pub = b2.client(f"{uid}-p")
    for i in range(4):
        pub.publish(f"{uid}/t", f"n{i}", qos=1)
    got = collect([back, m311], 4)
    assert len(got[back]) == 2 and len(got[m311]) == 2


def test_shared_figures_in_sys(broker, uid):
    b = broker(sys_interval=0.5)
    watch = b.client(f"{uid}-w")
    watch.subscribe("$SYS/broker/shared_subscriptions/#")
    member(b, f"{uid}-a", f"$share/g/{uid}/t")
    member(b, f"{uid}-b", f"$share/g/{uid}/t")
    want = {"$SYS/broker/shared_subscriptions/count": b"2",
            "$SYS/broker/shared_subscriptions/groups": b"1"}
    seen = {}
    deadline = time.monotonic() + 10
    while any(seen.get(t) != v for t, v in want.items()):
        assert time.monotonic() < deadline, seen
        p = watch.recv_publish(timeout=5)
        seen[p.topic] = p.payload
