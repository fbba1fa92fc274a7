"""A problem with a listener's own password_file or acl_file is reported under the
listener's key (listener[1].acl_file), not the top-level one it does not use; serve, `config
check` and a reload report every listener's problems at once."""

import signal

import pytest

from conftest import run_cli, toml_dumps

ERROR = "edgebroker: config error: "


def config(tmp_path, acl="/nonexistent/acl", pw="/nonexistent/pw") -> dict:
    return {"data_dir": str(tmp_path / "data"), "refusal_log_interval": 0,
            "listener": [{"host": "127.0.0.1", "port": 0},
                         {"host": "127.0.0.1", "port": 0, "acl_file": acl},
                         {"host": "127.0.0.1", "port": 0, "password_file": pw}]}


@pytest.mark.parametrize("command", ["config check", "serve"])
def test_each_listeners_file_problem_is_named_by_its_own_key(tmp_path, command):
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps(config(tmp_path)))
    r = run_cli(*command.split(), "-c", str(path), timeout=20)
    assert (r.returncode, r.stderr) == (2, (
        f"{ERROR}{path}: listener[1].acl_file: /nonexistent/acl: file not found\n"
        f"{ERROR}{path}: listener[2].password_file: /nonexistent/pw: file not found\n"))


def test_an_inherited_file_keeps_the_top_level_key_and_is_reported_once(tmp_path):
    path = tmp_path / "c.toml"
    cfg = {"data_dir": str(tmp_path / "data"), "acl_file": "/nonexistent/acl",
           "listener": [{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0}]}
    path.write_text(toml_dumps(cfg))
    r = run_cli("serve", "-c", str(path), timeout=20)
    assert (r.returncode, r.stderr) == (
        2, f"{ERROR}{path}: acl_file: /nonexistent/acl: file not found\n")


def test_a_reload_names_each_listeners_file_by_its_own_key(broker, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite #\n")
    pw = tmp_path / "pw"
    pw.write_text("")
    pw.chmod(0o600)
    good = config(tmp_path, str(acl), str(pw))
    good["listener"][2]["allow_anonymous"] = True
    b = broker(**good)
    bad = config(tmp_path, str(tmp_path / "no-acl"), str(tmp_path / "no-pw"))
    bad["listener"][2]["allow_anonymous"] = True
    b.config_path.write_text(toml_dumps({**b.config, "listener": bad["listener"]}))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark, timeout=10)
    assert line is not None, b.log_text()
    assert f"listener[1].acl_file: {tmp_path / 'no-acl'}: file not found" in line, line
    assert f"listener[2].password_file: {tmp_path / 'no-pw'}: file not found" in line, line
