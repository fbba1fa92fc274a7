"""TLS listeners: raw, paho-mqtt and mosquitto_pub/sub clients; client certificates (required,
missing, wrong CA, identity as user name); stalled handshakes; plain MQTT on the TLS port and
TLS on the plain port; close_notify; certificate reload on SIGHUP; configuration errors.
Deliveries over TLS (large writes, backlogs, bursts) are in test_tls_delivery.py; the fixtures
``pki`` and ``tlssrv`` in conftest.py."""

import shutil
import signal
import socket
import ssl
import time

import pytest

import mqttraw as m
from certs import encrypted_copy
from cli.test_passwd import Terminal
from conftest import _start, _teardown, run_cli, toml_dumps
from mqttraw import ConnectionClosed
from secfiles import wait_counter
from server.conftest import PASSWORDS, client_context, port, tls_client

# What a client sees when the server ends a failed handshake: an alert, a reset or EOF.
TLS_FAILURES = (ssl.SSLError, ConnectionClosed, ConnectionResetError, BrokenPipeError, TimeoutError)


def test_listening_lines_describe_security(tlssrv):
    text = tlssrv.log_text()
    assert f"listening on 127.0.0.1:{port(tlssrv, 1)} (TLS; password file " in text
    assert (f"listening on 127.0.0.1:{port(tlssrv, 2)} (TLS, client certificate required; "
            f"certificate identity as user name; no anonymous; ACL ") in text


def test_raw_tls_login_and_cross_listener_delivery(tlssrv, pki, uid):
    plain = tlssrv.client(f"{uid}-plain", port=port(tlssrv, 0))
    plain.subscribe(f"{uid}/t")
    c = tls_client(tlssrv, pki, 1, f"{uid}-tls", username="alice", password=PASSWORDS["alice"])
    assert c.sock.version() in ("TLSv1.2", "TLSv1.3")
    c.subscribe(f"{uid}/t", qos=1)
    c.publish(f"{uid}/t", b"over tls", qos=1)
    assert c.recv_publish().payload == b"over tls"
    assert plain.recv_publish().payload == b"over tls"
    tls_client(tlssrv, pki, 1, f"{uid}-bad", username="alice", password="wrong", expect_rc=4)
    tls_client(tlssrv, pki, 1, f"{uid}-anon", expect_rc=5)


def test_packets_sent_with_connect_over_tls_wait_for_the_password_check(tlssrv, pki, uid):
    """The TLS transport pauses reading while the check runs; decrypted bytes OpenSSL already
    holds are not lost, and everything is answered in order after CONNACK."""
    c = tlssrv.raw(port(tlssrv, 1), ssl_context=client_context(pki))
    c.send(m.connect(uid, username="held", password=PASSWORDS["held"])
           + m.subscribe(1, [(f"{uid}/t", 1)]) + m.publish(f"{uid}/t", b"x" * 50_000, qos=1,
                                                           packet_id=9) + m.pingreq())
    got = []
    while {m.PINGRESP, m.PUBACK, m.PUBLISH} - {p.type for p in got}:
        got.append(c.recv_packet(10))
    # In order; the PUBACK and the delivery wait for the log write at the end of the pass, so
    # they may follow the PINGRESP.
    ordered = [p for p in got if p.type not in (m.PINGRESP, m.PUBACK)]
    assert [p.type for p in ordered] == [m.CONNACK, m.SUBACK, m.PUBLISH], got
    assert ordered[0].rc == 0 and ordered[2].payload == b"x" * 50_000
    assert [p.packet_id for p in got if p.type == m.PUBACK] == [9]


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_over_tls(tlssrv, pki, paho, uid, qos):
    tls = {"ca_certs": str(pki.ca.cert)}
    sub = paho(port(tlssrv, 1), client_id=f"{uid}-s", tls=tls, username="alice",
               password=PASSWORDS["alice"])
    assert sub.connect_rc == 0
    assert sub.subscribe(f"{uid}/t", qos) == [qos]
    pub = paho(port(tlssrv, 2), client_id=f"{uid}-p",
               tls={**tls, "certfile": str(pki.client.cert), "keyfile": str(pki.client.key)})
    assert pub.connect_rc == 0
    # The certificate identity (device-1) may publish under devices/device-1/ only; alice reads.
    assert sub.subscribe("devices/#", qos) == [qos]
    pub.publish("devices/device-1/temp", b"21.5", qos=qos)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos) == ("devices/device-1/temp", b"21.5", qos)


