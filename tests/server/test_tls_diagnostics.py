"""What the broker and the client say about TLS connections that fail: a stalled handshake
(counted and logged once, at the shorter of handshake_timeout and connect_timeout), a client
certificate that is expired, not yet valid or of another CA (server side), a server
certificate that is expired or for another name (client side), and plain HTTP or MQTT on a
wss:// listener. Real broker, real clients (raw sockets, the stdlib ssl module, the
edgebroker CLI); certificates made here (tests/certs.py)."""

import datetime
import socket
import ssl
import time

import pytest

from certs import make_pki
from conftest import _close_all_clients, _start, _teardown, run_cli
from edgebroker.client.tls import TLSError, open_tls, tls_context
from mqttraw import ConnectionClosed, connect
from server.test_tls import client_hello

CONNECT_TIMEOUT = 1.0
# What a client sees when the server ends a failed handshake: an alert, a reset or EOF.
TLS_FAILURES = (ssl.SSLError, ConnectionClosed, ConnectionResetError, BrokenPipeError, TimeoutError)
DAY = datetime.timedelta(days=1)


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


def out_of_dates(ca, name: str, past: bool, **kw):
    """A certificate signed by ``ca`` that expired yesterday, or is valid from tomorrow."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return ca.issue(name, name, valid=(now - 3 * DAY, now - DAY) if past else (now + DAY,
                                                                                now + 3 * DAY),
                    **kw)


@pytest.mark.parametrize("past, words", [(True, "has expired (certificate has expired)"),
                                         (False, "is not valid yet (certificate is not yet "
                                                 "valid)")], ids=["expired", "not-yet-valid"])
@pytest.mark.parametrize("listener", [3, 4], ids=["wss", "mqtts"])
def test_a_client_certificate_out_of_its_dates_is_not_blamed_on_the_cafile(
        srv, pki, listener, past, words):
    """Signed by the listener's cafile but expired, or not valid yet (a gateway whose clock is
    behind): the log says so and points at the dates and the clock, not at the cafile."""
    cert = out_of_dates(pki.ca, f"device-{'old' if past else 'new'}-{listener}", past)
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    ctx.load_cert_chain(str(cert.cert), str(cert.key))
    mark = srv.mark()
    with pytest.raises(TLS_FAILURES):
        c = srv.raw(port(srv, listener), ssl_context=ctx)
        c.connect("x")
    line = srv.wait_log(f"on listener 127.0.0.1:{port(srv, listener)} failed: the client "
                        f"certificate {words}: check its dates", start=mark)
    assert line, srv.logs[mark:]
    assert "and this machine's clock (now " in line and "cafile" not in line, line


@pytest.mark.parametrize("past, words", [
    (True, "as expired or not valid yet (check its dates, and the server's clock)"),
    (False, "(the server's log says why)")], ids=["expired", "not-yet-valid"])
def test_the_client_is_told_why_its_certificate_was_rejected(srv, pki, past, words):
    """OpenSSL's alert for a client certificate not valid yet is "bad certificate"."""
    cert = out_of_dates(pki.ca, f"device-cli-{past}", past)
    r = run_cli("pub", "-L", f"mqtts://127.0.0.1:{port(srv, 4)}/t", "-m", "x", "--cafile",
                str(pki.ca.cert), "--cert", str(cert.cert), "--key", str(cert.key))
    assert r.returncode == 1 and f"the server rejected our client certificate {words}" \
        in r.stderr, r


def test_a_client_certificate_of_another_ca_still_blames_the_cafile(srv, pki):
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    ctx.load_cert_chain(str(pki.other_client.cert), str(pki.other_client.key))
    mark = srv.mark()
    with pytest.raises(TLS_FAILURES):
        srv.raw(port(srv, 4), ssl_context=ctx).connect("x")
    assert srv.wait_log("failed: the client certificate is not signed by the listener's cafile "
                        "(unable to get local issuer certificate); closing", start=mark)


def test_the_client_tells_an_expired_or_misnamed_server_certificate_from_an_unknown_ca(
        broker, pki, tmp_path):
    """edgebroker pub (the client library's TLS) against a server certificate signed by the CA
    given but expired, or for another name, or signed by another CA: each its own hint."""
    expired = out_of_dates(pki.ca, "server-expired", True, server=True)
    named = pki.ca.issue("server-named", "gateway", server=True, names=("gateway.example",))
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(c.cert),
                          "keyfile": str(c.key)} for c in (expired, named, pki.other_server)])

    def pub(listener: int) -> str:
        r = run_cli("pub", "-L", f"mqtts://127.0.0.1:{port(b, listener)}/t", "-m", "x",
                    "--cafile", str(pki.ca.cert))
        assert r.returncode == 1, r
        return r.stderr

    mark = b.mark()
    err = pub(0)
    assert "certificate has expired (CERTIFICATE_VERIFY_FAILED: the server certificate has " \
           "expired: check its dates" in err and "--cafile" not in err, err
    assert b.wait_log("failed: the client rejected the server certificate as expired or not "
                      "valid yet (check the certfile's dates, and the client's clock)", start=mark)
    err = pub(1)
    assert "IP address mismatch, certificate is not valid for '127.0.0.1'. (CERTIFICATE_VERIFY_" \
           "FAILED: connect by a host name or address the certificate holds (its " \
           "subjectAltName))" in err and "--cafile" not in err, err
    err = pub(2)
    assert "the server certificate is not signed by a trusted CA (give the CA file that " \
           "signed it: --cafile)" in err, err


