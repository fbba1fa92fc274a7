"""Topic and subscription limits with real clients (docs/limits.md)."""

import json

import mqttraw as m
import mqttraw5 as R
from conftest import _open_clients
from mqttraw import PUBACK


def delivered(sub) -> list[bytes]:
    """Payloads that reached ``sub`` so far (PINGREQ is the barrier)."""
    return [p.payload for p in sub.ping()]


def test_a_topic_flood_does_not_lock_other_clients_out_of_new_topics(broker, uid):
    """Issue 26, item 3, scaled down: flooding client ids fill the topic table; a
    well-behaved client still publishes to new topics (QoS 0 delivered, QoS 1 acknowledged),
    because a new topic evicts one not published to lately; the flooders are refused by
    their own max_topics_per_client."""
    b = broker(limits={"max_topics": 40, "max_topics_per_client": 10})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/good/#", qos=1)
    mark = b.mark()
    for f in range(8):                          # 8 x 20 new topics, twice what the table holds
        flooder = b.client(f"{uid}-flood{f}")
        flooder.send(b"".join(m.publish(f"{uid}/flood/{f}/{i}", b"x") for i in range(20)))
        assert flooder.ping() == []
        assert b.client_row(f"{uid}-flood{f}")["drops"] == {"max_topics_per_client": 10}
    assert b.stats()["topics"] == 40
    good = b.client(f"{uid}-good")
    for i in range(3):
        good.publish(f"{uid}/good/q0/{i}", b"q0-%d" % i)
    assert good.ping() == []
    assert delivered(sub) == [b"q0-0", b"q0-1", b"q0-2"]
    for i in range(3):
        good.publish(f"{uid}/good/q1/{i}", b"q1-%d" % i, qos=1)  # waits for its PUBACK
    assert [p.payload for p in sub.ping()] == [b"q1-0", b"q1-1", b"q1-2"]
    s = b.stats()
    assert s["topics"] == 40
    assert s["limit_hits"]["max_topics"] == 0 and s["dropped"]["max_topics"] == 0
    assert s["dropped"]["max_topics_per_client"] == s["limit_hits"]["max_topics_per_client"] == 80
    assert s["counters"]["topics_evicted"] == 8 * 10 - 40 + 6
    row = b.client_row(f"{uid}-good")
    assert row["drops"] == {} and row["topics_created"] == 6
    lines = [ln for ln in b.logs[mark:] if "topic table full" in ln]
    assert len(lines) == 1 and "max_topics 40" in lines[0] and f"{uid}-flood" in lines[0]
    good.disconnect()


def test_a_table_full_of_retained_topics_refuses_only_new_retained_topics(broker, uid):
    """Retained messages are what max_topics bounds: with every place taken by one, a new
    retained topic is refused (QoS 0: dropped; QoS 1: the connection closes), a message
    that is not retained is still routed."""
    b = broker(limits={"max_topics": 3})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#")
    pub = b.client(f"{uid}-pub")
    mark = b.mark()
    for i in range(3):
        pub.publish(f"{uid}/r{i}", b"r%d" % i, retain=True)
    pub.publish(f"{uid}/r3", b"over", retain=True)       # dropped
    pub.publish(f"{uid}/r4", b"over again", retain=True)  # logged once only
    pub.publish(f"{uid}/plain", b"plain")                 # not retained: routed
    pub.publish(f"{uid}/r0", b"known", retain=True)       # known topics keep working
    assert pub.ping() == []
    assert delivered(sub) == [b"r0", b"r1", b"r2", b"plain", b"known"]
    lines = [ln for ln in b.logs[mark:] if "refused: max_topics" in ln]
    assert len(lines) == 1 and f"'{uid}/r3'" in lines[0] and f"{uid}-pub" in lines[0]
    # QoS 1 to a new retained topic: no PUBACK, the connection is closed (no negative ack).
    other = b.client(f"{uid}-other")
    other.send(m.publish(f"{uid}/r5", b"q1", qos=1, retain=True, packet_id=7))
    assert other.expect_closed(5)
    assert not any(p.type == PUBACK for p in other.before_close)
    s = b.stats()
    assert s["topics"] == 3 and s["retained_messages"] == 3
    assert s["limit_hits"]["max_topics"] == 3 and s["dropped"]["max_topics"] == 3
    assert s["counters"]["topics_evicted"] == 0
    assert b.client_row(f"{uid}-pub")["drops"] == {"max_topics": 2}
    assert delivered(sub) == []


