"""A delayed will (5.0 Will Delay Interval) of a session whose listener had no ACL file when
its client came in is checked, when due, against the ACL that listener has then: one a reload
put in force since, or the one the restart read (docs/protocol.md, "Wills";
docs/security.md, the ACL table)."""

from __future__ import annotations

import json
import signal

import pytest

import mqttraw5 as R
from conftest import _open_clients, toml_dumps
from core.test_mqtt5_raw import raw5
from secfiles import write_acl

pytestmark = pytest.mark.timeout(90)

SESSION = {R.SESSION_EXPIRY: 300}


def watcher(b, uid) -> R.RawClient5:
    """A persistent session subscribed to the will's topic and a marker's."""
    w = raw5(b, f"{uid}-w", props=SESSION)
    assert list(w.subscribe(f"{uid}/will", f"{uid}/marker", qos=1).codes) == [1, 1]
    w.disconnect()
    return w


def drop_with_will(b, uid, delay: int) -> None:
    """A client whose connection breaks (no DISCONNECT): its will waits ``delay`` s."""
    c = raw5(b, f"{uid}-c", props={R.SESSION_EXPIRY: 60},
             will=(f"{uid}/will", b"offline", 1, False, {R.WILL_DELAY: delay}))
    mark = b.mark()
    c.abort()
    assert b.wait_log(lambda ln: f"will of client '{uid}-c'" in ln and f"delayed {delay} s" in ln,
                      start=mark)


def reload_with_acl(b, acl) -> None:
    """SIGHUP with the configuration file now naming ``acl``."""
    b.config_path.write_text(toml_dumps(dict(b.config, acl_file=str(acl))))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload: re-read" in ln and str(acl) in ln, start=mark)


def expect_dropped(b, uid, why: str, timeout: float = 15.0) -> None:
    line = b.wait_log(lambda ln: f"will of client '{uid}-c'" in ln
                      and ("publishing" in ln or "dropped" in ln), timeout=timeout)
    assert line and f"dropped: the ACL ({why}) does not let it publish there" in line, line
    assert b.stats()["counters"]["acl_publish_denied"] == 1


def expect_only_the_marker(b, uid) -> None:
    """The watcher's session got no will: the next message it gets is a marker."""
    pub = raw5(b, f"{uid}-m")
    pub.publish(f"{uid}/marker", b"MARKER", qos=1)
    w = raw5(b, f"{uid}-w", clean_start=False, props=SESSION)
    p = w.wait_for(lambda p: p.type == R.PUBLISH, 15.0)
    assert p.topic == f"{uid}/marker", f"a will published that the ACL denies: {p!r}"
    w.ack(p)


def rules(uid) -> str:
    """Anonymous clients may read everything and write only the marker: not the will."""
    return f"topic read #\ntopic write {uid}/marker\n"


def test_a_reload_adding_an_acl_checks_a_pending_will(broker, tmp_path, uid):
    b = broker()
    watcher(b, uid)
    drop_with_will(b, uid, delay=3)
    reload_with_acl(b, write_acl(tmp_path / "acl", rules(uid)))
    expect_dropped(b, uid, "reloaded since it connected")
    expect_only_the_marker(b, uid)


@pytest.mark.parametrize("when", ["at-restart", "reload-after-restart"])
def test_a_restored_will_is_checked_against_the_acl_its_listener_has_now(
        broker, tmp_path, uid, when):
    """The will's listener had no ACL file: the snapshot keeps its address all the same, and
    the ACL that listener has after the restart (read then, or put in force by a reload
    later) applies to it."""
    b = broker()
    data_dir = b.config["data_dir"]
    watcher(b, uid)
    drop_with_will(b, uid, delay=5)
    assert b.stop() == 0
    with open(f"{data_dir}/sessions.json") as fh:
        (entry,) = [s for s in json.load(fh)["sessions"] if s["client_id"] == f"{uid}-c"]
    assert entry["will"]["listener"] == f"127.0.0.1:{b.port}"
    acl = write_acl(tmp_path / "acl", rules(uid))
    same = {"data_dir": data_dir, "listener": [{"host": "127.0.0.1", "port": b.port}]}
    if when == "at-restart":
        b2 = broker(acl_file=str(acl), **same)
    else:
        b2 = broker(**same)
        assert b2.wait_log(lambda ln: "restored 1 delayed wills" in ln and "0 due now" in ln)
        reload_with_acl(b2, acl)
    expect_dropped(b2, uid, "read at the restart, or a reload since")
    expect_only_the_marker(b2, uid)


def test_a_restored_will_no_acl_applied_to_is_published_though_its_listener_moved(
        broker, tmp_path, uid):
    """Another listener has an ACL file, the will's had none; after a restart with the will's
    listener on another port its ACL is unknown, but none applied to it: published, as
    before its listener's address was kept (only a will an ACL applied to is dropped)."""
    acl = write_acl(tmp_path / "acl", rules(uid))
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "acl_file": str(acl)},
                         {"host": "127.0.0.1", "port": 0}])
    data_dir = b.config["data_dir"]
    plain = b.listeners[1][1]
    c = R.RawClient5("127.0.0.1", plain)
    _open_clients.append(c)
    assert c.connect(f"{uid}-c", props={R.SESSION_EXPIRY: 60},
                     will=(f"{uid}/will", b"offline", 1, False, {R.WILL_DELAY: 3})).reason == 0
    mark = b.mark()
    c.abort()
    assert b.wait_log(lambda ln: f"will of client '{uid}-c'" in ln and "delayed 3 s" in ln,
                      start=mark)
    assert b.stop() == 0
    with open(f"{data_dir}/sessions.json") as fh:
        (entry,) = [s for s in json.load(fh)["sessions"] if s["client_id"] == f"{uid}-c"]
    assert entry["will"]["listener"] == f"127.0.0.1:{plain}" and entry["will"]["acl"] is False
    b2 = broker(data_dir=data_dir, listener=[
        {"host": "127.0.0.1", "port": 0, "acl_file": str(acl)}, {"host": "127.0.0.1", "port": 0}])
    line = b2.wait_log(lambda ln: f"will of client '{uid}-c'" in ln
                       and ("publishing" in ln or "dropped" in ln), timeout=15)
    assert line and "publishing" in line, line
    assert b2.stats()["counters"]["acl_publish_denied"] == 0
