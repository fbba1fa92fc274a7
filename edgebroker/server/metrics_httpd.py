"""The HTTP server of the metrics endpoint (server/metrics_http.py gives it the page).

A thread per connection, at most MAX_CONNECTIONS at once, each cut off REQUEST_DEADLINE after
it was accepted: a slow or idle connection cannot hold a thread for good (a read timeout alone
lets a peer that sends a byte every few seconds keep one). When all are taken, a new connection
closes the oldest of those that have not sent a whole request yet (request line and headers)
and takes its thread: idle connections, or ones drip-feeding a request, cannot keep a scrape
out. Only when all of them are being answered is the new one closed at once.

What a client does to its own connection (a reset, a timeout: Prometheus resets a scrape it
gave up on) is counted and logged at debug level only; any other error of a request, and each
connection closed here, is counted and logged with the peer, each kind at most once a minute.
The counts are the ``edgebroker_metrics_connections_dropped_total`` family of the page
(docs/metrics.md).
"""

from __future__ import annotations

import http.server
import logging
import socket
import sys
import threading
import time
import traceback

from edgebroker.core.limits import EventLog
from edgebroker.server.peers import format_peer

log = logging.getLogger("edgebroker.metrics")

REQUEST_TIMEOUT = 5.0           # seconds one read or write of a request may take
REQUEST_DEADLINE = 10.0         # seconds a whole request may take
MAX_CONNECTIONS = 8             # connections served at once
SLOT_WAIT = 2.0                 # seconds for the thread of a connection closed for a new one
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

DROPPED = "edgebroker_metrics_connections_dropped_total"
DROP_REASONS = ("busy", "client_error", "deadline", "error", "idle")


class _Connection:
    __slots__ = ("peer", "accepted", "reading", "cut")

    def __init__(self, peer: str, accepted: float):
        self.peer = peer
        self.accepted = accepted
        self.reading = True           # its request (line and headers) is not whole yet
        self.cut = False              # shut down here (its errors are no news)


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT
    server_version = "edgebroker-metrics"

    def version_string(self):
        """The Server header: without the stdlib's Python version."""
        return self.server_version

    def parse_request(self):
        """(Once the request line and headers are read.) No answer when the connection was
        closed meanwhile for a new one (what it read then ends at the closing)."""
        parsed = super().parse_request()
        if not self.server.request_read(self.request):
            self.close_connection = True
            return False
        return parsed

    def do_GET(self):  # noqa: N802 (the stdlib's naming)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")   # (no body for HEAD)
            return
        body = self.server.page()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET    # the same headers, no body (health checkers probe with HEAD)

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
        log.debug("metrics: %s %s", self.address_string(), format % args)

    def log_error(self, format, *args):  # noqa: A002 (the stdlib's signature)
        """(The stdlib reports here a read or write that timed out, which it handled.)"""
        if args and isinstance(args[0], TimeoutError):
            self.server.client_error(self.request, self.client_address, args[0])
        else:
            self.log_message(format, *args)