def test_paho_wrong_password_over_tls(tlssrv, pki, paho, uid):
    c = paho(port(tlssrv, 1), client_id=uid, tls={"ca_certs": str(pki.ca.cert)},
             username="alice", password="nope", reconnect=False)
    assert c.connect_rc.is_failure and c.connect_rc.getName() == "Bad user name or password"


def test_mosquitto_pub_sub_over_tls(tlssrv, pki, mosq, uid):
    auth = ["--cafile", str(pki.ca.cert), "-u", "alice", "-P", PASSWORDS["alice"]]
    sub = mosq("sub", port(tlssrv, 1), *auth, "-t", f"{uid}/t", "-C", "1", "-v", "-d")
    sub.wait_line("received SUBACK")
    pub = mosq("pub", port(tlssrv, 1), *auth, "-t", f"{uid}/t", "-m", "hello mosquitto", "-q", "1")
    assert pub.wait() == 0, pub.out.text()
    sub.wait_line(f"{uid}/t hello mosquitto")
    assert sub.wait() == 0


def test_mosquitto_client_certificate_identity(tlssrv, pki, mosq, uid):
    watcher = tlssrv.client(f"{uid}-w", port=port(tlssrv, 0))
    watcher.subscribe("devices/#")
    cert = ["--cafile", str(pki.ca.cert), "--cert", str(pki.client.cert),
            "--key", str(pki.client.key)]
    for topic in ("devices/device-1/t", "devices/device-2/t"):   # the second is not device-1's
        pub = mosq("pub", port(tlssrv, 2), *cert, "-t", topic, "-m", uid, "-q", "1")
        assert pub.wait() == 0, pub.out.text()
    got = [(p.topic, p.payload) for p in watcher.ping() if p.type == m.PUBLISH]
    assert got == [("devices/device-1/t", uid.encode())]
    assert tlssrv.wait_log(lambda ln: "(user 'device-1')" in ln and "connected" in ln)


def test_client_certificate_required_and_missing(tlssrv, pki, mosq, uid):
    mark = tlssrv.mark()
    with pytest.raises(TLS_FAILURES):
        # TLS 1.3: the client finishes its side first; the server's alert ends the connection.
        tls_client(tlssrv, pki, 2, uid)
    assert tlssrv.wait_log(f"on listener 127.0.0.1:{port(tlssrv, 2)} failed: the client sent no "
                           f"certificate (require_certificate = true); closing", start=mark)
    pub = mosq("pub", port(tlssrv, 2), "--cafile", str(pki.ca.cert), "-t", "devices/x", "-m", "x")
    assert pub.wait() != 0
    assert tls_client(tlssrv, pki, 2, f"{uid}-ok", cert=pki.client2).ping() == []


def test_client_certificate_from_wrong_ca(tlssrv, pki, uid):
    mark = tlssrv.mark()
    with pytest.raises(TLS_FAILURES):
        tls_client(tlssrv, pki, 2, uid, cert=pki.other_client)
    line = tlssrv.wait_log("the client certificate is not signed by the listener's cafile",
                           start=mark)
    assert line and "(unable to get local issuer certificate)" in line, line


def test_client_rejects_server_of_wrong_ca(tlssrv, pki, mosq, uid):
    mark = tlssrv.mark()
    with pytest.raises(ssl.SSLCertVerificationError):
        tlssrv.raw(port(tlssrv, 1),
                   ssl_context=client_context(pki, ca=pki.other_ca.cert))
    assert tlssrv.wait_log(f"on listener 127.0.0.1:{port(tlssrv, 1)} failed: the client does not "
                           f"trust the server certificate", start=mark)
    pub = mosq("pub", port(tlssrv, 1), "--cafile", str(pki.other_ca.cert), "-u", "alice",
               "-P", PASSWORDS["alice"], "-t", "x", "-m", "x")
    assert pub.wait() != 0


