"""The failed-login throttles key a client by its host as far as its address tells: all of
127.0.0.0/8, ::1 and ::ffff:127.x.y.z are one host ("loopback"), an IPv6 link-local address
counts as itself with its scope, another IPv6 address by its /64 prefix, a Unix socket's
client by its uid (docs/security.md, "Failed logins are throttled")."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import mqttraw as m
from conftest import as_nobody
from edgebroker.security.authenticator import Authenticator
from secfiles import write_passwords

from edgebroker.security.policy import peer_host

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("peer, key", [
    ("127.0.0.1:1883", "loopback"),
    ("127.45.6.7:1883", "loopback"),
    ("[::1]:1883", "loopback"),
    ("[::ffff:127.0.0.9]:1883", "loopback"),
    ("[::ffff:192.0.2.7]:1883", "192.0.2.7"),
    ("192.0.2.7:1883", "192.0.2.7"),
    ("[2001:db8:1:2:a:b:c:d]:1883", "2001:db8:1:2::/64"),
    ("[2001:db8:1:2::99]:1883", "2001:db8:1:2::/64"),
    ("[2001:db8:1:3::1]:1883", "2001:db8:1:3::/64"),
    ("[fe80::1%eth0]:1883", "fe80::/64%eth0"),
    ("[fe80::1%eth1]:1883", "fe80::/64%eth1"),
    ("[FE80:0::0002%eth0]:1883", "fe80::/64%eth0"),
    ("[febf::1:2:3:4:5%eth0]:1883", "febf:0:0:1::/64%eth0"),
    ("[fec0::1]:1883", "fec0::/64"),
    ("unix:/run/edgebroker.sock (pid 7, uid 1000)", "unix uid 1000"),
    ("unix:/run/x (pid 1, uid 9).sock (pid 7, uid 0)", "unix uid 0"),
    ("unix:/run/edgebroker.sock", "unix"),
    ("unix", "unix"),
])
def test_the_throttle_key_of_an_address(peer, key):
    assert peer_host(peer) == key


def test_guesses_from_many_loopback_addresses_are_throttled_as_one_host(broker, tmp_path, uid):
    """A local process picking another 127.x source address for each guess gets no more
    password checks than from one address."""
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw"})
    b = broker(password_file=str(pw), max_login_failures=3, refusal_log_interval=0)
    codes = []
    for i in range(8):
        c = b.raw(source=f"127.0.0.{i + 2}")
        codes.append(c.connect(f"{uid}-{i}", username="alice", password=f"guess-{i}").rc)
        c.close()
    assert codes[:3] == [4, 4, 4] and set(codes[3:]) == {5}, codes
    assert b.wait_log(lambda ln: f"client '{uid}-7'" in ln and "refused (CONNACK 5): 3 failed "
                      "logins in a row for user 'alice' from loopback" in ln)
    assert b.stats()["counters"]["password_checks"] == 3


def test_link_local_clients_share_a_throttle_per_link():
    """Link-local clients are keyed by their link, as another IPv6 client by its /64: a host
    takes any number of fe80:: addresses, and when each was a key of its own, one host got a
    fresh row of failures with each (290 password checks for one user in 10 s from 30
    addresses). Another interface's link is another key: all link-local clients shared
    "fe80::/64" once, on every interface."""
    now = [1000.0]
    auth = Authenticator(lambda: None, lambda: now[0], max_failures=10, window=60)
    for i in range(1, 11):
        auth.record_failure(peer_host(f"[fe80::bad:{i:x}%eth0]:50000"), "sensor-9")
    for fresh in ("[fe80::bad:99%eth0]:40000", "[fe80::1234:5678%eth0]:40000"):
        assert "failed logins in a row for user 'sensor-9' from fe80::/64%eth0" in \
            auth.throttled(peer_host(fresh), "sensor-9"), fresh
    assert auth.throttled(peer_host("[fe80::bad:1%eth1]:40000"), "sensor-9") is None


# A client as the user nobody: connects to the Unix socket, sends CONNECT, prints the
# CONNACK's return code (the packet comes from the tests' encoder, as hex).
_NOBODY_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(bytes.fromhex(sys.argv[2]))
ack = b""
while len(ack) < 4:
    got = s.recv(4 - len(ack))
    if not got:
        break
    ack += got
print(ack[3] if len(ack) == 4 and ack[0] == 0x20 else "closed " + ack.hex())
"""


def test_unix_socket_clients_of_another_user_are_not_throttled_by_root(broker, uid):
    """Failed logins from one local user (root) on the Unix socket throttled every user's
    clients there: all were "unix". Now each uid is its own key."""
    prefix = as_nobody()
    top = tempfile.mkdtemp(prefix="edgebroker-unix-")     # /tmp: nobody may enter it
    try:
        os.chmod(top, 0o755)
        path = os.path.join(top, "mqtt.sock")
        pw = write_passwords(Path(top) / "passwd", {"alice": "alice-pw"})
        b = broker(password_file=str(pw), max_login_failures=2, refusal_log_interval=0,
                   listener=[{"unix_socket": path, "unix_socket_mode": "0666"}])
        codes = []
        for i in range(3):
            c = b.raw(unix_path=path)
            codes.append(c.connect(f"{uid}-{i}", username="alice", password="guess").rc)
            c.close()
        assert codes == [4, 4, 5], codes
        assert b.wait_log(lambda ln: f"client '{uid}-2'" in ln and "2 failed logins in a row "
                          f"for user 'alice' from unix uid {os.getuid()}" in ln)
        packet = m.connect(f"{uid}-nobody", username="alice", password="alice-pw")
        r = subprocess.run([*prefix, "/usr/bin/python3", "-c",
                            _NOBODY_CLIENT, path, packet.hex()],
                           capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == "0", (r.stdout, r.stderr)
        assert b.wait_log(f"client '{uid}-nobody' (user 'alice') from unix:{path} (pid ")
        assert b.stats()["counters"]["password_checks"] == 3
    finally:
        shutil.rmtree(top, ignore_errors=True)
