"""The MQTT 5.0 codec: every packet and property, every decoder rule, any split of the input.

The frames come from the independent encoder in tests/mqttraw5.py (written from the OASIS
MQTT 5.0 specification, never from the codec), are decoded with the broker's Decoder and
compared field by field with what the specification says they hold; the broker's own encoder
(encode5) is checked the other way, by mqttraw5's strict parser. The expected reason of every
refusal (Malformed Packet or Protocol Error) is the specification's.
"""

import random
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqttraw
import mqttraw5 as m5
from mqtt.test_codec import (
    _decode_anything, decode_all, feed_in_pieces, mutate, packet_ids, read_large_way,
    read_like_the_transport, read_repeat, same, short_bytes, topic_filters, topic_names,
)
from edgebroker.errors import (
    MALFORMED_PACKET, PACKET_TOO_LARGE, PROTOCOL_ERROR, TOPIC_ALIAS_INVALID, TOPIC_NAME_INVALID,
    UNSUPPORTED_PROTOCOL_VERSION, ProtocolError,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode5 import encode5
from edgebroker.mqtt.packets import (
    Auth, Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec,
    Pubrel, Suback, Subscribe, Unsuback, Unsubscribe, Will,
)
from edgebroker.mqtt.stream import LARGE_FRAME, Decoder, decode_one

V5, V311 = P.PROTOCOL_5, P.PROTOCOL_311
ACKS = {m5.PUBACK: Puback, m5.PUBREC: Pubrec, m5.PUBREL: Pubrel, m5.PUBCOMP: Pubcomp}
ACK_BUILDERS = {m5.PUBACK: m5.puback5, m5.PUBREC: m5.pubrec5, m5.PUBREL: m5.pubrel5,
                m5.PUBCOMP: m5.pubcomp5}
METHOD = (m5.AUTH_METHOD, "SCRAM-SHA-256")

# ----------------------------------------------------------------------------- helpers


def decoder_for(data: bytes, **kw) -> Decoder:
    """A server's decoder for a CONNECT (it starts with 3.1.1 rules), else a 5.0 one."""
    return Decoder(**kw) if data[0] == 0x10 else Decoder(protocol=V5, **kw)


def dec(data: bytes, **kw) -> list:
    return decode_all(data, decoder_for(data, **kw))


def raises5(data: bytes, reason: int, rule: str | None = None, decoder=None) -> ProtocolError:
    """Decoding ``data`` (whole, then byte by byte) refuses it with ``reason`` (and ``rule``)."""
    errors = []
    for step in (len(data), 1):
        d = decoder() if decoder else decoder_for(data)
        with pytest.raises(ProtocolError) as info:
            for i in range(0, len(data), step):
                list(d.feed(data[i:i + step]))
        errors.append(info.value)
    err = errors[0]
    assert err.reason == reason, f"{err} (reason {err.reason:#04x}, expected {reason:#04x})"
    if rule is not None:
        assert err.rule == rule, str(err)
    assert str(err) and str(errors[1]) == str(err)
    return err


def broker_props(items) -> dict | None:
    """The properties the decoder gives for mqttraw5 ``items`` (a dict or a list of pairs)."""
    out: dict = {}
    for ident, value in m5._items(items or ()):
        if ident == m5.USER_PROPERTY:
            out.setdefault(ident, []).append(tuple(value))
        elif ident == m5.SUBSCRIPTION_ID and isinstance(items, dict) and isinstance(
                items[ident], list):
            out.setdefault(ident, []).append(value)
        else:
            out[ident] = value
    return out or None


def plain_of(x) -> tuple:
    """A broker packet object as the fields mqttraw5's parser gives."""
    t = x.type
    props = getattr(x, "properties", None) or {}
    if t == P.CONNECT:
        will = x.will and (x.will.topic, bytes(x.will.payload), x.will.qos, x.will.retain,
                           x.will.properties or {})
        return (t, x.protocol_level, x.client_id, x.clean_session, x.keepalive, props, will,
                x.username, x.password)
    if t == P.CONNACK:
        return t, x.session_present, x.return_code, props
    if t == P.PUBLISH:
        return t, x.topic, x.packet_id, props, bytes(x.payload), x.qos, x.retain, x.dup
    if t in ACKS:
        return t, x.packet_id, x.reason_code, props
    if t in (P.SUBSCRIBE, P.UNSUBSCRIBE):
        return t, x.packet_id, props, list(x.topics)
    if t == P.SUBACK:
        return t, x.packet_id, props, list(x.return_codes)
    if t == P.UNSUBACK:
        return t, x.packet_id, props, list(x.reason_codes)
    if t in (P.DISCONNECT, P.AUTH):
        return t, x.reason_code, props
    return (t,)


def plain(p: m5.Packet5) -> tuple:
    """A Packet5 as plain fields, comparable with plain_of."""
    t = p.type
    props = {k: ([tuple(v) for v in val] if k == m5.USER_PROPERTY else val)
             for k, val in p.properties.items()}
    if t == m5.CONNECT:
        will = p.will and (*p.will[:4], {k: ([tuple(v) for v in val] if k == m5.USER_PROPERTY
                                              else val) for k, val in p.will[4].items()})
        return (t, p.level, p.client_id, p.clean_start, p.keepalive, props, will, p.username,
                p.password)
    if t == m5.CONNACK:
        return t, p.session_present, p.reason, props
    if t == m5.PUBLISH:
        return t, p.topic, p.packet_id, props, p.payload, p.qos, p.retain, p.dup
    if t in ACKS:
        return t, p.packet_id, p.reason, props
    if t == m5.SUBSCRIBE:
        return t, p.packet_id, props, p.topics
    if t == m5.UNSUBSCRIBE:
        return t, p.packet_id, props, p.filters
    if t in (m5.SUBACK, m5.UNSUBACK):
        return t, p.packet_id, props, p.codes
    if t in (m5.DISCONNECT, m5.AUTH):
        return t, p.reason, props
    return (t,)


def check_round_trip(data: bytes, expected) -> None:
    """mqttraw5's ``data`` decodes to ``expected`` (whole and byte by byte), and the broker's
    encoding of ``expected`` reads back the same, with mqttraw5's parser and with the Decoder."""
    assert same(dec(data), [expected])
    assert same(feed_in_pieces(data, range(1, len(data)), decoder_for(data)), [expected])
    encoded = encode5(expected)
    assert plain(m5.parse(encoded)) == plain_of(expected)
    assert same(dec(encoded), [expected])


# ----------------------------------------------------------------------------- round trips

U = m5.USER_PROPERTY
PUBLISH_PROPS = {m5.PAYLOAD_FORMAT: 1, m5.MESSAGE_EXPIRY: 3600, m5.CONTENT_TYPE: "text/plain",
                 m5.RESPONSE_TOPIC: "reply/to/me", m5.CORRELATION_DATA: b"\x00\x01corr",
                 U: [("a", "1"), ("a", "2"), ("ü", "€")]}
CONNECT_PROPS = {m5.SESSION_EXPIRY: 0xFFFFFFFF, m5.RECEIVE_MAXIMUM: 10,
                 m5.MAXIMUM_PACKET_SIZE: 1024, m5.TOPIC_ALIAS_MAXIMUM: 5,
                 m5.REQUEST_RESPONSE_INFO: 1, m5.REQUEST_PROBLEM_INFO: 0, U: [("k", "v")],
                 m5.AUTH_METHOD: "SCRAM-SHA-256", m5.AUTH_DATA: b"n,,n=user,r=abc"}
CONNACK_PROPS = {m5.SESSION_EXPIRY: 60, m5.RECEIVE_MAXIMUM: 100, m5.MAXIMUM_QOS: 1,
                 m5.RETAIN_AVAILABLE: 0, m5.MAXIMUM_PACKET_SIZE: 65536,
                 m5.ASSIGNED_CLIENT_ID: "auto-1", m5.TOPIC_ALIAS_MAXIMUM: 10,
                 m5.REASON_STRING: "welcome", U: [("x", "y")], m5.WILDCARD_SUB_AVAILABLE: 1,
                 m5.SUB_ID_AVAILABLE: 0, m5.SHARED_SUB_AVAILABLE: 1,
                 m5.SERVER_KEEP_ALIVE: 30, m5.RESPONSE_INFO: "resp/", m5.SERVER_REFERENCE: "b:1",
                 m5.AUTH_METHOD: "SCRAM-SHA-256", m5.AUTH_DATA: b"v=xyz"}
WILL_PROPS = {m5.WILL_DELAY: 30, **PUBLISH_PROPS}
ACK_PROPS = {m5.REASON_STRING: "why", U: [("k", "v")]}


def _rep():
    bp = broker_props
    out = [
        (m5.connect5("c5"), Connect("c5", True, 60, protocol_level=V5)),
        (m5.connect5("", clean_start=False, keepalive=0), Connect("", False, 0, protocol_level=V5)),
        (m5.connect5("c5", props=CONNECT_PROPS),
         Connect("c5", True, 60, properties=bp(CONNECT_PROPS), protocol_level=V5)),
        (m5.connect5("c5", will=("last/will", b"gone", 2, True, WILL_PROPS), username="ü-user",
                     password=b"\x00pw", keepalive=65535),
         Connect("c5", True, 65535, Will("last/will", b"gone", 2, True, bp(WILL_PROPS)),
                 "ü-user", b"\x00pw", protocol_level=V5)),
        (m5.connect5("c5", will=("w", b"", 0, False)),
         Connect("c5", True, 60, Will("w", b"", 0, False), protocol_level=V5)),
        # 5.0 allows a password without a user name (section 3.1.2.9)
        (m5.connect5("c5", password=b"secret"),
         Connect("c5", True, 60, password=b"secret", protocol_level=V5)),
        (m5.connack5(), Connack(False, 0)),
        (m5.connack5(True, 0, CONNACK_PROPS), Connack(True, 0, bp(CONNACK_PROPS))),
        (m5.connack5(False, 0x86, {m5.REASON_STRING: "bad password"}),
         Connack(False, 0x86, {m5.REASON_STRING: "bad password"})),
        (m5.publish5("t"), Publish("t")),
        (m5.publish5("a/b", b"\x00\xff", 1, packet_id=65535, props=PUBLISH_PROPS),
         Publish("a/b", b"\x00\xff", 1, False, False, 65535, bp(PUBLISH_PROPS))),
        (m5.publish5("ü/€/𝄞", b"x", 2, retain=True, dup=True, packet_id=7,
                     props={m5.SUBSCRIPTION_ID: [1, 268_435_455], m5.TOPIC_ALIAS: 3}),
         Publish("ü/€/𝄞", b"x", 2, True, True, 7,
                 {m5.SUBSCRIPTION_ID: [1, 268_435_455], m5.TOPIC_ALIAS: 3})),
        # an empty topic with a Topic Alias (section 3.3.2.3.4)
        (m5.publish5("", b"aliased", 1, packet_id=2, props={m5.TOPIC_ALIAS: 1}),
         Publish("", b"aliased", 1, False, False, 2, {m5.TOPIC_ALIAS: 1})),
        (m5.subscribe5(1, [("a/b", 0)]), Subscribe(1, [("a/b", 0)])),
        (m5.subscribe5(65535, [("#", 2 | m5.NO_LOCAL | m5.RETAIN_AS_PUBLISHED
                                | m5.retain_handling(2)), ("a/+/c", 1 | m5.retain_handling(1)),
                               ("$share/g/x", 1 | m5.RETAIN_AS_PUBLISHED)],
                       props={m5.SUBSCRIPTION_ID: 268_435_455, U: [("k", "v")]}),
         Subscribe(65535, [("#", 0x2E), ("a/+/c", 0x11), ("$share/g/x", 0x09)],
                   {m5.SUBSCRIPTION_ID: 268_435_455, U: [("k", "v")]})),
        (m5.suback5(1, [0]), Suback(1, [0])),
        (m5.suback5(9, [0, 1, 2, 0x80, 0x9E, 0xA2], ACK_PROPS),
         Suback(9, [0, 1, 2, 0x80, 0x9E, 0xA2], bp(ACK_PROPS))),
        (m5.unsubscribe5(1, ["a"]), Unsubscribe(1, ["a"])),
        (m5.unsubscribe5(2, ["a/#", "+"], {U: [("k", "v")]}),
         Unsubscribe(2, ["a/#", "+"], {U: [("k", "v")]})),
        (m5.unsuback5(5, [0]), Unsuback(5, [0])),
        (m5.unsuback5(5, [0x11, 0x87], ACK_PROPS), Unsuback(5, [0x11, 0x87], bp(ACK_PROPS))),
        (m5.pingreq(), Pingreq()), (m5.pingresp(), Pingresp()),
        (m5.disconnect5(), Disconnect()),
        (m5.disconnect5(0x04), Disconnect(0x04)),
        (m5.disconnect5(0x8E, {m5.SESSION_EXPIRY: 0, m5.REASON_STRING: "taken over",
                               m5.SERVER_REFERENCE: "other:1883", U: [("k", "v")]}),
         Disconnect(0x8E, {m5.SESSION_EXPIRY: 0, m5.REASON_STRING: "taken over",
                           m5.SERVER_REFERENCE: "other:1883", U: [("k", "v")]})),
        (m5.auth5(), Auth()),
        (m5.auth5(0x18, [METHOD, (m5.AUTH_DATA, b"r=abc")]),
         Auth(0x18, {m5.AUTH_METHOD: "SCRAM-SHA-256", m5.AUTH_DATA: b"r=abc"})),
        (m5.auth5(0x19, [METHOD, (m5.REASON_STRING, "again"), (U, ("k", "v"))]),
         Auth(0x19, {m5.AUTH_METHOD: "SCRAM-SHA-256", m5.REASON_STRING: "again",
                     U: [("k", "v")]})),
    ]
    for ptype, cls in ACKS.items():
        build = ACK_BUILDERS[ptype]
        code, error = (0x92, 0x92) if ptype in (m5.PUBREL, m5.PUBCOMP) else (0x10, 0x80)
        out += [(build(1), cls(1)),                                   # remaining length 2
                (build(2, code), cls(2, code)),                       # 3: a reason code alone
                (build(3, error, {}), cls(3, error)),                 # 4: empty properties
                (build(65535, 0, ACK_PROPS), cls(65535, 0, bp(ACK_PROPS)))]
    return out


REPRESENTATIVE5 = _rep()


def test_representative_list_covers_every_type():
    assert {x.type for _, x in REPRESENTATIVE5} == set(P.NAMES)


@pytest.mark.parametrize("data, expected", REPRESENTATIVE5, ids=lambda v: repr(v)[:70])
def test_round_trip(data, expected):
    check_round_trip(data, expected)


@pytest.mark.parametrize("data, expected", REPRESENTATIVE5, ids=lambda v: repr(v)[:70])
def test_decode_one_takes_exactly_one_frame(data, expected):
    protocol = 0 if data[0] == 0x10 else V5
    assert same([decode_one(data, protocol)], [expected])
    for bad in (data + b"\x00", data + m5.pingreq(), data[:-1]):
        with pytest.raises(ProtocolError) as info:
            decode_one(bad, protocol)
        assert info.value.reason == MALFORMED_PACKET


def test_all_packets_in_one_stream_in_random_splits():
    """After a 5.0 CONNECT, everything else in the same stream, cut anywhere."""
    stream = b"".join(d for d, _ in REPRESENTATIVE5)
    expected = [x for _, x in REPRESENTATIVE5]
    rng = random.Random(5)
    for _ in range(40):
        cuts = rng.sample(range(1, len(stream)), rng.randint(1, 60))
        assert same(feed_in_pieces(stream, cuts), expected)
    assert same(feed_in_pieces(stream, range(1, len(stream))), expected)


def test_short_acknowledgement_forms_mean_success_and_no_properties():
    for ptype, cls in ACKS.items():
        build = ACK_BUILDERS[ptype]
        for data in (build(7), build(7, 0), build(7, 0, {})):
            assert same(dec(data), [cls(7)])
    for build, cls in ((m5.disconnect5, Disconnect), (m5.auth5, Auth)):
        assert same(dec(build()), [cls()])
    assert same(dec(m5.disconnect5(0)), [Disconnect()])
    assert same(dec(m5.disconnect5(0, {})), [Disconnect()])


def test_the_broker_encodes_success_acknowledgements_in_their_short_forms():
    for ptype, cls in ACKS.items():
        assert encode5(cls(7)) == ACK_BUILDERS[ptype](7)
    assert encode5(Disconnect()) == m5.disconnect5() and encode5(Auth()) == m5.auth5()
    assert encode5(Puback(7, 0x10)) == m5.puback5(7, 0x10)       # a code and no properties
    assert encode5(Connack(False, 0)) == m5.connack5()           # never short in 5.0


# ----------------------------------------------------------------------------- properties

SAMPLE = {m5.BYTE: 1, m5.U16: 0x1234, m5.U32: 0x89ABCDEF, m5.VARINT: 268_435_455,
          m5.STRING: "ü/€ text", m5.BINARY: b"\x00\xff bin", m5.PAIR: ("name ü", "value €")}
WHERES = [m5.CONNECT, m5.WILL, m5.CONNACK, m5.PUBLISH, *ACKS, m5.SUBSCRIBE, m5.SUBACK,
          m5.UNSUBSCRIBE, m5.UNSUBACK, m5.DISCONNECT, m5.AUTH]


def where_id(where) -> str:
    return where if where == m5.WILL else m5.NAMES[where]


def with_props(where, items: list, expected_props="same") -> tuple:
    """A packet of kind ``where`` carrying the property list ``items``: (mqttraw5 bytes, the
    packet the decoder gives). AUTH always gets an Authentication Method first."""
    ids = [i for i, _ in items]
    if (where == m5.AUTH or where == m5.CONNECT and m5.AUTH_DATA in ids) and (
            m5.AUTH_METHOD not in ids):
        items = [METHOD] + items
    exp = broker_props(items) if expected_props == "same" else expected_props
    if where == m5.SUBSCRIBE and exp and m5.SUBSCRIPTION_ID in exp and isinstance(
            exp[m5.SUBSCRIPTION_ID], list):
        exp[m5.SUBSCRIPTION_ID] = exp[m5.SUBSCRIPTION_ID][0]
    if where == m5.PUBLISH and exp and m5.SUBSCRIPTION_ID in exp and not isinstance(
            exp[m5.SUBSCRIPTION_ID], list):
        exp[m5.SUBSCRIPTION_ID] = [exp[m5.SUBSCRIPTION_ID]]
    if where == m5.CONNECT:
        return m5.connect5("cid", props=items), Connect("cid", properties=exp, protocol_level=V5)
    if where == m5.WILL:
        return (m5.connect5("cid", will=("w/t", b"bye", 1, True, items)),
                Connect("cid", will=Will("w/t", b"bye", 1, True, exp), protocol_level=V5))
    if where == m5.CONNACK:
        return m5.connack5(True, 0, items), Connack(True, 0, exp)
    if where == m5.PUBLISH:
        return (m5.publish5("a/b", b"data", 1, packet_id=9, props=items),
                Publish("a/b", b"data", 1, False, False, 9, exp))
    if where in ACKS:
        return ACK_BUILDERS[where](9, 0, items), ACKS[where](9, 0, exp)
    if where == m5.SUBSCRIBE:
        return m5.subscribe5(9, [("a/+", 1)], items), Subscribe(9, [("a/+", 1)], exp)
    if where == m5.SUBACK:
        return m5.suback5(9, [1], items), Suback(9, [1], exp)
    if where == m5.UNSUBSCRIBE:
        return m5.unsubscribe5(9, ["a/#"], items), Unsubscribe(9, ["a/#"], exp)
    if where == m5.UNSUBACK:
        return m5.unsuback5(9, [0x11], items), Unsuback(9, [0x11], exp)
    if where == m5.DISCONNECT:
        return m5.disconnect5(0x80, items), Disconnect(0x80, exp)
    return m5.auth5(0x18, items), Auth(0x18, exp)


ALLOWED = [(i, w) for i, (_, _, ws) in m5.PROPERTIES.items() for w in ws]
NOT_ALLOWED = [(i, w) for i, (_, _, ws) in m5.PROPERTIES.items() for w in WHERES
               if w not in ws]


def pair_id(v) -> str:
    return f"{v:#04x}" if isinstance(v, int) else str(v)


@pytest.mark.parametrize("ident, where", ALLOWED,
                         ids=[f"{m5.PROPERTIES[i][0]}-{where_id(w)}" for i, w in ALLOWED])
def test_every_property_round_trips_in_every_packet_it_may_appear_in(ident, where):
    value = SAMPLE[m5.PROPERTIES[ident][1]]
    data, expected = with_props(where, [(ident, value)])
    check_round_trip(data, expected)


@pytest.mark.parametrize("ident, where", NOT_ALLOWED,
                         ids=[f"{m5.PROPERTIES[i][0]}-{where_id(w)}" for i, w in NOT_ALLOWED])
def test_a_property_the_packet_does_not_carry_is_malformed(ident, where):
    data, _ = with_props(where, [(ident, SAMPLE[m5.PROPERTIES[ident][1]])], None)
    raises5(data, MALFORMED_PACKET, "MQTT-2.2.2.2")


@pytest.mark.parametrize("where", WHERES, ids=where_id)
def test_every_property_a_packet_may_carry_at_once(where):
    items = [(i, SAMPLE[kind]) for i, (_, kind, ws) in m5.PROPERTIES.items() if where in ws]
    items += [(m5.USER_PROPERTY, ("second", "pair"))]
    if where == m5.PUBLISH:
        items += [(m5.SUBSCRIPTION_ID, 1)]
        exp = broker_props(items)
        exp[m5.SUBSCRIPTION_ID] = [268_435_455, 1]
        data, expected = with_props(where, items, exp)
    else:
        data, expected = with_props(where, items)
    check_round_trip(data, expected)


UNKNOWN_IDS = [i for i in range(0x80) if i not in m5.PROPERTIES]


@pytest.mark.parametrize("where", WHERES, ids=where_id)
def test_unknown_property_identifiers_are_malformed(where):
    for ident in UNKNOWN_IDS:
        data = _with_section(where, m5.props_raw(bytes((ident, 0, 0, 0, 0))))
        raises5(data, MALFORMED_PACKET, "MQTT-2.2.2.2")
    # Identifiers are variable byte integers: 128 (two bytes) is unknown too.
    raises5(_with_section(where, m5.props_raw(b"\x80\x01\x00")), MALFORMED_PACKET,
            "MQTT-2.2.2.2")


def _with_section(where, section: bytes) -> bytes:
    """A packet of kind ``where`` whose property section is ``section`` as it is."""
    if where == m5.CONNECT:
        return m5.connect5("cid", props=section)
    if where == m5.WILL:
        return m5.connect5("cid", will=("w/t", b"bye", 1, True, section))
    if where == m5.CONNACK:
        return m5.connack5(True, 0, section)
    if where == m5.PUBLISH:
        return m5.publish5("a/b", b"", 1, packet_id=9, props=section)
    if where in ACKS:
        return ACK_BUILDERS[where](9, 0, section)
    if where == m5.SUBSCRIBE:
        return m5.subscribe5(9, [("a/+", 1)], section)
    if where == m5.SUBACK:
        return m5.suback5(9, [1], section)
    if where == m5.UNSUBSCRIBE:
        return m5.unsubscribe5(9, ["a/#"], section)
    if where == m5.UNSUBACK:
        return m5.unsuback5(9, [0x11], section)
    if where == m5.DISCONNECT:
        return m5.disconnect5(0x80, section)
    return m5.auth5(0x18, section)


REPEATABLE = [(i, w) for i, w in ALLOWED if m5.repeatable(i, w)]
ONCE = [(i, w) for i, w in ALLOWED if not m5.repeatable(i, w)]


@pytest.mark.parametrize("ident, where", ONCE,
                         ids=[f"{m5.PROPERTIES[i][0]}-{where_id(w)}" for i, w in ONCE])
def test_a_property_given_twice_is_a_protocol_error(ident, where):
    value = SAMPLE[m5.PROPERTIES[ident][1]]
    data, _ = with_props(where, [(ident, value), (m5.USER_PROPERTY, ("k", "v")), (ident, value)],
                         None)
    raises5(data, PROTOCOL_ERROR)


@pytest.mark.parametrize("ident, where", REPEATABLE,
                         ids=[f"{m5.PROPERTIES[i][0]}-{where_id(w)}" for i, w in REPEATABLE])
def test_user_properties_and_publish_subscription_identifiers_may_repeat(ident, where):
    values = ([("k", "1"), ("k", "1"), ("j", "2")] if ident == m5.USER_PROPERTY
              else [5, 1, 5])
    exp = {ident: values}
    if where == m5.AUTH:
        exp = {m5.AUTH_METHOD: METHOD[1], **exp}
    data, expected = with_props(where, [(ident, v) for v in values], exp)
    check_round_trip(data, expected)


FLAGS = [(i, w) for i, w in ALLOWED if m5.PROPERTIES[i][1] == m5.BYTE]


@pytest.mark.parametrize("ident, where", FLAGS,
                         ids=[f"{m5.PROPERTIES[i][0]}-{where_id(w)}" for i, w in FLAGS])
def test_byte_properties_are_0_or_1(ident, where):
    for value in (0, 1):
        data, expected = with_props(where, [(ident, value)])
        assert same(dec(data), [expected])
    for value in (2, 0x80, 0xFF):
        raises5(with_props(where, [(ident, value)], None)[0], PROTOCOL_ERROR)


ZERO_REFUSED = [(m5.RECEIVE_MAXIMUM, m5.CONNECT), (m5.RECEIVE_MAXIMUM, m5.CONNACK),
                (m5.MAXIMUM_PACKET_SIZE, m5.CONNECT), (m5.MAXIMUM_PACKET_SIZE, m5.CONNACK),
                (m5.TOPIC_ALIAS, m5.PUBLISH), (m5.SUBSCRIPTION_ID, m5.SUBSCRIBE),
                (m5.SUBSCRIPTION_ID, m5.PUBLISH)]


@pytest.mark.parametrize("ident, where", ZERO_REFUSED,
                         ids=[f"{m5.PROPERTIES[i][0]}-{where_id(w)}" for i, w in ZERO_REFUSED])
def test_a_zero_where_zero_has_no_meaning_is_a_protocol_error(ident, where):
    """Topic Alias 0 is answered Topic Alias invalid (0x94), the others Protocol Error."""
    reason = TOPIC_ALIAS_INVALID if ident == m5.TOPIC_ALIAS else PROTOCOL_ERROR
    raises5(with_props(where, [(ident, 0)], None)[0], reason)
    data, expected = with_props(where, [(ident, 1)])
    assert same(dec(data), [expected])


@pytest.mark.parametrize("ident, where", [
    (m5.TOPIC_ALIAS_MAXIMUM, m5.CONNECT), (m5.SESSION_EXPIRY, m5.CONNECT),
    (m5.SERVER_KEEP_ALIVE, m5.CONNACK), (m5.MESSAGE_EXPIRY, m5.PUBLISH),
    (m5.WILL_DELAY, m5.WILL), (m5.SESSION_EXPIRY, m5.DISCONNECT)])
def test_other_integer_properties_may_be_zero(ident, where):
    data, expected = with_props(where, [(ident, 0)])
    check_round_trip(data, expected)


def test_variable_byte_integers_take_at_most_four_bytes():
    # the property length
    raises5(m5.publish5("t", props=b"\x80\x80\x80\x80\x01"), MALFORMED_PACKET, "MQTT-1.5.5-1")
    raises5(m5.disconnect5(0x80, b"\xff\xff\xff\xff\x7f"), MALFORMED_PACKET, "MQTT-1.5.5-1")
    # a Subscription Identifier
    sub_id = bytes((m5.SUBSCRIPTION_ID,)) + b"\xff\xff\xff\xff\x01"
    raises5(m5.subscribe5(1, ["a"], m5.props_raw(sub_id)), MALFORMED_PACKET, "MQTT-1.5.5-1")
    # the largest four-byte value is fine
    data, expected = with_props(m5.SUBSCRIBE, [(m5.SUBSCRIPTION_ID, 268_435_455)])
    assert same(dec(data), [expected])


def test_variable_byte_integers_use_the_fewest_bytes():
    """[MQTT-1.5.5-1] "The encoded value MUST use the minimum number of bytes necessary":
    an overlong property length, identifier or Subscription Identifier is malformed (as
    Mosquitto reads them). The remaining length keeps the 3.1.1 decoder's leniency."""
    raises5(m5.publish5("t", props=b"\x80\x00"), MALFORMED_PACKET, "MQTT-1.5.5-1")
    raises5(m5.publish5("t", props=m5.props_raw(b"\x81\x00\x01")), MALFORMED_PACKET,
            "MQTT-1.5.5-1")  # Payload Format Indicator as two bytes
    sub_id = bytes((m5.SUBSCRIPTION_ID,)) + b"\x81\x80\x00"
    raises5(m5.subscribe5(1, ["a"], m5.props_raw(sub_id)), MALFORMED_PACKET, "MQTT-1.5.5-1")
    long_rl = mqttraw.frame(0x40, b"\x82\x00", b"\x00\x07")
    assert same(dec(long_rl), [Puback(7)])


@pytest.mark.parametrize("where", WHERES, ids=where_id)
def test_a_property_section_running_past_the_end_is_malformed(where):
    for section in (m5.props_raw(b"", length=200),
                    m5.props_raw(bytes((m5.REASON_STRING,)) + b"\x00\x09abc"),
                    m5.props_raw(b"\x26\x00\x01k"),          # a pair with no value
                    m5.props_raw(b"\x02\x00\x00", length=3),  # a four byte integer cut short
                    b"\x80"):                                  # half a length
        data = _with_section(where, section)
        raises5(data, MALFORMED_PACKET)


def test_a_packet_that_ends_before_its_property_length_is_malformed():
    for data in (m5.packet(m5.SUBSCRIBE, 2, m5.u16(1)), m5.packet(m5.SUBACK, 0, m5.u16(1)),
                 m5.packet(m5.UNSUBACK, 0, m5.u16(1)), m5.packet(m5.UNSUBSCRIBE, 2, m5.u16(1)),
                 m5.packet(m5.PUBLISH, 2, m5.mqtt_str("t") + m5.u16(1)),
                 m5.packet(m5.PUBLISH, 0, m5.mqtt_str("t")),
                 m5.packet(m5.CONNACK, 0, b"\x00\x00")):
        raises5(data, MALFORMED_PACKET)


BAD_TEXT = [b"a\xffb", b"\xed\xa0\x80", b"\xc0\xaf", b"a\x00b"]


@pytest.mark.parametrize("raw", BAD_TEXT, ids=repr)
@pytest.mark.parametrize("ident, where", [
    (m5.CONTENT_TYPE, m5.PUBLISH), (m5.RESPONSE_TOPIC, m5.WILL), (m5.REASON_STRING, m5.PUBACK),
    (m5.AUTH_METHOD, m5.CONNECT), (m5.ASSIGNED_CLIENT_ID, m5.CONNACK),
    (m5.SERVER_REFERENCE, m5.DISCONNECT), (m5.REASON_STRING, m5.AUTH)])
def test_strings_in_properties_are_well_formed_utf8_without_u0000(ident, where, raw):
    section = m5.props_raw(m5.prop(ident, raw))
    if where == m5.AUTH:
        section = m5.props_raw(m5.prop(*METHOD) + m5.prop(ident, raw))
    err = raises5(_with_section(where, section), MALFORMED_PACKET)
    assert err.rule == ("MQTT-1.5.3-2" if b"\x00" in raw else "MQTT-1.5.3-1")


@pytest.mark.parametrize("raw", BAD_TEXT, ids=repr)
@pytest.mark.parametrize("side", ["name", "value"])
def test_user_property_names_and_values_are_checked_too(raw, side):
    pair = (raw, "v") if side == "name" else ("k", raw)
    for where in (m5.PUBLISH, m5.CONNECT, m5.SUBSCRIBE, m5.DISCONNECT):
        section = m5.props_raw(m5.prop(m5.USER_PROPERTY, ("ok", "ok"))
                               + m5.prop(m5.USER_PROPERTY, pair))
        raises5(_with_section(where, section), MALFORMED_PACKET)


def test_publishes_with_the_same_property_section_in_a_row_decode_alike():
    # The decoder remembers the last PUBLISH property section it decoded (mqtt/stream.py):
    # another one of the same bytes, on any connection, gets the same properties; one that
    # differs, even by a byte in a string it checks, is decoded (and refused) on its own.
    props = [(m5.CONTENT_TYPE, "text/plain"), (U, ("k", "1")), (U, ("k", "2"))]
    other = [(m5.CONTENT_TYPE, "text/plaiN"), (U, ("k", "1")), (U, ("k", "2"))]
    frames = [m5.publish5("a/b", b"%d" % i, 1, packet_id=i + 1, props=p)
              for i, p in enumerate([props, props, other, props])]
    want = [broker_props(p) for p in (props, props, other, props)]
    for decoder in (Decoder(protocol=V5), Decoder(protocol=V5)):
        got = decode_all(b"".join(frames), decoder)
        assert [g.properties for g in got] == want
        assert [g.payload for g in got] == [b"0", b"1", b"2", b"3"]
    bad = m5.publish5("a/b", b"x", 1, packet_id=5,
                      props=[(m5.CONTENT_TYPE, "text/pla\x00n"), (U, ("k", "1")), (U, ("k", "2"))])
    assert len(bad) == len(frames[0])          # a section of the same length
    raises5(frames[0] + bad, MALFORMED_PACKET, "MQTT-1.5.3-2")


def test_binary_properties_hold_any_bytes():
    data, expected = with_props(m5.PUBLISH, [(m5.CORRELATION_DATA, b"\x00\xff\xfe\x00")])
    check_round_trip(data, expected)


def test_authentication_data_needs_an_authentication_method():
    """3.1.2.11.10 and 3.15.2.2.3: Authentication Data without Authentication Method is a
    Protocol Error, in a CONNECT and in an AUTH."""
    raises5(m5.connect5("c", props={m5.AUTH_DATA: b"x"}), PROTOCOL_ERROR)
    raises5(m5.auth5(0x18, {m5.AUTH_DATA: b"x"}), PROTOCOL_ERROR)
    # a method alone is fine (its data may come later)
    data, expected = with_props(m5.CONNECT, [(m5.AUTH_METHOD, "m")])
    assert same(dec(data), [expected])


def test_an_auth_packet_needs_its_authentication_method():
    """3.15.2.2.2: "It is a Protocol Error to omit the Authentication Method". Only the short
    form the specification gives (remaining length 0: Success, no properties) has none."""
    raises5(m5.auth5(0x18, {m5.REASON_STRING: "no method"}), PROTOCOL_ERROR)
    raises5(m5.auth5(0x19, {}), PROTOCOL_ERROR)
    raises5(m5.auth5(0x18), PROTOCOL_ERROR)   # remaining length 1: no properties at all
    raises5(m5.auth5(0), PROTOCOL_ERROR)
    assert same(dec(m5.auth5()), [Auth()])


def test_a_response_topic_holds_no_wildcards():
    """[MQTT-3.3.2-14] "The Response Topic MUST NOT contain wildcard characters"."""
    for where in (m5.PUBLISH, m5.WILL):
        for topic in ("reply/+", "reply/#", "#"):
            raises5(with_props(where, [(m5.RESPONSE_TOPIC, topic)], None)[0], PROTOCOL_ERROR,
                    "MQTT-3.3.2-14")
        data, expected = with_props(where, [(m5.RESPONSE_TOPIC, "reply/$x")])
        assert same(dec(data), [expected])


# ----------------------------------------------------------------------------- reason codes


def with_reason(ptype: int, code: int) -> tuple:
    if ptype == m5.CONNACK:
        return m5.connack5(False, code), Connack(False, code)
    if ptype in ACKS:
        return ACK_BUILDERS[ptype](3, code), ACKS[ptype](3, code)
    if ptype == m5.SUBACK:
        return m5.suback5(3, [0, code]), Suback(3, [0, code])
    if ptype == m5.UNSUBACK:
        return m5.unsuback5(3, [code, 0]), Unsuback(3, [code, 0])
    if ptype == m5.DISCONNECT:
        return m5.disconnect5(code), Disconnect(code)
    return (m5.auth5(code, [METHOD]), Auth(code, {m5.AUTH_METHOD: METHOD[1]}))


@pytest.mark.parametrize("ptype", list(m5.REASON_CODES), ids=lambda t: m5.NAMES[t])
def test_each_packet_takes_only_its_own_reason_codes(ptype):
    allowed = m5.REASON_CODES[ptype]
    for code in range(256):
        data, expected = with_reason(ptype, code)
        if code in allowed:
            assert same(dec(data), [expected]), hex(code)
            assert plain(m5.parse(encode5(expected))) == plain_of(expected)
        else:
            raises5(data, PROTOCOL_ERROR)


def test_suback_and_unsuback_need_a_reason_code():
    for data in (m5.suback5(1, []), m5.unsuback5(1, []), m5.suback5(1, [], {U: [("k", "v")]})):
        with pytest.raises(ProtocolError):
            dec(data)
    # nor does the broker write one without (an Unsuback made the 3.1.1 way has none)
    for packet in (Unsuback(5), Unsuback(5, []), Suback(5, [])):
        with pytest.raises(ValueError, match="reason code per topic filter"):
            encode5(packet)


# ----------------------------------------------------------------------------- lengths

ACK_LENGTH_CASES = [
    (b"", MALFORMED_PACKET),             # no packet identifier
    (b"\x00", MALFORMED_PACKET),         # half of one
    (b"\x00\x00", MALFORMED_PACKET),     # identifier 0
    (b"\x00\x00\x00", MALFORMED_PACKET),
    (b"\x00\x07\x00\x00\x00", MALFORMED_PACKET),        # a byte after empty properties
    (b"\x00\x07\x00\x02\x1f\x00", MALFORMED_PACKET),    # a reason string cut short
    (b"\x00\x07\x00\x01", MALFORMED_PACKET),            # properties past the end
]


@pytest.mark.parametrize("ptype", list(ACKS), ids=lambda t: m5.NAMES[t])
@pytest.mark.parametrize("body, reason", ACK_LENGTH_CASES, ids=repr)
def test_acknowledgement_lengths(ptype, body, reason):
    raises5(m5.packet(ptype, 2 if ptype == m5.PUBREL else 0, body), reason)


def test_disconnect_and_auth_lengths():
    assert same(dec(m5.packet(m5.DISCONNECT, 0, b"")), [Disconnect()])
    assert same(dec(m5.packet(m5.DISCONNECT, 0, b"\x81")), [Disconnect(0x81)])
    assert same(dec(m5.packet(m5.DISCONNECT, 0, b"\x81\x00")), [Disconnect(0x81)])
    assert same(dec(m5.packet(m5.AUTH, 0, b"")), [Auth()])
    for ptype in (m5.DISCONNECT, m5.AUTH):
        raises5(m5.packet(ptype, 0, b"\x00\x00\x00"), MALFORMED_PACKET)  # byte after them
        raises5(m5.packet(ptype, 0, b"\x00\x05\x1f"), MALFORMED_PACKET)  # properties cut
    raises5(m5.packet(m5.AUTH, 0, b"\x18"), PROTOCOL_ERROR)  # no properties: no method


@pytest.mark.parametrize("flags", range(1, 16))
def test_auth_fixed_header_flags_are_0000(flags):
    raises5(m5.auth5(flags=flags), MALFORMED_PACKET, "MQTT-3.15.1-1")
    raises5(m5.disconnect5(flags=flags), MALFORMED_PACKET)


def test_auth_is_a_reserved_type_in_311():
    raises5(m5.auth5(), MALFORMED_PACKET, "MQTT-2.2.1", decoder=Decoder)


# ----------------------------------------------------------------------------- packets


def test_subscription_options():
    """3.8.3.1: QoS 3 and Retain Handling 3 are Protocol Errors, reserved bits 6-7 make the
    packet malformed [MQTT-3.8.3-5], No Local on a shared subscription is a Protocol Error
    [MQTT-3.8.3-4]."""
    for options in (3, 3 | m5.NO_LOCAL, 0x0F | m5.retain_handling(2)):
        raises5(m5.subscribe5(1, [("a", 0), ("b", options)]), PROTOCOL_ERROR)
    for options in (m5.retain_handling(3), 1 | m5.retain_handling(3)):
        raises5(m5.subscribe5(1, [("a", options)]), PROTOCOL_ERROR)
    for options in (0x40, 0x80, 0xC1, 0x41 | m5.NO_LOCAL):
        raises5(m5.subscribe5(1, [("a", options)]), MALFORMED_PACKET, "MQTT-3.8.3-5")
    raises5(m5.subscribe5(1, [("$share/g/a", 1 | m5.NO_LOCAL)]), PROTOCOL_ERROR, "MQTT-3.8.3-4")
    every = [(f"t/{o}", o) for o in range(0x40) if o & 3 != 3 and o >> 4 != 3]
    assert same(dec(m5.subscribe5(2, every)), [Subscribe(2, every)])


def test_subscribe_and_unsubscribe_need_a_topic_filter():
    """[MQTT-3.8.3-2], 3.10.3: no payload is a Protocol Error."""
    raises5(m5.subscribe5(1, []), PROTOCOL_ERROR)
    raises5(m5.subscribe5(1, [], {m5.SUBSCRIPTION_ID: 4}), PROTOCOL_ERROR)
    raises5(m5.unsubscribe5(1, []), PROTOCOL_ERROR)
    raises5(m5.unsubscribe5(1, [], {U: [("k", "v")]}), PROTOCOL_ERROR)
    # a filter with no options byte, and bad filters
    raises5(m5.packet(m5.SUBSCRIBE, 2, m5.u16(1) + b"\x00" + m5.mqtt_str("a")), MALFORMED_PACKET)
    for bad in ("a/#/b", "a+", ""):
        with pytest.raises(ProtocolError):
            dec(m5.subscribe5(1, [(bad, 0)]))
        with pytest.raises(ProtocolError):
            dec(m5.unsubscribe5(1, [bad]))


def test_publish_topic_rules():
    """3.3.2.3.4: an empty Topic Name without a Topic Alias is a Protocol Error; with one it
    is how an alias is used. Wildcards stay refused [MQTT-3.3.2-2]."""
    raises5(m5.publish5("", b"x"), PROTOCOL_ERROR)
    raises5(m5.publish5("", b"x", 1, props={U: [("k", "v")]}), PROTOCOL_ERROR)
    for alias in (1, 65535):
        assert same(dec(m5.publish5("", b"x", props={m5.TOPIC_ALIAS: alias})),
                    [Publish("", b"x", properties={m5.TOPIC_ALIAS: alias})])
    for topic in ("a/+", "#"):
        raises5(m5.publish5(topic, props={m5.TOPIC_ALIAS: 1}), TOPIC_NAME_INVALID)
    raises5(m5.publish5("a", b"", 1, packet_id=0), MALFORMED_PACKET, "MQTT-2.3.1-1")
    raises5(m5.publish5("a", flags=0x06), MALFORMED_PACKET, "MQTT-3.3.1-4")
    raises5(m5.publish5("a", flags=0x08), MALFORMED_PACKET, "MQTT-3.3.1-2")


def test_publish_payload_follows_the_properties():
    assert same(dec(m5.publish5("t", b"\x00\x26", props={})), [Publish("t", b"\x00\x26")])
    assert same(dec(m5.publish5("t", b"")), [Publish("t", b"")])


def test_connack_decoded_on_the_client_side():
    assert same(decode_all(m5.connack5(True, 0, CONNACK_PROPS), Decoder(protocol=V5)),
                [Connack(True, 0, broker_props(CONNACK_PROPS))])
    raises5(m5.packet(m5.CONNACK, 0, b"\x00\x00"), MALFORMED_PACKET)  # the 3.1.1 form
    raises5(m5.connack5(ack_flags=0x02), MALFORMED_PACKET, "MQTT-3.2.2-1")
    raises5(m5.connack5(ack_flags=0x81), MALFORMED_PACKET, "MQTT-3.2.2-1")
    raises5(m5.connack5(False, 0, {m5.WILL_DELAY: 1}), MALFORMED_PACKET, "MQTT-2.2.2.2")
    raises5(m5.packet(m5.CONNACK, 0, b"\x00\x00\x00\x00"), MALFORMED_PACKET)  # a byte more


def test_connack_refusing_a_connection_has_no_session_present():
    """[MQTT-3.2.2-6] a CONNACK with a non-zero reason code MUST have Session Present 0."""
    raises5(m5.connack5(True, 0x80), PROTOCOL_ERROR, "MQTT-3.2.2-6")
    assert same(dec(m5.connack5(False, 0x80)), [Connack(False, 0x80)])


V5_CONNECT_CASES = [
    # [MQTT-3.1.2-11] will QoS without the will flag, [MQTT-3.1.2-13] will retain without it,
    # [MQTT-3.1.2-12] will QoS 3 (5.0 numbers these rules apart from 3.1.1)
    (m5.connect5("c", flags_override=0x0A), "MQTT-3.1.2-11", MALFORMED_PACKET),
    (m5.connect5("c", flags_override=0x22), "MQTT-3.1.2-13", MALFORMED_PACKET),
    (m5.connect5("c", will=("w", b"x", 3)), "MQTT-3.1.2-12", MALFORMED_PACKET),
    (m5.connect5("c", flags_override=0x03), "MQTT-3.1.2-3", MALFORMED_PACKET),
    (m5.connect5("c", props=b"\x05\x11\x00"), "MQTT-2.2.3", MALFORMED_PACKET),
    (m5.connect5("c", will=("w/+", b"x")), None, TOPIC_NAME_INVALID),
    # user name and will flags set, neither field there
    (m5.connect5("c", flags_override=0x84), None, MALFORMED_PACKET),
    # level 5 is "MQTT" only
    (m5.connect5("c", proto_name=b"MQIsdp"), "MQTT-3.1.2-2", UNSUPPORTED_PROTOCOL_VERSION),
]


@pytest.mark.parametrize("data, rule, reason", V5_CONNECT_CASES, ids=repr)
def test_connect_rules_with_5_0_rule_ids(data, rule, reason):
    raises5(data, reason, rule)


def test_311_keeps_its_own_rule_ids_and_refuses_a_password_alone():
    for data, rule in ((mqttraw.connect("c", flags_override=0x0A), "MQTT-3.1.2-13"),
                       (mqttraw.connect("c", flags_override=0x22), "MQTT-3.1.2-15"),
                       (mqttraw.connect("c", will=("w", b"x", 3)), "MQTT-3.1.2-14"),
                       (mqttraw.connect("c", password=b"pw"), "MQTT-3.1.2-22")):
        raises5(data, MALFORMED_PACKET, rule)
    assert same(dec(m5.connect5("c", password=b"pw")),
                [Connect("c", password=b"pw", protocol_level=V5)])


def test_connect_with_every_field_and_both_property_sections_in_pieces():
    data = m5.connect5("cid", False, 30, CONNECT_PROPS, ("w/t", b"bye", 1, True, WILL_PROPS),
                       "user", b"pass")
    expected = Connect("cid", False, 30, Will("w/t", b"bye", 1, True, broker_props(WILL_PROPS)),
                       "user", b"pass", V5, properties=broker_props(CONNECT_PROPS))
    rng = random.Random(1)
    for _ in range(30):
        cuts = rng.sample(range(1, len(data)), rng.randint(1, 20))
        assert same(feed_in_pieces(data, cuts), [expected])


# ----------------------------------------------------------------------------- version switch


def test_a_311_connection_stays_311():
    publish_like_v5 = m5.publish5("t", b"abc")  # its property length reads as payload in 3.1.1
    stream = mqttraw.connect("c") + publish_like_v5 + mqttraw.puback(3)
    decoder = Decoder()
    got = decode_all(stream, decoder)
    assert same(got, [Connect("c"), Publish("t", b"\x00abc"), Puback(3)])
    assert decoder.protocol != V5
    raises5(mqttraw.connect("c") + m5.puback5(3, 0x10), MALFORMED_PACKET, decoder=Decoder)
    raises5(mqttraw.connect("c") + m5.auth5(), MALFORMED_PACKET, "MQTT-2.2.1", decoder=Decoder)
    # 3.1 too
    got = decode_all(mqttraw.connect_v31("c") + publish_like_v5, Decoder())
    assert same(got[1:], [Publish("t", b"\x00abc")])


def test_after_a_level_5_connect_the_same_feed_is_read_as_5_0():
    rest = [(m5.publish5("t", b"abc", 1, packet_id=4, props={U: [("k", "v")]}),
             Publish("t", b"abc", 1, False, False, 4, {U: [("k", "v")]})),
            (m5.puback5(3, 0x10), Puback(3, 0x10)),
            (m5.auth5(0x19, [METHOD]), Auth(0x19, {m5.AUTH_METHOD: METHOD[1]})),
            (m5.publish5("t", b"abc"), Publish("t", b"abc")),
            (m5.disconnect5(0x04), Disconnect(0x04))]
    stream = m5.connect5("c") + b"".join(d for d, _ in rest)
    expected = [Connect("c", protocol_level=V5)] + [x for _, x in rest]
    for cuts in ([], range(1, len(stream)), [5, 40, 41]):
        decoder = Decoder()
        assert same(feed_in_pieces(stream, cuts, decoder), expected)
        assert decoder.protocol == V5


def test_the_switch_comes_with_the_connect_not_before():
    """Bytes before the CONNECT is handed out are read with 3.1.1 rules; a consumer that
    stops after the CONNECT gets the rest read as 5.0."""
    decoder = Decoder()
    gen = decoder.feed(m5.connect5("c") + m5.puback5(3, 0x10))
    assert same([next(gen)], [Connect("c", protocol_level=V5)])
    gen.close()
    assert same(decode_all(b"", decoder), [Puback(3, 0x10)])


# ----------------------------------------------------------------------------- sizes


def test_max_packet_size_counts_the_properties():
    small = m5.publish5("t", b"x" * 10, props={U: [("k", "v" * 40)]})
    assert same(dec(small, max_packet_size=len(small)),
                [Publish("t", b"x" * 10, properties={U: [("k", "v" * 40)]})])
    err = raises5(small, PACKET_TOO_LARGE,
                  decoder=lambda: Decoder(max_packet_size=len(small) - 1, protocol=V5))
    assert err.rule == "max_packet_size"
    # checked before the body arrives
    decoder = Decoder(max_packet_size=100, protocol=V5)
    with pytest.raises(ProtocolError):
        list(decoder.feed(m5.publish5("t", b"x" * 1000)[:4]))


def large5(size: int, qos: int = 1, pid: int = 7, props=None, topic: str = "big/t"):
    """A large PUBLISH with properties, and the packet it is."""
    props = {U: [("k", "v")], m5.CONTENT_TYPE: "application/octet-stream"} if props is None \
        else props
    payload = random.Random(size + pid).randbytes(size)
    return (m5.publish5(topic, payload, qos, packet_id=pid if qos else None, props=props),
            Publish(topic, payload, qos, False, False, pid if qos else None, broker_props(props)))


def test_a_large_publish_with_properties_in_pieces_gets_a_payload_buffer_of_its_own():
    data, expected = large5(70_000)
    decoder = Decoder(protocol=V5)
    assert decode_all(data[:3000], decoder) == []
    assert decoder.room is not None and decoder.buffered == 3000
    assert decode_all(data[3000:50_000], decoder) == []
    got = decode_all(data[50_000:] + m5.pingreq(), decoder)
    assert same(got, [expected, Pingreq()])
    assert type(got[0].payload) is bytearray and decoder.room is None


def test_a_large_publish_split_anywhere_in_its_header_and_properties():
    props = {U: [("k", "v" * 300)], m5.RESPONSE_TOPIC: "r/t", m5.SUBSCRIPTION_ID: [5]}
    data, expected = large5(40_000, props=props)
    head = len(data) - 40_000
    for cut in range(1, head + 3):
        decoder = Decoder(protocol=V5)
        assert decode_all(data[:cut], decoder) == []
        if cut >= head:  # the header and properties are in: a payload buffer
            assert decoder.room is not None
        got = decode_all(data[cut:cut + 1000], decoder) + decode_all(data[cut + 1000:], decoder)
        assert same(got, [expected]), cut


def test_a_large_publish_whose_properties_are_longer_than_a_read():
    props = {U: [(f"k{i}", "v" * 200) for i in range(100)]}  # ~20 KB of properties
    data, expected = large5(30_000, props=props)
    decoder = Decoder(protocol=V5)
    got = []
    for i in range(0, len(data), 4096):
        got += decode_all(data[i:i + 4096], decoder)
    assert same(got, [expected])


def test_a_bad_property_in_a_large_publish_is_refused_before_its_payload_arrives():
    data, _ = large5(50_000, props=[(m5.CONTENT_TYPE, "a"), (m5.CONTENT_TYPE, "b")])
    raises5(data[:200], PROTOCOL_ERROR)
    data, _ = large5(50_000, props={m5.TOPIC_ALIAS: 0})
    raises5(data[:200], TOPIC_ALIAS_INVALID)
    data, _ = large5(50_000, topic="", props={})
    raises5(data[:200], PROTOCOL_ERROR)


def test_a_large_publish_whose_property_length_passes_its_end_is_refused_at_once():
    """Not after buffering the whole announced frame."""
    payload_len = 100_000
    body = m5.mqtt_str("t") + m5.u16(1) + m5.varint(payload_len + 10)
    head = mqttraw.packet(m5.PUBLISH, 2, body, remaining_length=len(body) + payload_len)
    raises5(head, MALFORMED_PACKET, decoder=lambda: Decoder(max_packet_size=1 << 20,
                                                             protocol=V5))


def test_alike_large_publishes_with_properties_are_read_apart_and_keep_them():
    """The repeated-frame path: QoS 1, packet identifier before the properties."""
    props = {U: [("device", "7")], m5.MESSAGE_EXPIRY: 60}
    frames = [large5(20_000, 1, pid, props)[0] for pid in (1, 2, 3, 4, 65535)]
    decoder = Decoder(protocol=V5)
    for f in frames[:2]:
        assert len(read_large_way(decoder, f)) == 1
    for f, pid in zip(frames[2:], (3, 4, 65535)):
        got = read_repeat(decoder, f)
        payload = random.Random(20_000 + pid).randbytes(20_000)
        assert same(got, [Publish("big/t", payload, 1, False, False, pid, broker_props(props))])
        assert type(got[0].payload) is bytearray and decoder.buffered == 0
    # other properties (same size): not the expected frame, decoded the usual way
    other, expected = large5(20_000, 1, 9, {U: [("device", "8")], m5.MESSAGE_EXPIRY: 60})
    assert same(read_repeat(decoder, other), [expected])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), packet_ids, st.sampled_from([
           None, {U: [("k", "v")]}, {m5.CONTENT_TYPE: "x", m5.TOPIC_ALIAS: 2}]),
           st.sampled_from([LARGE_FRAME, 20_000])), min_size=1, max_size=8),
       st.lists(st.integers(1, 70_000), min_size=1, max_size=5),
       st.sets(st.integers(0, 40), max_size=4), st.sets(st.integers(0, 40), max_size=4))
