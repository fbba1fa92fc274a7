"""The MQTT codec: encoding, incremental decoding and every decoder rule.

Malformed inputs are written by hand with the tiny independent helpers below
(never with the codec's own encoder), so a codec bug cannot hide behind itself.
Packets are compared field by field with ``fields()`` rather than ``==``.
"""

import itertools
import random
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgebroker.errors import (
    MALFORMED_PACKET, PACKET_TOO_LARGE, PROTOCOL_ERROR, TOPIC_NAME_INVALID,
    UNSUPPORTED_PROTOCOL_VERSION, ProtocolError,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import PINGRESP_BYTES, encode, encode_ack, encode_publish_head
from edgebroker.mqtt.stream import LARGE_FRAME, LARGE_READ, Decoder, decode_one
from edgebroker.mqtt.packets import (
    Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec, Pubrel,
    Suback, Subscribe, Unsuback, Unsubscribe, Will,
)

# ----------------------------------------------------------------------------- helpers


def vbi(n: int) -> bytes:
    """Remaining-length encoding, written independently of the codec."""
    out = []
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(first: int, body: bytes = b"") -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def s(text) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return u16(len(raw)) + raw


def connect_frame(name=b"MQTT", level=4, flags=0x02, keepalive=60, payload=None) -> bytes:
    if payload is None:
        payload = s("cid")
    return frame(0x10, s(name) + bytes([level, flags]) + u16(keepalive) + payload)


def fields(packet):
    """Every slot of a packet (through its class hierarchy), for exact comparison."""
    names = []
    for klass in type(packet).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name not in names:
                names.append(name)
    values = []
    for name in names:
        value = getattr(packet, name)
        if isinstance(value, Will):
            value = ("Will", value.topic, value.payload, value.qos, value.retain,
                     value.properties)
        values.append((name, value))
    return (type(packet).__name__, tuple(values))


def same(a, b) -> bool:
    return [fields(p) for p in a] == [fields(p) for p in b]


def decode_all(data, decoder=None):
    decoder = decoder or Decoder()
    return list(decoder.feed(data))


def feed_in_pieces(data: bytes, cuts, decoder=None) -> list:
    decoder = decoder or Decoder()
    out = []
    start = 0
    for cut in sorted(cuts) + [len(data)]:
        out.extend(decoder.feed(data[start:cut]))
        start = cut
    assert decoder.buffered == 0
    return out


def raises_rule(data: bytes, rule: str, reason: int = MALFORMED_PACKET):
    with pytest.raises(ProtocolError) as info:
        decode_all(data)
    assert info.value.rule == rule, str(info.value)
    assert info.value.reason == reason, str(info.value)
    assert str(info.value)  # a message that says what was wrong
    return info.value


# ----------------------------------------------------------------------------- round trips

PUBLISH_TOPIC_LEN = 1  # topic "t": remaining length = 2 + 1 + payload (+2 for QoS>0)

REPRESENTATIVE = [
    Connect(),
    Connect("client-1", False, 0),
    Connect("", True, 65535),
    Connect("c", True, 10, will=Will("last/will", b"gone", 2, True)),
    Connect("c", True, 10, will=Will("w", b"", 0, False), username="user", password=b"\x00pw"),
    Connect("c", False, 10, username="ü-user"),
    Connect("c", True, 10, username="u", password=b""),
    Connect("c31", True, 10, protocol_level=P.PROTOCOL_31),
    Connect("c31", True, 10, will=Will("a/b", b"x", 1), username="u", password=b"p",
            protocol_level=P.PROTOCOL_31),
    Connack(False, 0),
    Connack(True, 0),
    Connack(False, 5),
    Publish("t"),
    Publish("a/b/c", b"payload"),
    Publish("a/b", b"\x00\xff", 1, False, False, 1),
    Publish("a/b", b"x", 1, True, True, 65535),
    Publish("$SYS/x", b"x", 2, True, False, 42),
    Publish("/", b"", 2, False, True, 7),
    Publish("ü/€/𝄞", "ü".encode() * 3, 0, True),
    Puback(1), Puback(65535), Pubrec(2), Pubrel(3), Pubcomp(4),
    Subscribe(1, [("a/b", 0)]),
    Subscribe(65535, [("#", 2), ("a/+/c", 1), ("$SYS/#", 0), ("/", 2)]),
    Suback(1, [0]),
    Suback(9, [0, 1, 2, P.SUBACK_FAILURE]),
    Unsubscribe(1, ["a"]),
    Unsubscribe(2, ["a/#", "+", "x/+/y"]),
    Unsuback(5),
    Pingreq(), Pingresp(), Disconnect(),
]


def test_representative_list_covers_every_type():
    assert {p.type for p in REPRESENTATIVE} == set(P.NAMES) - {P.AUTH}  # AUTH: 5.0 only


@pytest.mark.parametrize("packet", REPRESENTATIVE, ids=repr)
def test_round_trip(packet):
    data = encode(packet)
    assert same([decode_one(data)], [packet])


@pytest.mark.parametrize("packet", REPRESENTATIVE, ids=repr)
def test_every_split_gives_the_same_packet(packet):
    data = encode(packet)
    expected = decode_all(data)
    assert same(expected, [packet])
    # byte by byte
    assert same(feed_in_pieces(data, range(1, len(data))), expected)
    # random splits
    rng = random.Random(len(data))
    for _ in range(10):
        cuts = rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 4)))
        assert same(feed_in_pieces(data, cuts), expected)
    # followed by the start of another valid frame
    other = encode(Publish("next/frame", b"abc", 1, packet_id=9))
    for extra in range(1, len(other)):
        decoder = Decoder()
        assert same(decode_all(data + other[:extra], decoder), expected)
        assert same(decode_all(other[extra:], decoder), [Publish("next/frame", b"abc", 1,
                                                                 packet_id=9)])


