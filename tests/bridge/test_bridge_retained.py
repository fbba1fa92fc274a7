"""Retained messages on a topic both sides of a bridge cover (a ``both`` rule): a newer local
retained message that waited for the link is not replaced by the remote's older one, which
the remote sends in answer to the bridge's SUBSCRIBE before the backlog reaches it."""

from __future__ import annotations

import pytest

from .helpers import bridge_table, wait_figure


def retained_here(gw, topic: str) -> bytes:
    """The payload of the retained message a new local subscription to ``topic`` gets."""
    with gw.client("look") as look:
        look.subscribe(topic, qos=1)
        p = look.recv_publish(5)
        assert p.retain, p
        return p.payload


@pytest.mark.parametrize("version,clean", [(4, False), (4, True), (5, True)])
def test_a_newer_local_retained_message_is_kept(broker, mosquitto_broker, paho, version,
                                                clean):
    remote = mosquitto_broker()
    rules = [{"pattern": "cfg/#", "direction": "both", "qos": 1}]
    gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=version,
                                     clean_start=clean)])
    wait_figure(gw, lambda f: f["state"] == "up")
    dev = gw.client("dev")
    dev.publish("cfg/x", b"v1", qos=1, retain=True)
    wait_figure(gw, lambda f: f["forwarded"] == 1)

    # The remote is away while a local device sets a newer value.
    remote.stop()
    wait_figure(gw, lambda f: f["state"] != "up")
    dev.publish("cfg/x", b"v2", qos=1, retain=True)
    local = gw.client("local")
    local.subscribe("cfg/mark", qos=1)

    # Back: the bridge subscribes, the remote answers with its v1, then gets v2. A marker
    # published at the remote after that comes in behind the remote's answer.
    remote.start()
    wait_figure(gw, lambda f: f["state"] == "up" and f["forwarded"] == 2, timeout=20)
    central = paho(remote.port, client_id="central")
    central.publish("cfg/mark", b"m", qos=1)
    assert local.recv_publish(10).topic == "cfg/mark"

    assert retained_here(gw, "cfg/x") == b"v2"
    assert central.subscribe("cfg/x", 1) == [1]
    assert central.get(5).payload == b"v2"
    fig = wait_figure(gw, lambda f: f["received_dropped"] == 1)
    assert gw.stats()["dropped"]["bridge_in"] == 1
    assert gw.wait_log(lambda ln: "bridge up: dropped the remote's retained message for "
                                  "'cfg/x': this broker holds a newer one" in ln, 5), fig


def test_a_retained_message_from_the_remote_is_still_its_own_after_a_crash(
        broker, mosquitto_broker, paho):
    """The snapshot keeps who published a retained message: after a crash (the bridge's
    checkpoint below it), the one that came from the remote is still known as the bridge's
    own, so the remote's newer value, in its answer to the SUBSCRIBE, replaces it (before, it
    was taken for a newer local one and dropped: the gateway kept v1)."""
    import signal
    from conftest import wait_for_snapshot
    remote = mosquitto_broker()
    central = paho(remote.port, client_id="central")
    central.publish("cfg/x", b"v1", qos=1, retain=True)
    rules = [{"pattern": "cfg/#", "direction": "both", "qos": 1}]
    table = bridge_table(remote.port, rules, checkpoint_interval=60)
    gw = broker(bridge=[table])
    data_dir = gw.config["data_dir"]
    wait_figure(gw, lambda f: f["state"] == "up" and f["received"] == 1)
    assert retained_here(gw, "cfg/x") == b"v1"
    with gw.client("dev", clean=False) as dev:      # a change: a snapshot within a second
        dev.subscribe("other", qos=1)
    doc = wait_for_snapshot(data_dir, "dev")
    assert [r["topic"] for r in doc["retained"]] == ["cfg/x"]
    assert gw.stop(signal.SIGKILL) != 0
    central.publish("cfg/x", b"v2", qos=1, retain=True)
    gw = broker(data_dir=data_dir, bridge=[table])
    wait_figure(gw, lambda f: f["state"] == "up")
    local = gw.client("local")
    local.subscribe("cfg/mark", qos=1)
    central.publish("cfg/mark", b"m", qos=1)
    assert local.recv_publish(10).topic == "cfg/mark"   # behind the remote's answer
    assert retained_here(gw, "cfg/x") == b"v2"
    assert gw.stats()["dropped"].get("bridge_in", 0) == 0
