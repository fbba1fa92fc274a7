"""MQTT 5.0 message properties across a bridge to a real Mosquitto: those of the remote's
messages reach the gateway's 5.0 subscribers unaltered, their Message Expiry Interval
counted down (an expired retained message is not served, also after a restart); a local
message whose expiry passed while the remote was down is not forwarded (counted), one still
alive goes with its properties and what is left of its expiry; a remote message whose
Payload Format Indicator says UTF-8 and whose payload is not is dropped, as a local
client's PUBLISH is refused."""

from __future__ import annotations

import signal
import time

import pytest

import mqttraw5 as R

from .helpers import bridge_table, wait_figure

PROPS = {R.USER_PROPERTY: [("k", "v1"), ("k", "v2")], R.CONTENT_TYPE: "text/x-test",
         R.RESPONSE_TOPIC: "resp/here", R.CORRELATION_DATA: b"\x00corr\xff",
         R.PAYLOAD_FORMAT: 1}
IN_RULE = [{"pattern": "i/#", "direction": "in", "qos": 1, "remote_prefix": "C/",
            "local_prefix": "L/"}]


def client5(host: str, port: int, client_id: str) -> R.RawClient5:
    c = R.RawClient5(host, port)
    ack = c.connect(client_id)
    assert ack.reason == 0, ack
    return c


def retained5(gw, *topics: str) -> list:
    """The retained messages a new 5.0 subscriber on the gateway gets for ``topics``, one
    subscription after the other: (topic, payload, properties) of each, in that order. The
    last topic must hold one (it ends the wait: one before it would have come first)."""
    c = client5(gw.host, gw.port, "look")
    try:
        for topic in topics:
            assert c.subscribe(topic, qos=1).codes == [1]
        got = []
        while True:
            p = c.recv_publish(5)
            assert p.retain, p
            got.append((p.topic, p.payload, p.properties))
            if p.topic == topics[-1]:
                return got
    finally:
        c.close()


def test_remote_properties_reach_a_local_5_0_subscriber(broker, mosquitto_broker):
    remote = mosquitto_broker()
    central = client5("127.0.0.1", remote.port, "central")
    central.publish("C/i/ret", b"retained", qos=1, retain=True, props=PROPS)
    gw = broker(bridge=[bridge_table(remote.port, IN_RULE, protocol_version=5)])
    # The remote's answer to the bridge's SUBSCRIBE: its subscription is in place.
    wait_figure(gw, lambda f: f["state"] == "up" and f["received"] == 1)
    [(topic, payload, props)] = retained5(gw, "L/i/ret")
    assert (topic, payload) == ("L/i/ret", b"retained")
    assert props == PROPS

    live = client5(gw.host, gw.port, "live")
    assert live.subscribe("L/i/#", qos=1).codes == [1]
    live.recv_publish(5)    # the retained one
    central.publish("C/i/live", b"live", qos=1, props=PROPS)
    p = live.recv_publish(5)
    assert (p.topic, p.payload, p.retain, p.properties) == ("L/i/live", b"live", False, PROPS)
    live.close()
    central.close()


def test_remote_message_expiry_is_counted_down_here(broker, mosquitto_broker):
    """A retained message with a Message Expiry Interval from the remote: served with what
    is left of it, and no more once it passed, also after a restart (the log keeps it)."""
    expiry = 5
    remote = mosquitto_broker()
    central = client5("127.0.0.1", remote.port, "central")
    central.publish("C/i/keep", b"keep", qos=1, retain=True)
    published = time.monotonic()
    central.publish("C/i/exp", b"expiring", qos=1, retain=True,
                    props={R.MESSAGE_EXPIRY: expiry, R.USER_PROPERTY: [("k", "x")]})
    central.close()
    table = bridge_table(remote.port, IN_RULE, protocol_version=5)
    gw = broker(bridge=[table])
    wait_figure(gw, lambda f: f["state"] == "up" and f["received"] == 2)
    got = retained5(gw, "L/i/exp", "L/i/keep")
    assert [(t, p) for t, p, _ in got] == [("L/i/exp", b"expiring"), ("L/i/keep", b"keep")]
    props = got[0][2]
    assert props[R.USER_PROPERTY] == [("k", "x")]
    assert 1 <= props[R.MESSAGE_EXPIRY] <= expiry, props
    assert R.MESSAGE_EXPIRY not in got[1][2]

    # A restart before it expires: the retained store is read back from the log.
    assert gw.stop(signal.SIGTERM) == 0
    gw = broker(data_dir=gw.config["data_dir"], bridge=[table])
    wait_figure(gw, lambda f: f["state"] == "up")
    left = published + expiry + 0.5 - time.monotonic()
    assert left > 0, "the restart took longer than the expiry: nothing to check"
    time.sleep(left)    # (the expiry itself is what is waited for)
    assert [t for t, _, _ in retained5(gw, "L/i/exp", "L/i/keep")] == ["L/i/keep"]


