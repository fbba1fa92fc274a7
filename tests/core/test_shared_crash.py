"""Shared subscriptions across a crash (kill -9): QoS 2 messages a group gave out are not given
out again, and the group's backlog keeps what it did not give (docs/persistence.md, "Exactly
once across a crash"; docs/protocol.md, "Shared subscriptions")."""

from __future__ import annotations

import signal

import pytest

from conftest import wait_for_snapshot
from core.test_shared import member, publishes

pytestmark = pytest.mark.timeout(90)


def _restart(broker, b):
    data_dir = b.config["data_dir"]
    b.stop(signal.SIGKILL)
    return broker(data_dir=data_dir)


def _in_snapshot(b, *client_ids):
    for client_id in client_ids:
        wait_for_snapshot(b.config["data_dir"], client_id, pred=lambda s: s["subscriptions"])


def test_a_qos2_message_sent_to_a_plain_subscriber_still_waits_for_the_group(broker, uid):
    """N (plain subscription, persistent) is sent M at QoS 2; the same M waits in the group's
    backlog for its offline member P. After the crash the exchange journal's record of N's
    delivery does not take M out of the group's backlog: P gets it, once."""
    b = broker()
    share = f"$share/g/{uid}/#"
    p = member(b, f"{uid}-P", share, qos=2, clean=False)
    p.disconnect()
    n = member(b, f"{uid}-N", f"{uid}/#", qos=2, clean=False)
    _in_snapshot(b, f"{uid}-P", f"{uid}-N")
    b.client(f"{uid}-pub").publish(f"{uid}/x", b"M", qos=2)
    got = n.recv_publish()                         # PUBREC, PUBREL, PUBCOMP
    assert got.payload == b"M"
    b2 = _restart(broker, b)
    p = b2.client(f"{uid}-P", clean=False)
    assert p.connack.session_present
    assert p.recv_publish().payload == b"M"
    assert publishes(p) == []
    n = b2.client(f"{uid}-N", clean=False)
    assert publishes(n) == []                      # N finished its exchange before the crash


def test_a_qos2_message_a_group_gave_a_member_is_not_given_again(broker, uid):
    """P1 (persistent) is sent M by the group and does not acknowledge it; crash. After the
    restart P1 gets M again with its packet id and DUP, and the other member P2 never."""
    b = broker()
    share = f"$share/g/{uid}/#"
    p2 = member(b, f"{uid}-P2", share, qos=2, clean=False)
    p2.disconnect()
    p1 = member(b, f"{uid}-P1", share, qos=2, clean=False)
    _in_snapshot(b, f"{uid}-P1", f"{uid}-P2")
    b.client(f"{uid}-pub").publish(f"{uid}/x", b"M", qos=2)
    (first,) = publishes(p1)
    assert first.payload == b"M"
    b2 = _restart(broker, b)
    p2 = b2.client(f"{uid}-P2", clean=False)
    assert publishes(p2) == []
    p1 = b2.client(f"{uid}-P1", clean=False)
    again = p1.recv_publish()
    assert (again.payload, again.dup, again.packet_id) == (b"M", True, first.packet_id)
    assert publishes(p1) == [] and publishes(p2) == []
