"""What the core may use of a connection's transport: the declared seam to ``server/``.

The core never touches a socket and never writes a transport's fields: it queues bytes
(``write``, ``offer``, ``write_file``), asks for a callback once the output drains
(``wait_for_drain``), counts the PUBLISH packets it writes itself (``count_publish``),
pauses and resumes reading for a named reason, and closes. It reads a few figures for
limits, metrics and the admin view. ``server.transport.Transport`` implements this
protocol; so does ``core.testing.FakeTransport``, for unit tests and bench/, and
``core.client.ClosedTransport``, a closed client's. The core imports this module for type
checkers only (``typing`` is not loaded at run time: the broker's memory, docs/deploy.md).
"""

from __future__ import annotations

from typing import Protocol


class Listener(Protocol):
    """What the core reads of the listener a connection came in on."""

    address: str            # as written in the configuration; "" when not on a listener
    max_connections: int    # the listener's own cap (0: none)
    policy: object | None   # its ListenerPolicy now (a reload replaces it), or None


class Transport(Protocol):
    # Read-only for the core (the transport keeps them).
    peer: str                     # the remote address, for log lines
    listener: Listener | None
    policy: object | None         # the listener's ListenerPolicy (authentication, ACL), or None
    max_pending: int              # bytes queued beyond which ``offer`` refuses
    out_bytes: int                # bytes queued and not yet written
    msgs_out: int                 # PUBLISH packets queued (offer, and count_publish)
    bytes_in: int
    bytes_out: int

    def write(self, data) -> None:
        """Queue bytes (a bytes-like object) for sending."""

    def offer(self, data, rest=None) -> bool:
        """Queue a QoS 0 PUBLISH (``data``, then ``rest`` if not None) and count it; False,
        queueing nothing, once ``max_pending`` bytes are waiting."""

    def write_file(self, head: bytes, fd: int, position: int, length: int, offset: int) -> None:
        """Queue a PUBLISH whose payload is a range of a commit-log segment (record ``offset``)."""

    def send_now(self) -> None:
        """Send what is queued now, in the middle of a pass, as far as the socket takes it
        without blocking; the rest, and errors, are left for the pass's own flush (a TLS
        connection leaves all of it there)."""

    def wait_for_drain(self) -> None:
        """Call ``client.writable()`` once everything queued is written."""

    def count_publish(self, n: int = 1) -> None:
        """Count ``n`` PUBLISHes queued with ``write`` or ``write_file`` in ``msgs_out``."""

    def pause_reading(self, reason: str) -> None:
        """Stop reading for ``reason`` ("auth", "rate", "log"); other reasons are independent."""

    def resume_reading(self, reason: str) -> None:
        """Release ``reason``'s pause; reading resumes once no reason holds it."""

    def peer_end(self) -> int | None:
        """None while the peer goes on; once it has ended its stream or reset it (seen
        without reading: for a client not read, throttled), the bytes it sent before its
        end that are still unread in the socket."""

    def close(self) -> None:
        """Close once what is queued is sent."""
