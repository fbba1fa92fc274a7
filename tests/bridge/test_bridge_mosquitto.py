"""A bridge to a real Mosquitto: nothing lost across a remote outage and a gateway SIGKILL,
duplicates only within the documented window; inbound rules and prefixes; a gap when
retention_bytes deletes what the bridge had not forwarded."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from conftest import run_cli

from .helpers import (
    Received, bridge_table, checkpoint, figures, publish_range, wait_figure,
)

# The remote is stopped this long while messages are published on the gateway (the issue's
# 30 s: about sixty failed reconnects with the test's 0.5 s back-off cap).
OUTAGE_SECONDS = 30.0
TOTAL = 100_000
WINDOW = 100
CHECKPOINT = 0.01     # s: the bridge's checkpoint_interval in the crash test
# How far the checkpoint on disk may be behind the cursor in memory when the gateway is
# killed: the writer thread's fsyncs lag under load (seen 1,700 messages behind on a loaded
# machine); this is more than a second of the capped drain (about 17,000 msg/s).
CHECKPOINT_LAG = 20_000
# Messages for the remote's subscribers are not limited in number while they are away.
REMOTE = ["max_queued_messages 0"]
# The crash test's bridge sends at most this many bytes (topic + payload) per second, about
# 17,000 of its messages: the SIGKILL then surely falls in the middle of the drain.
BANDWIDTH = 300_000


def test_outage_and_sigkill_lose_nothing(broker, mosquitto_broker, paho):
    remote = mosquitto_broker(extra=REMOTE)
    sub = paho(remote.port, client_id="central", clean_session=False)
    sub.c.reconnect_delay_set(min_delay=0.05, max_delay=0.5)
    assert sub.subscribe("gw1/sensors/#", 1) == [1]
    got = Received(sub)
    rules = [{"pattern": "sensors/#", "direction": "out", "qos": 1, "remote_prefix": "gw1/"}]
    gw = broker(bridge=[bridge_table(remote.port, rules, window=WINDOW,
                                     checkpoint_interval=CHECKPOINT, bandwidth=BANDWIDTH)])
    data_dir = gw.config["data_dir"]
    pub = gw.client("pub")

    # 1. The link is up: the first quarter goes through live.
    publish_range(pub, "sensors/t", 0, 25_000)
    assert got.wait_distinct(25_000, 60), f"{len(got.seen)} of 25000 arrived"

    # 2. The remote is down: the next quarter waits in the gateway's log.
    remote.stop()
    down = time.monotonic()
    publish_range(pub, "sensors/t", 25_000, 50_000)
    fig = wait_figure(gw, lambda f: f["state"] != "up" and f["lag_messages"] >= 25_000)
    while time.monotonic() - down < OUTAGE_SECONDS:
        fig = figures(gw)
        assert fig["state"] != "up"
        time.sleep(0.1)
    assert got.drain() == 25_000

    # 3. The remote is back; a third quarter; the gateway is SIGKILLed in the middle of the
    # drain, then started again on its data directory. Just before the kill the remote is
    # frozen (SIGSTOP), so the cursor in memory read then moves by at most the window (the
    # PUBACKs already on their way) before the kill, whatever the machine's load.
    remote.start()
    publish_range(pub, "sensors/t", 50_000, 75_000)
    wait_figure(gw, lambda f: f["cursor"] >= 55_000, timeout=30)
    remote.proc.send_signal(signal.SIGSTOP)
    try:
        before_kill = figures(gw)
        in_memory = before_kill["cursor"]
        gw.stop(signal.SIGKILL)
        saved = checkpoint(data_dir)
        cursor = saved["cursor"]
        assert 25_000 <= before_kill["checkpoint_cursor"] <= cursor <= in_memory < 75_000, (
            saved, before_kill)
        # The checkpoint writer (fsync on its own thread) is behind, but not far.
        assert in_memory - cursor <= CHECKPOINT_LAG, (saved, in_memory)
        gw = broker(data_dir=data_dir, bridge=[bridge_table(remote.port, rules, window=WINDOW,
                                                            checkpoint_interval=CHECKPOINT,
                                                            bandwidth=BANDWIDTH)])
        assert gw.wait_log(lambda ln: f"from log offset {cursor} " in ln, 5)
    finally:
        remote.proc.send_signal(signal.SIGCONT)

    # 4. The last quarter on the restarted gateway.
    pub = gw.client("pub")
    publish_range(pub, "sensors/t", 75_000, TOTAL)
    assert got.wait_distinct(TOTAL, 120), (f"{TOTAL - len(got.seen)} messages never arrived, "
                                           f"e.g. {sorted(set(range(TOTAL)) - got.seen)[:10]}")
    fig = wait_figure(gw, lambda f: f["lag_messages"] == 0 and f["inflight"] == 0)
    got.drain()
    assert got.seen == set(range(TOTAL))

    # Duplicates only within the documented bounds: what was in flight when the remote went
    # (before the checkpoint's cursor, one window at most), and after the crash what was sent
    # from the checkpoint on disk on: at most what was acknowledged since it (up to the cursor
    # in memory at the kill, which the frozen remote let move by one window at most) and one
    # window in flight.
    dups = got.duplicates()
    before = [d for d in dups if d < cursor]
    after = [d for d in dups if d >= cursor]
    assert len(before) <= WINDOW and (not before or before[-1] - before[0] < WINDOW), before
    assert all(d < in_memory + 2 * WINDOW for d in after), (cursor, in_memory, after[-5:])
    assert fig["forwarded"] >= TOTAL - cursor and fig["gaps"] == 0
    # Resent counts at least those the checkpoint knew were sent (every record here matches
    # the rule); those sent after the last checkpoint cannot be known after a crash.
    assert fig["resent"] >= saved["sent"] - cursor


def test_inbound_rules_and_prefixes(broker, mosquitto_broker, paho):
    remote = mosquitto_broker()
    rules = [{"pattern": "cmd/#", "direction": "in", "qos": 1, "remote_prefix": "site17/",
              "local_prefix": "from-central/"},
             {"pattern": "sys/#", "direction": "in", "remote_prefix": "site17/",
              "local_prefix": "$SYS/"},
             {"pattern": "+/temp", "direction": "out", "qos": 1, "local_prefix": "dev/",
              "remote_prefix": "site17/up/"}]
    gw = broker(bridge=[bridge_table(remote.port, rules)])
    wait_figure(gw, lambda f: f["state"] == "up")
    local = gw.client("local-sub")
    local.subscribe("#", qos=1)
    central = paho(remote.port, client_id="central")
    assert central.subscribe("site17/#", 1) == [1]

    # Out: dev/<x>/temp -> site17/up/<x>/temp; other local topics stay here.
    pub = gw.client("dev")
    pub.publish("dev/k1/temp", b"21.5", qos=1)
    pub.publish("dev/k1/humidity", b"40", qos=1)
    pub.publish("other/k1/temp", b"9", qos=1)
    msg = central.get(5)
    assert (msg.topic, msg.payload) == ("site17/up/k1/temp", b"21.5")
    # In: site17/cmd/<x> -> from-central/cmd/<x>, published here (logged and routed, QoS 1).
    # The bridge's subscription is made at CONNACK: wait until it answers.
    for p in (b"dev/k1/temp", b"dev/k1/humidity", b"other/k1/temp"):
        assert local.recv_publish(5).topic.encode() == p
    central.publish("site17/cmd/reboot", b"now", qos=1)
    central.publish("site17/sys/x", b"refused here", qos=1)
    central.publish("site17/elsewhere", b"not subscribed", qos=1)
    p = local.recv_publish(5)
    assert (p.topic, p.payload, p.qos) == ("from-central/cmd/reboot", b"now", 1)
    fig = figures(gw)
    assert fig["received"] == 1 and fig["forwarded"] == 1 and fig["received_dropped"] == 1
    assert gw.wait_log(lambda ln: "bridge up: dropped a message for '$SYS/sys/x': $SYS topics "
                                  "are written only by the broker" in ln, 5)
    assert gw.stats()["dropped"]["bridge_in"] == 1
    # The operator's view: a line per bridge in `inspect stats`.
    out = run_cli("inspect", "stats", "--data-dir", gw.config["data_dir"])
    assert out.returncode == 0, out.stderr
    assert re.search(rf"bridge +up to 127\.0\.0\.1:{remote.port}, up, cursor \d+; lag 0 "
                     r"messages, .*1 forwarded, 0 resent, 0 refused, 0 gaps \(0 offsets\), 1 received, "
                     r"0 reconnects", out.stdout), out.stdout
    # `inspect bridges`: a table row per bridge, and the admin reply as JSON.
    out = run_cli("inspect", "bridges", "--data-dir", gw.config["data_dir"])
    assert out.returncode == 0, out.stderr
    head, row = out.stdout.splitlines()
    assert head.split()[:4] == ["BRIDGE", "REMOTE", "STATE", "CURSOR"]
    assert row.split()[:3] == ["up", f"127.0.0.1:{remote.port}", "up"], out.stdout
    # INFLIGHT, FORWARDED, RESENT, REFUSED, GAPS, RECEIVED, RECONNECTS
    assert row.split()[-7:] == ["0", "1", "0", "0", "0", "1", "0"], out.stdout
    out = run_cli("inspect", "bridges", "--data-dir", gw.config["data_dir"], "--format", "json")
    (fig,) = json.loads(out.stdout)["bridges"]
    assert (fig["name"], fig["state"], fig["forwarded"], fig["received"]) == ("up", "up", 1, 1)


def test_retention_forced_under_the_cursor_is_a_counted_logged_gap(broker, mosquitto_broker,
                                                                   paho):
    remote = mosquitto_broker(extra=REMOTE)
    port = remote.port
    remote.stop()           # the bridge cannot forward: its cursor stays at 0
    rules = [{"pattern": "g/#", "direction": "out", "qos": 1}]
    gw = broker(log={"segment_bytes": 4096, "retention_bytes": 16384},
                bridge=[bridge_table(port, rules)])
    pub = gw.client("pub")
    publish_range(pub, "g/x", 0, 2000)   # about 100 KB: far over retention_bytes
    mark = gw.mark()
    wait_figure(gw, lambda f: f["gaps"] >= 1, timeout=10)
    line = gw.wait_log(lambda ln: "were deleted before it forwarded them" in ln, 5, mark)
    found = re.search(r"log records 0 to (\d+) were deleted .*: (\d+) offsets lost to the "
                      r"remote; it goes on from (\d+)", line or "")
    assert found, line
    last, lost, goes_on = map(int, found.groups())
    assert lost == last + 1 == goes_on and 0 < lost < 2000
    # The rest arrives once the remote is back; every offset is forwarded or counted lost.
    remote.start()
    fig = wait_figure(gw, lambda f: f["lag_messages"] == 0 and f["inflight"] == 0, timeout=20)
    assert fig["forwarded"] > 0 and fig["forwarded"] + fig["gap_offsets"] == 2000, fig
    out = run_cli("inspect", "bridges", "--data-dir", gw.config["data_dir"])
    assert (f"up: {fig['gap_offsets']} log offsets lost to the remote in {fig['gaps']} gaps "
            f"(retention_bytes)"
            in out.stdout), out.stdout


@pytest.mark.parametrize("limit, window, n, sub_qos", [
    (None, WINDOW, 2000, 2),
    (5, 5, 500, 1),
])
def test_a_qos_2_rule_to_a_3_1_1_mosquitto_loses_nothing(broker, mosquitto_broker, paho,
                                                         limit, window, n, sub_qos):
    """Mosquitto takes at most max_inflight_messages (20 by default) QoS 2 messages in flight
    from one client; from a 3.1.1 client it answers one more with a plain PUBREC and drops it
    (a 5.0 client gets PUBREC 0x97). A 3.1.1 bridge keeps at most 20 QoS 2 messages in
    flight, whatever its window (100); a 3.1.1 remote cannot say it takes fewer: to one with
    max_inflight_messages 5, a bridge whose window is 5 (docs/bridge.md) loses nothing."""
    extra = [] if limit is None else [f"max_inflight_messages {limit}"]
    remote = mosquitto_broker(extra=[*REMOTE, *extra])
    sub = paho(remote.port, client_id="central-q2")
    assert sub.subscribe("gw1/q2/#", sub_qos) == [sub_qos]
    got = Received(sub)
    rules = [{"pattern": "q2/#", "direction": "out", "qos": 2, "remote_prefix": "gw1/"}]
    gw = broker(bridge=[bridge_table(remote.port, rules, window=window)])
    wait_figure(gw, lambda f: f["state"] == "up")
    publish_range(gw.client("pub"), "q2/t", 0, n)
    assert got.wait_distinct(n, 60), f"{len(got.seen)} of {n} arrived"
    fig = wait_figure(gw, lambda f: f["cursor"] == n and f["inflight"] == 0, timeout=30)
    assert fig["forwarded"] == n and fig["reconnects"] == 0, fig
    assert got.duplicates() == []