def client_hello(pki) -> bytes:
    """The first flight of a real TLS client, produced without a socket."""
    ctx = client_context(pki)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_stalled_handshakes_do_not_block_other_clients(tlssrv, pki, uid):
    """Silent sockets and a half-sent ClientHello sit on the TLS listener; everyone else is served
    at once; the stalled ones are closed after handshake_timeout."""
    mark = tlssrv.mark()
    stalled = [socket.create_connection(("127.0.0.1", port(tlssrv, 3)), timeout=5)
               for _ in range(5)]
    half = socket.create_connection(("127.0.0.1", port(tlssrv, 3)), timeout=5)
    hello = client_hello(pki)
    half.sendall(hello[:len(hello) // 2])
    stalled.append(half)
    started = time.monotonic()
    c = tls_client(tlssrv, pki, 3, f"{uid}-ok")
    assert c.ping() == []
    assert tlssrv.client(f"{uid}-plain", port=port(tlssrv, 0)).ping() == []
    assert time.monotonic() - started < 0.4, "served only after the stalled handshakes timed out"
    for s in stalled:
        assert s.recv(100) == b"", "stalled handshake not closed"
        s.close()
    assert time.monotonic() - started >= 0.3
    start = mark
    for _ in range(6):                      # one log line per stalled socket
        line = tlssrv.wait_log("not finished within 0.5 s (handshake_timeout)", start=start)
        assert line, tlssrv.logs[mark:]
        start = tlssrv.logs.index(line, start) + 1
    assert c.ping() == []


def test_a_storm_of_handshakes_is_taken_a_few_per_pass_and_all_complete(tlssrv, pki, uid):
    """200 TLS clients whose ClientHellos arrive at once: the loop takes 32 handshake steps a
    pass (server/loop.py HANDSHAKES_PER_PASS; 1,000 in one pass held it 0.7 s: dos6), the
    others in the next passes as the selector reports their sockets again: every handshake
    completes and every client is answered, another client's included."""
    import select
    ctx = client_context(pki)
    pending = []
    for _ in range(200):
        raw = socket.create_connection(("127.0.0.1", port(tlssrv, 3)), timeout=5)
        tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1", do_handshake_on_connect=False)
        tls.setblocking(False)
        pending.append(tls)
    done = []
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        waiting = []
        for tls in pending:
            try:
                tls.do_handshake()
                done.append(tls)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                waiting.append(tls)
        pending = waiting
        if pending:
            select.select(pending, [], [], 0.5)
    assert not pending and len(done) == 200
    assert tlssrv.client(f"{uid}-plain", port=port(tlssrv, 0)).ping() == []
    for i, tls in enumerate(done):
        tls.setblocking(True)
        tls.settimeout(10)
        tls.sendall(m.connect(f"{uid}-{i}"))
    for tls in done:
        assert tls.recv(4) == b"\x20\x02\x00\x00"     # CONNACK, accepted
        tls.close()


def test_slow_handshake_completes(tlssrv, pki, uid):
    """A ClientHello trickling in (well within the timeout) still completes."""
    ctx = client_context(pki)
    raw = socket.create_connection(("127.0.0.1", port(tlssrv, 3)), timeout=5)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            data = outgoing.read()
            for i in range(0, len(data), 64):       # 64 bytes per segment
                raw.sendall(data[i:i + 64])
            chunk = raw.recv(65536)
            assert chunk, "server closed during a slow handshake"
            incoming.write(chunk)
    obj.write(m.connect(uid))
    raw.sendall(outgoing.read())
    buf = bytearray()
    while True:
        try:
            buf += obj.read(4096)
        except ssl.SSLWantReadError:
            incoming.write(raw.recv(65536))
            continue
        if len(buf) >= 4:
            break
    assert bytes(buf[:4]) == m.connack(False, 0)
    raw.close()


def test_minimum_tls_version(tlssrv, pki, uid):
    mark = tlssrv.mark()
    with pytest.raises(ssl.SSLError):
        tlssrv.raw(port(tlssrv, 3),
                   ssl_context=client_context(pki, max_version=ssl.TLSVersion.TLSv1_2))
    assert tlssrv.wait_log("the client's TLS version is below the listener's tls_version",
                           start=mark)


def test_plain_mqtt_on_tls_port(tlssrv, mosq, uid):
    mark = tlssrv.mark()
    c = tlssrv.raw(port(tlssrv, 1))
    c.send(m.connect(uid))
    assert c.expect_closed(5)
    assert c.before_close == []
    assert tlssrv.wait_log(f"TLS handshake with 127.0.0.1:{c.local_port} on listener 127.0.0.1:"
                           f"{port(tlssrv, 1)} failed: plain MQTT (a CONNECT) instead of a TLS "
                           f"handshake; the client must connect with TLS", start=mark)
    pub = mosq("pub", port(tlssrv, 1), "-t", "x", "-m", "x")
    assert pub.wait() != 0
    assert wait_counter(tlssrv, "tls/handshakes/failed", lambda v: v >= 2, port(tlssrv, 0))


def test_tls_on_plain_port(tlssrv, pki, mosq, uid):
    mark = tlssrv.mark()
    with pytest.raises(TLS_FAILURES):
        tlssrv.raw(port(tlssrv, 0), ssl_context=client_context(pki))
    line = tlssrv.wait_log("TLS handshake received on plain MQTT listener", start=mark)
    # (followed by the event log's "(repeats are logged at most once per 60 s)")
    assert line and (
        f"TLS handshake received on plain MQTT listener 127.0.0.1:{port(tlssrv, 0)} from "
        f"127.0.0.1:{line.split(' from 127.0.0.1:')[1].split(' ')[0]} — use the TLS listener or "
        f"disable TLS in the client") in line, line
    pub = mosq("pub", port(tlssrv, 0), "--cafile", str(pki.ca.cert), "-t", "x", "-m", "x")
    assert pub.wait() != 0


def _strict_tls_client(b, pki, listener: int, client_id: str) -> ssl.SSLSocket:
    """A connected MQTT client over TLS whose reads raise on a stream cut short without a
    close_notify (SSLEOFError) instead of reading it as a clean end."""
    sock = socket.create_connection(("127.0.0.1", port(b, listener)), timeout=5)
    tls = client_context(pki).wrap_socket(sock, server_hostname="127.0.0.1",
                                          suppress_ragged_eofs=False)
    tls.sendall(m.connect(client_id))
    head = tls.recv(4)
    assert head[:1] == b"\x20" and head[3:4] == b"\x00", head  # CONNACK, accepted
    return tls


def _read_to_clean_end(tls: ssl.SSLSocket) -> bytes:
    """What arrives until the broker ends the TLS stream with a close_notify (SSLEOFError if it
    only closes the socket)."""
    got = b""
    while True:
        chunk = tls.recv(65536)
        if not chunk:
            return got
        got += chunk


@pytest.mark.parametrize("how", ["protocol violation", "takeover", "broker stops"])
def test_connections_the_broker_ends_get_a_close_notify(tmp_path, pki, uid, how):
    b = _start(tmp_path, {"listener": [
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
         "keyfile": str(pki.server.key)}]})
    try:
        tls = _strict_tls_client(b, pki, 1, uid)
        if how == "protocol violation":
            tls.sendall(m.connect(uid))  # a second CONNECT
        elif how == "takeover":
            b.client(uid)  # the same client id on the plain listener
        else:
            b.send_signal(signal.SIGTERM)
        assert _read_to_clean_end(tls) == b""
        tls.close()
    finally:
        _teardown([b])


def test_a_client_close_notify_is_answered(tlssrv, pki, uid):
    # The broker answers a client's close_notify with its own (unwrap waits for it, and raises
    # SSLEOFError without it). A client that just closes its socket is simply gone; the next
    # client is served as usual.
    for polite in (True, False):
        tls = _strict_tls_client(tlssrv, pki, 3, f"{uid}-{polite}")
        if polite:
            tls = tls.unwrap()
        tls.close()
    c = tlssrv.client(f"{uid}-after", port=port(tlssrv, 3),
                      transport={"ssl_context": client_context(pki)})
    c.publish(f"{uid}/t", b"x", qos=1)


# ---------------------------------------------------------------------------------------------
# Certificate reload and configuration errors
# ---------------------------------------------------------------------------------------------

def der(path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_sighup_reloads_certificate_keeping_connections(broker, tmp_path, pki, uid):
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server.cert, live / "server.crt")
    shutil.copy(pki.server.key, live / "server.key")
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(live / "server.crt"),
                          "keyfile": str(live / "server.key")}])
    ctx = client_context(pki)
    old = b.client(f"{uid}-old", transport={"ssl_context": ctx})
    old.subscribe(f"{uid}/t")
    assert old.sock.getpeercert(binary_form=True) == der(pki.server.cert)
    renewed = pki.ca.issue("renewed", "localhost", server=True)
    shutil.copy(renewed.cert, live / "server.crt")
    shutil.copy(renewed.key, live / "server.key")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(f"reload: re-read certificates of 127.0.0.1:{b.port}", start=mark)
    new = b.client(f"{uid}-new", transport={"ssl_context": ctx})
    assert new.sock.getpeercert(binary_form=True) == der(renewed.cert)
    new.publish(f"{uid}/t", b"after reload")
    assert old.recv_publish().payload == b"after reload"     # the old connection is still there
    # A certificate that does not match its key: reload refused, the renewed one stays.
    shutil.copy(pki.client.cert, live / "server.crt")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark)
    assert line and "listener[0].certfile" in line, line
    again = b.client(f"{uid}-again", transport={"ssl_context": ctx})
    assert again.sock.getpeercert(binary_form=True) == der(renewed.cert)
    assert old.ping() == [] and new.ping() == []


