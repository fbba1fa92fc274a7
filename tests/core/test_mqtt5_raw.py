"""MQTT 5.0 against a real broker, from the independent raw-socket client (tests/mqttraw5.py):
Receive Maximum, Message Expiry while queued, the client's Maximum Packet Size, Will Delay
Interval, Subscription Identifier in a client's PUBLISH, a resumed window and Receive Maximum,
Reason Strings within the client's Maximum Packet Size, No Local and Subscription Identifiers."""

from __future__ import annotations

import signal
import time

import pytest

import mqttraw5 as R
from conftest import _open_clients

pytestmark = pytest.mark.timeout(60)


def raw5(b, client_id, **kw) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    connack = c.connect(client_id, **kw)
    assert connack.reason == 0, connack
    return c


def quiet(c, wait: float = 0.0) -> bool:
    """Nothing arrived for ``c`` after ``wait`` s (time for a deadline to pass), up to the
    answer to a PINGREQ sent then."""
    time.sleep(wait)
    return c.ping() == []


def publishes(c, n, timeout=5.0) -> list:
    return [c.wait_for(lambda p: p.type == R.PUBLISH, timeout) for _ in range(n)]


def test_receive_maximum_bounds_the_messages_in_flight(srv, uid):
    sub = raw5(srv, f"{uid}-s", props={R.RECEIVE_MAXIMUM: 2})
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw5(srv, f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    first = publishes(sub, 2)
    assert [p.payload for p in first] == [b"0", b"1"]
    assert quiet(sub)                       # the third waits for an acknowledgement
    sub.ack(first[0])
    (third,) = publishes(sub, 1)
    assert third.payload == b"2"
    for p in [first[1], third]:
        sub.ack(p)
    assert [p.payload for p in publishes(sub, 2)] == [b"3", b"4"]


def test_message_expiry_while_queued(srv, uid):
    sub = raw5(srv, f"{uid}-s", props={R.RECEIVE_MAXIMUM: 1})
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw5(srv, f"{uid}-p")
    pub.publish(f"{uid}/t", b"first", qos=1)
    pub.publish(f"{uid}/t", b"short", qos=1, props={R.MESSAGE_EXPIRY: 1})
    pub.publish(f"{uid}/t", b"long", qos=1, props={R.MESSAGE_EXPIRY: 600})
    (first,) = publishes(sub, 1)
    before = srv.stats()["dropped"]["message_expired"]
    # The queued ones wait behind the unacknowledged first until "short" has expired.
    assert quiet(sub, 1.2)
    sub.ack(first)
    (nxt,) = publishes(sub, 1)
    assert nxt.payload == b"long"
    assert 598 <= nxt.properties[R.MESSAGE_EXPIRY] <= 600
    assert srv.stats()["dropped"]["message_expired"] == before + 1


def test_a_message_larger_than_the_clients_maximum_packet_size_is_not_sent(srv, uid):
    sub = raw5(srv, f"{uid}-s", props={R.MAXIMUM_PACKET_SIZE: 100})
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw5(srv, f"{uid}-p")
    pub.publish(f"{uid}/t", b"x" * 200, qos=1)
    pub.publish(f"{uid}/t", b"small", qos=1)
    (p,) = publishes(sub, 1)
    assert p.payload == b"small"
    assert srv.stats()["dropped"]["packet_too_large"] >= 1


def frame_size(p) -> int:
    """Bytes of the frame ``p`` was read from."""
    return 1 + len(R.varint(len(p.body))) + len(p.body)


def test_reason_strings_are_left_out_rather_than_exceed_the_clients_maximum_packet_size(
        broker, uid):
    """MQTT-3.1.2-24 and the Reason String rules of CONNACK (3.2.2-19), PUBACK (3.4.2-2) and
    DISCONNECT (3.14.2-3): a client with a Maximum Packet Size of 16 gets the reason codes,
    without the Reason Strings that would make the packets larger; a client without one
    gets the Reason String. An accepting CONNACK leaves out what a client may go without."""
    b = broker(limits={"max_qos": 1})
    small = {R.MAXIMUM_PACKET_SIZE: 16}
    refused = R.RawClient5(b.host, b.port)
    _open_clients.append(refused)
    ack = refused.connect(f"{uid}-r", props=small, will=(f"{uid}/w", b"x", 2))
    assert ack.reason == 0x9B and frame_size(ack) <= 16, ack            # QoS not supported
    tiny = R.RawClient5(b.host, b.port)
    _open_clients.append(tiny)
    ack = tiny.connect(f"{uid}-tiny", props={R.MAXIMUM_PACKET_SIZE: 10})
    # Accepted without Topic Alias Maximum and Maximum Packet Size (18 bytes with them); the
    # Receive Maximum (receive_maximum's default, 1024) stays.
    assert ack.reason == 0 and frame_size(ack) <= 10, ack
    assert ack.properties == {R.MAXIMUM_QOS: 1, R.RECEIVE_MAXIMUM: 1024}, ack
    c = raw5(b, uid, props=small)
    ack = c.publish("$SYS/x", b"x", qos=1)
    assert ack.reason == 0x87 and frame_size(ack) <= 16, ack            # not authorized
    told = raw5(b, f"{uid}-t")
    assert told.publish("$SYS/x", b"x", qos=1).properties.get(R.REASON_STRING)
    raw5(b, uid)                                                        # takes the session over
    d = c.expect_disconnect()
    assert d.reason == 0x8E and frame_size(d) <= 16, d
    c = raw5(b, f"{uid}-2", props=small)
    c.send(R.publish5(f"{uid}/t", b"x", 0, props={R.SUBSCRIPTION_ID: 5}))
    d = c.expect_disconnect()
    assert d.reason == 0x82 and frame_size(d) <= 16, d                  # protocol error


def test_a_malformed_5_0_connect_gets_a_5_0_connack_saying_why(srv, uid):
    """A 5.0 CONNECT that does not decode (a Topic Alias among its properties, MQTT-2.2.2.2)
    is answered with CONNACK 0x81 and a Reason String, then closed, and counted as a
    protocol error."""
    before = srv.stats()["counters"]["protocol_errors"]
    c = R.RawClient5(srv.host, srv.port)
    _open_clients.append(c)
    c.send(R.connect5(uid, props={R.TOPIC_ALIAS: 1}))
    assert c.expect_closed()
    (ack,) = [p for p in c.before_close if p.type == R.CONNACK]
    assert ack.reason == 0x81 and "Topic Alias" in ack.properties[R.REASON_STRING], ack
    assert srv.stats()["counters"]["protocol_errors"] == before + 1


def test_a_message_expiry_interval_of_0_is_read_as_none(srv, uid):
    """As Mosquitto reads it: the message goes to the subscriber without the property, and a
    retained one stays for a later subscriber."""
    sub = raw5(srv, f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw5(srv, f"{uid}-p")
    pub.publish(f"{uid}/t", b"zero", qos=1, props={R.MESSAGE_EXPIRY: 0})
    pub.publish(f"{uid}/r", b"kept", qos=1, retain=True, props={R.MESSAGE_EXPIRY: 0})
    (p,) = publishes(sub, 1)
    assert p.payload == b"zero" and R.MESSAGE_EXPIRY not in p.properties, p
    sub.ack(p)
    time.sleep(1.1)                      # past any interval rounded up from 0
    sub.subscribe(f"{uid}/r", qos=1)
    (r,) = publishes(sub, 1)
    assert r.payload == b"kept" and r.retain and R.MESSAGE_EXPIRY not in r.properties, r


def test_a_reload_that_lowers_the_announced_limits_applies_to_connections_made_after_it(
        broker, uid):
    """Maximum QoS, Retain Available, Receive Maximum and Topic Alias Maximum are in the
    CONNACK: a client told 2, 1, 3 and 2 keeps them after a reload lowers them all; a client
    connecting after the reload is told the new ones, and held to them."""
    import signal
    from conftest import toml_dumps
    limits = {"max_qos": 2, "retain_available": True, "receive_maximum": 3,
              "max_topic_alias": 2}
    b = broker(limits=limits)
    before = raw5(b, f"{uid}-before")
    lower = {"max_qos": 1, "retain_available": False, "receive_maximum": 1,
             "max_topic_alias": 1}
    mark = b.mark()
    b.config_path.write_text(toml_dumps(dict(b.config, limits=lower)))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)
    for i in range(3):                       # QoS 2, retained, 3 awaiting PUBREL, alias 2
        before.send(R.publish5(f"{uid}/t", b"%d" % i, 2, retain=True, packet_id=i + 1,
                               props={R.TOPIC_ALIAS: 2}))
    recs = [before.wait_for(lambda p: p.type == R.PUBREC) for _ in range(3)]
    assert [p.reason for p in recs] == [0, 0, 0]
    after = R.RawClient5(b.host, b.port)
    _open_clients.append(after)
    ack = after.connect(f"{uid}-after")
    assert (ack.properties[R.MAXIMUM_QOS], ack.properties[R.RETAIN_AVAILABLE],
            ack.properties[R.RECEIVE_MAXIMUM], ack.properties[R.TOPIC_ALIAS_MAXIMUM]) == (
                1, 0, 1, 1)
    after.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=1))
    assert after.expect_disconnect().reason == 0x9B          # QoS not supported


