"""What the user can tell a running event loop (``Commands``), and the outgoing rate limit.

``loop.commands`` is a ``Commands``; its methods only record what is asked and wake the loop
(through a socket pair the loop watches), so they may be called between events, from a
signal handler or from another thread that the user runs; the loop carries them out at the
start of its next pass, in the order asked. The loop's own methods (``loop.pause()``...)
call these.
"""

from __future__ import annotations

import socket
from collections import deque

PAUSE = "pause"
RESUME = "resume"
THROTTLE = "throttle"
DISCONNECT = "disconnect"
RECONNECT = "reconnect"
SHUTDOWN = "shutdown"
SAVE = "save"


class Commands:
    __slots__ = ("_asked", "_reader", "_writer")

    def __init__(self):
        self._asked: deque = deque()   # append/popleft: safe from another thread
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    def _ask(self, *command) -> None:
        self._asked.append(command)
        self.wake()

    def wake(self) -> None:
        """Make the loop look again now (also for a producer that has new requests)."""
        try:
            self._writer.send(b"\0")
        except (BlockingIOError, OSError):
            pass       # a wake-up is already pending, or the loop is closed

    def pause(self) -> None:
        """Stop reading and writing the network, and taking requests (no disconnect)."""
        self._ask(PAUSE)

    def resume(self) -> None:
        self._ask(RESUME)

    def throttle(self, rate: float | None) -> None:
        """At most ``rate`` requests a second taken from the producer (None: no limit)."""
        if rate is not None and not rate > 0:
            raise ValueError(f"throttle rate must be > 0 messages/s or None, not {rate!r}")
        self._ask(THROTTLE, rate)

    def disconnect(self) -> None:
        """Send DISCONNECT and stay disconnected (the iteration ends) until reconnect()."""
        self._ask(DISCONNECT)

    def reconnect(self) -> None:
        self._ask(RECONNECT)

    def shutdown(self, state_file=None) -> None:
        """Disconnect, save the state (to ``state_file`` or the loop's), end the iteration."""
        self._ask(SHUTDOWN, state_file)

    def save_state(self, state_file=None) -> None:
        """Write the state file (``state_file`` or the loop's) at the loop's next pass: a
        checkpoint taken between two passes, never while the loop changes the state."""
        self._ask(SAVE, state_file)

    def woken(self) -> None:
        """Empty the wake-up socket (the loop's, when its selector says it is readable)."""
        try:
            while self._reader.recv(4096):
                pass
        except OSError:     # BlockingIOError: empty
            pass

    def take(self) -> list:
        """The commands asked since the last call (the loop's)."""
        if not self._asked:
            return []
        asked = []
        while self._asked:
            asked.append(self._asked.popleft())
        return asked

    def fileno(self) -> int:
        return self._reader.fileno()

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


class Throttle:
    """A token bucket: ``rate`` requests a second, bursts of up to one second's worth (of one
    request when ``rate`` is below 1: one every 1/rate seconds). The first goes at once."""

    __slots__ = ("rate", "tokens", "at", "burst")

    def __init__(self, rate: float, now: float):
        self.rate = rate
        self.burst = max(rate, 1.0)     # a bucket under 1 token would never give one
        self.tokens = 1.0
        self.at = now

    def take(self, now: float) -> bool:
        tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return True
        self.tokens = tokens
        return False

    def ready_at(self) -> float:
        """When the next request may go."""
        return self.at + max(0.0, 1.0 - self.tokens) / self.rate
