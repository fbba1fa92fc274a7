"""The control packet rate with real clients (docs/limits.md, "Control packet rate"): PINGREQ,
SUBSCRIBE, UNSUBSCRIBE and acknowledgements of no message in flight are charged to a client's
control_rate; over it the client is throttled (not read, not disconnected), counted and logged
once, and every packet it sent is still answered, in order. PUBLISH and the acknowledgements of
messages in flight are not charged."""

import time

import mqttraw as m
import mqttraw5 as R
from secfiles import write_passwords


def _answers(c, ptype: int, n: int, timeout: float = 15.0) -> list:
    """The next ``n`` packets, each of type ``ptype`` (bounded: ``timeout`` for each)."""
    got = []
    for _ in range(n):
        p = c.recv_packet(timeout)
        assert p.type == ptype, (p, len(got))
        got.append(p)
    return got


def test_a_pingreq_flood_is_throttled_answered_counted_and_logged_once(broker, uid):
    b = broker(limits={"control_rate": 200, "control_burst": 20})
    probe = b.client(f"{uid}-probe")
    flood = b.client(f"{uid}-flood")
    mark = b.mark()
    n = 300
    flood.send(m.pingreq() * n)
    line = b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=10, start=mark)
    assert line and f"{uid}-flood" in line and "control_rate 200/s" in line, line
    assert probe.ping() == []                   # another client is served meanwhile
    _answers(flood, m.PINGRESP, n)              # each one answered: throttled, not dropped
    assert flood.ping() == []                   # and still connected
    s = b.stats()
    # 280 past the burst, about 4 (20 ms of 200/s) let through per throttle.
    assert s["limit_hits"]["control_rate"] >= 10, s["limit_hits"]
    assert b.client_row(f"{uid}-flood")["throttled_seconds"] > 0
    assert b.client_row(f"{uid}-probe")["throttled_seconds"] == 0
    lines = [ln for ln in b.logs[mark:] if "over its control packet rate" in ln]
    assert len(lines) == 1, lines


def test_acks_of_messages_in_flight_are_free_and_others_are_charged(broker, uid):
    b = broker(limits={"control_rate": 50, "control_burst": 10})
    c = b.client(f"{uid}-q2")
    n = 40
    c.send(b"".join(m.publish(f"{uid}/t", b"x", qos=2, packet_id=i + 1) for i in range(n)))
    assert [p.packet_id for p in _answers(c, m.PUBREC, n)] == list(range(1, n + 1))
    c.send(b"".join(m.pubrel(i + 1) for i in range(n)))
    assert [p.packet_id for p in _answers(c, m.PUBCOMP, n)] == list(range(1, n + 1))
    assert b.stats()["limit_hits"]["control_rate"] == 0   # a whole QoS 2 flow: not charged
    mark = b.mark()
    c.send(b"".join(m.pubrel(i + 1) for i in range(n)))  # released already: no window
    assert [p.packet_id for p in _answers(c, m.PUBCOMP, n)] == list(range(1, n + 1))
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    assert b.wait_log(lambda ln: "over its control packet rate" in ln and f"{uid}-q2" in ln,
                      start=mark)


def test_a_5_0_unsubscribe_flood_is_throttled_and_answered_in_order(broker, uid):
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    c = R.RawClient5(b.host, b.port)
    assert c.connect(f"{uid}-v5").reason == 0
    n = 60
    c.send(b"".join(R.unsubscribe5(i + 1, [f"{uid}/{i}"]) for i in range(n)))
    assert [p.packet_id for p in _answers(c, m.UNSUBACK, n)] == list(range(1, n + 1))
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    c.close()


def test_control_rate_0_turns_the_limit_off(broker, uid):
    b = broker(limits={"control_rate": 0, "control_burst": 1})
    c = b.client(f"{uid}-free")
    n = 500
    c.send(m.pingreq() * n)
    _answers(c, m.PINGRESP, n)
    assert b.stats()["limit_hits"]["control_rate"] == 0


def test_a_client_within_its_rate_after_a_pause_is_not_throttled(broker, uid):
    """A packet is charged at the time it is handled, not at the client's previous read: a
    burst after a pause long enough to refill the budget goes through unthrottled (the
    publish rate likewise)."""
    b = broker(limits={"control_rate": 100, "control_burst": 100,
                       "messages_rate": 100, "messages_burst": 100})
    c = b.client(f"{uid}-c", keepalive=600)
    n = 80
    for _ in range(2):
        c.send(m.pingreq() * n)
        _answers(c, m.PINGRESP, n)
        c.send(b"".join(m.publish(f"{uid}/t", b"x", qos=1, packet_id=i + 1) for i in range(n)))
        _answers(c, m.PUBACK, n)
        time.sleep(1.2)         # both budgets whole again (100 a second)
    hits = b.stats()["limit_hits"]
    assert hits.get("control_rate", 0) == 0 and hits.get("messages_rate", 0) == 0, hits


def test_packets_held_during_the_password_check_keep_to_the_control_rate(broker, tmp_path,
                                                                          uid):
    """PINGREQs sent right behind CONNECT are held while the password check runs. They were
    then all answered at once, past the throttle: now a throttle stops them as it stops
    reading, and the rest are answered, in order, as the rate allows."""
    pw = write_passwords(tmp_path / "passwd", {"dev": "secret"})
    b = broker(password_file=str(pw), limits={"control_rate": 100, "control_burst": 10})
    c = m.RawClient(b.host, b.port)
    n = 110                      # 100 past the burst: about a second at 100/s
    c.send(m.connect(f"{uid}-held", username="dev", password="secret") + m.pingreq() * n)
    assert c.expect(m.CONNACK, 15).rc == 0
    _answers(c, m.PINGRESP, 1)
    first = time.monotonic()
    _answers(c, m.PINGRESP, n - 1)
    assert time.monotonic() - first >= 0.5      # paced by the rate, not all at once
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    assert b.client_row(f"{uid}-held")["throttled_seconds"] > 0
    assert c.ping() == []
    c.close()


