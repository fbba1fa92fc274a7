"""Log lines that name a client id or a user name show their first 100 characters, as the
connection lines do (max_client_id_length is 65535 unless set, and a user name may be 64 KB
long): a client with a 60,000-character client id and user name goes through a wrong
password, a session takeover, falling behind the log and coming back, a full queue, a full
topic table and session expiry, and every line the broker writes stays under 1 KB."""

from __future__ import annotations

import time

import pytest

import mqttraw as m
from secfiles import write_passwords

pytestmark = pytest.mark.timeout(60)

LONG = 60_000
PASSWORD = "right"


def _line(b, pred, mark):
    line = b.wait_log(pred, timeout=10, start=mark)
    assert line, "\n".join(ln[:300] for ln in b.logs[mark:])
    return line


def _all_short(b):
    long_lines = [f"{len(ln)}: {ln[:300]}" for ln in b.logs if len(ln.encode()) >= 1024]
    assert not long_lines, "\n".join(long_lines)


def test_long_client_id_and_user_name_are_logged_cut(broker, uid, tmp_path):
    cid = f"{uid}-" + "c" * LONG
    user = f"{uid}-" + "u" * LONG
    passwords = write_passwords(tmp_path / "passwd", {user: PASSWORD})
    b = broker(password_file=str(passwords), allow_anonymous=True,
               limits={"max_session_lag_age": 1.0})
    who = f"client {cid[:100]!r}... (user {user[:100]!r}...)"

    mark = b.mark()
    refused = b.client(cid, expect_rc=4, username=user, password="wrong")
    assert refused.expect_closed()
    _line(b, lambda ln: who in ln and "refused (CONNACK 4)" in ln, mark)

    sub = b.client(cid, clean=False, username=user, password=PASSWORD)
    sub.subscribe(f"{uid}/t", qos=1)
    mark = b.mark()
    again = b.client(cid, clean=False, username=user, password=PASSWORD)
    _line(b, lambda ln: f"client {cid[:100]!r}... from 127.0.0.1:{again.local_port} takes "
                        f"over the session" in ln, mark)
    assert sub.expect_closed()
    again.disconnect()

    # Offline while messages come: its cursor is moved past them (max_session_lag_age), the
    # first move logged, the next ones counted and logged when it catches up.
    mark = b.mark()
    pub = b.client(f"{uid}-p")
    for i in range(12):                          # 3 s: the cursor is moved several times
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
        time.sleep(0.25)
    _line(b, lambda ln: f"session {cid[:100]!r}...: log records" in ln
          and "are lost to it" in ln, mark)
    back = b.client(cid, clean=False, username=user, password=PASSWORD)
    assert back.connack.session_present
    back.ping()
    _line(b, lambda ln: f"session {cid[:100]!r}... caught up with the log;" in ln, mark)
    _all_short(b)


def test_a_long_client_id_with_a_full_queue_is_logged_cut(broker, uid):
    cid = f"{uid}-" + "q" * LONG
    b = broker(limits={"max_queued_messages": 2})
    c = b.client(cid, clean=False)
    c.subscribe(f"{uid}/t", qos=1)
    c.disconnect()
    mark = b.mark()
    pub = b.client(f"{uid}-p")
    for i in range(4):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    _line(b, lambda ln: f"session {cid[:100]!r}...: queue full" in ln, mark)
    back = b.client(cid, clean=False)
    assert [back.recv_publish(ack=True).payload for _ in range(2)] == [b"0", b"1"]
    _line(b, lambda ln: f"session {cid[:100]!r}...: queue drained" in ln, mark)
    _all_short(b)


def test_long_client_ids_filling_the_topic_table_are_logged_cut(broker, uid):
    b = broker(limits={"max_topics": 4})
    cids = [f"{uid}-{n}-" + "t" * LONG for n in range(2)]
    mark = b.mark()
    for n, cid in enumerate(cids):     # 6 topics: the table makes room
        c = b.client(cid)
        c.send(b"".join(m.publish(f"{uid}/{n}/{i}", b"x") for i in range(3)))
        assert c.ping() == []
    line = _line(b, lambda ln: "topic table full" in ln, mark)
    assert f"Most topics tracked per client id: {cids[0][:100]!r}... " in line, line[:1000]
    _all_short(b)


def test_a_long_client_id_expiring_is_logged_cut(broker, uid):
    cid = f"{uid}-" + "e" * LONG
    b = broker(limits={"persistent_client_expiration": 0.5})
    c = b.client(cid, clean=False)
    c.subscribe(f"{uid}/t", qos=1)
    mark = b.mark()
    c.disconnect()
    _line(b, lambda ln: f"persistent session {cid[:100]!r}... removed" in ln, mark)
    _all_short(b)


def test_a_long_unverified_user_name_is_logged_cut(broker, uid):
    user = f"{uid}-" + "u" * LONG
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "allow_anonymous": True}])
    mark = b.mark()
    c = b.client(f"{uid}-a", username=user, password="anything")
    assert c.ping() == []
    _line(b, lambda ln: f"user name {user[:100]!r}... not verified" in ln, mark)
    _all_short(b)
