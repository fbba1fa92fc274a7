"""Names a SCRAM client sends (its authorization identity ``a=``, its user name ``n=``) are
shown cut to their first 100 characters in the refusal's log line and Reason String, at
CONNECT and at re-authentication (docs/security.md, the failed-login throttle)."""

from __future__ import annotations

import pytest

import mqttraw5 as m5
from conftest import _open_clients
from edgebroker.security.passwords import hash_password
from scramclient import METHOD, Scram, keys_field

pytestmark = pytest.mark.timeout(60)

LONG = 60_000


def scram_broker(broker, tmp_path):
    pw = tmp_path / "passwd"
    pw.write_text(f"alice:{hash_password('alice-pw')}:{keys_field('alice-pw')}\n")
    pw.chmod(0o600)
    return broker(password_file=str(pw), refusal_log_interval=0)


def raw5(b) -> m5.RawClient5:
    c = m5.RawClient5(b.host, b.port)
    _open_clients.append(c)
    return c


def auth_props(data: bytes) -> dict:
    return {m5.AUTH_METHOD: METHOD, m5.AUTH_DATA: data}


def assert_cut(line: str | None, name: str) -> None:
    """``line`` shows ``name`` as its first 100 characters then "...", not whole."""
    assert line is not None
    assert f"{name[:100]!r}..." in line, line[:300]
    assert len(line) < 1000, f"a log line of {len(line)} characters"


def test_a_long_authorization_identity_is_cut_at_connect(broker, tmp_path, uid):
    b = scram_broker(broker, tmp_path)
    authzid = "Z" * LONG
    c = raw5(b)
    mark = b.mark()
    c.send(m5.connect5(uid, props=auth_props(f"n,a={authzid},n=alice,r=abcdef".encode())))
    ack = c.recv_packet()
    assert ack.type == m5.CONNACK and ack.reason == 0x87, ack
    assert "authorization identity" in ack.properties[m5.REASON_STRING]
    line = b.wait_log(lambda ln: f"client '{uid}'" in ln and "refused (CONNACK 0x87)" in ln,
                      start=mark)
    assert_cut(line, authzid)
    assert "differs from the user name 'alice'" in line


def test_a_long_user_name_at_reauthentication_is_cut(broker, tmp_path, uid):
    b = scram_broker(broker, tmp_path)
    c = raw5(b)
    s = Scram("alice", "alice-pw")
    c.send(m5.connect5(uid, props=auth_props(s.first())))
    first = c.recv_packet()
    assert first.type == m5.AUTH and first.reason == 0x18, first
    c.auth(0x18, auth_props(s.final(first.properties[m5.AUTH_DATA])))
    assert c.expect(m5.CONNACK).reason == 0
    other = "U" * LONG
    mark = b.mark()
    c.auth(0x19, auth_props(Scram(other, "x").first()))
    d = c.expect_disconnect()
    assert d.reason == 0x87
    assert len(d.properties[m5.REASON_STRING]) < 1000
    line = b.wait_log(lambda ln: f"client '{uid}'" in ln and "re-authentication failed" in ln,
                      start=mark)
    assert_cut(line, other)
    assert "the connection's user is 'alice'" in line
