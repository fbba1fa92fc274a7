"""A snapshot whose `written_ms` is no time a clock shows (past year 9999, before 1970) is a
damaged snapshot: `inspect sessions` says so in one line (exit 1, no traceback), and the broker
moves it aside and starts without it, as for any other damaged snapshot."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.mark.parametrize("written_ms", [10 ** 20, -10 ** 15, -1],
                         ids=["past-9999", "before-year-1", "before-1970"])
def test_written_ms_out_of_range_is_a_damaged_snapshot(broker, uid, written_ms):
    b = broker()
    b.client(f"{uid}-s", clean=False).subscribe(f"{uid}/t")
    b.stop()
    data_dir = b.config["data_dir"]
    path = f"{data_dir}/sessions.json"
    with open(path) as fh:
        doc = json.load(fh)
    doc["written_ms"] = written_ms
    with open(path, "w") as fh:
        json.dump(doc, fh)
    r = run_cli("inspect", "sessions", "--data-dir", data_dir)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "sessions.json: damaged snapshot" in r.stderr and str(written_ms) in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda line: "sessions.json" in line and "damaged" in line
                       and "written_ms" in line), b2.log_text()
    assert not b2.client(f"{uid}-s", clean=False).connack.session_present


def test_written_ms_in_range_is_read(broker, uid):
    """The last millisecond of year 9999 is still a time: shown, exit 0."""
    b = broker()
    b.client(f"{uid}-s", clean=False).subscribe(f"{uid}/t")
    b.stop()
    path = f"{b.config['data_dir']}/sessions.json"
    with open(path) as fh:
        doc = json.load(fh)
    doc["written_ms"] = 253_402_300_799_999
    with open(path, "w") as fh:
        json.dump(doc, fh)
    r = run_cli("inspect", "sessions", "--data-dir", b.config["data_dir"])
    assert r.returncode == 0, r.stderr
    assert "snapshot of 9999-12-31T23:59:59.999Z" in r.stdout, r.stdout
