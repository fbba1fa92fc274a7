"""A TCP connection as the core sees it: ``write`` and ``close``, nothing else.

Writes are queued and flushed by the loop once per pass with one ``sendmsg``
over all queued buffers (no per-message syscalls). Only the unsent remainder
stays queued, and the socket is registered for write readiness only while
something is queued.

The queue is bounded for what may be dropped: ``offer`` (a QoS 0 PUBLISH)
refuses once ``max_pending`` bytes are waiting; the core then drops the
message or keeps it in the session's queue, sets ``want_drain``, and is
called back (``client.writable()``) when everything has been written.
``pause_reading``/``resume_reading`` stop and restart reading the socket
(a throttled publisher): the kernel's receive buffer fills and TCP pushes
back on that client alone.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket

log = logging.getLogger("edgebroker.server")

# Linux IOV_MAX is 1024; stay under it.
_MAX_IOV = 512
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE
_READ_WRITE = selectors.EVENT_READ | selectors.EVENT_WRITE
# Used until the loop sets the configured limit.max_pending_write_bytes.
DEFAULT_MAX_PENDING = 1 << 20


def format_peer(addr) -> str:
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr) or "unix"


class Transport:
    __slots__ = ("loop", "sock", "peer", "client", "out", "out_bytes", "dirty", "closing",
                 "closed", "events", "listener", "reading", "want_drain", "max_pending",
                 "msgs_out", "bytes_in", "bytes_out")

    def __init__(self, loop, sock: socket.socket, peer: str, listener=None,
                 max_pending: int = DEFAULT_MAX_PENDING):
        self.loop = loop
        self.sock = sock
        self.peer = peer
        self.client = None
        self.out: list = []
        self.out_bytes = 0
        self.dirty = False       # listed in the loop's flush list for this pass
        self.closing = False     # the core asked to close once the queue is sent
        self.closed = False
        self.events = _READ      # what the selector watches (0: unregistered)
        self.listener = listener  # has .address and .max_connections (server.loop.Listener)
        self.reading = _READ     # _READ, or 0 while paused
        self.want_drain = False  # call client.writable() once the queue is empty
        self.max_pending = max_pending
        self.msgs_out = 0        # PUBLISH packets queued (offer, and the core's counted writes)
        self.bytes_in = 0
        self.bytes_out = 0

    # ----- the core's side --------------------------------------------------------------

    def write(self, data) -> None:
        if self.closed:
            return
        self.out.append(data)
        self.out_bytes += len(data)
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)

    def offer(self, data) -> bool:
        """Queue one PUBLISH frame unless ``max_pending`` bytes are already waiting."""
        if self.out_bytes >= self.max_pending:
            return self.closed  # a closed transport swallows writes, as write() does
        if self.closed:
            return True
        self.out.append(data)
        self.out_bytes += len(data)
        self.msgs_out += 1
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)
        return True

    def pause_reading(self) -> None:
        if self.reading and not self.closed:
            self.reading = 0
            self._watch((_WRITE if self.out else 0))

    def resume_reading(self) -> None:
        if not self.reading and not self.closed:
            self.reading = _READ
            self._watch(_READ | (_WRITE if self.out else 0))

    def _watch(self, want: int) -> None:
        """Tell the selector what to wait for (unregistering when nothing)."""
        have = self.events
        if want == have:
            return
        selector = self.loop.selector
        if not want:
            selector.unregister(self.sock)
        elif not have:
            selector.register(self.sock, want, self)
        else:
            selector.modify(self.sock, want, self)
        self.events = want

    def close(self) -> None:
        """Close after a last attempt to send what is queued (e.g. a refusing CONNACK)."""
        if self.closing or self.closed:
            return
        self.closing = True
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)

    # ----- the loop's side --------------------------------------------------------------

    def on_event(self, mask: int) -> None:
        if self.closed:
            return  # shut down earlier in this pass
        if mask & _READ and not self.closing:
            self.read()
        if mask & selectors.EVENT_WRITE and not self.closed:
            self.flush()

    # The transport itself is the selector key's callback: a bound method per connection
    # would cost 64 bytes each (10,000 idle connections: 640 KB).
    __call__ = on_event

    def read(self) -> None:
        loop = self.loop
        try:
            n = self.sock.recv_into(loop.buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc.strerror or str(exc))
            return
        if n == 0:
            self.lost("closed by peer")
            return
        loop.broker.stats.bytes_received += n
        self.bytes_in += n
        self.client.data_received(loop.view[:n])

    def flush(self) -> None:
        """Send as much of the queue as the socket takes, without blocking."""
        out = self.out
        sock = self.sock
        sent_total = 0
        while out:
            batch = out if len(out) <= _MAX_IOV else out[:_MAX_IOV]
            try:
                sent = sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.loop.broker.stats.bytes_sent += sent_total
                self.lost(exc.strerror or str(exc))
                return
            sent_total += sent
            # Drop fully sent buffers; keep a view of a partly sent one.
            i = 0
            n = len(batch)
            while i < n and sent >= len(out[i]):
                sent -= len(out[i])
                i += 1
            if i < n and sent:
                out[i] = memoryview(out[i])[sent:]
            del out[:i]
            if i < n:
                break  # the socket buffer is full
        self.out_bytes -= sent_total
        self.bytes_out += sent_total
        self.loop.broker.stats.bytes_sent += sent_total
        want = self.reading | _WRITE if out else self.reading
        if want != self.events and not self.closed:
            self._watch(want)
        if not out and self.want_drain and not self.closed:
            self.want_drain = False
            self.client.writable()

    def lost(self, reason: str) -> None:
        """The socket failed or the peer closed it: tell the core, release the socket."""
        if self.closed:
            return
        self.shutdown()
        self.client.connection_lost(reason)

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.out.clear()
        self.out_bytes = 0
        self.loop.forget(self)
        try:
            self.sock.close()
        except OSError as exc:  # pragma: no cover - close on a socket we own
            if exc.errno != errno.EBADF:
                log.debug("close %s: %s", self.peer, exc)