@pytest.mark.parametrize("remaining", [5, 127, 128, 16383, 16384, 2097151, 2097152])
@pytest.mark.parametrize("qos", [0, 1])
def test_remaining_length_boundaries(remaining, qos):
    overhead = 2 + PUBLISH_TOPIC_LEN + (2 if qos else 0)
    payload = bytes(range(256)) * (remaining // 256 + 1)
    packet = Publish("t", payload[:remaining - overhead], qos, packet_id=3 if qos else None)
    data = encode(packet)
    header_len = 1 + len(vbi(remaining))
    assert len(data) == header_len + remaining
    assert data[1:header_len] == vbi(remaining)
    assert same([decode_one(data)], [packet])
    chunk = 65536
    assert same(feed_in_pieces(data, range(chunk, len(data), chunk)), [packet])
    assert same(feed_in_pieces(data, [1, 2, 3] if len(data) > 4 else []), [packet])


def test_subscribe_boundary_sizes():
    # A SUBSCRIBE whose remaining length is exactly 128 (2-byte remaining length).
    topic = "a" * (128 - 2 - 2 - 1)
    packet = Subscribe(7, [(topic, 1)])
    data = encode(packet)
    assert data[1:3] == vbi(128)
    assert same([decode_one(data)], [packet])


def test_many_frames_in_one_feed_come_out_in_order():
    packets = [Publish(f"t/{i}", str(i).encode(), i % 3, packet_id=i + 1 if i % 3 else None)
               for i in range(500)] + REPRESENTATIVE
    data = b"".join(encode(p) for p in packets)
    assert same(decode_all(data), packets)
    assert same(feed_in_pieces(data, range(1000, len(data), 1000)), packets)


def test_feed_accepts_bytearray_and_memoryview():
    data = encode(Publish("a", b"b", 1, packet_id=1)) * 3
    shared = bytearray(data)
    decoder = Decoder()
    out = list(decoder.feed(memoryview(shared)[:10]))
    shared[:10] = b"\xff" * 10  # the caller reuses its buffer: the decoder must have copied
    out += decoder.feed(bytearray(data[10:]))
    assert same(out, [Publish("a", b"b", 1, packet_id=1)] * 3)


def test_decoded_fields_have_plain_types():
    pub = decode_one(frame(0x33, s("a/b") + u16(5) + b"pay"))
    assert type(pub.topic) is str and type(pub.payload) is bytes
    assert pub.retain is True and pub.dup is False and pub.qos == 1 and pub.packet_id == 5
    con = decode_one(connect_frame(flags=0xC2, payload=s("c") + s("u") + s(b"pw")))
    assert type(con.password) is bytes and con.password == b"pw" and con.username == "u"
    assert con.protocol_name == "MQTT" and con.protocol_level == 4
    old = decode_one(connect_frame(name=b"MQIsdp", level=3))
    assert old.protocol_name == "MQIsdp" and old.protocol_level == 3


# ----------------------------------------------------------------------------- fast encoders

@pytest.mark.parametrize("qos, retain, dup, pid", [
    (0, False, False, None), (0, True, False, None), (1, False, True, 5), (2, True, True, 65535),
])
@pytest.mark.parametrize("payload_len", [0, 10, 121, 122, 123, 124, 300, 20000])
def test_encode_publish_head(qos, retain, dup, pid, payload_len):
    payload = b"p" * payload_len
    head = encode_publish_head(b"a/b", payload_len, qos, retain, dup, pid)
    body = s("a/b") + (u16(pid) if qos else b"") + payload
    first = 0x30 | qos << 1 | (1 if retain else 0) | (8 if dup else 0)
    assert head + payload == frame(first, body)
    assert same([decode_one(head + payload)], [Publish("a/b", payload, qos, retain, dup, pid)])


@pytest.mark.parametrize("ptype, first", [
    (P.PUBACK, 0x40), (P.PUBREC, 0x50), (P.PUBREL, 0x62), (P.PUBCOMP, 0x70), (P.UNSUBACK, 0xB0),
])
def test_encode_ack(ptype, first):
    assert encode_ack(ptype, 0x1234) == bytes([first, 2, 0x12, 0x34])


def test_pingresp_bytes():
    assert PINGRESP_BYTES == b"\xd0\x00" == encode(Pingresp())


# ----------------------------------------------------------------------------- decoder semantics

def test_frames_before_a_bad_frame_are_yielded_then_the_decoder_is_dead():
    good = frame(0x30, s("a") + b"1") + frame(0xC0)
    bad = frame(0x36, s("a"))  # QoS 3
    decoder = Decoder()
    gen = decoder.feed(good + bad + frame(0xC0))
    assert same([next(gen), next(gen)], [Publish("a", b"1"), Pingreq()])
    with pytest.raises(ProtocolError) as info:
        next(gen)
    assert info.value.rule == "MQTT-3.3.1-4"
    for _ in range(2):
        with pytest.raises(ProtocolError) as again:
            list(decoder.feed(frame(0xC0)))
        assert again.value is info.value


def test_consumer_may_stop_early():
    packets = [Publish("a", bytes([i])) for i in range(5)]
    data = b"".join(encode(p) for p in packets)
    decoder = Decoder()
    gen = decoder.feed(data[:-2])
    assert same([next(gen)], packets[:1])
    del gen  # abandoned mid-way
    gen = decoder.feed(b"")
    assert same([next(gen), next(gen)], packets[1:3])
    # never iterated at all
    decoder.feed(b"")
    assert same(decode_all(data[-2:], decoder), packets[3:])
    assert decoder.buffered == 0


def test_abandoned_generator_then_more_data():
    decoder = Decoder()
    gen = decoder.feed(frame(0xC0) + frame(0xE0) + frame(0x30, s("x"))[:3])
    assert same([next(gen)], [Pingreq()])
    rest = frame(0x30, s("x"))[3:]
    assert same(decode_all(rest, decoder), [Disconnect(), Publish("x")])


def test_close_of_a_generator_keeps_untaken_frames():
    decoder = Decoder()
    gen = decoder.feed(frame(0xC0) * 3)
    next(gen)
    gen.close()
    assert len(decode_all(b"", decoder)) == 2


def test_empty_and_partial_feeds_yield_nothing():
    decoder = Decoder()
    assert decode_all(b"", decoder) == []
    data = encode(Publish("a/b", b"x" * 1000))
    assert decode_all(data[:1], decoder) == []
    assert decode_all(data[1:2], decoder) == []
    assert decode_all(data[2:500], decoder) == []
    assert decoder.buffered == 500
    assert same(decode_all(data[500:], decoder), [Publish("a/b", b"x" * 1000)])


def test_max_packet_size_is_checked_before_the_body_arrives():
    decoder = Decoder(max_packet_size=1000)
    with pytest.raises(ProtocolError) as info:
        list(decoder.feed(b"\x30" + vbi(998)))  # 1 + 2 + 998 = 1001 bytes
    assert info.value.reason == PACKET_TOO_LARGE
    assert info.value.rule == "max_packet_size"
    # the largest allowed frame is accepted
    decoder = Decoder(max_packet_size=1000)
    data = frame(0x30, s("t") + b"x" * (997 - 3))
    assert len(data) == 1000
    assert same(decode_all(data, decoder), [Publish("t", b"x" * 994)])


def test_max_packet_size_with_a_huge_declared_length():
    decoder = Decoder(max_packet_size=1 << 20)
    with pytest.raises(ProtocolError) as info:
        list(decoder.feed(b"\x30\xff\xff\xff\x7f"))
    assert info.value.reason == PACKET_TOO_LARGE


def test_max_packet_size_is_checked_after_good_frames():
    decoder = Decoder(max_packet_size=16)
    gen = decoder.feed(frame(0xC0) + b"\x30" + vbi(100))
    assert same([next(gen)], [Pingreq()])
    with pytest.raises(ProtocolError):
        next(gen)


def test_fifth_remaining_length_byte_is_rejected_without_waiting():
    raises_rule(b"\x30\xff\xff\xff\xff", "MQTT-2.2.3")
    raises_rule(b"\x30\x80\x80\x80\x80\x01", "MQTT-2.2.3")
    # four bytes are fine (the maximum remaining length) and just wait for the body
    assert decode_all(b"\x30\xff\xff\xff\x7f") == []


def test_non_minimal_remaining_length_is_accepted():
    # 3.1.1 does not forbid a non-minimal encoding; the value is what counts.
    body = s("a") + b"x"
    assert same(decode_all(b"\x30\x84\x00" + body), [Publish("a", b"x")])


def test_bad_first_byte_is_reported_as_soon_as_it_arrives():
    raises_rule(b"\x36", "MQTT-3.3.1-4")
    raises_rule(b"\x00", "MQTT-2.2.1")
    raises_rule(b"\x63", "MQTT-2.2.2-1")


def test_decode_one_rejects_trailing_and_missing_bytes():
    data = encode(Pingreq())
    with pytest.raises(ProtocolError):
        decode_one(data + b"\x00")
    with pytest.raises(ProtocolError):
        decode_one(data + data)
    with pytest.raises(ProtocolError):
        decode_one(data[:1])


# ----------------------------------------------------------------------------- rules, by hand

FIRST_BYTE_CASES = [
    # reserved packet types
    (b"\x00\x00", "MQTT-2.2.1"),
    (b"\x0f\x00", "MQTT-2.2.1"),
    (b"\xf0\x00", "MQTT-2.2.1"),
    # flags that must be 0010
    (frame(0x60, u16(1)), "MQTT-2.2.2-1"),           # PUBREL 0000
    (frame(0x63, u16(1)), "MQTT-2.2.2-1"),           # PUBREL 0011
    (frame(0x80, u16(1) + s("a") + b"\x00"), "MQTT-2.2.2-1"),  # SUBSCRIBE 0000
    (frame(0x8A, u16(1) + s("a") + b"\x00"), "MQTT-2.2.2-1"),  # SUBSCRIBE 1010
    (frame(0xA0, u16(1) + s("a")), "MQTT-2.2.2-1"),  # UNSUBSCRIBE 0000
    (frame(0xA3, u16(1) + s("a")), "MQTT-2.2.2-1"),  # UNSUBSCRIBE 0011
    # flags that must be 0000
    (connect_frame()[:0] + bytes([0x12]) + connect_frame()[1:], "MQTT-2.2.2-1"),  # CONNECT
    (frame(0x21, b"\x00\x00"), "MQTT-2.2.2-1"),      # CONNACK
    (frame(0x42, u16(1)), "MQTT-2.2.2-1"),           # PUBACK
    (frame(0x58, u16(1)), "MQTT-2.2.2-1"),           # PUBREC
    (frame(0x71, u16(1)), "MQTT-2.2.2-1"),           # PUBCOMP
    (frame(0x92, u16(1) + b"\x00"), "MQTT-2.2.2-1"),  # SUBACK
    (frame(0xB2, u16(1)), "MQTT-2.2.2-1"),           # UNSUBACK
    (frame(0xC1), "MQTT-2.2.2-1"),                   # PINGREQ
    (frame(0xD4), "MQTT-2.2.2-1"),                   # PINGRESP
    (frame(0xE8), "MQTT-2.2.2-1"),                   # DISCONNECT
    # PUBLISH flags
    (frame(0x36, s("a")), "MQTT-3.3.1-4"),           # QoS 3
    (frame(0x3F, s("a") + u16(1)), "MQTT-3.3.1-4"),  # QoS 3 with dup and retain
    (frame(0x38, s("a")), "MQTT-3.3.1-2"),           # DUP with QoS 0
    (frame(0x39, s("a")), "MQTT-3.3.1-2"),           # DUP with QoS 0, retain
]


@pytest.mark.parametrize("data, rule", FIRST_BYTE_CASES)
def test_fixed_header_rules(data, rule):
    raises_rule(data, rule)


PUBLISH_CASES = [
    (frame(0x30, s("") + b"x"), "MQTT-4.7.3-1", TOPIC_NAME_INVALID),
    (frame(0x32, s("") + u16(1)), "MQTT-4.7.3-1", TOPIC_NAME_INVALID),
    (frame(0x30, s("a/+/b")), "MQTT-3.3.2-2", TOPIC_NAME_INVALID),
    (frame(0x30, s("+")), "MQTT-3.3.2-2", TOPIC_NAME_INVALID),
    (frame(0x30, s("a/#")), "MQTT-3.3.2-2", TOPIC_NAME_INVALID),
    (frame(0x30, s("#")), "MQTT-3.3.2-2", TOPIC_NAME_INVALID),
    (frame(0x30, s(b"a\xffb")), "MQTT-1.5.3-1", MALFORMED_PACKET),      # not UTF-8
    (frame(0x30, s(b"\xed\xa0\x80")), "MQTT-1.5.3-1", MALFORMED_PACKET),  # surrogate U+D800
    (frame(0x30, s(b"\xc0\xaf")), "MQTT-1.5.3-1", MALFORMED_PACKET),    # overlong '/'
    (frame(0x30, s(b"\xe0\x80\xaf")), "MQTT-1.5.3-1", MALFORMED_PACKET),  # overlong, 3 bytes
    (frame(0x30, s(b"\xf4\x90\x80\x80")), "MQTT-1.5.3-1", MALFORMED_PACKET),  # > U+10FFFF
    (frame(0x30, s(b"a\x00b")), "MQTT-1.5.3-2", MALFORMED_PACKET),
    (frame(0x32, s("a") + u16(0)), "MQTT-2.3.1-1", MALFORMED_PACKET),
    (frame(0x34, s("a") + u16(0) + b"data"), "MQTT-2.3.1-1", MALFORMED_PACKET),
    (frame(0x32, s("a")), "MQTT-2.2.3", MALFORMED_PACKET),              # no packet id
    (frame(0x32, s("a") + b"\x01"), "MQTT-2.2.3", MALFORMED_PACKET),    # half a packet id
    (frame(0x30, u16(5) + b"abc"), "MQTT-2.2.3", MALFORMED_PACKET),     # topic past the end
    (frame(0x30, b"\x00"), "MQTT-2.2.3", MALFORMED_PACKET),             # half a length
    (frame(0x30), "MQTT-2.2.3", MALFORMED_PACKET),                      # nothing at all
]


@pytest.mark.parametrize("data, rule, reason", PUBLISH_CASES)
def test_publish_rules(data, rule, reason):
    raises_rule(data, rule, reason)


def test_publish_payload_is_the_rest_and_may_be_empty():
    assert same(decode_all(frame(0x30, s("a"))), [Publish("a", b"")])
    assert same(decode_all(frame(0x32, s("a") + u16(1))), [Publish("a", b"", 1, packet_id=1)])
    # payload bytes that look like anything are just payload
    assert same(decode_all(frame(0x30, s("a") + b"\x00\xff+#")), [Publish("a", b"\x00\xff+#")])


ID_CASES = [
    (frame(0x40, u16(0)), "MQTT-2.3.1-1"),
    (frame(0x50, u16(0)), "MQTT-2.3.1-1"),
    (frame(0x62, u16(0)), "MQTT-2.3.1-1"),
    (frame(0x70, u16(0)), "MQTT-2.3.1-1"),
    (frame(0xB0, u16(0)), "MQTT-2.3.1-1"),
    (frame(0x82, u16(0) + s("a") + b"\x00"), "MQTT-2.3.1-1"),
    (frame(0xA2, u16(0) + s("a")), "MQTT-2.3.1-1"),
    (frame(0x90, u16(0) + b"\x00"), "MQTT-2.3.1-1"),
    # exact lengths
    (frame(0x40, b"\x01"), "MQTT-2.2.3"),
    (frame(0x40, u16(1) + b"\x00"), "MQTT-2.2.3"),
    (frame(0x50), "MQTT-2.2.3"),
    (frame(0x62, u16(1) + b"\x00"), "MQTT-2.2.3"),
    (frame(0x70, b"\x00\x01\x02"), "MQTT-2.2.3"),
    (frame(0xB0, b"\x01"), "MQTT-2.2.3"),
    (frame(0xC0, b"\x00"), "MQTT-2.2.3"),
    (frame(0xD0, b"\x00"), "MQTT-2.2.3"),
    (frame(0xE0, b"\x00\x00"), "MQTT-2.2.3"),
    (frame(0x20, b"\x00"), "MQTT-2.2.3"),
    (frame(0x20, b"\x00\x00\x00"), "MQTT-2.2.3"),
    (frame(0x82, b"\x01"), "MQTT-2.2.3"),
    (frame(0xA2, b""), "MQTT-2.2.3"),
    (frame(0x90, b"\x01"), "MQTT-2.2.3"),
]


@pytest.mark.parametrize("data, rule", ID_CASES)
def test_packet_id_and_length_rules(data, rule):
    raises_rule(data, rule)


SUBSCRIBE_CASES = [
    (frame(0x82, u16(1)), "MQTT-3.8.3-3"),
    (frame(0x82, u16(1) + s("a") + b"\x03"), "MQTT-3-8.3-4"),
    (frame(0x82, u16(1) + s("a") + b"\x04"), "MQTT-3-8.3-4"),
    (frame(0x82, u16(1) + s("a") + b"\x80"), "MQTT-3-8.3-4"),
    (frame(0x82, u16(1) + s("a") + b"\xfd"), "MQTT-3-8.3-4"),
    (frame(0x82, u16(1) + s("a") + b"\x00" + s("b") + b"\x41"), "MQTT-3-8.3-4"),
    (frame(0x82, u16(1) + s("") + b"\x00"), "MQTT-4.7.3-1"),
    (frame(0x82, u16(1) + s("a/#/b") + b"\x00"), "MQTT-4.7.1-2"),
    (frame(0x82, u16(1) + s("a#") + b"\x00"), "MQTT-4.7.1-2"),
    (frame(0x82, u16(1) + s("a/b+") + b"\x00"), "MQTT-4.7.1-3"),
    (frame(0x82, u16(1) + s(b"\xff") + b"\x00"), "MQTT-1.5.3-1"),
    (frame(0x82, u16(1) + s(b"a\x00") + b"\x00"), "MQTT-1.5.3-2"),
    (frame(0x82, u16(1) + s("a")), "MQTT-2.2.3"),                 # QoS byte missing
    (frame(0x82, u16(1) + s("a") + b"\x00" + s("b")), "MQTT-2.2.3"),
    (frame(0x82, u16(1) + s("a") + b"\x00" + b"\x00"), "MQTT-2.2.3"),  # half a length
    (frame(0x82, u16(1) + u16(9) + b"abc"), "MQTT-2.2.3"),        # filter past the end
    (frame(0xA2, u16(1)), "MQTT-3.10.3-2"),
    (frame(0xA2, u16(1) + s("")), "MQTT-4.7.3-1"),
    (frame(0xA2, u16(1) + s("a") + s("#/a")), "MQTT-4.7.1-2"),
    (frame(0xA2, u16(1) + s("+a")), "MQTT-4.7.1-3"),
    (frame(0xA2, u16(1) + s(b"\xed\xbf\xbf")), "MQTT-1.5.3-1"),
    (frame(0xA2, u16(1) + s(b"\x00")), "MQTT-1.5.3-2"),
    (frame(0xA2, u16(1) + s("a") + b"\x00"), "MQTT-2.2.3"),       # trailing half length
    (frame(0xA2, u16(1) + u16(2) + b"a"), "MQTT-2.2.3"),
    (frame(0x90, u16(1)), "MQTT-3.9.3"),                          # SUBACK, no codes
    (frame(0x90, u16(1) + b"\x00\x03"), "MQTT-3.9.3-2"),
    (frame(0x90, u16(1) + b"\x81"), "MQTT-3.9.3-2"),
]


@pytest.mark.parametrize("data, rule", SUBSCRIBE_CASES)
def test_subscribe_unsubscribe_suback_rules(data, rule):
    raises_rule(data, rule)


CONNECT_CASES = [
    # protocol name and level
    (connect_frame(name=b"MQTX"), "MQTT-3.1.2-1", PROTOCOL_ERROR),
    (connect_frame(name=b"mqtt"), "MQTT-3.1.2-1", PROTOCOL_ERROR),
    (connect_frame(name=b"MQIsdpX", level=3), "MQTT-3.1.2-1", PROTOCOL_ERROR),
    (connect_frame(name=b"", level=4), "MQTT-3.1.2-1", PROTOCOL_ERROR),
    (connect_frame(name=b"\xff\xfe", level=4), "MQTT-3.1.2-1", PROTOCOL_ERROR),
    (connect_frame(level=6), "MQTT-3.1.2-2", UNSUPPORTED_PROTOCOL_VERSION),
    (connect_frame(level=3), "MQTT-3.1.2-2", UNSUPPORTED_PROTOCOL_VERSION),
    (connect_frame(level=0), "MQTT-3.1.2-2", UNSUPPORTED_PROTOCOL_VERSION),
    (connect_frame(name=b"MQIsdp", level=4), "MQTT-3.1.2-2", UNSUPPORTED_PROTOCOL_VERSION),
    # connect flags
    (connect_frame(flags=0x03), "MQTT-3.1.2-3", MALFORMED_PACKET),
    (connect_frame(flags=0x01), "MQTT-3.1.2-3", MALFORMED_PACKET),
    (connect_frame(flags=0x0A), "MQTT-3.1.2-13", MALFORMED_PACKET),   # will QoS 1, no will
    (connect_frame(flags=0x12), "MQTT-3.1.2-13", MALFORMED_PACKET),   # will QoS 2, no will
    (connect_frame(flags=0x22), "MQTT-3.1.2-15", MALFORMED_PACKET),   # will retain, no will
    (connect_frame(flags=0x1E, payload=s("c") + s("w") + s(b"m")), "MQTT-3.1.2-14",
     MALFORMED_PACKET),                                               # will QoS 3
    (connect_frame(flags=0x42, payload=s("c") + s(b"pw")), "MQTT-3.1.2-22", MALFORMED_PACKET),
    # will topic must be a valid topic name
    (connect_frame(flags=0x06, payload=s("c") + s("a/+") + s(b"m")), "MQTT-4.7.1-1",
     TOPIC_NAME_INVALID),
    (connect_frame(flags=0x06, payload=s("c") + s("#") + s(b"m")), "MQTT-4.7.1-1",
     TOPIC_NAME_INVALID),
    (connect_frame(flags=0x06, payload=s("c") + s("") + s(b"m")), "MQTT-4.7.3-1",
     TOPIC_NAME_INVALID),
    # UTF-8 in every string field
    (connect_frame(payload=s(b"c\xff")), "MQTT-1.5.3-1", MALFORMED_PACKET),
    (connect_frame(payload=s(b"c\xed\xa0\x80")), "MQTT-1.5.3-1", MALFORMED_PACKET),
    (connect_frame(payload=s(b"c\x00")), "MQTT-1.5.3-2", MALFORMED_PACKET),
    (connect_frame(flags=0x06, payload=s("c") + s(b"\xc1\x81") + s(b"m")), "MQTT-1.5.3-1",
     MALFORMED_PACKET),
    (connect_frame(flags=0x06, payload=s("c") + s(b"a\x00") + s(b"m")), "MQTT-1.5.3-2",
     MALFORMED_PACKET),
    (connect_frame(flags=0x82, payload=s("c") + s(b"\x80")), "MQTT-1.5.3-1", MALFORMED_PACKET),
    (connect_frame(flags=0x82, payload=s("c") + s(b"u\x00")), "MQTT-1.5.3-2", MALFORMED_PACKET),
    # structure: missing fields, fields past the end, bytes left over
    (connect_frame(payload=b""), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(payload=b"\x00"), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(payload=u16(4) + b"abc"), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(payload=s("c") + b"\x00"), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(payload=s("c") + s("extra")), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(flags=0x06, payload=s("c") + s("w")), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(flags=0x06, payload=s("c")), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(flags=0x82, payload=s("c")), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(flags=0xC2, payload=s("c") + s("u")), "MQTT-2.2.3", MALFORMED_PACKET),
    (connect_frame(flags=0xC2, payload=s("c") + s("u") + u16(3) + b"p"), "MQTT-2.2.3",
     MALFORMED_PACKET),
    (frame(0x10, s("MQTT")), "MQTT-2.2.3", MALFORMED_PACKET),               # no level
    (frame(0x10, s("MQTT") + b"\x04"), "MQTT-2.2.3", MALFORMED_PACKET),     # no flags
    (frame(0x10, s("MQTT") + b"\x04\x02\x00"), "MQTT-2.2.3", MALFORMED_PACKET),  # half keepalive
    (frame(0x10, b"\x00"), "MQTT-2.2.3", MALFORMED_PACKET),
    (frame(0x10), "MQTT-2.2.3", MALFORMED_PACKET),
    (frame(0x10, u16(4) + b"MQ"), "MQTT-2.2.3", MALFORMED_PACKET),
]


@pytest.mark.parametrize("data, rule, reason", CONNECT_CASES)
def test_connect_rules(data, rule, reason):
    raises_rule(data, rule, reason)


def test_protocol_errors_map_to_connack_codes():
    assert raises_rule(connect_frame(level=6), "MQTT-3.1.2-2",
                       UNSUPPORTED_PROTOCOL_VERSION).connack_code == 1
    assert raises_rule(connect_frame(name=b"HTTP"), "MQTT-3.1.2-1",
                       PROTOCOL_ERROR).connack_code is None


def test_connect_fields_by_hand():
    payload = s("dev-1") + s("will/t") + s(b"\x00bye") + s("ü") + s(b"\x00\xff")
    con = decode_one(connect_frame(flags=0xF6, keepalive=300, payload=payload))  # will QoS 2
    assert fields(con) == fields(Connect("dev-1", True, 300, Will("will/t", b"\x00bye", 2, True),
                                         "ü", b"\x00\xff", 4, "MQTT"))
    con = decode_one(connect_frame(flags=0x00, payload=s("")))
    assert con.client_id == "" and con.clean_session is False and con.will is None
    assert con.username is None and con.password is None


CONNACK_CASES = [
    (frame(0x20, b"\x02\x00"), "MQTT-3.2.2.1"),
    (frame(0x20, b"\x80\x00"), "MQTT-3.2.2.1"),
    (frame(0x20, b"\xff\x00"), "MQTT-3.2.2.1"),
]


@pytest.mark.parametrize("data, rule", CONNACK_CASES)
def test_connack_rules(data, rule):
    raises_rule(data, rule)


def test_every_bad_case_also_fails_after_good_frames_and_in_pieces():
    """The same rules hold when the bad frame arrives mid-stream and split up."""
    cases = (FIRST_BYTE_CASES + [c[:2] for c in PUBLISH_CASES] + ID_CASES + SUBSCRIBE_CASES
             + [c[:2] for c in CONNECT_CASES] + CONNACK_CASES)
    prefix = frame(0xC0) + frame(0x30, s("ok") + b"1")
    for bad, rule in cases:
        decoder = Decoder()
        got = []
        with pytest.raises(ProtocolError) as info:
            for i in range(0, len(prefix + bad), 3):
                got.extend(decoder.feed((prefix + bad)[i:i + 3]))
        assert info.value.rule == rule, (bad, str(info.value))
        assert same(got, [Pingreq(), Publish("ok", b"1")])


# ----------------------------------------------------------------------------- hypothesis

# Without surrogates, control characters and non-characters (Cn), which the decoder refuses.
_chars = st.characters(blacklist_categories=("Cs", "Cc", "Cn"))
_level = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Cn"), blacklist_characters="/+#"),
                 max_size=8)
