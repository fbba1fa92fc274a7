"""A WebSocket caller that sends no CONNECT within connect_timeout, with a real broker and a
real WebSocket client (tests/wsclient.py): after the upgrade it gets close code 1008 with the
reason (not 1000, "purpose fulfilled"); before the upgrade is done (a slow or unfinished
request head) the log line says that the upgrade did not finish. A caller throttled (for
pinging before CONNECT) when its deadline comes is told the same."""

from __future__ import annotations

import socket
import time

from wsproto.events import Ping

import mqttraw as m
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


def _limited(broker, **limits):
    return broker(limits=limits, listener=[
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])


def test_a_caller_throttled_at_its_connect_deadline_gets_1008(broker):
    """Pings before CONNECT throttle the caller (control_rate 0.1/s: about 10 s) past its
    connect_timeout of 1 s: it is closed at the timeout, told why like a silent caller (it got
    1000 with no reason)."""
    b = _limited(broker, connect_timeout=1, control_rate=0.1, control_burst=1)
    mark = b.mark()
    ws = WebSocketSocket(socket.create_connection(("127.0.0.1", b.listeners[1][1]), timeout=5))
    ws.send_event(Ping(b"1"))
    ws.send_event(Ping(b"2"))
    assert b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=5, start=mark)
    assert (ws.wait_close(timeout=5), ws.close_reason) == (1008, "connect_timeout")
    ws.close()
    assert b.wait_log(lambda ln: "no CONNECT within 1 s" in ln, timeout=5, start=mark)
    assert b.stats()["counters"]["connect_timeouts"] == 1


def test_a_throttle_that_ends_before_the_deadline_leaves_later_closes_their_own_code(broker):
    """A throttle before CONNECT that ends before the connect deadline does not mark the
    connection as timed out: the caller connects, and its DISCONNECT gets a normal close."""
    b = _limited(broker, connect_timeout=10, control_rate=20, control_burst=1)
    mark = b.mark()
    c = b.raw(b.listeners[1][1])
    ws = c.sock = WebSocketSocket(c.sock)
    for i in range(3):
        ws.send_event(Ping(b"%d" % i))
    assert b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=5, start=mark)
    assert [ws.wait_pong(5) for _ in range(3)] == [b"0", b"1", b"2"]   # the throttle ended
    assert c.connect("after-throttle").rc == 0
    c.send(m.disconnect())
    assert (ws.wait_close(timeout=5), ws.close_reason) == (1000, "")
    ws.close()
