"""`passwd` on a symbolic link to the password file (/etc/edgebroker/passwd -> a file kept
elsewhere) replaced the link with a new file and left the file it pointed to unchanged. Now the
link is followed: the file it points to is replaced (its new file written next to it), the
link stays; a link to no file creates the file it names."""

from __future__ import annotations

import os
import stat

from conftest import run_cli
from edgebroker.security.passwords import PasswordFile


def _users(path) -> list[str]:
    return sorted(PasswordFile.load(str(path)).raw)


def test_passwd_through_a_link_rewrites_the_file_it_points_to(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "etc").mkdir()
    target = tmp_path / "data" / "passwd"
    link = tmp_path / "etc" / "passwd"
    assert run_cli("passwd", "-b", str(target), "alice", "pw1").returncode == 0
    os.chmod(target, 0o640)
    link.symlink_to("../data/passwd")
    r = run_cli("passwd", "-b", str(link), "bob", "pw2")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == "../data/passwd"
    assert _users(target) == ["alice", "bob"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path / "etc")) == ["passwd"]      # no temporary file left
    assert sorted(os.listdir(tmp_path / "data")) == ["passwd"]
    r = run_cli("passwd", "-D", str(link), "alice")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and _users(target) == ["bob"]


def test_passwd_through_a_link_to_no_file_creates_it(tmp_path):
    link = tmp_path / "passwd"
    link.symlink_to(tmp_path / "kept" / "passwd")
    (tmp_path / "kept").mkdir()
    r = run_cli("passwd", "-b", str(link), "carol", "pw3")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and _users(tmp_path / "kept" / "passwd") == ["carol"]
    assert stat.S_IMODE((tmp_path / "kept" / "passwd").stat().st_mode) == 0o600
