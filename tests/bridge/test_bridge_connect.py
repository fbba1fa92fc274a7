"""One deadline, connect_timeout, covers a whole connection attempt (TCP connect, TLS
handshake, CONNECT/CONNACK): a remote that accepts the TCP connection and then never
answers (the TLS ClientHello, or the CONNECT) is given up on, the reason logged once, and
the bridge tries again after its back-off."""

from __future__ import annotations

import socket

import pytest
from certs import make_pki

from .helpers import bridge_table, figures


@pytest.mark.parametrize("tls", [True, False], ids=["tls_handshake", "connack"])
def test_a_remote_that_never_answers_is_given_up_on_and_retried(broker, tmp_path, tls):
    server = socket.create_server(("127.0.0.1", 0))
    extra = {"cafile": str(make_pki(tmp_path / "pki").ca.cert)} if tls else {}
    stage = "the TLS handshake" if tls else "the CONNACK"
    try:
        gw = broker(bridge=[bridge_table(server.getsockname()[1], [{"pattern": "s/#"}],
                                         connect_timeout=0.5, keepalive=60, **extra)])
        server.settimeout(10)
        held = []
        for _ in range(3):       # each attempt is accepted, its first bytes read, unanswered
            conn, _ = server.accept()
            held.append(conn)
            first = conn.recv(4096)
            assert first[:1] == (b"\x16" if tls else b"\x10")   # ClientHello / CONNECT
        reason = f"no connection within connect_timeout (0.5 s): {stage} did not finish"
        assert reason in figures(gw)["last_error"]
        assert gw.wait_log(lambda ln: reason in ln, 5)
        # Logged once for the three attempts (again only when the reason changes).
        assert sum(reason in ln for ln in gw.logs) == 1
        for conn in held:
            conn.close()
    finally:
        server.close()
