"""The broker sends no AUTH larger than the client's Maximum Packet Size (MQTT-3.1.2-24): the
SCRAM-SHA-256 server-first-message cannot be left out, so the exchange ends instead: CONNACK
0x95 at CONNECT (closed without one when even that does not fit), DISCONNECT 0x95 on a
re-authentication. Logged and counted as a failed exchange. An accepting CONNACK (the
server-final-message, an Assigned Client Identifier) that does not fit is a refusal too, before
any session is made. A SUBACK or UNSUBACK that does not fit closes with DISCONNECT 0x95."""

from __future__ import annotations

import pytest

import mqttraw5 as R
from conftest import _open_clients
from edgebroker.security.passwords import hash_password
from scramclient import METHOD, Scram, keys_field

USER, PASSWORD = "alice", "alice-pw"


@pytest.fixture
def scram_broker(broker, tmp_path):
    pw = tmp_path / "passwd"
    pw.write_text(f"{USER}:{hash_password(PASSWORD)}:{keys_field(PASSWORD)}\n")
    pw.chmod(0o600)
    return broker(password_file=str(pw))


def raw5(b) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    return c


def size(p) -> int:
    return 1 + len(R.varint(len(p.body))) + len(p.body)


def auth_props(data: bytes) -> dict:
    return {R.AUTH_METHOD: METHOD, R.AUTH_DATA: data}


def scram_failed(b) -> int:
    return b.stats()["counters"]["scram_failed"]


@pytest.mark.parametrize("limit, answer", [(64, R.CONNACK), (4, None)])
def test_an_auth_over_the_clients_maximum_packet_size_ends_the_exchange_at_connect(
        scram_broker, uid, limit, answer):
    b = scram_broker
    before = scram_failed(b)
    mark = b.mark()
    c = raw5(b)
    props = {**auth_props(Scram(USER, PASSWORD).first()), R.MAXIMUM_PACKET_SIZE: limit}
    c.send(R.connect5(uid, props=props))
    if answer is None:      # CONNACK 0x95 is 5 bytes: over 4, nothing is sent
        assert c.expect_closed()
    else:
        ack = c.expect(R.CONNACK)
        assert ack.reason == 0x95 and size(ack) <= limit, ack
        assert c.expect_closed()
    told = (f"closed: a CONNACK 0x95 would be larger than its Maximum Packet Size ({limit})"
            if answer is None else "CONNACK 0x95")
    assert b.wait_log(f"refused ({told}): SCRAM-SHA-256: its AUTH (", start=mark)
    assert b.wait_log(f"bytes) would be larger than the client's Maximum Packet Size ({limit})",
                      start=mark)
    assert scram_failed(b) == before + 1
    assert b.stats()["refused"]["packet_too_large"] >= 1


def test_a_reauthentication_auth_over_the_clients_maximum_packet_size_gets_disconnect_0x95(
        scram_broker, uid):
    b = scram_broker
    c = raw5(b)
    s = Scram(USER, PASSWORD)
    c.send(R.connect5(uid, props={**auth_props(s.first()), R.MAXIMUM_PACKET_SIZE: 200}))
    first = c.expect(R.AUTH)
    assert first.reason == 0x18 and size(first) <= 200, first
    c.auth(0x18, auth_props(s.final(first.properties[R.AUTH_DATA])))
    assert c.expect(R.CONNACK).reason == 0
    before = scram_failed(b)
    mark = b.mark()
    # A client nonce of 200 characters: the server-first-message repeats it.
    c.auth(0x19, auth_props(Scram(USER, PASSWORD, nonce="n" * 200).first()))
    d = c.expect_disconnect()
    assert d.reason == 0x95 and size(d) <= 200, d
    assert b.wait_log("re-authentication failed (DISCONNECT 0x95): SCRAM-SHA-256: its AUTH (",
                      start=mark)
    assert scram_failed(b) == before + 1


def _scram_connect(b, client_id: str, limit: int | None) -> tuple[R.Packet5, R.RawClient5]:
    """A SCRAM exchange with a one-character client nonce (a short AUTH) and a Session Expiry
    Interval, the client-final-message sent: (the broker's AUTH, the client)."""
    c = raw5(b)
    s = Scram(USER, PASSWORD, nonce="x")
    props = {**auth_props(s.first()), R.SESSION_EXPIRY: 300}
    if limit is not None:
        props[R.MAXIMUM_PACKET_SIZE] = limit
    c.send(R.connect5(client_id, clean_start=False, props=props))
    first = c.expect(R.AUTH)
    c.auth(0x18, auth_props(s.final(first.properties[R.AUTH_DATA])))
    return first, c


