"""Log lines that name a client's topic show its first 200 characters and its size, as the
others do (a topic may be 64 KB long): a will, a refused 5.0 PUBLISH, a protocol violation
and a shared subscription on a 60,000-character topic each log a line under 1 KB."""

from __future__ import annotations

import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import _open_clients

pytestmark = pytest.mark.timeout(60)

LONG = 60_000


def _line(b, pred, mark):
    line = b.wait_log(pred, start=mark)
    assert line, "\n".join(b.logs[mark:])
    return line


def test_a_will_on_a_long_topic_is_logged_cut(broker, uid):
    b = broker()
    topic = f"{uid}/" + "L" * LONG
    mark = b.mark()
    c = b.client(f"{uid}-w", will=(topic, b"bye"))
    c.abort()
    line = _line(b, lambda ln: f"publishing will of client '{uid}-w'" in ln, mark)
    assert len(line) < 1000, len(line)
    assert f"({len(topic)} characters)" in line


def test_a_refused_5_0_publish_on_a_long_topic_is_logged_cut(broker, uid):
    b = broker()
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(f"{uid}-p").reason == 0
    topic = f"{uid}/" + "P" * LONG
    mark = b.mark()
    c.send(R.publish5(topic, b"\xff", qos=1, props={R.PAYLOAD_FORMAT: 1}))
    assert c.expect(R.PUBACK).reason == 0x99
    line = _line(b, lambda ln: f"client '{uid}-p'" in ln and "refused (reason 0x99)" in ln, mark)
    assert len(line) < 1000, len(line)
    assert f"({len(topic)} characters)" in line


def test_a_wildcard_in_a_long_topic_name_is_logged_cut(broker, uid):
    b = broker()
    c = b.client(f"{uid}-x")
    mark = b.mark()
    c.send(m.publish(f"{uid}/" + "X" * LONG + "/#", b"x"))
    assert c.expect_closed()
    line = _line(b, lambda ln: f"client '{uid}-x'" in ln and "contains a wildcard" in ln, mark)
    assert len(line) < 1000, len(line)


def test_a_shared_subscription_on_a_long_filter_is_logged_cut(broker, uid):
    b = broker(limits={"max_queued_messages": 1})
    group = f"$share/g/{uid}/" + "S" * LONG
    member = R.RawClient5(b.host, b.port)
    _open_clients.append(member)
    assert member.connect(f"{uid}-m", clean_start=False,
                          props={R.SESSION_EXPIRY: 600}).reason == 0
    member.subscribe(group, qos=1)
    member.disconnect()
    pub = b.client(f"{uid}-pub")
    mark = b.mark()
    for i in range(3):
        pub.publish(f"{uid}/" + "S" * LONG, b"m", qos=1)
    line = _line(b, lambda ln: "its backlog is full" in ln, mark)
    assert len(line) < 1000, len(line)
