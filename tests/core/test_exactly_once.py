"""QoS 2 exactly once across a crash: the exchange journal (core.exchanges, docs/persistence.md).

A crash comes right after a step of a QoS 2 exchange, before a snapshot covers it; after the
restart the exchange goes on where it was. (The catch-up of a long backlog killed halfway is
in test_log_queue.py.) At the end: a re-send without DUP (the same message) within one run."""

import glob
import json
import os
import signal
import threading
import time

import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import wait_for_snapshot
from mqttraw import PUBCOMP, PUBLISH, PUBREC, PUBREL


def _restart(broker, b):
    data_dir = b.config["data_dir"]
    b.stop(signal.SIGKILL)
    return broker(data_dir=data_dir)


def test_a_received_qos2_message_is_not_logged_again_after_a_crash(broker, uid):
    """PUBREC went out, then the crash: the publisher (which did not see the PUBREC) sends the
    PUBLISH again with DUP. It is acknowledged, not logged and delivered a second time."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p", clean=False)
    wait_for_snapshot(data_dir, f"{uid}-p")              # no session changes after this one
    pub.send(m.publish(f"{uid}/t", b"once", qos=2, packet_id=3))
    assert pub.expect(PUBREC).packet_id == 3
    assert sub.recv_publish(ack=False).payload == b"once"
    b2 = _restart(broker, b)
    pub = b2.client(f"{uid}-p", clean=False)
    pub.send(m.publish(f"{uid}/t", b"once", qos=2, packet_id=3, dup=True))
    assert pub.expect(PUBREC).packet_id == 3
    pub.send(m.pubrel(3))
    assert pub.expect(PUBCOMP).packet_id == 3
    sub = b2.client(f"{uid}-s", clean=False)
    again = sub.recv_publish(ack=False)          # the unacknowledged delivery, re-sent ...
    assert (again.payload, again.dup) == (b"once", True)
    sub.ack(again)
    assert sub.ping() == [], "the re-sent PUBLISH was logged and delivered again"


def test_an_outgoing_exchange_goes_on_from_the_step_it_reached(broker, uid):
    """Three QoS 2 messages to a subscriber: one finished, one with PUBREC answered, one not
    acknowledged; then the crash. After it: PUBREL again for the second, the third again
    with its packet id and DUP, nothing for the first, and nothing sent twice."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p")
    wait_for_snapshot(data_dir, f"{uid}-s", pred=lambda s: s["subscriptions"])
    for text in (b"one", b"two", b"three"):
        pub.publish(f"{uid}/t", text, qos=2)
    one, two, three = (sub.expect(PUBLISH) for _ in range(3))
    sub.ack(one)                                          # PUBREC, PUBREL, PUBCOMP
    sub.send(m.pubrec(two.packet_id))
    assert sub.expect(PUBREL).packet_id == two.packet_id
    assert sub.ping() == []
    b2 = _restart(broker, b)
    sub = b2.client(f"{uid}-s", clean=False)
    assert sub.connack.session_present
    got = [sub.recv_packet() for _ in range(2)]
    kinds = {p.type: p for p in got}
    assert set(kinds) == {PUBLISH, PUBREL}, got
    assert kinds[PUBREL].packet_id == two.packet_id
    resent = kinds[PUBLISH]
    assert (resent.payload, resent.packet_id, resent.dup) == (b"three", three.packet_id, True)
    sub.send(m.pubcomp(two.packet_id))
    sub.ack(resent)
    assert sub.ping() == [], "a finished exchange was sent again"


def test_a_snapshot_retires_the_journal_files_before_it(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"x", qos=2)
    sub.recv_publish()
    files = glob.glob(os.path.join(data_dir, "exchanges-*.jsonl"))
    assert files, "the exchange was journaled"
    # A session change makes a snapshot, which starts a new file and retires the old one.
    b.client(f"{uid}-other", clean=False).disconnect()
    wait_for_snapshot(data_dir, f"{uid}-other")
    newest = max(map(_generation, files))
    deadline = time.monotonic() + 5          # deleted just after the snapshot is renamed
    while time.monotonic() < deadline:
        left = glob.glob(os.path.join(data_dir, "exchanges-*.jsonl"))
        if all(_generation(f) > newest for f in left):
            break
        threading.Event().wait(0.05)
    assert all(_generation(f) > newest for f in left), left


