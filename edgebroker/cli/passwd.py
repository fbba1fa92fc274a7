"""`edgebroker passwd`: add, change, delete and upgrade users in a password file.

    edgebroker passwd FILE USER              set USER's password (asked twice, not shown;
                                             read from stdin when it is not a terminal)
    edgebroker passwd -b FILE USER PASSWORD  the same, password on the command line (scripts)
    edgebroker passwd -D FILE USER           delete USER
    edgebroker passwd -U FILE                hash every plain-text user:password line

The file is created when missing, with mode 0600. Every change replaces it atomically (a
temporary file, fsynced, renamed over) keeping its owner, group and mode, less group-write and
others' bits (``passwords.write_atomic``); comment lines and other users' lines are kept as
they are. A symbolic link is followed: the file it points to is replaced, the link stays. An exclusive lock on the file (flock), held from its read to the rename, makes two
commands editing it at once take turns (``_locked``): neither loses the other's change.
Hashes are scrypt by default
(docs/security.md describes the format); ``--hash pbkdf2`` writes Mosquitto's
PBKDF2-SHA512 format instead. Beside the hash, as a third field, go the user's
SCRAM-SHA-256 keys (``--scram-iterations``, default 4096), so the user can also
log in by SCRAM (MQTT 5.0 enhanced authentication) without sending the password;
``--no-scram`` leaves them out (they make a stolen file cheaper to attack than the
hash alone: docs/security.md).
A running broker reads the file again on SIGHUP.
"""

from __future__ import annotations

import getpass
import os
import stat
import sys
from contextlib import contextmanager

from edgebroker.cli.options import UsageError
from edgebroker.errors import EdgebrokerError
from edgebroker.security import passwords, scram