def test_max_topics_per_client_counts_per_client_id(broker, uid):
    b = broker(limits={"max_topics_per_client": 2})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#")
    noisy = b.client(f"{uid}-noisy")
    for i in range(5):
        noisy.publish(f"{uid}/n{i}", b"%d" % i)
    assert noisy.ping() == []
    assert delivered(sub) == [b"0", b"1"]
    noisy.disconnect()
    noisy = b.client(f"{uid}-noisy")            # reconnecting does not reset the count
    noisy.publish(f"{uid}/n9", b"9")
    noisy.publish(f"{uid}/n0", b"again")        # its own known topic is fine
    assert noisy.ping() == []
    quiet = b.client(f"{uid}-quiet")            # another client is not affected
    quiet.publish(f"{uid}/q", b"q")
    assert quiet.ping() == []
    assert delivered(sub) == [b"again", b"q"]
    s = b.stats()
    assert s["dropped"]["max_topics_per_client"] == 4 and s["topics"] == 3
    assert b.client_row(f"{uid}-noisy")["topics_created"] == 2


def test_idle_topics_are_forgotten_retained_ones_kept(broker, uid):
    b = broker(log_level="debug", limits={"topic_expiry": 1})
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/kept", b"r", retain=True)
    pub.publish(f"{uid}/idle", b"i")
    assert pub.ping() == []
    assert b.stats()["topics"] == 2
    mark = b.mark()
    # One topic idle for two expiry periods is forgotten (logged at debug level), and its
    # place in its creator's max_topics_per_client is free again.
    assert b.wait_log("forgot 1 topics", timeout=5, start=mark)
    assert b.stats()["topics"] == 1
    assert b.client_row(f"{uid}-pub")["topics_created"] == 1


def test_topic_length_and_levels(broker, uid):
    b = broker(limits={"max_topic_length": 20, "max_topic_levels": 3})
    sub = b.client(f"{uid}-sub")
    ack = sub.subscribe((f"{uid}/#", 0), ("a/b/c/d", 0), ("x" * 21, 0), ("a/+/c", 1))
    assert ack.codes == [0, 0x80, 0x80, 1]
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/a/b/c", b"deep")        # 4 levels
    pub.publish(f"{uid}/" + "y" * 20, b"long")
    pub.publish(f"{uid}/ok", b"ok")
    assert pub.ping() == []
    assert delivered(sub) == [b"ok"]
    d = b.stats()["dropped"]
    assert d["max_topic_levels"] == 1 and d["max_topic_length"] == 1
    assert b.stats()["limit_hits"]["max_topic_levels"] == 2  # the filter and the publish


def test_a_will_topic_over_the_topic_limits_refuses_the_connect(broker, uid):
    """A will topic is checked against max_topic_length and max_topic_levels at CONNECT, as a
    PUBLISH topic is: a 5.0 CONNECT gets CONNACK 0x97 (as the PUBLISH would get PUBACK 0x97),
    a 3.1.1 one is closed without a CONNACK (no code says it); counted, logged once per
    address, and no will is stored. (It was accepted, and its retained will kept.)"""
    b = broker(limits={"max_topic_length": 100, "max_topic_levels": 8},
               refusal_log_interval=60)
    deep = f"{uid}/" + "/".join(["d"] * 20)            # 21 levels, 40 bytes and the uid
    long = f"{uid}/" + "x" * 200
    mark = b.mark()
    for i in range(2):
        c = b.raw()
        c.send(m.connect(f"{uid}-w{i}", will=(deep, b"gone", 1, True)))
        assert c.expect_closed(5) and c.before_close == []
    c5 = R.RawClient5(b.host, b.port)
    _open_clients.append(c5)
    ack = c5.connect(f"{uid}-w5", will=(long, b"gone", 1, True))
    assert ack.reason == 0x97
    assert "will topic over max_topic_length (100)" in ack.properties[R.REASON_STRING]
    assert c5.expect_closed(5)
    s = b.stats()
    assert s["limit_hits"]["max_topic_levels"] == 2 and s["limit_hits"]["max_topic_length"] == 1
    assert s["refused"]["max_topic_levels"] == 2 and s["refused"]["max_topic_length"] == 1
    assert s["retained_messages"] == 0
    lines = [ln for ln in b.logs[mark:] if "will topic" in ln]
    assert len(lines) == 2, lines
    assert f"'{uid}-w0'" in lines[0] and "refused (closed: MQTT 3.1.1 has no CONNACK" in lines[0]
    assert f"will topic over max_topic_levels (8): '{uid}/d/d/" in lines[0]
    assert f"'{uid}-w5'" in lines[1] and "refused (CONNACK 0x97)" in lines[1]
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=1)
    assert delivered(sub) == []