def test_hypothesis_large_v5_packets_read_any_way_give_the_same_packets(items, sizes, keeps,
                                                                       halts):
    frames, expected = [], []
    for qos, pid, props, size in items:
        f, x = large5(size, qos, pid, props or {})
        frames.append(f)
        expected.append(x)
        frames.append(m5.puback5(pid, 0x10))
        expected.append(Puback(pid, 0x10))
    decoder = Decoder(max_packet_size=1 << 20, protocol=V5)
    assert same(read_like_the_transport(decoder, b"".join(frames), sizes, keeps, halts),
                expected)


# ----------------------------------------------------------------------------- hypothesis

_text = st.text(alphabet="abcxyz019/ü€𝄞 -_.$", max_size=12)
_VALUES = {m5.BYTE: st.integers(0, 1), m5.U16: st.integers(1, 65535),
           m5.U32: st.integers(1, 0xFFFFFFFF), m5.VARINT: st.integers(1, 268_435_455),
           m5.STRING: _text, m5.BINARY: short_bytes, m5.PAIR: st.tuples(_text, _text)}


@st.composite
def property_lists(draw, where):
    """Properties a ``where`` may carry, each once (User Property any number of times, and
    Subscription Identifier in a PUBLISH), in any order."""
    items = []
    for ident, (_, kind, ws) in m5.PROPERTIES.items():
        if where not in ws or not draw(st.booleans()):
            continue
        times = draw(st.integers(1, 3)) if m5.repeatable(ident, where) else 1
        value = _VALUES[kind]
        if ident == m5.RESPONSE_TOPIC:
            value = _text.filter(lambda t: "+" not in t and "#" not in t)
        items += [(ident, draw(value)) for _ in range(times)]
    return draw(st.permutations(items))


