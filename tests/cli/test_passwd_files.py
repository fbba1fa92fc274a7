"""`edgebroker passwd` on the files it meets: one starting with a UTF-8 byte order mark, one
edited by two commands at once, passwords that are not UTF-8, and files the broker would
refuse."""

import fcntl
import os
import subprocess
import threading
import time

import pytest

from conftest import REPO, broker_command, run_cli

from edgebroker.errors import ConfigError
from edgebroker.security import passwords
from edgebroker.security.passwords import PasswordFile

BOM = "\ufeff"


def users_of(path) -> list[str]:
    return [line.split(":")[0] for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_byte_order_mark_is_skipped_as_the_broker_skips_it(tmp_path):
    """The broker skips a BOM (docs/security.md); passwd read it as part of the first user's
    name: changing that user's password added a second line for it ("added"), and the broker
    then refused the file (user listed twice); -D said there was no such user."""
    path = tmp_path / "bom.pw"
    assert run_cli("passwd", "-b", "--no-scram", str(path), "alice", "old").returncode == 0
    assert run_cli("passwd", "-b", "--no-scram", str(path), "bob", "b").returncode == 0
    path.write_text(BOM + path.read_text(encoding="utf-8"), encoding="utf-8")
    r = run_cli("passwd", "-b", str(path), "alice", "new")
    assert r.returncode == 0 and r.stdout == f"{path}: user 'alice' changed\n", r.stdout
    assert users_of(path) == ["alice", "bob"]
    assert set(PasswordFile.load(str(path)).entries) == {"alice", "bob"}
    path.write_text(BOM + path.read_text(encoding="utf-8"), encoding="utf-8")
    r = run_cli("passwd", "-D", str(path), "alice")
    assert r.returncode == 0 and r.stdout == f"{path}: user 'alice' deleted\n", r.stderr
    assert users_of(path) == ["bob"]


@pytest.mark.parametrize("text, line, problem", [
    ("u1:plain\nbroken\n", 2, "expected username:password (or username:hash)"),
    ("# users\nu1:a\nu2:b\nu1:c\n", 4, "user 'u1' is listed twice"),
])
def test_upgrade_refuses_a_file_the_broker_would_refuse(tmp_path, text, line, problem):
    """-U skipped a line with no ':' (and hashed a user listed twice) and said it hashed the
    file; the broker then refused it at start and reload (ops5). Now -U names the line and
    changes nothing, and the broker refuses the same line (once the others are hashes)."""
    path = tmp_path / "plain.pw"
    path.write_text(text)
    os.chmod(path, 0o600)
    r = run_cli("passwd", "-U", str(path))
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr == f"edgebroker: passwd: {path} line {line}: {problem}; nothing changed\n"
    assert path.read_text() == text
    hashed = passwords.hash_password("pw", "pbkdf2")
    users = [ln.partition(":")[0] + (f":{hashed}" if ":" in ln else "")
             for ln in text.splitlines()]          # (every password hashed, the rest as is)
    path.write_text("\n".join(users) + "\n")
    r = run_cli("passwd", "-U", str(path))
    assert r.returncode == 1 and f"line {line}: {problem}; nothing changed" in r.stderr
    with pytest.raises(ConfigError, match=f"line {line}: "):
        PasswordFile.load(str(path))


def _waits_for_a_lock(pid: int, inode: int) -> bool:
    """Whether process ``pid`` is blocked on a flock of file ``inode`` (/proc/locks: a waiter's
    line has '->' and the holder's MAJ:MIN:INODE)."""
    with open("/proc/locks") as fh:
        for line in fh:
            fields = line.split()
            if "->" in fields and str(pid) in fields and any(
                    f.count(":") == 2 and f.rsplit(":", 1)[1] == str(inode) for f in fields):
                return True
    return False


def test_an_edit_waits_for_the_one_before_it_and_keeps_its_change(tmp_path):
    """Two commands editing the file at once each read it, hashed, and wrote theirs: one
    user was lost. Now a command waits for the lock on the file (held here, as another
    command holds it from its read to its rename), then reads the file the other wrote."""
    path = tmp_path / "f.pw"
    assert run_cli("passwd", "-b", "--no-scram", str(path), "alice", "a").returncode == 0
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    proc = subprocess.Popen([*broker_command(), "passwd", "-b", "--no-scram", str(path), "bob",
                             "b"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 15
        while not _waits_for_a_lock(proc.pid, os.fstat(fd).st_ino):
            assert proc.poll() is None, f"passwd did not wait for the lock: {proc.communicate()}"
            assert time.monotonic() < deadline, "passwd is not waiting for the lock"
            threading.Event().wait(0.02)
        # Another editor, holding the lock: carol added, the file renamed over.
        passwords.write_atomic(str(path), [*path.read_text().splitlines(), "carol:" +
                                           path.read_text().split(":", 1)[1].strip()])
    finally:
        os.close(fd)                # releases the lock
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == f"{path}: user 'bob' added\n", err
    assert users_of(path) == ["alice", "carol", "bob"]


def test_commands_at_once_lose_no_user(tmp_path):
    path = tmp_path / "f.pw"
    procs = [subprocess.Popen([*broker_command(), "passwd", "-b", str(path), f"u{i}", "pw"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True) for i in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.endswith("added\n"), err
    assert sorted(users_of(path)) == ["u0", "u1", "u2", "u3"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_password_that_is_not_utf8_is_a_one_line_error(tmp_path):
    """A password of bytes that are not UTF-8, on the command line or stdin, ended in a
    traceback (UnicodeEncodeError)."""
    path = tmp_path / "f.pw"
    why = ("edgebroker: passwd: the password is not UTF-8 text, which MQTT clients send and "
           "SCRAM-SHA-256 needs")
    for argv, stdin, where in (([b"-b", bytes(path), b"bob", b"p\xffw"], b"", "it has the "
                                "byte 0xFF"),
                               ([bytes(path), b"carol"], b"\xe9t\xe9\n", "stdin has the byte "
                                "0xE9")):
        r = subprocess.run([*broker_command(), "passwd", *argv], cwd=REPO, input=stdin,
                           capture_output=True, timeout=30, start_new_session=True)
        assert (r.returncode, r.stderr.decode()) == (1, f"{why} ({where}); nothing changed\n")
    assert not path.exists()


def test_a_user_name_that_is_not_utf8_is_a_one_line_error(tmp_path):
    """A user name of bytes that are not UTF-8 on the command line ended in a traceback
    (UnicodeEncodeError) when the file was written; the file stays as it was."""
    path = tmp_path / "f.pw"
    assert run_cli("passwd", "-b", str(path), "alice", "a-pw").returncode == 0
    before = path.read_bytes()
    for user, byte in ((b"\xff", "0xFF"), (b"b\xe9b", "0xE9")):
        r = subprocess.run([*broker_command(), "passwd", "-b", bytes(path), user, b"pw"],
                           cwd=REPO, capture_output=True, timeout=30, start_new_session=True)
        assert (r.returncode, r.stderr.decode()) == (
            1, f"edgebroker: passwd: the user name is not UTF-8 text, which MQTT clients send "
               f"(it has the byte {byte})\n")
    assert path.read_bytes() == before
