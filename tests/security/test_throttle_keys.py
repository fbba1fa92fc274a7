"""The failed-login throttles key a client by its host as far as its address tells: all of
127.0.0.0/8, ::1 and ::ffff:127.x.y.z are one host ("loopback"), another IPv6 address counts
by its /64 prefix (docs/security.md, "Failed logins are throttled")."""

from __future__ import annotations

import pytest

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
    ("[fe80::1%eth0]:1883", "fe80::/64"),
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
