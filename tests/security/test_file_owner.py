"""An ACL or password file owned by a user other than root and the broker's own: that user can
rewrite it (or chmod it) at any time, so it is refused like a file other users may change, at
start, by `config check` and at a reload (which keeps the running configuration), in one line
naming the file, its owner and the chown to run. A configuration file other users can change
is used, with a warning. Giving a file to another user (uid 65534) needs root, as `make test`
runs in CI: run as another user, those tests fail at the chown."""

import os
import signal

import pytest

from conftest import run_cli, toml_dumps
from secfiles import write_acl, write_passwords

from edgebroker.errors import ConfigError
from edgebroker.files import owner_problem
from edgebroker.security.acl import Acl
from edgebroker.security.passwords import PasswordFile

NOBODY = 65534          # a uid no test process runs as
FAILED = "reload failed, keeping the running configuration"

def _me() -> str:
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name


def _owned_by_nobody(path) -> str:
    """What the refusal says of ``path`` once owned by uid 65534."""
    import pwd
    try:
        who = f"{pwd.getpwuid(NOBODY).pw_name} (uid {NOBODY})"
    except KeyError:
        who = f"uid {NOBODY}"
    return (f"owned by {who}, who can change it whatever its permissions (only root, the "
            f"broker's user {_me()} (uid {os.geteuid()}) or the edgebroker system user may own "
            f"it); run: chown {_me()} {path}")


def test_root_and_the_brokers_user_may_own_a_file_others_may_not(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 4321)   # a broker run as an unprivileged user
    assert owner_problem("/f", 0) is None
    assert owner_problem("/f", 4321) is None
    problem = owner_problem("/f", 1000)
    assert problem and "can change it" in problem and problem.endswith("run: chown 4321 /f")


@pytest.mark.parametrize("load, write", [
    (Acl.load, lambda p: write_acl(p, "topic read public/#\n")),
    (PasswordFile.load, lambda p: write_passwords(p, {"alice": "pw"})),
])
def test_a_file_owned_by_another_user_is_refused(tmp_path, load, write):
    path = write(tmp_path / "f")
    key = "acl_file" if load == Acl.load else "password_file"
    load(str(path))                                  # ours (root's): used
    os.chown(path, NOBODY, -1)
    with pytest.raises(ConfigError) as info:
        load(str(path))
    assert info.value.problems == [f"{key}: {path}: {_owned_by_nobody(path)}"]


@pytest.mark.parametrize("key", ["acl_file", "password_file"])
def test_start_config_check_and_reload_refuse_it_in_one_line(broker, tmp_path, key):
    acl = write_acl(tmp_path / "acl", "topic readwrite #\n")
    pw = write_passwords(tmp_path / "passwd", {"alice": "pw"})
    b = broker(acl_file=str(acl), allow_anonymous=True)
    path = acl if key == "acl_file" else pw
    os.chown(path, NOBODY, -1)
    cfg = dict(b.config, **{key: str(path)})
    problem = f"{key}: {path}: {_owned_by_nobody(path)}"
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log(lambda ln: FAILED in ln or "configuration reloaded" in ln, timeout=10,
                      start=mark)
    assert line is not None and line.endswith(f"{FAILED}: {b.config_path}: {problem}"), line
    c = b.client("after-reload")                     # the running configuration serves on
    c.subscribe("after/t")
    c.publish("after/t", b"still here")
    assert c.recv_publish().payload == b"still here"
    config = tmp_path / "c.toml"
    config.write_text(toml_dumps(dict(cfg, data_dir=str(tmp_path / "d2"))))
    for command in ("config check", "serve"):
        r = run_cli(*command.split(), "-c", str(config))
        assert "Traceback" not in r.stderr and r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"edgebroker: config error: {config}: {problem}"], command


def test_a_configuration_file_others_can_change_is_used_with_a_warning(tmp_path):
    """Whoever can write it can set acl_file = "" or allow_anonymous = true: config check
    says so (serve and a reload log the same line, config.exposed_secrets); exit 0."""
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "d"}"\n[[listener]]\nport = 0\n')
    os.chmod(path, 0o644)
    assert run_cli("config", "check", "-c", str(path)).stderr == ""
    os.chmod(path, 0o666)
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0 and r.stderr == (
        f"warning: {path}: other users can change it (permissions -rw-rw-rw-): "
        f"run chmod go-w {path}\n"), r.stderr
    if os.geteuid() == 0:
        os.chmod(path, 0o644)
        os.chown(path, NOBODY, -1)
        r = run_cli("config", "check", "-c", str(path))
        assert r.returncode == 0 and r.stderr == f"warning: {path}: {_owned_by_nobody(path)}\n"


def test_the_service_user_may_own_a_file_root_checks(monkeypatch):
    """`sudo edgebroker config check` of the unit's files (docs/deploy.md: the password file
    is the edgebroker user's) is not refused for that owner."""
    import pwd
    real = pwd.getpwnam
    monkeypatch.setattr(pwd, "getpwnam", lambda name: pwd.struct_passwd(
        ("edgebroker", "x", 999, 999, "", "/", "/bin/false")) if name == "edgebroker"
        else real(name))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert owner_problem("/f", 999) is None
    assert owner_problem("/f", 1000) is not None
