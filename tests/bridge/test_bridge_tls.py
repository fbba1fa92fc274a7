"""A bridge over TLS: the remote's certificate checked against cafile, a client certificate
presented; a remote whose certificate another CA signed is refused; unusable TLS files stop
the start with a line naming the bridge; a client certificate renewed in place is used after a
reload (SIGHUP), without a restart."""

from __future__ import annotations

import datetime
import shutil
import signal
import socket

import pytest
from certs import encrypted_copy, make_pki

from .helpers import bridge_table, figures, wait_figure


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_remote(broker, server, client_ca, host="127.0.0.1"):
    """An edgebroker on TLS only (on ``host``), with ``server``'s certificate, that wants
    client certificates signed by ``client_ca``."""
    return broker(listener=[{"host": host, "port": 0, "certfile": str(server.cert),
                             "keyfile": str(server.key), "cafile": str(client_ca.cert),
                             "require_certificate": True, "use_identity_as_username": True}],
                  allow_anonymous=False)


def test_forwards_over_tls_with_a_client_certificate(broker, pki):
    central = _tls_remote(broker, pki.server, pki.ca)
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(sys_interval=0.2,
                bridge=[bridge_table(central.port, rules, cafile=str(pki.ca.cert),
                                     certfile=str(pki.client.cert), keyfile=str(pki.client.key))])
    wait_figure(gw, lambda f: f["state"] == "up")
    assert central.wait_log(lambda ln: f"'{socket.gethostname()}.up'" in ln and "connected" in ln, 5)
    gw.client("pub").publish("s/1", b"over tls", qos=1)
    fig = wait_figure(gw, lambda f: f["forwarded"] == 1)
    assert fig["last_error"] == ""
    # The figures under $SYS too.
    watcher = gw.client("sys-watcher")
    watcher.subscribe("$SYS/broker/bridge/up/+", qos=0)
    seen = {}
    while seen.get("forwarded") != b"1" or seen.get("state") != b"up":
        p = watcher.recv_publish(5)
        seen[p.topic.rsplit("/", 1)[1]] = p.payload


def test_a_remote_certificate_from_another_ca_is_refused(broker, pki):
    central = _tls_remote(broker, pki.other_server, pki.ca)
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(bridge=[bridge_table(central.port, rules, cafile=str(pki.ca.cert),
                                     certfile=str(pki.client.cert), keyfile=str(pki.client.key))])
    line = gw.wait_log(lambda ln: "bridge up: cannot connect to" in ln, 10)
    # Why the verification failed, in the line and in last_error.
    why = "TLS handshake failed: CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"
    assert line is not None and why in line, line
    fig = figures(gw)
    assert fig["state"] != "up" and why in fig["last_error"], fig


def test_a_remote_certificate_for_another_host_is_refused_saying_so(broker, pki):
    central = _tls_remote(broker, pki.server, pki.ca, host="127.0.0.2")
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    table = bridge_table(central.port, rules, cafile=str(pki.ca.cert),
                         certfile=str(pki.client.cert), keyfile=str(pki.client.key))
    gw = broker(bridge=[dict(table, address=f"127.0.0.2:{central.port}")])
    line = gw.wait_log(lambda ln: "bridge up: cannot connect to" in ln, 10)
    why = ("TLS handshake failed: CERTIFICATE_VERIFY_FAILED: IP address mismatch, certificate "
           "is not valid for '127.0.0.2'")
    assert line is not None and why in line, line
    fig = figures(gw)
    assert fig["state"] != "up" and why in fig["last_error"], fig


def test_unusable_tls_files_stop_the_start(broker, tmp_path):
    missing = tmp_path / "nowhere.pem"
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(wait=False, bridge=[bridge_table(1883, rules, cafile=str(missing))])
    assert gw.proc.wait(15) != 0
    gw.stopped = True
    assert gw.wait_log(lambda ln: "bridge[0] (up): cannot use its TLS files" in ln
                       and str(missing) in ln, 5)


