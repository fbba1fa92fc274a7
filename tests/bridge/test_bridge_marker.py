"""The bridge marker (``try_private``, Mosquitto's): over MQTT 3.1.1 the bridge's CONNECT has
protocol level 0x84, so a Mosquitto (or edgebroker) remote sends it back nothing it published
and keeps the retain flag as published; a remote that refuses the marker (CONNACK 0x01) is
connected to again as a plain 3.1.1 client (docs/bridge.md, "Loops")."""

from __future__ import annotations

import mqttraw
import pytest
from mqttraw import PUBLISH

from .helpers import FakeRemote, bridge_table, wait_figure

BOTH = [{"pattern": "t/#", "direction": "both", "qos": 1}]


def remote_client(remote, client_id: str, *filters: str) -> mqttraw.RawClient:
    c = mqttraw.RawClient(remote.host, remote.port)
    assert c.connect(client_id).rc == 0
    if filters:
        c.subscribe(*filters, qos=1)
    return c


def payloads_until(c, last: bytes, timeout: float = 10.0) -> list[bytes]:
    """The payloads ``c`` gets up to ``last`` (bounded: a loop fails it at once)."""
    got: list[bytes] = []
    while not got or got[-1] != last:
        assert len(got) < 10, f"a message goes round: {got}"
        got.append(c.recv_publish(timeout).payload)
    return got


def test_two_bridges_to_two_mosquittos_with_both_rules_do_not_loop(broker, mosquitto_broker):
    """Two 3.1.1 bridges on one gateway to two remotes, each ``both`` on the same topics:
    without the marker each remote echoes what its bridge sent it, the other bridge forwards
    the echo, and one message went round for ever (thousands of copies a second)."""
    r1, r2 = mosquitto_broker(), mosquitto_broker()
    gw = broker(bridge=[{**bridge_table(r1.port, BOTH), "name": "a"},
                        {**bridge_table(r2.port, BOTH), "name": "b"}])
    for name in ("a", "b"):
        wait_figure(gw, lambda f: f["state"] == "up" and f["inflight"] == 0, name=name)
    local = gw.client("local-sub")
    local.subscribe("t/#", qos=1)
    at_r1 = remote_client(r1, "r1-sub", "t/#")
    at_r2 = remote_client(r2, "r2-sub", "t/#")

    pub = gw.client("pub")
    pub.publish("t/x", b"one", qos=1)
    for sub in (local, at_r1, at_r2):
        assert payloads_until(sub, b"one") == [b"one"]
    for name in ("a", "b"):
        wait_figure(gw, lambda f: f["forwarded"] == 1 and f["inflight"] == 0, name=name)
    # Anything that went round would come before the next message on every path.
    pub.publish("t/x", b"end", qos=1)
    for sub in (local, at_r1, at_r2):
        assert payloads_until(sub, b"end") == [b"end"]
    for name in ("a", "b"):
        fig = wait_figure(gw, lambda f: f["forwarded"] == 2 and f["inflight"] == 0
                          and f["lag_messages"] == 0, name=name)
        assert fig["received"] == 0 and fig["not_sent_back"] == 0, fig
    assert "New bridge connected" in r1.out.text(), r1.out.text()   # taken for a bridge


@pytest.mark.parametrize("kind", ["mosquitto", "edgebroker"])
def test_live_retained_messages_from_the_remote_keep_the_local_retained_state(
        broker, request, kind):
    """With the marker a Mosquitto or edgebroker remote keeps the retain flag on live
    messages: the gateway's retained message follows the remote's, its clears too (plain
    3.1.1: retain 0 on live messages, so neither reached the retained store)."""
    remote = request.getfixturevalue("mosquitto_broker")() if kind == "mosquitto" else broker()
    rules = [{"pattern": "cfg/#", "direction": "in", "qos": 1}]
    gw = broker(bridge=[bridge_table(remote.port, rules)])
    wait_figure(gw, lambda f: f["state"] == "up" and f["inflight"] == 0)
    watcher = gw.client("watcher")
    watcher.subscribe("cfg/#", qos=1)
    pub = remote_client(remote, "remote-pub")

    pub.publish("cfg/a", b"v1", qos=1, retain=True)
    assert payloads_until(watcher, b"v1") == [b"v1"]
    late = gw.client("late")
    late.subscribe("cfg/#", qos=1)
    p = late.expect(PUBLISH)
    assert (p.topic, p.payload, p.retain) == ("cfg/a", b"v1", True)
    late.ack(p)

    pub.publish("cfg/a", b"", qos=1, retain=True)     # the remote clears it
    assert payloads_until(watcher, b"") == [b""]
    later = gw.client("later")
    later.subscribe("cfg/#", qos=1)
    gw.client("local-pub").publish("cfg/mark", b"mark", qos=1)
    assert later.recv_publish().payload == b"mark"     # no retained message before it


def test_a_remote_that_refuses_the_marker_is_connected_to_without_it(broker):
    remote = FakeRemote()
    try:
        rules = [{"pattern": "t/#", "direction": "in", "qos": 1}]
        gw = broker(bridge=[bridge_table(remote.port, rules)])
        first = remote.accept(rc=1)
        assert first.level == 0x84
        assert first.expect_closed(10)
        end = remote.accept()
        assert end.level == 4
        gw.wait_log(lambda ln: "refused the bridge marker" in ln)
        wait_figure(gw, lambda f: f["state"] == "up")
        # The rest of the run: a reconnect connects without the marker at once.
        end.close()
        again = remote.accept()
        assert again.level == 4
        wait_figure(gw, lambda f: f["state"] == "up" and f["connects"] == 2)
        log = gw.log_text()
        assert log.count("refused the bridge marker") == 1
        assert "cannot connect" not in log
    finally:
        remote.close()


def test_try_private_false_connects_without_the_marker(broker):
    remote = FakeRemote()
    try:
        rules = [{"pattern": "t/#", "direction": "in", "qos": 1}]
        gw = broker(bridge=[bridge_table(remote.port, rules, try_private=False)])
        assert remote.accept().level == 4
        wait_figure(gw, lambda f: f["state"] == "up")
    finally:
        remote.close()
