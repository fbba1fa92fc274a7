"""Persistent sessions: max_sessions and persistent_client_expiration (docs/limits.md,
"Sessions"), with a real broker and real clients, across a restart; and, in-process with a
clock of our own, what an expiry releases."""

import json
import signal
import threading
import time

import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import run_cli, wait_for_snapshot
from edgebroker import config
from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.log import CommitLog
from edgebroker.core.broker import Broker
from edgebroker.core.catchup import NO_HOLD
from edgebroker.core.testing import FakeTransport
from edgebroker.core.timers import Timer


def test_max_sessions_refuses_a_new_persistent_session_but_not_a_known_one(broker, uid):
    # Refusals from one address are logged once per interval (the tests' default logs each).
    b = broker(limits={"max_sessions": 3}, refusal_log_interval=60)
    for i in range(3):
        c = b.client(f"{uid}-p{i}", clean=False)
        c.subscribe(f"{uid}/p{i}", qos=1)
        c.disconnect()
    mark = b.mark()
    for i in (3, 4):                            # one more persistent session each: refused
        raw = b.raw()
        ack = raw.connect(f"{uid}-p{i}", clean=False)
        assert ack.rc == 3 and not ack.session_present
        assert raw.expect_closed(5)
    clean = b.client(f"{uid}-clean")            # clean sessions are not counted
    back = b.raw()                              # an existing session resumes
    ack = back.connect(f"{uid}-p0", clean=False)
    assert ack.rc == 0 and ack.session_present
    s = b.stats()
    assert s["sessions"] == 4                   # 3 persistent + 1 clean
    assert s["refused"]["max_sessions"] == 2 and s["limit_hits"]["max_sessions"] == 2
    lines = [ln for ln in b.logs[mark:] if "max_sessions" in ln]
    assert len(lines) == 1 and f"{uid}-p3" in lines[0] and "CONNACK 3" in lines[0]
    # A persistent session that goes (its client id connects with clean session 1) frees
    # its place.
    b.client(f"{uid}-p1", clean=True).disconnect()
    fresh = b.raw()
    assert fresh.connect(f"{uid}-p3", clean=False).rc == 0
    clean.disconnect()


def _snapshot(data_dir: str) -> dict:
    with open(f"{data_dir}/sessions.json") as fh:
        return json.load(fh)


