"""`edgebroker passwd` end to end: the prompt on a real terminal (pty), batch mode, delete,
upgrade, atomic writes (0600, or the old mode less group-write and others), user names the
file cannot hold, and the broker accepting what it wrote."""

import base64
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import mqttraw as m
from conftest import REPO, Proc, as_nobody, broker_command, run_cli
from edgebroker.security.passwords import PasswordFile, verify_password
from scramclient import stored_keys


class Terminal:
    """``python -m edgebroker ARGS`` on a pseudo-terminal (its controlling terminal, as for a
    person typing), so getpass really turns echo off."""

    def __init__(self, *args, stdin_fd: int | None = None):
        """``stdin_fd``: the child's stdin instead of the terminal (still its controlling
        terminal)."""
        pid, fd = pty.fork()
        if pid == 0:                                        # the child: exec at once
            try:
                if stdin_fd is not None:
                    os.dup2(stdin_fd, 0)
                os.chdir(REPO)
                os.execv(sys.executable, [sys.executable, "-m", "edgebroker", *args])
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.output = b""

    def expect(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.output:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{text!r} not shown; terminal so far: {self.output!r}"
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready and not self._read():
                raise AssertionError(f"{text!r} not shown before exit: {self.output!r}")

    def _read(self) -> bool:
        try:
            data = os.read(self.fd, 4096)
        except OSError:             # EIO: the child closed the terminal
            return False
        self.output += data
        return bool(data)

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\r")

    def wait(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if ready and not self._read():
                break
        else:
            os.kill(self.pid, signal.SIGKILL)               # still waiting: fail, not hang
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def test_prompt_twice_without_echo(tmp_path):
    path = tmp_path / "passwd"
    term = Terminal("passwd", str(path), "carol")
    term.expect("Password: ")
    term.type("Typed-On-A-Tty")
    term.expect("Reenter password: ")
    term.type("Typed-On-A-Tty")
    assert term.wait() == 0, term.output
    assert b"Typed-On-A-Tty" not in term.output, "the password was echoed"
    assert b"user 'carol' added" in term.output
    assert os.stat(path).st_mode & 0o777 == 0o600
    stored, parsed = PasswordFile.load(str(path)).lookup("carol")
    assert stored.startswith("$scrypt$v=1$") and verify_password(parsed, "Typed-On-A-Tty")


def test_prompt_mismatch_changes_nothing(tmp_path):
    path = tmp_path / "passwd"
    term = Terminal("passwd", str(path), "carol")
    term.expect("Password: ")
    term.type("first")
    term.expect("Reenter password: ")
    term.type("second")
    assert term.wait() == 1
    assert b"the passwords do not match; nothing changed" in term.output
    assert not path.exists()


def test_batch_change_delete_and_the_broker_accepts_it(broker, tmp_path, uid):
    path = tmp_path / "passwd"
    path.write_text("# gateway users\n")
    for user, password in (("alice", "a-1"), ("bob", "b-1"), ("carol", "c-1")):
        r = run_cli("passwd", "-b", str(path), user, password)
        assert r.returncode == 0 and f"user '{user}' added" in r.stdout, r.stderr
    r = run_cli("passwd", "-b", str(path), "alice", "a-2")
    assert r.returncode == 0 and "user 'alice' changed" in r.stdout
    r = run_cli("passwd", "-D", str(path), "bob")
    assert r.returncode == 0 and "user 'bob' deleted" in r.stdout
    lines = path.read_text().splitlines()
    assert lines[0] == "# gateway users"
    assert [ln.split(":")[0] for ln in lines[1:]] == ["alice", "carol"]      # order kept
    r = run_cli("passwd", "-D", str(path), "bob")
    assert r.returncode == 1 and f"passwd: {path}: no user 'bob'" in r.stderr
    b = broker(password_file=str(path))
    assert b.client(f"{uid}-a", username="alice", password="a-2").ping() == []
    b.client(f"{uid}-a1", username="alice", password="a-1", expect_rc=4)
    b.client(f"{uid}-b", username="bob", password="b-1", expect_rc=4)
    assert b.client(f"{uid}-c", username="carol", password="c-1").ping() == []


def test_upgrade_plain_file(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("# plain\nalice:alice pw with spaces\nbob:b0b\n")
    os.chmod(path, 0o644)
    r = run_cli("passwd", "-U", str(path))
    assert r.returncode == 0 and "2 password(s) hashed, 0 already hashed" in r.stdout, r.stderr
    assert os.stat(path).st_mode & 0o777 == 0o640          # others' bits cleared
    upgraded = path.read_text()
    assert "alice pw with spaces" not in upgraded and upgraded.startswith("# plain\n")
    f = PasswordFile.load(str(path))
    assert verify_password(f.lookup("alice")[1], "alice pw with spaces")
    assert verify_password(f.lookup("bob")[1], "b0b")
    r = run_cli("passwd", "-U", str(path))                 # twice: nothing re-hashed
    assert r.returncode == 0 and "0 password(s) hashed, 2 already hashed" in r.stdout
    assert path.read_text() == upgraded


def test_pbkdf2_option_writes_mosquitto_format(tmp_path):
    path = tmp_path / "passwd"
    r = run_cli("passwd", "--hash", "pbkdf2", "-b", str(path), "dave", "d-pw")
    assert r.returncode == 0, r.stderr
    stored, parsed = PasswordFile.load(str(path)).lookup("dave")
    assert stored.startswith("$7$210000$") and verify_password(parsed, "d-pw")


def scram_field(path, user: str) -> list[str]:
    """The parts of ``user``'s SCRAM keys field: ['', 'scram-sha-256', 'v=1', 'i=N', SALT,
    STOREDKEY, SERVERKEY]."""
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith(user + ":"))
    fields = line.split(":")
    assert len(fields) == 3, line
    return fields[2].split("$")


def test_scram_keys_are_written_beside_the_hash(tmp_path):
    """The third field is what docs/security.md describes, byte for byte: checked against keys
    the test computes itself from the salt and iteration count."""
    path = tmp_path / "passwd"
    assert run_cli("passwd", "-b", str(path), "alice", "a-pw").returncode == 0
    r = run_cli("passwd", "--scram-iterations", "8192", "--hash", "pbkdf2", "-b", str(path),
                "bob", "b-pw")
    assert r.returncode == 0, r.stderr
    for user, password, iterations in (("alice", "a-pw", 4096), ("bob", "b-pw", 8192)):
        parts = scram_field(path, user)
        assert parts[:4] == ["", "scram-sha-256", "v=1", f"i={iterations}"]
        salt = base64.b64decode(parts[4], validate=True)
        assert len(salt) == 16
        stored, server = stored_keys(password, salt, iterations)
        assert parts[5:] == [base64.b64encode(stored).decode(), base64.b64encode(server).decode()]
    assert scram_field(path, "alice")[4] != scram_field(path, "bob")[4]      # salt per user
    f = PasswordFile.load(str(path))
    assert verify_password(f.lookup("alice")[1], "a-pw")
    assert verify_password(f.lookup("bob")[1], "b-pw")
    r = run_cli("passwd", "--scram-iterations", "1000", "-b", str(path), "carol", "c-pw")
    assert r.returncode == 2 and "--scram-iterations must be 4096 to" in r.stderr  # usage
    r = run_cli("passwd", "--no-scram", "-b", str(path), "alice", "a-pw2")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith("alice:"))
    assert line.count(":") == 1 and line.startswith("alice:$scrypt$")
    assert "no SCRAM keys" in PasswordFile.load(str(path)).scram_keys("alice")


def test_upgrade_writes_scram_keys_for_plain_lines_only(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("alice:a-pw\n")
    os.chmod(path, 0o600)
    assert run_cli("passwd", "-U", str(path)).returncode == 0
    salt = base64.b64decode(scram_field(path, "alice")[4])
    assert scram_field(path, "alice")[5] == base64.b64encode(
        stored_keys("a-pw", salt, 4096)[0]).decode()


def test_a_pbkdf2_file_with_scram_keys_still_loads_in_mosquitto(tmp_path):
    """Mosquitto reads a line's first two fields: the SCRAM keys do not stop it (2.0.11 here)."""
    path = tmp_path / "passwd"
    assert run_cli("passwd", "--hash", "pbkdf2", "-b", str(path), "dave", "d-pw").returncode == 0
    sock = tmp_path / "mosquitto.sock"
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"user root\nlistener 0 {sock}\npassword_file {path}\n"
                    f"allow_anonymous false\n")
    proc = Proc(["mosquitto", "-c", str(conf), "-v"])
    try:
        proc.wait_line(lambda line: line.endswith(" running"))
        good = m.RawClient("", 0, unix_path=str(sock))
        assert good.connect("d1", username="dave", password="d-pw").rc == 0
        bad = m.RawClient("", 0, unix_path=str(sock))
        assert bad.connect("d2", username="dave", password="wrong").rc == 5
        good.close()
        bad.close()
    finally:
        proc.kill(signal.SIGTERM)


def test_writes_are_atomic_and_keep_the_owner(tmp_path):
    path = tmp_path / "passwd"
    assert run_cli("passwd", "-b", str(path), "alice", "x").returncode == 0
    if os.geteuid() == 0:
        os.chown(path, 4321, 4322)
    before = os.stat(path)
    assert run_cli("passwd", "-b", str(path), "bob", "y").returncode == 0
    after = os.stat(path)
    assert after.st_ino != before.st_ino, "file rewritten in place instead of replaced"
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert after.st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]


