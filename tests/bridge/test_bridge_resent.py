"""``resent`` counts the messages sent again after a reconnect: those that were sent on the
lost link, not those still waiting in the client library's queue (docs/bridge.md)."""

from __future__ import annotations

import mqttraw5 as m5

from .helpers import FakeRemote5, bridge_table, wait_figure


def test_only_what_was_sent_before_counts_as_resent(broker):
    remote = FakeRemote5()
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5, window=5)])
        # The remote takes 2 at a time (Receive Maximum): of the window of 5 handed to the
        # connection, 2 go out and 3 wait in its queue.
        end = remote.accept(m5.connack5(props={m5.RECEIVE_MAXIMUM: 2}))
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        for i in range(5):
            pub.publish("s/x", str(i).encode(), qos=1)
        first = [end.expect(m5.PUBLISH) for _ in range(2)]
        assert [p.payload for p in first] == [b"0", b"1"]
        wait_figure(gw, lambda f: f["inflight"] == 2 and f["lag_messages"] == 5)
        mark = gw.mark()
        end.close()
        end = remote.accept(m5.connack5(props={m5.RECEIVE_MAXIMUM: 10}))
        again = [end.expect(m5.PUBLISH) for _ in range(5)]
        assert [p.payload for p in again] == [b"0", b"1", b"2", b"3", b"4"]
        line = gw.wait_log(lambda ln: "bridge up: connected to" in ln, 5, mark)
        assert "2 messages sent again" in line, line
        end.send(b"".join(m5.puback5(p.packet_id) for p in again))
        fig = wait_figure(gw, lambda f: f["cursor"] == 5)
        assert (fig["forwarded"], fig["resent"]) == (5, 2), fig
    finally:
        remote.close()