def test_a_reload_that_raises_max_inflight_keeps_a_connected_clients_receive_maximum(
        broker, uid):
    """A client's Receive Maximum (3) at or above max_inflight_messages (2) was not kept:
    after a reload raised the limit to 50 the client was sent 50 messages at once."""
    import signal
    from conftest import toml_dumps
    b = broker(limits={"max_inflight_messages": 2})
    sub = raw5(b, f"{uid}-s", props={R.RECEIVE_MAXIMUM: 3})
    sub.subscribe(f"{uid}/t", qos=1)
    mark = b.mark()
    b.config_path.write_text(toml_dumps(dict(b.config, limits={"max_inflight_messages": 50})))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)
    pub = raw5(b, f"{uid}-p")
    for i in range(10):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    first = publishes(sub, 3)
    assert [p.payload for p in first] == [b"0", b"1", b"2"]
    assert quiet(sub)                       # the fourth waits for an acknowledgement
    sub.ack(first[0])
    assert [p.payload for p in publishes(sub, 1)] == [b"3"]


def test_a_filter_listed_twice_in_an_unsubscribe_is_removed_once(srv, uid):
    """The first removes it (0x00); the second finds no subscription (0x11)."""
    c = raw5(srv, uid)
    c.subscribe((f"{uid}/a", 1))
    ack = c.unsubscribe(f"{uid}/a", f"{uid}/a", f"{uid}/b")
    assert list(ack.codes) == [0x00, 0x11, 0x11]


def test_will_delay_interval(srv, uid):
    watcher = raw5(srv, f"{uid}-w")
    watcher.subscribe(f"{uid}/will", qos=1)
    will = (f"{uid}/will", b"gone", 1, False, {R.WILL_DELAY: 1})
    expiry = {R.SESSION_EXPIRY: 60}
    # Back within the delay: no will.
    c = raw5(srv, f"{uid}-c", props=expiry, will=will)
    c.close()                                    # no DISCONNECT: the will is due
    back = raw5(srv, f"{uid}-c", clean_start=False, props=expiry, will=will)
    assert quiet(watcher, 1.5)
    # Not back: published after the delay.
    back.close()
    mark = srv.mark()
    (p,) = publishes(watcher, 1, timeout=5)
    assert p.payload == b"gone"
    assert srv.wait_log(lambda line: "publishing will of" in line, start=mark)


