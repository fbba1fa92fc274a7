"""5.0 properties a client cannot send: refused with a ClientError naming the property when
the request is made (and when a connection takes a Request made by hand); a request that
reaches the connection anyway (a spool record or a state file written before these checks)
is answered as refused (0x80) instead of raising out of the loop, so the requests around it
go and a restart does not fail on it again."""

from __future__ import annotations

import re
import time

import pytest

import mqttraw as m
import mqttraw5 as m5
from edgebroker.client import spool as S
from edgebroker.client.connection import ClientError, Connection
from edgebroker.client.events import Acked, Connected
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import (PUBLISH, SUBSCRIBE, Request, make_publish,
                                        make_subscribe, make_unsubscribe, to_state)
from edgebroker.mqtt.packets import Will

BAD_ON_PUBLISH = [
    ({0x02: "3600"}, "Message Expiry Interval (0x02) must be an int in 0..4294967295, "
                     "not '3600'"),
    ({0x99: 1}, "0x99 is no MQTT 5.0 property identifier"),
    ({"2": 1}, "'2' is no MQTT 5.0 property identifier"),
    ({0x23: 70000}, "Topic Alias (0x23) must be an int in 1..65535, not 70000"),
    ({0x23: 0}, "Topic Alias (0x23) must be an int in 1..65535, not 0"),
    ({0x26: "x"}, "User Property (0x26) must be a list of (name, value) pairs of str"),
    ({0x26: [("k", 5)]}, "User Property (0x26) has a name or value that must be a str"),
    ({0x08: 5}, "Response Topic (0x08) must be a str, not 5"),
    ({0x08: "r/+"}, "Response Topic (0x08) must be a topic name without wildcard"),
    ({0x03: "a\0b"}, "Content Type (0x03) must not contain U+0000"),
    ({0x03: "x" * 65536}, "Content Type (0x03) must be at most 65,535 bytes"),
    ({0x09: "text"}, "Correlation Data (0x09) must be bytes"),
    ({0x01: 2}, "Payload Format Indicator (0x01) must be an int in 0..1, not 2"),
    ({0x0B: 3}, "Subscription Identifier (0x0b) is not one a client puts on PUBLISH "
                "(MQTT-3.3.4-6)"),
    ({0x11: 10}, "Session Expiry Interval (0x11) is not one a client puts on PUBLISH"),
    ([(0x02, 1)], "properties must be a dict"),
]


@pytest.mark.parametrize("props, words", BAD_ON_PUBLISH)
def test_a_publish_with_a_bad_property_is_refused_when_made_naming_it(props, words):
    with pytest.raises(ClientError) as info:
        make_publish("p/t", b"x", 1, properties=props)
    assert str(info.value).startswith("publish to 'p/t': ") and words in str(info.value)
    c = Connection("c", 5)              # a Request made by hand: refused when submitted
    with pytest.raises(ClientError, match=re.escape(words)):
        c.submit(Request(PUBLISH, None, "p/t", b"x", 1, False, props))
    assert c.queued == 0


def test_bad_properties_of_subscribe_unsubscribe_connect_and_will(tmp_path):
    with pytest.raises(ClientError, match=re.escape(
            "subscribe to 'a/#': property Subscription Identifier (0x0b) must be an int in "
            "1..268435455, not 0")):
        make_subscribe([("a/#", 1)], properties={0x0B: 0})
    with pytest.raises(ClientError, match=re.escape(
            "Message Expiry Interval (0x02) is not one a client puts on SUBSCRIBE")):
        make_subscribe([("a/#", 1)], properties={0x02: 5})
    with pytest.raises(ClientError, match=re.escape(
            "unsubscribe from 'a/#': property Subscription Identifier (0x0b) is not one a "
            "client puts on UNSUBSCRIBE")):
        make_unsubscribe(["a/#"], properties={0x0B: 1})
    with pytest.raises(ClientError, match=re.escape(
            "CONNECT: property Maximum Packet Size (0x27) must be an int in 1..4294967295")):
        Connection("c", 5, properties={0x27: 0})
    with pytest.raises(ClientError, match=re.escape(
            "CONNECT: property Will Delay Interval (0x18) must be an int")):
        Connection("c", 5, will=Will("w", b"", properties={0x18: "10"}))
    with S.Spool(tmp_path / "spool") as spool, pytest.raises(ClientError, match="0x02"):
        spool.append(Request(PUBLISH, None, "p/t", b"x", 1, False, {0x02: "1"}))


def test_good_properties_pass_and_go_out_as_given():
    props = {0x01: 1, 0x02: 3600, 0x03: "text/plain", 0x08: "r/t", 0x09: b"id",
             0x26: [("k", "v"), ("k", "w")], 0x23: 5}
    c = Connection("c", 5)
    c.connect(0.0)
    c.data_to_send(0.0)
    c.receive_data(m5.connack5(props={0x22: 10}), 0.0)
    c.publish("p/t", b"x", 1, properties=props)
    c.subscribe([("a/#", 1)], properties={0x0B: 7, 0x26: [("k", "v")]})
    frames = m5.split_frames5(bytearray(c.data_to_send(0.0)))
    assert frames[0].properties == {**props, 0x26: [("k", "v"), ("k", "w")]}
    assert frames[1].properties[0x0B] == 7


def old_record(spool: S.Spool, req: Request) -> None:
    """``req`` appended as a spool of a version without the checks wrote it."""
    with spool._lock:
        seq = spool._next_seq
        spool._write(spool._data_fd, S._frame(S._record(to_state(req), seq)))
        spool._next_seq += 1
        spool._records_in_file += 1
        spool._waiting.append((seq, S._record(to_state(req), seq)))