def one_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("listener, words", [
    ({"certfile": "/nonexistent/server.crt"}, "listener[0].certfile: /nonexistent/server.crt: "
                                              "file not found"),
    ({"certfile": "{client_cert}", "keyfile": "{server_key}"},
     "listener[0].certfile: {client_cert}: the private key in {server_key} does not match its "
     "certificate (KEY_VALUES_MISMATCH)"),
    # (a file that is no PEM: OpenSSL's "PEM lib" named neither; the file at fault is named)
    ({"certfile": "{server_cert}", "keyfile": "{garbage}"},
     "listener[0].keyfile: {garbage}: no usable PEM private key in it"),
    ({"certfile": "{garbage}", "keyfile": "{server_key}"},
     "listener[0].certfile: {garbage}: no PEM certificate in it"),
    ({"certfile": "{server_cert}"}, "listener[0].certfile: {server_cert}: no usable PEM private "
                                    "key in it (no keyfile is set: the key goes in the certfile"),
    # (a key of another type than the certificate's: a renewal's ECDSA certificate beside the
    # old RSA key: the key is fine, it does not match)
    ({"certfile": "{server_cert}", "keyfile": "{rsa_key}"},
     "listener[0].certfile: {server_cert}: the private key in {rsa_key} does not match its "
     "certificate ("),
    ({"certfile": "{server_cert}", "keyfile": "{server_key}", "cafile": "/nonexistent/ca.crt"},
     "listener[0].cafile: /nonexistent/ca.crt: file not found"),
    ({"certfile": "{server_cert}", "keyfile": "{server_key}", "require_certificate": True},
     "listener[0].require_certificate: needs cafile"),
    ({"certfile": "{server_cert}", "keyfile": "{server_key}", "cafile": "{ca}",
      "use_identity_as_username": True}, "use_identity_as_username: needs require_certificate"),
    ({"require_certificate": True}, "listener[0].require_certificate: needs certfile"),
    ({"certfile": "{server_cert}", "keyfile": "{server_key}", "tls_version": "tlsv1.0"},
     "listener[0].tls_version: must be one of"),
    ({"certfile": "{server_cert}", "keyfile": "{server_key}", "ciphers": "NO-SUCH-CIPHER"},
     "listener[0].ciphers: no cipher matches"),
])
def test_tls_config_errors_exit_2(tmp_path, pki, listener, words):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not PEM\n")
    paths = {"{client_cert}": pki.client.cert, "{server_key}": pki.server.key,
             "{server_cert}": pki.server.cert, "{ca}": pki.ca.cert, "{garbage}": garbage}
    if "{rsa_key}" in listener.values():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        paths["{rsa_key}"] = tmp_path / "rsa.key"
        paths["{rsa_key}"].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    lc = {"host": "127.0.0.1", "port": 0,
          **{k: str(paths.get(v, v)) if isinstance(v, str) else v for k, v in listener.items()}}
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [lc]}))
    for command in (["serve", "-c", str(path)], ["config", "check", "-c", str(path)]):
        r = run_cli(*command)
        assert r.returncode == 2, r.stderr
        expected = words
        for name, path in paths.items():
            expected = expected.replace(name, str(path))
        assert expected in one_line(r)


