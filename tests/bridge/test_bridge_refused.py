"""Messages a 5.0 remote refuses (docs/bridge.md, "Refused messages"): refused for good, skipped
and counted; quota exceeded / server busy, sent again after a back-off with the cursor held;
the remote's Maximum QoS, Retain Available and Maximum Packet Size. The remote is the test
(FakeRemote5: a raw socket answering with chosen reason codes), and a real Mosquitto with
``max_qos 1``."""

from __future__ import annotations

import json
import re

import pytest

import mqttraw5 as m5
from conftest import run_cli

from .helpers import FakeRemote5, bridge_table, figures, scrape_when, wait_figure

OUT = [{"pattern": "s/#", "direction": "out", "qos": 1}]


def publishes(end, n: int) -> list:
    return [end.expect(m5.PUBLISH) for _ in range(n)]


def test_refused_for_good_is_skipped_counted_and_logged_once(broker):
    remote = FakeRemote5()
    try:
        gw = broker(metrics={"listen": "127.0.0.1:0"},
                    bridge=[bridge_table(remote.port, OUT, protocol_version=5, window=10)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        for i in range(3):
            pub.publish("s/x", str(i).encode(), qos=1)
        first = publishes(end, 3)
        # One refused (0x87 not authorized) between two accepted, in one segment.
        mark = gw.mark()
        end.send(m5.puback5(first[0].packet_id, 0x87) + m5.puback5(first[1].packet_id)
                 + m5.puback5(first[2].packet_id))
        fig = wait_figure(gw, lambda f: f["cursor"] == 3)
        assert (fig["forwarded"], fig["refused"], fig["inflight"]) == (2, 1, 0), fig
        line = gw.wait_log(lambda ln: "was refused" in ln, 5, mark)
        assert ("bridge up: the message at offset 0 for 's/x' was refused by the remote (reason "
                "code 0x87, Not authorized): skipped, counted as refused (bridge_refused)"
                in line), line
        # Another code is logged once more; the same code again is only counted.
        for i in range(3, 6):
            pub.publish("s/x", str(i).encode(), qos=1)
        more = publishes(end, 3)
        end.send(m5.puback5(more[0].packet_id, 0x90) + m5.puback5(more[1].packet_id, 0x87)
                 + m5.puback5(more[2].packet_id, 0x99))
        fig = wait_figure(gw, lambda f: f["cursor"] == 6)
        assert (fig["forwarded"], fig["refused"], fig["lag_messages"]) == (2, 4, 0), fig
        assert gw.wait_log(lambda ln: "reason code 0x99" in ln, 5, mark)   # (read after fig)
        lines = [ln for ln in gw.logs[mark:] if "was refused" in ln]
        assert [re.search(r"reason code (0x..)", ln).group(1) for ln in lines] == [
            "0x87", "0x90", "0x99"], lines
        assert "offset 3 for 's/x'" in lines[1] and "offset 5 for 's/x'" in lines[2]
        assert not [ln for ln in gw.logs if "internal error" in ln or "Traceback" in ln]
        # Counted everywhere: the drop reason, Prometheus, inspect bridges.
        assert gw.stats()["dropped"]["bridge_refused"] == 4
        samples = scrape_when(gw, "edgebroker_bridge_refused_total", "up", 4)
        assert samples["edgebroker_messages_dropped_total", "bridge_refused"] == 4
        assert samples["edgebroker_bridge_checkpoint_damaged_total", "up"] == 0
        assert samples["edgebroker_bridge_checkpoint_failures_total", "up"] == 0
        out = run_cli("inspect", "bridges", "--data-dir", gw.config["data_dir"],
                      "--format", "json")
        assert json.loads(out.stdout)["bridges"][0]["refused"] == 4
        out = run_cli("inspect", "bridges", "--data-dir", gw.config["data_dir"])
        head, row = out.stdout.splitlines()
        # ... RESENT, REFUSED, GAPS, RECEIVED, RECONNECTS
        assert head.split()[-4] == "REFUSED" and row.split()[-4] == "4", out.stdout
    finally:
        remote.close()


def test_quota_exceeded_is_sent_again_after_a_back_off_and_holds_the_cursor(broker):
    remote = FakeRemote5()
    try:
        gw = broker(bridge=[bridge_table(remote.port, OUT, protocol_version=5, window=10,
                                         reconnect_min=0.2, reconnect_max=0.5)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        pub.publish("s/x", b"0", qos=1)
        pub.publish("s/x", b"1", qos=1)
        first = publishes(end, 2)
        mark = gw.mark()
        end.send(m5.puback5(first[0].packet_id, 0x97) + m5.puback5(first[1].packet_id))
        line = gw.wait_log(lambda ln: "answered 0x97" in ln, 5, mark)
        assert ("bridge up: the remote answered 0x97 (Quota exceeded) to the message at offset "
                "0 for 's/x': it is sent again after a back-off" in line), line
        fig = figures(gw)
        assert (fig["cursor"], fig["forwarded"], fig["refused"]) == (0, 1, 0), fig
        # Nothing new goes before the refused one is sent again.
        pub.publish("s/x", b"2", qos=1)
        again, new = publishes(end, 2)
        assert (again.payload, new.payload) == (b"0", b"2"), (again, new)
        # Once more: the back-off grows, the cursor still waits.
        end.send(m5.puback5(again.packet_id, 0x97) + m5.puback5(new.packet_id))
        third = end.expect(m5.PUBLISH)
        assert third.payload == b"0" and figures(gw)["cursor"] == 0
        end.send(m5.puback5(third.packet_id))
        fig = wait_figure(gw, lambda f: f["cursor"] == 3)
        assert (fig["forwarded"], fig["refused"], fig["resent"]) == (3, 0, 2), fig
        assert gw.stats()["dropped"]["bridge_refused"] == 0
    finally:
        remote.close()


def test_within_the_remotes_maximum_qos_retain_and_packet_size(broker):
    remote = FakeRemote5()
    rules = [{"pattern": "s/#", "direction": "out", "qos": 2}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        pub.publish("s/x", b"a", qos=1)
        first = end.expect(m5.PUBLISH)
        assert first.qos == 2
        # The link drops with it in flight; the remote comes back without the session and
        # says Maximum QoS 1, no retain, packets of 60 bytes at most: the request queued in
        # the client library is refused there before sending (QoS 2), and the bridge sends
        # it at QoS 1 at once (not at the next keepalive tick, 60 s away).
        mark = gw.mark()
        end.close()
        end = remote.accept(m5.connack5(props={m5.MAXIMUM_QOS: 1, m5.RETAIN_AVAILABLE: 0,
                                               m5.MAXIMUM_PACKET_SIZE: 60}))
        again = end.expect(m5.PUBLISH)
        assert (again.payload, again.qos) == (b"a", 1), again
        assert gw.wait_log(lambda ln: "the remote's Maximum QoS is 1: out rules with QoS 2 "
                                      "are sent at QoS 1" in ln, 5, mark)
        end.send(m5.puback5(again.packet_id))
        # Retained: sent without the flag; too large: refused before sending, skipped.
        pub.publish("s/x", b"r", qos=1, retain=True)
        pub.publish("s/x", b"x" * 100, qos=1)
        pub.publish("s/x", b"b", qos=1)
        got = publishes(end, 2)
        assert [(p.payload, p.qos, p.retain) for p in got] == [(b"r", 1, False), (b"b", 1, False)]
        end.send(b"".join(m5.puback5(p.packet_id) for p in got))
        fig = wait_figure(gw, lambda f: f["cursor"] == 4)
        assert (fig["forwarded"], fig["refused"]) == (3, 1), fig
        assert gw.wait_log(lambda ln: "Retain Available 0" in ln, 5, mark)
        line = gw.wait_log(lambda ln: "was refused" in ln, 5, mark)
        assert ("the message at offset 2 for 's/x' was refused before sending, over the remote's "
                "Maximum Packet Size (reason code 0x95, Packet too large)" in line), line
    finally:
        remote.close()


def test_a_mosquitto_with_max_qos_1_gets_a_qos_2_rule_at_qos_1(broker, mosquitto_broker,
                                                               paho):
    remote = mosquitto_broker(extra=["max_qos 1"])
    sub = paho(remote.port, client_id="central")
    assert sub.subscribe("s/#", 1) == [1]
    rules = [{"pattern": "s/#", "direction": "out", "qos": 2}]
    gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5)])
    wait_figure(gw, lambda f: f["state"] == "up")
    pub = gw.client("pub")
    for i in range(3):
        pub.publish("s/x", str(i).encode(), qos=1)
    got = [sub.messages.get(timeout=5) for _ in range(3)]
    assert [(m.payload, m.qos) for m in got] == [(b"0", 1), (b"1", 1), (b"2", 1)]
    fig = wait_figure(gw, lambda f: f["cursor"] == 3)
    assert (fig["forwarded"], fig["refused"]) == (3, 0), fig
    assert gw.wait_log(lambda ln: "the remote's Maximum QoS is 1" in ln, 5)
    assert not [ln for ln in gw.logs if "internal error" in ln or "Traceback" in ln]


def test_a_connack_with_receive_maximum_0_is_a_protocol_error(broker):
    remote = FakeRemote5()
    try:
        gw = broker(bridge=[bridge_table(remote.port, OUT, protocol_version=5)])
        end = remote.accept(m5.connack5(props={m5.RECEIVE_MAXIMUM: 0}))
        assert end.expect(m5.DISCONNECT).reason == 0x82        # protocol error
        line = gw.wait_log(lambda ln: "bridge up: cannot connect to" in ln, 5)
        assert "Receive Maximum is 0" in line, line
        # It tries again (and is not "up" meanwhile).
        remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up" and f["connects"] == 1)
    finally:
        remote.close()


def test_messages_lowered_to_a_new_maximum_qos_wait_for_room_in_the_queue(broker):
    """The remote comes back (its session kept) with Maximum QoS 1: the QoS 2 messages sent
    or queued before are refused before sending (0x9B) while new ones fill the client
    library's queue (its Receive Maximum 1 is below the window); they are sent at QoS 1 once
    there is room, not lost with the cursor stuck before them; the packet id of the one
    sent at QoS 2 gets its PUBREL."""
    remote = FakeRemote5()
    rules = [{"pattern": "s/#", "direction": "out", "qos": 2}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5, window=4)])
        end = remote.accept(m5.connack5(props={m5.RECEIVE_MAXIMUM: 1}))
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        for i in range(4):          # one in flight at QoS 2, three queued behind it
            pub.publish("s/x", str(i).encode(), qos=1)
        first = end.expect(m5.PUBLISH)
        assert (first.payload, first.qos) == (b"0", 2), first
        end.close()
        wait_figure(gw, lambda f: f["state"] != "up")
        for i in range(4, 8):       # read while the link is down
            pub.publish("s/x", str(i).encode(), qos=1)
        end = remote.accept(m5.connack5(True, props={m5.RECEIVE_MAXIMUM: 1,
                                                     m5.MAXIMUM_QOS: 1}))
        got, released = [], []
        for _ in range(20):         # one at a time (Receive Maximum 1), acknowledged
            if len(set(got)) == 8 and released:
                break
            p = end.recv_packet()
            if p.type == m5.PUBREL:
                released.append(p.packet_id)
                end.send(m5.pubcomp5(p.packet_id))
                continue
            assert (p.type, p.qos) == (m5.PUBLISH, 1), p
            got.append(int(p.payload))
            end.send(m5.puback5(p.packet_id))
        assert sorted(set(got)) == list(range(8)), got
        # The one sent at QoS 2 before (its PUBREC lost with the link) may be held by the
        # remote under its packet id: it gets its PUBREL (MQTT-4.4.0-1), as does each other id
        # of the bridge's range (10: window 4), once (release.py: the remote may have been
        # restarted from an older save).
        assert first.packet_id in released and sorted(released) == list(range(1, 11)), released
        fig = wait_figure(gw, lambda f: f["cursor"] == 8)
        assert (fig["lag_messages"], fig["refused"], fig["inflight"]) == (0, 0, 0), fig
        assert not [ln for ln in gw.logs if "internal error" in ln or "Traceback" in ln]
    finally:
        remote.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_over_mosquittos_message_size_limit_is_skipped(broker, mosquitto_broker,
                                                                 paho, qos):
    """Mosquitto 2.0 refuses a message over its message_size_limit with PUBACK (PUBREC) 0x95,
    a code MQTT 5.0 does not allow there, then closes the link: the bridge skips that message
    (counted and logged as refused, naming the code), connects again, and what follows
    arrives."""
    remote = mosquitto_broker(extra=["message_size_limit 1000"])
    sub = paho(remote.port, client_id="central")
    assert sub.subscribe("s/#", 1) == [1]
    rules = [{"pattern": "s/#", "direction": "out", "qos": qos}]
    gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5)])
    wait_figure(gw, lambda f: f["state"] == "up")
    pub = gw.client("pub")
    pub.publish("s/x", b"0", qos=1)
    pub.publish("s/x", b"x" * 5000, qos=1)
    for i in range(1, 6):
        pub.publish("s/x", str(i).encode(), qos=1)
    got = [sub.messages.get(timeout=10).payload for _ in range(6)]
    assert got == [str(i).encode() for i in range(6)]
    fig = wait_figure(gw, lambda f: f["cursor"] == 7 and f["inflight"] == 0)
    assert (fig["forwarded"], fig["refused"], fig["lag_messages"]) == (6, 1, 0), fig
    assert gw.stats()["dropped"]["bridge_refused"] == 1
    line = gw.wait_log(lambda ln: "was refused" in ln, 5)
    assert ("bridge up: the message at offset 1 for 's/x' was refused by the remote, with a "
            "code MQTT 5.0 does not allow there [MQTT-2.4] (reason code 0x95, Packet too "
            "large): skipped, counted as refused (bridge_refused)" in line), line
    assert not [ln for ln in gw.logs if "broke the protocol" in ln or "Traceback" in ln]


def test_a_refusal_of_a_long_topic_is_logged_cut(broker):
    """The line names the topic as the bridge's other lines do (its first 120 characters and
    its size), not all of a topic that may be 64 KB long."""
    remote = FakeRemote5()
    try:
        gw = broker(bridge=[bridge_table(remote.port, OUT, protocol_version=5)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        topic = "s/" + "L" * 60_000
        gw.client("pub").publish(topic, b"x", qos=1)
        sent = end.expect(m5.PUBLISH)
        mark = gw.mark()
        end.send(m5.puback5(sent.packet_id, 0x87))
        line = gw.wait_log(lambda ln: "was refused" in ln, 5, mark)
        assert line and len(line) < 1000, len(line or "")
        assert "... (60002 bytes) was refused by the remote (reason code 0x87" in line, line
    finally:
        remote.close()
