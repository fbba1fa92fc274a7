"""The state directory of a command run in a shell on the service's configuration file (no
data_dir in it, no $STATE_DIRECTORY: ./edgebroker-data, the one outside systemd): `config
check` says so and names the unit's, /var/lib/edgebroker; `inspect` and `upload` commands, when
that directory does not exist, say the same rather than "no commit log" there."""

import json
import os
import subprocess

import pytest

from conftest import REPO, LineCollector, broker_command

CONFIG = REPO / "systemd" / "edgebroker.toml"     # the unit's: no data_dir
UNIT_STATE_DIR = "/var/lib/edgebroker"


def environment() -> dict:
    """The environment without $STATE_DIRECTORY; this checkout's edgebroker imported from
    any working directory."""
    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run(cwd, *args, state_directory: str | None = None) -> subprocess.CompletedProcess:
    env = environment()
    if state_directory is not None:
        env["STATE_DIRECTORY"] = state_directory
    return subprocess.run([*broker_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_config_check_names_the_state_directory_outside_systemd(tmp_path):
    shell = tmp_path / "edgebroker-data"
    r = run(tmp_path, "config", "check", "-c", str(CONFIG))
    assert r.returncode == 0, r.stderr
    ok, note = r.stdout.splitlines()
    assert ok.endswith(f"state directory: {shell})"), r.stdout
    assert note.startswith(f"note: {shell} is the state directory outside systemd"), note
    assert f"under systemd/edgebroker.service it is {UNIT_STATE_DIR}" in note, note
    assert f"`STATE_DIRECTORY={UNIT_STATE_DIR} edgebroker config check -c {CONFIG}`" in note
    assert not shell.exists()
    r = run(tmp_path, "config", "check", "-c", str(CONFIG), "--format", "json")
    report = json.loads(r.stdout)
    assert report["state_dir"] == str(shell) and report["state_dir_outside_systemd"] is True


def test_config_check_with_the_units_state_directory_says_no_more(tmp_path):
    state = tmp_path / "state"
    r = run(tmp_path, "config", "check", "-c", str(CONFIG), state_directory=str(state))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{CONFIG}: OK (listeners: 127.0.0.1:1883; state "
                                     f"directory: {state})"], r.stdout
    r = run(tmp_path, "config", "check", "-c", str(CONFIG), "--format", "json",
            state_directory=str(state))
    assert json.loads(r.stdout)["state_dir_outside_systemd"] is False


@pytest.mark.parametrize("command", [["inspect", "segments"], ["inspect", "sessions"],
                                     ["inspect", "stats"], ["inspect", "clients"],
                                     ["upload", "status"]])
def test_commands_on_a_missing_state_directory_outside_systemd_say_so(tmp_path, command):
    r = run(tmp_path, *command, "-c", str(CONFIG))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"edgebroker: no state directory: {tmp_path / 'edgebroker-data'} is the state directory "
        f"outside systemd (no data_dir, no $STATE_DIRECTORY); under "
        f"systemd/edgebroker.service it is {UNIT_STATE_DIR}: give --data-dir {UNIT_STATE_DIR}"]
    assert not (tmp_path / "edgebroker-data").exists()


def test_an_existing_state_directory_outside_systemd_is_used(tmp_path):
    """A development run's ./edgebroker-data is the state directory, as for serve: the command
    goes on to what it finds there (no broker: its admin socket is missing)."""
    (tmp_path / "edgebroker-data").mkdir()
    r = run(tmp_path, "inspect", "stats", "-c", str(CONFIG))
    assert r.returncode == 1
    assert "cannot reach the broker's admin socket" in r.stderr, r.stderr
    assert str(tmp_path / "edgebroker-data" / "admin.sock") in r.stderr, r.stderr


def test_a_relative_data_dir_is_shown_absolute(tmp_path):
    """``data_dir = "state"`` is relative to the working directory: `config check`, the start
    line and `inspect` showed it as written, so nobody could tell where it was."""
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "c.toml"
    config.write_text('data_dir = "state"\n[[listener]]\nhost = "127.0.0.1"\nport = 0\n')
    r = run(tmp_path / "etc", "config", "check", "-c", "c.toml")
    assert r.stdout == (f"c.toml: OK (listeners: 127.0.0.1:0; state directory: "
                        f"{tmp_path / 'etc' / 'state'})\n"), r.stdout + r.stderr
    r = run(tmp_path, "inspect", "segments", "-c", str(config))
    assert r.returncode == 1
    assert r.stderr == f"edgebroker: no commit log at {tmp_path / 'state' / 'log'} (use --data-dir)\n"
    proc = subprocess.Popen([*broker_command(), "serve", "-c", "c.toml"], cwd=tmp_path / "etc",
                            env=environment(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = LineCollector(proc.stderr)
        line = lines.wait(" state directory ", 20)
    finally:
        proc.terminate()
        proc.wait(10)
    assert line and line.endswith(f" state directory {tmp_path / 'etc' / 'state'}; "
                                  f"configuration c.toml"), lines.text()


def test_a_relative_data_dir_in_a_deep_working_directory_keeps_its_admin_socket(tmp_path):
    """The absolute path of ``<data_dir>/admin.sock`` may be past a Unix socket's 107 bytes
    where the relative one is not: the broker binds, and `inspect` connects, by the relative
    path (made absolute, the socket was disabled)."""
    deep = tmp_path.joinpath(*["d" * 20] * 6)
    deep.mkdir(parents=True)
    assert len(str(deep / "st" / "admin.sock")) > 107
    (deep / "c.toml").write_text('data_dir = "st"\n[[listener]]\nhost = "127.0.0.1"\nport = 0\n')
    proc = subprocess.Popen([*broker_command(), "serve", "-c", "c.toml"], cwd=deep,
                            env=environment(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = LineCollector(proc.stderr)
        assert lines.wait(" ready", 20), lines.text()
        assert "admin socket disabled" not in lines.text()
        assert lines.wait("admin socket st/admin.sock", 1), lines.text()
        r = run(deep, "inspect", "stats", "-c", "c.toml", "--format", "json")
        assert r.returncode == 0 and json.loads(r.stdout)["clients_connected"] == 0, r.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_socket_path_that_is_a_regular_file_is_named_as_not_a_socket(tmp_path):
    """`inspect --socket` given a regular file (a typo, the config file) said "Connection
    refused", as for a broker that is not running."""
    path = tmp_path / "edgebroker.toml"
    path.write_text("")
    r = run(tmp_path, "inspect", "stats", "--socket", str(path))
    assert r.returncode == 1
    assert f"cannot reach the broker's admin socket {path}: not a socket" in r.stderr, r.stderr