def _wait_snapshot_without(data_dir: str, client_id: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        doc = _snapshot(data_dir)
        if all(s["client_id"] != client_id for s in doc["sessions"]):
            return doc
        assert time.monotonic() < deadline, f"{client_id} still in the snapshot"
        pause.wait(0.05)


def test_an_offline_session_expires_and_a_connected_one_does_not(broker, uid):
    b = broker(limits={"persistent_client_expiration": 1})
    data_dir = b.config["data_dir"]
    gone = b.client(f"{uid}-gone", clean=False)
    gone.subscribe(f"{uid}/t", qos=1)
    kept = b.client(f"{uid}-kept", clean=False)
    kept.subscribe(f"{uid}/t", qos=1)
    mark = b.mark()
    gone.disconnect()
    kept.disconnect()
    kept = b.raw()                              # back within the second: its timer is off
    assert kept.connect(f"{uid}-kept", clean=False).session_present
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/t", b"for the offline one", qos=1)
    assert kept.recv_publish().payload == b"for the offline one"
    wait_for_snapshot(data_dir, f"{uid}-gone", pred=lambda s: s["offline_ms"] is not None)
    line = b.wait_log(f"persistent session '{uid}-gone' removed", timeout=5, start=mark)
    assert line and "persistent_client_expiration 1 s" in line
    s = b.stats()
    assert s["counters"]["sessions_expired"] == 1
    assert s["sessions"] == 2 and s["sessions_behind"] == 0  # its cursor went with it
    doc = _wait_snapshot_without(data_dir, f"{uid}-gone")
    assert [x["client_id"] for x in doc["sessions"]] == [f"{uid}-kept"]
    listed = run_cli("inspect", "sessions", "--data-dir", data_dir, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [x["client_id"] for x in json.loads(listed.stdout)["sessions"]] == [f"{uid}-kept"]
    again = b.raw()
    ack = again.connect(f"{uid}-gone", clean=False)
    assert ack.rc == 0 and not ack.session_present
    assert again.ping() == []                   # nothing of the old session is sent
    assert kept.ping() == []


def test_expiries_not_logged_are_reported_at_shutdown(broker, uid):
    """Sessions expiring together: the first is logged, the others only counted; with no
    expiry after them the count was never logged (only the next expiry said it). The stop
    logs the last of them with their number."""
    b = broker(limits={"persistent_client_expiration": 1})
    for i in range(3):
        c = b.client(f"{uid}-{i}", clean=False)
        c.subscribe(f"{uid}/t", qos=1)
        c.disconnect()
    assert b.wait_log(f"persistent session '{uid}-", timeout=10)
    deadline = time.monotonic() + 10
    while b.stats()["counters"]["sessions_expired"] < 3:
        assert time.monotonic() < deadline, "the sessions did not all expire"
        threading.Event().wait(0.05)
    mark = b.mark()
    assert b.stop() == 0
    line = b.wait_log("that were not logged when they came", start=mark, timeout=1)
    assert line and f"persistent session '{uid}-" in line and "the last of 2 like this" in line


def test_expiry_counts_from_the_disconnect_across_a_restart(broker, uid):
    """The snapshot keeps when each session went offline: after a restart a session offline
    for longer than persistent_client_expiration is removed at once, one offline for less is
    kept with its time, and one without the field (connected when the snapshot was written,
    or an older snapshot) counts from the restart."""
    b = broker()
    data_dir = b.config["data_dir"]
    for name in ("old", "recent", "unknown"):
        c = b.client(f"{uid}-{name}", clean=False)
        c.subscribe(f"{uid}/{name}", qos=1)
        c.disconnect()
    for name in ("old", "recent", "unknown"):
        wait_for_snapshot(data_dir, f"{uid}-{name}", pred=lambda s: s["offline_ms"] is not None)
    assert b.stop() == 0
    doc = _snapshot(data_dir)
    offline = {s["client_id"]: s["offline_ms"] for s in doc["sessions"]}
    for s in doc["sessions"]:
        if s["client_id"] == f"{uid}-old":
            s["offline_ms"] -= 7200 * 1000      # as if it went offline two hours ago
        elif s["client_id"] == f"{uid}-unknown":
            del s["offline_ms"]                 # written before the field was kept
    with open(f"{data_dir}/sessions.json", "w") as fh:
        json.dump(doc, fh)
    restarted = int(time.time() * 1000)
    b2 = broker(data_dir=data_dir, limits={"persistent_client_expiration": 3600})
    assert b2.wait_log(f"persistent session '{uid}-old' removed", timeout=5)
    after = _wait_snapshot_without(data_dir, f"{uid}-old")
    times = {s["client_id"]: s["offline_ms"] for s in after["sessions"]}
    assert set(times) == {f"{uid}-recent", f"{uid}-unknown"}
    assert abs(times[f"{uid}-recent"] - offline[f"{uid}-recent"]) < 100  # not the restart time
    assert times[f"{uid}-unknown"] >= restarted
    assert b2.stats()["counters"]["sessions_expired"] == 1
    for name, present in (("old", False), ("recent", True), ("unknown", True)):
        raw = b2.raw()
        assert raw.connect(f"{uid}-{name}", clean=False).session_present is present


def test_a_session_connected_at_a_crash_is_kept_whatever_the_snapshots_age(broker, uid):
    """A crash of a broker whose last snapshot was written long before (an idle broker
    writes none): a session connected until the crash counted as offline since that
    snapshot and was removed at the restart, with the messages it was owed, though its
    client came straight back. It counts from the restart now."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-sub", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    wait_for_snapshot(data_dir, f"{uid}-sub", pred=lambda s: s["subscriptions"])
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/t", b"owed", qos=1)     # acknowledged; the subscriber does not read
    assert b.stop(signal.SIGKILL) != 0
    doc = _snapshot(data_dir)
    [state] = [s for s in doc["sessions"] if s["client_id"] == f"{uid}-sub"]
    assert state["offline_ms"] is None          # connected when it was written
    doc["written_ms"] -= 7200 * 1000            # as if written two hours before the crash
    with open(f"{data_dir}/sessions.json", "w") as fh:
        json.dump(doc, fh)
    b2 = broker(data_dir=data_dir, limits={"persistent_client_expiration": 3600})
    again = b2.raw()
    assert again.connect(f"{uid}-sub", clean=False).session_present is True
    p = again.expect(m.PUBLISH, 10)
    assert (p.topic, p.payload) == (f"{uid}/t", b"owed")
    assert b2.stats()["counters"]["sessions_expired"] == 0


# ----- in-process, with our own clock -------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def core(tmp_path):
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(segment_bytes=64 * 1024))
    cfg = config.Config(limits=config.Limits(persistent_client_expiration=60))
    clock = Clock()
    broker = Broker(cfg, clock, commit_log=log, wall_ms=lambda: time.time_ns() // 1_000_000)
    broker.clock_ = clock
    yield broker
    log.close()


def _session(broker, client_id: str, clean: bool = False, subscribe: bool = True):
    transport = FakeTransport(client_id)
    client = transport.client = broker.connection_made(transport)
    client.data_received(m.connect(client_id, clean=clean, keepalive=0))
    if subscribe:
        client.data_received(m.subscribe(1, [("t/#", 1)]))
    return client


def test_expiry_releases_the_cursor_and_its_hold_on_the_log(core):
    clock = core.clock_
    sub = _session(core, "sub")
    sub.data_received(m.disconnect())
    pub = _session(core, "pub", clean=True, subscribe=False)
    pub.data_received(m.publish("t/1", b"x", qos=1, packet_id=1))
    core.end_pass()
    session = core.sessions["sub"]
    assert session.cursor is not None and session in core.behind
    core.check_cursors(clock.now)
    assert core.journal.log.hold_offset == session.cursor.floor
    clock.now += 59
    core.tick(clock.now)
    assert "sub" in core.sessions
    clock.now += 1
    core.tick(clock.now)
    assert "sub" not in core.sessions and not core.behind
    assert core.persistent_sessions == 0 and core.stats.sessions_expired == 1
    core.check_cursors(clock.now)
    assert core.journal.log.hold_offset == NO_HOLD


def test_cycling_persistent_and_clean_sessions_adds_no_heap_entries(core):
    """A client id that leaves a persistent session and then connects clean (dropping it)
    reuses the dropped session's expiry timer: the deadline heap does not grow."""
    def cycle(i):
        c = _session(core, f"c{i}", subscribe=False)
        c.data_received(m.disconnect())
        c = _session(core, f"c{i}", clean=True, subscribe=False)
        c.data_received(m.disconnect())

    def timers():  # the heap's Timer entries (closed clients' entries are item 1's business)
        return sum(1 for entry in core._timers if isinstance(entry[1], Timer))

    cycle(0)
    before = timers()
    for i in range(1, 200):
        cycle(i)
    assert timers() <= before + 1
    assert core.persistent_sessions == 0 and not core.sessions


@pytest.mark.parametrize("asked", [None, 0xFFFFFFFF, 86400], ids=["3.1.1", "never", "day"])
def test_a_reload_applies_the_expiration_to_sessions_already_offline(core, asked):
    """Counted from the disconnect, not the reload. It also caps a 5.0 Session Expiry
    Interval: set by a reload (or a restart) after the session's CONNECT, it applied to 3.1.1
    sessions only; the 5.0 ones that asked for longer (paho's default: never) stayed
    (sessions7)."""
    clock = core.clock_
    core.apply_config(config.Config(limits=config.Limits(persistent_client_expiration=0)))
    if asked is None:
        _session(core, "a").data_received(m.disconnect())
    else:
        transport = FakeTransport("a")
        client = transport.client = core.connection_made(transport)
        client.data_received(R.connect5("a", clean_start=False, keepalive=0,
                                        props={R.SESSION_EXPIRY: asked}))
        client.data_received(R.disconnect5())
    clock.now += 100
    core.tick(clock.now)
    assert "a" in core.sessions                 # 0: never
    core.apply_config(config.Config(limits=config.Limits(persistent_client_expiration=150)))
    clock.now += 49
    core.tick(clock.now)
    assert "a" in core.sessions                 # offline for 149 s
    clock.now += 1
    core.tick(clock.now)
    assert "a" not in core.sessions and core.stats.sessions_expired == 1


def test_a_cap_past_the_four_byte_field_is_its_largest_value(broker, uid):
    """persistent_client_expiration above 0xFFFFFFFF (allowed: 0 or more) capped a 5.0
    client's "never" to itself, which the CONNACK's four-byte Session Expiry Interval cannot
    hold: an internal error, no CONNACK, for every such client (diff33)."""
    b = broker(limits={"persistent_client_expiration": 5_000_000_000})
    c = R.RawClient5(b.host, b.port)
    c.send(R.connect5(uid, clean_start=False, props={R.SESSION_EXPIRY: 0xFFFFFFFF}))
    ack = c.expect(R.CONNACK)
    assert ack.reason == 0 and ack.properties[R.SESSION_EXPIRY] == 0xFFFFFFFE, ack
    c.close()
    assert not any("Traceback" in ln or "internal error" in ln for ln in b.logs), b.log_text()
