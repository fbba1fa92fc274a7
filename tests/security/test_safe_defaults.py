"""Safe defaults: loopback-only and anonymous without configuration; a listener reachable from
the network does not start without authentication or an explicit allow_anonymous = true."""

import pytest

from conftest import run_cli, toml_dumps
from secfiles import write_passwords

REFUSAL = ("is reachable from the network and has no authentication: set password_file (clients "
           "log in) or allow_anonymous = true (anyone may connect), at the top level or in its "
           "[[listener]] table")


def one_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def write_config(tmp_path, **top):
    cfg = {"data_dir": str(tmp_path / "data"), "sys_interval": 0, **top}
    path = tmp_path / "edgebroker.toml"
    path.write_text(toml_dumps(cfg))
    return path


def test_no_configuration_means_loopback_and_anonymous(broker, tmp_path, uid):
    b = broker(config_file=False, args=["--data-dir", str(tmp_path / "state"), "--listen",
                                        "127.0.0.1:0"])
    assert b.listeners[0][0] == "127.0.0.1"
    assert b.client(uid).ping() == []


@pytest.mark.parametrize("address", ["0.0.0.0:0", ":0", "[::]:0", "192.0.2.10:1883"])
def test_listen_on_network_without_auth_refused(tmp_path, address):
    r = run_cli("serve", "--listen", address, "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2
    line = one_line(r)
    assert line.startswith("edgebroker: config error: listener ") and REFUSAL in line, line
    assert "listening on" not in r.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.local"])
def test_config_listener_on_network_without_auth_refused(tmp_path, host):
    path = write_config(tmp_path, listener=[{"host": "127.0.0.1", "port": 0},
                                            {"host": host, "port": 1883}])
    for command in (["serve", "-c", str(path)], ["config", "check", "-c", str(path)]):
        r = run_cli(*command)
        assert r.returncode == 2
        line = one_line(r)
        address = f"[{host}]:1883" if ":" in host else f"{host}:1883"
        assert f"listener {address} {REFUSAL}" in line, line


@pytest.mark.parametrize("top, listener", [
    ({"allow_anonymous": True}, {}),
    ({}, {"allow_anonymous": True}),
    ({"password_file": "{pw}"}, {}),
    ({}, {"password_file": "{pw}"}),
    ({"password_file": "{pw}", "allow_anonymous": True}, {}),
])
def test_network_listener_accepted_with_auth_or_explicit_anonymous(tmp_path, top, listener):
    pw = str(write_passwords(tmp_path / "passwd", {"alice": "pw"}))
    fill = {k: pw if v == "{pw}" else v for k, v in top.items()}
    lfill = {k: pw if v == "{pw}" else v for k, v in listener.items()}
    path = write_config(tmp_path, **fill, listener=[{"host": "0.0.0.0", "port": 1883, **lfill}])
    r = run_cli("config", "check", "-c", str(path))   # checks without binding anything
    assert r.returncode == 0, r.stderr


def test_listener_override_can_remove_auth_and_is_refused(tmp_path):
    pw = str(write_passwords(tmp_path / "passwd", {"alice": "pw"}))
    path = write_config(tmp_path, password_file=pw,
                        listener=[{"host": "0.0.0.0", "port": 1883, "password_file": ""}])
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2 and REFUSAL in one_line(r)


def test_nobody_could_connect_refused(tmp_path):
    path = write_config(tmp_path, allow_anonymous=False,
                        listener=[{"host": "127.0.0.1", "port": 0}])
    r = run_cli("serve", "-c", str(path))
    assert r.returncode == 2
    assert ("listener 127.0.0.1:0: allow_anonymous is false and there is no password_file or "
            "use_identity_as_username, so no client could connect") in one_line(r)


def test_password_file_on_loopback_turns_anonymous_off(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", {"alice": "pw"})
    b = broker(password_file=str(pw))
    b.client(uid, expect_rc=5)
    assert b.client(f"{uid}-a", username="alice", password="pw").ping() == []


def test_config_check_reads_security_files(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic read a\nuser\n")
    path = write_config(tmp_path, acl_file=str(acl), listener=[{"host": "127.0.0.1", "port": 0}])
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2 and f"acl_file: {acl} line 2: 'user' needs a user name" in one_line(r)
