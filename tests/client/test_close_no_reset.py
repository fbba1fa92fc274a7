"""The event loop's DISCONNECT ends the connection with a FIN, not a reset, even when bytes the
server sent are still unread: the loop reads (and drops) them until the server closes. A
socket closed with unread bytes sends RST, and the server may then drop what it had not read
yet: the PUBACK/PUBREC sent just before the DISCONNECT (it sends those messages again). The
server here is a plain socket of the test, to see which of the two comes."""

from __future__ import annotations

import socket
import threading

from edgebroker.client.events import Connected
from edgebroker.client.loop import EventLoop
from mqttraw import publish

CONNACK = b"\x20\x02\x00\x00"
DISCONNECT = b"\xe0\x00"


def test_disconnect_with_unread_bytes_ends_with_fin():
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(10)
    flood, flooded = threading.Event(), threading.Event()
    seen = {}

    def server():
        conn, _ = lsock.accept()
        conn.settimeout(10)
        with conn:
            conn.recv(1024)                               # CONNECT
            conn.sendall(CONNACK)
            flood.wait(10)
            conn.sendall(b"".join(publish("a/b", b"x" * 1000) for _ in range(50)))
            flooded.set()
            got = b""
            try:
                for _ in range(100):                      # up to the DISCONNECT
                    data = conn.recv(65536)
                    got += data
                    if not data or got.endswith(DISCONNECT):
                        break
                conn.shutdown(socket.SHUT_WR)             # as a broker closes after DISCONNECT
                for _ in range(100):
                    data = conn.recv(65536)
                    if not data:
                        seen["end"] = "fin"
                        break
            except ConnectionResetError:
                seen["end"] = "reset"
            seen["got"] = got

    t = threading.Thread(target=server, daemon=True)
    t.start()
    loop = EventLoop("127.0.0.1", lsock.getsockname()[1], client_id="c")
    try:
        for _ in range(50):
            if type(loop.poll(0.2)) is Connected:
                break
        else:
            raise AssertionError("no Connected")
        flood.set()
        assert flooded.wait(10)
        loop.disconnect()            # 50 KB unread in the socket: read past, then closed
    finally:
        loop.close()
        t.join(10)
        lsock.close()
    assert seen.get("got", b"").endswith(DISCONNECT)
    assert seen.get("end") == "fin"