def test_the_client_names_a_host_name_mismatch(srv, pki):
    """By a host name the certificate does not hold: that name is named, with the hint."""
    with pytest.raises(TLSError) as info:
        open_tls("127.0.0.1", port(srv, 1), timeout=5,
                 context=tls_context(cafile=str(pki.ca.cert)), server_name="gateway.example")
    assert "Hostname mismatch, certificate is not valid for 'gateway.example'. " \
           "(CERTIFICATE_VERIFY_FAILED: connect by a host name the certificate holds (its " \
           "subjectAltName))" in str(info.value), info.value


def refused_at_first_bytes(b, listener: int, data: bytes) -> str:
    """Send ``data`` without TLS; the broker closes at once; its log line."""
    mark = b.mark()
    sock = socket.create_connection(("127.0.0.1", port(b, listener)), timeout=5)
    sock.sendall(data)
    try:
        assert sock.recv(100) == b""
    except ConnectionResetError:
        pass        # (the unread request: the broker's close is a reset)
    peer = f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    line = b.wait_log(f"TLS handshake with {peer} on listener 127.0.0.1:{port(b, listener)} "
                      f"failed: ", start=mark)
    assert line, b.logs[mark:]
    return line.split(" failed: ", 1)[1]


UPGRADE = (b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: "
           b"Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: "
           b"13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")


def test_a_ws_client_on_a_wss_listener_is_named(srv):
    """The most common browser mistake: ws:// on the wss:// port."""
    assert refused_at_first_bytes(srv, 3, UPGRADE) == (
        "an HTTP request (GET) without TLS: a ws:// client on this wss:// listener? the client "
        "must connect with wss://; closing")
    assert refused_at_first_bytes(srv, 3, b"G") == (
        "an HTTP request without TLS: a ws:// client on this wss:// listener? the client must "
        "connect with wss://; closing")


def test_plain_mqtt_and_http_on_tls_listeners(srv):
    assert refused_at_first_bytes(srv, 3, connect("x")) == (
        "plain MQTT (a CONNECT) instead of a TLS handshake; this listener takes MQTT over "
        "WebSocket over TLS: the client must connect with wss://; closing")
    assert refused_at_first_bytes(srv, 4, connect("x")) == (
        "plain MQTT (a CONNECT) instead of a TLS handshake; the client must connect with TLS "
        "(or use a plain MQTT listener); closing")
    assert refused_at_first_bytes(srv, 4, UPGRADE) == (
        "an HTTP request (GET) instead of a TLS handshake; this listener takes MQTT over TLS "
        "(mqtts://); closing")


def test_a_tcp_port_check_is_not_a_failed_handshake(srv):
    """A connection closed before its first byte (a load balancer's or a monitor's TCP check)
    counted as a failed TLS handshake, logged at debug level only: an alert on that counter
    fired for good. Not counted now, as on a plain listener; a refused one after it is."""
    before = srv.stats()["counters"]["tls_handshakes_failed"]
    for listener in (3, 4):
        socket.create_connection(("127.0.0.1", port(srv, listener)), timeout=5).close()
    # (the broker reads those ends no later than this connection's bytes)
    refused_at_first_bytes(srv, 4, connect("x"))
    assert srv.stats()["counters"]["tls_handshakes_failed"] - before == 1


# A plaintext CONNECT, and a well-formed application_data record whose body does not decrypt.
NOT_TLS = connect("x", 60)
BAD_MAC = bytes([23, 3, 3, 0, 40]) + b"\x5a" * 40


@pytest.mark.parametrize("after_connect", [False, True], ids=["before-connect", "after-connect"])
@pytest.mark.parametrize("garbage", [NOT_TLS, BAD_MAC], ids=["plaintext", "bad-mac"])
def test_a_tls_stream_broken_after_the_handshake_is_counted_and_logged(srv, pki, garbage,
                                                                      after_connect):
    """Bytes that are not TLS records after a completed handshake (a broken client TLS stack,
    a corrupting middlebox): one WARNING naming the peer and the TLS error, counted as a
    protocol error, before CONNECT as after it (it was DEBUG, or INFO "connection lost")."""
    before = srv.stats()["counters"]["protocol_errors"]
    mark = srv.mark()
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port(srv, 2)), timeout=10),
                         server_hostname="localhost") as tls:
        if after_connect:
            tls.sendall(connect("broken-stream", 60))
            assert tls.recv(4) == bytes([0x20, 2, 0, 0])
        peer = f"127.0.0.1:{tls.getsockname()[1]}"
        with socket.socket(fileno=socket.dup(tls.fileno())) as raw:   # under the TLS layer
            raw.settimeout(10)
            raw.sendall(garbage)
            with pytest.raises((ConnectionResetError, ssl.SSLError)):
                while raw.recv(4096):
                    pass
                raise ConnectionResetError("closed")
    who = "client 'broken-stream'" if after_connect else "client (before CONNECT)"
    line = srv.wait_log(lambda ln: f"{who} from {peer} on listener 127.0.0.1:{port(srv, 2)}: "
                                   f"broken TLS stream (TLS error: " in ln, start=mark)
    assert line and "WARNING" in line, srv.logs[mark:]
    assert srv.stats()["counters"]["protocol_errors"] == before + 1
