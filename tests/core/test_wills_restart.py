"""A 5.0 session's delayed will (Will Delay Interval) kept across a restart, in the session
snapshot: published when due after a stop or a crash, at once when its time passed while the
broker was down, not at all when the client comes back within the delay; checked against the
ACL of its listener, for its user, when it is published (docs/protocol.md, "Wills")."""

from __future__ import annotations

import base64
import json
import logging
import signal
import threading
import time

import pytest

import mqttraw5 as R
from conftest import _open_clients, wait_for_snapshot
from secfiles import write_acl, write_passwords

from edgebroker.core import snapshot as snap

pytestmark = pytest.mark.timeout(90)

SESSION = {R.SESSION_EXPIRY: 300}


def raw5(b, client_id, **kw) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    connack = c.connect(client_id, **kw)
    assert connack.reason == 0, connack
    c.connack = connack
    return c


def watcher(b, uid, **kw) -> R.RawClient5:
    """A persistent session subscribed to the will's topic and a marker's: it gets the will
    whenever it is published, connected or not."""
    w = raw5(b, f"{uid}-w", props=SESSION, **kw)
    assert list(w.subscribe(f"{uid}/will", f"{uid}/marker", qos=1).codes) == [1, 1]
    w.disconnect()
    return w


def drop_with_will(b, uid, delay: int, **kw) -> None:
    """A client whose connection breaks (no DISCONNECT): its will waits ``delay`` s."""
    will = (f"{uid}/will", b"offline", 1, True,
            {R.WILL_DELAY: delay, R.CONTENT_TYPE: "text/plain", R.USER_PROPERTY: ("site", "7"),
             R.MESSAGE_EXPIRY: 3600})
    c = raw5(b, f"{uid}-c", props={R.SESSION_EXPIRY: 60}, will=will, **kw)
    mark = b.mark()
    c.abort()
    assert b.wait_log(lambda ln: f"will of client '{uid}-c'" in ln and f"delayed {delay} s" in ln,
                      start=mark)


def will_in_snapshot(data_dir: str, client_id: str) -> dict | None:
    with open(f"{data_dir}/sessions.json") as fh:
        doc = json.load(fh)
    (entry,) = [s for s in doc["sessions"] if s["client_id"] == client_id]
    return entry.get("will")


def wait_until_ms(wall_ms: int, timeout: float = 30.0) -> None:
    """Wait until the wall clock is past ``wall_ms`` (at most ``timeout`` s)."""
    left = (wall_ms - time.time() * 1000) / 1000
    assert left < timeout, f"{left:.1f} s to wait, more than {timeout}"
    if left > 0:
        threading.Event().wait(left + 0.05)


def next_publish(c, timeout: float = 15.0):
    return c.wait_for(lambda p: p.type == R.PUBLISH, timeout)


def expect_no_more_wills(b, w, uid, **kw) -> None:
    """The next message the watcher gets is a marker published now: no (second) will."""
    pub = raw5(b, f"{uid}-m", **kw)
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    p = next_publish(w)
    assert p.topic == f"{uid}/marker", f"a will published when it must not be: {p!r}"
    w.ack(p)


def expect_will(w) -> object:
    p = next_publish(w)
    assert (p.payload, p.qos) == (b"offline", 1), p
    assert p.properties[R.CONTENT_TYPE] == "text/plain"
    assert p.properties[R.USER_PROPERTY] == [("site", "7")]
    assert 3500 < p.properties[R.MESSAGE_EXPIRY] <= 3600      # counted from its publishing
    w.ack(p)
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_a_delayed_will_is_published_when_due_after_a_restart(broker, uid, sig):
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid)
    drop_with_will(b, uid, delay=5)
    if sig == signal.SIGKILL:       # the snapshot written after the drop holds the will
        wait_for_snapshot(data_dir, f"{uid}-c", pred=lambda s: "will" in s)
    assert b.stop(sig) == (0 if sig == signal.SIGTERM else -sig)
    will = will_in_snapshot(data_dir, f"{uid}-c")
    assert will is not None, "the snapshot does not hold the pending will"
    due_ms = will["due_ms"]
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: "restored 1 delayed wills" in ln and "0 due now" in ln), \
        "the will's delay had ended before the restart: the restart took too long"
    w = raw5(b2, f"{uid}-w", clean_start=False, props=SESSION)
    p = expect_will(w)
    assert time.time() * 1000 >= due_ms - 100, "the will was published before it was due"
    assert b2.wait_log(lambda ln: f"publishing will of client '{uid}-c'" in ln
                       and "before the restart" in ln)
    expect_no_more_wills(b2, w, uid)
    # Retained, as its flag says; and gone from the snapshot once published.
    late = raw5(b2, f"{uid}-late")
    late.subscribe(f"{uid}/will", qos=1)
    assert next_publish(late).retain
    wait_for_snapshot(data_dir, f"{uid}-c", pred=lambda s: "will" not in s)
    assert p.retain is False