def test_a_takeover_that_resumes_the_session_does_not_publish_the_will(srv, uid):
    """A 5.0 connection taken over by one that resumes its session (Clean Start 0): the new
    connection came before the Will Delay Interval, 0 here, passed, so no will (MQTT-3.1.2-8;
    Mosquitto publishes none either). Taken over with Clean Start 1, the session ends: the
    will goes (MQTT-3.1.3-9)."""
    watcher = raw5(srv, f"{uid}-w")
    watcher.subscribe(f"{uid}/will", qos=1)
    expiry = {R.SESSION_EXPIRY: 60}
    old = raw5(srv, f"{uid}-c", props=expiry, will=(f"{uid}/will", b"resumed", 1, False))
    mark = srv.mark()
    back = raw5(srv, f"{uid}-c", clean_start=False, props=expiry)
    assert old.expect_disconnect().reason == 0x8E
    assert srv.wait_log(lambda ln: "not published: a new connection took its session over"
                        in ln, start=mark)
    assert quiet(watcher)
    # the session ends with the takeover: its will is published
    back.close()
    old = raw5(srv, f"{uid}-c", clean_start=False, props=expiry,
               will=(f"{uid}/will", b"ended", 1, False))
    raw5(srv, f"{uid}-c", clean_start=True)
    assert old.expect_disconnect().reason == 0x8E
    assert [p.payload for p in publishes(watcher, 1)] == [b"ended"]


def test_will_delay_ends_with_the_session(srv, uid):
    """A session ending before the delay (here: Session Expiry Interval 0) sends the will."""
    watcher = raw5(srv, f"{uid}-w")
    watcher.subscribe(f"{uid}/will", qos=1)
    c = raw5(srv, f"{uid}-c", will=(f"{uid}/will", b"now", 1, False, {R.WILL_DELAY: 300}))
    c.close()
    (p,) = publishes(watcher, 1, timeout=5)
    assert p.payload == b"now"


def test_subscription_identifier_in_a_clients_publish_is_a_protocol_error(srv, uid):
    c = raw5(srv, f"{uid}-c")
    c.send(R.publish5(f"{uid}/t", b"x", 0, props={R.SUBSCRIPTION_ID: 5}))
    d = c.expect_disconnect()
    assert d.reason == 0x82
    assert "MQTT-3.3.4-6" in d.properties[R.REASON_STRING]


def test_a_topic_alias_of_0_gets_disconnect_0x94(srv, uid):
    """Topic Alias 0 (MQTT-3.3.2-8) is answered as an alias past the maximum is: Topic Alias
    invalid, as Mosquitto does."""
    c = raw5(srv, f"{uid}-c")
    c.send(R.publish5(f"{uid}/t", b"x", 0, props={R.TOPIC_ALIAS: 0}))
    d = c.expect_disconnect()
    assert d.reason == 0x94
    assert "Topic Alias is 0" in d.properties[R.REASON_STRING]


def test_max_qos_and_retain_available(broker, uid):
    b = broker(limits={"max_qos": 1, "retain_available": False})
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    connack = c.connect(f"{uid}-c")
    assert connack.properties[R.MAXIMUM_QOS] == 1
    assert connack.properties[R.RETAIN_AVAILABLE] == 0
    assert c.subscribe(f"{uid}/t", qos=2).codes == [1]     # granted at most max_qos
    c.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=3))
    assert c.expect_disconnect().reason == 0x9B
    r = R.RawClient5(b.host, b.port)
    _open_clients.append(r)
    r.connect(f"{uid}-r")
    r.send(R.publish5(f"{uid}/t", b"x", 0, retain=True))
    assert r.expect_disconnect().reason == 0x9A
    w = R.RawClient5(b.host, b.port)
    _open_clients.append(w)
    assert w.connect(f"{uid}-w", will=(f"{uid}/w", b"x", 2)).reason == 0x9B
    old = b.raw()
    old.send(R.mqttraw.connect(f"{uid}-old"))
    old.expect(R.CONNACK)
    old.send(R.mqttraw.publish(f"{uid}/t", b"x", 0, retain=True))
    assert old.expect_closed()


def test_will_payload_not_utf8_with_payload_format_1_gets_connack_0x99(srv, uid):
    """A will with Payload Format Indicator 1 whose payload is not UTF-8 is refused as a
    PUBLISH's is (3.1.3.2.3; was accepted, and its subscribers got a payload its own
    indicator calls text); counted, and a well-formed one is still accepted."""
    watcher = raw5(srv, f"{uid}-w")
    watcher.subscribe(f"{uid}/will", qos=1)
    before = srv.stats()["refused"]["payload_format"]
    bad = R.RawClient5(srv.host, srv.port)
    _open_clients.append(bad)
    ack = bad.connect(f"{uid}-bad", will=(f"{uid}/will", b"ok \xff", 1, False,
                                          {R.PAYLOAD_FORMAT: 1}))
    assert ack.reason == 0x99
    assert "will payload is not well-formed UTF-8 at byte 3" in ack.properties[R.REASON_STRING]
    assert bad.expect_closed()
    assert srv.stats()["refused"]["payload_format"] == before + 1
    good = raw5(srv, f"{uid}-good", will=(f"{uid}/will", "gr\u00fc\u00df".encode(), 1, False,
                                         {R.PAYLOAD_FORMAT: 1}))
    good.close()                                 # no DISCONNECT: the will is sent
    will = watcher.recv_publish()
    assert will.payload == "gr\u00fc\u00df".encode() and will.properties[R.PAYLOAD_FORMAT] == 1


def test_the_brokers_receive_maximum(broker, uid):
    b = broker(limits={"receive_maximum": 2})
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(f"{uid}-c").properties[R.RECEIVE_MAXIMUM] == 2
    for pid in (1, 2):                      # two QoS 2 exchanges left awaiting PUBREL
        c.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=pid))
        c.wait_for(lambda p, pid=pid: p.type == R.PUBREC and p.packet_id == pid)
    c.send(R.pubrel5(1))                    # one ends: room for one more
    c.wait_for(lambda p: p.type == R.PUBCOMP)
    c.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=3))
    c.wait_for(lambda p: p.type == R.PUBREC and p.packet_id == 3)
    c.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=4))
    assert c.expect_disconnect().reason == 0x93


