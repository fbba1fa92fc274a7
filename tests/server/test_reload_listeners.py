"""A reload (SIGHUP) onto a file whose listeners are not those running (one removed, moved,
added): each running listener takes the settings of its own table in the new file, and one
no longer there keeps its running settings and security until a restart."""

import signal
import socket

import mqttraw as m
from conftest import toml_dumps
from secfiles import write_passwords
from server.conftest import client_context

KEPT = "it keeps its running settings, authentication, ACL and TLS until a restart"


def reload_with(b, cfg: dict) -> list[str]:
    """Write ``cfg``, SIGHUP, wait for the reload to be done; its log lines."""
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log(lambda ln: "configuration reloaded" in ln or "reload failed" in ln,
                      timeout=10, start=mark)
    assert line is not None and "configuration reloaded" in line, b.log_text()
    return b.logs[mark:]


def test_a_moved_listener_does_not_take_the_new_top_level_security(broker, tmp_path, uid):
    """The file moves the only listener (a restart opens it there) and drops the top-level
    password_file for allow_anonymous = true: the running listener took the new top level's
    security and let anonymous clients in (a network listener protected by a password became
    open to anyone). It keeps its password file until the restart."""
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw"})
    b = broker(password_file=str(pw))
    b.client(f"{uid}-before", expect_rc=5)
    cfg = dict(b.config, allow_anonymous=True, listener=[{"host": "127.0.0.2", "port": 0}])
    cfg.pop("password_file")
    lines = reload_with(b, cfg)
    b.client(f"{uid}-anonymous", expect_rc=5)
    assert any(f"reload: listener 127.0.0.1:{b.port} is no longer in the file" in ln
               and KEPT in ln for ln in lines), lines
    assert b.client(f"{uid}-alice", username="alice", password="alice-pw").ping() == []


def test_port_0_listeners_are_not_matched_by_address(broker, tmp_path, uid):
    """Two listeners on 127.0.0.1 port 0, the first with a password file, the second
    anonymous; the first is deleted from the file. The running first listener was matched to
    the second's table by its address 127.0.0.1:0 and let anonymous clients in. Now it keeps
    its password file; the second, whose table is unchanged, stays anonymous."""
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw"})
    anonymous = {"host": "127.0.0.1", "port": 0, "password_file": "", "allow_anonymous": True}
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "password_file": str(pw)},
                         anonymous])
    locked, open_ = (port for _, port in b.listeners)
    b.client(f"{uid}-before", expect_rc=5, port=locked)
    lines = reload_with(b, dict(b.config, listener=[anonymous]))
    b.client(f"{uid}-anonymous", expect_rc=5, port=locked)
    assert any(f"reload: listener 127.0.0.1:{locked} is no longer in the file" in ln
               for ln in lines), lines
    assert b.client(f"{uid}-alice", port=locked, username="alice",
                    password="alice-pw").ping() == []
    assert b.client(f"{uid}-open", port=open_).ping() == []


def test_a_listener_losing_its_certfile_stays_tls_until_a_restart(broker, tmp_path, pki, uid):
    """The reloaded file keeps a TLS listener's address but drops its certfile: the port
    served every new connection in plain text from then on (a client's password in the
    clear, TLS clients failing with "wrong version number"), without a word. A certfile is
    part of what a listener speaks: it keeps TLS until a restart, with the warning."""
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
                          "keyfile": str(pki.server.key)}])
    ctx = client_context(pki)
    lines = reload_with(b, dict(b.config, listener=[{"host": "127.0.0.1", "port": 0}]))
    assert any(f"reload: listener 127.0.0.1:{b.port} is no longer in the file" in ln
               and "TLS turned on or off" in ln and KEPT in ln for ln in lines), lines
    assert any("listeners (addresses, protocol, websocket_path, TLS on or off)" in ln
               for ln in lines), lines
    c = b.client(f"{uid}-tls", transport={"ssl_context": ctx})
    c.subscribe(f"{uid}/t")
    c.publish(f"{uid}/t", b"over TLS")
    assert c.recv_publish().payload == b"over TLS"
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as plain:
        plain.sendall(m.connect(f"{uid}-plain"))
        try:
            answer = plain.recv(4)
        except ConnectionResetError:
            answer = b""
        assert answer in (b"", b"\x15\x03")   # no CONNACK: a TLS alert, a close or a reset


def test_a_listener_gaining_a_certfile_stays_plain_until_a_restart(broker, pki, uid):
    """The reverse: a certfile added to a plain listener made it TLS at once, under the
    clients configured to speak plain MQTT to it."""
    b = broker()
    lines = reload_with(b, dict(b.config, listener=[{
        "host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
        "keyfile": str(pki.server.key)}]))
    assert any(f"reload: listener 127.0.0.1:{b.port} is no longer in the file" in ln
               for ln in lines), lines
    assert b.client(f"{uid}-plain").ping() == []
