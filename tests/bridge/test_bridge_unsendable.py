"""A local message an out rule matches whose remote topic is no valid MQTT topic name (a valid
local topic of 65,530 bytes under ``remote_prefix = "site17/"``: 65,537 bytes): skipped as it
is read, counted (``unsendable``, drop reason ``bridge_unsendable``) and logged once per
episode; the broker stays up and the cursor goes on past it (docs/bridge.md, "Unsendable
messages"). Against a real Mosquitto."""

from __future__ import annotations

from conftest import run_cli

from .helpers import Received, bridge_table, checkpoint, scrape_when, wait_figure

RULES = [{"pattern": "sensors/#", "direction": "out", "qos": 1, "remote_prefix": "site17/"}]
LONG = "sensors/" + "x" * (65_530 - len("sensors/"))


def test_a_remote_topic_over_65535_bytes_is_skipped_counted_and_logged(
        broker, mosquitto_broker, paho):
    remote = mosquitto_broker()
    sub = paho(remote.port, client_id="central")
    assert sub.subscribe("site17/#", 1) == [1]
    got = Received(sub)
    gw = broker(metrics={"listen": "127.0.0.1:0"},
                bridge=[bridge_table(remote.port, RULES, checkpoint_interval=0.05)])
    wait_figure(gw, lambda f: f["state"] == "up")
    pub = gw.client("pub")
    mark = gw.mark()
    pub.publish(LONG, b"long", qos=1)                   # offset 0
    for i in range(1, 4):
        pub.publish("sensors/ok", str(i).encode(), qos=1)   # offsets 1 to 3
    fig = wait_figure(gw, lambda f: f["cursor"] == 4 and f["checkpoint_cursor"] == 4)
    assert (fig["forwarded"], fig["unsendable"], fig["refused"], fig["inflight"]) == \
        (3, 1, 0, 0), fig
    assert got.wait_distinct(3, 10) and sorted(got.seen) == [1, 2, 3]
    assert gw.alive()
    line = gw.wait_log(lambda ln: "cannot be forwarded" in ln, 5, mark)
    assert "bridge up: the message at offset 0 for 'sensors/xxx" in line, line
    assert "(65530 bytes) cannot be forwarded: its remote topic 'site17/sensors/xxx" in line
    assert "(65537 bytes) is no valid MQTT topic name (topic name is 65537 bytes" in line
    assert "counted as unsendable (bridge_unsendable)" in line and len(line) < 1000, line
    # Two more in a row: counted, not logged again.
    pub.publish(LONG, b"long", qos=1)
    pub.publish(LONG + "y", b"long", qos=1)
    pub.publish("sensors/ok", b"4", qos=1)
    fig = wait_figure(gw, lambda f: f["cursor"] == 7 and f["checkpoint_cursor"] == 7)
    assert (fig["forwarded"], fig["unsendable"]) == (4, 3), fig
    assert got.wait_distinct(4, 10)
    assert len([ln for ln in gw.logs if "cannot be forwarded" in ln]) == 1
    assert not [ln for ln in gw.logs if "internal error" in ln or "Traceback" in ln]
    # Counted everywhere: the drop reason, Prometheus, inspect bridges.
    assert gw.stats()["dropped"]["bridge_unsendable"] == 3
    samples = scrape_when(gw, "edgebroker_bridge_unsendable_total", "up", 3)
    assert samples["edgebroker_messages_dropped_total", "bridge_unsendable"] == 3
    out = run_cli("inspect", "bridges", "--data-dir", gw.config["data_dir"])
    assert "up: 3 messages skipped, their remote topic no valid MQTT topic name" in out.stdout
    # The checkpoint is past them: a restart holds nothing back either.
    data_dir = gw.config["data_dir"]
    gw.stop()
    assert checkpoint(data_dir)["cursor"] == 7
