"""A password or ACL file with several bad lines: `config check`, `serve` and a reload report
every one of them at once (the first 20, then how many more), not only the first (the operator
fixed it and found the next one, one run at a time)."""

import signal

from conftest import run_cli, toml_dumps

from edgebroker.security.passwords import hash_password

FAILED = "reload failed, keeping the running configuration"


def _files(tmp_path, bad_users: int = 2):
    good = hash_password("pw", "pbkdf2")
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic read a/#\ntopci read y\ntopic read a/#/b\n"
                   "pattern read d/x%c\n")
    acl.chmod(0o600)
    pw = tmp_path / "pw"
    lines = [f"alice:{good}", "carol", "dave:notahash"]
    lines += [f"user{i}" for i in range(bad_users - 2)]
    pw.write_text("".join(line + "\n" for line in lines))
    pw.chmod(0o600)
    return acl, pw


def _expected(acl, pw) -> list[str]:
    return [f"acl_file: {acl} line 3: unknown keyword 'topci' (expected topic, pattern or user)",
            f"acl_file: {acl} line 4: ",
            f"acl_file: {acl} line 5: %c and %u must fill a whole level",
            f"password_file: {pw} line 2: expected username:hash",
            f"password_file: {pw} line 3: user 'dave': "]


def _starting(text: str, expected: list[str]) -> list[str]:
    """The ``expected`` beginnings not in ``text``."""
    return [e for e in expected if e not in text]


def test_config_check_serve_and_reload_report_every_bad_line(broker, tmp_path):
    b = broker()
    acl, pw = _files(tmp_path)
    cfg = dict(b.config, acl_file=str(acl), password_file=str(pw))
    path = tmp_path / "bad.toml"
    path.write_text(toml_dumps(cfg))
    for command in ("config check", "serve"):
        r = run_cli(*command.split(), "-c", str(path))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (command, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert all(line.startswith(f"edgebroker: config error: {path}: ") for line in lines)
        found = [e for e in _expected(acl, pw) if any(e in line for line in lines)]
        assert found == _expected(acl, pw), (command, r.stderr)
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log(lambda ln: FAILED in ln or "configuration reloaded" in ln, timeout=10,
                      start=mark)
    assert line is not None and FAILED in line, line
    assert _starting(line, _expected(acl, pw)) == [], line
    assert b.alive()


def test_many_bad_lines_are_reported_up_to_20_with_how_many_more(tmp_path):
    acl, pw = _files(tmp_path, bad_users=27)
    path = tmp_path / "bad.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "password_file": str(pw),
                                "listener": [{"host": "127.0.0.1", "port": 1}]}))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if "password_file" in line]
    assert len(lines) == 21, r.stderr
    assert [line.split(" line ")[1].split(":")[0] for line in lines[:20]] == [
        str(n) for n in range(2, 22)]
    assert lines[20] == (f"edgebroker: config error: {path}: password_file: {pw}: 7 more bad "
                         f"lines (the first 20 are above)"), lines[20]


def test_20000_bad_lines_refused_with_20_then_how_many_more_and_the_plain_text_hint(tmp_path):
    """10,000 lines without ':' then 10,000 plain-text user:password lines (each used to scan
    every problem before it for the hint: 40 s for 1 MB, in the loop at a reload). The hint
    is on the first plain-text line, here past the 20 shown: it comes after them."""
    pw = tmp_path / "pw"
    pw.write_text("".join(f"nocolon{i}\n" for i in range(10_000))
                  + "".join(f"user{i}:secret{i}\n" for i in range(10_000)))
    pw.chmod(0o600)
    acl = tmp_path / "acl"
    acl.write_text("".join(f"topci read a/{i}\n" for i in range(20_000)))
    acl.chmod(0o600)
    path = tmp_path / "bad.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "password_file": str(pw),
                                "acl_file": str(acl),
                                "listener": [{"host": "127.0.0.1", "port": 1}]}))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2, r.stderr
    head = f"edgebroker: config error: {path}: "
    lines = [line for line in r.stderr.strip().splitlines() if "password_file" in line]
    assert lines[:20] == [f"{head}password_file: {pw} line {n}: expected username:hash"
                          for n in range(1, 21)], r.stderr
    assert lines[20:] == [
        f"{head}password_file: {pw}: 19980 more bad lines (the first 20 are above)",
        f"{head}password_file: {pw} line 10001 (the first plain-text line): plain-text "
        f"passwords are not accepted: run 'edgebroker passwd -U {pw}' to hash them"], lines[20:]
    lines = [line for line in r.stderr.strip().splitlines() if "acl_file" in line]
    assert lines[:20] == [f"{head}acl_file: {acl} line {n}: unknown keyword 'topci' (expected "
                          f"topic, pattern or user)" for n in range(1, 21)], r.stderr
    assert lines[20:] == [f"{head}acl_file: {acl}: 19980 more bad lines (the first 20 are "
                          f"above)"], lines[20:]


def test_the_plain_text_hint_within_the_first_20_is_said_once_on_its_line(tmp_path):
    from edgebroker.errors import ConfigError
    from edgebroker.security.passwords import PasswordFile
    pw = tmp_path / "pw"
    pw.write_text("".join(f"nocolon{i}\n" for i in range(3))
                  + "".join(f"user{i}:secret{i}\n" for i in range(30)))
    pw.chmod(0o600)
    try:
        PasswordFile.load(str(pw))
    except ConfigError as exc:
        problems = exc.problems
    else:
        raise AssertionError("loaded")
    assert len(problems) == 21, problems
    hinted = [p for p in problems if "passwords are not accepted" in p]
    assert hinted == [f"password_file: {pw} line 4: user 'user0': not a hash (a plain-text "
                      f"password?); plain-text passwords are not accepted: run 'edgebroker "
                      f"passwd -U {pw}' to hash them"], problems
