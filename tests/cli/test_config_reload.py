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
                        f"within 0.5 s: the request stays with the broker, which applies it "
                        f"when its loop goes on (see the journal)\n"), r.stderr
    # The request was taken: once going again the broker reloads (and still serves).
    assert b.wait_log(lambda ln: "configuration reloaded from" in ln)
    b.client("after")


def test_reload_without_a_broker_says_so(tmp_path):
    (tmp_path / "d").mkdir()
    r = run_cli("config", "reload", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 1
    assert "cannot reach the broker's admin socket" in r.stderr, r.stderr


def test_a_data_dir_changed_in_the_file_falls_back_to_sighup_with_pid(broker, tmp_path):
    """data_dir changed in the file (it takes a restart): the admin socket is not where the
    file says; with --pid (the unit's $MAINPID) the broker gets SIGHUP instead and applies the
    rest of the file; without it the command fails, naming the socket it looked for."""
    pw = write_passwords(tmp_path / "pw", {"alice": "a-pw"})
    b = broker(password_file=str(pw))
    write_passwords(pw, {"alice": "a-pw", "bob": "b-pw"})
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    b.config_path.write_text(toml_dumps(dict(b.config, data_dir=str(moved))))
    r = run_cli("config", "reload", "-c", str(b.config_path))
    assert r.returncode == 1 and f"cannot reach the broker's admin socket {moved}" in r.stderr
    mark = b.mark()
    r = run_cli("config", "reload", "-c", str(b.config_path), "--pid", str(b.proc.pid))
    assert r.returncode == 0, r.stderr
    assert "; sent SIGHUP to process" in r.stdout and "not waiting for the result" in r.stdout
    line = b.wait_log(lambda ln: "configuration reloaded from" in ln, start=mark)
    after = "\n".join(b.logs[mark:])
    assert line and "data_dir" in after, after
    b.client("bob", username="bob", password="b-pw")       # the rest of the file applied
