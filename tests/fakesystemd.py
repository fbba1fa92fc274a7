"""A stand-in for systemd's notification socket (sd_notify), for tests/server/test_sdnotify.py
and tests/frozen/test_binary.py."""

import os
import socket
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
