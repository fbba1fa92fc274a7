"""``limits.receive_maximum`` bounds the QoS 2 messages from one client that await their PUBREL,
for MQTT 3.1.1 clients too (docs/limits.md, "Incoming QoS 2"). 3.1.1 has no Receive Maximum:
a client that never sent PUBREL made its session hold up to 65,535 ids (about 6 MB of memory
and 380 KB of snapshot each), uncounted. Now one more closes a 3.1.1 connection (there is no
negative acknowledgement), counted in ``limit_hits`` and logged; 5.0 clients are told the
default of 1024 in CONNACK and get DISCONNECT 0x93, counted the same way."""

import signal

import mqttraw as m
import mqttraw5 as R
from conftest import toml_dumps

DEFAULT = 1024


def _pubrecs(c, pids, timeout: float = 15.0) -> None:
    for pid in pids:
        got = c.recv_packet(timeout)
        assert (got.type, got.packet_id) == (m.PUBREC, pid), (got, pid)


def _line(b, start: int) -> str:
    line = b.wait_log(lambda ln: "receive_maximum" in ln and "refused" in ln, start=start)
    assert line, b.log_text()[-3000:]
    return line


def test_a_3_1_1_client_past_the_default_is_closed_counted_and_logged(broker, uid):
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=0)
    watcher = b.client(f"{uid}-w")
    watcher.subscribe(f"{uid}/will")
    c = b.client(f"{uid}-c", will=(f"{uid}/will", b"gone"))
    mark = b.mark()
    c.send(b"".join(m.publish(f"{uid}/t", b"%d" % pid, qos=2, packet_id=pid)
                    for pid in range(1, DEFAULT + 1)))
    _pubrecs(c, range(1, DEFAULT + 1))
    c.send(m.publish(f"{uid}/t", b"x", qos=2, packet_id=DEFAULT, dup=True))  # a re-send: taken
    _pubrecs(c, [DEFAULT])
    c.send(m.publish(f"{uid}/t", b"one more", qos=2, packet_id=DEFAULT + 1))
    assert c.expect_closed(10) and c.before_close == []      # no PUBREC for it
    line = _line(b, mark)
    assert f"{uid}-c" in line and f"{DEFAULT} QoS 2 messages" in line, line
    assert f"(receive_maximum {DEFAULT})" in line and "packet id 1025" in line, line
    assert watcher.recv_publish().payload == b"gone"         # closed by the broker: the will
    got = [sub.recv_publish().payload for _ in range(DEFAULT)]
    assert got == [b"%d" % pid for pid in range(1, DEFAULT + 1)]
    assert sub.ping() == []                                  # the one refused was not routed
    assert b.stats()["limit_hits"]["receive_maximum"] == 1
    assert len([ln for ln in b.logs[mark:] if "receive_maximum" in ln]) == 1


def test_a_3_1_1_client_that_pipelines_past_the_limit_gets_through_on_reconnects(broker, uid):
    """1100 QoS 2 PUBLISHes in one write, before any PUBREL (paho-mqtt re-sends its whole
    queue so at a reconnect): the PUBRECs of the 1024 taken go out, then the connection
    closes (they were dropped at the close, and such a client never got anywhere). On the
    next connection the client releases them and sends the rest: each delivered once."""
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    total = DEFAULT + 76
    c = b.client(f"{uid}-c", clean=False)
    c.send(b"".join(m.publish(f"{uid}/t", b"%d" % pid, qos=2, packet_id=pid)
                    for pid in range(1, total + 1)))
    _pubrecs(c, range(1, DEFAULT + 1))
    assert c.expect_closed(10) and c.before_close == []
    back = b.client(f"{uid}-c", clean=False)
    back.send(b"".join(m.pubrel(pid) for pid in range(1, DEFAULT + 1))
              + b"".join(m.publish(f"{uid}/t", b"%d" % pid, qos=2, packet_id=pid, dup=True)
                         for pid in range(DEFAULT + 1, total + 1)))
    answers = [back.recv_packet(15) for _ in range(total)]
    assert sorted((p.type, p.packet_id) for p in answers) == sorted(
        [(m.PUBCOMP, pid) for pid in range(1, DEFAULT + 1)]
        + [(m.PUBREC, pid) for pid in range(DEFAULT + 1, total + 1)])
    back.send(b"".join(m.pubrel(pid) for pid in range(DEFAULT + 1, total + 1)))
    assert [back.expect(m.PUBCOMP).packet_id for _ in range(76)] == list(range(DEFAULT + 1,
                                                                              total + 1))
    got = [sub.recv_publish().payload for _ in range(total)]
    assert got == [b"%d" % pid for pid in range(1, total + 1)] and sub.ping() == []
    assert b.stats()["limit_hits"]["receive_maximum"] == 1