def add_parser(commands) -> None:
    p = commands.add_parser(
        "passwd", help="manage a password file",
        description="Set (asking for the password twice), delete or upgrade users in a "
                    "password file of username:hash lines.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-b", dest="batch", action="store_true",
                      help="batch mode: the password is the last argument")
    mode.add_argument("-D", dest="delete", action="store_true", help="delete USER")
    mode.add_argument("-U", dest="upgrade", action="store_true",
                      help="hash the plain-text passwords of a user:password file")
    p.add_argument("--hash", choices=("scrypt", "pbkdf2"), default="scrypt",
                   help="hash to write (default scrypt)")
    p.add_argument("--scram-iterations", type=int, default=scram.DEFAULT_ITERATIONS,
                   metavar="N", help=f"iteration count of the SCRAM-SHA-256 keys written beside "
                                     f"the hash (default and minimum {scram.MIN_ITERATIONS})")
    p.add_argument("--no-scram", dest="scram", action="store_false",
                   help="write the hash alone, without SCRAM-SHA-256 keys (the user then logs "
                        "in with its password only)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("user", metavar="USER", nargs="?")
    p.add_argument("password", metavar="PASSWORD", nargs="?")
    p.set_defaults(run=run)


def run(args) -> int:
    iterations = args.scram_iterations if args.scram else 0
    if args.scram and not scram.MIN_ITERATIONS <= iterations <= scram.MAX_ITERATIONS:
        raise UsageError(f"passwd: --scram-iterations must be {scram.MIN_ITERATIONS} to "
                              f"{scram.MAX_ITERATIONS} (RFC 7677's minimum is 4096)")
    if args.upgrade:
        _expect(args, user=False, password=False, usage="-U FILE")
        return upgrade(args.file, args.hash, iterations)
    if args.delete:
        _expect(args, user=True, password=False, usage="-D FILE USER")
        return delete(args.file, args.user)
    if args.batch:
        _expect(args, user=True, password=True, usage="-b FILE USER PASSWORD")
        return set_password(args.file, args.user, args.password, args.hash, iterations)
    _expect(args, user=True, password=False, usage="FILE USER")
    return set_password(args.file, args.user, prompt(), args.hash, iterations)


def _expect(args, *, user: bool, password: bool, usage: str) -> None:
    if (args.user is not None) != user or (args.password is not None) != password:
        raise UsageError(f"passwd: usage: edgebroker passwd {usage}")


def prompt() -> str:
    """The password, asked twice on a terminal; from stdin when it is not one (a pipe or a
    file: ``echo "$PW" | edgebroker passwd FILE USER``)."""
    if not sys.stdin.isatty():
        return read_stdin()
    try:
        first = getpass.getpass("Password: ")
        second = getpass.getpass("Reenter password: ")
    except EOFError:
        raise EdgebrokerError("passwd: no password entered") from None
    except UnicodeDecodeError:
        raise EdgebrokerError(f"passwd: {_NOT_UTF8}; nothing changed") from None
    if first != second:
        raise EdgebrokerError("passwd: the passwords do not match; nothing changed")
    return first


def read_stdin() -> str:
    """The first line of stdin, without its line end ("\n" or "\r\n" only: a password may
    hold U+2028, a form feed and the other breaks str.splitlines knows). A second line, if
    any, must repeat it (input made for the two prompts)."""
    data = sys.stdin.buffer.read()
    try:
        lines = passwords.lines_of(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise EdgebrokerError(f"passwd: {_NOT_UTF8} (stdin has the byte "
                              f"0x{data[exc.start]:02X}); nothing changed") from None
    if not lines:
        raise EdgebrokerError("passwd: no password on stdin (it is not a terminal: give the "
                              "password as its first line)")
    if len(lines) > 1 and lines[1] != lines[0]:
        raise EdgebrokerError("passwd: the two lines on stdin differ; nothing changed")
    return lines[0]


_NOT_UTF8 = ("the password is not UTF-8 text, which MQTT clients send and SCRAM-SHA-256 "
             "needs")


def _user_of(line: str) -> str | None:
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    user, sep, _ = line.partition(":")
    return user if sep else None


def entry(user: str, password: str, scheme: str = "scrypt",
          iterations: int = scram.DEFAULT_ITERATIONS) -> str:
    """A password file line: ``user:hash:SCRAM keys`` (``user:hash`` when ``iterations`` is 0)."""
    line = f"{user}:{passwords.hash_password(password, scheme)}"
    if not iterations:
        return line
    return f"{line}:{scram.format_keys(scram.derive(password, iterations=iterations))}"


def set_password(path: str, user: str, password: str, scheme: str = "scrypt",
                 iterations: int = scram.DEFAULT_ITERATIONS) -> int:
    problem = passwords.check_username(user)
    if problem:
        raise EdgebrokerError(f"passwd: {problem}")
    if not password:
        raise EdgebrokerError("passwd: the password is empty; nothing changed")
    bad = next((ch for ch in password if 0xDC80 <= ord(ch) <= 0xDCFF), None)
    if bad is not None:     # a byte of the command line that is not UTF-8 (surrogateescape)
        raise EdgebrokerError(f"passwd: {_NOT_UTF8} (it has the byte 0x{ord(bad) - 0xDC00:02X})"
                              f"; nothing changed")
    new = entry(user, password, scheme, iterations)     # (before the lock: it takes a while)
    with _locked(path, create=True) as lines:
        for i, line in enumerate(lines):
            if _user_of(line) == user:
                lines[i] = new
                action = "changed"
                break
        else:
            lines.append(new)
            action = "added"
        _write(path, lines)
    print(f"{path}: user {user!r} {action}")
    return 0


def delete(path: str, user: str) -> int:
    with _locked(path) as lines:
        kept = [line for line in lines or () if _user_of(line) != user]
        if lines is None or len(kept) == len(lines):
            raise EdgebrokerError(f"passwd: {path}: no user {user!r}")
        _write(path, kept)
    print(f"{path}: user {user!r} deleted")
    return 0


def upgrade(path: str, scheme: str = "scrypt", iterations: int = scram.DEFAULT_ITERATIONS) -> int:
    hashed = kept = 0
    with _locked(path) as lines:
        if lines is None:
            raise EdgebrokerError(f"passwd: {path}: file not found")
        users = set()
        for i, line in enumerate(lines):
            user = _user_of(line)
            if user is None and line.strip() and not line.lstrip().startswith("#"):
                problem = "expected username:password (or username:hash)"  # (as the broker)
            elif user is None:
                continue
            elif user in users:
                problem = f"user {user!r} is listed twice"
            else:
                problem = passwords.check_username(user)
            if problem:
                raise EdgebrokerError(f"passwd: {path} line {i + 1}: {problem}; nothing "
                                      f"changed")
            users.add(user)
            secret = line.partition(":")[2]
            try:
                passwords.parse_hash(secret.partition(":")[0].strip())
                kept += 1               # already a hash: running -U twice changes nothing
                continue
            except passwords.HashError:
                pass
            if not secret:
                raise EdgebrokerError(f"passwd: {path} line {i + 1}: user {user!r} has an empty "
                                      f"password; nothing changed")
            lines[i] = entry(user, secret, scheme, iterations)
            hashed += 1
        _write(path, lines)
    print(f"{path}: {hashed} password(s) hashed, {kept} already hashed")
    return 0


# Times a command may find the file replaced (by the command it waited for) before it holds
# the lock on the file the path names: each is another command's whole edit.
LOCK_ATTEMPTS = 100


@contextmanager
def _locked(path: str, create: bool = False):
    """The file's lines, read under an exclusive lock (flock) on the file, held until the
    block ends (after ``_write`` renamed the new file over it). A command that waited finds
    the path naming the file the one before it wrote: it then locks that one and reads it.
    A missing file is created empty (mode 0600) with ``create``, and removed again when the
    block fails; else None, with no lock (nothing will be written)."""
    import fcntl
    for _ in range(LOCK_ATTEMPTS):
        created = False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                yield None
                return
            try:    # (a link to no file: the file it names is created)
                fd = os.open(os.path.realpath(path),
                             os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                raise EdgebrokerError(f"passwd: {path}: cannot create: {exc.strerror}") from None
            created = True
        except OSError as exc:
            raise EdgebrokerError(f"passwd: {path}: cannot read: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise EdgebrokerError(f"passwd: {path}: not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                continue        # replaced or removed while this command waited: again
            try:
                yield _lines(path, fd)
            except BaseException:
                if created and os.fstat(fd).st_size == 0:
                    os.unlink(os.path.realpath(path))
                raise
            return
        finally:
            os.close(fd)
    raise EdgebrokerError(f"passwd: {path}: replaced by other commands {LOCK_ATTEMPTS} times "
                          f"while this one waited to edit it; nothing changed")


def _lines(path: str, fd: int) -> list[str]:
    try:
        # utf-8-sig: a byte order mark at the start is skipped, as the broker skips it (it
        # is not part of the first user's name); the file is written without it.
        with open(os.dup(fd), encoding="utf-8-sig") as fh:
            return passwords.lines_of(fh.read())
    except OSError as exc:
        raise EdgebrokerError(f"passwd: {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise EdgebrokerError(f"passwd: {path}: not UTF-8 text") from None


def _write(path: str, lines: list[str]) -> None:
    try:
        passwords.write_atomic(path, lines)
    except OSError as exc:
        raise EdgebrokerError(f"passwd: {path}: cannot write: {exc.strerror}") from None