def test_refused_publishes_are_logged_shortened_and_once_per_address(broker, uid):
    """A 3.1.1 QoS 1 PUBLISH a topic limit refuses closes the connection: a client that
    reconnected to try again wrote a line each time (200 connections: 6 MB of log), with the
    over-long topic in full. Now the first line from an address is logged, the topic shown
    up to 200 characters, then a count a minute as for refused connections; all counted."""
    b = broker(limits={"max_topic_length": 100}, refusal_log_interval=60)
    long_topic = f"{uid}/" + "z" * 20000
    mark = b.mark()
    for i in range(20):
        c = b.client(f"{uid}-{i}")
        c.send(m.publish(long_topic, b"x", qos=1, packet_id=1))
        assert c.expect_closed(5)
    c = b.client(f"{uid}-q0")
    c.publish(long_topic, b"x")             # QoS 0: dropped, logged once per connection
    assert c.ping() == []
    assert b.stats()["dropped"]["max_topic_length"] == 21
    b.wait_log(f"client '{uid}-q0'", start=mark)
    lines = [ln for ln in b.logs[mark:] if "publish to new topic" in ln]
    assert len(lines) == 2, lines
    shown = f"{long_topic[:200]!r}... ({len(long_topic)} characters)"
    assert f"client '{uid}-0'" in lines[0] and shown + " refused: max_topic_length" in lines[0]
    assert f"client '{uid}-q0'" in lines[1] and shown in lines[1]
    assert max(len(ln) for ln in b.logs[mark:]) < 600


def test_max_subscriptions_per_client(broker, uid, paho):
    b = broker(limits={"max_subscriptions_per_client": 2})
    c = b.client(f"{uid}-c")
    assert c.subscribe(f"{uid}/a", f"{uid}/b", f"{uid}/c").codes == [0, 0, 0x80]
    assert c.subscribe(f"{uid}/a", qos=1).codes == [1]     # replacing one is not an extra
    assert c.subscribe(f"{uid}/d").codes == [0x80]
    c.unsubscribe(f"{uid}/b")
    assert c.subscribe(f"{uid}/d").codes == [0]
    # A real client sees the failure code too.
    p = paho(b.port, client_id=f"{uid}-paho")
    rc, mid = p.c.subscribe([("x/1", 0), ("x/2", 1), ("x/3", 0)])
    assert rc == 0 and p._wait_mid(mid) == [0, 1, 0x80]
    s = b.stats()
    assert s["limit_hits"]["max_subscriptions_per_client"] == 3
    assert s["subscriptions"] == 4


def test_denied_and_sys_publishes_take_no_topic_place(broker, uid, tmp_path):
    """A PUBLISH the ACL denies, or one to $SYS, is dropped before it could create a topic:
    it uses none of max_topics_per_client."""
    acl = tmp_path / "acl"
    acl.write_text(f"topic readwrite {uid}/ok/#\n")
    b = broker(allow_anonymous=True, acl_file=str(acl),
               limits={"max_topics_per_client": 2})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/ok/#", qos=0)
    pub = b.client(f"{uid}-pub")
    for i in range(5):
        pub.publish(f"{uid}/denied/{i}", b"no")
        pub.publish(f"$SYS/{uid}/{i}", b"no")
    pub.publish(f"{uid}/ok/a", b"a")
    pub.publish(f"{uid}/ok/b", b"b")
    pub.publish(f"{uid}/ok/c", b"c")            # the third new topic: over the limit
    assert pub.ping() == []
    assert delivered(sub) == [b"a", b"b"]
    s = b.stats()
    assert s["limit_hits"].get("max_topics_per_client") == 1
    assert s["dropped"]["acl"] == 5 and s["dropped"]["sys_topic"] == 5


def test_memory_limit_refuses_new_subscriptions_not_existing_ones(broker, uid):
    """Above memory_limit a new subscription is refused (3.1.1: 0x80; 5.0: 0x97 Quota
    exceeded), shared ones too; one the session has may be replaced, and what it has keeps
    delivering. Counted as memory_limit, logged once per connection; below it again, new
    subscriptions are made."""
    import signal
    import mqttraw5 as R
    from conftest import toml_dumps

    b = broker()
    c = b.client(f"{uid}-c")
    assert c.subscribe(f"{uid}/old").codes == [0]
    c5 = R.RawClient5(b.host, b.port)
    assert c5.connect(f"{uid}-c5").reason == 0
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/old", b"first")         # a known topic from now on
    assert c.recv_publish().payload == b"first"

    def reload(**limits):
        b.config_path.write_text(toml_dumps(dict(b.config, limits=limits)))
        b.send_signal(signal.SIGHUP)

    mark = b.mark()
    reload(memory_limit=1_000_000)  # far below any Python process
    assert b.wait_log("above memory_limit", timeout=5, start=mark)
    hits = b.stats()["limit_hits"]["memory_limit"]
    assert c.subscribe(f"{uid}/new", f"$share/g/{uid}/s").codes == [0x80, 0x80]
    assert c.subscribe(f"{uid}/new2").codes == [0x80]
    assert c.subscribe(f"{uid}/old", qos=1).codes == [1]    # replaced, not new: granted
    assert c5.subscribe(f"{uid}/new", f"$share/g/{uid}/s").codes == [0x97, 0x97]
    pub.publish(f"{uid}/old", b"still")
    assert c.recv_publish().payload == b"still"
    s = b.stats()
    assert s["limit_hits"]["memory_limit"] - hits == 5
    assert s["subscriptions"] == 1
    lines = [ln for ln in b.logs[mark:] if "subscription to" in ln and "memory_limit" in ln]
    assert len(lines) == 2, lines                             # once per connection
    assert f"{uid}-c'" in lines[0] and "SUBACK 0x80" in lines[0]
    assert f"{uid}-c5'" in lines[1] and "SUBACK 0x97" in lines[1]

    mark = b.mark()
    reload(memory_limit=0)
    assert b.wait_log("memory_limit turned off", timeout=5, start=mark)
    assert c.subscribe(f"{uid}/new").codes == [0]
    assert c5.subscribe(f"{uid}/new").codes == [0]
    c5.close()