def _retained(b, uid, n: int) -> None:
    pub = b.client(f"{uid}-ret")
    pub.send(b"".join(m.publish(f"{uid}/r/{i}", b"%d" % i, retain=True) for i in range(n)))
    assert pub.ping() == []                     # all handled


def test_retained_messages_a_subscribe_matches_cost_the_control_rate(broker, uid):
    """Each SUBSCRIBE walks the retained messages its filters match, at one control token a
    packet: re-subscribing to '#' over a large retained set took the loop for seconds. Now
    every 100 retained messages matched cost a packet: the client is throttled, counted,
    and still gets every copy it asked for."""
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    _retained(b, uid, 500)
    c = b.client(f"{uid}-sub")
    mark = b.mark()
    c.send(b"".join(m.subscribe(i + 1, [(f"{uid}/r/#", 0)]) for i in range(3)))
    got = 0
    for _ in range(3 * 501):                    # three SUBACKs, 500 copies after each
        p = c.recv_packet(15)
        got += p.type == m.PUBLISH and p.retain
    assert got == 1500
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    assert b.client_row(f"{uid}-sub")["throttled_seconds"] > 0
    assert b.wait_log(lambda ln: "over its control packet rate" in ln and f"{uid}-sub" in ln,
                      start=mark)


def test_subscribes_that_walk_a_large_retained_tree_cost_the_control_rate(broker, uid):
    """A SUBSCRIBE whose filter matches no retained message may still walk the whole tree
    ("+" levels): 1,000 such SUBSCRIBEs pipelined took the loop for seconds, each charged
    one packet. The nodes walked are charged too (ten per retained message matched), so five
    SUBSCRIBEs, within the burst of 10 as packets, are throttled, counted and logged."""
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    _retained(b, uid, 4000)                                 # <uid>/r/<i>
    c = b.client(f"{uid}-sub")
    mark = b.mark()
    c.send(b"".join(m.subscribe(i + 1, [("+/+/+/none", 0)]) for i in range(5)))
    assert [c.expect(m.SUBACK, 15).packet_id for _ in range(5)] == [1, 2, 3, 4, 5]
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    assert b.client_row(f"{uid}-sub")["throttled_seconds"] > 0
    assert b.wait_log(lambda ln: "over its control packet rate" in ln and f"{uid}-sub" in ln,
                      start=mark)


def test_a_filter_listed_twice_in_one_subscribe_gets_its_retained_messages_once(broker, uid):
    b = broker()
    _retained(b, uid, 3)
    c = b.client(f"{uid}-sub")
    c.send(m.subscribe(1, [(f"{uid}/r/#", 0), (f"{uid}/r/#", 1)]))
    assert c.expect(m.SUBACK).codes == [0, 1]
    got = [p for p in c.ping() if p.type == m.PUBLISH]
    assert sorted((p.topic, p.qos) for p in got) == [(f"{uid}/r/{i}", 0) for i in range(3)]


def test_overlapping_filters_in_one_subscribe_get_each_retained_message_once(broker, uid):
    """Filters of one SUBSCRIBE that overlap get each retained message once, at the highest
    QoS among those matching it (as live routing, MQTT-3.3.5-1): the 12 filters here, each
    matching all 200 messages, sent 2,400 copies (a SUBSCRIBE of 1,000 such filters over a
    large retained set took the loop for minutes); now 200."""
    b = broker()
    pub = b.client(f"{uid}-ret")
    n = 200
    pub.send(b"".join(m.publish(f"{uid}/r/{i}/x", b"%d" % i, retain=True, qos=1, packet_id=i + 1)
                      for i in range(n)))
    assert [pub.expect(m.PUBACK, 15).packet_id for _ in range(n)] == list(range(1, n + 1))
    every = ["#", "+/#", "+/+/+/+", "+/r/+/x", f"{uid}/#", f"{uid}/+/#", f"{uid}/r/#",
             f"{uid}/r/+/#", f"{uid}/r/+/x", f"{uid}/r/+/+", f"{uid}/+/+/x", f"{uid}/+/+/+"]
    filters = [(f, 1 if f == f"{uid}/r/+/x" else 0) for f in every]
    filters += [(f"{uid}/r/{i}/x", 0) for i in range(3)]
    c = b.client(f"{uid}-sub")
    c.send(m.subscribe(1, filters))
    assert c.expect(m.SUBACK).codes == [q for _, q in filters]
    got = []
    while len(got) < n:
        p = c.recv_packet(15)
        assert p.type == m.PUBLISH and p.retain, p
        got.append((p.topic, p.qos))
        if p.qos == 1:
            c.send(m.puback(p.packet_id))
    assert [p for p in c.ping() if p.type == m.PUBLISH] == []        # no second copy
    # QoS 1 for each: granted by one filter of the 15, the others granted 0.
    assert sorted(got) == sorted((f"{uid}/r/{i}/x", 1) for i in range(n))


def test_one_subscribe_over_the_rate_is_one_throttle(broker, uid):
    """The retained messages' charge throttled the client, then the SUBSCRIBE's own charge
    throttled it again: two hits for one throttle (docs/limits.md: one hit is one throttle)."""
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    _retained(b, uid, 1000)
    c = b.client(f"{uid}-sub")
    c.send(m.subscribe(1, [(f"{uid}/r/#", 0)]))
    got = 0
    for _ in range(1001):
        got += c.recv_packet(15).type == m.PUBLISH
    assert got == 1000
    assert b.stats()["limit_hits"]["control_rate"] == 1