def test_pubrel_makes_room_for_a_3_1_1_client(broker, uid):
    b = broker(limits={"receive_maximum": 2})
    c = b.client(f"{uid}-c")
    c.send(m.publish(f"{uid}/t", b"1", qos=2, packet_id=1)
           + m.publish(f"{uid}/t", b"2", qos=2, packet_id=2))
    _pubrecs(c, [1, 2])
    c.send(m.pubrel(1))
    assert c.expect(m.PUBCOMP).packet_id == 1
    c.send(m.publish(f"{uid}/t", b"3", qos=2, packet_id=3))
    _pubrecs(c, [3])
    mark = b.mark()
    c.send(m.publish(f"{uid}/t", b"4", qos=2, packet_id=4))
    assert c.expect_closed(10) and c.before_close == []
    assert "(receive_maximum 2)" in _line(b, mark)
    assert b.stats()["limit_hits"]["receive_maximum"] == 1


def test_a_reload_applies_to_a_connected_3_1_1_client_from_its_next_publish(broker, uid):
    b = broker(limits={"receive_maximum": 3})
    c = b.client(f"{uid}-c")
    c.send(m.publish(f"{uid}/t", b"1", qos=2, packet_id=1)
           + m.publish(f"{uid}/t", b"2", qos=2, packet_id=2))
    _pubrecs(c, [1, 2])
    mark = b.mark()
    b.config_path.write_text(toml_dumps(dict(b.config, limits={"receive_maximum": 2})))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)
    c.send(m.publish(f"{uid}/t", b"3", qos=2, packet_id=3))   # the third: over the new 2
    assert c.expect_closed(10) and c.before_close == []
    assert "(receive_maximum 2)" in _line(b, mark)


def test_ids_held_from_before_are_forgotten_first_for_3_1_1(broker, uid):
    """Two ids await PUBREL when a persistent 3.1.1 client goes; it comes back without sending
    their PUBRELs. Its new QoS 2 PUBLISHes are taken, an old id forgotten for each; a late
    PUBREL still gets its PUBCOMP; past its own two the connection closes."""
    b = broker(limits={"receive_maximum": 2})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    c = b.client(f"{uid}-c", clean=False)
    c.send(m.publish(f"{uid}/t", b"old 1", qos=2, packet_id=1)
           + m.publish(f"{uid}/t", b"old 2", qos=2, packet_id=2))
    _pubrecs(c, [1, 2])
    c.abort()
    mark = b.mark()
    back = b.client(f"{uid}-c", clean=False)
    back.send(m.publish(f"{uid}/t", b"new 3", qos=2, packet_id=3)
              + m.publish(f"{uid}/t", b"new 4", qos=2, packet_id=4))
    _pubrecs(back, [3, 4])
    assert b.wait_log(lambda ln: "held from before this connection" in ln, start=mark)
    back.send(m.pubrel(1))                                   # late: answered all the same
    assert back.expect(m.PUBCOMP).packet_id == 1
    back.send(m.publish(f"{uid}/t", b"x", qos=2, packet_id=5))
    assert back.expect_closed(10)                            # 3 and 4 are its own
    got = sorted(sub.recv_publish().payload for _ in range(4))
    assert got == [b"new 3", b"new 4", b"old 1", b"old 2"]
    assert b.stats()["limit_hits"]["receive_maximum"] == 1


def test_ids_the_client_sends_again_are_not_forgotten(broker, uid):
    """A client whose PUBRECs were lost sends its PUBLISHes again (DUP) after reconnecting,
    not PUBRELs: those ids are its own again, and a new PUBLISH past the limit closes the
    connection instead of forgetting one of them (which took the next DUP re-send of it for
    a new message: delivered twice)."""
    b = broker(limits={"receive_maximum": 2})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    c = b.client(f"{uid}-c", clean=False)
    a, bb = (m.publish(f"{uid}/t", x, qos=2, packet_id=i) for i, x in ((1, b"A"), (2, b"B")))
    c.send(a + bb)
    _pubrecs(c, [1, 2])
    c.abort()                                   # as if the PUBRECs were lost
    again = [m.publish(f"{uid}/t", x, qos=2, packet_id=i, dup=True)
             for i, x in ((1, b"A"), (2, b"B"))]
    back = b.client(f"{uid}-c", clean=False)
    back.send(b"".join(again) + m.publish(f"{uid}/t", b"C", qos=2, packet_id=3))
    _pubrecs(back, [1, 2])
    assert back.expect_closed(10)               # C: over the limit, A and B are live
    last = b.client(f"{uid}-c", clean=False)
    last.send(b"".join(again))                  # their PUBRECs lost again: still no copy
    _pubrecs(last, [1, 2])
    last.send(m.pubrel(1) + m.pubrel(2))
    assert [last.expect(m.PUBCOMP).packet_id for _ in range(2)] == [1, 2]
    last.send(m.publish(f"{uid}/t", b"C", qos=2, packet_id=3))
    _pubrecs(last, [3])
    got = [sub.recv_publish().payload for _ in range(3)]
    assert got == [b"A", b"B", b"C"] and sub.ping() == []


