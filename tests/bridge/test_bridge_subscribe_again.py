"""A link lost between the bridge's SUBSCRIBE and its SUBACK: the next link subscribes
afresh, once; the unanswered SUBSCRIBE is neither sent again nor held in the window."""

from __future__ import annotations

import socket

import mqttraw as m
from client.blocking import raw_over

from .helpers import FakeRemote, bridge_table, wait_figure

WINDOW = 2
CUTS = 3


def connected(remote: FakeRemote, session_present: bool) -> m.RawClient:
    """The remote's end of the bridge's next link, its CONNECT answered."""
    sock, _ = remote.server.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    end = raw_over(None)
    end.sock = sock
    remote.ends.append(end)
    end.expect(m.CONNECT, 10)
    end.send(m.connack(session_present))
    return end


def _after_pubrels(end):
    """The next packet that is no PUBREL, those before it answered: a reconnect to a kept
    session releases the bridge's packet ids first (bridge/release.py)."""
    while True:
        p = end.recv_packet(10)
        if p.type != m.PUBREL:
            return p
        end.send(m.pubcomp(p.packet_id))


def test_an_unanswered_subscribe_is_not_sent_again(broker):
    remote = FakeRemote()
    remote.server.settimeout(10)
    try:
        rules = [{"pattern": "in/#", "direction": "in", "qos": 1},
                 {"pattern": "out/#", "direction": "out", "qos": 1}]
        gw = broker(bridge=[bridge_table(remote.port, rules, window=WINDOW)])
        # Links cut after the SUBSCRIBE, before its SUBACK (a flapping link).
        for i in range(CUTS):
            end = connected(remote, session_present=i > 0)
            sub = _after_pubrels(end)
            assert sub.type == m.SUBSCRIBE and sub.flags == 2, sub   # a new one, one per link
            end.close()
        end = connected(remote, session_present=True)
        sub = _after_pubrels(end)
        assert sub.type == m.SUBSCRIBE, sub
        end.send(m.suback(int.from_bytes(sub.body[:2], "big"), [1]))
        wait_figure(gw, lambda f: f["state"] == "up" and f["connects"] == CUTS + 1)
        # The whole window is the publishes': both go out at once, nothing before them.
        pub = gw.client("pub")
        pub.publish("out/a", b"1", qos=1)
        pub.publish("out/a", b"2", qos=1)
        got = [end.expect(m.PUBLISH, 5) for _ in range(WINDOW)]
        assert [p.payload for p in got] == [b"1", b"2"]
        fig = wait_figure(gw, lambda f: f["inflight"] == WINDOW)
        assert fig["inflight"] == WINDOW, fig
    finally:
        remote.close()