def test_a_will_due_while_the_broker_was_down_is_published_at_the_start(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid)
    drop_with_will(b, uid, delay=1)
    assert b.stop() == 0
    wait_until_ms(will_in_snapshot(data_dir, f"{uid}-c")["due_ms"])
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: "restored 1 delayed wills" in ln and "1 due now" in ln)
    assert b2.wait_log(lambda ln: f"publishing will of client '{uid}-c'" in ln)
    w = raw5(b2, f"{uid}-w", clean_start=False, props=SESSION)
    expect_will(w)
    expect_no_more_wills(b2, w, uid)


def test_a_will_in_an_older_snapshot_with_its_will_delay_is_published_with_its_properties(
        broker, uid):
    """Older brokers kept all of a will's properties in the snapshot, its Will Delay Interval
    too (now left out: its due time says it): read the same, published with the rest."""
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid)
    drop_with_will(b, uid, delay=1)
    assert b.stop() == 0
    with open(f"{data_dir}/sessions.json") as fh:
        doc = json.load(fh)
    (entry,) = [s for s in doc["sessions"] if s["client_id"] == f"{uid}-c"]
    kept = base64.b64decode(entry["will"]["properties"])
    section = R.props_raw(kept)
    props, _ = R.parse_properties(section, 0, len(section), R.WILL)
    assert R.WILL_DELAY not in props and props[R.MESSAGE_EXPIRY] == 3600, props
    older = b"\x18" + (1).to_bytes(4, "big") + kept     # Will Delay Interval 1 s first
    entry["will"]["properties"] = base64.b64encode(older).decode()
    with open(f"{data_dir}/sessions.json", "w") as fh:
        json.dump(doc, fh)
    wait_until_ms(entry["will"]["due_ms"])
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: f"publishing will of client '{uid}-c'" in ln)
    w = raw5(b2, f"{uid}-w", clean_start=False, props=SESSION)
    p = expect_will(w)
    assert R.WILL_DELAY not in p.properties
    expect_no_more_wills(b2, w, uid)


def test_a_client_back_within_the_delay_after_a_restart_cancels_its_will(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid)
    drop_with_will(b, uid, delay=5)
    assert b.stop() == 0
    due_ms = will_in_snapshot(data_dir, f"{uid}-c")["due_ms"]
    b2 = broker(data_dir=data_dir)
    mark = b2.mark()
    back = raw5(b2, f"{uid}-c", clean_start=False, props={R.SESSION_EXPIRY: 60})
    assert back.connack.session_present
    assert b2.wait_log(lambda ln: f"will of client '{uid}-c'" in ln
                       and "connected again within the Will Delay Interval" in ln, start=mark)
    assert time.time() * 1000 < due_ms, "the client came back after the delay: too slow"
    wait_until_ms(due_ms)
    w = raw5(b2, f"{uid}-w", clean_start=False, props=SESSION)
    expect_no_more_wills(b2, w, uid)
    assert not any("publishing will of" in ln for ln in b2.logs[mark:])


PASSWORDS = {"alice": "alice-pw", "watch": "watch-pw"}


