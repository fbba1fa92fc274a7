"""The bridge's bandwidth cap on its own: a backlog drained to a real Mosquitto under
``bandwidth`` never sends more than the cap allows over the measured stretch, beyond one
message's worth (the message that overdraws the bucket) and the 20 ms' worth the bridge
waits to gather before it goes on. How fast the drain is otherwise is bench/run.py
bridge_drain's business."""

from __future__ import annotations

import time

from .helpers import Received, bridge_table, figures, publish_range, wait_figure

BANDWIDTH = 20_000          # bytes (topic + payload) per second: about 97 messages of 207
SIZE = 200                  # payload bytes
REMOTE_TOPIC = "gw/bw/t"    # 7 bytes
COUNTED = len(REMOTE_TOPIC) + SIZE                 # what the cap counts per message
FRAME = 1 + 2 + 2 + len(REMOTE_TOPIC) + 2 + SIZE   # the QoS 1 PUBLISH on the link (214)
TOTAL = 500                 # about 1 s of burst, then about 4 s at the cap


def test_bandwidth_cap_holds_over_a_drain(broker, mosquitto_broker, paho):
    remote = mosquitto_broker()
    sub = paho(remote.port, client_id="central")
    assert sub.subscribe("gw/#", 1) == [1]
    got = Received(sub)
    rules = [{"pattern": "bw/#", "direction": "out", "qos": 1, "remote_prefix": "gw/"}]
    gw = broker(bridge=[bridge_table(remote.port, rules, bandwidth=BANDWIDTH)])
    wait_figure(gw, lambda f: f["state"] == "up")
    start = figures(gw)["bytes_out"]     # CONNECT: the link's bytes from here are PUBLISHes
    publish_range(gw.client("pub"), "bw/t", 0, TOTAL, size=SIZE)

    # (time asked, time answered, messages on the link) until the backlog is out (bounded).
    samples = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        asked = time.monotonic()
        sent = (figures(gw)["bytes_out"] - start) // FRAME
        samples.append((asked, time.monotonic(), sent))
        if sent >= TOTAL:
            break
        time.sleep(0.05)
    assert samples[-1][2] == TOTAL, f"only {samples[-1][2]} of {TOTAL} sent in 30 s"

    # The stretch measured: from once the first second's burst is surely spent to the last
    # sample before the backlog ran out (the bucket is kept empty all along).
    burst = BANDWIDTH // COUNTED + 2
    inside = [s for s in samples if burst <= s[2] < TOTAL]
    assert len(inside) >= 10, samples
    first, last = inside[0], inside[-1]
    seconds = last[1] - first[0]          # the longest the stretch can have lasted
    sent_bytes = (last[2] - first[2]) * COUNTED
    allowed = BANDWIDTH * seconds + BANDWIDTH * 0.02 + COUNTED
    assert sent_bytes <= allowed, (sent_bytes, allowed, seconds)
    # And the cap is a rate, not a stall: at least half of it over the same stretch.
    assert sent_bytes >= BANDWIDTH * (last[0] - first[1]) / 2, (sent_bytes, seconds)

    assert got.wait_distinct(TOTAL, 10) and got.seen == set(range(TOTAL))