def test_an_id_released_and_taken_again_is_the_clients(broker, uid):
    """An id held from before, released (PUBREL) and then used for a new message on this
    connection is not forgotten as "held from before" when the limit is reached."""
    b = broker(limits={"receive_maximum": 1})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    c = b.client(f"{uid}-c", clean=False)
    c.send(m.publish(f"{uid}/t", b"A", qos=2, packet_id=5))
    _pubrecs(c, [5])
    c.abort()
    back = b.client(f"{uid}-c", clean=False)
    back.send(m.pubrel(5))
    assert back.expect(m.PUBCOMP).packet_id == 5
    back.send(m.publish(f"{uid}/t", b"B", qos=2, packet_id=5))
    _pubrecs(back, [5])
    back.send(m.publish(f"{uid}/t", b"C", qos=2, packet_id=6))   # over: closed, 5 kept
    assert back.expect_closed(10)
    last = b.client(f"{uid}-c", clean=False)
    last.send(m.publish(f"{uid}/t", b"B", qos=2, packet_id=5, dup=True))
    _pubrecs(last, [5])
    assert [sub.recv_publish().payload for _ in range(2)] == [b"A", b"B"]
    assert sub.ping() == []                     # B once


def test_a_5_0_client_is_told_the_default_and_counted(broker, uid):
    b = broker()
    c = R.RawClient5(b.host, b.port)
    try:
        assert c.connect(f"{uid}-c5").properties[R.RECEIVE_MAXIMUM] == DEFAULT
        c.send(b"".join(R.publish5(f"{uid}/t", b"x", 2, packet_id=pid)
                        for pid in range(1, DEFAULT + 1)))
        for pid in range(1, DEFAULT + 1):
            got = c.recv_packet(15)
            assert (got.type, got.packet_id) == (R.PUBREC, pid), got
        c.send(R.publish5(f"{uid}/t", b"x", 2, packet_id=DEFAULT + 1))
        assert c.expect_disconnect().reason == 0x93
        assert b.stats()["limit_hits"]["receive_maximum"] == 1
    finally:
        c.close()


def test_a_5_0_client_over_it_is_logged_with_the_client_and_the_limit(broker, uid):
    """Its DISCONNECT 0x93 has the 3.1.1 case's kind in the log (once per address and
    refusal_log_interval): another client's protocol violation from the same address just
    before (a Topic Alias over the maximum) does not hide its line, which was a generic "1
    more protocol violations from 127.0.0.1" later, naming neither client nor limit."""
    b = broker(refusal_log_interval=60, limits={"receive_maximum": 3, "max_topic_alias": 2})
    mark = b.mark()
    other = R.RawClient5(b.host, b.port)
    q2 = R.RawClient5(b.host, b.port)
    try:
        assert other.connect(f"{uid}-alias").reason == 0
        other.send(R.publish5(f"{uid}/t", b"x", props={R.TOPIC_ALIAS: 3}))
        assert other.expect_disconnect().reason == 0x94
        assert b.wait_log(lambda ln: f"{uid}-alias" in ln and "Topic Alias" in ln, start=mark)
        assert q2.connect(f"{uid}-q2").properties[R.RECEIVE_MAXIMUM] == 3
        q2.send(b"".join(R.publish5(f"{uid}/t", b"x", 2, packet_id=pid) for pid in range(1, 5)))
        assert q2.expect_disconnect().reason == 0x93
        line = _line(b, mark)
        assert f"{uid}-q2" in line and "3 QoS 2 messages" in line, line
        assert "(receive_maximum 3, its Receive Maximum)" in line and "packet id 4" in line, line
        s = b.stats()
        assert s["limit_hits"]["receive_maximum"] == 1 and s["counters"]["protocol_errors"] == 2
    finally:
        other.close()
        q2.close()