def _expected_props(where, items):
    out = broker_props(items)
    if out and where == m5.PUBLISH and m5.SUBSCRIPTION_ID in out:
        out[m5.SUBSCRIPTION_ID] = [v for i, v in items if i == m5.SUBSCRIPTION_ID]
    return out


@st.composite
def v5_packets(draw):
    """(mqttraw5 bytes, the packet the decoder gives) for any packet but CONNECT."""
    kind = draw(st.sampled_from([m5.CONNACK, m5.PUBLISH, *ACKS, m5.SUBSCRIBE, m5.SUBACK,
                                 m5.UNSUBSCRIBE, m5.UNSUBACK, m5.PINGREQ, m5.PINGRESP,
                                 m5.DISCONNECT, m5.AUTH]))
    if kind in (m5.PINGREQ, m5.PINGRESP):
        return (m5.pingreq(), Pingreq()) if kind == m5.PINGREQ else (m5.pingresp(), Pingresp())
    items = draw(property_lists(kind))
    if kind == m5.AUTH:
        items = [(i, v) for i, v in items if i != m5.AUTH_METHOD] + [METHOD]
    props = _expected_props(kind, items)
    codes = sorted(m5.REASON_CODES.get(kind, {0}))
    if kind == m5.CONNACK:
        code = draw(st.sampled_from(codes))
        sp = draw(st.booleans()) and code == 0
        return m5.connack5(sp, code, items), Connack(sp, code, props)
    if kind == m5.PUBLISH:
        qos = draw(st.integers(0, 2))
        pid = draw(packet_ids) if qos else None
        topic, payload, retain = draw(topic_names), draw(short_bytes), draw(st.booleans())
        dup = qos > 0 and draw(st.booleans())
        return (m5.publish5(topic, payload, qos, retain, dup, pid, items),
                Publish(topic, payload, qos, retain, dup, pid, props))
    if kind in ACKS:
        pid, code = draw(packet_ids), draw(st.sampled_from(codes))
        return ACK_BUILDERS[kind](pid, code, items), ACKS[kind](pid, code, props)
    if kind == m5.SUBSCRIBE:
        pid = draw(packet_ids)
        topics = draw(st.lists(st.tuples(topic_filters, st.sampled_from(
            [o for o in range(0x30) if o & 3 != 3])), min_size=1, max_size=4))
        topics = [(f, o & ~m5.NO_LOCAL if f.startswith("$share/") else o) for f, o in topics]
        return m5.subscribe5(pid, topics, items), Subscribe(pid, topics, props)
    if kind in (m5.SUBACK, m5.UNSUBACK):
        pid = draw(packet_ids)
        rcs = draw(st.lists(st.sampled_from(codes), min_size=1, max_size=5))
        if kind == m5.SUBACK:
            return m5.suback5(pid, rcs, items), Suback(pid, rcs, props)
        return m5.unsuback5(pid, rcs, items), Unsuback(pid, rcs, props)
    if kind == m5.UNSUBSCRIBE:
        pid = draw(packet_ids)
        filters = draw(st.lists(topic_filters, min_size=1, max_size=4))
        return m5.unsubscribe5(pid, filters, items), Unsubscribe(pid, filters, props)
    code = draw(st.sampled_from(codes))
    cls = Disconnect if kind == m5.DISCONNECT else Auth
    return (m5.disconnect5 if kind == m5.DISCONNECT else m5.auth5)(code, items), cls(code, props)


