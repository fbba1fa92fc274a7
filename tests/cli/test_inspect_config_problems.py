"""The read-only commands that take only data_dir from ``-c FILE`` (`inspect ...`, `upload
status`) still run when the file has a problem elsewhere: that is when an operator looks (a
reload was refused for it). They say on stderr, in one line, that the file has problems (`config
check` names them). A problem with data_dir itself, or a file that is not TOML, still stops
them with the file's error (exit 2)."""

from __future__ import annotations

import json

from conftest import run_cli


def test_inspect_and_upload_status_take_data_dir_from_a_file_with_a_typo(broker, tmp_path):
    b = broker()
    data_dir = b.config["data_dir"]
    pub = b.client("p")
    pub.publish("a/b", b"x", qos=1)
    typo = tmp_path / "typo.toml"
    typo.write_text(f'data_dir = "{data_dir}"\n[limits]\nmesages_rate = 20\n')
    note = (f"edgebroker: note: {typo} has 1 problem(s) (`edgebroker config check -c {typo}` "
            f"names them); data_dir taken from it")
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
    r = run_cli("inspect", "sessions", "-c", str(typo))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [note.replace(
        "data_dir taken", "data_dir, limits.persistent_client_expiration taken")]
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
