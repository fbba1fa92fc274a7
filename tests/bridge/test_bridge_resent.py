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


def test_a_qos_2_message_past_pubrec_is_not_counted_as_resent(broker):
    """After a reconnect to a session the remote kept, a QoS 2 message past PUBREC gets its
    PUBREL again, not its PUBLISH: only the other one counts as resent."""
    remote = FakeRemote5()
    rules = [{"pattern": "s/#", "direction": "out", "qos": 2}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5,
                                         session_expiry=300)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        for i in range(2):
            pub.publish("s/x", str(i).encode(), qos=1)
        first = [end.expect(m5.PUBLISH) for _ in range(2)]
        end.send(m5.pubrec5(first[0].packet_id))
        assert end.expect(m5.PUBREL).packet_id == first[0].packet_id
        mark = gw.mark()
        end.close()
        end = remote.accept(m5.connack5(session_present=True))
        assert end.expect(m5.PUBREL).packet_id == first[0].packet_id
        again = end.expect(m5.PUBLISH)
        assert (again.payload, again.dup) == (b"1", True)
        line = gw.wait_log(lambda ln: "bridge up: connected to" in ln, 5, mark)
        assert "1 messages sent again" in line, line
        end.send(m5.pubcomp5(first[0].packet_id) + m5.pubrec5(again.packet_id))
        end.expect(m5.PUBREL)
        end.send(m5.pubcomp5(again.packet_id))
        fig = wait_figure(gw, lambda f: f["cursor"] == 2)
        assert (fig["forwarded"], fig["resent"]) == (2, 1), fig
    finally:
        remote.close()