@st.composite
def v5_connects(draw):
    items = draw(property_lists(m5.CONNECT))
    if any(i == m5.AUTH_DATA for i, _ in items) and all(i != m5.AUTH_METHOD for i, _ in items):
        items.append(METHOD)
    will = None
    if draw(st.booleans()):
        will_items = draw(property_lists(m5.WILL))
        will = (draw(topic_names), draw(short_bytes), draw(st.integers(0, 2)),
                draw(st.booleans()), will_items)
    username = draw(st.none() | _text)
    password = draw(st.none() | short_bytes)
    client_id, clean, keepalive = draw(_text), draw(st.booleans()), draw(st.integers(0, 65535))
    data = m5.connect5(client_id, clean, keepalive, items, will, username, password)
    expected = Connect(client_id, clean, keepalive,
                       will and Will(*will[:4], _expected_props(m5.WILL, will[4])),
                       username, password, V5, properties=_expected_props(m5.CONNECT, items))
    return data, expected


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.one_of(v5_packets(), v5_connects()))
def test_hypothesis_round_trip(item):
    check_round_trip(*item)


@SETTINGS
@given(v5_connects(), st.lists(v5_packets(), min_size=1, max_size=6), st.data())
def test_hypothesis_any_split_after_a_v5_connect_gives_the_same_packets(connect, items, data):
    stream = connect[0] + b"".join(d for d, _ in items)
    cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=12, unique=True))
    assert same(feed_in_pieces(stream, cuts), [connect[1]] + [x for _, x in items])


