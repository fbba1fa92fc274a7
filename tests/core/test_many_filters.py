"""Sessions with max_subscriptions_per_client (1,000) filters on a real broker: a 5.0 session
with No Local, Retain As Published and Subscription Identifiers gets exactly the messages,
QoS, retain flags and identifiers its filters say, also after UNSUBSCRIBE and SUBSCRIBE
change them; a 3.1.1 session reading its backlog from the log takes exactly the records its
filters match, each at the highest QoS granted. (Both go through the session's compiled
filters, core.filter_set, instead of every filter for each message.)"""

from __future__ import annotations

import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import _open_clients
from core.test_mqtt5_raw import raw5

pytestmark = pytest.mark.timeout(120)

NL, RAP = R.NO_LOCAL, 0x08


def raw(b, client_id, **kw) -> m.RawClient:
    c = m.RawClient(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id, **kw).rc == 0
    return c


def received5(c, n: int) -> list:
    got = []
    for _ in range(n):
        p = c.wait_for(lambda p: p.type == R.PUBLISH, 10)
        c.ack(p)
        got.append((p.topic, p.payload, p.qos, p.retain,
                    sorted(p.properties.get(R.SUBSCRIPTION_ID, []))))
    assert c.ping() == []          # nothing more
    return got


def test_a_5_0_session_with_1000_filters_and_no_local(srv, uid):
    c = raw5(srv, f"{uid}-c")
    p = raw5(srv, f"{uid}-p")
    assert c.subscribe((f"{uid}/#", 1 | NL | RAP), props={R.SUBSCRIPTION_ID: 1}).codes == [1]
    # uid/+/+/z<i> at QoS i % 3; the even ones with identifier i + 2, z3 with No Local.
    for i in range(0, 999, 2):
        sub = c.subscribe((f"{uid}/+/+/z{i}", i % 3), props={R.SUBSCRIPTION_ID: i + 2})
        assert sub.codes == [i % 3]
    odd = [(f"{uid}/+/+/z{i}", i % 3 | (NL if i == 3 else 0)) for i in range(1, 999, 2)]
    for j in range(0, len(odd), 100):
        assert c.subscribe(*odd[j:j + 100]).codes == [q & 3 for _, q in odd[j:j + 100]]
    c.publish(f"{uid}/x", b"own-x", qos=2)                 # only uid/#, No Local: not sent
    c.publish(f"{uid}/a/b/z4", b"own-z4", qos=2, retain=True)   # z4 only (QoS 1, id 6)
    c.publish(f"{uid}/a/b/z3", b"own-z3", qos=2)           # z3 has No Local too: not sent
    p.publish(f"{uid}/a/b/z4", b"z4", qos=2, retain=True)  # both; retain as published
    p.publish(f"{uid}/a/b/z5", b"z5", qos=2)               # z5 grants 2, has no identifier
    p.publish(f"{uid}/q/r/s/z4", b"deep", qos=2)           # uid/# only
    assert received5(c, 4) == [
        (f"{uid}/a/b/z4", b"own-z4", 1, False, [6]),
        (f"{uid}/a/b/z4", b"z4", 1, True, [1, 6]),
        (f"{uid}/a/b/z5", b"z5", 2, False, [1]),
        (f"{uid}/q/r/s/z4", b"deep", 1, False, [1]),
    ]
    c.unsubscribe(f"{uid}/+/+/z4")
    assert c.subscribe((f"{uid}/+/+/w", 2), props={R.SUBSCRIPTION_ID: 777}).codes == [2]
    p.publish(f"{uid}/a/b/z4", b"z4-again", qos=2)
    p.publish(f"{uid}/a/b/w", b"w", qos=2)
    c.publish(f"{uid}/a/b/w", b"own-w", qos=2)
    c.publish(f"{uid}/a/b/z3", b"own-z3-again", qos=1)
    assert received5(c, 3) == [
        (f"{uid}/a/b/z4", b"z4-again", 1, False, [1]),
        (f"{uid}/a/b/w", b"w", 2, False, [1, 777]),
        (f"{uid}/a/b/w", b"own-w", 2, False, [777]),
    ]
    # One more filter is over max_subscriptions_per_client: the set is what it was.
    assert c.subscribe((f"{uid}/+/+/v", 1)).codes == [0x80]
    p.publish(f"{uid}/a/b/v", b"v", qos=1)
    assert received5(c, 1) == [(f"{uid}/a/b/v", b"v", 1, False, [1])]


def test_a_session_behind_with_1000_filters_takes_what_they_match(broker, uid):
    b = broker()
    s = raw(b, f"{uid}-s", clean=False)
    filters = [(f"{uid}/+/+/z{i}", i % 3) for i in range(999)] + [(f"{uid}/a/#", 1)]
    for j in range(0, 1000, 100):
        assert s.subscribe(*filters[j:j + 100]).codes == [q for _, q in filters[j:j + 100]]
    s.disconnect()
    p = raw(b, f"{uid}-p")
    long_topic = f"{uid}/a/" + "long/" * 60 + "end"       # over 256 characters: not cached
    sent = [(f"{uid}/a/b/z7", 2), (f"{uid}/c/d/z8", 2), (f"{uid}/c/d/nothing", 2),
            (f"{uid}/c/d/z9", 1), (long_topic, 2), ("/".join([uid] + ["x"] * 125), 2),
            (f"{uid}/c/d/z8/deeper", 2), (f"{uid}/a/b/z7", 2), (f"{uid}/c/d/z6", 1)]
    for i, (topic, qos) in enumerate(sent * 3):
        p.publish(topic, b"%d" % i, qos=qos)
    s = raw(b, f"{uid}-s", clean=False)
    # z7 grants 1 (and uid/a/# 1), z8 2, the long topic 1 (uid/a/#); z9 and z6 grant 0, and
    # QoS 0 is not kept for an offline session (queue_qos0_messages).
    takes = {f"{uid}/a/b/z7": 1, f"{uid}/c/d/z8": 2, long_topic: 1}
    expected = [(topic, b"%d" % i, takes[topic]) for i, (topic, _) in enumerate(sent * 3)
                if topic in takes]
    assert len(expected) == 12
    got = []
    for _ in expected:
        msg = s.recv_publish(10)
        got.append((msg.topic, msg.payload, msg.qos))
    assert s.ping() == []
    assert got == expected
