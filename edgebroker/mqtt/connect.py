"""Decoding a CONNECT, every version (3.1, 3.1.1, 5.0), with no I/O: its protocol name and
level choose the version, and so how the rest of the packet and of the connection reads.

A level the broker does not speak raises ProtocolError with reason 0x84 (Unsupported
Protocol Version), which the caller answers with the CONNACK that version understands.
A 3.1 or 3.1.1 level with 0x80 added (0x83, 0x84) is the bridge marker that Mosquitto's
bridge sends (``try_private``): that version, with ``Connect.bridge`` set.
"""

from __future__ import annotations

from edgebroker.errors import PROTOCOL_ERROR, UNSUPPORTED_PROTOCOL_VERSION, ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.fields import (
    malformed, no_trailing, protocol_error, read_binary, read_str, read_u16, read_varint,
)
from edgebroker.mqtt.packets import Connect, Will
from edgebroker.mqtt.properties import (AUTH_DATA, AUTH_METHOD, MAXIMUM_PACKET_SIZE, WILL,
                                         decode_properties)
from edgebroker.mqtt.topics import validate_topic_name

# The conformance ids of the connect flag rules, which 5.0 renumbered.
_RULES = {
    P.PROTOCOL_311: ("MQTT-3.1.2-13", "MQTT-3.1.2-15", "MQTT-3.1.2-14"),
    P.PROTOCOL_5: ("MQTT-3.1.2-11", "MQTT-3.1.2-13", "MQTT-3.1.2-12"),
}


def check_auth(props: dict | None, what: str) -> None:
    if props is not None and AUTH_DATA in props and AUTH_METHOD not in props:
        raise protocol_error(f"{what} with Authentication Data but no Authentication Method",
                             "MQTT-3.1.2.11.10")


def decode_connect(b0: int, buf: bytes, p: int, end: int) -> Connect:
    name, p = read_binary(buf, p, end, "CONNECT protocol name")
    if name != b"MQTT" and name != b"MQIsdp":
        raise ProtocolError(f"CONNECT with unknown protocol name {name!r}",
                            rule="MQTT-3.1.2-1", reason=PROTOCOL_ERROR)
    if p >= end:
        raise malformed("CONNECT ends before the protocol level")
    given = level = buf[p]
    bridge = level in (0x80 | P.PROTOCOL_31, 0x80 | P.PROTOCOL_311)
    if bridge:
        level &= 0x7F
    supported = (P.PROTOCOL_311, P.PROTOCOL_5) if name == b"MQTT" else (P.PROTOCOL_31,)
    if level not in supported:
        raise ProtocolError(f"CONNECT with protocol {name.decode()!r} level "
                            f"{given if given < 0x80 else hex(given)} "
                            f"(supported: level {' or '.join(map(str, supported))})",
                            rule="MQTT-3.1.2-2", reason=UNSUPPORTED_PROTOCOL_VERSION)
    try:
        connect = _decode_from_level(buf, p, end, name, level)
    except ProtocolError as exc:
        exc.connect5 = level == P.PROTOCOL_5    # the refusal goes in 5.0's CONNACK
        if exc.connect5:    # ... within the Maximum Packet Size, when it can be read
            try:
                props = decode_properties(buf, p + 4, end, P.CONNECT)[0] or {}
                exc.max_packet5 = props.get(MAXIMUM_PACKET_SIZE, 0)
            except ProtocolError:   # unreadable: the smallest CONNACK if it may set one
                exc.max_packet5 = 5 if _may_set_a_limit(buf, p + 4, end) else 0
        raise
    connect.bridge = bridge
    return connect


def _may_set_a_limit(buf: bytes, p: int, end: int) -> bool:
    """Whether a CONNECT property section (at ``p``) that does not decode may hold a Maximum
    Packet Size: its identifier's byte is in it, or its length cannot be read."""
    try:
        length, p = read_varint(buf, p, end, "CONNECT properties length")
    except ProtocolError:
        return True
    return MAXIMUM_PACKET_SIZE in buf[p:min(p + length, end)]


def _decode_from_level(buf: bytes, p: int, end: int, name: bytes, level: int) -> Connect:
    if p + 1 >= end:
        raise malformed("CONNECT ends before the connect flags")
    flags = buf[p + 1]
    if flags & 0x01:
        raise malformed("CONNECT with reserved connect flag bit 0 set", rule="MQTT-3.1.2-3")
    will_flag = flags & 0x04
    will_qos = flags >> 3 & 3
    will_retain = flags & 0x20
    qos_rule, retain_rule, qos3_rule = _RULES.get(level, _RULES[P.PROTOCOL_311])
    if not will_flag:
        if will_qos:
            raise malformed(f"CONNECT with will QoS {will_qos} but no will flag", rule=qos_rule)
        if will_retain:
            raise malformed("CONNECT with will retain but no will flag", rule=retain_rule)
    elif will_qos == 3:
        raise malformed("CONNECT with will QoS 3", rule=qos3_rule)
    v5 = level == P.PROTOCOL_5
    if flags & 0x40 and not flags & 0x80 and not v5:  # 5.0 allows a password alone
        raise malformed("CONNECT with password flag but no username flag",
                        rule="MQTT-3.1.2-22")
    keepalive = read_u16(buf, p + 2, end, "CONNECT keep alive")
    p += 4
    props = None
    if v5:
        props, p = decode_properties(buf, p, end, P.CONNECT)
        check_auth(props, "CONNECT")
    client_id, p = read_str(buf, p, end, "CONNECT client identifier")
    will = None
    if will_flag:
        will_props = None
        if v5:
            will_props, p = decode_properties(buf, p, end, WILL)
        will_topic, p = read_str(buf, p, end, "CONNECT will topic")
        validate_topic_name(will_topic, "will topic")
        will_payload, p = read_binary(buf, p, end, "CONNECT will message")
        will = Will(will_topic, will_payload, will_qos, bool(will_retain), will_props)
    username = password = None
    if flags & 0x80:
        username, p = read_str(buf, p, end, "CONNECT user name")
    if flags & 0x40:
        password, p = read_binary(buf, p, end, "CONNECT password")
    no_trailing(p, end, "CONNECT")
    return Connect(client_id, bool(flags & 0x02), keepalive, will, username, password,
                   level, name.decode("ascii"), props)