CONNECT5 = m5.connect5("fuzz")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_hypothesis_random_bytes_after_a_v5_connect_raise_only_protocol_error(data):
    got, _ = _decode_anything(CONNECT5 + data)
    assert got and got[0][0] == "Connect"


FIRST_BYTES5 = [0x10, 0x20, 0x30, 0x32, 0x34, 0x3B, 0x40, 0x50, 0x62, 0x70, 0x82, 0x90, 0xA2,
                0xB0, 0xE0, 0xF0]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIRST_BYTES5), st.binary(max_size=120))
def test_hypothesis_random_bodies_raise_only_protocol_error(first, body):
    _decode_anything(m5.packet(first >> 4, first & 15, body), protocol=V5)


@st.composite
def property_bodies(draw):
    """A frame whose property section is random bytes (often well-formed enough to reach the
    property rules)."""
    first = draw(st.sampled_from(FIRST_BYTES5))
    raw = draw(st.lists(st.tuples(st.sampled_from(sorted(m5.PROPERTIES) + [0, 0x7F, 0x80]),
                                  st.binary(max_size=6)), max_size=5))
    section = m5.props_raw(b"".join(bytes((i,)) + v for i, v in raw))
    ptype = first >> 4
    head = {m5.CONNACK: b"\x00\x00", m5.PUBLISH: m5.mqtt_str("t") + (m5.u16(1) if first & 6
                                                                     else b"")}.get(ptype)
    if head is None:
        head = m5.u16(1) if ptype in (*ACKS, m5.SUBSCRIBE, m5.SUBACK, m5.UNSUBSCRIBE,
                                       m5.UNSUBACK) else b""
        head += b"\x00" if ptype in ACKS or ptype in (m5.DISCONNECT, m5.AUTH) else b""
    if ptype == m5.CONNECT:
        return m5.connect5("c", props=section)
    return m5.packet(ptype, first & 15, head + section + draw(st.binary(max_size=8)))


