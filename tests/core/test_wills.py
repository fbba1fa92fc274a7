"""Will messages (3.1.2.5): published when the connection ends without DISCONNECT."""

import time

import pytest

import mqttraw as m


def watcher(srv, uid, qos=2):
    w = srv.client(f"{uid}-w")
    w.subscribe(f"{uid}/will", f"{uid}/marker", qos=qos)
    return w


def expect_will(w, uid, payload=b"gone", timeout=5.0):
    p = w.recv_publish(timeout=timeout)
    assert (p.topic, p.payload) == (f"{uid}/will", payload), f"expected the will, got {p!r}"
    return p


def expect_no_will(srv, w, uid):
    pub = srv.client(f"{uid}-marker")
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    p = w.recv_publish()
    assert p.topic == f"{uid}/marker", f"will published when it must not be: {p!r}"


def test_will_on_socket_close_without_disconnect(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.close()
    expect_will(w, uid)


def test_will_on_connection_reset(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.abort()
    expect_will(w, uid)


def test_no_will_after_disconnect(srv, uid):
    """[MQTT-3.1.2-10]: DISCONNECT deletes the will."""
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.send(m.disconnect())
    assert c.expect_closed(5)
    expect_no_will(srv, w, uid)


def test_will_on_keepalive_expiry(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", keepalive=1, will=(f"{uid}/will", b"gone", 1))
    t0 = time.monotonic()
    expect_will(w, uid, timeout=4.0)
    assert time.monotonic() - t0 >= 1.2
    assert c.expect_closed(2)


def test_will_on_protocol_violation(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.send(m.publish(f"{uid}/x", b"", flags=0b0110, packet_id=1))  # QoS 3
    assert c.expect_closed(5)
    expect_will(w, uid)


def test_will_on_malformed_disconnect(srv, uid):
    """A DISCONNECT with reserved flags set is a protocol violation, not a clean disconnect."""
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.send(m.disconnect(flags=1))
    assert c.expect_closed(5)
    expect_will(w, uid)


def test_will_on_second_connect(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.send(m.connect(f"{uid}-c"))
    assert c.expect_closed(5)
    expect_will(w, uid)


def test_will_on_takeover(srv, uid):
    """Client-id takeover closes the older connection; it did not DISCONNECT, so its will goes out."""
    w = watcher(srv, uid)
    old = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    new = srv.client(f"{uid}-c")
    assert old.expect_closed(5)
    expect_will(w, uid)
    assert new.ping() == []


@pytest.mark.parametrize("will_qos,sub_qos", [(0, 2), (1, 2), (2, 2), (2, 1), (2, 0)])
def test_will_qos_honoured(srv, uid, will_qos, sub_qos):
    w = watcher(srv, uid, qos=sub_qos)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", will_qos))
    c.close()
    p = expect_will(w, uid)
    assert p.qos == min(will_qos, sub_qos)


def test_will_retain(srv, uid):
    """[MQTT-3.1.2-17]: will retain 1 -> published as a retained message."""
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1, True))
    c.close()
    assert expect_will(w, uid).retain is False  # live delivery
    late = srv.client(f"{uid}-late")
    late.subscribe(f"{uid}/will", qos=1)
    p = late.recv_publish()
    assert (p.payload, p.retain, p.qos) == (b"gone", True, 1)


def test_will_without_retain_not_stored(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1, False))
    c.close()
    expect_will(w, uid)
    late = srv.client(f"{uid}-late")
    late.subscribe(f"{uid}/will", f"{uid}/marker", qos=1)
    pub = srv.client(f"{uid}-p")
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    assert late.recv_publish().topic == f"{uid}/marker"


def test_will_mqtt31(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-31"[:23], proto_name=b"MQIsdp", level=3, will=(f"{uid}/will", b"gone", 1))
    c.close()
    expect_will(w, uid)


@pytest.mark.parametrize("payload", [b"", b"\x00\x01\xff" * 100], ids=["empty", "binary"])
def test_will_payloads(srv, uid, payload):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", payload, 0))
    c.close()
    expect_will(w, uid, payload=payload)


def test_will_of_persistent_session(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", clean=False, will=(f"{uid}/will", b"gone", 1))
    c.close()
    expect_will(w, uid)
    again = srv.client(f"{uid}-c", clean=True)  # tidy: drop the stored session
    again.disconnect()


def test_no_will_when_connect_refused(srv, uid):
    w = watcher(srv, uid)
    c = srv.raw()
    c.send(m.connect(f"{uid}-c", level=7, will=(f"{uid}/will", b"gone", 1)))
    assert c.expect_closed(5)
    expect_no_will(srv, w, uid)


def test_will_published_once(srv, uid):
    w = watcher(srv, uid)
    c = srv.client(f"{uid}-c", will=(f"{uid}/will", b"gone", 1))
    c.send(m.publish(f"{uid}/x", b"", flags=0b0110, packet_id=1))
    c.close()
    expect_will(w, uid)
    expect_no_will(srv, w, uid)


def test_will_on_a_very_deep_topic_is_delivered_and_broker_survives(broker, uid):
    """A 3000-level will topic once overflowed the recursive trie walk and killed the broker
    (max_topic_levels raised to let it through: a will topic is held to it)."""
    b = broker(limits={"max_topic_levels": 4000})
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


def test_will_on_sys_topic_is_dropped(broker, uid):
    b = broker(sys_interval=0)
    watch = b.client(f"{uid}-w")
    watch.subscribe("$SYS/#", f"{uid}/marker")
    forger = b.client(f"{uid}-f", will=("$SYS/broker/version", b"forged", 0, True))
    forger.abort()
    assert b.wait_log(lambda line: "dropped: $SYS topics are written only by the broker" in line)
    b.client(f"{uid}-m").publish(f"{uid}/marker", b"MARKER")
    assert watch.recv_publish().topic == f"{uid}/marker"
