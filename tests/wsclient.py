"""A blocking WebSocket client socket for the tests, written with wsproto's client side.

``WebSocketSocket(sock, path)`` does the HTTP upgrade on a connected socket (plain, TLS or Unix)
and then stands in for it: ``sendall`` sends one masked binary frame, ``recv`` returns the MQTT
bytes of the binary frames that arrive (answering pings), b"" once the server closed. So
``mqttraw.RawClient`` speaks MQTT over WebSockets when its ``sock`` is replaced by one of these
(``over_websocket``), with the tests' own MQTT encoder and no code of the broker's.
"""

from __future__ import annotations

import socket

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Message, Ping, Pong,
                            RejectConnection, RejectData, Request, TextMessage)


class HandshakeRefused(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body.decode(errors='replace')}")
        self.status = status
        self.body = body


class WebSocketSocket:
    def __init__(self, sock: socket.socket, path: str = "/mqtt", subprotocols=("mqtt",),
                 host: str = "127.0.0.1"):
        self.sock = sock
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.pongs: list[bytes] = []
        self.close_code: int | None = None      # the server's close frame, once it came
        self.close_reason = ""                  # and its reason
        self.subprotocol = None
        sock.sendall(self.ws.send(Request(host=host, target=path,
                                          subprotocols=list(subprotocols))))
        status, body = None, b""
        while self.subprotocol is None:
            data = sock.recv(65536)
            if not data:
                if status is not None:
                    raise HandshakeRefused(status, body)
                raise ConnectionError("closed during the WebSocket handshake")
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, AcceptConnection):
                    self.subprotocol = event.subprotocol or ""
                elif isinstance(event, RejectConnection):
                    status = event.status_code
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        raise HandshakeRefused(status, body)
        self._held = b""       # MQTT bytes read and not yet returned (some may come with the 101)
        for event in self.ws.events():
            self._held += self._handle(event)

    # -- what RawClient calls -------------------------------------------------------------------
    def sendall(self, data: bytes) -> None:
        self.sock.sendall(self.ws.send(Message(data=bytes(data))))

    def recv(self, n: int) -> bytes:
        while not self._held and self.close_code is None:
            self._held += self._pump()
        data, self._held = self._held, b""
        return data

    def _pump(self) -> bytes:
        """Read once; the MQTT bytes that came (b"" for none, or at the close)."""
        data = self.sock.recv(65536)
        if not data:
            self.close_code = self.close_code or 1006     # closed without a close frame
            return b""
        self.ws.receive_data(data)
        return b"".join(self._handle(event) for event in self.ws.events())

    def settimeout(self, timeout) -> None:
        self.sock.settimeout(timeout)

    def getsockname(self):
        return self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()

    def __getattr__(self, name):       # version(), shutdown(), fileno() ... of the socket
        return getattr(self.sock, name)

    # -- WebSocket control frames ---------------------------------------------------------------
    def _handle(self, event) -> bytes:
        if isinstance(event, BytesMessage):
            return event.data
        if isinstance(event, Ping):
            self.sock.sendall(self.ws.send(event.response()))
        elif isinstance(event, Pong):
            self.pongs.append(event.payload)
        elif isinstance(event, CloseConnection):
            self.close_code = event.code
            self.close_reason = event.reason
            if self.ws.state is ConnectionState.REMOTE_CLOSING:
                try:
                    self.sock.sendall(self.ws.send(event.response()))
                except OSError:
                    pass
        elif isinstance(event, TextMessage):
            raise AssertionError(f"the server sent a text frame: {event.data!r}")
        return b""

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are (a hand-made frame)."""
        self.sock.sendall(data)

    def send_event(self, event) -> None:
        """A wsproto event: Ping, Message(data=str) for a text frame, CloseConnection, ..."""
        self.sock.sendall(self.ws.send(event))

    def wait_pong(self, timeout: float = 5.0) -> bytes:
        self.sock.settimeout(timeout)
        while not self.pongs:
            assert self.close_code is None, f"closed ({self.close_code}) before a pong"
            self._held += self._pump()
        return self.pongs.pop(0)

    def wait_close(self, timeout: float = 5.0) -> int:
        """The code of the server's close frame (1006: none); the socket must then be closed."""
        self.sock.settimeout(timeout)
        while self.close_code is None:
            self._held += self._pump()
        while self.sock.recv(65536):
            pass
        return self.close_code


def over_websocket(client, path: str = "/mqtt", **kw):
    """Turn a connected ``mqttraw.RawClient`` into one speaking MQTT over WebSockets."""
    client.sock = WebSocketSocket(client.sock, path, **kw)
    return client

