"""Topic matching and subscriptions: wildcards, $-topics, overlaps, re-subscribe, unsubscribe.

"Not delivered" is checked with a marker: after the message that must not arrive, the same
publisher sends a marker, and the marker must be the next thing the subscriber receives.
"""

import pytest


def expect_only_marker(sub, pub, marker_topic, qos=1):
    pub.publish(marker_topic, b"MARKER", qos=qos)
    p = sub.recv_publish()
    assert (p.topic, p.payload) == (marker_topic, b"MARKER"), f"unexpected delivery {p!r}"


MATCHES = [
    # (filter, topic, matches)
    ("a/b/c", "a/b/c", True),
    ("a/b/c", "a/b", False),
    ("a/b/c", "A/b/c", False),
    ("a/+/c", "a/b/c", True),
    ("a/+/c", "a//c", True),
    ("a/+/c", "a/b/x/c", False),
    ("a/+", "a/b", True),
    ("a/+", "a", False),
    ("a/+", "a/", True),
    ("+/+", "/x", True),
    ("+", "x", True),
    ("+", "/x", False),
    ("/+", "/x", True),
    ("a/#", "a", True),
    ("a/#", "a/b", True),
    ("a/#", "a/b/c/d", True),
    ("a/#", "ab", False),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("+/#", "a", True),
    ("+/b/#", "a/b", True),
    ("a/+/#", "a/b/c", True),
    ("a b/+", "a b/c d", True),
    ("$foo/#", "$foo/x", True),
    ("$foo/+", "$foo/bar", True),
    ("#", "$foo/bar", False),
    ("+/bar", "$foo/bar", False),
    ("+/#", "$foo/bar", False),
    ("a/$x", "a/$x", True),
    ("+/$x", "a/$x", True),
]


@pytest.mark.parametrize("flt,topic,matches", MATCHES, ids=[f"{f}|{t}|{x}" for f, t, x in MATCHES])
def test_topic_matching(srv, uid, flt, topic, matches):
    """4.7: wildcard semantics; 4.7.2 [MQTT-4.7.2-1]: '$' topics not matched by a leading wildcard.

    The shared broker has no retained messages in this module and tests run one at a time, so
    the bare topics of the table are safe to use."""
    marker = f"{uid}/marker"
    sub = srv.client(f"{uid}-s")
    sub.subscribe(flt, marker, qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(topic, b"payload", qos=1)
    if matches:
        p = sub.recv_publish()
        assert (p.topic, p.payload) == (topic, b"payload")
    expect_only_marker(sub, pub, marker)


def test_overlapping_subscriptions_one_delivery_at_highest_qos(srv, uid):
    """3.3.5: overlapping subscriptions -> one message at the maximum QoS of the matches."""
    t = f"{uid}/a/b"
    sub = srv.client(f"{uid}-s")
    assert sub.subscribe((f"{uid}/#", 0), (f"{uid}/a/+", 2), (t, 1), (f"{uid}/+/b", 0)).codes == [0, 2, 1, 0]
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"once", qos=2)
    p = sub.recv_publish()
    assert (p.payload, p.qos) == (b"once", 2)
    expect_only_marker(sub, pub, f"{uid}/marker")


def test_overlapping_subscriptions_downgraded_to_publish_qos(srv, uid):
    t = f"{uid}/a/b"
    sub = srv.client(f"{uid}-s")
    sub.subscribe((f"{uid}/#", 2), (t, 2))
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"q1", qos=1)
    p = sub.recv_publish()
    assert (p.payload, p.qos) == (b"q1", 1)
    expect_only_marker(sub, pub, f"{uid}/marker")


def test_resubscribe_replaces_qos(srv, uid):
    """3.8.4 [MQTT-3.8.4-3]: a SUBSCRIBE for an existing filter replaces it."""
    t = f"{uid}/t"
    sub = srv.client(f"{uid}-s")
    assert sub.subscribe(t, qos=2).codes == [2]
    assert sub.subscribe(t, qos=0).codes == [0]
    sub.subscribe(f"{uid}/marker")
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"x", qos=2)
    p = sub.recv_publish()
    assert (p.payload, p.qos) == (b"x", 0)
    expect_only_marker(sub, pub, f"{uid}/marker", qos=0)


def test_unsubscribe_stops_delivery(srv, uid):
    t = f"{uid}/t"
    sub = srv.client(f"{uid}-s")
    sub.subscribe(t, f"{uid}/marker", qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"before", qos=1)
    assert sub.recv_publish().payload == b"before"
    ack = sub.unsubscribe(t)
    assert ack.packet_id is not None
    pub.publish(t, b"after", qos=1)
    expect_only_marker(sub, pub, f"{uid}/marker")


def test_unsubscribe_is_exact_filter_not_matching(srv, uid):
    """UNSUBSCRIBE compares filters character by character; it does not match topics."""
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=1)
    sub.unsubscribe(f"{uid}/a")  # not the same filter: nothing removed
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/a", b"still", qos=1)
    assert sub.recv_publish().payload == b"still"


def test_unsubscribe_several_filters(srv, uid):
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/a", f"{uid}/b", f"{uid}/c", qos=1)
    sub.unsubscribe(f"{uid}/a", f"{uid}/b")
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/a", b"a", qos=1)
    pub.publish(f"{uid}/b", b"b", qos=1)
    pub.publish(f"{uid}/c", b"c", qos=1)
    assert sub.recv_publish().payload == b"c"


def test_subscription_ends_with_connection_for_clean_session(srv, uid):
    t = f"{uid}/t"
    sub = srv.client(f"{uid}-s", clean=True)
    sub.subscribe(t, qos=1)
    sub.disconnect()
    sub = srv.client(f"{uid}-s", clean=True)
    assert sub.connack.session_present is False
    sub.subscribe(f"{uid}/marker", qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(t, b"gone", qos=1)
    expect_only_marker(sub, pub, f"{uid}/marker")


def test_many_topics_and_subscribers(srv, uid):
    subs = []
    for i in range(20):
        s = srv.client(f"{uid}-s{i}")
        s.subscribe(f"{uid}/dev/{i}/+", f"{uid}/all/#", qos=1)
        subs.append(s)
    pub = srv.client(f"{uid}-p")
    for i in range(20):
        pub.publish(f"{uid}/dev/{i}/temp", str(i), qos=1)
    pub.publish(f"{uid}/all/x", b"broadcast", qos=1)
    for i, s in enumerate(subs):
        assert s.recv_publish().payload == str(i).encode()
        assert s.recv_publish().payload == b"broadcast"
