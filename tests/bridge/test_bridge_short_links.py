"""A remote that closes the link soon after each CONNACK: the bridge's reconnect back-off
keeps growing (a connection counts as a success once it lasted STABLE_AFTER, as in the client
library), the short links are counted, and the log says so once."""

from __future__ import annotations

import re
from datetime import datetime

from .helpers import bridge_table, publish_range, wait_figure

CONNECTS = 9        # the first connection, then 8 after short links
# With reconnect_min 0.05 s and a growing back-off the 8 waits take 6.6 s on average (below
# 1.2 s about once in 7,000 runs); without it they take 8 x 0.05 s and the connections.
LEAST = 1.2
_TIME = re.compile(r"\d\d:\d\d:\d\d[.,]\d+")


def _when(line: str) -> float:
    stamp = datetime.strptime(_TIME.search(line).group(0).replace(",", "."), "%H:%M:%S.%f")
    return stamp.hour * 3600 + stamp.minute * 60 + stamp.second + stamp.microsecond / 1e6


def test_a_remote_that_drops_each_link_after_its_connack_meets_a_growing_wait(
        broker, mosquitto_broker):
    # Mosquitto closes a 3.1.1 client's connection on a packet over its max_packet_size: the
    # bridge sends that message again after each CONNACK.
    remote = mosquitto_broker(extra=["max_packet_size 1000"])
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=4,
                                     reconnect_min=0.05, reconnect_max=60)])
    wait_figure(gw, lambda f: f["state"] == "up")
    mark = gw.mark()
    publish_range(gw.client("pub"), "s/big", 0, 1, size=2000)
    connects: list[str] = []

    def nth(line: str) -> bool:
        if "bridge up: connected to" in line:
            connects.append(line)
        return len(connects) >= CONNECTS

    assert gw.wait_log(nth, 60, mark), connects
    took = _when(connects[-1]) - _when(connects[0])
    assert took >= LEAST, f"{CONNECTS} connections in {took:.2f} s"
    lines = gw.log_text().splitlines()[mark:]
    warned = [ln for ln in lines if "bridge up: link to" in ln and "WARN" in ln]
    assert len(warned) == 1, warned
    assert "after its CONNACK" in warned[0] and "cursor at log offset 0" in warned[0]
    fig = wait_figure(gw, lambda f: f["short_links"] >= CONNECTS - 1)
    assert fig["forwarded"] == 0
