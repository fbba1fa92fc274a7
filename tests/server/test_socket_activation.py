"""Socket activation: the test plays systemd's part (fakesystemd.SocketUnit). It binds the
listening sockets itself, starts the real broker with them at descriptors 3, 4, ... and
LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (the broker's pid, set by an exec wrapper), and
keeps them open between two starts, as systemd does (server/activation.py,
systemd/edgebroker.socket, docs/deploy.md "Socket activation")."""

import logging
import os
import socket

import pytest

import mqttraw as m
from edgebroker.config import ListenerConfig
from edgebroker.errors import ConfigError
from edgebroker.server import activation
from fakesystemd import SocketUnit

EXIT_TIMEOUT = 15.0


@pytest.fixture
def unit():
    u = SocketUnit()
    yield u
    u.close()


def fd_flags(pid: int, fd: int) -> int:
    """The open flags of descriptor ``fd`` of process ``pid`` (octal in /proc/PID/fdinfo)."""
    with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
        for line in fh:
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    raise AssertionError(f"no flags line in /proc/{pid}/fdinfo/{fd}")


def start_failure(broker, unit, **config) -> str:
    """Start a broker that must refuse to start: its exit code 2 and one error line."""
    b = broker(wait=False, wrap=unit.wrap, pass_fds=unit.fds, **config)
    rc = b.proc.wait(EXIT_TIMEOUT)
    b.stop()
    assert rc == 2, b.log_text()
    errors = [ln for ln in b.logs if ln.startswith("edgebroker: config error: socket activation")]
    assert len(errors) == 1, b.log_text()
    assert not any("listening on" in ln for ln in b.logs), b.log_text()
    return errors[0]


def test_pub_sub_and_a_restart_that_refuses_no_connection(broker, unit, tmp_path, uid):
    port = unit.listen_tcp("mqtt")
    path = str(tmp_path / "mqtt.sock")
    unit.listen_unix("local", path)
    config = dict(listener=[{"host": "127.0.0.1", "port": port}, {"unix_socket": path}],
                  data_dir=str(tmp_path / "state"))
    local = {"unix_path": path}

    os.chmod(path, 0o666)     # systemd's SocketMode= default
    first = broker(wrap=unit.wrap, pass_fds=unit.fds, **config)
    assert first.listeners == [("127.0.0.1", port)] and first.unix_paths == [path]
    assert first.wait_log(f"unix:{path}: the socket file from systemd has mode 0666: every "
                          f"local user may connect (unix_socket_mode 0660 does not apply", 0)
    assert first.wait_log(f"listening on 127.0.0.1:{port} (socket from systemd", 0)
    assert first.wait_log(f"listening on unix:{path} (socket from systemd", 0)
    # The passed descriptors: close-on-exec (a child would not get them) and non-blocking.
    for fd in (3, 4):
        flags = fd_flags(first.proc.pid, fd)
        assert flags & os.O_CLOEXEC and flags & os.O_NONBLOCK, f"fd {fd}: flags {flags:o}"

    # A persistent subscriber on the Unix socket, a publisher on TCP.
    sub = first.client(f"{uid}-sub", clean=False, transport=local)
    sub.subscribe(f"{uid}/#", qos=1)
    pub = first.client(f"{uid}-pub")
    pub.publish(f"{uid}/one", b"before the restart", qos=1)
    assert sub.recv_publish().payload == b"before the restart"
    assert sub.ping() == []     # the PUBACK is in before the stop: nothing to send again
    sub.close()
    pub.close()
    assert first.stop() == 0
    assert os.path.exists(path), "the broker removed the socket file systemd owns"

    # The broker is gone; the sockets are still open here (as in systemd). Callers connect
    # (the kernel queues them) and send their CONNECT and a PUBLISH: none is refused.
    waiting = [m.RawClient("127.0.0.1", port) for _ in range(10)]
    waiting += [m.RawClient("", 0, unix_path=path) for _ in range(10)]
    for i, c in enumerate(waiting):
        c.send(m.connect(f"{uid}-w{i}"))
    sub = m.RawClient("", 0, unix_path=path)
    sub.send(m.connect(f"{uid}-sub", clean=False))
    pub = m.RawClient("127.0.0.1", port)
    pub.send(m.connect(f"{uid}-pub") + m.publish(f"{uid}/two", b"sent while stopped", qos=1,
                                                 packet_id=7))

    # The next start on the same sockets serves them all.
    second = broker(wrap=unit.wrap, pass_fds=unit.fds, **config)
    try:
        ack = sub.expect(m.CONNACK)
        assert (ack.rc, ack.session_present) == (0, True)
        ack = pub.expect(m.CONNACK)
        assert ack.rc == 0
        assert pub.expect(m.PUBACK).packet_id == 7
        got = sub.recv_publish()
        assert (got.topic, got.payload) == (f"{uid}/two", b"sent while stopped")
        for c in waiting:
            assert c.expect(m.CONNACK).rc == 0
        assert second.stats()["clients_connected"] == len(waiting) + 2
    finally:
        for c in waiting + [sub, pub]:
            c.close()
    assert second.stop() == 0

    # Contrast: once nothing holds the TCP socket, a caller is refused.
    unit.close()
    with pytest.raises(ConnectionRefusedError):
        m.RawClient("127.0.0.1", port)


