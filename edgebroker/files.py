"""Small files replaced whole: a crash leaves the old file or the new one, never a mixture
(the commit log's recovery point and indexes, the uploader's checkpoint, the broker's snapshot,
a bridge's checkpoint, the client's state file), and read whole (``read_small_file``)."""

from __future__ import annotations

import errno
import os
import stat

from edgebroker.errors import ConfigError


def write_small_file(path: str, data: bytes, dir_fd: int | None = None,
                     mode: int = 0o640) -> None:
    """Replace ``path`` atomically: write a temporary file, fsync it, rename it, and fsync
    the directory open as ``dir_fd`` (none given: the caller does not need the rename
    durable, as for an index the log can rebuild)."""
    tmp = path + ".tmp"
    fd = open_replaced(tmp, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except OSError:
        try:
            os.unlink(tmp)  # (its blocks: a full disk needs them back)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if dir_fd is not None:
        os.fsync(dir_fd)


class NotRegularFile(OSError):
    """A state file's path names something else: a FIFO, a device, a socket, a folder."""

    def __str__(self) -> str:      # the callers' messages name the path
        return self.strerror


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def open_regular(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a regular file (made with ``mode`` when ``flags`` say so), without
    waiting: a FIFO there (whose open would wait for the other end) or anything else that is
    not a regular file raises ``NotRegularFile`` naming it. (O_NONBLOCK: a FIFO opened for
    reading returns at once, for writing fails with ENXIO; a regular file is not changed.)"""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno != errno.ENXIO:    # (a FIFO opened for writing with no reader)
            raise
        fd = None
        st_mode = os.stat(path).st_mode
    else:
        st_mode = os.fstat(fd).st_mode
    if fd is None or not stat.S_ISREG(st_mode):
        if fd is not None:
            os.close(fd)
        kind = next((name for test, name in _KINDS if test(st_mode)), "not a file")
        raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind})", path)
    os.set_blocking(fd, True)
    return fd


def open_replaced(path: str, mode: int = 0o600) -> int:
    """``path`` opened to be written anew (a file of ours: the broker's temporary and batch
    files); something else put there by hand (a FIFO), not a folder, is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        return open_regular(path, flags, mode)
    except NotRegularFile:
        os.unlink(path)
        return open_regular(path, flags, mode)


def config_file_mode(path: str, key: str) -> int:
    """The mode of ``path``, the file of setting ``key``, which must be a regular file (a
    FIFO would block the thread that opens it, a device could be endless): ConfigError naming
    ``key`` and ``path`` otherwise."""
    return config_file_stat(path, key).st_mode


def config_file_stat(path: str, key: str) -> os.stat_result:
    """``config_file_mode``'s check, giving the whole stat result (its owner too)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{key}: {path}: not a regular file")
    return st


SERVICE_USER = "edgebroker"   # the systemd unit's User= (docs/deploy.md, "Passwords")


def owner_problem(path: str, uid: int) -> str | None:
    """None when ``path``'s owner ``uid`` is root, the broker's (effective) user or the
    service's system user (``SERVICE_USER``: root's `config check` of the unit's files); else
    what is wrong with it: its owner can change the file (or its permissions) at any time,
    whatever they say now."""
    import pwd
    me = os.geteuid()
    if uid in (0, me):
        return None
    try:
        if pwd.getpwnam(SERVICE_USER).pw_uid == uid:
            return None
    except KeyError:
        pass
    return (f"owned by {_user_name(uid)}, who can change it whatever its permissions (only "
            f"root, the broker's user {_user_name(me)} or the {SERVICE_USER} system user may "
            f"own it); "
            f"run: chown {_user_name(me, bare=True)} {path}")


def _user_name(uid: int, bare: bool = False) -> str:
    """``name (uid N)``, or the name alone (``bare``); the number alone for a uid without a
    name (a dynamic user's, another user namespace's)."""
    import pwd
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid) if bare else f"uid {uid}"
    return name if bare else f"{name} (uid {uid})"


def read_small_file(path: str) -> bytes:
    """The whole of the regular file ``path``. Something else there (a FIFO, whose open
    would wait for a writer and whose read for its data; a device, that may never end)
    raises ``NotRegularFile`` naming it, without waiting; FileNotFoundError and other
    OSErrors as open and read raise them."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """``write_small_file`` with the rename made durable: the directory is opened, fsynced
    after the rename, and closed."""
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        write_small_file(path, data, dir_fd, mode)
    finally:
        os.close(dir_fd)


def write_zeros(fd: int, nbytes: int) -> int:
    """Make the file ``nbytes`` long by writing zeros and fsync it (room taken on a file
    system that cannot allocate ahead: the file's size then counts it); 0 or the errno."""
    block = bytes(64 << 10)
    try:
        size = os.fstat(fd).st_size
        while size < nbytes:
            size += os.pwrite(fd, block[:nbytes - size], size)
        os.fsync(fd)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


def numbered_files(directory: str, pattern) -> list[int]:
    """The numbers of the files in ``directory`` whose names match ``pattern`` (a compiled
    regular expression whose first group is the number), ascending; none for no directory."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def not_a_log_dir(log_dir: str) -> str | None:
    """What is wrong with ``log_dir`` (``<state directory>/log``) when something other than a
    directory is there (the commit log could not be opened or created), else None. (Asked by
    serve and the commands that read the log: here, as a broker does not import cli.state_dir.)"""
    if not os.path.lexists(log_dir) or os.path.isdir(log_dir):
        return None
    what = "a regular file" if os.path.isfile(log_dir) else "not a directory"
    return (f"{log_dir} is {what}: the commit log is kept in a directory of that name "
            f"(move it away)")


# The configuration files read that were pipes (`-c /dev/stdin`, `-c <(...)`, a FIFO): read at
# start, they are not read again (a reload would wait on the loop thread for a writer).
pipes_read: set[str] = set()


def open_config(path: str):
    """The configuration file, opened to be read: a regular file, or once a pipe. Anything
    else (a device, which may never end, a folder), or a pipe read already, raises
    NotRegularFile without waiting; OSErrors as open raises them."""
    if stat.S_ISFIFO(os.stat(path).st_mode):
        if path in pipes_read:
            raise NotRegularFile(errno.EINVAL, "not a regular file (a pipe), read at start: it "
                                 "cannot be read again; restart to change the configuration")
        pipes_read.add(path)
        return open(path, "rb")     # (waits for the other end: at start, that is the point)
    return os.fdopen(open_regular(path, os.O_RDONLY), "rb")
