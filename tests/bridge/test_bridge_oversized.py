"""A message from the remote over the broker's max_packet_size: the connection reads past it
(its payload is never held), the bridge drops it, counts it once (dropped, bridge_in) and
acknowledges it, so the remote lets it go; the link stays up and what follows arrives. Any
other packet over the limit still closes the link."""

from __future__ import annotations

import pytest

import mqttraw as m
import mqttraw5 as m5

from .helpers import FakeRemote, FakeRemote5, bridge_table, publish_range, wait_figure

MAX_PACKET = 4096


@pytest.mark.parametrize("qos", [1, 2])
def test_an_oversized_message_from_mosquitto_is_dropped_once_and_the_link_goes_on(
        broker, mosquitto_broker, paho, qos):
    remote = mosquitto_broker(extra=["max_queued_messages 0"])
    rules = [{"pattern": "in/#", "direction": "in", "qos": qos},
             {"pattern": "out/#", "direction": "out", "qos": 1}]
    gw = broker(limits={"max_packet_size": MAX_PACKET},
                bridge=[bridge_table(remote.port, rules)])
    wait_figure(gw, lambda f: f["state"] == "up")
    local = gw.client("local")
    local.subscribe("in/#", qos=1)
    central = paho(remote.port, client_id="central")
    assert central.subscribe("out/#", 1) == [1]
    # Sent behind the bridge's SUBSCRIBE: once it is at the remote, so is the subscription.
    gw.client("first").publish("out/first", b"f", qos=1)
    assert central.get(5).topic == "out/first"

    central.publish("in/big", b"x" * 20_000, qos=qos)
    for i in range(5):
        central.publish("in/t", str(i).encode(), qos=qos)
    assert [local.recv_publish(5).payload for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
    # The remote's acknowledgements are read again: the outbound side moves on.
    publish_range(gw.client("lp"), "out/t", 0, 20)
    fig = wait_figure(gw, lambda f: f["forwarded"] == 21 and f["inflight"] == 0)
    assert (fig["connects"], fig["received"], fig["received_dropped"]) == (1, 5, 1), fig
    assert gw.stats()["dropped"]["bridge_in"] == 1
    assert gw.stats()["limit_hits"]["max_packet_size"] == 1
    lines = [ln for ln in gw.logs if "over max_packet_size" in ln]
    assert len(lines) == 1 and "a message of 20" in lines[0] and "'in/big'" in lines[0], lines


def test_an_oversized_message_is_acknowledged_in_order_and_another_packet_closes(broker):
    remote = FakeRemote()
    rules = [{"pattern": "cmd/#", "direction": "in", "qos": 1}]
    try:
        gw = broker(limits={"max_packet_size": MAX_PACKET},
                    bridge=[bridge_table(remote.port, rules)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        big = m.publish("cmd/big", b"x" * 100_000, qos=1, packet_id=2)
        # Its body in pieces, the messages around it in the same writes.
        end.send(m.publish("cmd/a", b"1", qos=1, packet_id=1) + big[:1000])
        end.send(big[1000:50_000])
        end.send(big[50_000:] + m.publish("cmd/b", b"2", qos=1, packet_id=3))
        assert [end.expect(m.PUBACK).packet_id for _ in range(3)] == [1, 2, 3]
        fig = wait_figure(gw, lambda f: f["received"] == 2)
        assert (fig["received_dropped"], fig["connects"]) == (1, 1), fig
        # Sent again (the remote did not see our PUBACK, say): dropped and answered again.
        end.send(m.publish("cmd/big", b"x" * 100_000, qos=1, packet_id=2, dup=True))
        assert end.expect(m.PUBACK).packet_id == 2
        # A SUBACK saying 256 MiB follow: no PUBLISH, not read past; the link is closed.
        end.send(b"\x90\xff\xff\xff\x7f")
        assert end.expect_closed(5)
        end = remote.accept()
        fig = wait_figure(gw, lambda f: f["state"] == "up" and f["connects"] == 2)
        assert fig["received_dropped"] == 3
        assert gw.stats()["dropped"]["bridge_in"] == 3
        assert len([ln for ln in gw.logs if "over max_packet_size" in ln]) == 1
        assert len([ln for ln in gw.logs if "a packet from the remote" in ln]) == 1
    finally:
        remote.close()


def test_a_v5_remote_that_ignores_the_maximum_packet_size_is_read_past(broker):
    remote = FakeRemote5()
    rules = [{"pattern": "cmd/#", "direction": "in", "qos": 2}]
    try:
        gw = broker(limits={"max_packet_size": MAX_PACKET},
                    bridge=[bridge_table(remote.port, rules, protocol_version=5)])
        end = remote.accept()
        sub = end.expect(m5.SUBSCRIBE)
        end.send(m5.suback5(sub.packet_id, [2]))
        wait_figure(gw, lambda f: f["state"] == "up")
        end.send(m5.publish5("cmd/big", b"x" * 10_000, qos=2, packet_id=7,
                             props={0x26: [("k", "v")]}))
        assert end.expect(m5.PUBREC).packet_id == 7
        end.send(m5.pubrel5(7))
        assert end.expect(m5.PUBCOMP).packet_id == 7
        end.send(m5.publish5("cmd/ok", b"fine", qos=2, packet_id=8))
        assert end.expect(m5.PUBREC).packet_id == 8
        fig = wait_figure(gw, lambda f: f["received"] == 1)
        assert (fig["received_dropped"], fig["connects"]) == (1, 1), fig
    finally:
        remote.close()