topic_names = st.lists(_level, min_size=1, max_size=4).map("/".join).filter(bool)
topic_filters = st.builds(
    lambda levels, hash_: "/".join(levels + (["#"] if hash_ else [])),
    st.lists(st.one_of(_level, st.just("+")), max_size=4), st.booleans(),
).filter(bool)
packet_ids = st.integers(1, 65535)
short_text = st.text(_chars, max_size=12)
short_bytes = st.binary(max_size=40)

wills = st.builds(Will, topic_names, short_bytes, st.integers(0, 2), st.booleans())


@st.composite
def connects(draw):
    username = draw(st.none() | short_text)
    password = draw(st.none() | short_bytes) if username is not None else None
    return Connect(draw(short_text), draw(st.booleans()), draw(st.integers(0, 65535)),
                   draw(st.none() | wills), username, password,
                   draw(st.sampled_from([P.PROTOCOL_311, P.PROTOCOL_31])))


@st.composite
def publishes(draw):
    qos = draw(st.integers(0, 2))
    return Publish(draw(topic_names), draw(st.binary(max_size=300)), qos, draw(st.booleans()),
                   draw(st.booleans()) if qos else False, draw(packet_ids) if qos else None)


any_packet = st.one_of(
    connects(),
    st.builds(Connack, st.booleans(), st.integers(0, 5)),
    publishes(),
    st.builds(Puback, packet_ids), st.builds(Pubrec, packet_ids),
    st.builds(Pubrel, packet_ids), st.builds(Pubcomp, packet_ids),
    st.builds(Subscribe, packet_ids,
              st.lists(st.tuples(topic_filters, st.integers(0, 2)), min_size=1, max_size=4)),
    st.builds(Suback, packet_ids, st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1,
                                           max_size=6)),
    st.builds(Unsubscribe, packet_ids, st.lists(topic_filters, min_size=1, max_size=4)),
    st.builds(Unsuback, packet_ids),
    st.builds(Pingreq), st.builds(Pingresp), st.builds(Disconnect),
)

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(any_packet)
def test_hypothesis_round_trip(packet):
    assert same([decode_one(encode(packet))], [packet])


