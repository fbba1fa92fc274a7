"""The read-only commands that take only data_dir from ``-c FILE`` (`inspect ...`, `upload
status`) still run when the file has a problem elsewhere: that is when an operator looks (a
reload was refused for it). They say on stderr, in one line, that the file has problems (`config
check` names them) and what they took from it. A problem with data_dir itself, or a file that is
not TOML, still stops them with the file's error (exit 2); so does a file with an unknown key
that sets no data_dir at the top level: the key could be data_dir misplaced (`[log]
data_dir`) or misspelled (`data-dir`), and the default state directory ($STATE_DIRECTORY,
./edgebroker-data) another broker's (diff39 #1). `inspect sessions` holds
limits.persistent_client_expiration to the same rule."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import REPO, broker_command, run_cli, until


def test_inspect_and_upload_status_take_data_dir_from_a_file_with_a_typo(broker, tmp_path):
    b = broker()
    data_dir = b.config["data_dir"]
    pub = b.client("p")
    pub.publish("a/b", b"x", qos=1)
    typo = tmp_path / "typo.toml"
    typo.write_text(f'data_dir = "{data_dir}"\n[limits]\nmesages_rate = 20\n')
    note = (f"edgebroker: note: {typo} has 1 problem(s) (`edgebroker config check -c {typo}` "
            f"names them); taken from it: data_dir = \"{data_dir}\"")
    r = run_cli("inspect", "stats", "-c", str(typo), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [note]
    assert json.loads(r.stdout)["counters"]["publish_received"] >= 1, r.stdout
    for command in (["inspect", "segments"], ["inspect", "topics"], ["inspect", "clients"],
                    ["upload", "status"]):
        r = run_cli(*command, "-c", str(typo))
        assert r.returncode == 0, (command, r.stderr)
        assert r.stderr.splitlines() == [note], (command, r.stderr)
    b.stop()
    typo.write_text(f'data_dir = "{data_dir}"\n[limits]\nmesages_rate = 20\n'
                    f'persistent_client_expiration = 3600\n')
    r = run_cli("inspect", "sessions", "-c", str(typo))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"{note}, limits.persistent_client_expiration = 3600"], r.stderr
    r = run_cli("config", "check", "-c", str(typo))
    assert r.returncode == 2 and "limits.mesages_rate: unknown setting" in r.stderr, r.stderr


def test_a_bad_data_dir_or_a_file_that_is_not_toml_still_stops_them(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('data_dir = 5\n[limits]\nmesages_rate = 20\n')
    junk = tmp_path / "junk.toml"
    junk.write_text('data_dir = "x\n')
    for command in (["inspect", "stats"], ["inspect", "sessions"], ["upload", "status"]):
        r = run_cli(*command, "-c", str(bad))
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert r.stderr.splitlines() == [
            f"edgebroker: config error: {bad}: data_dir: expected a string, got 5"], r.stderr
        r = run_cli(*command, "-c", str(junk))
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert r.stderr.startswith(f"edgebroker: config error: {junk}: not valid TOML"), r.stderr


def _run(cwd, env_state_dir: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, STATE_DIRECTORY=env_state_dir, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([*broker_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_a_misplaced_or_misspelled_data_dir_stops_them_not_the_default_directory(
        broker, tmp_path):
    """Broker B has the default state directory ($STATE_DIRECTORY here, as under systemd);
    A's file, edited, has its data_dir under [log] or spelled data-dir: the commands named B's
    clients and uploader, with "data_dir taken from it"."""
    other = broker()
    other.client("only-on-B")
    mine = tmp_path / "mine"
    mine.mkdir()
    cases = {
        "under [log]": (f'[log]\ndata_dir = "{mine}"\n',
                        "log.data_dir: unknown setting; did you mean data_dir? (a top-level "
                        "setting: put it above the first [table])"),
        "misspelled": (f'data-dir = "{mine}"\n', "data-dir: unknown setting; did you mean "
                                                 "data_dir?"),
        # (a table written [listener] for [[listener]] is refused whole, its keys unchecked)
        "under a [listener] table": (f'[listener]\ndata_dir = "{mine}"\n',
                                     "listener: expected one or more [[listener]] tables"),
    }
    for case, (text, problem) in cases.items():
        edited = tmp_path / "edited.toml"
        edited.write_text(text)
        for command in (["inspect", "clients"], ["inspect", "stats"], ["inspect", "sessions"],
                        ["upload", "status"], ["upload", "pause"]):
            r = _run(tmp_path, other.config["data_dir"], *command, "-c", str(edited))
            assert r.returncode == 2, (case, command, r.stdout, r.stderr)
            assert r.stderr.splitlines() == [f"edgebroker: config error: {edited}: {problem}"], \
                (case, command, r.stderr)
            assert "only-on-B" not in r.stdout, (case, command, r.stdout)
    # A value problem cannot be data_dir: the file without one still gives the default, and
    # the note says it was not set.
    edited.write_text("[limits]\nmax_qos = 7\n")
    r = _run(tmp_path, other.config["data_dir"], "inspect", "clients", "-c", str(edited))
    assert r.returncode == 0 and "only-on-B" in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.splitlines() == [
        f"edgebroker: note: {edited} has 1 problem(s) (`edgebroker config check -c {edited}` "
        f"names them); taken from it: data_dir unset"], r.stderr
    assert other.alive()


def test_inspect_sessions_with_persistent_client_expiration_misplaced_stops(broker, tmp_path):
    b = broker()
    data_dir = b.config["data_dir"]
    b.stop()
    moved = tmp_path / "moved.toml"
    moved.write_text(f'data_dir = "{data_dir}"\npersistent_client_expiration = 3600\n')
    r = run_cli("inspect", "sessions", "-c", str(moved))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.splitlines() == [
        f"edgebroker: config error: {moved}: persistent_client_expiration: unknown setting; "
        f"did you mean limits.persistent_client_expiration? (a setting of the [limits] table)"]
    r = run_cli("inspect", "sessions", "--data-dir", data_dir, "-c", str(moved))
    assert r.returncode == 2, (r.stdout, r.stderr)
    # data_dir alone is all `inspect stats` takes: set where it belongs, it is taken.
    r = run_cli("inspect", "segments", "-c", str(moved))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"edgebroker: note: {moved} has 1 problem(s) (`edgebroker config check -c {moved}` "
        f"names them); taken from it: data_dir = \"{data_dir}\""], r.stderr


def test_inspect_sessions_reads_a_piped_file_once(broker, tmp_path):
    """`inspect sessions -c /dev/stdin` (or `-c <(...)`): the file is read once; it was read
    a second time to find the log, which a pipe refuses (diff41)."""
    b = broker()
    b.client("piped", clean=False).disconnect()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    text = f'data_dir = "{b.config["data_dir"]}"\n'
    snapshot = Path(b.config["data_dir"], "sessions.json")
    until(lambda: snapshot.exists() and "piped" in snapshot.read_text(), 10,
          "the session in the snapshot")
    r = subprocess.run([*broker_command(), "inspect", "sessions", "-c", "/dev/stdin"],
                       input=text, cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert "piped" in r.stdout, r.stdout
