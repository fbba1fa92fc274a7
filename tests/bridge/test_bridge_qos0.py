"""A QoS 0 ``out`` rule (docs/bridge.md, "QoS 0 rules"): QoS 0 messages take no place in the
window, so a backlog logged while the remote is away goes out as soon as it is back, limited
by the link's buffer alone (the link says when its buffer drained; nothing polls)."""

from __future__ import annotations

import time

import mqttraw

from edgebroker.bridge.pump import MAX_LINK_OUT

from .helpers import FakeRemote, bridge_table, figures, publish_range, wait_figure

TOTAL = 4000
SIZE = 4000     # 16 MB in all: more than the link's buffer (1 MiB) and the sockets' together
FRAME = 1 + 2 + 2 + len("s/x") + SIZE    # a QoS 0 PUBLISH of it on the link


def test_a_qos0_backlog_drains_at_once_when_the_remote_is_back(broker):
    remote = FakeRemote()
    rules = [{"pattern": "s/#", "direction": "out", "qos": 0}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, window=10)])
        # The remote is away: the bridge's TCP connect lands in the listen backlog and its
        # CONNECT waits unanswered ("connecting") while the backlog is logged here.
        wait_figure(gw, lambda f: f["state"] == "connecting")
        publish_range(gw.client("pub"), "s/x", 0, TOTAL, size=SIZE)
        assert figures(gw)["lag_messages"] == TOTAL
        remote.server.settimeout(10)
        sock, _ = remote.server.accept()
        sock.settimeout(10)
        buf = bytearray()
        while not mqttraw.split_frames(buf):     # CONNECT
            buf += sock.recv(65536)
        start = figures(gw)["bytes_out"]         # the CONNECT
        sock.sendall(mqttraw.connack(False))
        # The remote reads nothing until the bridge has filled the sockets and its link's
        # buffer past half of it (handed to the link, at QoS 0 the cursor, beyond what the
        # socket took): from then on only the link saying it drained gets the rest going.
        wait_figure(gw, lambda f: f["cursor"] * FRAME - (f["bytes_out"] - start)
                    >= MAX_LINK_OUT // 2, timeout=20)
        got = []
        deadline = time.monotonic() + 30
        sock.settimeout(1)
        while len(got) < TOTAL and time.monotonic() < deadline:
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                continue
            assert data, f"the bridge closed the link after {len(got)} messages"
            buf += data
            got += [int(p.payload) for p in mqttraw.split_frames(buf) if p.type == mqttraw.PUBLISH]
        assert got == list(range(TOTAL)), f"{len(got)} of {TOTAL} arrived in 30 s"
        # At QoS 0 the cursor moved as each message was handed to the link.
        fig = wait_figure(gw, lambda f: f["lag_messages"] == 0)
        assert (fig["cursor"], fig["forwarded"], fig["inflight"]) == (TOTAL, TOTAL, 0), fig
        sock.close()
    finally:
        remote.close()
