"""Fixtures and helpers of the TLS tests (test_tls.py, test_tls_delivery.py; ``pki`` also of
test_websocket_clients.py): ``pki``, a fresh set of certificates, and ``tlssrv``, a broker with
a plain and three TLS listeners (each test module that uses them gets its own);
``tls_client`` connects to one of its listeners."""

import ssl

import pytest

from certs import make_pki
from conftest import _close_all_clients, _start, _teardown
from secfiles import write_acl, write_passwords

PASSWORDS = {"alice": "alice-tls-pw", "held": "used-once-so-never-cached"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tlssrv(tmp_path_factory, pki):
    """0: plain, anonymous, no ACL.  1: TLS + password.  2: TLS, client certificate required,
    its CN is the user name, ACL.  3: TLS 1.3 only, handshake_timeout 0.5 s, anonymous."""
    d = tmp_path_factory.mktemp("tls")
    pw = write_passwords(d / "passwd", PASSWORDS)
    acl = write_acl(d / "acl", "pattern readwrite devices/%u/#\n")
    server = {"certfile": str(pki.server.cert), "keyfile": str(pki.server.key)}
    # The byte limits high enough that the large-message test (test_tls_delivery.py: 3.6 MB of
    # QoS 1 to one reader at once, then QoS 0 behind it) tests TLS writes, not the limits
    # (docs/limits.md: beyond them QoS 1 waits in the queue while QoS 0 goes on, or is dropped).
    limits = {"max_inflight_bytes": 16 << 20, "max_pending_write_bytes": 16 << 20}
    b = _start(d, {"password_file": str(pw), "sys_interval": 0.5, "limits": limits, "listener": [
        {"host": "127.0.0.1", "port": 0, "allow_anonymous": True, "password_file": ""},
        {"host": "127.0.0.1", "port": 0, **server},
        {"host": "127.0.0.1", "port": 0, **server, "cafile": str(pki.ca.cert),
         "require_certificate": True, "use_identity_as_username": True, "acl_file": str(acl)},
        {"host": "127.0.0.1", "port": 0, **server, "tls_version": "tlsv1.3",
         "handshake_timeout": 0.5, "allow_anonymous": True, "password_file": ""},
    ]})
    yield b
    _close_all_clients()
    _teardown([b])


def port(b, i):
    return b.listeners[i][1]


def client_context(pki, cert=None, ca=None, max_version=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca or pki.ca.cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def tls_client(b, pki, listener, client_id, cert=None, expect_rc=0, **kw):
    return b.client(client_id, port=port(b, listener), expect_rc=expect_rc,
                    transport={"ssl_context": client_context(pki, cert)}, **kw)
