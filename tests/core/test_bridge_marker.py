"""The bridge marker (Mosquitto's ``try_private``): a CONNECT with 0x80 on its 3.1/3.1.1
protocol level is a bridge; its subscriptions get No Local and Retain As Published, as
Mosquitto gives a bridge (docs/protocol.md)."""

from mqttraw import PUBLISH


def publishes_until(c, payload: bytes, timeout: float = 5.0) -> list:
    """The PUBLISHes ``c`` gets up to the one with ``payload`` (acknowledged)."""
    got = []
    while not got or got[-1].payload != payload:
        assert len(got) < 20, got
        got.append(c.recv_publish(timeout))
    return got


def test_bridge_marker_gets_no_local_and_retain_as_published(srv, uid):
    bridge = srv.client(f"{uid}-br", level=0x84)
    assert bridge.subscribe(f"{uid}/#", qos=1).codes == [1]
    plain = srv.client(f"{uid}-plain")
    plain.subscribe(f"{uid}/#", qos=1)
    other = srv.client(f"{uid}-pub")

    bridge.publish(f"{uid}/own", b"mine", qos=1)
    other.publish(f"{uid}/r1", b"kept1", qos=1, retain=True)
    other.publish(f"{uid}/r0", b"kept0", qos=0, retain=True)
    other.publish(f"{uid}/end", b"end", qos=1)

    at_bridge = publishes_until(bridge, b"end")
    # No Local: its own message does not come back; the retained ones keep their flag.
    assert [(p.payload, p.retain) for p in at_bridge] == [
        (b"kept1", True), (b"kept0", True), (b"end", False)]
    assert [p.qos for p in at_bridge] == [1, 0, 1]
    # A plain 3.1.1 subscriber: everything, live messages with retain 0 (MQTT-3.3.1-9).
    at_plain = publishes_until(plain, b"end")
    assert [(p.payload, p.retain) for p in at_plain] == [
        (b"mine", False), (b"kept1", False), (b"kept0", False), (b"end", False)]
    # The retained messages sent for a SUBSCRIBE have the flag, as for any client.
    bridge.subscribe(f"{uid}/r1", qos=1)
    again = bridge.expect(PUBLISH)
    assert (again.payload, again.retain) == (b"kept1", True)
    bridge.ack(again)
    for topic in ("r1", "r0"):
        other.publish(f"{uid}/{topic}", b"", qos=1, retain=True)


def test_bridge_marker_on_mqtt_31(srv, uid):
    bridge = srv.client(f"{uid}-br", proto_name=b"MQIsdp", level=0x83)
    bridge.subscribe(f"{uid}/#", qos=0)
    bridge.publish(f"{uid}/own", b"mine", qos=1)
    srv.client(f"{uid}-pub").publish(f"{uid}/end", b"end", qos=1)
    assert [p.payload for p in publishes_until(bridge, b"end")] == [b"end"]


def test_marker_on_other_levels_refused(srv, uid):
    for name, level in ((b"MQTT", 0x85), (b"MQTT", 0x83), (b"MQIsdp", 0x84)):
        c = srv.raw()
        ack = c.connect(f"{uid}-x", proto_name=name, level=level)
        assert ack.rc == 1, (name, level)
        assert c.expect_closed(5)
    log = srv.log_text()
    assert "level 0x85 (supported: level 4 or 5)" in log