@pytest.mark.parametrize("before, after", [
    (0o600, 0o600), (0o640, 0o640), (0o400, 0o400), (0o440, 0o440),
    (0o644, 0o640), (0o660, 0o640), (0o666, 0o640), (0o604, 0o600), (0o755, 0o640),
])
def test_writes_keep_the_mode_less_group_write_and_others(tmp_path, before, after):
    """docs/security.md: 0640 for a group the broker runs in. Each command keeps that mode
    (the old one with group-write and others' bits cleared); a new file is 0600."""
    path = tmp_path / "passwd"
    assert run_cli("passwd", "-b", str(path), "alice", "a-pw").returncode == 0
    assert os.stat(path).st_mode & 0o777 == 0o600
    for args in (["-b", str(path), "bob", "b-pw"], ["-b", str(path), "bob", "b-pw2"],
                 ["-D", str(path), "bob"], ["-U", str(path)]):
        os.chmod(path, before)
        r = run_cli("passwd", *args)
        assert r.returncode == 0, (args, r.stderr)
        assert os.stat(path).st_mode & 0o7777 == after, (args, oct(os.stat(path).st_mode))


def test_group_read_is_dropped_when_the_group_cannot_be_kept():
    """A user who may not give the new file the old group (not a member of it) gets a file of
    its own group: that group must not get the old file's group read. (Root sets up a file of
    a group nobody is not in, and runs passwd as nobody.)"""
    prefix = as_nobody()
    directory = tempfile.mkdtemp(prefix="edgebroker-passwd-")    # /tmp: others may enter
    try:
        os.chmod(directory, 0o755)
        os.chown(directory, 65534, 65534)
        path = os.path.join(directory, "passwd")
        assert run_cli("passwd", "-b", path, "alice", "a-pw").returncode == 0
        os.chown(path, 65534, 4322)
        os.chmod(path, 0o640)
        r = subprocess.run([*prefix, *broker_command(), "passwd", "-b", path, "bob", "b-pw"],
                           cwd=REPO, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        after = os.stat(path)
        assert (after.st_uid, after.st_gid) == (65534, 65534)
        assert after.st_mode & 0o777 == 0o600, oct(after.st_mode)
    finally:
        shutil.rmtree(directory)


def test_usage_errors(tmp_path):
    path = str(tmp_path / "passwd")
    for args, code, words in (     # the arguments wrong for the mode: a usage error, exit 2
            (["-b", path, "alice"], 2, "usage: edgebroker passwd -b FILE USER PASSWORD"),
            ([path], 2, "usage: edgebroker passwd FILE USER"),
            (["-D", path], 2, "usage: edgebroker passwd -D FILE USER"),
            (["-U", path, "alice"], 2, "usage: edgebroker passwd -U FILE"),
            (["-U", path], 1, f"passwd: {path}: file not found"),
            (["-b", path, "al:ice", "pw"], 1, "a user name cannot contain ':'"),
            (["-b", path, "alice", ""], 1, "the password is empty"),
    ):
        r = run_cli("passwd", *args)
        assert r.returncode == code, (args, r.stderr)
        assert words in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("passwd", "-b", "-D", path, "alice")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    assert not os.path.exists(path)


@pytest.mark.parametrize("user, words", [
    ("bob\u2028x", "cannot contain control characters or line separators (it has U+2028)"),
    ("bob\u2029x", "(it has U+2029)"),
    ("bob\x85x", "(it has U+0085)"),
    ("bob\x0bx", "(it has U+000B)"),
    ("#admin", "a user name cannot start with '#' (the line would be a comment)"),
    ("  #admin", "a user name cannot start with '#'"),
])
def test_user_names_the_file_cannot_hold_are_refused(tmp_path, user, words):
    """A user name the loader would read as two lines (str.splitlines) or as a comment: the
    file stays as it was, and still loads."""
    path = tmp_path / "passwd"
    assert run_cli("passwd", "-b", str(path), "alice", "a-pw").returncode == 0
    before = path.read_bytes()
    r = run_cli("passwd", "-b", str(path), user, "b-pw")
    assert r.returncode == 1, r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert path.read_bytes() == before
    assert sorted(PasswordFile.load(str(path)).entries) == ["alice"]


def test_comments_with_unicode_line_breaks_are_kept_whole(tmp_path):
    """passwd reads the file by "\\n" as the broker does: a comment holding U+2028 or U+0085
    is kept as one line, not cut into a comment and a line the broker refuses."""
    path = tmp_path / "passwd"
    comment = "# gateway \u2028 users \x85 (caf\u00e9)"
    path.write_text(comment + "\r\n")
    os.chmod(path, 0o600)
    r = run_cli("passwd", "-b", str(path), "alice", "a-pw")
    assert r.returncode == 0, r.stderr
    lines = path.read_text().split("\n")
    assert lines[0] == comment and lines[1].startswith("alice:$scrypt$") and lines[2:] == [""]
    f = PasswordFile.load(str(path))
    assert verify_password(f.lookup("alice")[1], "a-pw")


def piped(path, user: str, stdin: str) -> subprocess.CompletedProcess:
    """``printf STDIN | edgebroker passwd FILE USER`` with no controlling terminal (cron, CI,
    ssh without a tty), where getpass warned (GetPassWarning) and read the wrong lines."""
    return subprocess.run([sys.executable, "-m", "edgebroker", "passwd", str(path), user],
                          cwd=REPO, input=stdin, capture_output=True, text=True, timeout=30,
                          start_new_session=True)


def test_password_piped_without_a_terminal(tmp_path):
    path = tmp_path / "passwd"
    r = piped(path, "alice", "S3cret pw\n")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == f"{path}: user 'alice' added\n"
    assert verify_password(PasswordFile.load(str(path)).lookup("alice")[1], "S3cret pw")
    r = piped(path, "bob", "b-pw\nb-pw\n")              # input made for the two prompts
    assert (r.returncode, r.stderr) == (0, "")
    assert verify_password(PasswordFile.load(str(path)).lookup("bob")[1], "b-pw")
    before = path.read_text()
    r = piped(path, "bob", "one\nother\n")
    assert r.returncode == 1
    assert r.stderr == "edgebroker: passwd: the two lines on stdin differ; nothing changed\n"
    r = piped(path, "carol", "")
    assert r.returncode == 1 and "no password on stdin" in r.stderr
    assert path.read_text() == before


@pytest.mark.parametrize("pw", ["abc\u2028def", "abc\u2028", "a\x85b\x0cc\x0bd\x1ce\x1d\x1e",
                                "\u2029x"])
@pytest.mark.parametrize("end", ["", "\n", "\r\n"])
def test_password_piped_is_cut_at_a_newline_only(tmp_path, pw, end):
    """Stdin was split at every break str.splitlines knows: "abc<U+2028>" with no newline
    stored "abc", and "abc<U+2028>def" was refused as two lines that differ."""
    path = tmp_path / "passwd"
    r = piped(path, "alice", pw + end)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    entry = PasswordFile.load(str(path)).lookup("alice")[1]
    assert verify_password(entry, pw) and not verify_password(entry, pw.splitlines()[0])
    r = piped(path, "bob", f"{pw}\r\n{pw}\n")               # the two prompts' lines
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert verify_password(PasswordFile.load(str(path)).lookup("bob")[1], pw)


def test_password_piped_in_a_terminal_session(tmp_path):
    """`echo PW | edgebroker passwd FILE USER` typed in a shell: stdin is the pipe, not the
    terminal (getpass read the terminal, waiting for someone to type)."""
    path = tmp_path / "passwd"
    r, w = os.pipe()
    os.write(w, b"from-the-pipe\n")
    os.close(w)
    term = Terminal("passwd", str(path), "dave", stdin_fd=r)
    os.close(r)
    assert term.wait() == 0, term.output
    assert b"Password" not in term.output and b"from-the-pipe" not in term.output
    assert verify_password(PasswordFile.load(str(path)).lookup("dave")[1], "from-the-pipe")
