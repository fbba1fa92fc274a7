"""The client's byte stream on a plain TCP or Unix socket, for the event loop (client/loop.py).

Every transport (this one; TLS and WebSocket ones in their own modules) has the same shape:
``fileno()``; ``send(data) -> int`` (bytes taken; BlockingIOError when none fit);
``recv(n) -> bytes`` (b"" at EOF; BlockingIOError when nothing has arrived); ``pending() ->
bool`` (bytes already received and decoded by the transport but not yet returned, which a
selector cannot see: always False here); ``close()``. It is connected (with a timeout) when
made, then non-blocking.
"""

from __future__ import annotations

import socket


class TCPTransport:
    """A connected stream socket (TCP or Unix), non-blocking."""

    __slots__ = ("sock", "peer")

    def __init__(self, sock: socket.socket, peer: str):
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data) -> int:
        return self.sock.send(data)

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def pending(self) -> bool:
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"TCPTransport({self.peer})"


# A server that closes a plain TCP link before its CONNACK did not take the CONNECT (a
# refusal, bad credentials included, comes as a CONNACK): these are the usual causes.
NO_CONNACK_HINT = ("before the CONNACK: the server did not take the CONNECT; a TLS port (use "
                   "mqtts://)? not an MQTT server? a CONNECT it found malformed?")


def lost_reason(transport, state: str, reason: str) -> str:
    """``reason`` for a link lost in the connection's ``state``: before the CONNACK
    ("connecting") on plain TCP, with the usual causes of a server closing (or resetting)
    it without a word (NO_CONNACK_HINT): a server that speaks TLS on the port reads our
    CONNECT as a TLS record; another protocol's server; a CONNECT the server finds
    malformed (MQTT: it closes without a CONNACK)."""
    if (state != "connecting" or type(transport) is not TCPTransport
            or transport.sock.family == socket.AF_UNIX):
        return reason
    return f"{reason} ({NO_CONNACK_HINT})"


def connect_socket(host: str, port: int, timeout: float,
                   unix_path: str | None = None) -> tuple[socket.socket, str]:
    """A stream socket connected to ``host``:``port`` (or ``unix_path``) within ``timeout``
    seconds, and a name for it; OSError (with the address in its message) when it cannot;
    AddressError for a host name that cannot be looked up."""
    if unix_path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(unix_path)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"connect to unix:{unix_path}: {exc.strerror or exc}") \
                from None
        return sock, f"unix:{unix_path}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise OSError(exc.errno, f"connect to {host}:{port}: {exc.strerror or exc}") from None
    except UnicodeError as exc:
        from edgebroker.client.handshake import not_a_host_name
        raise not_a_host_name(f"{host}:{port}", exc) from None
    return sock, f"{host}:{port}"


def open_transport(host: str, port: int, *, timeout: float, unix_path: str | None = None):
    """A plain TCP (or Unix) transport, connected within ``timeout`` seconds. TLS and
    WebSocket transports are made by address.py's ``Dialer`` (over ``connect_socket``'s
    socket, or, in the event loop, ``Dialer.steps`` without waiting)."""
    sock, peer = connect_socket(host, port, timeout, unix_path)
    return TCPTransport(sock, peer)