def test_an_accepting_connack_over_the_clients_maximum_packet_size_is_a_refusal(scram_broker):
    """The CONNACK 0x00 of an empty client id carries the Assigned Client Identifier and the
    server-final-message, neither of which the client can go without: when it does not fit
    although the AUTH did, the CONNECT is refused with CONNACK 0x95, and no session is made."""
    b = scram_broker
    first, c = _scram_connect(b, "", None)
    ack = c.expect(R.CONNACK)
    assert ack.reason == 0 and R.ASSIGNED_CLIENT_ID in ack.properties, ack
    c.send(R.disconnect5())
    assert c.expect_closed()
    limit = size(first)
    # Without what it may go without (Topic Alias Maximum, Maximum Packet Size), still over.
    assert size(ack) - 5 - 3 * (R.TOPIC_ALIAS_MAXIMUM in ack.properties) > limit
    stats = b.stats()
    mark = b.mark()
    first, c = _scram_connect(b, "", limit)
    assert size(first) <= limit
    ack = c.expect(R.CONNACK)
    assert ack.reason == 0x95 and size(ack) <= limit, ack
    assert c.expect_closed()
    assert b.wait_log("refused (CONNACK 0x95): its CONNACK 0x00 (", start=mark)
    assert b.wait_log(f"bytes) would be larger than the client's Maximum Packet Size ({limit})",
                      start=mark)
    after = b.stats()
    assert after["sessions"] == stats["sessions"]
    assert after["refused"]["packet_too_large"] == stats["refused"]["packet_too_large"] + 1
    assert after["counters"]["scram_failed"] == stats["counters"]["scram_failed"]


@pytest.mark.parametrize("limit, answer", [(20, R.CONNACK), (4, None)])
def test_an_accepting_connack_too_large_without_auth_is_refused_too(broker, limit, answer):
    b = broker()
    sessions = b.stats()["sessions"]
    mark = b.mark()
    c = raw5(b)
    c.send(R.connect5("", clean_start=False,
                      props={R.SESSION_EXPIRY: 300, R.MAXIMUM_PACKET_SIZE: limit}))
    if answer is None:      # CONNACK 0x95 is 5 bytes: over 4, nothing is sent
        assert c.expect_closed()
        told = f"closed: a CONNACK 0x95 would be larger than its Maximum Packet Size ({limit})"
    else:
        ack = c.expect(R.CONNACK)
        assert ack.reason == 0x95 and size(ack) <= limit, ack
        assert c.expect_closed()
        told = "CONNACK 0x95"
    assert b.wait_log(f"refused ({told}): its CONNACK 0x00 (", start=mark)
    stats = b.stats()
    assert stats["sessions"] == sessions and stats["refused"]["packet_too_large"] == 1


@pytest.mark.parametrize("what", ["SUBACK", "UNSUBACK"])
def test_a_suback_or_unsuback_over_the_clients_maximum_packet_size_gets_disconnect_0x95(
        broker, uid, what):
    """A client announcing 20 bytes and sending a SUBSCRIBE (UNSUBSCRIBE) of 40 filters got a
    45-byte SUBACK (UNSUBACK) all the same (MQTT-3.1.2-24; mqtt5h). Its reason codes cannot be
    left out: the connection is closed with DISCONNECT 0x95 instead, counted and logged."""
    b = broker()
    c = raw5(b)
    assert c.connect(uid, props={R.MAXIMUM_PACKET_SIZE: 20}).reason == 0
    filters = [f"{uid}/f{i}" for i in range(40)]
    small = c.subscribe(*filters[:3]) if what == "SUBACK" else c.unsubscribe(*filters[:3])
    assert small.type == getattr(R, what) and size(small) <= 20, small
    mark = b.mark()
    pid = c.next_pid()
    c.send(R.subscribe5(pid, [(f, 0) for f in filters]) if what == "SUBACK"
           else R.unsubscribe5(pid, filters))
    d = c.expect_disconnect()
    assert d.reason == 0x95 and size(d) <= 20, d
    assert c.expect_closed()
    assert b.wait_log(f"its {what} (45 bytes) would be larger than its Maximum Packet Size (20); "
                      f"closing the connection (DISCONNECT 0x95)", start=mark)
    assert b.stats()["refused"]["packet_too_large"] == 1


def test_a_caller_in_an_exchange_is_held_to_the_pre_connect_packet_limit(scram_broker, uid):
    """While an enhanced authentication exchange runs, the caller is not authenticated: the
    packet limit was raised to max_packet_size at its CONNECT, and one announcing a large
    PUBLISH (only AUTH or DISCONNECT may come before CONNACK) made the broker hold up to that
    much until connect_timeout (200 such callers of any user name: 20 → 226 MB). It is held
    to the largest valid CONNECT until accepted, as a caller before its CONNECT."""
    b = scram_broker
    c = raw5(b)
    c.send(R.connect5(uid, props=auth_props(Scram(USER, PASSWORD).first())))
    assert c.expect(R.AUTH).reason == 0x18
    mark = b.mark()
    c.send(b"\x30" + R.varint(1_000_000) + b"\x00\x01t" + b"x" * 1000)
    assert c.expect_closed(timeout=3)
    assert [(p.type, p.reason) for p in c.before_close] == [(R.CONNACK, 0x95)]
    line = b.wait_log("[max_packet_size]", start=mark, timeout=5)
    assert line and "PUBLISH of 1000004 bytes exceeds the maximum packet size 393236" in line