def test_a_spooled_publish_with_bad_properties_is_answered_not_a_crash_at_every_start(
        broker, uid, tmp_path, caplog):
    """A spool holds a good publish, one with Message Expiry Interval as a str (written before
    the checks) and another good one. The loop answers the bad one as refused (0x80), logged
    with the property named; the good ones reach a subscriber; a spool opened again has
    nothing left (it used to raise AttributeError out of poll() during the CONNACK, at every
    start)."""
    b = broker()
    sub = m.RawClient(b.host, b.port)
    sub.send(m.connect(f"{uid}s"))
    sub.expect(m.CONNACK)
    sub.send(m.subscribe(1, [(f"{uid}/t", 1)]))
    sub.expect(m.SUBACK)
    spool = S.Spool(tmp_path / "spool")
    spool.append(f"{uid}/t", b"good1", 1, token="good1")
    old_record(spool, Request(PUBLISH, "bad", f"{uid}/t", b"bad", 1, False, {0x02: "3600"}))
    old_record(spool, Request(SUBSCRIBE, "bad-sub", filters=[(f"{uid}/x", 1)],
                              properties={0x0B: "7"}))
    spool.append(f"{uid}/t", b"good2", 1, token="good2")
    lp = EventLoop(b.host, b.port, client_id=f"{uid}p", protocol=5, requests=spool)
    answers = {}
    deadline = time.monotonic() + 10
    while len(answers) < 4:
        assert time.monotonic() < deadline, f"spool still holds {spool.unacked}: {answers}"
        event = lp.poll(0.2)
        if event is not None and type(event) is not Connected:
            answers[event.request.token] = event
    assert answers["bad"] == Acked(answers["bad"].request, 0x80)
    assert answers["bad-sub"].granted == [0x80]
    assert answers["good1"].reason_code == answers["good2"].reason_code == 0
    assert "Message Expiry Interval (0x02) must be an int" in caplog.text
    assert [sub.recv_packet(5).payload for _ in range(2)] == [b"good1", b"good2"]
    lp.close()
    spool.close()
    with S.Spool(tmp_path / "spool") as again:
        assert again.unacked == 0 and next(iter(again)) is None


def test_a_spool_record_that_is_no_request_is_skipped_not_a_crash(tmp_path, caplog):
    """A sound record whose body is no request (no topic): skipped with a warning naming the
    file and the record, counted as answered; the next one is given."""
    path = tmp_path / "spool"
    with S.Spool(path) as spool:
        spool.append("t", b"a", 1)
        with spool._lock:
            spool._write(spool._data_fd, S._frame({"kind": "publish", "seq": 2}))
            spool._next_seq = 3
        spool.append("t", b"b", 1)
    with S.Spool(path) as spool:
        assert [r.payload for r in iter(spool.__next__, None)] == [b"a", b"b"]
        assert spool.unacked == 2
    assert f"{path}: record 2 is no request this client can send" in caplog.text
    with S.Spool(path) as spool:
        assert spool.unacked == 2          # the bad one counted as answered for good


def test_a_state_file_request_with_bad_properties_is_answered_as_refused(caplog):
    """Requests in flight and queued, loaded from a state file written before the checks:
    those with properties a client cannot send are answered as refused (0x80) at once,
    logged, and never sent; the others go as usual."""
    c = Connection("c", 5, clean_start=False, max_inflight=1)
    c.connect(0.0)
    c.data_to_send(0.0)
    c.receive_data(m5.connack5(), 0.0)
    c.publish("t", b"in flight", 1)
    c.data_to_send(0.0)
    c.publish("t", b"queued", 1)
    doc = c.save()
    doc["inflight"].append({**doc["inflight"][0], "packet_id": 9, "token": "bad1",
                            "properties": {"35": 0}})        # Topic Alias 0
    doc["queued"].insert(0, {**doc["queued"][0], "token": "bad2", "properties": {"2": "x"}})
    c = Connection.load(doc, max_inflight=2)
    assert c.inflight == 1 and c.queued == 1
    c.connect(2.0)
    c.data_to_send(2.0)
    events = c.receive_data(m5.connack5(session_present=True), 2.0)
    frames = m5.split_frames5(bytearray(c.data_to_send(2.0)))
    assert [(f.payload, f.dup, f.properties) for f in frames] == [
        (b"in flight", True, {}), (b"queued", False, {})]
    refused = {e.request.token: e.reason_code for e in events if type(e) is Acked}
    assert refused == {"bad1": 0x80, "bad2": 0x80}
    assert "Topic Alias (0x23) must be an int in 1..65535, not 0" in caplog.text


def test_properties_changed_after_the_request_was_made_are_answered_not_raised(caplog):
    """The caller changes the properties dict of a request already made (checked then) before
    it is sent: the packet cannot be made, and the request is answered as refused (0x80),
    logged, instead of an error raised out of the CONNACK's handling; the next one goes."""
    c = Connection("c", 5)
    props = {0x02: 60}
    bad = c.publish("t", b"bad", 1, properties=props)
    good = c.publish("t", b"good", 1)
    props[0x02] = "60"
    c.connect(0.0)
    c.data_to_send(0.0)
    events = c.receive_data(m5.connack5(), 0.0)
    events += c.acked_qos0()
    assert [type(e) for e in events] == [Connected, Acked]
    assert events[1].request is bad and events[1].reason_code == 0x80
    frames = m5.split_frames5(bytearray(c.data_to_send(0.0)))
    assert [f.payload for f in frames] == [b"good"] and c.inflight == 1
    assert "its packet cannot be made" in caplog.text and good.packet_id == 1