ENCRYPTED = "the private key is encrypted (edgebroker takes no pass phrase): decrypt it with " \
            "openssl pkey -in {key} -out PLAIN.key"


@pytest.mark.parametrize("form", ["pkcs8", "traditional", "in certfile"])
def test_an_encrypted_key_is_refused_without_asking_for_a_pass_phrase(tmp_path, pki, form):
    """OpenSSL asked for the pass phrase on the terminal (the start waited there; without a
    terminal: "cannot read: Invalid argument"). serve and config check say what it is, at
    once, on a terminal or not."""
    key = encrypted_copy(pki.server.key, tmp_path / "enc.key", traditional=form == "traditional")
    lc = {"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert), "keyfile": str(key)}
    where = "listener[0].keyfile"
    if form == "in certfile":
        both = tmp_path / "both.pem"
        both.write_bytes(pki.server.cert.read_bytes() + key.read_bytes())
        lc, key, where = {**lc, "certfile": str(both), "keyfile": ""}, both, "listener[0].certfile"
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [lc]}))
    words = f"{where}: {key}: " + ENCRYPTED.format(key=key)
    for command in (["serve", "-c", str(path)], ["config", "check", "-c", str(path)]):
        r = run_cli(*command)
        assert r.returncode == 2, r.stderr
        assert one_line(r).endswith(words), r.stderr
        term = Terminal(*command)           # the terminal is the controlling one: no prompt
        assert term.wait(timeout=20) == 2, term.output
        assert b"pass phrase" not in term.output.replace(b"takes no pass phrase", b"")
        assert words.encode() in term.output.replace(b"\r\n", b"").replace(b"\n", b"")