def test_ids_held_from_before_that_the_client_finished_do_not_count_against_it(broker, uid):
    """Two QoS 2 ids await PUBREL when the client goes; it comes back without resending the
    PUBRELs (as when a crash kept ids the client had finished). Its new QoS 2 PUBLISHes are
    taken, an old id forgotten for each (they counted against the Receive Maximum of 2, and
    the first new one got DISCONNECT 0x93); a late PUBREL still gets its PUBCOMP, and a
    PUBLISH beyond the window of this connection's own is refused as before."""
    b = broker(limits={"receive_maximum": 2})
    keep = {R.SESSION_EXPIRY: 300}
    sub = raw5(b, f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    c = raw5(b, f"{uid}-c", props=keep)
    for pid in (1, 2):
        c.send(R.publish5(f"{uid}/t", b"old %d" % pid, 2, packet_id=pid))
        c.wait_for(lambda p, pid=pid: p.type == R.PUBREC and p.packet_id == pid)
    c.abort()
    mark = b.mark()
    back = raw5(b, f"{uid}-c", clean_start=False, props=keep)
    for pid in (3, 4):
        back.send(R.publish5(f"{uid}/t", b"new %d" % pid, 2, packet_id=pid))
        back.wait_for(lambda p, pid=pid: p.type == R.PUBREC and p.packet_id == pid)
    assert b.wait_log(lambda ln: "held from before this connection" in ln, start=mark)
    back.send(R.pubrel5(1))                           # late: answered all the same
    assert back.wait_for(lambda p: p.type == R.PUBCOMP).packet_id == 1
    back.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=5))
    assert back.expect_disconnect().reason == 0x93    # 3 and 4 are this connection's own
    got = sorted(p.payload for p in publishes(sub, 4))
    assert got == [b"new 3", b"new 4", b"old 1", b"old 2"]


def test_records_replayed_after_a_crash_keep_their_publisher_and_properties(broker, uid):
    """Records written after the last snapshot are replayed at the next start after a crash:
    a retained message keeps its properties and Message Expiry Interval (counted from its
    publish), and a queued message (max_queued_messages set) its publisher, so No Local holds.
    Replay made them bare messages: no properties, never expiring, from no one."""
    limits = {"max_queued_messages": 100}
    b = broker(limits=limits)
    data_dir = b.config["data_dir"]
    keep = {R.SESSION_EXPIRY: 300}
    x = raw5(b, f"{uid}-x", props=keep)
    x.subscribe((f"{uid}/t", 1 | R.NO_LOCAL))
    x.send(R.disconnect5())
    x.expect_closed()
    x = raw5(b, f"{uid}-x", clean_start=False, props=keep)
    x.publish(f"{uid}/t", b"own", qos=1, timeout=30)  # not for itself: No Local
    x.send(R.disconnect5())
    x.expect_closed()
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/r", b"kept", qos=1, retain=True,
                props={R.CONTENT_TYPE: "text/x", R.MESSAGE_EXPIRY: 3600}, timeout=30)
    b.stop(signal.SIGKILL)                            # acknowledged: the record is durable
    b2 = broker(data_dir=data_dir, limits=limits)
    again = raw5(b2, f"{uid}-x", clean_start=False, props=keep)
    assert again.ping() == [], "its own message came back after the crash"
    sub = raw5(b2, f"{uid}-s")
    sub.subscribe(f"{uid}/r", qos=1)
    (got,) = publishes(sub, 1)
    assert got.payload == b"kept" and got.properties[R.CONTENT_TYPE] == "text/x"
    assert 3500 < got.properties[R.MESSAGE_EXPIRY] <= 3600


def test_a_filter_subscribed_while_behind_has_no_say_over_older_records(broker, uid):
    """Behind, a 5.0 session with a/# (No Local, identifier 5) subscribes to a/b (identifier
    7). Records from before that SUBSCRIBE go as a/# alone says: its own message not at all
    (MQTT-3.8.3-3; a/b without No Local let it through); later ones by both. (The
    identifiers of an older record sent after the session caught up may still name a/b:
    docs/persistence.md.)"""
    b = broker()
    pub = raw5(b, f"{uid}-p")
    c = raw5(b, f"{uid}-c")
    c.subscribe((f"{uid}/a/#", 1 | R.NO_LOCAL), props={R.SUBSCRIPTION_ID: 5})
    c.subscribe((f"{uid}/t", 1))
    for i in range(600):                      # unacknowledged: the session falls behind
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    c.publish(f"{uid}/a/b", b"own-before", qos=1)
    pub.publish(f"{uid}/a/b", b"other-before", qos=1)
    c.subscribe((f"{uid}/a/b", 1), props={R.SUBSCRIPTION_ID: 7})
    c.publish(f"{uid}/a/b", b"own-after", qos=1)
    pub.publish(f"{uid}/a/b", b"other-after", qos=1)
    got = []
    while len(got) < 3:
        p = c.wait_for(lambda p: p.type == R.PUBLISH, 10)
        c.ack(p)
        if p.topic == f"{uid}/a/b":
            got.append((p.payload, sorted(p.properties.get(R.SUBSCRIPTION_ID, []))))
    assert [payload for payload, _ in got] == [b"other-before", b"own-after", b"other-after"]
    assert 5 in got[0][1] and got[1][1] == [7] and got[2][1] == [5, 7]
    assert quiet(c)


def test_a_retained_copy_for_a_subscribe_made_while_behind_carries_its_identifier(broker,
                                                                                    uid):
    """MQTT-3.3.4-3: behind, a 5.0 session subscribes to r/# with identifier 9; the retained
    message that SUBSCRIBE sends (its record older than the SUBSCRIBE) carries 9, and 3 of r/+
    subscribed before, as for a session in step. (It came without 9: a filter subscribed
    while behind counted only for records after it.)"""
    b = broker()
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/r/a", b"kept", qos=1, retain=True)
    c = raw5(b, f"{uid}-c")
    c.subscribe((f"{uid}/t", 1), (f"{uid}/x/#", 1))
    c.subscribe((f"{uid}/r/+", 1 | 0x20), props={R.SUBSCRIPTION_ID: 3})  # none sent now
    for i in range(600):                      # unacknowledged: the session falls behind
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    assert b.stats()["sessions_behind"] == 1
    c.subscribe((f"{uid}/r/#", 1), props={R.SUBSCRIPTION_ID: 9})
    pub.publish(f"{uid}/x/y", b"after", qos=1)
    got = []
    for _ in range(602):
        p = c.wait_for(lambda p: p.type == R.PUBLISH, 10)
        c.ack(p)
        if p.topic != f"{uid}/t":
            got.append((p.topic, p.retain, sorted(p.properties.get(R.SUBSCRIPTION_ID, []))))
        if len(got) == 2:
            break
    assert got == [(f"{uid}/r/a", True, [3, 9]), (f"{uid}/x/y", False, [])]


