"""MQTT 3.1.1 / 3.1 decoding of one frame's fields, with no I/O: the rules every packet's
body is checked against, and one decoder per packet type (``DECODERS``).

``mqtt/stream.py`` splits a connection's bytes into frames and calls these; PUBLISH, the hot
path, is decoded there inline. Every rule violation names the specification's conformance id in
``rule`` (section numbers such as ``MQTT-2.2.3`` where the spec has no numbered rule).
"""

from __future__ import annotations

from edgebroker.errors import TOPIC_NAME_INVALID, ProtocolError, topic_shown
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.packets import (
    Connack, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Pubrec, Pubrel, Suback, Subscribe,
    Unsuback, Unsubscribe,
)
from edgebroker.mqtt.connect import decode_connect
from edgebroker.mqtt.fields import (
    malformed, read_packet_id, read_str,
)
from edgebroker.mqtt.topics import validate_topic_filter

_SUBACK_CODES = frozenset({0, 1, 2, P.SUBACK_FAILURE})

# Fixed-header flag nibble each type must carry (PUBLISH flags vary; checked apart).
_REQUIRED_FLAGS = {
    P.CONNECT: 0, P.CONNACK: 0, P.PUBACK: 0, P.PUBREC: 0, P.PUBREL: 2, P.PUBCOMP: 0,
    P.SUBSCRIBE: 2, P.SUBACK: 0, P.UNSUBSCRIBE: 2, P.UNSUBACK: 0, P.PINGREQ: 0,
    P.PINGRESP: 0, P.DISCONNECT: 0,
}



def _first_byte_error(b0: int) -> ProtocolError | None:
    """The error for a bad first byte (type + flags), or None if it is acceptable."""
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 0 or ptype == 15:
        return malformed(f"reserved packet type {ptype}", rule="MQTT-2.2.1")
    if ptype == P.PUBLISH:
        qos = flags >> 1 & 3
        if qos == 3:
            return malformed("PUBLISH with QoS 3", rule="MQTT-3.3.1-4")
        if qos == 0 and flags & 0x08:
            return malformed("PUBLISH with DUP set and QoS 0", rule="MQTT-3.3.1-2")
        return None
    required = _REQUIRED_FLAGS[ptype]
    if flags != required:
        return malformed(f"{P.NAMES[ptype]} with fixed-header flags {flags:04b} "
                          f"(must be {required:04b})", rule="MQTT-2.2.2-1")
    return None


# Indexed by the first byte of a frame: None when acceptable, else the error to raise.
FIRST_BYTE_ERRORS = [_first_byte_error(b) for b in range(256)]


def _dec_connack(b0: int, buf: bytes, p: int, end: int) -> Connack:
    if end - p != 2:
        raise malformed(f"CONNACK with remaining length {end - p} (must be 2)")
    ack_flags = buf[p]
    if ack_flags & 0xFE:
        raise malformed(f"CONNACK with reserved acknowledge flag bits set ({ack_flags:#04x})",
                         rule="MQTT-3.2.2.1")
    return Connack(bool(ack_flags), buf[p + 1])


def publish_topic_error(topic: str) -> ProtocolError:
    if not topic:
        return ProtocolError("PUBLISH with an empty topic name", rule="MQTT-4.7.3-1",
                             reason=TOPIC_NAME_INVALID)
    if "\x00" in topic:
        return malformed("PUBLISH topic name contains U+0000", rule="MQTT-1.5.3-2")
    return ProtocolError(f"PUBLISH topic name {topic_shown(topic)} contains a wildcard "
                         f"character",
                         rule="MQTT-3.3.2-2", reason=TOPIC_NAME_INVALID)


def _make_id_only_decoder(cls):
    name = P.NAMES[cls.type]

    def decode(b0: int, buf: bytes, p: int, end: int):
        if end - p != 2:
            raise malformed(f"{name} with remaining length {end - p} (must be 2)")
        pid = buf[p] << 8 | buf[p + 1]
        if pid == 0:
            raise malformed(f"{name} with packet identifier 0", rule="MQTT-2.3.1-1")
        return cls(pid)
    return decode