def test_sighup_with_an_encrypted_key_keeps_the_certificate_in_use(broker, tmp_path, pki, uid):
    live = tmp_path / "server.key"
    shutil.copy(pki.server.key, live)
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
                          "keyfile": str(live)}])
    encrypted_copy(pki.server.key, live)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark)
    assert line and f"listener[0].keyfile: {live}: " + ENCRYPTED.format(key=live) in line, line
    assert b.client(uid, transport={"ssl_context": client_context(pki)}).ping() == []


def test_config_check_reads_certificates(tmp_path, pki):
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [
        {"host": "127.0.0.1", "port": 8883, "certfile": str(pki.server.cert),
         "keyfile": str(pki.server.key)}]}))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert "127.0.0.1:8883 (TLS)" in r.stdout


def test_key_in_certfile(broker, tmp_path, pki, uid):
    both = tmp_path / "both.pem"
    both.write_bytes(pki.server.cert.read_bytes() + pki.server.key.read_bytes())
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(both)}])
    assert b.client(uid, transport={"ssl_context": client_context(pki)}).ping() == []


class _Handshaking:
    """What HandshakeTimers uses of a TLSTransport."""

    def __init__(self, timed_out: list):
        self.handshake_entry = None
        self.timed_out = timed_out

    def handshake_timed_out(self):
        self.timed_out.append(self)


def test_handshake_timers_let_go_of_finished_handshakes():
    # A handshake that ends leaves the heap's entry at once (a closed TLS connection is not
    # held until its handshake deadline); the heap is rebuilt once such entries are half of it.
    from edgebroker.server.handshakes import HandshakeTimers
    timers = HandshakeTimers()
    timed_out = []
    pending = [_Handshaking(timed_out) for _ in range(10)]
    for i, t in enumerate(pending):
        timers.add(t, 100.0 + i)
    for t in pending[:8]:
        timers.done(t)
        assert t.handshake_entry is None
    live = [entry[2] for entry in timers.heap if entry[2] is not None]
    assert sorted(live, key=pending.index) == pending[8:]
    assert len(timers.heap) <= 2 * len(live)
    assert timers.next_deadline() == 108.0
    timers.expire(108.5)
    assert timed_out == [pending[8]]
    timers.done(pending[8])                 # ended meanwhile: nothing to do
    timers.expire(200.0)
    assert timed_out == [pending[8], pending[9]] and not timers


@pytest.mark.parametrize("close_notify", [False, True], ids=["fin", "close_notify"])
def test_a_client_that_half_closes_after_connect_gets_its_connack(tlssrv, pki, uid,
                                                                   close_notify):
    """CONNECT, then the end of the client's side (a TCP FIN alone, or a close_notify first):
    the CONNACK still comes, then the broker closes."""
    raw = socket.create_connection(("127.0.0.1", port(tlssrv, 3)), timeout=5)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_context(pki).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
            chunk = raw.recv(65536)
            assert chunk, "server closed during the handshake"
            incoming.write(chunk)
    obj.write(m.connect(uid))
    if close_notify:
        with pytest.raises(ssl.SSLWantReadError):
            obj.unwrap()
    raw.sendall(outgoing.read())
    raw.shutdown(socket.SHUT_WR)
    buf = bytearray()
    while len(buf) < 4:
        try:
            buf += obj.read(4096)
        except ssl.SSLWantReadError:
            chunk = raw.recv(65536)
            assert chunk, f"closed without a CONNACK (got {bytes(buf)!r})"
            incoming.write(chunk)
        except ssl.SSLZeroReturnError:
            break
    assert bytes(buf[:4]) == m.connack(False, 0)
    raw.close()
