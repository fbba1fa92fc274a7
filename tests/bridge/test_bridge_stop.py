"""A clean stop (SIGTERM) of a gateway whose bridge is busy with a real Mosquitto: the
acknowledgements of the inbound messages logged last go out before the link closes (after
the final fsync, durability "sync"), so the remote sends nothing again that was logged
already; a QoS 0 backlog still in the link's buffer at the stop is sent at the next start."""

from __future__ import annotations

import collections
import json
import signal

from conftest import run_cli

from .helpers import bridge_table, wait_figure

TOTAL = 6000
# Messages for the bridge's session are not limited while the gateway restarts.
REMOTE = ["max_queued_messages 0", "max_inflight_messages 20"]


def _logged(data_dir) -> list[str]:
    """The payloads of the gateway's log, in order (the log reader, the gateway stopped)."""
    tail = run_cli("inspect", "tail", "--data-dir", str(data_dir), "--from", "0",
                   "--format", "json", timeout=60)
    assert tail.returncode == 0, tail.stderr
    return [json.loads(line)["payload"] for line in tail.stdout.splitlines() if line.strip()]


def test_inbound_qos2_logged_once_across_a_clean_stop_in_sync_mode(broker, mosquitto_broker,
                                                                   mosq):
    remote = mosquitto_broker(extra=REMOTE)
    table = bridge_table(remote.port, [{"pattern": "in/#", "direction": "in", "qos": 2}],
                         client_id="gw-bridge")
    gw = broker(log={"durability": "sync"}, bridge=[table])
    data_dir = gw.config["data_dir"]
    wait_figure(gw, lambda f: f["state"] == "up")
    lines = "".join(f"{i}\n" for i in range(TOTAL))
    pub = mosq("pub", remote.port, "-t", "in/x", "-q", "2", "-l", "-i", "producer",
               stdin_data=lines)
    # Stopped while the remote streams into the bridge (20 messages in flight).
    wait_figure(gw, lambda f: f["received"] >= 500, timeout=30)
    assert gw.stop(signal.SIGTERM) == 0
    first = len(_logged(data_dir))
    assert first < TOTAL, "the stop came after the stream ended: nothing tested"

    gw = broker(data_dir=data_dir, log={"durability": "sync"}, bridge=[table])
    assert pub.wait(60) == 0
    wait_figure(gw, lambda f: f["received"] >= TOTAL - first, timeout=60)
    assert gw.stop(signal.SIGTERM) == 0
    counts = collections.Counter(_logged(data_dir))
    twice = sorted(int(p) for p, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} messages logged twice, from {twice[:10]}"
    assert len(counts) == TOTAL
