"""The s3 sink's connection to the store (s3.py): kept between requests and batches, and cut
short by the broker's stop.

A store that takes the connection and never answers holds a request until its timeout (30 s
for a connect and for each read or write): ``interrupt()``, called by the uploader's stop from
another thread, shuts the socket down (a TLS handshake or a wait for the answer ends at once
with an error; a TCP connect the store has not answered yet may still wait for its timeout, and
the stop then for its own bound) and refuses every later connection, so the stop does not wait
for a store that took the connection (but one: ``spare()``, the abort of a multipart upload
cut short, a short request). The socket is opened here rather than by ``http.client`` so that
a duplicate of it is kept (``shutdown`` on it reaches the socket whatever wraps it; the
duplicate, closed with the connection, also keeps its descriptor from being reused by another
file meanwhile).

The answer (``answer()``): its body is read up to ``MAX_ANSWER`` bytes (S3 answers are small
XML; a longer one is an ``AnswerError``, the rest never read), and all of it must come within
``answer_deadline`` s of the request sent (a store that drips its answer a byte at a time
resets the 30 s read timeout for ever): past it, a timer shuts the connection down and the
read fails (``expired``).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading

IO_TIMEOUT = 30.0        # seconds a connect or one read/write may take
ANSWER_DEADLINE = 60.0   # seconds from the request sent to the answer read in full
MAX_ANSWER = 64 * 1024   # bytes of an answer's body read at most


class AnswerError(http.client.HTTPException):
    """The store's answer has a body longer than MAX_ANSWER."""


class Link:
    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext | None):
        self.address = address
        self.tls = tls
        self.timeout = IO_TIMEOUT
        self.answer_deadline = ANSWER_DEADLINE
        self.expired = False             # the last answer's deadline passed (answer())
        self.conn: http.client.HTTPConnection | None = None
        self._took = False               # the TCP connect of self.conn succeeded
        self._guard = threading.Lock()   # _cancel and _stopping, between the two threads
        self._cancel: socket.socket | None = None
        self._stopping = False
        self._spare = False              # one connection may open all the same (spare())

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
            self._took = False
        return self.conn

    def opened(self) -> bool:
        """True when the connection's TCP connect succeeded (the store took it), even when
        http.client has closed it since (it does on a reset or a close before the answer)."""
        return self.conn is not None and self._took

    def _open(self, address, timeout, source_address=None) -> socket.socket:
        """socket.create_connection, with a duplicate of each socket kept for interrupt()."""
        host, port = address
        error: OSError | None = None
        for family, kind, proto, _, where in socket.getaddrinfo(host, port, 0,
                                                                 socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            with self._guard:
                if self._stopping and not self._spare:
                    sock.close()
                    raise ConnectionAbortedError("the broker is stopping")
                self._spare = False
                self._drop_cancel()
                self._cancel = sock.dup()
            try:
                sock.settimeout(timeout)
                sock.connect(where)
                self._took = True
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"{host} has no address")

    def answer(self, conn: http.client.HTTPConnection, deadline: float | None = None
               ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of the answer to the request sent on ``conn``, read within
        ``deadline`` s (``answer_deadline``); AnswerError for a body over MAX_ANSWER bytes
        (the connection closed), OSError or HTTPException when it did not come whole in
        time (``expired`` then True)."""
        self.expired = False
        timer = threading.Timer(deadline or self.answer_deadline, self._expire)
        timer.daemon = True
        timer.start()
        try:
            resp = conn.getresponse()
            body = resp.read(MAX_ANSWER + 1)
            if len(body) <= MAX_ANSWER and not resp.isclosed() and resp.read(1):
                body += b"+"   # (a body read to the connection's end: one byte more is over)
        finally:
            timer.cancel()
        if self.expired:   # cut short by the timer (a body up to the close is not whole)
            raise TimeoutError("the answer's deadline passed")
        if len(body) > MAX_ANSWER:
            self.close()
            raise AnswerError(f"{resp.status} {resp.reason}, with a body longer than "
                              f"{MAX_ANSWER // 1024} KiB (an S3 answer is a small XML "
                              f"document): not read further")
        if resp.length:   # the connection ended before its Content-Length
            raise http.client.IncompleteRead(body, resp.length)
        if resp.will_close:
            self.close()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body

    def _expire(self) -> None:
        with self._guard:
            self.expired = True
            if self._cancel is not None:
                try:
                    self._cancel.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def interrupt(self) -> None:
        """Any thread: end the request in flight now, and refuse new connections. Once only: a
        request in flight after it is the spare one (short)."""
        with self._guard:
            if self._stopping:
                return
            self._stopping = True
            if self._cancel is not None:
                try:
                    self._cancel.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass   # not connected (yet, or any more): nothing waits on it

    def spare(self, seconds: float) -> None:
        """After interrupt(): one more connection may open, with ``seconds`` for its connect,
        each read and the whole answer (one short request the stop waits for: the abort of a
        multipart upload it cut short)."""
        self.close()
        self.timeout = self.answer_deadline = seconds
        with self._guard:
            self._spare = True

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


__all__ = ["Link", "AnswerError", "IO_TIMEOUT", "ANSWER_DEADLINE", "MAX_ANSWER"]
