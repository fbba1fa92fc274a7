"""`inspect sessions` shows whether each session was connected at the snapshot (or offline since
when) and when it expires: its Session Expiry Interval (5.0), at most persistent_client_expiration
of `-c FILE`, or that setting (3.1.1), counted from the disconnect; a session past it while the
broker is stopped is shown expired, and the next start removes it (sessions7 #2: no state and no
expiry were shown, so an expired session looked live)."""

from __future__ import annotations

import json
import re
import threading
import time

import mqttraw5 as R
from conftest import run_cli, toml_dumps, wait_for_snapshot


def _offline5(b, client_id: str, expiry: int, topic_filter: str) -> None:
    c = R.RawClient5(b.host, b.port)
    c.connect(client_id, clean_start=False, props={R.SESSION_EXPIRY: expiry})
    c.subscribe((topic_filter, 0x01))
    c.disconnect()


def _inspect(*where: str) -> tuple[dict, dict]:
    """The sessions of `inspect sessions ...` as JSON and as text rows (id -> line), by id."""
    r = run_cli("inspect", "sessions", *where, "--format", "json")
    assert r.returncode == 0, r.stderr
    shown = {s["client_id"]: s for s in json.loads(r.stdout)["sessions"]}
    r = run_cli("inspect", "sessions", *where)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:5] == ["CLIENT", "ID", "STATE", "EXPIRES", "SUBSCRIPTIONS"], lines
    rows = {line.split()[0]: line for line in lines[1:-1]}
    return shown, {**rows, "": lines[-1]}


def test_state_and_expiry_of_connected_and_offline_sessions(broker, uid, tmp_path):
    b = broker()
    data = b.config["data_dir"]
    _offline5(b, f"{uid}-never", 0xFFFFFFFF, f"{uid}/a/#")
    _offline5(b, f"{uid}-hour", 3600, f"{uid}/b/#")
    v3 = b.client(f"{uid}-v3", clean=False)
    v3.subscribe(f"{uid}/c/#", qos=1)
    v3.disconnect()
    live = R.RawClient5(b.host, b.port)
    live.connect(f"{uid}-live", clean_start=False, props={R.SESSION_EXPIRY: 600})
    live.subscribe((f"{uid}/d/#", 0x01))
    for name in ("never", "hour", "v3"):
        wait_for_snapshot(data, f"{uid}-{name}", pred=lambda s: s["offline_ms"] is not None)
    snap = wait_for_snapshot(data, f"{uid}-live",
                             pred=lambda s: [f"{uid}/d/#", 1] in s["subscriptions"])
    offline_ms = {s["client_id"]: s["offline_ms"] for s in snap["sessions"]}
    assert offline_ms[f"{uid}-live"] is None

    shown, rows = _inspect("--data-dir", data)
    state = {k: {f: shown[f"{uid}-{k}"][f] for f in ("online", "offline_ms", "expiry_seconds",
                                                     "expires_ms", "expired")}
             for k in ("live", "never", "hour", "v3")}
    hour_off = offline_ms[f"{uid}-hour"]
    assert state == {
        "live": {"online": True, "offline_ms": None, "expiry_seconds": 600, "expires_ms": None,
                 "expired": False},
        "never": {"online": False, "offline_ms": offline_ms[f"{uid}-never"],
                  "expiry_seconds": None, "expires_ms": None, "expired": False},
        "hour": {"online": False, "offline_ms": hour_off, "expiry_seconds": 3600,
                 "expires_ms": hour_off + 3_600_000, "expired": False},
        "v3": {"online": False, "offline_ms": offline_ms[f"{uid}-v3"], "expiry_seconds": None,
               "expires_ms": None, "expired": False},
    }, state
    assert re.search(r"\bonline\s+10m00s after it goes offline\s", rows[f"{uid}-live"])
    assert re.search(r"\boffline 0m0\ds\s+never\s", rows[f"{uid}-never"]), rows
    assert re.search(r"\boffline 0m0\ds\s+in 59m[45]\ds\s", rows[f"{uid}-hour"]), rows
    assert re.search(r"\boffline 0m0\ds\s+never\s", rows[f"{uid}-v3"]), rows
    assert "reading from the log, 0 expired)" in rows[""], rows[""]

    # persistent_client_expiration of -c FILE caps every one (5.0 sessions that asked for
    # longer, or never, too), and sets that of 3.1.1 sessions.
    capped = tmp_path / "capped.toml"
    limits = {**b.config.get("limits", {}), "persistent_client_expiration": 60}
    capped.write_text(toml_dumps({**b.config, "limits": limits}))
    shown, rows = _inspect("--data-dir", data, "-c", str(capped))
    assert {k: shown[f"{uid}-{k}"]["expiry_seconds"] for k in ("live", "never", "hour", "v3")} \
        == dict.fromkeys(("live", "never", "hour", "v3"), 60)
    assert shown[f"{uid}-v3"]["expires_ms"] == offline_ms[f"{uid}-v3"] + 60_000
    assert re.search(r"\bonline\s+1m00s after it goes offline\s", rows[f"{uid}-live"])
    for name in ("never", "hour", "v3"):
        assert re.search(r"\boffline 0m0\ds\s+in 0m5\ds\s", rows[f"{uid}-{name}"]), rows


def test_a_session_past_its_expiry_while_stopped_is_shown_expired(broker, uid):
    b = broker()
    data = b.config["data_dir"]
    _offline5(b, f"{uid}-short", 3, f"{uid}/#")     # stopped within its 3 s
    _offline5(b, f"{uid}-long", 3600, f"{uid}/#")
    wait_for_snapshot(data, f"{uid}-long", pred=lambda s: s["offline_ms"] is not None)
    assert b.stop() == 0
    with open(f"{data}/sessions.json") as fh:
        went = {s["client_id"]: s["offline_ms"] for s in json.load(fh)["sessions"]}
    # Until its 3 s have passed (one bounded wait on the wall clock, no retry).
    threading.Event().wait(max(0.0, (went[f"{uid}-short"] + 3100) / 1000 - time.time()))

    shown, rows = _inspect("--data-dir", data)
    short = shown[f"{uid}-short"]
    assert (short["online"], short["expiry_seconds"], short["expires_ms"], short["expired"]) \
        == (False, 3, went[f"{uid}-short"] + 3000, True), short
    assert shown[f"{uid}-long"]["expired"] is False
    assert re.search(r"\boffline 0m0\ds\s+expired \(removed at the next start\)\s",
                     rows[f"{uid}-short"]), rows
    assert re.search(r"\bin 59m[45]\ds\s", rows[f"{uid}-long"]), rows
    assert "reading from the log, 1 expired)" in rows[""], rows[""]

    b2 = broker(data_dir=data)                 # as shown: removed at the start, the other kept
    for name, present in (("short", False), ("long", True)):
        c = R.RawClient5(b2.host, b2.port)
        assert c.connect(f"{uid}-{name}", clean_start=False,
                         props={R.SESSION_EXPIRY: 60}).session_present is present, name
        c.disconnect()