def test_an_encrypted_client_key_stops_the_start_without_asking(broker, pki, tmp_path):
    """OpenSSL asked for the key's pass phrase on the terminal; the start now stops at once
    with a line naming the bridge, the key and what to do."""
    key = encrypted_copy(pki.client.key, tmp_path / "client-enc.key")
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(wait=False, bridge=[bridge_table(1883, rules, cafile=str(pki.ca.cert),
                                                 certfile=str(pki.client.cert), keyfile=str(key))])
    assert gw.proc.wait(15) == 2
    gw.stopped = True
    assert gw.wait_log(lambda ln: f"bridge[0] (up).keyfile: {key}: the private key is encrypted "
                                  f"(edgebroker takes no pass phrase): decrypt it with openssl "
                                  f"pkey -in {key} -out PLAIN.key" in ln, 5)


def test_a_remote_that_does_not_speak_tls_is_named_as_the_likely_cause(broker, pki,
                                                                       mosquitto_broker):
    """cafile set, the remote's port plain MQTT: Mosquitto resets the connection at our
    ClientHello; the line says that this happened during the TLS handshake and what that
    suggests, not only "receive failed: Connection reset by peer"."""
    remote = mosquitto_broker()
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(bridge=[bridge_table(remote.port, rules, cafile=str(pki.ca.cert))])
    line = gw.wait_log(lambda ln: "bridge up: cannot connect to" in ln, 10)
    hint = ("(during the TLS handshake: does the remote speak TLS on this port, or did it turn "
            "the connection away, at its connection limit say?)")
    assert line is not None and hint in line, line
    assert hint in figures(gw)["last_error"]


def _mosquitto_wanting_client_certificates(mosquitto_broker, pki):
    """Mosquitto on TLS with ``pki.server``'s certificate, refusing clients without a
    certificate signed by ``pki.ca``."""
    return mosquitto_broker(extra=[f"cafile {pki.ca.cert}", f"certfile {pki.server.cert}",
                                   f"keyfile {pki.server.key}", "require_certificate true"])


def test_a_client_certificate_renewed_in_place_is_used_after_a_reload(broker, pki,
                                                                      mosquitto_broker, tmp_path):
    """The bridge's client certificate has expired: the start warns of it, Mosquitto refuses
    it. A renewed one copied over the same files and SIGHUP: the reload reads the bridge's
    files again and its next connection presents the new certificate (the TLS context was
    made once, at start: the bridge stayed down until a restart)."""
    remote = _mosquitto_wanting_client_certificates(mosquitto_broker, pki)
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = pki.ca.issue("bridge-expired", "gateway",
                           valid=(now - datetime.timedelta(days=3), now - datetime.timedelta(days=1)))
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "client.crt", live / "client.key"
    shutil.copy(expired.cert, cert)
    shutil.copy(expired.key, key)
    rules = [{"pattern": "s/#", "direction": "out", "qos": 1}]
    gw = broker(bridge=[bridge_table(remote.port, rules, cafile=str(pki.ca.cert),
                                     certfile=str(cert), keyfile=str(key))])
    assert any(f"WARNING bridge[0] (up).certfile: {cert}: the certificate expired on " in ln
               and ln.endswith("(notAfter): the remote refuses it") for ln in gw.logs), gw.logs
    line = gw.wait_log(lambda ln: "bridge up: cannot connect to" in ln, 10)
    assert line is not None and "CERTIFICATE_EXPIRED" in line, line
    # Renewed in place, then a reload.
    renewed = pki.ca.issue("bridge-renewed", "gateway")
    shutil.copy(renewed.cert, cert)
    shutil.copy(renewed.key, key)
    mark = gw.mark()
    gw.send_signal(signal.SIGHUP)
    reloaded = gw.wait_log("reload: re-read", 10, start=mark)
    assert reloaded is not None and "certificates of bridge up" in reloaded, reloaded
    assert gw.wait_log(lambda ln: "bridge up: connected to" in ln, 10, start=mark), gw.logs[mark:]
    assert wait_figure(gw, lambda f: f["state"] == "up")["last_error"] == ""
    assert not any("certfile" in ln for ln in gw.logs[mark:]), gw.logs[mark:]
    # Files that cannot be used: the reload is refused and the renewed certificate stays.
    shutil.copy(pki.client.cert, cert)      # (not the certificate of this key)
    mark = gw.mark()
    gw.send_signal(signal.SIGHUP)
    failed = gw.wait_log("reload failed", 10, start=mark)
    assert failed is not None and "bridge[0] (up)" in failed, failed
    remote.stop()
    remote.start()
    assert gw.wait_log(lambda ln: "bridge up: connected to" in ln, 15, start=mark), gw.logs[mark:]
