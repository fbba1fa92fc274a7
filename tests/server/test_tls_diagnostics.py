"""What the broker and the client say about TLS connections that fail: a stalled handshake
(counted and logged once, at the shorter of handshake_timeout and connect_timeout), a client
certificate that is expired, not yet valid or of another CA (server side), a server
certificate that is expired or for another name (client side), and plain HTTP or MQTT on a
wss:// listener. Real broker, real clients (raw sockets, the stdlib ssl module, the
edgebroker CLI); certificates made here (tests/certs.py)."""

import socket
import time

import pytest

from certs import make_pki
from conftest import _close_all_clients, _start, _teardown
from server.test_tls import client_hello

CONNECT_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, pki):
    """0: plain.  1: TLS, handshake_timeout = connect_timeout.  2: TLS, handshake_timeout 30
    (connect_timeout is shorter).  3: wss, client certificate required.  4: TLS, client
    certificate required."""
    d = tmp_path_factory.mktemp("tlsdiag")
    server = {"certfile": str(pki.server.cert), "keyfile": str(pki.server.key)}
    required = {"cafile": str(pki.ca.cert), "require_certificate": True}
    b = _start(d, {"allow_anonymous": True, "limits": {"connect_timeout": CONNECT_TIMEOUT},
                   "listener": [
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, **server, "handshake_timeout": CONNECT_TIMEOUT},
        {"host": "127.0.0.1", "port": 0, **server, "handshake_timeout": 30},
        {"host": "127.0.0.1", "port": 0, **server, **required, "protocol": "websockets"},
        {"host": "127.0.0.1", "port": 0, **server, **required},
    ]})
    yield b
    _close_all_clients()
    _teardown([b])


def port(b, i):
    return b.listeners[i][1]


def lines_about(b, peer: str, start: int) -> list[str]:
    return [ln for ln in b.logs[start:] if peer in ln]


@pytest.mark.parametrize("listener, limit", [(1, "handshake_timeout"), (2, "connect_timeout")])
def test_a_stalled_handshake_is_counted_and_logged_once(srv, pki, listener, limit):
    """Half a ClientHello, then nothing: closed at the shorter timeout, counted once as a
    failed TLS handshake (not also as a connect timeout), one log line naming the timeout."""
    before = srv.stats()
    mark = srv.mark()
    sock = socket.create_connection(("127.0.0.1", port(srv, listener)), timeout=10)
    hello = client_hello(pki)
    started = time.monotonic()
    sock.sendall(hello[:len(hello) // 2])
    assert sock.recv(100) == b""
    took = time.monotonic() - started
    peer = f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    assert CONNECT_TIMEOUT - 0.1 <= took < CONNECT_TIMEOUT + 2, took
    line = srv.wait_log(f"TLS handshake with {peer} on listener 127.0.0.1:"
                        f"{port(srv, listener)} not finished within 1 s ({limit}); closing",
                        start=mark)
    assert line, srv.logs[mark:]
    after = srv.stats()     # (an admin request: answered after the pass that closed it)
    counted = {key: after["counters"][key] - before["counters"][key]
               for key in ("tls_handshakes_failed", "connect_timeouts")}
    assert counted == {"tls_handshakes_failed": 1, "connect_timeouts": 0}
    assert lines_about(srv, peer, mark) == [line]
