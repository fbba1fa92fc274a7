"""A delayed will that ended after the last snapshot (published, or cancelled by its client
coming back), then a crash (SIGKILL): the restart does not restore it, so a QoS 2 will is
delivered exactly once and a cancelled one not at all (the exchange journal's ``W`` record,
core.exchanges; docs/protocol.md, "Wills").

The snapshot is kept from being written after the one holding the will: its temporary file's
name is taken by a folder (the writer fails and retries), so the crash always comes before a
snapshot without the will, as it does within about a second in production."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

import mqttraw5 as R
from conftest import wait_for_snapshot
from core.test_wills_restart import SESSION, raw5

pytestmark = pytest.mark.timeout(90)

def block_snapshots(data_dir: str) -> str:
    """No snapshot is written from now on (until the folder returned is removed)."""
    folder = os.path.join(data_dir, "sessions.json.tmp")
    os.mkdir(folder)
    return folder


def will_in_snapshot(data_dir: str, client_id: str) -> dict | None:
    with open(f"{data_dir}/sessions.json") as fh:
        doc = json.load(fh)
    (entry,) = [s for s in doc["sessions"] if s["client_id"] == client_id]
    return entry.get("will")


def drop_with_will(b, uid, delay: int) -> None:
    """A 5.0 client with a QoS 2 will whose connection breaks: its will waits ``delay`` s."""
    c = raw5(b, f"{uid}-c", props={R.SESSION_EXPIRY: 60},
             will=(f"{uid}/will", b"offline", 2, False, {R.WILL_DELAY: delay}))
    mark = b.mark()
    c.abort()
    assert b.wait_log(lambda ln: f"will of client '{uid}-c'" in ln and f"delayed {delay} s" in ln,
                      start=mark)
    # The snapshot written after the drop holds it; none is written after this one.
    wait_for_snapshot(b.config["data_dir"], f"{uid}-c", pred=lambda s: "will" in s)


def next_publish(c, timeout: float = 15.0):
    return c.wait_for(lambda p: p.type == R.PUBLISH, timeout)


def receive_will(w) -> None:
    """The QoS 2 will, its exchange finished (PUBCOMP handled before the PINGRESP)."""
    p = next_publish(w)
    assert (p.topic, p.payload, p.qos) == (w.will_topic, b"offline", 2), p
    w.ack(p)
    assert w.ping() == []


def expect_no_more_wills(b, w, uid) -> None:
    """The next message the watcher gets is a marker published now: no (second) will."""
    pub = raw5(b, f"{uid}-m")
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    p = next_publish(w)
    assert p.topic == f"{uid}/marker", f"a will published when it must not be: {p!r}"
    w.ack(p)


def watcher(b, uid, clean_start: bool = True) -> R.RawClient5:
    """A persistent QoS 2 subscriber of the will's topic and a marker's."""
    w = raw5(b, f"{uid}-w", clean_start=clean_start, props=SESSION)
    if clean_start:
        assert list(w.subscribe(f"{uid}/will", f"{uid}/marker", qos=2).codes) == [2, 2]
    w.will_topic = f"{uid}/will"
    return w


def crash_and_restart(broker, b, blocked: str, client_id: str | None = None):
    """SIGKILL, then a start on the same state; ``client_id``: the snapshot on disk at the
    crash must hold its session's will (the crash came before a snapshot without it)."""
    data_dir = b.config["data_dir"]
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    if client_id is not None:
        b.will_at_crash = will_in_snapshot(data_dir, client_id)
        assert b.will_at_crash is not None, "a snapshot without the will came first"
    os.rmdir(blocked)
    return broker(data_dir=data_dir)


def test_a_qos2_delayed_will_published_before_a_crash_is_delivered_once(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    w = watcher(b, uid)
    drop_with_will(b, uid, delay=3)
    blocked = block_snapshots(data_dir)
    receive_will(w)
    assert b.wait_log(lambda ln: f"publishing will of client '{uid}-c'" in ln)
    b2 = crash_and_restart(broker, b, blocked, f"{uid}-c")
    w = watcher(b2, uid, clean_start=False)
    assert w.connack.session_present
    expect_no_more_wills(b2, w, uid)
    assert not any("publishing will of" in ln for ln in b2.logs)
    assert b2.wait_log(lambda ln: "1 delayed wills ended" in ln and "not restored" in ln)


def test_a_will_cancelled_by_its_client_before_a_crash_is_not_published(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid).disconnect()
    drop_with_will(b, uid, delay=5)
    blocked = block_snapshots(data_dir)
    mark = b.mark()
    back = raw5(b, f"{uid}-c", clean_start=False, props={R.SESSION_EXPIRY: 60})
    assert back.connack.session_present
    assert b.wait_log(lambda ln: f"will of client '{uid}-c'" in ln
                      and "connected again within the Will Delay Interval" in ln, start=mark)
    assert back.ping() == []
    b2 = crash_and_restart(broker, b, blocked, f"{uid}-c")
    wait_until_ms(b.will_at_crash["due_ms"])      # (a will restored would be published now)
    w = watcher(b2, uid, clean_start=False)
    expect_no_more_wills(b2, w, uid)
    assert not any("publishing will of" in ln for ln in b2.logs)
    assert b2.wait_log(lambda ln: "1 delayed wills ended" in ln and "not restored" in ln)


def test_a_will_kept_at_a_stop_and_published_by_the_next_start_is_not_published_again(
        broker, uid):
    """A will whose session ended at the stop: the next start publishes it at once; a crash
    before that start's first snapshot is on disk does not publish it a second time."""
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid).disconnect()
    raw5(b, f"{uid}-c", will=(f"{uid}/will", b"offline", 2, False, {}))    # Session Expiry 0
    assert b.stop() == 0
    blocked = block_snapshots(data_dir)
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: f"publishing will of client '{uid}-c'" in ln)
    w = watcher(b2, uid, clean_start=False)
    receive_will(w)
    b3 = crash_and_restart(broker, b2, blocked)
    w = watcher(b3, uid, clean_start=False)
    expect_no_more_wills(b3, w, uid)
    assert not any("publishing will of" in ln for ln in b3.logs)
    assert b3.wait_log(lambda ln: "1 delayed wills ended" in ln and "not restored" in ln)


def wait_until_ms(wall_ms: int, timeout: float = 30.0) -> None:
    """Wait until the wall clock is past ``wall_ms`` (at most ``timeout`` s)."""
    left = (wall_ms - time.time() * 1000) / 1000
    assert left < timeout, f"{left:.1f} s to wait, more than {timeout}"
    if left > 0:
        threading.Event().wait(left + 0.2)