@SETTINGS
@given(st.lists(any_packet, min_size=1, max_size=8), st.data())
def test_hypothesis_any_split_gives_the_same_packets(packets, data):
    stream = b"".join(encode(p) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10, unique=True))
    assert same(feed_in_pieces(stream, cuts), packets)


def _decode_anything(data: bytes, max_packet_size: int = 1 << 16, protocol: int = 0) -> list:
    """Feed data whole and byte-wise; only ProtocolError may escape, and both agree. The
    packets and the error's rule (or None)."""
    results = []
    for step in (len(data) or 1, 1, 7):
        decoder = Decoder(max_packet_size=max_packet_size, protocol=protocol)
        got, error = [], None
        try:
            for i in range(0, len(data), step):
                got.extend(decoder.feed(data[i:i + step]))
        except ProtocolError as exc:
            error = exc.rule
        results.append(([fields(p) for p in got], error))
    assert results[0] == results[1] == results[2]
    return results[0]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_hypothesis_random_bytes_raise_only_protocol_error(data):
    _decode_anything(data)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([0x10, 0x20, 0x30, 0x32, 0x34, 0x62, 0x82, 0x90, 0xA2]),
       st.binary(max_size=120))
def test_hypothesis_random_bodies_raise_only_protocol_error(first, body):
    _decode_anything(frame(first, body))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_packet, min_size=1, max_size=3), st.data())
