"""systemd notification protocol (sd_notify) without libsystemd.

Under a ``Type=notify`` unit systemd sets ``NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace); each message is one datagram of ``KEY=VALUE`` lines. Outside systemd
every call is a no-op. What the broker sends (systemd/edgebroker.service, docs/deploy.md):

- ``READY=1`` once every listener accepts (again after a reload), ``RELOADING=1`` on SIGHUP
  with ``MONOTONIC_USEC=`` (CLOCK_MONOTONIC in µs, in the same datagram: sd_notify(3) pairs
  them, and ``Type=notify-reload`` needs it), ``STOPPING=1`` when a stop signal arrives;
- from the core loop, every ``Notifier.interval`` seconds: ``STATUS=`` with the connections and
  the PUBLISH rates in and out since the last one, and ``WATCHDOG=1`` when the unit has
  ``WatchdogSec=`` (``WATCHDOG_USEC``): at half of it, so a loop that hangs stops the pings and
  systemd restarts the service.

The one-file binary runs the broker in a child of PyInstaller's bootloader, which is the unit's
main process: ``WATCHDOG_PID`` then names the parent, accepted here, and the unit needs
``NotifyAccess=all`` for systemd to take the child's messages.
"""

from __future__ import annotations

import os
import socket
import sys
import time

STATUS_INTERVAL = 5.0   # seconds between STATUS= lines without a watchdog (or a slower one)


def _address() -> str | None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    return address


def notify(message: str) -> bool:
    address = _address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
    except OSError:
        return False
    return True


def reloading() -> bool:
    """``RELOADING=1`` with ``MONOTONIC_USEC=``, the time the reload starts, in one datagram."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")


def for_this_process(pid: str) -> bool:
    """Whether ``pid`` (WATCHDOG_PID, LISTEN_PID) names this process: its own pid, or in the
    one-file binary its parent's (the bootloader, the unit's main process)."""
    if pid == str(os.getpid()):
        return True
    return bool(getattr(sys, "frozen", False)) and pid == str(os.getppid())


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec:
        return None
    if pid and not for_this_process(pid):
        return None
    try:
        usec = int(usec)
    except ValueError:
        return None
    return usec / 2_000_000 if usec > 0 else None


class Notifier:
    """STATUS= and WATCHDOG=1 from the core loop (Loop.run calls ``tick`` every ``interval``).

    Keeps one socket open; a send that fails (systemd gone, a full socket buffer) is dropped:
    the next tick tries again."""

    def __init__(self, address: str, watchdog: float | None, now: float):
        self.address = address
        self.watchdog = watchdog
        self.interval = min(watchdog, STATUS_INTERVAL) if watchdog else STATUS_INTERVAL
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self._last = now
        self._counts = (0, 0)

    @classmethod
    def from_env(cls, now: float) -> Notifier | None:
        address = _address()
        return cls(address, watchdog_interval(), now) if address is not None else None

    def status(self, now: float, connections: int, received: int, sent: int) -> str:
        """``STATUS=`` text: connections, PUBLISH packets per second in and out since the last
        call (``received``/``sent``: the running counts)."""
        elapsed = now - self._last
        last_received, last_sent = self._counts
        self._last = now
        self._counts = (received, sent)
        if elapsed <= 0:
            return f"{connections} connections"
        return (f"{connections} connections, {(received - last_received) / elapsed:.1f} msg/s in, "
                f"{(sent - last_sent) / elapsed:.1f} msg/s out")

    def tick(self, now: float, connections: int, received: int, sent: int) -> None:
        message = "STATUS=" + self.status(now, connections, received, sent)
        if self.watchdog:
            message = "WATCHDOG=1\n" + message
        try:
            self.sock.sendto(message.encode(), self.address)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
