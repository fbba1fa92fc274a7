"""Stand-ins for systemd: its notification socket (sd_notify), for tests/server/test_sdnotify.py
and tests/frozen/test_binary.py; a socket unit's listening sockets (socket activation), for
tests/server/test_socket_activation.py and tests/frozen/test_binary.py."""

import os
import socket
import sys
import tempfile
import time

import pytest


class FakeSystemd:
    """The notification socket: every datagram received, each as its list of lines."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.messages: list[list[str]] = []

    def next(self, timeout: float) -> list[str] | None:
        """The next datagram within ``timeout`` s, or None."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            return None
        lines = data.decode().split("\n")
        self.messages.append(lines)
        return lines

    def wait_for(self, pred, timeout: float = 10.0) -> list[str]:
        """The first datagram from now on with a line for which ``pred`` holds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            lines = self.next(left)
            if lines is not None and any(pred(ln) for ln in lines):
                return lines
        raise AssertionError(f"no such notification within {timeout} s; got {self.messages}")

    def close(self):
        self.sock.close()


@pytest.fixture
def systemd(monkeypatch):
    """A FakeSystemd named by NOTIFY_SOCKET, with no WATCHDOG_USEC/WATCHDOG_PID set."""
    with tempfile.TemporaryDirectory(prefix="ebsd") as d:   # short: AF_UNIX paths are ≤ 107 bytes
        fake = FakeSystemd(os.path.join(d, "notify"))
        monkeypatch.setenv("NOTIFY_SOCKET", fake.sock.getsockname())
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        yield fake
        fake.close()


# The exec wrapper between the test and the broker: moves the descriptors it is given to
# 3, 4, ... and sets LISTEN_PID to its own pid, which the broker keeps (exec), as systemd does
# in the child it forks. argv: FD,FD,... NAME:NAME:... COMMAND...
EXEC_WRAPPER = """
import fcntl, os, sys
fds = [int(fd) for fd in sys.argv[1].split(",")]
moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds)) for fd in fds]  # above every target
for fd in fds:
    os.close(fd)
for i, fd in enumerate(moved):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=sys.argv[2],
                  LISTEN_PID=str(os.getpid()))
os.execvp(sys.argv[3], sys.argv[3:])
"""


class SocketUnit:
    """Listening sockets held as systemd holds a socket unit's: bound here, passed to each
    process started through ``wrap`` at descriptors 3, 4, ... (in the order added) with
    LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID, and still open here between two of them."""

    def __init__(self):
        self.sockets: list[tuple[str, object]] = []   # (FileDescriptorName, socket or fd)

    def listen_tcp(self, name: str, backlog: int = 128) -> int:
        """A TCP socket listening on a free loopback port; returns the port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(backlog)
        self.sockets.append((name, sock))
        return sock.getsockname()[1]

    def listen_unix(self, name: str, path: str, backlog: int = 128) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(backlog)
        self.sockets.append((name, sock))

    def pass_other(self, name: str, thing) -> None:
        """Pass something that is not a listening socket (a descriptor or a socket object)."""
        self.sockets.append((name, thing))

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(s if isinstance(s, int) else s.fileno() for _, s in self.sockets)

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` started as systemd starts a socket-activated service (pass ``fds`` to
        Popen's pass_fds)."""
        return [sys.executable, "-c", EXEC_WRAPPER, ",".join(map(str, self.fds)),
                ":".join(name for name, _ in self.sockets), *command]

    def close(self) -> None:
        for _, s in self.sockets:
            if isinstance(s, int):
                os.close(s)
            else:
                s.close()
        self.sockets.clear()