def test_sockets_and_listeners_that_do_not_match_are_named(broker, unit):
    port = unit.listen_tcp("mqtt")
    extra = unit.listen_tcp("extra")
    with socket.socket() as spare:      # an address no socket is passed for
        spare.bind(("127.0.0.1", 0))
        missing = spare.getsockname()[1]
        error = start_failure(broker, unit, listener=[{"host": "127.0.0.1", "port": port},
                                                      {"host": "127.0.0.1", "port": missing}])
    assert (f"listener[1] (127.0.0.1:{missing}) has no socket from systemd: add "
            f"ListenStream=127.0.0.1:{missing} to the socket unit, or remove the listener") in error
    assert (f"socket 'extra' (fd 4, 127.0.0.1:{extra}) matches no listener: add a [[listener]] "
            f"with that address, or remove its ListenStream= from the socket unit") in error
    assert "listener[0]" not in error and "'mqtt'" not in error, error


def test_descriptors_that_are_not_listening_sockets_are_named(broker, unit):
    read_end, write_end = os.pipe()
    os.close(write_end)
    unit.pass_other("pipe", read_end)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    connected = socket.create_connection(server.getsockname())
    unit.pass_other("conn", connected)     # what a socket unit with Accept=yes passes
    dgram = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unit.pass_other("udp", dgram)
    try:
        error = start_failure(broker, unit, listener=[{"host": "127.0.0.1", "port": 1883}])
    finally:
        server.close()
    assert "fd 3 ('pipe') is not an open socket (Socket operation on non-socket)" in error
    assert ("fd 4 ('conn') is not listening (a socket unit with Accept=yes passes connections: "
            "edgebroker.socket needs Accept=no)") in error
    assert "fd 5 ('udp') is not a TCP or Unix stream socket" in error


def test_variables_removed_and_sockets_for_another_process_left_alone(monkeypatch, caplog):
    """In this process: LISTEN_PID naming another process means not activated (the broker
    binds its listeners); the variables are removed from the environment either way."""
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "mqtt")
    monkeypatch.setenv("LISTEN_PID", "1")
    with caplog.at_level(logging.WARNING, "edgebroker.server"):
        assert activation.listen_fds() is None
    assert not {"LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"} & set(os.environ)
    assert f"LISTEN_FDS is set for process 1, not this one ({os.getpid()})" in caplog.text

    monkeypatch.setenv("LISTEN_FDS", "two")
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    with pytest.raises(ConfigError, match="LISTEN_FDS='two' is not a number of descriptors"):
        activation.listen_fds()
    assert "LISTEN_FDS" not in os.environ and "LISTEN_PID" not in os.environ


def test_the_same_address_however_the_listener_writes_it(tmp_path):
    """The rule in this process: a listener's host is compared as the broker would bind it
    ("localhost", an IPv6 address written another way, "::" for a port alone)."""
    socks = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family)
        s.bind((host, 0))
        s.listen(1)
        socks.append(s)
    path = str(tmp_path / "mqtt.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen(1)
    socks.append(unix)
    v4, v6 = (s.getsockname()[1] for s in socks[:2])
    passed = [activation.adopt(s.detach(), name) for s, name in zip(socks, ("a", "b", "c"))]
    try:
        listeners = [ListenerConfig(unix_socket=str(tmp_path / "." / "mqtt.sock")),
                     ListenerConfig(host="0:0::1", port=v6),
                     ListenerConfig(host="localhost", port=v4)]
        assert activation.match(listeners, passed) == [p.sock for p in reversed(passed)]
        every_address = activation.listener_key(ListenerConfig(host="::", port=1883))
        assert activation.listen_stream(every_address) == "[::]:1883"
    finally:
        for p in passed:
            p.sock.close()
