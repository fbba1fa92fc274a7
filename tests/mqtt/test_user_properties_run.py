"""Runs of User Properties are decoded as a whole (mqtt/properties.py ``_user_properties``):
the same pairs, and for a bad string the same error, as one property at a time; and a
packet of many costs a fraction of what it did (200,000 took 0.3 s)."""


import pytest

from edgebroker.errors import ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt import properties as Q


def _section(body: bytes) -> bytes:
    return Q.varint(len(body)) + body


def _pair(name: bytes, value: bytes) -> bytes:
    return (b"\x26" + len(name).to_bytes(2, "big") + name + len(value).to_bytes(2, "big")
            + value)


def test_a_run_gives_the_pairs_in_order_with_other_properties_between():
    body = (_pair(b"a", b"1") + _pair("é".encode(), b"") + b"\x1f\x00\x01r"
            + _pair(b"b", b"2"))
    buf = _section(body)
    props, q = Q.decode_properties(buf, 0, len(buf), P.PUBACK)
    assert props == {Q.USER_PROPERTY: [("a", "1"), ("é", ""), ("b", "2")],
                     Q.REASON_STRING: "r"}
    assert q == len(buf)


@pytest.mark.parametrize("bad, message", [
    (b"\xff", "PUBACK properties: User Property value is not well-formed UTF-8"),
    (b"x\x00", "PUBACK properties: User Property value contains U+0000"),
    (b"\x07", "PUBACK properties: User Property value contains U+0007"),
])
def test_a_bad_string_in_a_run_names_what_is_wrong(bad, message):
    body = _pair(b"a", b"1") * 50 + _pair(b"k", bad) + _pair(b"a", b"1") * 50
    with pytest.raises(ProtocolError) as caught:
        buf = _section(body)
        Q.decode_properties(buf, 0, len(buf), P.PUBACK)
    assert message in str(caught.value)


def test_a_pair_past_the_end_is_malformed():
    body = _pair(b"a", b"1") * 3 + b"\x26\x00\x05ab"
    with pytest.raises(ProtocolError) as caught:
        buf = _section(body)
        Q.decode_properties(buf, 0, len(buf), P.PUBACK)
    assert "User Property name" in str(caught.value) and "past the end" in str(caught.value)


def test_200000_empty_user_properties_are_all_decoded():
    """(The run's speed is for the benchmark: 0.3 s one at a time, about 0.15 s as a run.)"""
    buf = _section(b"\x26\x00\x00\x00\x00" * 200_000)
    props, end = Q.decode_properties(buf, 0, len(buf), P.PUBLISH)
    assert end == len(buf) and props[Q.USER_PROPERTY] == [("", "")] * 200_000


def test_a_run_with_a_bad_string_is_scanned_once(monkeypatch):
    """After a run failed (a bad string in it), the rest of the section is decoded one property
    at a time: the run was tried again after each pair, scanning all that followed (n good
    pairs before a bad one cost n * n / 2: a 50 KB CONNECT stalled the loop 33 s)."""
    calls = []
    scan = Q._user_properties
    monkeypatch.setattr(Q, "_user_properties", lambda *a: calls.append(a[1]) or scan(*a))
    body = _pair(b"", b"") * 2000 + _pair(b"k", b"v\x01")
    buf = _section(body)
    with pytest.raises(ProtocolError, match="User Property value contains U\\+0001"):
        Q.decode_properties(buf, 0, len(buf), P.CONNECT)
    assert len(calls) == 1


class _Counted(bytes):
    """A packet that counts the bytes its slices copy."""
    copied = 0

    def __getitem__(self, k):
        if isinstance(k, slice):
            type(self).copied += len(range(*k.indices(len(self))))
        return bytes.__getitem__(self, k)


def test_runs_between_other_properties_copy_only_their_own_bytes():
    """User Properties alternating with Subscription Identifiers (a client may not send those
    in a PUBLISH: refused, but only once the section is decoded): each run copied the rest of
    the section, so a 1 MB PUBLISH took the loop 2 s and a 4 MB one 30 s (mqtt5h)."""
    body = (_pair(b"", b"") + b"\x0b\x01") * 2000
    buf = _Counted(_section(body))
    _Counted.copied = 0
    props, q = Q.decode_properties(buf, 0, len(buf), P.PUBLISH)
    assert q == len(buf) and props[Q.USER_PROPERTY] == [("", "")] * 2000
    assert props[Q.SUBSCRIPTION_ID] == [1] * 2000
    assert _Counted.copied <= len(buf), _Counted.copied
