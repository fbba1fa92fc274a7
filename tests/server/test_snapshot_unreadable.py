"""A snapshot the broker's user may not read (a `sudo cp` or `chmod` mistake) was taken as
damaged: moved to sessions.json.damaged and an empty snapshot written, so every persistent
session and retained message was gone for good, even once the permission was fixed. It is no
evidence of damage: the start is refused naming the file and the fix, and nothing changes, as
for a log file the broker may not read."""

from __future__ import annotations

import os

from conftest import without_root_file_access


def test_a_snapshot_the_broker_may_not_read_refuses_the_start_and_keeps_the_sessions(
        broker, tmp_path):
    data = tmp_path / "data"
    gw = broker(data_dir=str(data))
    s = gw.client("s", clean=False)
    s.subscribe("t", qos=1)
    s.disconnect()
    p = gw.client("p")
    p.publish("keep", b"r", qos=1, retain=True)
    p.publish("t", b"m", qos=1)
    p.disconnect()
    assert gw.stop() == 0
    snapshot = data / "sessions.json"
    before = snapshot.read_bytes()
    assert b'"s"' in before
    os.chmod(snapshot, 0)

    refused = broker(data_dir=str(data), wait=False,
                     wrap=lambda cmd: without_root_file_access() + cmd)
    assert refused.proc.wait(15) == 1
    refused.stopped = True
    assert refused.wait_log(lambda ln: f"{snapshot}: cannot read: Permission denied; nothing "
                                       f"was changed" in ln), refused.log_text()
    assert "moved it to" not in refused.log_text()
    assert snapshot.read_bytes() == before      # (read as root)
    assert not (data / "sessions.json.damaged").exists()

    os.chmod(snapshot, 0o600)
    gw = broker(data_dir=str(data))
    s = gw.client("s", clean=False)
    assert s.connack.session_present
    assert s.recv_publish().payload == b"m"
    r = gw.client("r")
    r.subscribe("keep", qos=1)
    assert r.recv_publish().payload == b"r"
    assert gw.stop() == 0
