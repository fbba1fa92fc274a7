"""Test helpers over the client's non-blocking transports (client/transport.py's interface).

``Blocking(transport)`` stands in for a blocking socket (``sendall``, ``recv`` with a timeout,
``settimeout``, ``close``), so that ``mqttraw.RawClient`` speaks MQTT through a transport under
test with the tests' own MQTT encoder: ``raw_over(broker, transport)``.
"""

from __future__ import annotations

import collections
import select
import time

import mqttraw as m


class Blocking:
    def __init__(self, transport, timeout: float = 5.0):
        self.transport = transport
        self.timeout = timeout

    def _wait(self, events: int) -> None:
        poller = select.poll()
        poller.register(self.transport.fileno(), events)
        if not poller.poll(self.timeout * 1000):
            raise TimeoutError("transport not ready in time")

    def sendall(self, data) -> None:
        view = memoryview(bytes(data))
        deadline = time.monotonic() + self.timeout
        while view:
            assert time.monotonic() < deadline, "sendall did not finish in time"
            try:
                view = view[self.transport.send(view):]
            except BlockingIOError:
                self._wait(select.POLLOUT)

    def recv(self, n: int) -> bytes:
        while True:
            try:
                return self.transport.recv(n)
            except BlockingIOError:
                if not self.transport.pending():
                    self._wait(select.POLLIN)

    def settimeout(self, timeout) -> None:
        self.timeout = timeout if timeout is not None else 3600.0

    def close(self) -> None:
        self.transport.close()


def raw_over(transport) -> m.RawClient:
    """A RawClient whose socket is ``transport`` (its fields as RawClient.__init__ sets them
    after connecting)."""
    c = m.RawClient.__new__(m.RawClient)
    c.host, c.port = "", 0
    c.sock = Blocking(transport)
    c._buf = bytearray()
    c._pending = collections.deque()
    c._eof = False
    c._closed_locally = False
    c._next_pid = 0
    c.before_close = []
    c.client_id = None
    return c
