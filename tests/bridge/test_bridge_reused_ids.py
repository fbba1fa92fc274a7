"""The remote comes back from an older save of its sessions (Mosquitto killed between two
autosaves): it still has the bridge's session but not the QoS 2 exchanges it started since,
so it sends a new message under a packet id whose PUBREL the bridge still awaits. The bridge
logs and publishes it as the different message it is (another topic, payload or RETAIN than
the held one, whatever DUP says), counts it (``ids_reused``) and warns once per link; the
same message again under a held id is logged once, with DUP 1 or, as Mosquitto back from
its save sends a saved message, DUP 0. The bridge used to take the new message for a
resend (PUBREC sent, the message lost, nothing counted), then, going by DUP alone, logged
Mosquitto's DUP 0 resend twice. The remote is played by the test (FakeRemote)."""

from __future__ import annotations

import mqttraw as m
from core.test_disk_full import _log_payloads

from .helpers import FakeRemote, gateway_up, wait_figure

RULES = [{"pattern": "c/#", "direction": "in", "qos": 2}]


def test_a_new_message_under_an_id_held_for_pubrel_is_logged_a_resend_is_not(broker):
    remote = FakeRemote()
    try:
        gw, end, local = gateway_up(broker, remote, RULES, "c/#")

        # Id 1 logged and acknowledged; the remote's PUBREL withheld. The link breaks.
        end.send(m.publish("c/a", b"old", qos=2, packet_id=1))
        assert end.expect(m.PUBREC).packet_id == 1
        assert local.recv_publish().payload == b"old"
        end.close()

        # The remote restarted from an older save: session present, a new message under id 1.
        end = remote.accept(session_present=True)
        mark = gw.mark()
        end.send(m.publish("c/a", b"new", qos=2, packet_id=1))
        assert end.expect(m.PUBREC).packet_id == 1
        assert local.recv_publish().payload == b"new"
        assert gw.wait_log(lambda ln: "awaited its PUBREL" in ln and "WARNING" in ln, 5, mark)
        # Its resend (DUP 1): acknowledged again, not logged again; then the exchange ends.
        end.send(m.publish("c/a", b"new", qos=2, dup=True, packet_id=1))
        assert end.expect(m.PUBREC).packet_id == 1
        end.send(m.pubrel(1))
        assert end.expect(m.PUBCOMP).packet_id == 1
        end.send(m.publish("c/a", b"last", qos=2, packet_id=2))
        assert end.expect(m.PUBREC).packet_id == 2
        assert local.recv_publish().payload == b"last"
        fig = wait_figure(gw, lambda f: f["received"] == 3)
        assert (fig["ids_reused"], fig["received_dropped"]) == (1, 0)
        assert gw.stop() == 0
        assert _log_payloads(gw.config["data_dir"]) == ["old", "new", "last"]
    finally:
        remote.close()


def test_the_same_message_again_with_dup_0_is_logged_once_a_different_one_with_dup_1_is_new(
        broker):
    remote = FakeRemote()
    try:
        gw, end, local = gateway_up(broker, remote, RULES, "c/#")

        # Ids 1 and 2 logged and acknowledged; the remote's PUBRELs withheld. The link breaks.
        end.send(m.publish("c/a", b"m1", qos=2, packet_id=1)
                 + m.publish("c/a", b"m2", qos=2, packet_id=2))
        assert [end.expect(m.PUBREC).packet_id for _ in range(2)] == [1, 2]
        assert [local.recv_publish().payload for _ in range(2)] == [b"m1", b"m2"]
        end.close()

        # The remote back from its save: m1 again under id 1 with DUP 0 (a resend: not logged
        # again), a different message under id 2 with DUP 1 (new: logged).
        end = remote.accept(session_present=True)
        mark = gw.mark()
        end.send(m.publish("c/a", b"m1", qos=2, packet_id=1)
                 + m.publish("c/a", b"other", qos=2, dup=True, packet_id=2))
        assert [end.expect(m.PUBREC).packet_id for _ in range(2)] == [1, 2]
        assert local.recv_publish().payload == b"other"
        assert gw.wait_log(lambda ln: "a different QoS 2 message (DUP 1)" in ln
                           and "WARNING" in ln, 5, mark)
        end.send(m.pubrel(1) + m.pubrel(2))
        assert [end.expect(m.PUBCOMP).packet_id for _ in range(2)] == [1, 2]
        end.send(m.publish("c/a", b"last", qos=2, packet_id=1))
        assert end.expect(m.PUBREC).packet_id == 1
        assert local.recv_publish().payload == b"last"
        fig = wait_figure(gw, lambda f: f["received"] == 4)
        assert (fig["ids_reused"], fig["received_dropped"]) == (1, 0)
        assert gw.stop() == 0
        assert _log_payloads(gw.config["data_dir"]) == ["m1", "m2", "other", "last"]
    finally:
        remote.close()
