"""Readiness for the loop: epoll used directly on Linux, ``selectors`` elsewhere.

The loop needs little of a selector: register, modify and unregister a socket with a callback,
and a poll that calls each ready socket's callback with its mask (``dispatch``; ``select``
returns the ``(callback, mask)`` pairs instead), where the mask uses ``selectors.EVENT_READ``
and ``EVENT_WRITE``. The standard library's selectors keep a ``SelectorKey`` named tuple and
bookkeeping per socket (about 110 bytes; 1 MB at 10,000 idle connections); ``EpollPoller`` keeps
one dictionary entry, file descriptor -> callback, and asks the kernel for the rest.
"""

from __future__ import annotations

import math
import select
import selectors
import time

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE

if hasattr(select, "epoll"):
    _IN, _OUT = select.EPOLLIN, select.EPOLLOUT
    _TROUBLE = select.EPOLLERR | select.EPOLLHUP
    _TO_EPOLL = {EVENT_READ: _IN, EVENT_WRITE: _OUT, EVENT_READ | EVENT_WRITE: _IN | _OUT}
    _MASKS = {_IN: EVENT_READ, _OUT: EVENT_WRITE, _IN | _OUT: EVENT_READ | EVENT_WRITE}


MAX_EVENTS = 1024  # ready sockets taken per poll


class EpollPoller:
    """fd -> callback over ``select.epoll``. Same contract as a selector, callback for key."""

    def __init__(self, clock=time.monotonic):
        self._epoll = select.epoll()
        self._data: dict = {}
        self._clock = clock
        self.woke = 0.0         # when the last dispatch's wait ended (the loop's pass time)

    def register(self, sock, events: int, data) -> None:
        fd = sock.fileno()
        if fd in self._data:
            raise KeyError(f"file descriptor {fd} is already registered")
        self._epoll.register(fd, _TO_EPOLL[events])
        self._data[fd] = data

    def modify(self, sock, events: int, data) -> None:
        fd = sock.fileno()
        if fd not in self._data:
            raise KeyError(f"file descriptor {fd} is not registered")
        self._epoll.modify(fd, _TO_EPOLL[events])
        self._data[fd] = data

    def unregister(self, sock) -> None:
        """KeyError when not registered (as selectors). A socket closed while registered
        (fileno -1) is found by its callback's ``sock``; the kernel already dropped it."""
        fd = sock.fileno()
        if fd < 0:
            for fd, data in self._data.items():
                if getattr(getattr(data, "__self__", data), "sock", None) is sock:
                    del self._data[fd]
                    return
            raise KeyError("closed socket is not registered")
        del self._data[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass  # closed and reopened elsewhere: nothing left to remove

    def _poll(self, timeout: float | None) -> list:
        if timeout is None:
            timeout = -1
        elif timeout <= 0:
            timeout = 0
        else:
            # epoll counts milliseconds: round up, or a wait under 1 ms would spin.
            timeout = math.ceil(timeout * 1e3) * 1e-3
        try:
            # More ready sockets than MAX_EVENTS wait for the next call (the kernel takes them
            # in turn, so none starves).
            return self._epoll.poll(timeout, min(len(self._data) + 1, MAX_EVENTS))
        except InterruptedError:
            return []

    @staticmethod
    def _mask(ev: int, callback) -> int:
        mask = (EVENT_READ if ev & _IN else 0) | (EVENT_WRITE if ev & _OUT else 0)
        if not mask and ev & _TROUBLE:
            # An error or hang-up alone: report what the socket is watched for, so its
            # owner's next recv or send meets the error (a paused reader is not read).
            mask = getattr(callback, "events", EVENT_READ) or EVENT_READ
        return mask

    def select(self, timeout: float | None = None) -> list:
        data = self._data
        masks = _MASKS
        out = []
        for fd, ev in self._poll(timeout):
            callback = data.get(fd)
            if callback is not None:
                out.append((callback, masks.get(ev) or self._mask(ev, callback)))
        return out

    def dispatch(self, timeout: float | None, on_error) -> int:
        """Wait for readiness (``timeout`` as for ``select``) and call each ready socket's
        callback with its mask; a callback that raises is handed to ``on_error(callback)``.
        Callbacks are looked up as their turn comes: a socket unregistered earlier in the batch
        is skipped (a new one given its number is called, and finds nothing to read).
        Returns how many sockets were ready."""
        data = self._data
        masks = _MASKS
        ready = self._poll(timeout)
        self.woke = self._clock()
        for fd, ev in ready:
            callback = data.get(fd)
            if callback is None:
                continue
            try:
                callback(masks.get(ev) or self._mask(ev, callback))
            except Exception:
                on_error(callback)
        return len(ready)

    def close(self) -> None:
        self._epoll.close()
        self._data.clear()


class SelectorPoller:
    """The same contract over ``selectors.DefaultSelector`` (where there is no epoll)."""

    def __init__(self, clock=time.monotonic):
        self._selector = selectors.DefaultSelector()
        self._clock = clock
        self.woke = 0.0

    def register(self, sock, events: int, data) -> None:
        self._selector.register(sock, events, data)

    def modify(self, sock, events: int, data) -> None:
        self._selector.modify(sock, events, data)

    def unregister(self, sock) -> None:
        try:
            self._selector.unregister(sock)
        except ValueError as exc:   # a closed socket it does not know
            raise KeyError(str(exc)) from None

    def select(self, timeout: float | None = None) -> list:
        return [(key.data, mask) for key, mask in self._selector.select(timeout)]

    def dispatch(self, timeout: float | None, on_error) -> int:
        ready = self.select(timeout)
        self.woke = self._clock()
        for callback, mask in ready:
            try:
                callback(mask)
            except Exception:
                on_error(callback)
        return len(ready)

    def close(self) -> None:
        self._selector.close()


def make_poller(clock=time.monotonic):
    return EpollPoller(clock) if hasattr(select, "epoll") else SelectorPoller(clock)
