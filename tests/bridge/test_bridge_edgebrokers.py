"""A bridge between two edgebrokers, both ways on the same topics, with no loop: MQTT 5.0 (No
Local on the remote subscription) and 3.1.1 (the origin marker only: the remote sends the
bridge's own messages back once, and they stop there)."""

from __future__ import annotations

import pytest

from .helpers import bridge_table, wait_figure


@pytest.mark.parametrize("version, marker", [(5, None), (4, True), (4, False)])
def test_both_ways_without_loops(broker, version, marker):
    """A ``both`` rule between two edgebrokers: nothing goes round. On 5.0 (No Local) and on
    3.1.1 with the bridge marker (try_private, the default) the remote never sends the
    bridge its own messages back; on plain 3.1.1 they come back once, and stop there."""
    central = broker()
    rules = [{"pattern": "t/#", "direction": "both", "qos": 1}]
    marked = {} if marker is None else {"try_private": marker}
    gw = broker(bridge=[bridge_table(central.port, rules, protocol_version=version, **marked)])
    wait_figure(gw, lambda f: f["state"] == "up")
    at_gw = gw.client("gw-sub")
    at_gw.subscribe("t/#", qos=1)
    at_central = central.client("central-sub")
    at_central.subscribe("t/#", qos=1)
    wait_figure(gw, lambda f: f["inflight"] == 0)    # the bridge's SUBACK is back

    gw.client("gw-pub").publish("t/a", b"from the gateway", qos=1)
    central.client("central-pub").publish("t/b", b"from the centre", qos=1)
    gw.client("gw-pub2").publish("t/end", b"gateway end", qos=1)

    def collect(client, expected: list[bytes]) -> None:
        got: list[bytes] = []
        while sorted(got) != sorted(expected):
            assert len(got) < len(expected), f"got {got}, expected {expected}"
            got.append(client.recv_publish(5).payload)

    ours = [b"from the gateway", b"gateway end"]
    collect(at_central, ours + [b"from the centre"])
    if version == 5 or marker:
        # No Local (5.0, or 3.1.1 with the bridge marker): the central broker never sends the
        # bridge its own messages back.
        collect(at_gw, ours + [b"from the centre"])
        received = 1
    else:
        # 3.1.1: the gateway's messages come back once each and are published here again;
        # the origin marker keeps them from going out again.
        collect(at_gw, ours * 2 + [b"from the centre"])
        received = 3
    fig = wait_figure(gw, lambda f: f["received"] == received and f["inflight"] == 0
                      and f["lag_messages"] == 0)
    assert fig["forwarded"] == 2 and fig["not_sent_back"] == received
    # Nothing goes round: the next message on each side is a new one.
    central.client("central-pub2").publish("t/z", b"centre end", qos=1)
    assert at_central.recv_publish(5).payload == b"centre end"
    assert at_gw.recv_publish(5).payload == b"centre end"
    fig = wait_figure(gw, lambda f: f["received"] == received + 1)
    assert fig["forwarded"] == 2 and fig["not_sent_back"] == received + 1


def test_messages_that_came_in_on_topics_no_out_rule_sends_are_not_counted_as_not_sent_back(
        broker):
    """``not_sent_back`` counts the bridge's own records an out rule would have sent: with
    two out rules (the log is read without a topic filter) the messages of an in rule on
    other topics are not among them."""
    central = broker()
    rules = [{"pattern": "t/#", "direction": "out", "qos": 1},
             {"pattern": "u/#", "direction": "out", "qos": 1},
             {"pattern": "cmd/#", "direction": "in", "qos": 1}]
    gw = broker(bridge=[bridge_table(central.port, rules, protocol_version=4)])
    wait_figure(gw, lambda f: f["state"] == "up" and f["inflight"] == 0)
    pub = central.client("central-pub")
    for i in range(3):
        pub.publish(f"cmd/{i}", b"in", qos=1)
    gw.client("gw-pub").publish("t/a", b"out", qos=1)
    fig = wait_figure(gw, lambda f: f["received"] == 3 and f["forwarded"] == 1
                      and f["lag_messages"] == 0)
    assert fig["not_sent_back"] == 0