def test_hypothesis_mutated_frames_raise_only_protocol_error(packets, data):
    stream = mutate(bytearray(b"".join(encode(p) for p in packets)), data)
    _decode_anything(bytes(stream), max_packet_size=1 << 12)


def mutate(stream: bytearray, data) -> bytearray:
    """One to four random changes to ``stream`` (``data``: hypothesis's st.data())."""
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not stream:
            break
        at = data.draw(st.integers(0, len(stream) - 1))
        if kind == "flip":
            stream[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            stream[at] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            stream[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif kind == "delete":
            del stream[at]
        else:
            del stream[at:]
    return stream


# ----------------------------------------------------------------------------- large PUBLISH

def publish_frame(topic: str, payload: bytes, qos: int = 0, pid: int = 0, retain: bool = False,
                  dup: bool = False) -> bytes:
    first = 0x30 | qos << 1 | (1 if retain else 0) | (8 if dup else 0)
    return frame(first, s(topic) + (u16(pid) if qos else b"") + payload)


def large_publish(size: int, qos: int = 0, topic: str = "big/t", pid: int = 7) -> tuple:
    payload = random.Random(size).randbytes(size)
    return publish_frame(topic, payload, qos, pid), payload


def test_large_publish_in_pieces_gets_a_payload_buffer_of_its_own():
    data, payload = large_publish(70_000, qos=1)
    tail = frame(0xC0)
    decoder = Decoder()
    assert decode_all(data[:3000], decoder) == []
    assert decoder.room is not None and decoder.buffered == 3000
    assert decode_all(data[3000:50_000], decoder) == []
    got = decode_all(data[50_000:] + tail, decoder)
    assert same(got, [Publish("big/t", payload, 1, False, False, 7), Pingreq()])
    assert type(got[0].payload) is bytearray
    assert decoder.buffered == 0 and decoder.room is None


def test_large_payload_received_straight_into_room():
    data, payload = large_publish(100_000)
    decoder = Decoder()
    assert decode_all(data[:LARGE_READ], decoder) == []
    pos = LARGE_READ
    out = []
    while decoder.room is not None:
        room = decoder.room
        n = min(len(room), 30_000)
        room[:n] = data[pos:pos + n]
        del room
        pos += n
        out += decoder.filled(n)
    assert pos == len(data)
    assert same(out, [Publish("big/t", payload)])
    # The next read is a short one, so that a following large payload goes to its room too.
    assert decoder.read_hint == LARGE_READ
    assert same(decode_all(frame(0xC0), decoder), [Pingreq()])
    assert decoder.read_hint == 0


def test_a_large_packet_announced_but_not_sent_holds_little_memory():
    data, payload = large_publish(1_000_000)
    decoder = Decoder(max_packet_size=2_000_000)
    decode_all(data[:100], decoder)
    # The payload buffer is twice what arrived (4 KiB at least) until more arrives.
    assert decoder.buffered == 100 and len(decoder.room) + 89 == LARGE_READ
    got = feed_chunks(decoder, data[100:], 7_000)
    assert same(got, [Publish("big/t", payload)])


def feed_chunks(decoder, data: bytes, step: int) -> list:
    out = []
    for i in range(0, len(data), step):
        out += decoder.feed(data[i:i + step])
    return out


def test_a_bad_topic_in_a_large_packet_is_refused_before_its_payload_arrives():
    data, _ = large_publish(50_000, topic="a/+")
    with pytest.raises(ProtocolError) as info:
        decode_all(data[:200])
    assert info.value.rule == "MQTT-3.3.2-2"


def test_keep_holds_bytes_across_a_large_packet_until_the_next_feed():
    data, payload = large_publish(40_000)
    stream = data + frame(0xC0) + data[:100]
    decoder = Decoder()
    decode_all(stream[:1000], decoder)
    decoder.keep(memoryview(bytearray(stream[1000:]))[:])  # a view of a buffer reused later
    got = decode_all(b"", decoder)
    assert same(got, [Publish("big/t", payload), Pingreq()])
    assert decoder.buffered == 100


def test_a_generator_that_never_started_loses_nothing():
    packets = [Publish("a", bytes([i])) for i in range(3)]
    data = b"".join(encode(p) for p in packets)
    decoder = Decoder()
    decoder.feed(data[:4])
    decoder.feed(data[4:])
    assert same(decode_all(b"", decoder), packets)


def test_a_lone_acknowledgement_is_decoded_the_short_way_only_when_nothing_is_buffered():
    decoder = Decoder()
    assert same(decode_all(frame(0x40, u16(513)), decoder), [Puback(513)])
    # Four bytes that look like a PUBACK but continue a buffered PUBLISH are its payload.
    data = frame(0x30, s("t") + b"\x40\x02\x00\x07")
    assert decode_all(data[:-4], decoder) == []
    assert same(decode_all(data[-4:], decoder), [Publish("t", b"\x40\x02\x00\x07")])
    with pytest.raises(ProtocolError) as info:
        decode_all(frame(0x40, u16(0)))
    assert info.value.rule == "MQTT-2.3.1-1"
    with pytest.raises(ProtocolError):
        decode_all(frame(0x60, u16(1)))  # PUBREL must have flags 0010


def scatter(buffers: list, data: bytes) -> None:
    """Fill ``buffers`` in turn with ``data``, as one ``recvmsg_into`` does."""
    for b in buffers:
        k = min(len(b), len(data))
        b[:k] = data[:k]
        data = data[k:]


def read_like_the_transport(decoder: Decoder, stream: bytes, sizes: list, keeps: set,
                            halts: set = frozenset()) -> list:
    """Consume ``stream`` as Transport.read does: into ``decoder.room`` while a large payload
    arrives; into ``decoder.repeat_buffers(size)`` when large PUBLISHes like the last two are
    expected; else reads of ``read_hint`` bytes (or of the next size). Some reads are kept
    (a throttled client) and decoded with the next one; after some (``halts``) the client is
    throttled after the first packet the read gave."""
    out = []
    pos = k = 0
    while pos < len(stream):
        size = sizes[k % len(sizes)]
        if decoder.room is not None:
            room = decoder.room
            n = min(len(room), size, len(stream) - pos)
            room[:n] = stream[pos:pos + n]
            del room
            out += decoder.filled(n)
        elif decoder.read_hint and (parts := decoder.repeat_buffers(size)) is not None:
            # The next frames are expected to be like the last two: headers and payloads apart.
            n = min(sum(map(len, parts)), size, len(stream) - pos)
            scatter(parts, stream[pos:pos + n])
            if k in keeps:  # a throttled client keeps the bytes as they are
                decoder.keep(decoder.unexpected(parts, n))
            else:
                got = decoder.repeated(parts, n)
                if got is None:
                    out += decoder.feed(decoder.unexpected(parts, n))
                elif k in halts and isinstance(got, types.GeneratorType):
                    out += itertools.islice(got, 1)
                    got.close()  # the rest waits in the decoder for the next read
                else:
                    out += got
        else:
            n = min(decoder.read_hint or size, len(stream) - pos)
            chunk = memoryview(bytearray(stream[pos:pos + n]))  # a reused buffer's view
            if k in keeps:
                decoder.keep(chunk)
            else:
                out += decoder.feed(chunk)
        pos += n
        k += 1
    out += decoder.feed(b"")
    assert decoder.buffered == 0 and decoder.room is None
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(any_packet, st.builds(
           lambda n, qos: Publish("big", random.Random(n).randbytes(n), qos,
                                  packet_id=7 if qos else None),
           st.integers(LARGE_READ, 200_000), st.integers(0, 2))), min_size=1, max_size=6),
       st.lists(st.integers(1, 70_000), min_size=1, max_size=5),
       st.sets(st.integers(0, 40), max_size=5))
