"""Where a client connects, as a URL, and the transport for it.

``parse_url(text)`` reads a broker address:

    mqtt://[user[:password]@]host[:port][/topic]     plain TCP (port 1883)
    mqtts://[user[:password]@]host[:port][/topic]    TLS (port 8883)
    ws://[user[:password]@]host[:port][/path]        WebSocket (port 80, path /mqtt)
    wss://[user[:password]@]host[:port][/path]       WebSocket over TLS (port 443, path /mqtt)
    unix:/path/to/socket, or an absolute path         a Unix socket (raw MQTT)

As in mosquitto_pub's ``-L``, the path of an mqtt:// or mqtts:// URL is a topic (all that
follows the host's '/', verbatim: '#', '?' and '%' are the topic's); the path of a
ws:// or wss:// URL is the HTTP path of the WebSocket endpoint. A user name and password in the
URL are percent-decoded. An IPv6 host is written in brackets (``mqtt://[::1]:1883``).

``Dialer(address, timeout=..., cafile=..., ...)`` makes a new transport for the address each
time it is called (the first connection and every reconnection), with the interface of
client/transport.py: plain TCP and Unix sockets (client/transport.py), TLS through
client/tls.py, WebSocket through client/websocket.py over either. ``await
dialer.open_async()`` makes the same transport on an asyncio loop without blocking it;
``dialer.steps()`` is the same as a generator that the synchronous event loop drives in its
own selector (client/handshake.py). The TLS context is built once, so a bad CA or
certificate file is reported when the Dialer is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from edgebroker.errors import AddressError

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883, "ws": 80, "wss": 443}
TLS_SCHEMES = ("mqtts", "wss")
WS_SCHEMES = ("ws", "wss")
DEFAULT_WS_PATH = "/mqtt"


@dataclass
class Address:
    scheme: str                 # mqtt, mqtts, ws, wss or unix
    host: str = ""
    port: int = 0
    path: str = ""              # ws/wss: the HTTP path; mqtt/mqtts: the topic ("" for none)
    unix_path: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme in TLS_SCHEMES

    @property
    def websocket(self) -> bool:
        return self.scheme in WS_SCHEMES

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.unix_path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = self.path if self.websocket else ""
        return f"{self.scheme}://{host}:{self.port}{path}"


def parse_url(text: str) -> Address:
    """The address ``text`` names; AddressError saying what is wrong with it."""
    if text.startswith("/"):
        return Address("unix", unix_path=text)
    if text.startswith("unix:"):
        path = text[5:]
        path = path[2:] if path.startswith("//") else path
        if not path.startswith("/"):
            raise AddressError(f"{text!r}: a unix: address needs an absolute path "
                               f"(unix:/run/mqtt.sock)")
        return Address("unix", unix_path=path)
    try:
        parts = urlsplit(text)
    except ValueError as exc:           # "Invalid IPv6 URL": a bracket not closed
        raise AddressError(f"{text!r}: not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        named = f"{parts.scheme}://" if parts.scheme else "(none)"
        raise AddressError(f"{text!r}: unknown scheme {named}; use mqtt://, mqtts://, ws://, "
                           f"wss:// or unix:/path")
    topic = ""
    if scheme not in WS_SCHEMES and "://" in text:
        # the topic is everything after the authority's '/', verbatim as mosquitto_pub
        # takes it: a '#' or '?' in it is part of the topic, not a fragment or a query
        authority, _, topic = text.split("://", 1)[1].partition("/")
        parts = urlsplit(f"{parts.scheme}://{authority}")
    try:
        port = parts.port
    except ValueError:
        raise AddressError(f"{text!r}: the port is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise AddressError(f"{text!r}: no host")
    path = parts.path
    if scheme in WS_SCHEMES:
        path = (path or DEFAULT_WS_PATH) + (f"?{parts.query}" if parts.query else "")
    else:
        path = topic
    return Address(scheme, parts.hostname, port or DEFAULT_PORTS[scheme], path,
                   username=unquote(parts.username) if parts.username is not None else None,
                   password=unquote(parts.password) if parts.password is not None else None)


class Dialer:
    """Makes a connected transport for one address (module docstring)."""

    def __init__(self, address: Address | str, *, timeout: float = 10.0,
                 cafile: str | None = None, certfile: str | None = None,
                 keyfile: str | None = None, verify: bool = True,
                 server_name: str | None = None, headers: list | None = None,
                 tls: bool | None = None):
        """``tls=True`` puts TLS under an mqtt:// or ws:// address too (mosquitto_pub's
        --cafile on a port given with -p); ``headers``: extra HTTP headers of the WebSocket
        upgrade, as (name, value) pairs."""
        self.address = parse_url(address) if isinstance(address, str) else address
        self.timeout = timeout
        self.server_name = server_name
        self.headers = headers
        use_tls = self.address.tls if tls is None else tls or self.address.tls
        self.context = None
        if use_tls:
            from edgebroker.client.tls import tls_context
            self.context = tls_context(cafile, certfile, keyfile, verify)

    def __call__(self, timeout: float | None = None):
        """A new transport, connected (and upgraded) within ``timeout`` seconds (the
        Dialer's by default); OSError (a ConnectionError naming the address, a TimeoutError)
        when it cannot be made. A Dialer is the event loop's ``transport_factory``
        (client/loop.py: ``EventLoop(transport_factory=Dialer(url), ...)``), which runs its
        ``steps`` instead of this call, so as not to wait."""
        from edgebroker.client.handshake import drive
        from edgebroker.client.transport import connect_socket
        a = self.address
        timeout = self.timeout if timeout is None else timeout
        sock, peer = connect_socket(a.host, a.port, timeout, a.unix_path)
        return drive(self._set_up(sock, peer), sock.fileno(), timeout)

    def steps(self):
        """``self()`` as a generator of ``(READ or WRITE, fd)`` steps returning the transport
        (client/handshake.py), which never waits in a call but for a host name's resolution:
        the synchronous event loop drives it in its selector, with its own deadline."""
        from edgebroker.client.handshake import connect_steps, on_fd
        a = self.address
        sock, peer = yield from connect_steps(a.host, a.port, a.unix_path)
        return (yield from on_fd(self._set_up(sock, peer), sock.fileno()))

    async def open_async(self, timeout: float | None = None):
        """``self()`` on the running asyncio loop, which it never blocks and which needs no
        thread for it (client/handshake.py; a host name is resolved by asyncio's resolver)."""
        from edgebroker.client.handshake import connect_async, drive_async
        a = self.address
        timeout = self.timeout if timeout is None else timeout
        sock, peer = await connect_async(a.host, a.port, timeout, a.unix_path)
        return await drive_async(self._set_up(sock, peer), sock.fileno(), timeout)

    def _set_up(self, sock, peer: str):
        """The connected socket's TLS handshake and WebSocket upgrade, as the address asks,
        as a client/handshake.py generator; returns the transport."""
        a = self.address
        if self.context is not None:
            from edgebroker.client.tls import tls_handshake
            stream = yield from tls_handshake(sock, a.host, a.port, self.context,
                                              self.server_name)
        else:
            from edgebroker.client.transport import TCPTransport
            stream = TCPTransport(sock, peer)
        if a.websocket:
            from edgebroker.client.websocket import websocket_upgrade
            stream = yield from websocket_upgrade(stream, a.host, a.port, a.path, self.headers)
        return stream

    def __repr__(self) -> str:
        return f"Dialer({str(self.address)!r})"
