"""A configuration file holding a secret (a bridge's password, the uploader's secret key or
session token) that other users can read: `config check` and `serve` (at start and at each
reload) warn, naming the file, its permissions and the keys; the file is still used."""

import json
import os
import signal

import pytest

from conftest import run_cli

BRIDGE = ('[[bridge]]\nname = "up"\naddress = "127.0.0.1:1"\ntopic = [{pattern = "a/#"}]\n'
          'username = "gw"\npassword = "1234"\n')
S3 = ('[upload]\nurl = "s3://bucket-x/p"\nendpoint_url = "http://127.0.0.1:1"\n'
      'access_key_id = "AKIA"\nsecret_access_key = "s3cret"\nsession_token = "st-9f8e"\n')
WARNED = "other users can read it"


def write(tmp_path, text: str, mode: int):
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n' + text)
    os.chmod(path, mode)
    return path


ENVIRONMENT = ", or give the uploader's keys through the environment"


# A bridge's password cannot come from the environment: its warning does not say it can.
@pytest.mark.parametrize("text, keys, hint", [
    (BRIDGE, "bridge[0].password", ""),
    (S3, "upload.secret_access_key, upload.session_token", ENVIRONMENT),
])
def test_config_check_warns_of_secrets_others_can_read(tmp_path, text, keys, hint):
    path = write(tmp_path, text, 0o644)
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"warning: {path}: other users can read it (permissions -rw-r--r--) "
                        f"and it holds {keys}: run chmod o-r {path} (the broker's user must "
                        f"still read it){hint}\n")
    assert "1234" not in r.stderr and "s3cret" not in r.stderr and "st-9f8e" not in r.stderr
    r = run_cli("config", "check", "-c", str(path), "--format", "json")
    assert r.returncode == 0
    out = json.loads(r.stdout)
    assert out["ok"] is True and len(out["warnings"]) == 1 and keys in out["warnings"][0]
    os.chmod(path, 0o640)                            # the owner and its group only: quiet
    r = run_cli("config", "check", "-c", str(path))
    assert (r.returncode, r.stderr) == (0, "")


def test_no_warning_without_a_secret(tmp_path):
    path = write(tmp_path, BRIDGE.replace('username = "gw"\npassword = "1234"\n', ""), 0o644)
    r = run_cli("config", "check", "-c", str(path))
    assert (r.returncode, r.stderr) == (0, "")
    assert json.loads(run_cli("config", "check", "-c", str(path), "--format",
                              "json").stdout)["warnings"] == []


def test_serve_warns_at_start_and_at_a_reload(broker, tmp_path):
    before = os.umask(0o022)        # the file the fixture writes: 0644
    try:
        b = broker(raw_config='[[listener]]\nport = 0\nhost = "127.0.0.1"\n' + BRIDGE)
    finally:
        os.umask(before)
    assert b.wait_log(lambda ln: WARNED in ln and "bridge[0].password" in ln, timeout=5), \
        b.log_text()
    assert "1234" not in b.log_text()
    os.chmod(b.config_path, 0o600)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=10, start=mark), b.log_text()
    assert not [ln for ln in b.logs[mark:] if WARNED in ln]
    os.chmod(b.config_path, 0o604)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: WARNED in ln and "-rw----r--" in ln, timeout=10, start=mark), \
        b.log_text()


def test_each_warning_is_its_own_line_and_json_string(tmp_path):
    # (ops5: a file others can change and read, holding a secret, gave one warning string
    # of two joined with "; ": a script counting or matching warnings got them wrong)
    path = write(tmp_path, BRIDGE, 0o666)
    changed = f"{path}: other users can change it (permissions -rw-rw-rw-): run chmod go-w {path}"
    read = (f"{path}: other users can read it (permissions -rw-rw-rw-) and it holds "
            f"bridge[0].password: run chmod o-r {path} (the broker's user must still read it)")
    r = run_cli("config", "check", "-c", str(path), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["warnings"] == [changed, read], r.stdout
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0 and r.stderr == f"warning: {changed}\nwarning: {read}\n", r.stderr