def test_hypothesis_large_packets_read_any_way_give_the_same_packets(packets, sizes, keeps):
    stream = b"".join(encode(p) for p in packets)
    decoder = Decoder(max_packet_size=1 << 20)
    assert same(read_like_the_transport(decoder, stream, sizes, keeps), packets)


def test_after_a_large_packet_the_next_one_gets_its_whole_buffer_at_once():
    data, payload = large_publish(100_000)
    decoder = Decoder()
    assert same(feed_chunks(decoder, data, 4096), [Publish("big/t", payload)])
    head = len(data) - len(payload)
    decode_all(data[:4096], decoder)
    # The whole payload's buffer, not twice the 4 KiB that arrived: this client sent as
    # large a packet whole before.
    assert len(decoder.room) == len(payload) - (4096 - head)


def test_a_large_packet_whose_header_is_split_still_gets_a_buffer_of_its_own():
    data, payload = large_publish(100_000, qos=1, topic="t" * 300)
    decoder = Decoder()
    assert decode_all(data[:5], decoder) == []        # inside the topic length...
    assert decode_all(data[5:200], decoder) == []     # ...and inside the topic
    assert decoder.room is None
    assert decode_all(data[200:400], decoder) == []   # header complete: a payload buffer
    assert decoder.room is not None and decoder.buffered == 400
    assert same(decode_all(data[400:], decoder), [Publish("t" * 300, payload, 1, packet_id=7)])