def _dec_subscribe(b0: int, buf: bytes, p: int, end: int) -> Subscribe:
    pid = read_packet_id(buf, p, end, "SUBSCRIBE")
    p += 2
    if p == end:
        raise malformed("SUBSCRIBE with no topic filters", rule="MQTT-3.8.3-3")
    topics = []
    while p < end:
        topic_filter, p = read_str(buf, p, end, "SUBSCRIBE topic filter")
        validate_topic_filter(topic_filter)
        if p >= end:
            raise malformed(f"SUBSCRIBE topic filter {topic_shown(topic_filter)} has no "
                            f"requested QoS")
        qos = buf[p]
        p += 1
        if qos > 2:
            detail = "reserved bits set" if qos > 3 else "QoS 3"
            raise malformed(f"SUBSCRIBE requested-QoS byte {qos:#04x} for "
                            f"{topic_shown(topic_filter)}: {detail}", rule="MQTT-3-8.3-4")
        topics.append((topic_filter, qos))
    return Subscribe(pid, topics)


def _dec_suback(b0: int, buf: bytes, p: int, end: int) -> Suback:
    pid = read_packet_id(buf, p, end, "SUBACK")
    codes = list(buf[p + 2:end])
    if not codes:
        raise malformed("SUBACK with no return codes", rule="MQTT-3.9.3")
    for code in codes:
        if code not in _SUBACK_CODES:
            raise malformed(f"SUBACK with reserved return code {code:#04x}",
                             rule="MQTT-3.9.3-2")
    return Suback(pid, codes)


def _dec_unsubscribe(b0: int, buf: bytes, p: int, end: int) -> Unsubscribe:
    pid = read_packet_id(buf, p, end, "UNSUBSCRIBE")
    p += 2
    if p == end:
        raise malformed("UNSUBSCRIBE with no topic filters", rule="MQTT-3.10.3-2")
    topics = []
    while p < end:
        topic_filter, p = read_str(buf, p, end, "UNSUBSCRIBE topic filter")
        validate_topic_filter(topic_filter)
        topics.append(topic_filter)
    return Unsubscribe(pid, topics)


def make_empty_decoder(cls):
    name = P.NAMES[cls.type]
    instance = cls()  # immutable and field-less: share one

    def decode(b0: int, buf: bytes, p: int, end: int):
        if end != p:
            raise malformed(f"{name} with remaining length {end - p} (must be 0)")
        return instance
    return decode


# The 4-byte acknowledgements by their (valid) first byte, for Decoder.feed's shortcut.
ACKS = {0x40: Puback, 0x50: Pubrec, 0x62: Pubrel, 0x70: Pubcomp, 0xB0: Unsuback}

# Indexed by packet type; PUBLISH (3) is decoded inline in Decoder._frames.
DECODERS = [None] * 16
DECODERS[P.CONNECT] = decode_connect
DECODERS[P.CONNACK] = _dec_connack
DECODERS[P.SUBSCRIBE] = _dec_subscribe
DECODERS[P.SUBACK] = _dec_suback
DECODERS[P.UNSUBSCRIBE] = _dec_unsubscribe
for _cls in (Puback, Pubrec, Pubrel, Pubcomp, Unsuback):
    DECODERS[_cls.type] = _make_id_only_decoder(_cls)
for _cls in (Pingreq, Pingresp, Disconnect):
    DECODERS[_cls.type] = make_empty_decoder(_cls)
del _cls


def long_remaining_length(buf: bytes, pos: int, n: int) -> tuple[int, int] | None:
    """Remaining length starting at ``buf[pos+1]`` whose first byte has the continuation bit.

    Returns (remaining length, offset of the variable header), or None if incomplete.
    """
    value = 0
    shift = 0
    p = pos + 1
    while True:
        if p >= n:
            return None
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        if shift == 21:
            raise malformed("remaining length has a continuation bit in its 4th byte",
                             rule="MQTT-2.2.3")
        shift += 7
