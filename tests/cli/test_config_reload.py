"""`edgebroker config reload` (the unit's last ExecReload= line, docs/deploy.md) against a
running broker: it returns once the broker has applied the file (a user added to the password
file logs in at once, no wait), fails with the broker's reason when the broker refused it (and
the broker serves on as it was), and gives up after --timeout when the broker does not answer."""

import signal

from conftest import run_cli, toml_dumps
from secfiles import write_passwords

FAILED = "reload failed, keeping the running configuration"


def test_reload_returns_once_the_new_configuration_is_live(broker, tmp_path):
    pw = write_passwords(tmp_path / "pw", {"alice": "a-pw"})
    b = broker(password_file=str(pw))
    b.client("alice", username="alice", password="a-pw")
    b.client("bob", expect_rc=4, username="bob", password="b-pw")    # (3.1.1: bad user name)
    write_passwords(pw, {"alice": "a-pw", "bob": "b-pw"})
    mark = b.mark()
    r = run_cli("config", "reload", "-c", str(b.config_path))
    assert (r.returncode, r.stdout, r.stderr) == (0, "configuration reloaded\n", ""), r.stderr
    # Live when the command returned: bob logs in at once.
    b.client("bob", username="bob", password="b-pw")
    assert b.wait_log(lambda ln: f"configuration reloaded from {b.config_path}" in ln, start=mark)
    # A key that needs a restart is said on the line.
    b.config_path.write_text(toml_dumps(dict(b.config, metrics={"listen": "127.0.0.1:0"})))
    r = run_cli("config", "reload", "--data-dir", b.config["data_dir"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("configuration reloaded; changes to [metrics] take effect after a "
                        "restart\n"), r.stdout


def test_a_refused_reload_fails_with_the_brokers_reason(broker, tmp_path):
    pw = write_passwords(tmp_path / "pw", {"alice": "a-pw"})
    b = broker(password_file=str(pw))
    gone = tmp_path / "gone"
    # A file `config check` would refuse too; the broker refuses it on its own here.
    b.config_path.write_text(toml_dumps(dict(b.config, password_file=str(gone))))
    mark = b.mark()
    r = run_cli("config", "reload", "-c", str(b.config_path))
    assert r.returncode == 1 and r.stdout == "", r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"edgebroker: the broker answered: {FAILED}: {b.config_path}: "
                               f"password_file: {gone}"), lines[0]
    logged = b.wait_log(lambda ln: FAILED in ln, start=mark)
    assert logged and lines[0].split(f"{FAILED}: ", 1)[1] in logged, logged
    b.client("alice", username="alice", password="a-pw")          # the running configuration


def test_reload_gives_up_when_the_broker_does_not_answer(broker, tmp_path):
    b = broker()
    b.send_signal(signal.SIGSTOP)
    try:
        r = run_cli("config", "reload", "--data-dir", b.config["data_dir"], "--timeout", "0.5")
    finally:
        b.send_signal(signal.SIGCONT)
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"edgebroker: admin socket {b.config['data_dir']}/admin.sock: no answer "
                        f"within 0.5 s\n"), r.stderr
    # The request was taken: once going again the broker reloads (and still serves).
    assert b.wait_log(lambda ln: "configuration reloaded from" in ln)
    b.client("after")


def test_reload_without_a_broker_says_so(tmp_path):
    (tmp_path / "d").mkdir()
    r = run_cli("config", "reload", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 1
    assert "cannot reach the broker's admin socket" in r.stderr, r.stderr
