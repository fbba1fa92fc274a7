"""A WebSocket caller that sends no CONNECT within connect_timeout, with a real broker and a
real WebSocket client (tests/wsclient.py): after the upgrade it gets close code 1008 with the
reason (not 1000, "purpose fulfilled"); before the upgrade is done (a slow or unfinished
request head) the log line says that the upgrade did not finish."""

from __future__ import annotations

import socket
import time

from wsclient import WebSocketSocket


def _broker(broker):
    return broker(limits={"connect_timeout": 1}, listener=[
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])


def test_an_upgraded_caller_without_connect_gets_1008(broker):
    b = _broker(broker)
    mark = b.mark()
    ws = WebSocketSocket(socket.create_connection(("127.0.0.1", b.listeners[1][1]), timeout=5))
    peer = f"127.0.0.1:{ws.getsockname()[1]}"
    assert (ws.wait_close(timeout=5), ws.close_reason) == (1008, "connect_timeout")
    ws.close()
    assert b.wait_log(f"client (before CONNECT) from {peer}: no CONNECT within 1 s; closing",
                      start=mark)
    assert b.stats()["counters"]["connect_timeouts"] == 1


def test_an_unfinished_upgrade_is_named_in_the_log(broker):
    b = _broker(broker)
    mark = b.mark()
    sock = socket.create_connection(("127.0.0.1", b.listeners[1][1]), timeout=5)
    sock.sendall(b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n")     # and no more
    started = time.monotonic()
    assert sock.recv(100) == b""
    assert time.monotonic() - started < 3
    peer = f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    assert b.wait_log(f"client (before CONNECT) from {peer}: no CONNECT (its HTTP upgrade to "
                      f"WebSocket not finished) within 1 s; closing", start=mark)
