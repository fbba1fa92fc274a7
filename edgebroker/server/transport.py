"""A TCP connection as the core sees it: ``write`` and ``close``, nothing else.

Writes are queued and flushed by the loop once per pass with one ``sendmsg``
over all queued buffers (no per-message syscalls). Only the unsent remainder
stays queued, and the socket is registered for write readiness only while
something is queued.

The core may pause reading (``pause_reading``: a CONNECT waiting for its
password check); the socket is then not watched for input, so the peer's
further bytes stay in the kernel and TCP slows it down.
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
# First byte of a TLS record carrying a handshake (a ClientHello).
_TLS_HANDSHAKE = 0x16


def format_peer(addr) -> str:
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr) or "unix"


class Transport:
    __slots__ = ("loop", "sock", "peer", "client", "out", "out_bytes", "dirty", "closing",
                 "closed", "events", "policy", "reading", "fresh", "listener_name")

    def __init__(self, loop, sock: socket.socket, peer: str):
        self.loop = loop
        self.sock = sock
        self.peer = peer
        self.client = None
        self.out: list = []
        self.out_bytes = 0
        self.dirty = False       # listed in the loop's flush list for this pass
        self.closing = False     # the core asked to close once the queue is sent
        self.closed = False
        self.events = _READ
        self.policy = None        # the listener's ListenerPolicy (authentication, ACL)
        self.reading = True       # False while the core paused reading
        self.fresh = True         # nothing read yet
        self.listener_name = ""

    # ----- the core's side --------------------------------------------------------------

    def write(self, data) -> None:
        if self.closed:
            return
        self.out.append(data)
        self.out_bytes += len(data)
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)

    def close(self) -> None:
        """Close after a last attempt to send what is queued (e.g. a refusing CONNACK)."""
        if self.closing or self.closed:
            return
        self.closing = True
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.update_events()

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self.update_events()

    # ----- the loop's side --------------------------------------------------------------

    def update_events(self) -> None:
        """Watch the socket for what is needed now: input unless paused, output if queued."""
        if self.closed:
            return
        want = (_READ if self.reading else 0) | (_WRITE if self.out else 0)
        if want == self.events:
            return
        selector = self.loop.selector
        if not want:
            selector.unregister(self.sock)
        elif not self.events:
            selector.register(self.sock, want, self.on_event)
        else:
            selector.modify(self.sock, want, self.on_event)
        self.events = want

    def on_event(self, mask: int) -> None:
        if self.closed:
            return  # shut down earlier in this pass
        if mask & _READ and not self.closing:
            self.read()
        if mask & selectors.EVENT_WRITE and not self.closed:
            self.flush()

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
        if self.fresh:
            self.fresh = False
            if loop.buffer[0] == _TLS_HANDSHAKE:
                self.tls_on_plain()
                return
        loop.broker.stats.bytes_received += n
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
        self.loop.broker.stats.bytes_sent += sent_total
        want = (_READ if self.reading else 0) | (_WRITE if out else 0)
        if want != self.events and not self.closed:
            self.update_events()

    def tls_on_plain(self) -> None:
        """A TLS ClientHello on a plain MQTT listener: say so, count it, close."""
        self.loop.broker.stats.protocol_errors += 1
        log.warning("TLS handshake received on plain MQTT listener %s from %s — use the TLS "
                    "listener or disable TLS in the client", self.listener_name, self.peer)
        self.lost("TLS on a plain MQTT listener")

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
