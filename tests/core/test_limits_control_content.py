"""The control packet rate charges packets by their content (docs/limits.md, "Control packet
rate"), with real clients: a SUBSCRIBE or UNSUBSCRIBE costs one token per 10 topic filters,
100 User Properties cost one token in any packet (PUBLISH and acknowledgements too), and a
PUBACK or PUBCOMP for no message in flight costs one, as a PUBREL or PUBREC does. A client
over the rate this way is throttled, counted in limit_hits control_rate and logged once,
naming what it sent; small SUBSCRIBEs and the PUBACKs of messages in flight are not."""

import pytest

import mqttraw as m
import mqttraw5 as R

from core.test_limits_control import _answers

THROTTLED = "over its control packet rate"


def _throttled(b, mark, who: str, what: str) -> None:
    """``who`` was throttled for ``what``: counted once at least, logged once."""
    line = b.wait_log(lambda ln: THROTTLED in ln and who in ln, timeout=10, start=mark)
    assert what in line, line
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    assert len([ln for ln in b.logs[mark:] if THROTTLED in ln]) == 1


def _users(n: int) -> dict:
    return {R.USER_PROPERTY: [("k", "v")] * n}


def test_a_subscribe_of_many_filters_is_charged_by_their_number(broker, uid):
    b = broker()                                # defaults: 100 a second, 1000 at once
    c = b.client(f"{uid}-subs")
    mark = b.mark()
    n = 20_000                                  # 2,000 tokens: past the burst
    c.send(m.subscribe(1, [(f"{uid}/{i}", 0) for i in range(n)]))
    assert len(_answers(c, m.SUBACK, 1)[0].body) == 2 + n     # one code per filter
    _throttled(b, mark, f"{uid}-subs", f"a SUBSCRIBE of {n} topic filters")


def test_a_5_0_unsubscribe_of_many_filters_is_charged_by_their_number(broker, uid):
    b = broker(limits={"control_rate": 100, "control_burst": 50})
    c = R.RawClient5(b.host, b.port)
    assert c.connect(f"{uid}-unsubs").reason == 0
    mark = b.mark()
    n = 1_000                                   # 100 tokens
    c.send(R.unsubscribe5(1, [f"{uid}/{i}" for i in range(n)]))
    _answers(c, m.UNSUBACK, 1)
    _throttled(b, mark, f"{uid}-unsubs", f"an UNSUBSCRIBE of {n} topic filters")
    c.close()


def test_pubacks_with_many_user_properties_for_no_message_are_charged(broker, uid):
    b = broker(limits={"control_rate": 100, "control_burst": 50,
                       "messages_rate": 10, "bytes_rate": 10_000})
    c = R.RawClient5(b.host, b.port)
    assert c.connect(f"{uid}-acker").reason == 0
    mark = b.mark()
    n = 2_000                                   # 20 tokens each
    c.send(R.puback5(7, 0, _users(n)) * 3)
    _throttled(b, mark, f"{uid}-acker", f"a PUBACK of {n} User Properties")
    assert c.ping(20) == []                     # throttled, not disconnected
    c.close()


def test_a_publish_with_many_user_properties_is_charged(broker, uid):
    b = broker(limits={"control_rate": 100, "control_burst": 50})
    c = R.RawClient5(b.host, b.port)
    assert c.connect(f"{uid}-pub").reason == 0
    mark = b.mark()
    n = 6_000                                   # 60 tokens
    c.send(R.publish5(f"{uid}/t", b"x", qos=1, packet_id=1, props=_users(n)))
    assert _answers(c, m.PUBACK, 1)[0].packet_id == 1
    _throttled(b, mark, f"{uid}-pub", f"a PUBLISH of {n} User Properties")
    c.close()


def test_pubacks_and_pubcomps_for_no_message_in_flight_are_charged(broker, uid):
    b = broker(limits={"control_rate": 50, "control_burst": 10})
    c = b.client(f"{uid}-strays")
    mark = b.mark()
    c.send(b"".join(m.puback(i + 1) for i in range(40)))   # one read of PUBACKs only
    _throttled(b, mark, f"{uid}-strays", "")
    assert c.ping(20) == []
    d = b.client(f"{uid}-comps")
    hits = b.stats()["limit_hits"]["control_rate"]
    d.send(b"".join(m.pubcomp(i + 1) + m.pingreq() for i in range(20)))
    _answers(d, m.PINGRESP, 20)
    assert b.stats()["limit_hits"]["control_rate"] > hits


def test_small_subscribes_and_acks_of_messages_in_flight_are_charged_as_before(broker, uid):
    """Ten filters or fewer cost a SUBSCRIBE one token, as before; PUBACKs of messages in
    flight with a few User Properties and PUBLISHes with a few cost none."""
    b = broker(limits={"control_rate": 20, "control_burst": 20})
    c = R.RawClient5(b.host, b.port)
    assert c.connect(f"{uid}-dev").reason == 0
    for i in range(15):
        assert c.subscribe(*[f"{uid}/{i}/{j}" for j in range(10)], qos=1).type == m.SUBACK
    pub = b.client(f"{uid}-src")
    n = 10                                      # within the delivery window
    pub.send(b"".join(m.publish(f"{uid}/0/0", b"x", qos=1, packet_id=i + 1)
                      for i in range(n)))
    _answers(pub, m.PUBACK, n)
    got = _answers(c, m.PUBLISH, n)
    c.send(b"".join(R.puback5(p.packet_id, 0, _users(99)) for p in got))
    c.send(b"".join(R.publish5(f"{uid}/x", b"x", props=_users(99)) for _ in range(n)))
    assert c.ping(10) == []
    assert b.stats()["limit_hits"]["control_rate"] == 0
    c.close()


@pytest.mark.parametrize("name, packet, answer", [
    ("PUBREC", lambda props: R.pubrec5(7, 0, props), m.PUBREL),
    ("PUBREL", lambda props: R.pubrel5(7, 0, props), m.PUBCOMP),
    ("PUBCOMP", lambda props: R.pubcomp5(7, 0, props), None),
    ("SUBSCRIBE", lambda props: R.subscribe5(3, [("a/b", 0)], props), m.SUBACK),
    ("UNSUBSCRIBE", lambda props: R.unsubscribe5(3, ["a/b"], props), m.UNSUBACK),
])
def test_every_5_0_packet_with_many_user_properties_is_charged(broker, uid, name, packet,
                                                               answer):
    """Whichever 5.0 packet carries them, many User Properties cost tokens: the client is
    throttled, naming the packet, and not disconnected."""
    b = broker(limits={"control_rate": 100, "control_burst": 50})
    c = R.RawClient5(b.host, b.port)
    assert c.connect(f"{uid}-c").reason == 0
    mark = b.mark()
    n = 2_000                                   # 20 tokens each
    c.send(packet(_users(n)) * 3)
    if answer is not None:
        _answers(c, answer, 3)
    _throttled(b, mark, f"{uid}-c", f"{name} of {n} User Properties")
    assert c.ping(20) == []
    c.close()
