"""The metrics endpoint's HTTP server (server/metrics_httpd.py) against scrapers that misbehave:
resets, errors, idle connections (docs/metrics.md, "Prometheus")."""

import contextlib
import logging
import os
import re
import socket
import struct
import threading
import time
import urllib.request
from collections import deque

from edgebroker.server.metrics_httpd import MAX_CONNECTIONS, MetricsHTTPServer

METRICS_RE = re.compile(r"metrics on http://([0-9.]+):(\d+)/metrics")
DROPPED_RE = re.compile(r'^edgebroker_metrics_connections_dropped_total\{reason="(\w+)"\} (\d+)$',
                        re.M)


def dropped(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {reason: int(n) for reason, n in DROPPED_RE.findall(text)}


def reset(host: str, port: int, data: bytes) -> None:
    """Send ``data`` and close with a reset (SO_LINGER 0), as a scraper that gives up."""
    sock = socket.create_connection((host, port), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.sendall(data)
    sock.close()


@contextlib.contextmanager
def in_process(page):
    """The HTTP server in this process on loopback, serving ``page``: its port."""
    httpd = MetricsHTTPServer(("127.0.0.1", 0), socket.AF_INET)
    httpd.page = page
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_a_scraper_that_resets_is_counted_not_a_traceback(broker):
    """A scraper that reset its connection (Prometheus does when a scrape times out) put a
    23-line traceback on stderr, each time. Now it is counted (reason client_error) and logged
    at debug level only, as a read that timed out (5 s) is. (The request is left unfinished, so
    that the reset surely comes before the answer.)"""
    b = broker(metrics={"listen": "127.0.0.1:0"}, log_level="debug")
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    url = f"http://{host}:{port}/metrics"
    assert dropped(url).get("client_error", 0) == 0
    start = b.mark()
    silent = socket.create_connection((host, int(port)), timeout=15)
    silent.sendall(b"GET /metrics HTTP/1.1\r\n")
    for _ in range(3):
        reset(host, int(port), b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    lines = []
    for _ in range(4):
        line = b.wait_log("ended before its answer", timeout=10, start=start)
        assert line is not None, b.log_text()
        assert f"metrics: the connection from {host}:" in line, line
        lines.append(line)
        start = b.logs.index(line, start) + 1
    assert all("Error" in line and "TimeoutError" not in line for line in lines[:3]), lines
    assert "TimeoutError" in lines[-1], lines
    assert silent.recv(100) == b""
    silent.close()
    assert dropped(url)["client_error"] == 4
    assert "Traceback" not in b.log_text(), b.log_text()
    assert "Exception occurred" not in b.log_text()


def test_an_error_of_the_endpoint_is_one_line_with_the_peer_once_a_minute(caplog):
    """Any other error of a request (here a page that cannot be made) is counted (reason
    error) and logged in one line naming the peer and where it was raised; repeats within a
    minute are counted, not logged. The server runs in this process, on loopback."""
    calls = []

    def broken_page():
        calls.append(1)
        raise ValueError("no snapshot")

    caplog.set_level(logging.DEBUG, logger="edgebroker.metrics")
    with in_process(broken_page) as httpd:
        port = httpd.server_address[1]
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert sock.recv(100) == b""       # closed without an answer
            sock.close()
        assert len(calls) == 3
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        message = errors[0].getMessage()
        assert errors[0].levelno == logging.ERROR
        assert "metrics: the request from 127.0.0.1:" in message, message
        assert "ValueError: no snapshot (at " in message and "broken_page" in message, message
        assert "\n" not in message
        assert 'reason="error"} 3' in httpd.render_dropped()


def test_idle_connections_do_not_keep_the_scrapes_out(broker):
    """8 idle connections (as many as the endpoint serves at once) made every scrape fail
    (closed at once) until they timed out, and opening them again kept the scrapes out for
    good. Now a new connection closes the oldest one that has not sent a whole request (one
    left with half a request included: it gets no answer) and is served in its place, counted
    (reason idle); the broker's threads stay bounded."""
    b = broker(metrics={"listen": "127.0.0.1:0"})
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    url = f"http://{host}:{port}/metrics"
    tasks = f"/proc/{b.proc.pid}/task"
    threads = len(os.listdir(tasks))    # before any scrape: a scrape's thread ends after its answer
    assert dropped(url).get("idle", 0) == 0
    idle = deque(socket.create_connection((host, int(port)), timeout=5)
                 for _ in range(MAX_CONNECTIONS))
    idle[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    for n in range(1, 4):
        assert dropped(url)["idle"] == n        # served (it was closed at once)
        oldest = idle.popleft()
        assert oldest.recv(100) == b""          # closed for the scrape, unanswered
        oldest.close()
        # The scrape's thread ends just after its answer: then a slot is free for the next
        # idle connection (else that one would close another for itself).
        deadline = time.monotonic() + 10
        while len(os.listdir(tasks)) > threads + MAX_CONNECTIONS - 1:
            assert time.monotonic() < deadline, os.listdir(tasks)
            time.sleep(0.01)
        idle.append(socket.create_connection((host, int(port)), timeout=5))   # all taken
        assert len(os.listdir(tasks)) <= threads + MAX_CONNECTIONS + 1
    assert b.wait_log("metrics: 8 connections open; closed the one from 127.0.0.1:")
    for sock in idle:
        sock.close()


def test_when_all_are_being_answered_a_new_connection_is_closed_and_counted(caplog):
    """With 8 requests being answered (here a page that waits) a new connection is closed at
    once, counted (reason busy) and logged once: answers are not cut short for it."""
    gate, started = threading.Event(), threading.Semaphore(0)

    def slow_page():
        started.release()
        assert gate.wait(10)
        return b"answered\n"

    caplog.set_level(logging.INFO, logger="edgebroker.metrics")
    with in_process(slow_page) as httpd:
        port = httpd.server_address[1]
        busy = []
        for _ in range(MAX_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            busy.append(sock)
        for _ in range(MAX_CONNECTIONS):
            assert started.acquire(timeout=5)
        for _ in range(2):
            extra = socket.create_connection(("127.0.0.1", port), timeout=5)
            assert extra.recv(100) == b""
            extra.close()
        assert 'reason="busy"} 2' in httpd.render_dropped()
        gate.set()
        for sock in busy:
            answer = b""
            while len(answer) < 10_000:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
            assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"answered\n")
            sock.close()
        logged = [r.getMessage() for r in caplog.records if "being answered" in r.getMessage()]
        assert len(logged) == 1 and "closed the new connection from 127.0.0.1:" in logged[0]


def test_head_gets_the_headers_of_get_and_no_python_version(broker):
    """HEAD (health checkers, load balancers) got 501; the Server header named the Python
    version."""
    import http.client
    b = broker(metrics={"listen": "127.0.0.1:0"})
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("HEAD", "/metrics")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        assert head.getheader("Server") == "edgebroker-metrics"
        assert head.getheader("Content-Type").startswith("text/plain")
        assert int(head.getheader("Content-Length")) > 1000
        conn.request("HEAD", "/other")
        missing = conn.getresponse()
        assert missing.status == 404 and missing.read() == b""
    finally:
        conn.close()
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200 and resp.headers["Server"] == "edgebroker-metrics"
        assert resp.read().startswith(b"# HELP")
