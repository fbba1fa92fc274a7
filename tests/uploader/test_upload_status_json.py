"""`upload status --format json` has one shape whether a broker runs or not (docs/upload.md):
it was {"running": true, "upload": {...}} with a broker, the files' keys and `log_held`
without one, so a script reading `uploaded_offset` broke on one side or the other."""

from __future__ import annotations

import json

from conftest import run_cli

from .test_uploader import publish, upload_config, uploaded, wait_until

KEYS = {"running", "log_held", "uploaded_offset", "next_offset", "backlog_records",
        "backlog_bytes", "backlog_sealed_segments", "backlog_age_seconds", "intent", "upload"}


def status(data: str) -> dict:
    r = run_cli("upload", "status", "--data-dir", data, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_status_json_has_the_same_keys_with_the_broker_up_and_down(broker, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    data = str(tmp_path / "data")
    b = broker(data_dir=data, upload=upload_config(landing, batch_max_age=1))
    publish(b, 0, 5)
    wait_until(lambda: uploaded(b) == 5, what="the first batch")
    assert b.admin("upload_pause")["changed"]
    publish(b, 5, 3)
    wait_until(lambda: b.stats()["upload"]["backlog_bytes"], what="the backlog seen")
    up = status(data)
    assert set(up) == KEYS, up
    assert (up["running"], up["log_held"], up["intent"]) == (True, False, None)
    assert (up["uploaded_offset"], up["next_offset"], up["backlog_records"]) == (5, 8, 3)
    assert up["backlog_bytes"] > 0 and up["upload"]["state"] == "paused"
    assert up["upload"]["uploaded_offset"] == 5
    b.stop()
    down = status(data)
    assert set(down) == KEYS, down
    assert (down["running"], down["log_held"], down["upload"]) == (False, False, None)
    assert (down["uploaded_offset"], down["next_offset"], down["backlog_records"]) == (5, 8, 3)
    assert down["backlog_bytes"] == up["backlog_bytes"]


def test_status_json_of_a_running_broker_without_uploading_reads_the_files(broker, tmp_path):
    """Uploading off, the broker does not measure the backlog: the files say it."""
    data = str(tmp_path / "data")
    b = broker(data_dir=data)
    publish(b, 0, 4)
    up = status(data)
    assert set(up) == KEYS, up
    assert (up["running"], up["log_held"], up["upload"]) == (True, False, None)
    assert (up["uploaded_offset"], up["next_offset"], up["backlog_records"]) == (0, 4, 4)
    b.stop()
