"""`upload status` while a broker runs but its admin socket cannot be asked (a data_dir too long
for a Unix socket path; a member of the state directory's group, the socket being 0600): it
said "broker not running" from the files, exit 0. Now it says a broker runs (it holds the log's
lock), names the socket and why it cannot be asked, exit 1. Stopped, the files are read.
With the lock held and nobody listening on the socket (`upload run --once`, a broker replaying
its log before it opens the socket), the files are read too, with a line saying so, exit 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO, Proc, as_nobody, broker_command, run_cli, toml_dumps


def test_status_with_the_admin_socket_path_too_long(broker, tmp_path):
    data = tmp_path / ("d" * 110)
    b = broker(data_dir=str(data))
    assert b.wait_log(lambda line: "admin socket disabled" in line), b.log_text()
    for fmt in ("text", "json"):
        r = run_cli("upload", "status", "--data-dir", str(data), "--format", fmt)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert r.stdout == "" and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip() == (
            f"edgebroker: a broker runs on {data} (it holds the lock of {data / 'log'}) but its "
            f"admin socket {data / 'admin.sock'} cannot be asked: the path is longer than 107 "
            f"bytes (a Unix socket limit): the broker runs without it; give it a shorter "
            f"data_dir"), r.stderr
    b.stop()
    r = run_cli("upload", "status", "--data-dir", str(data), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["running"] is False, r.stderr


def test_status_as_a_member_of_the_state_directorys_group(broker):
    top = tempfile.mkdtemp(prefix="eb-upload-status-")   # not under tmp_path: nobody enters it
    b = None
    try:
        os.chmod(top, 0o711)
        data = os.path.join(top, "data")
        os.mkdir(data)
        os.chown(data, 0, 65534)
        os.chmod(data, 0o2750)                           # the group inherits what is made in it
        b = broker(data_dir=data)
        r = subprocess.run([*as_nobody(), sys.executable, "-m", "edgebroker", "upload", "status",
                            "--data-dir", data], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
        assert r.stderr.strip() == (
            f"edgebroker: a broker runs on {data} (it holds the lock of {data}/log) but its "
            f"admin socket {data}/admin.sock cannot be asked: Permission denied (only the "
            f"broker's user may ask it: run the command as that user)"), r.stderr
        b.stop()
        r = subprocess.run([*as_nobody(), sys.executable, "-m", "edgebroker", "upload", "status",
                            "--data-dir", data], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("broker not running; "), r.stderr
    finally:
        if b is not None and not b.stopped:
            b.stop()
        shutil.rmtree(top)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_status_while_upload_run_once_holds_the_log(broker, tmp_path, stop):
    """``run --once`` takes the log's lock and has no admin socket; stopped by SIGKILL, the
    broker left its socket file, which nobody listens on (connection refused)."""
    b = broker(log={"segment_bytes": 4096})
    data = b.config["data_dir"]
    c = b.client("p")
    for _ in range(40):
        c.publish("t/x", b"y" * 200, qos=1)
    c.close()
    b.stop(stop)
    assert os.path.exists(os.path.join(data, "admin.sock")) == (stop == signal.SIGKILL)
    config = tmp_path / "upload.toml"
    config.write_text(toml_dumps({"data_dir": data, "listener": [{"host": "127.0.0.1", "port": 0}],
                                  "upload": {"url": f"file://{tmp_path}/no-landing"}}))
    run = Proc([*broker_command(), "upload", "run", "--once", "-c", str(config)])
    try:
        run.wait_line("upload failed: ")        # it holds the lock and retries
        held = (f"another process holds the lock of {data}/log and nobody answers on "
                f"{data}/admin.sock (a broker starting, or `edgebroker upload run --once`)")
        r = run_cli("upload", "status", "--data-dir", data)
        assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
        lines = r.stdout.splitlines()
        assert lines[0] == f"{held}: what the log directory says now", r.stdout
        assert lines[1].startswith("uploaded up to offset 0 (next offset 40)"), r.stdout
        r = run_cli("upload", "status", "--data-dir", data, "--format", "json")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["log_held"] is True and st["running"] is False and st["next_offset"] == 40
    finally:
        run.kill(signal.SIGTERM)
    r = run_cli("upload", "status", "--data-dir", data, "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["log_held"] is False, r.stderr
