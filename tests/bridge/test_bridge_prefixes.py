"""Topic rules with prefixes match as the filters ``local_prefix + pattern`` and
``remote_prefix + pattern`` do (MQTT 4.7): only a topic whose *first* character is ``$`` is
kept from a leading wildcard, so ``a/$x``, ``a/`` and ``a`` (the parent level of ``a/#``)
go out and come in like any other topic (docs/bridge.md, "Topic rules"). Against a real
Mosquitto."""

from __future__ import annotations

import time

from .helpers import bridge_table, wait_figure

RULES = [{"pattern": "#", "direction": "both", "qos": 1, "local_prefix": "a/",
          "remote_prefix": "b/"}]


def _topics(client, n: int, timeout: float = 10.0) -> dict:
    """topic -> payload of the next ``n`` messages a paho client gets (bounded)."""
    got = {}
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        try:
            msg = client.messages.get(timeout=0.2)
        except Exception:   # queue.Empty
            continue
        got[msg.topic] = msg.payload
    return got


def test_a_level_starting_with_dollar_and_empty_levels_go_both_ways(
        broker, mosquitto_broker, paho):
    remote = mosquitto_broker()
    central = paho(remote.port, client_id="central")
    assert central.subscribe("b/#", 1) == [1]
    gw = broker(bridge=[bridge_table(remote.port, RULES, protocol_version=5)])
    wait_figure(gw, lambda f: f["state"] == "up")
    local = paho(gw.port, client_id="local")
    assert local.subscribe("a/#", 1) == [1]
    pub = gw.client("pub")
    for topic in ("a/x", "a/$x", "a/", "a", "a/y", "c/x"):
        pub.publish(topic, topic.encode(), qos=1)
    assert _topics(central, 5) == {"b/x": b"a/x", "b/$x": b"a/$x", "b/": b"a/", "b": b"a",
                                   "b/y": b"a/y"}
    fig = wait_figure(gw, lambda f: f["cursor"] == 6)
    assert (fig["forwarded"], fig["unsendable"], fig["refused"]) == (5, 0, 0), fig
    assert len(_topics(local, 5)) == 5          # (the local subscriber's own copies)
    # Inbound: the remote's b/$in and b come here as a/$in and a.
    rpub = paho(remote.port, client_id="rpub")
    for topic in ("b/$in", "b"):
        rpub.publish(topic, b"in " + topic.encode(), qos=1)
    assert _topics(local, 2) == {"a/$in": b"in b/$in", "a": b"in b"}
    fig = wait_figure(gw, lambda f: f["received"] == 2)
    assert fig["received_dropped"] == 0, fig
    assert not [ln for ln in gw.logs if "dropped" in ln or "Traceback" in ln]