def test_an_acknowledgement_ends_the_short_reads_after_a_large_packet():
    data, _ = large_publish(LARGE_FRAME)
    decoder = Decoder()
    decode_all(data, decoder)
    decode_all(data[:LARGE_READ], decoder)
    decode_all(data[LARGE_READ:], decoder)
    assert decoder.read_hint == LARGE_READ
    decode_all(frame(0x40, u16(3)), decoder)
    assert decoder.read_hint == 0


# ------------------------------------------- a large PUBLISH like the last two, read apart


def read_large_way(decoder: Decoder, data: bytes) -> list:
    """One large frame as the transport reads it when nothing is expected: LARGE_READ bytes,
    then the rest straight into ``room`` (as it grows)."""
    assert decoder.repeat_buffers() is None
    out = decode_all(data[:LARGE_READ], decoder)
    pos = LARGE_READ
    while decoder.room is not None:  # the buffer grows as the payload arrives
        room = decoder.room
        n = len(room)
        room[:] = data[pos:pos + n]
        del room
        out += decoder.filled(n)
        pos += n
    assert pos == len(data)
    return out


def read_repeat(decoder: Decoder, data: bytes, n: int | None = None) -> list:
    """One read into ``repeat_buffers()`` of the first ``n`` bytes of ``data`` (all they take
    when None), as Transport._read_large makes it, and what it decodes."""
    parts = decoder.repeat_buffers()
    assert parts is not None
    n = min(len(parts[0]) + len(parts[1]), len(data)) if n is None else n
    scatter(parts, data[:n])
    got = decoder.repeated(parts, n)
    if got is None:
        return decode_all(decoder.unexpected(parts, n), decoder)
    return list(got)


def test_two_alike_large_publishes_make_the_next_arrive_in_a_buffer_of_its_own():
    bodies = [random.Random(i).randbytes(20_000) for i in range(4)]
    frames = [publish_frame("dev/1/raw", b, retain=True) for b in bodies]
    decoder = Decoder()
    assert same(read_large_way(decoder, frames[0]), [Publish("dev/1/raw", bodies[0], 0, True)])
    assert decoder.repeat_buffers() is None   # one is not yet a pattern
    assert same(read_large_way(decoder, frames[1]), [Publish("dev/1/raw", bodies[1], 0, True)])
    for i in (2, 3):
        parts = decoder.repeat_buffers()
        assert [len(b) for b in parts] == [len(frames[i]) - 20_000, 20_000]
        scatter(parts, frames[i])
        got = decoder.repeated(parts, len(frames[i]))
        assert same(got, [Publish("dev/1/raw", bodies[i], 0, True)])
        assert got[0].payload is parts[1]    # the read's buffer is the payload: no copy
        assert decoder.buffered == 0
        assert decoder.read_hint == LARGE_READ


@pytest.mark.parametrize("second", [("dev/2", 20_000, 0), ("dev/1", 20_001, 0),
                                    ("dev/1", 20_000, 1)])
def test_two_large_publishes_that_differ_expect_nothing(second):
    decoder = Decoder()
    read_large_way(decoder, publish_frame("dev/1", bytes(20_000)))
    topic, size, qos = second
    read_large_way(decoder, publish_frame(topic, bytes(size), qos, 5))
    assert decoder.repeat_buffers() is None


def test_a_repeated_qos1_publish_takes_its_own_packet_identifier():
    body = bytes(30_000)
    decoder = Decoder()
    for pid in (1, 2):
        read_large_way(decoder, publish_frame("t", body, 1, pid))
    assert same(read_repeat(decoder, publish_frame("t", body, 1, 3)),
                [Publish("t", body, 1, packet_id=3)])
    assert same(read_repeat(decoder, publish_frame("t", body, 1, 65535)),
                [Publish("t", body, 1, packet_id=65535)])
    # The DUP flag makes another first byte: decoded the usual way, and no longer expected.
    assert same(read_repeat(decoder, publish_frame("t", body, 1, 4, dup=True)),
                [Publish("t", body, 1, dup=True, packet_id=4)])
    assert decoder.repeat_buffers() is None


@pytest.mark.parametrize("other", ["topic", "size", "qos", "small", "short read"])
def test_what_is_not_the_expected_publish_is_decoded_as_usual(other):
    body = bytes(range(256)) * 100
    decoder = Decoder()
    for _ in range(2):
        read_large_way(decoder, publish_frame("dev/7", body))
    if other == "small":
        stream = frame(0xC0) + publish_frame("dev/7", body)
        expected = [Pingreq(), Publish("dev/7", body)]
    elif other == "short read":
        stream = publish_frame("dev/7", body)
        expected = [Publish("dev/7", body)]
    else:
        changed = {"topic": publish_frame("dev/8", body),
                   "size": publish_frame("dev/7", body + b"!"),
                   "qos": publish_frame("dev/7", body, 2, 9)}[other]
        stream = changed + publish_frame("dev/7", body)
        expected = [{"topic": Publish("dev/8", body), "size": Publish("dev/7", body + b"!"),
                     "qos": Publish("dev/7", body, 2, packet_id=9)}[other], Publish("dev/7", body)]
    n = 3 if other == "short read" else None
    out = read_repeat(decoder, stream, n)
    consumed = n if n is not None else min(len(stream), len(publish_frame("dev/7", body)))
    out += decode_all(stream[consumed:], decoder)
    assert same(out, expected)
    assert decoder.buffered == 0 and decoder.room is None


def test_a_repeated_publish_that_arrives_in_pieces_continues_into_room():
    body = random.Random(3).randbytes(50_000)
    data = publish_frame("p", body, 1, 8)
    decoder = Decoder()
    for pid in (6, 7):
        read_large_way(decoder, publish_frame("p", body, 1, pid))
    head = len(data) - len(body)
    assert read_repeat(decoder, data, head + 1000) == []
    assert decoder.buffered == head + 1000 and len(decoder.room) == 49_000
    room = decoder.room
    room[:] = data[head + 1000:]
    del room
    assert same(decoder.filled(49_000), [Publish("p", body, 1, packet_id=8)])
    # Still expected: the next one is read apart again.
    assert same(read_repeat(decoder, publish_frame("p", body, 1, 9)),
                [Publish("p", body, 1, packet_id=9)])


