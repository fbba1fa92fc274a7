"""MQTT 5.0 decoding of one frame's fields, with no I/O: one decoder per packet type
(``DECODERS5``; CONNECT, every version, is mqtt/connect.py's).

``mqtt/stream.py`` switches a connection to these once its CONNECT says level 5 (or from the
start, for a client's decoder); PUBLISH is decoded there inline, its properties with
``decode_properties``. Each packet's properties are checked against the table in
mqtt/properties.py; reason codes against the set the specification gives each packet. Every
rule violation names the rule in ``rule``. A client's decoder (``DECODERS5_CLIENT``) is lenient
in one case: it takes any reason code of 0x80 or more in a PUBACK or PUBREC, listed or not, as
a refusal of that message (Mosquitto 2.0 answers 0x95 to a message over its
``message_size_limit``); a server's decoder keeps to the list.
"""

from __future__ import annotations

from edgebroker.errors import (
    CONTINUE_AUTHENTICATION, GRANTED_QOS_1, GRANTED_QOS_2, NO_MATCHING_SUBSCRIBERS,
    NO_SUBSCRIPTION_EXISTED, PACKET_ID_NOT_FOUND, REASON_NAMES, REAUTHENTICATE, SUCCESS,
    topic_shown,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.connect import decode_connect
from edgebroker.mqtt.decode import DECODERS, FIRST_BYTE_ERRORS
from edgebroker.mqtt.fields import (
    malformed, no_trailing, protocol_error, read_packet_id, read_str,
)
from edgebroker.mqtt.packets import (
    Auth, Connack, Disconnect, Puback, Pubcomp, Pubrec, Pubrel, Suback, Subscribe, Unsuback,
    Unsubscribe,
)
from edgebroker.mqtt.properties import AUTH_METHOD, decode_properties
from edgebroker.mqtt.topics import validate_topic_filter

# The reason codes each packet may carry (section 2.4 and each packet's table).
_ERRORS_PUB = (0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)
REASONS = {
    P.CONNACK: frozenset((SUCCESS, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
                          0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)),
    P.PUBACK: frozenset((SUCCESS, NO_MATCHING_SUBSCRIBERS, *_ERRORS_PUB)),
    P.PUBREC: frozenset((SUCCESS, NO_MATCHING_SUBSCRIBERS, *_ERRORS_PUB)),
    P.PUBREL: frozenset((SUCCESS, PACKET_ID_NOT_FOUND)),
    P.PUBCOMP: frozenset((SUCCESS, PACKET_ID_NOT_FOUND)),
    P.SUBACK: frozenset((SUCCESS, GRANTED_QOS_1, GRANTED_QOS_2, 0x80, 0x83, 0x87, 0x8F, 0x91,
                         0x97, 0x9E, 0xA1, 0xA2)),
    P.UNSUBACK: frozenset((SUCCESS, NO_SUBSCRIPTION_EXISTED, 0x80, 0x83, 0x87, 0x8F, 0x91)),
    # Table 3-10, and 0x8C (Bad authentication method), which section 2.4 also gives
    # DISCONNECT (a failed re-authentication ends with it).
    P.DISCONNECT: frozenset((SUCCESS, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8C,
                             0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99,
                             0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2)),
    P.AUTH: frozenset((SUCCESS, CONTINUE_AUTHENTICATION, REAUTHENTICATE)),
}


def _reason(ptype: int, code: int) -> int:
    if code not in REASONS[ptype]:
        name = REASON_NAMES.get(code, "unknown")
        raise protocol_error(f"{P.NAMES[ptype]} with reason code {code:#04x} ({name}), which "
                             f"that packet cannot carry", "MQTT-2.4")
    return code


def _dec_connack(b0: int, buf: bytes, p: int, end: int) -> Connack:
    if end - p < 2:
        raise malformed(f"CONNACK with remaining length {end - p} (at least 2)")
    ack_flags = buf[p]
    if ack_flags & 0xFE:
        raise malformed(f"CONNACK with reserved acknowledge flag bits set ({ack_flags:#04x})",
                        rule="MQTT-3.2.2-1")
    code = _reason(P.CONNACK, buf[p + 1])
    if ack_flags and code:
        raise protocol_error(f"CONNACK with reason code {code:#04x} and Session Present 1",
                             "MQTT-3.2.2-6")
    if end - p == 2:  # a 3.1.1-sized CONNACK: the property length is not optional in 5.0
        raise malformed("CONNACK ends before its properties")
    props, p = decode_properties(buf, p + 2, end, P.CONNACK)
    no_trailing(p, end, "CONNACK")
    return Connack(bool(ack_flags), code, props)


def _make_ack_decoder(cls, lenient: bool = False):
    """The decoder of ``cls`` (PUBACK, PUBREC, PUBREL, PUBCOMP); ``lenient``: any code of
    0x80 or more is taken (a client's decoder of PUBACK and PUBREC, see the module doc)."""
    ptype = cls.type
    name = P.NAMES[ptype]

    def decode(b0: int, buf: bytes, p: int, end: int):
        pid = read_packet_id(buf, p, end, name)
        if end - p == 2:  # reason code 0 and no properties may be left out
            return cls(pid)
        code = buf[p + 2]
        if not (lenient and code >= 0x80):
            _reason(ptype, code)
        props = None
        if end - p > 3:
            props, q = decode_properties(buf, p + 3, end, ptype)
            no_trailing(q, end, name)
        return cls(pid, code, props)
    return decode


def check_subscription_options(options: int, topic_filter: str) -> None:
    """Reserved bits (malformed), QoS 3, Retain Handling 3 and No Local on a shared
    subscription (protocol errors) in a 5.0 subscription options byte (section 3.8.3.1)."""
    if options & 0xC0:
        raise malformed(f"SUBSCRIBE options {options:#04x} for {topic_shown(topic_filter)}: "
                        f"reserved bits set", rule="MQTT-3.8.3-5")
    if options & 3 == 3:
        raise protocol_error(f"SUBSCRIBE options {options:#04x} for "
                             f"{topic_shown(topic_filter)}: QoS 3", "MQTT-3.8.3.1")
    if options & P.SUB_RETAIN_HANDLING == P.SUB_RETAIN_HANDLING:
        raise protocol_error(f"SUBSCRIBE options {options:#04x} for "
                             f"{topic_shown(topic_filter)}: Retain Handling 3", "MQTT-3.8.3.1")
    if options & P.SUB_NO_LOCAL and topic_filter.startswith("$share/"):
        raise protocol_error(f"SUBSCRIBE options {options:#04x} for "
                             f"{topic_shown(topic_filter)}: No Local on a shared subscription",
                             "MQTT-3.8.3-4")


def _dec_subscribe(b0: int, buf: bytes, p: int, end: int) -> Subscribe:
    pid = read_packet_id(buf, p, end, "SUBSCRIBE")
    props, p = decode_properties(buf, p + 2, end, P.SUBSCRIBE)
    if p == end:
        raise protocol_error("SUBSCRIBE with no topic filters", "MQTT-3.8.3-2")
    topics = []
    while p < end:
        topic_filter, p = read_str(buf, p, end, "SUBSCRIBE topic filter")
        validate_topic_filter(topic_filter)
        if p >= end:
            raise malformed(f"SUBSCRIBE topic filter {topic_shown(topic_filter)} has no "
                            f"options byte")
        options = buf[p]
        p += 1
        check_subscription_options(options, topic_filter)
        topics.append((topic_filter, options))
    return Subscribe(pid, topics, props)


def _codes(ptype: int, buf: bytes, p: int, end: int) -> list[int]:
    codes = [_reason(ptype, c) for c in buf[p:end]]
    if not codes:
        raise protocol_error(f"{P.NAMES[ptype]} with no reason codes", "MQTT-3.9.3")
    return codes


def _dec_suback(b0: int, buf: bytes, p: int, end: int) -> Suback:
    pid = read_packet_id(buf, p, end, "SUBACK")
    props, p = decode_properties(buf, p + 2, end, P.SUBACK)
    return Suback(pid, _codes(P.SUBACK, buf, p, end), props)


def _dec_unsubscribe(b0: int, buf: bytes, p: int, end: int) -> Unsubscribe:
    pid = read_packet_id(buf, p, end, "UNSUBSCRIBE")
    props, p = decode_properties(buf, p + 2, end, P.UNSUBSCRIBE)
    if p == end:
        raise protocol_error("UNSUBSCRIBE with no topic filters", "MQTT-3.10.3-2")
    topics = []
    while p < end:
        topic_filter, p = read_str(buf, p, end, "UNSUBSCRIBE topic filter")
        validate_topic_filter(topic_filter)
        topics.append(topic_filter)
    return Unsubscribe(pid, topics, props)


def _dec_unsuback(b0: int, buf: bytes, p: int, end: int) -> Unsuback:
    pid = read_packet_id(buf, p, end, "UNSUBACK")
    props, p = decode_properties(buf, p + 2, end, P.UNSUBACK)
    return Unsuback(pid, _codes(P.UNSUBACK, buf, p, end), props)


def _make_reasoned_decoder(cls):
    ptype = cls.type
    name = P.NAMES[ptype]

    def decode(b0: int, buf: bytes, p: int, end: int):
        if p == end:  # reason code 0 and no properties
            return cls()
        code = _reason(ptype, buf[p])
        props = None
        if end - p > 1:
            props, q = decode_properties(buf, p + 1, end, ptype)
            no_trailing(q, end, name)
        if ptype == P.AUTH and (props is None or AUTH_METHOD not in props):
            # Only the empty AUTH (Success, no properties) may leave it out.
            raise protocol_error("AUTH with no Authentication Method", "MQTT-3.15.2.2.2")
        return cls(code, props)
    return decode


# As FIRST_BYTE_ERRORS, with AUTH (type 15, flags 0) allowed.
FIRST_BYTE_ERRORS5 = list(FIRST_BYTE_ERRORS)
for _b in range(0xF0, 0x100):
    FIRST_BYTE_ERRORS5[_b] = None if _b == 0xF0 else malformed(
        f"AUTH with fixed-header flags {_b & 15:04b} (must be 0000)", rule="MQTT-3.15.1-1")
del _b

# Indexed by packet type; PUBLISH is decoded inline in Decoder._frames.
DECODERS5 = [None] * 16
DECODERS5[P.CONNECT] = decode_connect
DECODERS5[P.CONNACK] = _dec_connack
DECODERS5[P.SUBSCRIBE] = _dec_subscribe
DECODERS5[P.SUBACK] = _dec_suback
DECODERS5[P.UNSUBSCRIBE] = _dec_unsubscribe
DECODERS5[P.UNSUBACK] = _dec_unsuback
for _cls in (Puback, Pubrec, Pubrel, Pubcomp):
    DECODERS5[_cls.type] = _make_ack_decoder(_cls)
for _cls in (Disconnect, Auth):
    DECODERS5[_cls.type] = _make_reasoned_decoder(_cls)
for _cls in (P.Pingreq, P.Pingresp):
    DECODERS5[_cls.type] = DECODERS[_cls.type]
# A client's: as DECODERS5, with PUBACK and PUBREC taking any refusal (see the module doc).
DECODERS5_CLIENT = list(DECODERS5)
for _cls in (Puback, Pubrec):
    DECODERS5_CLIENT[_cls.type] = _make_ack_decoder(_cls, lenient=True)
del _cls
