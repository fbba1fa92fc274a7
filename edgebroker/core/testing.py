"""A transport without a socket, for driving the core in-process (unit tests and bench/).

``FakeTransport`` implements ``core.transport.Transport`` as ``server.transport.Transport``
does, minus the I/O: ``offer`` refuses once ``max_pending`` bytes are waiting and counts
what it takes, ``write_file`` queues its full length, pauses are held per reason, and
``flush`` (the loop writing everything) calls ``client.writable()`` when the core asked
for it. What the core wrote stays readable: ``out`` (bytes, in order) and ``files``
(messages sent from the log). Production code never imports this module.
"""

from __future__ import annotations


class FakeTransport:
    def __init__(self, peer: str = "fake", listener=None, policy=None,
                 max_pending: int = 1 << 20):
        self.peer = peer
        self.listener = listener    # has .address and .max_connections, or None
        self.policy = policy
        self.max_pending = max_pending
        self.client = None          # set by the caller to broker.connection_made(transport)
        self.out: list = []         # what write and offer queued, in order
        self.files: list = []       # (header, fd, position, length) of messages sent from the log
        self.out_bytes = 0
        self.msgs_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.want_drain = False
        self.sent_now = 0           # send_now calls
        self.closing = False
        self.paused: set[str] = set()

    @property
    def reading(self) -> bool:
        return not self.paused

    def write(self, data) -> None:
        self.out.append(data)
        self.out_bytes += len(data)

    def offer(self, data, rest=None) -> bool:
        if self.out_bytes >= self.max_pending:
            return False
        self.msgs_out += 1
        self.write(data)
        if rest is not None:
            self.write(rest)
        return True

    def write_file(self, head: bytes, fd: int, position: int, length: int, offset: int) -> None:
        self.files.append((bytes(head), fd, position, length))
        self.out_bytes += len(head) + length

    def send_now(self) -> None:
        """Counted (``sent_now``); what was written stays in ``out``, each write an item."""
        self.sent_now += 1

    def wait_for_drain(self) -> None:
        self.want_drain = True

    def count_publish(self, n: int = 1) -> None:
        self.msgs_out += n

    def pause_reading(self, reason: str) -> None:
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        self.paused.discard(reason)

    def peer_end(self) -> int | None:
        return None     # the peer goes on

    def close(self) -> None:
        self.closing = True

    def flush(self) -> None:
        """The loop wrote everything queued: forget it, then call ``client.writable()`` if the
        core waits for the drain (as the server's transport does)."""
        self.bytes_out += self.out_bytes
        self.out = []
        self.files = []
        self.out_bytes = 0
        if self.want_drain and not self.closing:
            self.want_drain = False
            self.client.writable()
