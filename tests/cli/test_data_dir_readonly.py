"""A data_dir on a read-only mount (what the unit's ProtectSystem=strict makes of every
directory but its own: docs/deploy.md, "The log on another disk") is refused by `serve` and
`config check` with the reason, "read-only file system", and under systemd ($INVOCATION_ID or
$STATE_DIRECTORY set) with the way out: ReadWritePaths= and the service user's ownership.
The mount is a read-only bind in a mount namespace of the command's own (unshare, as root)."""

import os
import subprocess

import pytest

from conftest import REPO, broker_command, toml_dumps
from cli.test_serve import base_config, one_error_line

# (not root: a user namespace of its own, mapped to root, makes the bind mount)
USER_NS = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]


def run_on_readonly(mount, env: dict, *args) -> subprocess.CompletedProcess:
    """``edgebroker ARGS`` with ``mount`` bound read-only over itself, in a mount namespace of
    its own (nothing changes outside it)."""
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"')
    return subprocess.run(
        ["unshare", *USER_NS, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         str(mount), *broker_command(), *args],
        cwd=REPO, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, env=env)


@pytest.mark.parametrize("systemd", [False, True])
def test_data_dir_on_a_read_only_mount_names_the_reason(tmp_path, systemd):
    disk = tmp_path / "srv"
    data = disk / "mqtt"
    data.mkdir(parents=True)
    os.chmod(data, 0o777)                  # the permissions allow it: the mount does not
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "STATE_DIRECTORY")}
    if systemd:
        env["INVOCATION_ID"] = "0123456789abcdef0123456789abcdef"
    for data_dir, words in ((data, f"{data} is not writable: read-only file system"),
                            (data / "new", f"cannot create {data / 'new'}: Read-only file "
                                           f"system")):
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps({**base_config(tmp_path), "data_dir": str(data_dir)}))
        for command in (["config", "check", "-c", str(path)], ["serve", "-c", str(path)]):
            r = run_on_readonly(disk, env, *command)
            assert r.returncode == 2, r.stderr
            line = one_error_line(r)
            assert f"config error: {path}: data_dir: {words}" in line, line
            if systemd and data_dir != data:        # not there yet: made first
                assert line.endswith(
                    f"{words} (under systemd/edgebroker.service the service cannot make it "
                    f"(ProtectSystem=strict): as root, `useradd --system edgebroker`, "
                    f"`install -d -o edgebroker -g edgebroker -m 0750 {data_dir}`, then add "
                    f"ReadWritePaths={data_dir} in a drop-in (`systemctl edit edgebroker`): "
                    f"docs/deploy.md)"), line
            elif systemd:
                assert line.endswith(
                    f"{words} (under systemd/edgebroker.service, ProtectSystem=strict leaves "
                    f"every directory but the unit's own read-only: add "
                    f"ReadWritePaths={data_dir} in a drop-in (`systemctl edit edgebroker`), "
                    f"and give the directory to the service's user (`useradd --system "
                    f"edgebroker`, then `chown edgebroker:edgebroker {data_dir}`): "
                    f"docs/deploy.md)"), line
            else:
                assert line.endswith(words), line
    assert os.listdir(data) == []


def test_a_data_dir_under_a_file_gets_no_systemd_hint(tmp_path):
    """The hint is for what the unit's sandbox may cause (read-only, permissions): a data_dir
    under a regular file is only named (its advice would fail too: diff37)."""
    (tmp_path / "afile").write_text("x")
    data_dir = tmp_path / "afile" / "mqtt"
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({**base_config(tmp_path), "data_dir": str(data_dir)}))
    env = dict(os.environ, INVOCATION_ID="0123456789abcdef0123456789abcdef")
    for command in (["config", "check", "-c", str(path)], ["serve", "-c", str(path)]):
        r = subprocess.run([*broker_command(), *command], cwd=REPO, capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL, env=env)
        assert r.returncode == 2, r.stderr
        line = one_error_line(r)
        assert line.endswith(f"data_dir: cannot create {data_dir}: Not a directory"), line