def _shut(sock) -> None:
    """End a connection's blocked read or write (its thread then ends)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _describe(exc: BaseException | None) -> str:
    """One line: the error and where it was raised."""
    if exc is None:
        return "unknown error"
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        text += f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})"
    return text


class MetricsHTTPServer(http.server.ThreadingHTTPServer):
    """``page``: a function giving the body of ``GET /metrics`` (bytes); set before
    ``serve_forever``."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address, family, v6only=False):
        self.address_family = family
        self.page = None
        self.v6only = v6only and family == socket.AF_INET6
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._conns: dict = {}           # request socket -> _Connection
        self._lock = threading.Lock()    # _conns, dropped, _events
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self._events = EventLog(log)
        super().__init__(address, _Handler)

    def server_bind(self):
        if self.v6only:     # an IPv4 listener shares the port (listener_config, "overlaps")
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()

    def render_dropped(self) -> str:
        """The exposition of this server's own counts."""
        with self._lock:
            counts = sorted(self.dropped.items())
        out = [f"# HELP {DROPPED} Connections to the metrics endpoint that ended without a "
               "whole answer, by reason.", f"# TYPE {DROPPED} counter"]
        out += [f'{DROPPED}{{reason="{reason}"}} {n}' for reason, n in counts]
        return "\n".join(out) + "\n"

    def _drop(self, reason: str, level: int, now: float, message: str, *args) -> None:
        """Count a connection ended without a whole answer, and log it (at ``level``, at most
        once a minute per reason; debug: every time). Under ``_lock``."""
        self.dropped[reason] += 1
        if level == logging.DEBUG:
            log.debug(message, *args)
        else:
            self._events.log(level, reason, now, message, *args)

    def process_request(self, request, client_address):
        now = time.monotonic()
        conn = _Connection(format_peer(client_address), now)
        if not self._take_slot(conn, now):
            self.shutdown_request(request)
            return
        with self._lock:
            self._conns[request] = conn
        try:
            super().process_request(request, client_address)      # starts its thread
        except BaseException:
            self._release(request)
            raise

    def _take_slot(self, conn: _Connection, now: float) -> bool:
        """A thread for a new connection: a free one, else the one of the oldest connection
        that has not sent a whole request (it is closed), else none (False)."""
        if self._slots.acquire(blocking=False):
            return True
        with self._lock:
            waiting = [(old.accepted, sock) for sock, old in self._conns.items()
                       if old.reading and not old.cut]
            if not waiting:
                self._drop("busy", logging.WARNING, now, "metrics: %d requests being answered "
                           "at once; closed the new connection from %s", MAX_CONNECTIONS,
                           conn.peer)
                return False
            sock = min(waiting, key=lambda item: item[0])[1]
            old = self._conns[sock]
            old.cut = True
            self._drop("idle", logging.INFO, now, "metrics: %d connections open; closed the "
                       "one from %s, which sent no whole request in %.1f s, for a new one from "
                       "%s", MAX_CONNECTIONS, old.peer, now - old.accepted, conn.peer)
        _shut(sock)
        if self._slots.acquire(timeout=SLOT_WAIT):  # its thread ends at once
            return True
        with self._lock:
            self._drop("busy", logging.WARNING, time.monotonic(), "metrics: no thread free "
                       "%.0f s after a connection was closed for a new one; closed the new one "
                       "from %s", SLOT_WAIT, conn.peer)
        return False

    def request_read(self, request) -> bool:
        """A connection's request line and headers are read: it is not closed for a new one
        from now on. False when it was closed meanwhile."""
        with self._lock:
            conn = self._conns.get(request)
            if conn is None or conn.cut:
                return False
            conn.reading = False
            return True

    def _release(self, request) -> None:
        with self._lock:
            self._conns.pop(request, None)
        self._slots.release()

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def handle_error(self, request, client_address):
        """(Called with the exception being handled.) The stdlib prints a traceback to
        stderr: here a client's doing is counted and logged at debug level, anything else
        counted and logged in one line with the peer, at most once a minute."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            self.client_error(request, client_address, exc)
            return
        with self._lock:
            if not self._was_cut(request):
                self._drop("error", logging.ERROR, time.monotonic(),
                           "metrics: the request from %s failed: %s",
                           format_peer(client_address), _describe(exc))

    def client_error(self, request, client_address, exc: BaseException) -> None:
        """The client broke the connection off (a reset), or a read or write timed out."""
        with self._lock:
            if not self._was_cut(request):
                self._drop("client_error", logging.DEBUG, time.monotonic(),
                           "metrics: the connection from %s ended before its answer: %s",
                           format_peer(client_address), _describe(exc))

    def _was_cut(self, request) -> bool:
        """Whether this server shut the connection down (its errors were counted then)."""
        conn = self._conns.get(request)
        return conn is not None and conn.cut

    def service_actions(self):
        """(serve_forever's loop, every poll interval): cut off requests past their deadline
        (the handler's blocked read or write then ends); log the repeats of dropped
        connections not logged yet."""
        now = time.monotonic()
        with self._lock:
            late = [sock for sock, conn in self._conns.items()
                    if conn.accepted + REQUEST_DEADLINE <= now and not conn.cut]
            for sock in late:
                conn = self._conns[sock]
                conn.cut = True
                self._drop("deadline", logging.INFO, now, "metrics: cut off the connection "
                           "from %s %.0f s after it was accepted (%s)", conn.peer,
                           REQUEST_DEADLINE, "its request not whole yet" if conn.reading
                           else "its answer not sent yet")
            self._events.flush(now)
        for sock in late:
            _shut(sock)

    def server_close(self):
        super().server_close()
        with self._lock:
            self._events.flush(time.monotonic(), final=True)
