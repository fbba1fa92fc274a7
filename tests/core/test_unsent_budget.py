"""Records a session (or a shared subscription's backlog) takes from the log but drops as they
are written (5.0 Message Expiry passed, over the client's Maximum Packet Size) fill neither its
window nor its connection: past a budget of them (core.catchup.UNSENT_RECORDS) it goes on in
the next loop pass instead of reading its whole backlog in one.

Observed through the order of what one read brings: the returning client sends CONNECT and
PINGREQ together. Handling the CONNECT resumes the session (its pump runs there); when the
pump worked through the whole backlog at once, the one message left to deliver went out
before the PINGRESP; with the budget, the PINGREQ is answered first and the message follows
in a later pass."""

from __future__ import annotations

import time

import pytest

import mqttraw5 as R
from conftest import _open_clients
from core.test_mqtt5_raw import raw5
from edgebroker.core.catchup import UNSENT_RECORDS

# Enough records dropped at write time for a few budgets.
BACKLOG = 3 * UNSENT_RECORDS


def publish_backlog(b, uid, topic: str, expiry: int | None) -> None:
    """BACKLOG QoS 1 messages of 100 bytes (with Message Expiry ``expiry``), then a small
    one without expiry, all acknowledged (in the log)."""
    pub = raw5(b, f"{uid}-p")
    props = {R.MESSAGE_EXPIRY: expiry} if expiry else None
    pid = 0
    for start in range(0, BACKLOG, 500):
        frames = []
        for _ in range(start, min(start + 500, BACKLOG)):
            pid = pid % 65000 + 1
            frames.append(R.publish5(topic, b"x" * 100, qos=1, packet_id=pid, props=props))
        pub.send(b"".join(frames))
        for _ in range(len(frames)):
            pub.wait_for(lambda p: p.type == R.PUBACK, 10)
    pub.publish(topic, b"last", qos=1)


def resume_with_ping(b, client_id: str, props: dict) -> list:
    """CONNECT (resuming the session) and PINGREQ in one write: the types of what comes
    back, up to the PUBLISH of "last"."""
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    c.send(R.connect5(client_id, clean_start=False, props=props) + R.pingreq())
    seen = []
    for _ in range(10):
        p = c.wait_for(lambda p: True, 10)
        seen.append(p.type)
        if p.type == R.CONNACK:
            assert p.reason == 0 and p.session_present, p
        if p.type == R.PUBLISH:
            assert p.payload == b"last", p
            c.ack(p)
            break
    return seen


@pytest.mark.parametrize("why", ["message_expired", "packet_too_large"])
def test_a_backlog_dropped_at_write_time_goes_on_in_later_passes(broker, uid, why):
    b = broker()
    keep = {R.SESSION_EXPIRY: 300}
    s = raw5(b, f"{uid}-s", props=keep)
    s.subscribe(f"{uid}/t", qos=1)
    s.disconnect()
    expiry = 1 if why == "message_expired" else None
    publish_backlog(b, uid, f"{uid}/t", expiry)
    before = b.stats()["dropped"][why]
    if expiry:
        time.sleep(expiry + 0.2)                 # past the backlog's Message Expiry
    back = dict(keep)
    if why == "packet_too_large":
        back[R.MAXIMUM_PACKET_SIZE] = 64         # "last" fits, the 100-byte ones do not
    seen = resume_with_ping(b, f"{uid}-s", back)
    assert seen == [R.CONNACK, R.PINGRESP, R.PUBLISH], [R.Packet5(t, 0, b"").name
                                                         for t in seen]
    assert b.stats()["dropped"][why] == before + BACKLOG       # each still counted


def test_a_shared_backlog_dropped_at_write_time_goes_on_in_later_passes(broker, uid):
    b = broker()
    keep = {R.SESSION_EXPIRY: 300}
    s = raw5(b, f"{uid}-s", props=keep)
    s.subscribe(f"$share/g/{uid}/t", qos=1)
    s.disconnect()
    publish_backlog(b, uid, f"{uid}/t", None)
    before = b.stats()["dropped"]["packet_too_large"]
    seen = resume_with_ping(b, f"{uid}-s", {**keep, R.MAXIMUM_PACKET_SIZE: 64})
    assert seen == [R.CONNACK, R.PINGRESP, R.PUBLISH], [R.Packet5(t, 0, b"").name
                                                         for t in seen]
    assert b.stats()["dropped"]["packet_too_large"] == before + BACKLOG
