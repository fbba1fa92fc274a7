"""Regressions for problems found in review: each test names what used to go wrong."""

import signal
import time

from conftest import run_cli
from mqttraw import PUBLISH, PUBREL, publish, pubrec


def test_will_on_a_very_deep_topic_is_delivered_and_broker_survives(broker, uid):
    """A 3000-level will topic once overflowed the recursive trie walk and killed the broker."""
    b = broker()
    deep = "/".join([uid] + ["d"] * 3000)
    sub = b.client(f"{uid}-s")
    sub.subscribe("#", qos=1)
    dying = b.client(f"{uid}-w", will=(deep, b"gone", 1, True))
    dying.abort()  # reset: the broker notices while reading or flushing
    p = sub.recv_publish()
    assert (p.topic, p.payload) == (deep, b"gone")
    late = b.client(f"{uid}-late")
    late.subscribe("#")  # the retained will is found by a '#' walk too
    assert late.recv_publish().topic == deep
    assert b.alive()


def test_keepalive_counts_packets_not_bytes(broker, uid):
    """Dribbling one byte at a time used to reset keepalive forever."""
    b = broker()
    c = b.client(uid, keepalive=1)
    frame = publish(f"{uid}/t", b"x" * 50)
    start = time.monotonic()
    closed = False
    for byte in frame:
        c.send(bytes([byte]))
        if c.expect_closed(0.4):
            closed = True
            break
    assert closed, "connection kept open by single bytes without a complete packet"
    assert time.monotonic() - start < 3.0


def test_pubrel_resent_in_pubrec_order(broker, uid):
    """MQTT-4.6.0-4: after reconnect, PUBRELs come in the order the PUBRECs were sent."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"1", qos=2)
    pub.publish(f"{uid}/t", b"2", qos=2)
    first, second = sub.expect(PUBLISH), sub.expect(PUBLISH)
    sub.send(pubrec(second.packet_id))
    sub.send(pubrec(first.packet_id))
    live = [sub.expect(PUBREL).packet_id, sub.expect(PUBREL).packet_id]
    assert live == [second.packet_id, first.packet_id]
    sub.close()
    again = b.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    resent = [again.expect(PUBREL).packet_id, again.expect(PUBREL).packet_id]
    assert resent == [second.packet_id, first.packet_id]


def test_will_on_sys_topic_is_dropped(broker, uid):
    b = broker(sys_interval=0)
    watch = b.client(f"{uid}-w")
    watch.subscribe("$SYS/#", f"{uid}/marker")
    forger = b.client(f"{uid}-f", will=("$SYS/broker/version", b"forged", 0, True))
    forger.abort()
    assert b.wait_log(lambda line: "dropped: $SYS topics are written only by the broker" in line)
    b.client(f"{uid}-m").publish(f"{uid}/marker", b"MARKER")
    assert watch.recv_publish().topic == f"{uid}/marker"


def test_qos0_keeps_order_behind_a_backlog(broker, uid):
    """MQTT-4.6.0-6 with queue_qos0_messages: live QoS 0 must not overtake queued QoS 0."""
    b = broker(limits={"queue_qos0_messages": True, "max_inflight_messages": 1})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.close()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"q1-a", qos=1)
    pub.publish(f"{uid}/t", b"q1-b", qos=1)
    pub.publish(f"{uid}/t", b"q0-old", qos=0)
    again = b.client(f"{uid}-s", clean=False)   # window of 1: q1-a in flight, rest queued
    pub.publish(f"{uid}/t", b"q0-new", qos=0)
    pub.publish(f"{uid}/t", b"marker", qos=1)
    got = [again.recv_publish().payload for _ in range(5)]
    assert got.index(b"q0-old") < got.index(b"q0-new"), got


def test_sighup_with_a_non_utf8_config_keeps_running(broker, uid):
    b = broker()
    b.config_path.write_bytes(b"log_level = \"\xff\xfe\"\n")
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda line: "reload failed" in line and "UTF-8" in line)
    c = b.client(uid)
    c.subscribe(f"{uid}/t")
    c.publish(f"{uid}/t", b"still here")
    assert c.recv_publish().payload == b"still here"


def test_non_utf8_config_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe = 1\n")
    result = run_cli("serve", "-c", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "UTF-8" in lines[0]
