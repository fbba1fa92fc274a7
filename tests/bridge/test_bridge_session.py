"""The remote keeps the bridge's session while the gateway is away (clean_start = false, the
default), on MQTT 3.1.1 and on 5.0 (where a session ends with the link unless CONNECT carries
a Session Expiry Interval): a QoS 1 message published at a real Mosquitto for an `in` rule
while the gateway is stopped arrives once the gateway is started again."""

from __future__ import annotations

import pytest
from core.test_disk_full import _log_payloads

from .helpers import bridge_table, wait_figure

RULES = [{"pattern": "cmd/#", "direction": "in", "qos": 1}]


@pytest.mark.parametrize("version", [4, 5])
def test_messages_published_while_the_gateway_is_away_arrive(broker, mosquitto_broker, paho,
                                                             version):
    remote = mosquitto_broker()
    table = bridge_table(remote.port, RULES, protocol_version=version)
    gw = broker(bridge=[table])
    wait_figure(gw, lambda f: f["state"] == "up")
    # The subscription is made at CONNACK: a message published after its SUBACK is routed.
    central = paho(remote.port, client_id="central")
    central.publish("cmd/before", b"before", qos=1)
    wait_figure(gw, lambda f: f["received"] == 1)
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0

    central.publish("cmd/x", b"while away", qos=1)
    gw = broker(bridge=[table], data_dir=data_dir)
    assert gw.wait_log(lambda ln: "session present: True" in ln, 10)
    wait_figure(gw, lambda f: f["received"] == 1)
    assert gw.stop() == 0
    assert _log_payloads(data_dir) == ["before", "while away"]


@pytest.mark.parametrize("version", [4, 5])
def test_a_retained_message_comes_again_at_a_reconnect_only_on_3_1_1(broker, mosquitto_broker,
                                                                       paho, version):
    """On 5.0 the bridge subscribes with Retain Handling 1: the remote kept the session, so
    its retained message does not come again when the gateway reconnects. A 3.1.1
    subscription has no such option: the remote sends it again (the log holds it twice)."""
    remote = mosquitto_broker()
    central = paho(remote.port, client_id="central")
    central.publish("cmd/r", b"retained", qos=1, retain=True)
    table = bridge_table(remote.port, RULES, protocol_version=version)
    gw = broker(bridge=[table])
    wait_figure(gw, lambda f: f["state"] == "up" and f["received"] == 1)
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0
    gw = broker(bridge=[table], data_dir=data_dir)
    assert gw.wait_log(lambda ln: "session present: True" in ln, 10)
    central.publish("cmd/after", b"after", qos=1)
    again = ["retained"] if version == 4 else []
    wait_figure(gw, lambda f: len(_log_payloads(data_dir)) >= 2 + len(again))
    assert gw.stop() == 0
    # (the retained one again, on 3.1.1, and "after" come in either order)
    payloads = _log_payloads(data_dir)
    assert payloads[0] == "retained" and sorted(payloads[1:]) == sorted(again + ["after"])
