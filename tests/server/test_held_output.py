"""A client that sends requests and never reads the replies (PINGREQs here; QoS 1 PUBLISHes
or WebSocket pings alike): once more output waits for it than any reading client leaves
queued, the broker stops reading it, so its replies cannot grow without bound. Counted as a
``max_pending_write_bytes`` hit and logged; once the client reads, every request it sent is
answered and it is read again."""

from __future__ import annotations

import select
import socket
import time

import mqttraw as m
from edgebroker.server.transport import HELD_FACTOR

MAX_PENDING = 256 * 1024


def test_a_client_that_does_not_read_its_replies_is_not_read_meanwhile(broker, uid):
    # control_rate off: PINGREQs stand for any request here, and that limit would throttle
    # them long before their replies pile up (tests/core/test_limits_control.py).
    b = broker(limits={"max_pending_write_bytes": MAX_PENDING, "control_rate": 0})
    mark = b.mark()
    c = b.client(f"{uid}-flood", rcvbuf=4096)
    chunk = m.pingreq() * 32768                       # 64 KiB of PINGREQs
    sock = c.sock
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 20
    while sent < 64 << 20 and time.monotonic() < deadline:   # until the broker stops reading
        if not select.select([], [sock], [], 1.0)[1]:
            break
        sent += sock.send(chunk[sent % len(chunk):])
    assert sent < 64 << 20, "the broker read 64 MiB of requests it could not answer"
    line = b.wait_log(lambda ln: "wait for the client to read them" in ln, 10, mark)
    assert line and f"{uid}-flood" in line, line
    assert b.stats()["limit_hits"]["max_pending_write_bytes"] >= 1
    row = b.client_row(f"{uid}-flood")
    assert row["pending_write_bytes"] <= HELD_FACTOR * MAX_PENDING + 2 * len(chunk), row
    # The client reads: every PINGREQ it sent is answered, and it is read again (the rest of
    # a PINGREQ cut in two, then one more).
    rest = m.pingreq()[sent % 2:] if sent % 2 else b""
    rest += m.pingreq()
    expected = (sent + len(rest)) // 2 * len(m.pingresp())
    got = 0
    deadline = time.monotonic() + 30
    while got < expected:
        assert time.monotonic() < deadline, f"{got} of {expected} bytes of PINGRESP in 30 s"
        readable, writable, _ = select.select([sock], [sock] if rest else [], [], 1.0)
        if writable:
            rest = rest[sock.send(rest):]
        if readable:
            data = sock.recv(1 << 20)
            assert data, "the broker closed the connection"
            got += len(data)
    assert got == expected
    assert b.client_row(f"{uid}-flood")["pending_write_bytes"] == 0


def test_a_websocket_client_that_does_not_read_its_pongs_is_not_read_meanwhile(broker):
    """The same before any CONNECT, over WebSocket: pings whose pongs are not read (with no
    control_rate, which charges pings too: test_websocket_floods.py)."""
    b = broker(limits={"max_pending_write_bytes": MAX_PENDING, "control_rate": 0},
               listener=[{"host": "127.0.0.1", "port": 0},
                         {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])
    mark = b.mark()
    sock = socket.create_connection((b.host, b.listeners[1][1]))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                 b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
    ping = bytes((0x89, 0x80 | 125)) + b"\0\0\0\0" + b"x" * 125    # masked with zeros
    chunk = ping * 500
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 20
    while sent < 64 << 20 and time.monotonic() < deadline:
        if not select.select([], [sock], [], 1.0)[1]:
            break
        sent += sock.send(chunk[sent % len(chunk):])
    assert sent < 64 << 20, "the broker read 64 MiB of pings whose pongs were not read"
    line = b.wait_log(lambda ln: "wait for the client to read them" in ln, 10, mark)
    assert line and "before CONNECT" in line, line
    assert "internal error" not in b.log_text()
    sock.close()
