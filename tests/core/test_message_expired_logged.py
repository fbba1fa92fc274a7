"""Messages dropped for their Message Expiry Interval (``message_expired``) are logged as the
other drops are: the first at once with the session's client id and the topic, the next ones
within the minute only counted (core.limits.EventLog)."""

from __future__ import annotations

import threading

import pytest

import mqttraw5 as R
from conftest import _open_clients

pytestmark = pytest.mark.timeout(60)


def raw5(b, client_id, **kw) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id, **kw).reason == 0
    return c


def test_messages_expired_while_queued_are_logged_once(broker, uid):
    b = broker()
    sub = raw5(b, f"{uid}-s", props={R.RECEIVE_MAXIMUM: 1})
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/t", b"first", qos=1)
    first = sub.wait_for(lambda p: p.type == R.PUBLISH)
    for i in range(3):      # queued behind the unacknowledged first
        pub.publish(f"{uid}/t", b"short", qos=1, props={R.MESSAGE_EXPIRY: 1})
    pub.publish(f"{uid}/t", b"last", qos=1)
    mark = b.mark()
    threading.Event().wait(1.1)     # the Message Expiry Interval (whole seconds) passes
    sub.ack(first)
    nxt = sub.wait_for(lambda p: p.type == R.PUBLISH)
    assert nxt.payload == b"last"   # the three expired ones, before it, were dropped
    assert b.stats()["dropped"]["message_expired"] == 3
    # (Logged before "last" was sent; the stats answer came after it: every line is in.)
    assert b.wait_log(lambda ln: "expired (its Message Expiry Interval)" in ln, start=mark)
    lines = [ln for ln in b.logs[mark:] if "expired (its Message Expiry Interval)" in ln]
    assert len(lines) == 1, "\n".join(b.logs[mark:])
    assert (f"a message on '{uid}/t' for session '{uid}-s' expired (its Message Expiry "
            f"Interval) before it was sent; dropped" in lines[0]), lines[0]


def test_an_expired_retained_message_is_logged(broker, uid):
    b = broker()
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/r", b"old", qos=1, retain=True, props={R.MESSAGE_EXPIRY: 1})
    threading.Event().wait(1.1)
    mark = b.mark()
    sub = raw5(b, f"{uid}-s")
    sub.subscribe(f"{uid}/r", qos=1)
    assert sub.ping() == []         # nothing retained comes
    line = b.wait_log(lambda ln: "expired (its Message Expiry Interval)" in ln, start=mark)
    assert line and f"a message on '{uid}/r' for session '{uid}-s'" in line, line
    assert b.stats()["dropped"]["message_expired"] == 1