def _generation(path: str) -> int:
    return int(os.path.basename(path)[len("exchanges-"):-len(".jsonl")])


def test_damaged_journal_records_are_skipped_and_the_broker_starts(broker, uid):
    """Lines that are JSON but no record a restart can apply (a client id that is a list, too
    few fields, an offset that is text or 1e400, a negative digest, a will serial that is
    text or negative, an unknown kind) are
    skipped with one warning naming the file, their number and the first; the sound records
    of the file are applied (a ``D`` ends a session). The list raised TypeError (unhashable) out of the start, the
    short ``O`` ValueError, the text offset TypeError: exit 1 at every start."""
    b = broker()
    data_dir = b.config["data_dir"]
    for name in ("gone", "kept"):
        b.client(f"{uid}-{name}", clean=False).subscribe(f"{uid}/t", qos=2)
    wait_for_snapshot(data_dir, f"{uid}-kept")
    assert b.stop() == 0
    journal = os.path.join(data_dir, "exchanges-999999.jsonl")
    gone, kept = json.dumps(f"{uid}-gone"), json.dumps(f"{uid}-kept")
    with open(journal, "w") as fh:
        fh.write(f'["O", [{kept}], 1, 0, 10, false]\n'
                 f'["O", {kept}, 1]\n'
                 f'["I", {kept}, 1, "5"]\n'
                 f'["I", {kept}, 1, 5, -1]\n'
                 f'["O", {kept}, 2, 1e400, 10, false]\n'
                 f'["R", {kept}]\n'
                 f'["Z", {kept}, 1]\n'
                 f'["W", {kept}, "1"]\n'
                 f'["W", {kept}, -1]\n'
                 f'["W", {kept}, 5]\n'       # (sound: no such will, nothing to leave out)
                 f'["G", "$share/g/{uid}/#", "5"]\n'
                 f'["B", "$share/g/{uid}/#"]\n'
                 f'["G", "$share/g/{uid}/#", 5]\n'     # (sound: no such group)
                 f'["D", {gone}]\n')
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: f"{journal}: 11 damaged QoS 2 exchange record(s) skipped "
                                  f"(the first at line 1: a client id that is no string)" in ln,
                       5), b2.log_text()
    assert not b2.client(f"{uid}-gone", clean=False).connack.session_present
    assert b2.client(f"{uid}-kept", clean=False).connack.session_present
    assert b2.stop() == 0


@pytest.mark.parametrize("same", [b"same", b"large " * 10000])   # (large: read in pieces)
def test_the_same_message_sent_again_without_dup_is_not_delivered_again(broker, uid, same):
    """MQTT-4.3.3-2: until PUBREL, a QoS 2 message is delivered once. paho-mqtt re-sends a
    message whose PUBREC it did not get with DUP 0 after reconnecting: the same packet id,
    topic and payload (as Mosquitto, by its content) is a re-send: PUBREC, not routed."""
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p", clean=False)
    pub.send(m.publish(f"{uid}/t", same, qos=2, packet_id=7))
    assert pub.expect(PUBREC).packet_id == 7
    pub.abort()
    pub = b.client(f"{uid}-p", clean=False)
    pub.send(m.publish(f"{uid}/t", same, qos=2, packet_id=7, dup=False))
    assert pub.expect(PUBREC).packet_id == 7
    pub.send(m.pubrel(7))
    assert pub.expect(PUBCOMP).packet_id == 7
    assert sub.recv_publish().payload == same
    assert sub.ping() == [], "the re-send without DUP was delivered again"
    # Released: the id and its digest are forgotten, the same message again is a new one.
    pub.send(m.publish(f"{uid}/t", same, qos=2, packet_id=7))
    assert pub.expect(PUBREC).packet_id == 7
    assert sub.recv_publish().payload == same
    assert not any("packet id 7" in ln for ln in b.logs), "warned for a re-send"