def test_outbound_topic_aliases(broker, uid):
    b = broker(limits={"outbound_topic_aliases": True})
    sub = R.RawClient5(b.host, b.port)
    _open_clients.append(sub)
    sub.connect(f"{uid}-s", props={R.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe(f"{uid}/#", qos=0)
    plain = R.RawClient5(b.host, b.port)        # announces no Topic Alias Maximum: no aliases
    _open_clients.append(plain)
    plain.connect(f"{uid}-plain")
    plain.subscribe(f"{uid}/#", qos=0)
    pub = raw5(b, f"{uid}-p")
    topics = [f"{uid}/a", f"{uid}/b", f"{uid}/c", f"{uid}/a", f"{uid}/b", f"{uid}/c"]
    for t in topics:
        pub.publish(t, b"x", qos=1)
    got = publishes(sub, 6)
    seen = [(p.topic, p.properties.get(R.TOPIC_ALIAS)) for p in got]
    # Both aliases in use, c takes the least recently used one (a's), with its name; and so
    # on (tests/core/test_topic_alias_out.py).
    assert seen == [(f"{uid}/a", 1), (f"{uid}/b", 2), (f"{uid}/c", 1),
                    (f"{uid}/a", 2), (f"{uid}/b", 1), (f"{uid}/c", 2)]
    assert [p.topic for p in publishes(plain, 6)] == topics


def test_a_payload_sent_from_the_segment_sets_no_topic_alias(broker, uid):
    """A PUBLISH whose payload goes from the segment file (16 KiB or more, read back from the
    log) may be dropped by the transport if retention deletes its record before it leaves:
    it carries its topic and sets no alias that the next PUBLISHes would rely on. A message
    whose payload is in memory sets one."""
    b = broker(limits={"outbound_topic_aliases": True})
    expiry = {R.SESSION_EXPIRY: 300, R.TOPIC_ALIAS_MAXIMUM: 2}
    sub = raw5(b, f"{uid}-s", props=expiry)
    sub.subscribe(f"{uid}/#", qos=1)
    sub.disconnect()
    pub = raw5(b, f"{uid}-p")
    big = b"b" * 20_000
    pub.publish(f"{uid}/big", big, qos=1)
    pub.publish(f"{uid}/big", big, qos=1)
    pub.publish(f"{uid}/small", b"s", qos=1)
    sub = R.RawClient5(b.host, b.port)
    _open_clients.append(sub)
    assert sub.connect(f"{uid}-s", clean_start=False, props=expiry).session_present
    got = []
    for p in publishes(sub, 3):
        got.append((p.topic, p.properties.get(R.TOPIC_ALIAS), len(p.payload)))
        sub.ack(p)
    pub.publish(f"{uid}/small", b"s", qos=1)
    (live,) = publishes(sub, 1)
    got.append((live.topic, live.properties.get(R.TOPIC_ALIAS), len(live.payload)))
    assert got == [(f"{uid}/big", None, 20_000), (f"{uid}/big", None, 20_000),
                   (f"{uid}/small", 1, 1), ("", 1, 1)]


def test_an_offline_session_reads_properties_and_expiry_back_from_the_log(srv, uid):
    expiry = {R.SESSION_EXPIRY: 300}
    sub = raw5(srv, f"{uid}-s", props=expiry)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = raw5(srv, f"{uid}-p")
    pub.publish(f"{uid}/t", b"gone soon", qos=1, props={R.MESSAGE_EXPIRY: 1})
    pub.publish(f"{uid}/t", b"x" * 5000, qos=1, props=[
        (R.USER_PROPERTY, ("k", "1")), (R.MESSAGE_EXPIRY, 600), (R.USER_PROPERTY, ("k", "2")),
        (R.CONTENT_TYPE, "text/plain")])
    pub.publish(f"{uid}/t", b"small", qos=1, props={R.USER_PROPERTY: ("size", "small")})
    time.sleep(1.2)                      # the first one's expiry passes while it is offline
    back = raw5(srv, f"{uid}-s", clean_start=False, props=expiry)
    p, small = publishes(back, 2)
    assert small.payload == b"small" and small.properties[R.USER_PROPERTY] == [("size", "small")]
    back.ack(small)
    assert p.payload == b"x" * 5000
    assert p.properties[R.USER_PROPERTY] == [("k", "1"), ("k", "2")]
    assert p.properties[R.CONTENT_TYPE] == "text/plain"
    assert 598 <= p.properties[R.MESSAGE_EXPIRY] <= 600
    back.ack(p)
    assert quiet(back)


def test_a_retained_message_keeps_its_properties_and_expiry_across_a_restart(broker, uid):
    b = broker()
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/r", b"kept", qos=1, retain=True,
                props=[(R.CONTENT_TYPE, "text/plain"), (R.USER_PROPERTY, ("a", "1")),
                       (R.MESSAGE_EXPIRY, 600)])
    pub.publish(f"{uid}/gone", b"short", qos=1, retain=True, props={R.MESSAGE_EXPIRY: 1})
    pub.disconnect()
    b.stop()
    time.sleep(1.1)                      # the second one's expiry passes while it is down
    b2 = broker(data_dir=str(b.workdir / "data"))
    sub = raw5(b2, f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=1)
    (p,) = publishes(sub, 1)
    assert (p.topic, p.payload, p.retain) == (f"{uid}/r", b"kept", True)
    assert p.properties[R.CONTENT_TYPE] == "text/plain"
    assert p.properties[R.USER_PROPERTY] == [("a", "1")]
    assert 590 <= p.properties[R.MESSAGE_EXPIRY] <= 600
    sub.ack(p)
    assert quiet(sub)
    old = b2.raw()                       # a 3.1.1 subscriber: the expired one is gone for it too
    old.send(R.mqttraw.connect(f"{uid}-old"))
    old.expect(R.CONNACK)
    old.send(R.mqttraw.subscribe(1, [(f"{uid}/#", 1)]))
    old.expect(R.SUBACK)
    got = old.wait_for(lambda q: q.type == R.PUBLISH)
    assert got.topic == f"{uid}/r" and old.ping() == []


def test_no_local_holds_for_a_session_reading_back_from_the_log(srv, uid):
    """Behind (its window of 1 full, its queue past its bound: it reads the log from a
    cursor), a session publishes on its own No Local subscription: that record is skipped
    when it catches up; another client's on the same topic is not."""
    c = raw5(srv, f"{uid}-c", props={R.RECEIVE_MAXIMUM: 1})
    c.subscribe((f"{uid}/own", R.NO_LOCAL | 1), (f"{uid}/other", 1))
    other = raw5(srv, f"{uid}-o")
    n = 300
    for i in range(n):
        other.send(R.publish5(f"{uid}/other", b"%d" % i, 1, packet_id=i % 60000 + 1))
    c.publish(f"{uid}/own", b"mine", qos=1)
    other.publish(f"{uid}/own", b"theirs", qos=1)
    assert srv.client_row(f"{uid}-c")["cursor"] is not None     # behind: reading the log
    got = []
    for _ in range(n + 1):
        (p,) = publishes(c, 1)
        got.append(p.payload)
        c.ack(p)
    assert got[-1] == b"theirs" and b"mine" not in got
    assert got[:n] == [b"%d" % i for i in range(n)]
    assert quiet(c)


@pytest.mark.parametrize("behind", [False, True], ids=["live", "from-the-log"])
@pytest.mark.parametrize("size", [3, 20_000], ids=["small", "sent-from-the-segment"])
def test_a_no_local_subscriptions_identifier_is_not_sent_with_the_sessions_own_message(
        srv, uid, behind, size):
    """MQTT-3.3.4-3: a PUBLISH carries the identifiers of the subscriptions that take it. The
    session's own message reaches it through ``#`` (identifier 7), not through its No Local
    subscription (identifier 5), live and read back from the log (a payload of 16 KiB or
    more goes from the segment file)."""
    c = raw5(srv, f"{uid}-c", props={R.RECEIVE_MAXIMUM: 1})
    c.subscribe((f"{uid}/t", R.NO_LOCAL | 1), props={R.SUBSCRIPTION_ID: 5})
    c.subscribe((f"{uid}/#", 1), props={R.SUBSCRIPTION_ID: 7})
    n = 300 if behind else 0
    other = raw5(srv, f"{uid}-o")
    for i in range(n):
        other.publish(f"{uid}/x", b"%d" % i, qos=1)       # each acknowledged: logged first
    mine = b"m" * size
    c.publish(f"{uid}/t", mine, qos=1)
    other.publish(f"{uid}/t", b"theirs", qos=1)
    if behind:
        assert srv.client_row(f"{uid}-c")["cursor"] is not None     # reading the log
    got = []
    for _ in range(n + 2):
        (p,) = publishes(c, 1)
        got.append((p.payload, p.properties.get(R.SUBSCRIPTION_ID)))
        c.ack(p)
    assert got[n:] == [(mine, [7]), (b"theirs", [5, 7])]


def test_retain_as_published_holds_for_messages_read_back_from_the_log(srv, uid):
    expiry = {R.SESSION_EXPIRY: 300}
    c = raw5(srv, f"{uid}-c", props=expiry)
    c.subscribe((f"{uid}/rap", R.RETAIN_AS_PUBLISHED | 1), (f"{uid}/plain", 1))
    c.disconnect()
    other = raw5(srv, f"{uid}-o")
    other.publish(f"{uid}/rap", b"kept", qos=1, retain=True)
    other.publish(f"{uid}/plain", b"kept too", qos=1, retain=True)
    back = raw5(srv, f"{uid}-c", clean_start=False, props=expiry)
    got = publishes(back, 2)
    assert [(p.topic, p.retain) for p in got] == [(f"{uid}/rap", True), (f"{uid}/plain", False)]


def test_retain_as_published_holds_for_qos_0_messages_queued_offline(broker, uid):
    """max_queued_messages set, queue_qos0_messages on: a retained QoS 0 message queued for an
    offline session whose subscription has Retain As Published keeps its retain flag, as a
    QoS 1 one does (the QoS 0 one went with retain 0)."""
    b = broker(limits={"queue_qos0_messages": True, "max_queued_messages": 100})
    expiry = {R.SESSION_EXPIRY: 300}
    c = raw5(b, f"{uid}-c", props=expiry)
    c.subscribe((f"{uid}/#", R.RETAIN_AS_PUBLISHED | 1))
    c.disconnect()
    other = raw5(b, f"{uid}-o")
    other.publish(f"{uid}/q0", b"kept", qos=0, retain=True)
    other.publish(f"{uid}/q1", b"kept", qos=1, retain=True)
    back = raw5(b, f"{uid}-c", clean_start=False, props=expiry)
    got = publishes(back, 2)
    assert sorted((p.topic, p.qos, p.retain) for p in got) == [
        (f"{uid}/q0", 0, True), (f"{uid}/q1", 1, True)]


def test_live_retained_messages_for_a_retain_as_published_session_stay_bounded(broker, uid):
    """With the log as the queue, live retained messages a session cannot take now (its
    Receive Maximum is used up) past the in-memory bound (256 messages) are read back from the
    log, Retain As Published or not; only the retained copies a SUBSCRIBE sends may go past
    it. (With Retain As Published they all stayed in memory.)"""
    b = broker()
    c = raw5(b, f"{uid}-c", props={R.RECEIVE_MAXIMUM: 1})
    c.subscribe((f"{uid}/#", R.RETAIN_AS_PUBLISHED | 1))
    other = raw5(b, f"{uid}-o")
    for i in range(300):
        other.publish(f"{uid}/{i}", b"kept", qos=1, retain=True)
    assert b.stats()["queued_messages"] <= 256
    got = []
    while len(got) < 300:
        (p,) = publishes(c, 1)
        c.ack(p)
        got.append(p)
    assert [p.topic for p in got] == [f"{uid}/{i}" for i in range(300)]
    assert all(p.retain for p in got)


def test_one_message_to_many_5_0_subscribers_each_gets_its_own_publish(srv, uid):
    # The broker makes the parts of a PUBLISH that no subscriber changes once per message
    # (core/router5.py), for subscribers with the same Subscription Identifiers; each
    # subscriber's frame must still carry its own packet id, QoS, retain flag and Subscription
    # Identifiers, for small and large payloads, message after message.
    t = f"{uid}/t"
    q1 = raw5(srv, f"{uid}-q1")
    q1.subscribe(t, qos=1)
    later = raw5(srv, f"{uid}-later")          # its packet ids run one ahead of q1's
    later.subscribe(f"{uid}/warm", t, qos=1)
    q0 = raw5(srv, f"{uid}-q0")
    q0.subscribe(t, qos=0)
    sid = raw5(srv, f"{uid}-sid")
    sid.subscribe(t, qos=1, props={R.SUBSCRIPTION_ID: 7})
    sid_b = raw5(srv, f"{uid}-sid-b")             # the same identifier, on QoS 0
    sid_b.subscribe(t, qos=0, props={R.SUBSCRIPTION_ID: 7})
    sid_c = raw5(srv, f"{uid}-sid-c")             # another (two bytes long)
    sid_c.subscribe(t, qos=0, props={R.SUBSCRIPTION_ID: 300})
    rap = raw5(srv, f"{uid}-rap")
    rap.subscribe((t, 1 | R.RETAIN_AS_PUBLISHED))
    limited = raw5(srv, f"{uid}-limited", props={R.MAXIMUM_PACKET_SIZE: 200})
    limited.subscribe(t, qos=0)
    too_large = srv.stats()["dropped"]["packet_too_large"]
    pub = raw5(srv, f"{uid}-p")
    pub.publish(f"{uid}/warm", b"w", qos=1)
    later.ack(publishes(later, 1)[0])
    props = [(R.CONTENT_TYPE, "text/plain"), (R.USER_PROPERTY, ("a", "1")),
             (R.USER_PROPERTY, ("b", "2"))]
    sent = [(b"small", False), (b"L" * 5000, True), (b"next", False)]
    for payload, retain in sent:
        pub.publish(t, payload, qos=1, retain=retain, props=props)
    clients = {"q1": q1, "later": later, "q0": q0, "sid": sid, "sid-b": sid_b, "sid-c": sid_c,
               "rap": rap}
    ids = {"sid": [7], "sid-b": [7], "sid-c": [300]}
    got = {name: publishes(c, 3) for name, c in clients.items()}
    for name, ps in got.items():
        assert [p.payload for p in ps] == [s for s, _ in sent], name
        for p, (_, retain) in zip(ps, sent):
            assert p.topic == t
            assert p.properties[R.CONTENT_TYPE] == "text/plain"
            assert p.properties[R.USER_PROPERTY] == [("a", "1"), ("b", "2")]
            assert p.properties.get(R.SUBSCRIPTION_ID) == ids.get(name)
            assert p.qos == (0 if name in ("q0", "sid-b", "sid-c") else 1)
            assert p.retain == (retain and name == "rap"), name
    small = publishes(limited, 2)          # the large one is not sent to it, and counted
    assert [(p.payload, p.qos, p.retain) for p in small] == [(b"small", 0, False),
                                                             (b"next", 0, False)]
    assert small[0].properties[R.USER_PROPERTY] == [("a", "1"), ("b", "2")]
    assert srv.stats()["dropped"]["packet_too_large"] == too_large + 1
    assert [p.packet_id for p in got["q1"]] == [1, 2, 3]
    assert [p.packet_id for p in got["later"]] == [2, 3, 4]
    for name, c in clients.items():
        for p in got[name]:
            c.ack(p)
        assert quiet(c)
    assert quiet(limited)


@pytest.mark.parametrize("limits", [{}, {"max_queued_messages": 100}],
                         ids=["log-queue", "max_queued"])
def test_a_session_resumed_with_a_smaller_receive_maximum_gets_its_window_in_turn(broker, uid,
                                                                                   limits):
    """MQTT-3.3.4-9: a client back with Receive Maximum 2 has 10 unacknowledged QoS 1
    messages: 2 are sent again at once (DUP, their packet ids), the others as acknowledgements
    make room, in order and before a message published since; with the log as the queue, and
    with max_queued_messages set (no cursor), where nothing newer comes to move it on."""
    b = broker(limits=limits)
    keep = {R.SESSION_EXPIRY: 300}
    sub = raw5(b, f"{uid}-s", props=keep)
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw5(b, f"{uid}-p")
    for i in range(10):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    first = publishes(sub, 10)
    ids = {p.payload: p.packet_id for p in first}
    sub.abort()                                   # none acknowledged
    back = raw5(b, f"{uid}-s", clean_start=False, props={**keep, R.RECEIVE_MAXIMUM: 2})
    newer = [] if limits else [b"new"]
    for payload in newer:
        pub.publish(f"{uid}/t", payload, qos=1)
    got = [p for p in back.ping() if p.type == R.PUBLISH]
    assert [(p.payload, p.dup, p.packet_id) for p in got] == [
        (b"0", True, ids[b"0"]), (b"1", True, ids[b"1"])]
    while len(got) < 10 + len(newer):
        assert len(got) < 20
        back.ack(got[-2])
        (p,) = publishes(back, 1)
        got.append(p)
        # Never more than two unacknowledged.
        assert quiet(back)
    assert [p.payload for p in got] == [b"%d" % i for i in range(10)] + newer
    assert all(p.dup and p.packet_id == ids[p.payload] for p in got[:10])
    assert not any(p.dup for p in got[10:])


def test_an_unacknowledged_qos_2_message_is_sent_again_after_its_expiry(broker, uid):
    """MQTT-3.3.2-5 deletes only copies whose delivery has not started: a QoS 2 PUBLISH sent
    and not acknowledged goes again, DUP, with its packet id (the client may hold that id),
    though its Message Expiry Interval has passed meanwhile."""
    b = broker()
    keep = {R.SESSION_EXPIRY: 300}
    sub = raw5(b, f"{uid}-s", props=keep)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/t", b"once", qos=2, props={R.MESSAGE_EXPIRY: 1})
    (first,) = publishes(sub, 1)
    sub.abort()                                   # no PUBREC
    expired = b.stats()["dropped"].get("message_expired", 0)
    time.sleep(1.2)
    back = raw5(b, f"{uid}-s", clean_start=False, props=keep)
    (again,) = publishes(back, 1)
    assert (again.payload, again.dup, again.packet_id) == (b"once", True, first.packet_id)
    assert again.properties[R.MESSAGE_EXPIRY] == 1
    back.ack(again)                               # PUBREC, PUBREL, PUBCOMP
    assert quiet(back)
    assert b.stats()["dropped"].get("message_expired", 0) == expired


def test_a_3_1_1_subscribe_or_unsubscribe_drops_a_filters_5_0_options_and_identifier(
        srv, uid):
    """A 5.0 session (No Local, Retain As Published, Subscription Identifiers) resumed by a
    3.1.1 client: its SUBSCRIBE replaces the subscription with a plain one (MQTT-3.8.4-3), its
    UNSUBSCRIBE removes the filter's identifier with it (MQTT-3.3.4-3)."""
    expiry = {R.SESSION_EXPIRY: 300}
    c = raw5(srv, f"{uid}-c", props=expiry)
    c.subscribe((f"{uid}/t", R.NO_LOCAL | R.RETAIN_AS_PUBLISHED | 1),
                props={R.SUBSCRIPTION_ID: 5})
    c.subscribe((f"{uid}/#", 1), props={R.SUBSCRIPTION_ID: 1})
    c.subscribe((f"{uid}/+", 1), props={R.SUBSCRIPTION_ID: 2})
    c.disconnect()
    old = srv.client(f"{uid}-c", clean=False)
    assert old.subscribe(f"{uid}/t", qos=1).codes == [1]
    assert old.unsubscribe(f"{uid}/#")
    other = raw5(srv, f"{uid}-o")
    other.publish(f"{uid}/t", b"retained", qos=1, retain=True)
    old.publish(f"{uid}/t", b"own", qos=1)
    got = [old.recv_publish() for _ in range(2)]
    # Each through two subscriptions of the session, sent once: retain 0 (3.1.1), and the
    # session's own message comes back (no No Local any more).
    assert sorted((p.payload, p.retain) for p in got) == [(b"own", False), (b"retained", False)]
    old.disconnect()
    back = raw5(srv, f"{uid}-c", clean_start=False, props=expiry)
    other.publish(f"{uid}/x", b"m", qos=1)
    (p,) = publishes(back, 1)
    assert p.payload == b"m" and p.properties.get(R.SUBSCRIPTION_ID) == [2]


@pytest.mark.parametrize("prefix", ["auto-", "a-prefix-of-30-bytes-é-long-"])
def test_an_assigned_client_id_fits_max_client_id_length(broker, uid, prefix):
    """The client must be able to come back with the id the broker gave it: with
    max_client_id_length = 23 the random part is 18 hex digits, or 16 and the prefix cut."""
    b = broker(auto_id_prefix=prefix, limits={"max_client_id_length": 23})
    expiry = {R.SESSION_EXPIRY: 300}
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    ack = c.connect("", props=expiry)
    assigned = ack.properties[R.ASSIGNED_CLIENT_ID]
    assert len(assigned.encode()) <= 23
    assert assigned.startswith(prefix[:7]) and len(assigned) - len(assigned.rstrip(
        "0123456789abcdef")) >= 16
    c.disconnect()
    back = R.RawClient5(b.host, b.port)
    _open_clients.append(back)
    ack = back.connect(assigned, clean_start=False, props=expiry)
    assert ack.reason == 0 and ack.session_present


def test_a_5_0_client_is_told_the_server_is_shutting_down(broker, uid):
    """At a stop a 5.0 client gets DISCONNECT 0x8B before the close (it got none)."""
    b = broker()
    c = raw5(b, f"{uid}-c")
    b.stop()
    assert c.expect_disconnect(10).reason == 0x8B


def test_an_unknown_packet_id_in_pubrec_or_pubrel_is_answered_with_0x92(srv, uid):
    """A PUBREL for an id the broker does not hold gets PUBCOMP 0x92 Packet Identifier not
    found, a PUBREC for no message in flight PUBREL 0x92 (section 3.6.2.1, 3.7.2.1; Mosquitto
    does the same); a PUBREL for an id the broker holds still gets PUBCOMP 0x00, and a 3.1.1
    client keeps its plain acknowledgements (tests/core/test_qos.py)."""
    c = raw5(srv, f"{uid}-c")
    c.send(R.pubrel5(7))
    comp = c.wait_for(lambda p: p.type == R.PUBCOMP)
    assert (comp.packet_id, comp.reason) == (7, 0x92)
    c.send(R.pubrec5(8))
    rel = c.wait_for(lambda p: p.type == R.PUBREL)
    assert (rel.packet_id, rel.reason) == (8, 0x92)
    c.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=9))
    c.wait_for(lambda p: p.type == R.PUBREC and p.packet_id == 9)
    c.send(R.pubrel5(9))
    comp = c.wait_for(lambda p: p.type == R.PUBCOMP)
    assert (comp.packet_id, comp.reason) == (9, 0)