@settings(max_examples=400, deadline=None)
@given(property_bodies())
def test_hypothesis_random_property_sections_raise_only_protocol_error(data):
    _decode_anything(data, protocol=0 if data[0] == 0x10 else V5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v5_connects(), st.lists(v5_packets(), min_size=1, max_size=3), st.data())
def test_hypothesis_mutated_v5_frames_raise_only_protocol_error(connect, items, data):
    stream = mutate(bytearray(connect[0] + b"".join(d for d, _ in items)), data)
    _decode_anything(bytes(stream), max_packet_size=1 << 12)


# ----------------------------------------------------------------------------- mqttraw5 client


def test_raw_client5_speaks_5_0_to_a_peer_that_answers_with_the_broker_s_encoder():
    """The blocking client the integration tests use, against a loopback listener that
    answers with encode5 frames; what the client sent is read with the broker's Decoder."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        client = m5.RawClient5("127.0.0.1", listener.getsockname()[1], timeout=5.0)
        peer, _ = listener.accept()
    with client, peer:
        peer.settimeout(5.0)
        # The peer's answers go out first (then it stops sending): the client reads each
        # when it waits for it.
        peer.sendall(encode5(Connack(False, 0, {m5.ASSIGNED_CLIENT_ID: "auto-1",
                                                m5.RECEIVE_MAXIMUM: 5}))
                     + encode5(Suback(1, [1, 0x8F], {m5.REASON_STRING: "bad filter"}))
                     + encode5(Puback(2, 0x10))
                     + encode5(Publish("a/b", b"hi", 1, False, False, 9,
                                       {U: [("k", "v")], m5.SUBSCRIPTION_ID: [3]}))
                     + encode5(Disconnect(0x8B, {m5.REASON_STRING: "bye"})))
        peer.shutdown(socket.SHUT_WR)
        ack = client.connect("", props={m5.SESSION_EXPIRY: 60})
        assert (ack.reason, ack.properties[m5.ASSIGNED_CLIENT_ID]) == (0, "auto-1")
        sub = client.subscribe(("a/+", 1 | m5.NO_LOCAL), "x/#", props={m5.SUBSCRIPTION_ID: 3})
        assert sub.codes == [1, 0x8F] and sub.properties == {m5.REASON_STRING: "bad filter"}
        assert client.publish("a/b", b"x", 1, props={m5.MESSAGE_EXPIRY: 5}).reason == 0x10
        msg = client.recv_publish()
        assert (msg.topic, msg.packet_id, msg.properties) == (
            "a/b", 9, {U: [("k", "v")], m5.SUBSCRIPTION_ID: [3]})
        gone = client.expect_disconnect()
        assert (gone.reason, gone.properties) == (0x8B, {m5.REASON_STRING: "bye"})
        client.close()
        sent = bytearray()
        while chunk := peer.recv(65536):
            sent += chunk
    assert same(decode_all(bytes(sent), Decoder()), [
        Connect("", properties={m5.SESSION_EXPIRY: 60}, protocol_level=V5),
        Subscribe(1, [("a/+", 5), ("x/#", 0)], {m5.SUBSCRIPTION_ID: 3}),
        Publish("a/b", b"x", 1, False, False, 2, {m5.MESSAGE_EXPIRY: 5}),
        Puback(9)])