@pytest.mark.parametrize("version", [4, 5])
def test_a_local_message_expired_while_the_remote_was_down_is_not_forwarded(
        broker, mosquitto_broker, version):
    remote = mosquitto_broker()
    remote.stop()
    rules = [{"pattern": "o/#", "direction": "out", "qos": 1, "remote_prefix": "R/"}]
    gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=version)])
    dev = client5(gw.host, gw.port, "dev")
    published = time.monotonic()
    dev.publish("o/cmd", b"expires-in-1s", qos=1, retain=True, props={R.MESSAGE_EXPIRY: 1})
    dev.publish("o/alive", b"alive", qos=1, retain=True,
                props={R.MESSAGE_EXPIRY: 600, **PROPS})
    dev.close()
    left = published + 1.5 - time.monotonic()
    if left > 0:
        time.sleep(left)    # (the expiry itself is what is waited for)
    mark = gw.mark()
    remote.start()
    wait_figure(gw, lambda f: f["forwarded"] >= 1 and f["lag_messages"] == 0, timeout=20)

    central = client5("127.0.0.1", remote.port, "central")
    for topic in ("R/o/cmd", "R/o/alive"):
        assert central.subscribe(topic, qos=1).codes == [1]
    p = central.recv_publish(5)     # R/o/cmd would have come first
    assert (p.topic, p.payload, p.retain) == ("R/o/alive", b"alive", True)
    if version == 5:    # its properties, and what is left of its expiry
        expiry = p.properties.pop(R.MESSAGE_EXPIRY)
        assert 590 <= expiry <= 600
        assert p.properties == PROPS
    else:
        assert p.properties == {}

    fig = wait_figure(gw, lambda f: f["forwarded"] == 1)
    assert (fig["expired"], fig["refused"], fig["unsendable"]) == (1, 0, 0), fig
    assert gw.stats()["dropped"]["message_expired"] == 1
    assert gw.wait_log(lambda ln: "bridge up: the message at offset 0 for 'R/o/cmd' expired "
                                  "(its Message Expiry Interval) before it could be "
                                  "forwarded" in ln, 5, mark)
    central.close()


def test_the_expiry_forwarded_is_never_more_than_published():
    """A record's Message Expiry Interval counts down from when it was logged (on the
    broker's clock: Journal.logged_ago); what is left is never more than the publisher set,
    whatever the clocks did since."""
    from edgebroker.bridge.outbound import carried, remaining
    stored = (R.prop(R.MESSAGE_EXPIRY, 60) + R.prop(R.CONTENT_TYPE, "text/plain"))
    props, expires = carried(stored, 1_000_000)
    assert expires == 1_060_000 and props[R.CONTENT_TYPE] == "text/plain"
    assert remaining(props, expires, 1_010_000)[R.MESSAGE_EXPIRY] == 50
    assert remaining(props, expires, 1_059_999)[R.MESSAGE_EXPIRY] == 1
    assert remaining(props, expires, 400_000)[R.MESSAGE_EXPIRY] == 60
    assert carried(R.prop(R.CONTENT_TYPE, "x"), 5)[1] == 0                # none: never expires


def test_a_remote_message_whose_payload_is_not_the_utf_8_it_says_is_dropped(
        broker, mosquitto_broker, tmp_path):
    """Payload Format Indicator 1 with a payload that is not UTF-8: a local client's PUBLISH
    is refused (0x99); one from the remote is dropped the same way, acknowledged to it
    (after a restart of the gateway the remote does not send it again), counted and logged
    once. Mosquitto passes it on unchecked."""
    remote = mosquitto_broker()
    central = client5("127.0.0.1", remote.port, "central")
    bridge = [bridge_table(remote.port, IN_RULE, protocol_version=5)]
    gw = broker(data_dir=str(tmp_path / "gw"), bridge=bridge)
    wait_figure(gw, lambda f: f["state"] == "up")
    local = client5(gw.host, gw.port, "local")
    assert local.subscribe("L/i/#", qos=1).codes == [1]
    bad = {R.PAYLOAD_FORMAT: 1}
    mark = gw.mark()
    central.publish("C/i/bad", b"\xff\xfe not utf-8", qos=1, props=bad)
    central.publish("C/i/bad", b"\xc3 not utf-8 either", qos=1, props=bad)
    central.publish("C/i/good", "caf\u00e9".encode(), qos=1, props=bad)
    p = local.recv_publish(5)       # the bad ones would have come first
    assert (p.topic, p.payload, p.properties) == ("L/i/good", "caf\u00e9".encode(), bad)
    fig = wait_figure(gw, lambda f: f["received"] == 1)
    assert fig["received_dropped"] == 2
    dropped = gw.stats()["dropped"]
    assert (dropped["bridge_in"], dropped["payload_format"]) == (2, 0)
    lines = [ln for ln in gw.logs[mark:] if "(Payload Format Indicator 1)" in ln]
    assert len(lines) == 1 and "'L/i/bad'" in lines[0] and "at byte 0" in lines[0], lines
    local.close()

    # Acknowledged: the remote keeps the bridge's session, and sends nothing of it again.
    assert gw.stop() == 0
    gw = broker(data_dir=str(tmp_path / "gw"), bridge=bridge)
    wait_figure(gw, lambda f: f["state"] == "up")
    central.publish("C/i/good", b"again", qos=1)
    fig = wait_figure(gw, lambda f: f["received"] == 1)
    assert fig["received_dropped"] == 0
    central.close()
