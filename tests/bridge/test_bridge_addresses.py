"""A remote host name with several addresses: the bridge tries each in getaddrinfo's order
within one connection attempt, as socket.create_connection does. The name resolves to ::1
first (an AAAA record, preferred) and 127.0.0.1 (an A record), through the system's real
resolver: the test runs in a private mount namespace (tests/diskfull.py) where a hosts
file of its own is mounted over /etc/hosts; the remote, a real Mosquitto, listens on
127.0.0.1 only, as a gateway without IPv6 sees a dual-stack name. Before, only the first
address was ever tried: the bridge never connected."""

from __future__ import annotations

import socket
import subprocess

from diskfull import in_private_mount_namespace

from .helpers import bridge_table, wait_figure

NAME = "remote.test"


def _hosts(tmp_path) -> None:
    """/etc/hosts, in this mount namespace only, with NAME on ::1 and 127.0.0.1."""
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n::1 {NAME}\n127.0.0.1 {NAME}\n")
    r = subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], capture_output=True,
                       text=True)
    assert r.returncode == 0, f"cannot mount a hosts file: {r.stderr.strip()}"


def test_each_address_of_a_host_name_is_tried(broker, mosquitto_broker, tmp_path, request):
    if not in_private_mount_namespace(request):
        return
    _hosts(tmp_path)
    remote = mosquitto_broker()
    found = socket.getaddrinfo(NAME, remote.port, type=socket.SOCK_STREAM)
    assert [a[4][0] for a in found] == ["::1", "127.0.0.1"], found
    with socket.socket(socket.AF_INET6) as s:     # nothing listens there
        assert s.connect_ex(("::1", remote.port)) != 0
    table = bridge_table(remote.port, [{"pattern": "a/#", "direction": "out", "qos": 1}],
                         address=f"{NAME}:{remote.port}")
    gw = broker(bridge=[table])
    fig = wait_figure(gw, lambda f: f["state"] == "up", timeout=10)
    assert fig["connects"] == 1, fig
