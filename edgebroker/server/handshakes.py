"""The deadlines of the TLS handshakes in progress (``HandshakeTimers``), which the loop
(server/loop.py) keeps and expires. Apart from server/tls.py so that a broker without TLS
listeners, whose loop has the (empty) timers too, does not load the TLS transport
(docs/deploy.md, idle RSS)."""

from __future__ import annotations

import heapq
import itertools

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edgebroker.server.tls import TLSTransport


class HandshakeTimers:
    """Deadlines of TLS handshakes in progress: a heap of ``[deadline, sequence, transport]``.

    A handshake that ends (done, failed or closed) lets go of its entry (``done``): the
    entry's transport becomes None, so a finished connection is not held until its deadline,
    and the heap is rebuilt without such entries once they are more than half of it."""

    def __init__(self):
        self.heap: list = []  # the loop checks it is empty
        self._seq = itertools.count()
        self._done = 0        # entries whose transport is None

    def __bool__(self) -> bool:
        return bool(self.heap)

    def add(self, transport: "TLSTransport", deadline: float) -> None:
        transport.handshake_entry = entry = [deadline, next(self._seq), transport]
        heapq.heappush(self.heap, entry)

    def done(self, transport: "TLSTransport") -> None:
        entry = transport.handshake_entry
        if entry is None:
            return
        transport.handshake_entry = None
        entry[2] = None
        self._done += 1
        heap = self.heap
        if self._done * 2 > len(heap):
            heap[:] = [e for e in heap if e[2] is not None]
            heapq.heapify(heap)
            self._done = 0

    def next_deadline(self) -> float | None:
        heap = self.heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
            self._done -= 1
        return heap[0][0] if heap else None

    def expire(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            transport = heapq.heappop(heap)[2]
            if transport is None:
                self._done -= 1
                continue
            transport.handshake_entry = None
            transport.handshake_timed_out()