def test_a_reload_lowering_max_topics_brings_the_table_down_to_it(broker, uid):
    """Three topics tracked, then a reload to max_topics = 2: the next new topic evicts as
    many as it takes to fit (two here), so that the table holds 2 and a retained PUBLISH to
    one more new topic is refused once both places hold a retained message. Before, each new
    topic evicted one only: the table stayed at 3 and three retained topics were admitted."""
    import signal
    from conftest import toml_dumps

    b = broker(limits={"max_topics": 5})
    pub = b.client(f"{uid}-pub")
    for i in range(3):
        pub.publish(f"{uid}/plain{i}", b"x")
    assert pub.ping() == [] and b.stats()["topics"] == 3
    mark = b.mark()
    b.config_path.write_text(toml_dumps(dict(b.config, limits={"max_topics": 2})))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)
    for i in range(3):
        pub.publish(f"{uid}/r{i}", b"r%d" % i, retain=True)
    assert pub.ping() == []
    s = b.stats()
    assert (s["topics"], s["retained_messages"]) == (2, 2)
    assert s["counters"]["topics_evicted"] == 3 and s["dropped"]["max_topics"] == 1


def test_retained_topics_restored_at_start_and_retained_wills_count_toward_max_topics(
        broker, uid):
    """max_topics bounds the retained messages across restarts: those restored (from the
    snapshot, and from the log after it on a crash) take their places in the topic table
    again, so a retained PUBLISH to one more new topic is refused as before the restart. A
    retained will is never refused, but takes a place too."""
    import signal
    b = broker(limits={"max_topics": 3})
    data_dir = b.config["data_dir"]
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/r0", b"r0", retain=True)
    assert pub.ping() == [] and b.stop() == 0        # r0 in the snapshot
    b = broker(data_dir=data_dir, limits={"max_topics": 3})
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/r1", b"r1", qos=1, retain=True)
    assert b.stop(signal.SIGKILL) != 0                   # r1 only in the log
    b = broker(data_dir=data_dir, limits={"max_topics": 3})
    assert b.stats()["retained_messages"] == 2
    gone = b.client(f"{uid}-gone", will=(f"{uid}/will", b"w", 0, True))
    gone.sock.close()                                    # no DISCONNECT: the will goes
    assert b.wait_log(f"publishing will of client '{uid}-gone'", timeout=5)
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/r3", b"r3", retain=True)
    assert pub.ping() == []
    s = b.stats()
    assert (s["topics"], s["retained_messages"]) == (3, 3)
    assert s["dropped"]["max_topics"] == 1, "the fourth retained topic is refused"


def test_a_clients_retained_topics_count_toward_its_allowance_after_a_restart(broker, uid):
    """The snapshot keeps who published each retained message, so after a restart the topics
    a client created with retained messages are still its own: max_topics_per_client does not
    start over (before: 3 retained topics, then 6, then 9 over two restarts)."""
    limits = {"max_topics_per_client": 3}
    b = broker(limits=limits)
    data_dir = b.config["data_dir"]
    for run in range(3):
        pub = b.client(f"{uid}-pub")
        for i in range(5):
            pub.publish(f"{uid}/r{run}-{i}", b"x", retain=True)
        assert pub.ping() == []
        assert b.stats()["retained_messages"] == 3, f"run {run}"
        assert b.stop() == 0
        b = broker(data_dir=data_dir, limits=limits)
    doc = json.loads(open(f"{data_dir}/sessions.json").read())
    assert {r["client_id"] for r in doc["retained"]} == {f"{uid}-pub"}
