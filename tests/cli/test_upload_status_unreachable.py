"""`upload status` while a broker runs but its admin socket cannot be asked (a data_dir too long
for a Unix socket path; a member of the state directory's group, the socket being 0600): it
said "broker not running" from the files, exit 0. Now it says a broker runs (it holds the log's
lock), names the socket and why it cannot be asked, exit 1. Stopped, the files are read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from conftest import REPO, as_nobody, run_cli


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
