"""Commands run as root on a state directory another user owns (the service's: systemd's
``DynamicUser=`` gives it a uid such as 61234): ``upload run --once`` gives what it wrote
there to that user, so the broker starts again as that user; ``serve`` refuses, and
``config check`` warns (edgebroker/cli/state_owner.py, docs/upload.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, Broker, broker_command, run_cli, toml_dumps

SERVICE_UID = 61234     # a uid no one has here, as a dynamic user's


@pytest.fixture
def top():
    """A directory in /tmp others may enter (pytest's tmp_path is root's, 0700)."""
    assert os.geteuid() == 0, "these tests run commands as another user: run them as root"
    path = Path(tempfile.mkdtemp(prefix="edgebroker-owner-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def service_dir(path: Path) -> Path:
    path.mkdir()
    os.chown(path, SERVICE_UID, SERVICE_UID)
    os.chmod(path, 0o700)
    return path


def as_service(cmd: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={SERVICE_UID}", f"--regid={SERVICE_UID}", "--clear-groups",
            *cmd]


def not_the_services(state: Path) -> list[str]:
    return [f"{p} {p.lstat().st_uid}:{p.lstat().st_gid}" for p in state.rglob("*")
            if (p.lstat().st_uid, p.lstat().st_gid) != (SERVICE_UID, SERVICE_UID)]


def test_upload_run_once_as_root_leaves_the_state_directory_to_the_service(top):
    state = service_dir(top / "state")
    landing = service_dir(top / "landing")
    config = {"data_dir": str(state), "log_level": "info", "sys_interval": 0,
              "listener": [{"host": "127.0.0.1", "port": 0}], "log": {"segment_bytes": 4096}}
    first = Broker(top / "first", config, wrap=as_service).wait_ready()
    client = first.client("filler")
    for i in range(150):
        client.publish("a/b", f"message {i} with some padding to fill segments", qos=1)
    client.close()
    assert first.stop() == 0, first.log_text()
    assert not_the_services(state) == []
    sealed = sorted(int(p.stem) for p in (state / "log").glob("*.seg"))
    assert len(sealed) >= 3

    upload = top / "upload.toml"
    upload.write_text(toml_dumps({**config, "upload": {"url": f"file://{landing}",
                                                       "gateway_id": "gw1"}}))
    r = subprocess.run([*broker_command(), "upload", "run", "--once", "-c", str(upload)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"uploaded up to offset {sealed[-1]}" in r.stdout, r.stdout
    assert not_the_services(state) == [], "root-owned files left in the service's directory"

    # The service starts again as its user, on the log root has shipped.
    again = Broker(top / "again", config, wrap=as_service).wait_ready()
    status = Path(f"/proc/{again.proc.pid}/status").read_text()
    assert f"\nUid:\t{SERVICE_UID}\t" in status, status
    client = again.client("after")
    assert client.publish("a/b", "after", qos=1) is not None
    client.close()
    assert again.stop() == 0, again.log_text()
    assert "Permission denied" not in again.log_text(), again.log_text()
    assert not_the_services(state) == []


def test_serve_as_root_refuses_the_state_directory_of_another_user(top):
    state = service_dir(top / "state")
    r = subprocess.run([*broker_command(), "serve", "--listen", "127.0.0.1:0", "--data-dir",
                        str(state)], cwd=REPO, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    assert (f"edgebroker: the state directory {state} belongs to uid {SERVICE_UID}, not root"
            in r.stderr), r.stderr
    assert f"--reuid={SERVICE_UID}" in r.stderr, r.stderr
    assert list(state.iterdir()) == [], "serve wrote into the directory it refused"


def test_config_check_as_root_warns_of_the_directory_serve_would_refuse(top):
    """(ops5: `sudo edgebroker config check` said OK, then `sudo edgebroker serve` refused.)
    A warning, not a problem: root checks the unit's directory by hand too (docs/deploy.md),
    and the unit runs serve as its owner. The service's own check has nothing to say."""
    state = service_dir(top / "state")
    config = top / "c.toml"
    config.write_text(f'data_dir = "{state}"\n')
    warning = (f"warning: the state directory {state} belongs to uid {SERVICE_UID}, not root: "
               f"`edgebroker serve` run as root (by hand) refuses it; the systemd unit, or "
               f"`setpriv --reuid={SERVICE_UID} --regid={SERVICE_UID} --clear-groups "
               f"edgebroker serve ...`, runs it as that user\n")
    r = run_cli("config", "check", "-c", str(config))
    assert (r.returncode, r.stderr) == (0, warning), r.stderr
    r = run_cli("config", "check", "-c", str(config), "--format", "json")
    assert json.loads(r.stdout)["warnings"] == [warning.removeprefix("warning: ").strip()]
    r = subprocess.run(as_service([*broker_command(), "config", "check", "-c", str(config)]),
                       cwd=REPO, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert list(state.iterdir()) == []


def test_a_link_planted_in_the_state_directory_does_not_hand_over_roots_files(top):
    """The state directory is the other user's to change while root works in it: a hard link
    or a symbolic link to one of root's files elsewhere is left alone (root's file would
    become that user's), root's own files of the log are handed over."""
    from edgebroker.cli.state_owner import hand_over
    secret = top / "roots-file"
    secret.write_text("root's")
    state = service_dir(top / "state")
    os.link(secret, state / "hard")
    os.symlink(secret, state / "soft")
    (state / "log").mkdir()
    (state / "log" / "00000000000000000000.idx").write_bytes(b"x")
    assert hand_over(str(state), (SERVICE_UID, SERVICE_UID)) == 2   # log/ and its file
    assert secret.stat().st_uid == 0 and os.lstat(state / "soft").st_uid == 0
    assert (state / "log" / "00000000000000000000.idx").stat().st_uid == SERVICE_UID