def test_another_message_with_a_held_id_and_no_dup_is_delivered_and_warned(broker, uid):
    """A PUBLISH without DUP with an id awaiting PUBREL but another payload (or topic, or
    RETAIN) is a new message: delivered (a DUP re-send of it is not), logged once."""
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=2)
    pub = b.client(f"{uid}-p")
    mark = b.mark()
    for payload, topic, dup in ((b"first", "t", False), (b"second", "t", False),
                                (b"second", "t", True), (b"second", "u", False),
                                (b"second", "u", True)):
        pub.send(m.publish(f"{uid}/{topic}", payload, qos=2, packet_id=9, dup=dup))
        assert pub.expect(PUBREC).packet_id == 9
    got = [(p.topic, p.payload) for p in (sub.recv_publish() for _ in range(3))]
    assert got == [(f"{uid}/t", b"first"), (f"{uid}/t", b"second"), (f"{uid}/u", b"second")]
    assert sub.ping() == []
    line = b.wait_log(lambda ln: "packet id 9 (DUP 0)" in ln, start=mark)
    assert line and "taken as a new message" in line and f"{uid}-p" in line, line
    assert "another topic, payload or RETAIN" in line, line
    assert len([ln for ln in b.logs[mark:] if "packet id 9 (DUP 0)" in ln]) == 1


def test_a_5_0_client_re_sending_without_dup_gets_the_same_rule(broker, uid):
    """5.0 PUBLISHes take the same path: the same message with a held id and DUP 0 is a
    re-send (not delivered again), another payload a new message."""
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    c = R.RawClient5(b.host, b.port)
    try:
        c.connect(f"{uid}-c5")
        for payload in (b"A", b"A", b"B"):
            c.send(R.publish5(f"{uid}/t", payload, 2, packet_id=4))
            got = c.recv_packet()
            assert (got.type, got.packet_id) == (R.PUBREC, 4), got
        assert [sub.recv_publish().payload for _ in range(2)] == [b"A", b"B"]
        assert sub.ping() == []
    finally:
        c.close()


@pytest.mark.parametrize("rap", [False, True])
def test_a_retained_copy_queued_beside_its_records_copy_is_kept_after_a_crash(broker, uid,
                                                                              rap):
    """The snapshot holds a retained message X twice in a session's queue: the copy of its log
    record and the retained copy a SUBSCRIBE queued. The record's copy goes out (its ``O``
    record journaled), then a crash: the restart forgot both entries, and the client never got
    the retained copy its SUBSCRIBE owed it (RETAIN 1). Now one goes, the other stays."""
    b = broker(limits={"max_inflight_messages": 2})
    data_dir = b.config["data_dir"]
    cid = f"{uid}-s"
    options = 2 | (8 if rap else 0)                  # QoS 2, Retain As Published
    expiry = {R.SESSION_EXPIRY: 600}
    s = R.RawClient5(b.host, b.port)
    s.connect(cid, clean_start=False, props=expiry)
    s.subscribe((f"{uid}/r/#", options))
    s.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(6):
        pub.publish(f"{uid}/r/x", b"%d" % i, qos=1)
    pub.publish(f"{uid}/r/t", b"RET", qos=2, retain=True)
    s = R.RawClient5(b.host, b.port)
    s.connect(cid, clean_start=False, props=expiry)
    s.subscribe((f"{uid}/r/#", options))            # again, as clients do at each connect
    window = [s.expect(PUBLISH), s.expect(PUBLISH)]
    wait_for_snapshot(data_dir, cid, pred=lambda st: len(
        [e for e in st.get("queue", ()) if e[2]]) == 2 or len(
        {e[0] for e in st.get("queue", ())}) < len(st.get("queue", ())))
    while window[-1].topic != f"{uid}/r/t":          # one acknowledged, the next comes
        s.send(R.puback5(window.pop(0).packet_id))
        window.append(s.expect(PUBLISH))
    assert window[-1].retain is rap                  # the record's copy
    b.stop(signal.SIGKILL)
    s.close()
    b = broker(data_dir=data_dir, limits={"max_inflight_messages": 2})
    s = R.RawClient5(b.host, b.port)
    s.connect(cid, clean_start=False, props=expiry)
    got = []
    while True:
        p = s.recv_packet()
        if p.type == PUBLISH:
            if p.topic == f"{uid}/r/t":
                got.append((p.payload, p.dup, p.retain))
            s.ack(p)
            if len(got) == 2:
                break
    assert got == [(b"RET", True, rap), (b"RET", False, True)]
    assert s.ping() == []
    s.close()
