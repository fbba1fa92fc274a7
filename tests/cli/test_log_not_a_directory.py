"""A state directory whose ``log`` is a regular file (ops5): `config check` said OK, `serve`
bound its listener and admin socket and then failed with "cannot open the commit log
directory ...: File exists", and `inspect` said there was no commit log. Now `config check`
and `serve` (before it binds anything) refuse it, and `inspect` and `upload run --once` say
what is there, each naming the path."""

from __future__ import annotations

import os

from conftest import run_cli


def _state(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "log").write_text("not a log\n")
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{state}"\n[upload]\nurl = "file://{tmp_path}/landing"\n')
    said = (f"{state / 'log'} is a regular file: the commit log is kept in a directory of "
            f"that name (move it away)")
    return state, config, said


def test_config_check_and_serve_refuse_it(tmp_path):
    state, config, said = _state(tmp_path)
    r = run_cli("config", "check", "-c", str(config))
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"edgebroker: config error: {config}: data_dir: {said}\n"
    r = run_cli("serve", "--data-dir", str(state), "--listen", "127.0.0.1:0")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == f"edgebroker: config error: data_dir: {said}"
    assert sorted(os.listdir(state)) == ["log"]          # no admin socket bound


def test_inspect_and_upload_run_say_what_is_there(tmp_path):
    state, config, said = _state(tmp_path)
    for args in (["inspect", "segments", "--data-dir", str(state)],
                 ["inspect", "verify", "--data-dir", str(state)],
                 ["upload", "run", "--once", "-c", str(config)]):
        r = run_cli(*args)
        assert (r.returncode, r.stderr) == (1, f"edgebroker: {said}\n"), (args, r.stderr)
