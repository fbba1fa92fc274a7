"""The s3 sink's connection to the store (s3.py): kept between requests and batches, and cut
short by the broker's stop.

A store that takes the connection and never answers holds a request until its timeout (30 s
for a connect and for each read or write): ``interrupt()``, called by the uploader's stop from
another thread, shuts the socket down (a TLS handshake or a wait for the answer ends at once
with an error; a TCP connect the store has not answered yet may still wait for its timeout, and
the stop then for its own bound) and refuses every later connection, so the stop does not wait
for a store that took the connection. The socket is opened here rather than by ``http.client`` so that a duplicate of it is
kept (``shutdown`` on it reaches the socket whatever wraps it; the duplicate, closed with the
connection, also keeps its descriptor from being reused by another file meanwhile).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading

IO_TIMEOUT = 30.0        # seconds a connect or one read/write may take


class Link:
    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext | None):
        self.address = address
        self.tls = tls
        self.timeout = IO_TIMEOUT
        self.conn: http.client.HTTPConnection | None = None
        self._guard = threading.Lock()   # _cancel and _stopping, between the two threads
        self._cancel: socket.socket | None = None
        self._stopping = False

    def connection(self) -> http.client.HTTPConnection:
        """The kept connection, or a new one (it connects on its first request)."""
        if self.conn is None:
            host, port = self.address
            if self.tls is not None:
                self.conn = http.client.HTTPSConnection(host, port, timeout=self.timeout,
                                                        context=self.tls)
            else:
                self.conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
            self.conn._create_connection = self._open
        return self.conn

    def opened(self) -> bool:
        """True when the connection's TCP connect succeeded (the store took it)."""
        return self.conn is not None and self.conn.sock is not None

    def _open(self, address, timeout, source_address=None) -> socket.socket:
        """socket.create_connection, with a duplicate of each socket kept for interrupt()."""
        host, port = address
        error: OSError | None = None
        for family, kind, proto, _, where in socket.getaddrinfo(host, port, 0,
                                                                 socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            with self._guard:
                if self._stopping:
                    sock.close()
                    raise ConnectionAbortedError("the broker is stopping")
                self._drop_cancel()
                self._cancel = sock.dup()
            try:
                sock.settimeout(timeout)
                sock.connect(where)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"{host} has no address")

    def interrupt(self) -> None:
        """Any thread: end the request in flight now, and refuse new connections."""
        with self._guard:
            self._stopping = True
            if self._cancel is not None:
                try:
                    self._cancel.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass   # not connected (yet, or any more): nothing waits on it

    @property
    def stopping(self) -> bool:
        return self._stopping

    def close(self) -> None:
        with self._guard:
            self._drop_cancel()
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _drop_cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.close()
            self._cancel = None


__all__ = ["Link", "IO_TIMEOUT"]
