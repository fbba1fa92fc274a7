"""A listener on a Unix-domain socket (local clients only, access by file permissions).

The socket file is created with ``unix_socket_mode`` permissions (default
0660: the broker's user and group). A file left at the path by a broker that
died is replaced; a socket some process still answers on, or any other kind of
file, stops the start with a message. The file is removed at shutdown.
Peers are logged as ``unix:PATH`` with the connecting process's pid and uid.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

from edgebroker.config import ListenerConfig
from edgebroker.errors import EdgebrokerError
from edgebroker.server.loop import LISTEN_BACKLOG, Listener

_PEERCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


def _remove_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise EdgebrokerError(f"cannot listen on unix:{path}: a file that is not a socket is "
                              f"in the way")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)             # left by a process that is gone
        return
    except OSError as exc:
        raise EdgebrokerError(f"cannot listen on unix:{path}: {exc.strerror}") from None
    finally:
        probe.close()
    raise EdgebrokerError(f"cannot listen on unix:{path}: another process is listening there")


class UnixListener(Listener):
    def __init__(self, loop, config: ListenerConfig):
        self.loop = loop
        self.config = config
        self.path = config.unix_socket
        mode = int(config.unix_socket_mode, 8)
        _remove_stale(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o777 & ~mode)   # no moment with looser permissions
        try:
            sock.bind(self.path)
            os.chmod(self.path, mode)
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            raise EdgebrokerError(f"cannot listen on unix:{self.path}: "
                                  f"{exc.strerror or exc}") from None
        finally:
            os.umask(old_umask)
        sock.setblocking(False)
        self.sock = sock
        self.family = socket.AF_UNIX
        self.address = f"unix:{self.path}"
        self.paused_until = 0.0
        self.stat = os.stat(self.path)

    def peer_name(self, conn: socket.socket, addr) -> str:
        try:
            pid, uid, _ = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError:
            return self.address
        return f"{self.address} (pid {pid}, uid {uid})"

    def close(self) -> None:
        super().close()
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_dev) == (self.stat.st_ino, self.stat.st_dev):
                os.unlink(self.path)    # only our own socket file
        except OSError:
            pass