@pytest.mark.parametrize("case", ["allowed", "denied-since", "listener-gone"])
def test_a_restored_will_is_checked_against_the_acl_for_its_user(broker, tmp_path, uid, case):
    """The will is checked when published, for its client's user (kept in the snapshot), as
    the ACL file of its listener is at the restart: one taking the right away drops it
    (counted, logged); so does its listener no longer being served (its ACL is unknown)."""
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    rules = (f"user alice\ntopic write {uid}/will\n\n"
             f"user watch\ntopic readwrite {uid}/marker\ntopic read {uid}/#\n")
    acl = write_acl(tmp_path / "acl", rules)
    b = broker(password_file=str(pw), acl_file=str(acl))
    data_dir = b.config["data_dir"]
    login = {"username": "watch", "password": "watch-pw"}
    watcher(b, uid, **login)
    drop_with_will(b, uid, delay=1, username="alice", password="alice-pw")
    assert b.stop() == 0
    will = will_in_snapshot(data_dir, f"{uid}-c")
    assert (will["username"], will["listener"]) == ("alice", f"127.0.0.1:{b.port}")
    wait_until_ms(will["due_ms"])
    if case == "denied-since":
        write_acl(acl, rules.replace(f"topic write {uid}/will\n", ""))
    # The same listener (its address names it), unless it is to be gone.
    port = 0 if case == "listener-gone" else b.port
    b2 = broker(data_dir=data_dir, password_file=str(pw), acl_file=str(acl),
                listener=[{"host": "127.0.0.1", "port": port}])
    line = b2.wait_log(lambda ln: f"will of client '{uid}-c'" in ln
                       and ("publishing" in ln or "dropped" in ln))
    w = raw5(b2, f"{uid}-w", clean_start=False, props=SESSION, **login)
    if case == "allowed":
        assert "publishing will of client" in line and "(user 'alice')" in line
        expect_will(w)
    else:
        assert ("dropped: the ACL (read at the restart, or a reload since) does not let it"
                if case == "denied-since" else
                f"the listener its client came in on (127.0.0.1:{b.port}) is not served") in line
        assert b2.stats()["counters"]["acl_publish_denied"] == 1
    expect_no_more_wills(b2, w, uid, **login)


def test_the_snapshot_will_field_reads_back_and_older_snapshots_load(broker, uid, caplog):
    b = broker()
    data_dir = b.config["data_dir"]
    drop_with_will(b, uid, delay=30)
    assert b.stop() == 0
    with open(f"{data_dir}/sessions.json", "rb") as fh:
        data = fh.read()
    (state,) = [s for s in snap.decode(data).sessions if s.client_id == f"{uid}-c"]
    will = state.will
    assert (will.topic, will.payload, will.qos, will.retain) == (f"{uid}/will", b"offline", 1,
                                                                  True)
    # Anonymous; its listener's address is kept though no ACL applied to it (one may then).
    assert will.username is None and will.listener == f"127.0.0.1:{b.port}"
    assert abs(will.due_ms - (time.time() * 1000 + 30000)) < 30000
    # Those its PUBLISH is made of (Content Type, User Properties, ...) and Message Expiry.
    assert will.properties
    # Its serial, which the exchange journal's W record names when it ends after a snapshot.
    assert will.serial >= 1
    # Encoded again, it reads the same.
    (again,) = [s for s in snap.decode(snap.encode(snap.decode(data))).sessions
                if s.client_id == f"{uid}-c"]
    assert again.will == will
    # A will written before wills had a serial reads with 0 (its W records name 0).
    doc = json.loads(data)
    for s in doc["sessions"]:
        if "will" in s:
            del s["will"]["serial"]
    assert [s.will.serial for s in snap.decode(json.dumps(doc).encode()).sessions
            if s.will is not None] == [0]
    # A snapshot written before wills were kept (no "will") still loads, without one.
    doc = json.loads(data)
    for s in doc["sessions"]:
        s.pop("will", None)
    assert all(s.will is None for s in snap.decode(json.dumps(doc).encode()).sessions)
    # A will whose QoS is out of range is left out, logged with the file and the session.
    doc = json.loads(data)
    for s in doc["sessions"]:
        if "will" in s:
            s["will"]["qos"] = 3
    with caplog.at_level(logging.ERROR, "edgebroker.snapshot"):
        restored = snap.decode(json.dumps(doc).encode(), "x/sessions.json")
    assert all(s.will is None for s in restored.sessions)
    assert f"x/sessions.json: session '{uid}-c': the QoS 3 of its delayed will" in caplog.text