def test_a_repeated_publish_is_checked_like_any_other():
    body = bytes(20_000)
    decoder = Decoder()
    for pid in (1, 2):
        read_large_way(decoder, publish_frame("t", body, 1, pid))
    with pytest.raises(ProtocolError) as info:
        read_repeat(decoder, publish_frame("t", body, 1, 0))
    assert info.value.rule == "MQTT-2.3.1-1"
    # A maximum lowered (by a reload) below the expected frame's size.
    decoder = Decoder()
    for _ in range(2):
        read_large_way(decoder, publish_frame("t", body))
    decoder.max_packet_size = 10_000
    with pytest.raises(ProtocolError) as info:
        read_repeat(decoder, publish_frame("t", body))
    assert info.value.reason == PACKET_TOO_LARGE


def read_repeats(decoder: Decoder, data: bytes, room: int, n: int | None = None):
    """One read into ``repeat_buffers(room)`` of the first ``n`` bytes of ``data`` (all the
    pairs take when None): (the pairs, the packets it gives, as a list)."""
    parts = decoder.repeat_buffers(room)
    assert parts is not None
    n = min(sum(map(len, parts)), len(data)) if n is None else n
    scatter(parts, data[:n])
    got = decoder.repeated(parts, n)
    return parts, list(got)


def alike_frames(count: int, size: int = 20_000, topic: str = "dev/1/raw") -> tuple:
    """``count`` alike QoS 1 frames (packet identifiers 1, 2, ...) and a decoder that has
    read the first two the usual way, so it expects the third."""
    frames = [publish_frame(topic, random.Random(i).randbytes(size), 1, i + 1)
              for i in range(count)]
    decoder = Decoder()
    for f in frames[:2]:
        read_large_way(decoder, f)
    return frames, decoder


def test_a_read_takes_more_alike_frames_each_time_they_all_arrive():
    frames, decoder = alike_frames(40)
    pos = 2
    asked = []
    while pos + 16 <= len(frames):
        parts, got = read_repeats(decoder, b"".join(frames[pos:pos + 16]), room=1 << 20)
        asked.append(len(parts) // 2)
        assert [p.packet_id for p in got] == list(range(pos + 1, pos + 1 + len(got)))
        # Each payload is the read's own buffer: no copy.
        assert all(p.payload is parts[2 * i + 1] for i, p in enumerate(got))
        pos += len(got)
    assert asked == [1, 2, 4, 8, 16]
    # No more than the room asks for (the last frame may reach past it).
    parts, got = read_repeats(decoder, b"".join(frames[pos:]), room=2 * len(frames[0]) + 1)
    assert len(parts) == 6 and len(got) == 3
    assert decoder.buffered == 0 and decoder.room is None


def test_a_read_that_fills_fewer_frames_offers_one_more_than_it_filled_next():
    frames, decoder = alike_frames(30)
    pos = 2
    for _ in range(4):  # to 16 pairs
        _, got = read_repeats(decoder, b"".join(frames[pos:pos + 16]), room=1 << 20)
        pos += len(got)
    assert pos == 17
    # Two frames and part of a third arrive: they and the rest of the third are decoded...
    data = b"".join(frames[pos:pos + 3])
    cut = len(frames[0]) * 2 + 500
    parts, got = read_repeats(decoder, data, room=1 << 20, n=cut)
    assert len(parts) == 32 and [p.packet_id for p in got] == [18, 19]
    room = decoder.room
    room[:] = data[cut:]
    del room
    assert [p.packet_id for p in decoder.filled(len(data) - cut)] == [20]
    # ...and the next read offers three pairs: the two it filled and one.
    parts, got = read_repeats(decoder, b"".join(frames[20:]), room=1 << 20)
    assert len(parts) == 6 and [p.packet_id for p in got] == [21, 22, 23]


@pytest.mark.parametrize("cut", ["header", "topic", "payload size"])
def test_a_frame_that_breaks_a_run_inside_a_read_is_decoded_as_usual(cut):
    frames, decoder = alike_frames(12)
    for pos in (2, 3):  # one pair, then two: four next
        read_repeats(decoder, b"".join(frames[pos:pos + 2]), room=1 << 20)
    body = random.Random(99).randbytes(20_000)
    odd = {"header": frame(0xC0) + publish_frame("dev/1/raw", body, 1, 50),  # a PINGREQ first
           "topic": publish_frame("dev/2/raw", body, 1, 50),
           "payload size": publish_frame("dev/1/raw", body[:-1], 1, 50)}[cut]
    data = frames[5] + odd + frames[6] + frames[7]
    parts, got = read_repeats(decoder, data, room=1 << 20, n=len(data) - 100)
    assert len(parts) == 8
    got += decode_all(data[len(data) - 100:], decoder)
    expected = [6] + ([None, 50] if cut == "header" else [50]) + [7, 8]
    assert [getattr(p, "packet_id", None) for p in got] == expected
    assert decoder.buffered == 0 and decoder.room is None


def test_a_client_throttled_after_the_first_frame_of_a_read_keeps_the_rest_in_order():
    frames, decoder = alike_frames(10)
    read_repeats(decoder, frames[2], room=1 << 20)            # one pair
    read_repeats(decoder, b"".join(frames[3:5]), room=1 << 20)  # two: four next
    parts = decoder.repeat_buffers(1 << 20)
    data = b"".join(frames[5:7]) + frames[7][:1000]
    scatter(parts, data)
    got = decoder.repeated(parts, len(data))
    assert len(parts) == 8 and isinstance(got, types.GeneratorType)
    assert next(got).packet_id == 6
    got.close()  # throttled: the second frame and the start of the third wait
    assert decoder.buffered == len(data) - len(frames[5])
    out = decode_all(frames[7][1000:] + b"".join(frames[8:]), decoder)
    assert [p.packet_id for p in out] == [7, 8, 9, 10]
    assert decoder.buffered == 0 and decoder.room is None


_shapes = st.sampled_from([("a/1", 16_384, 0), ("a/1", 16_384, 1), ("a/2", 16_384, 0),
                           ("a/1", 20_000, 2), ("a/1", 16_385, 0)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
           st.tuples(_shapes, st.integers(1, 65535), st.booleans(), st.booleans()),
           any_packet), min_size=1, max_size=12),
       st.lists(st.integers(1, 140_000), min_size=1, max_size=5),
       st.sets(st.integers(0, 60), max_size=4), st.sets(st.integers(0, 60), max_size=4))
def test_hypothesis_runs_of_alike_large_packets_read_any_way_give_the_same_packets(
        items, sizes, keeps, halts):
    # Mostly a few shapes of large PUBLISH (so that runs of alike ones are common), some
    # with the DUP or retain flag, between any other packets.
    packets = []
    for item in items:
        if isinstance(item, tuple):
            (topic, size, qos), pid, retain, dup = item
            packets.append(Publish(topic, random.Random(pid).randbytes(size), qos, retain,
                                   dup and qos > 0, pid if qos else None))
        else:
            packets.append(item)
    stream = b"".join(
        publish_frame(p.topic, p.payload, p.qos, p.packet_id or 0, p.retain, p.dup)
        if type(p) is Publish else encode(p) for p in packets)
    decoder = Decoder(max_packet_size=1 << 20)
    assert same(read_like_the_transport(decoder, stream, sizes, keeps, halts), packets)
