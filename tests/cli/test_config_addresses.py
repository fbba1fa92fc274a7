"""Listeners and the metrics endpoint on one port: `config check` and `serve` refuse those that
could not all listen, naming both entries; "0.0.0.0" and "::" on one port serve IPv4 and IPv6
side by side (the "::" socket is bound IPV6_V6ONLY, as Mosquitto binds its IPv6 sockets)."""

import os
import socket
import urllib.request

import pytest

import mqttraw
from conftest import REPO, run_cli, toml_dumps

ERROR = "edgebroker: config error: "


def free_port() -> int:
    """A port free on IPv4 and IPv6 (a test needing two sockets on one port cannot use 0)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        return s.getsockname()[1]


def overlaps(port):
    """(listeners, metrics, the problem) for each way two sockets can overlap."""
    return [
        ([("0.0.0.0", port), ("127.0.0.1", port)], "",
         f"listener[1]: 127.0.0.1:{port} overlaps listener[0] (0.0.0.0:{port}): 0.0.0.0 takes "
         f"every IPv4 address on port {port}, so they cannot both listen"),
        ([("127.0.0.1", port), ("0.0.0.0", port)], "",
         f"listener[1]: 0.0.0.0:{port} overlaps listener[0] (127.0.0.1:{port}): 0.0.0.0 takes "
         f"every IPv4 address on port {port}, so they cannot both listen"),
        ([("::1", port), ("::", port)], "",
         f"listener[1]: [::]:{port} overlaps listener[0] ([::1]:{port}): :: takes every IPv6 "
         f"address on port {port}, so they cannot both listen"),
        ([("127.0.0.1", port)], f"127.0.0.1:{port}",
         f"metrics.listen: 127.0.0.1:{port} overlaps listener[0] (127.0.0.1:{port}): the same "
         f"address and port, so they cannot both listen"),
        ([("127.0.0.1", port)], f"0.0.0.0:{port}",
         f"metrics.listen: 0.0.0.0:{port} overlaps listener[0] (127.0.0.1:{port}): 0.0.0.0 "
         f"takes every IPv4 address on port {port}, so they cannot both listen"),
        ([("::", port)], f"[::1]:{port}",
         f"metrics.listen: [::1]:{port} overlaps listener[0] ([::]:{port}): :: takes every IPv6 "
         f"address on port {port}, so they cannot both listen"),
        # The bind failed at start with "[Errno 22] Invalid argument": the IPv6 socket is
        # bound IPV6_V6ONLY beside an IPv4 address, which no IPv4-mapped address can be.
        ([("127.0.0.2", port), ("::ffff:127.0.0.1", port)], "",
         f"listener[1]: [::ffff:127.0.0.1]:{port} overlaps listener[0] (127.0.0.2:{port}): "
         f"::ffff:127.0.0.1 is an IPv4-mapped address, which cannot be bound beside an IPv4 "
         f"address on one port (write it as 127.0.0.1), so they cannot both listen"),
    ]


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
@pytest.mark.parametrize("case", range(7))
def test_overlapping_addresses_are_refused_naming_both(tmp_path, command, case):
    """config check said OK, then serve failed with "Address already in use" (0.0.0.0 and
    127.0.0.1 on one port; [metrics] listen on a listener's port)."""
    port = free_port()
    listeners, metrics, problem = overlaps(port)[case]
    cfg = {"data_dir": str(tmp_path / "data"), "allow_anonymous": True,
           "listener": [{"host": host, "port": p} for host, p in listeners]}
    if metrics:
        cfg["metrics"] = {"listen": metrics}
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps(cfg))
    r = run_cli(*command, "-c", str(path))
    assert (r.returncode, r.stderr) == (2, f"{ERROR}{path}: {problem}\n")


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
def test_a_unix_socket_at_the_admin_sockets_path_is_refused(tmp_path, command):
    """serve said "another broker is running" (it found its own listener's socket there)."""
    data = tmp_path / "data"
    cfg = {"data_dir": str(data), "allow_anonymous": True,
           "listener": [{"unix_socket": str(data / "admin.sock")}]}
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps(cfg))
    r = run_cli(*command, "-c", str(path))
    assert (r.returncode, r.stderr) == (
        2, f"{ERROR}{path}: listener[0]: unix_socket {data / 'admin.sock'} is the path of the "
           f"broker's admin socket (data_dir/admin.sock); choose another\n")


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
def test_two_unix_socket_paths_naming_one_file_are_refused(tmp_path, command):
    """"/d/x.sock" and "/d//x.sock" (or a relative path, or one through a link to /d): config
    check said OK, serve exited 1 ("another process is listening there": its own first
    socket) leaving that socket file behind. Now both refuse them, naming both entries."""
    sock = tmp_path / "x.sock"
    (tmp_path / "link").symlink_to(tmp_path)
    for other in (f"{tmp_path}//x.sock", os.path.relpath(sock, REPO), f"{tmp_path}/link/x.sock"):
        cfg = {"data_dir": str(tmp_path / "data"), "allow_anonymous": True,
               "listener": [{"unix_socket": str(sock)}, {"unix_socket": other}]}
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps(cfg))
        r = run_cli(*command, "-c", str(path))
        assert (r.returncode, r.stderr) == (
            2, f"{ERROR}{path}: listener[1]: unix:{other} names the same file as listener[0] "
               f"(unix:{sock})\n")
        assert not sock.exists()


def test_listen_options_that_overlap_are_refused(tmp_path):
    port = free_port()
    r = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}",
                "--listen", f":{port}")
    assert (r.returncode, r.stderr) == (
        2, f"{ERROR}listener[1]: 0.0.0.0:{port} overlaps listener[0] (127.0.0.1:{port}): 0.0.0.0 "
           f"takes every IPv4 address on port {port}, so they cannot both listen\n")


def test_the_same_port_on_ipv4_and_ipv6_wildcards_serves_both(broker, uid):
    """0.0.0.0 and :: on one port (and a metrics endpoint on [::] beside an IPv4 listener):
    serve failed with "Address already in use", the :: socket taking IPv4 too."""
    port, other = free_port(), free_port()
    b = broker(allow_anonymous=True, metrics={"listen": f"[::]:{other}"},
               listener=[{"host": "0.0.0.0", "port": port}, {"host": "::", "port": port},
                         {"host": "127.0.0.1", "port": other}])
    assert b.listeners == [("0.0.0.0", port), ("::", port), ("127.0.0.1", other)]
    for i, (host, p) in enumerate([("127.0.0.1", port), ("::1", port), ("127.0.0.1", other)]):
        c = mqttraw.RawClient(host, p)
        try:
            assert c.connect(f"{uid}-{i}").rc == 0
        finally:
            c.close()
    text = urllib.request.urlopen(f"http://[::1]:{other}/metrics", timeout=5).read().decode()
    assert "edgebroker_" in text
    assert b.wait_log(f"client '{uid}-1' from [::1]:")
