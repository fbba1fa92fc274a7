"""MQTT 3.1.1 / 3.1 encoding: packet objects -> frames, with no I/O.

``encode(packet)`` turns any of the 14 packet objects into one frame.
``encode_publish_head``, ``encode_ack``, ``encode_puback`` and ``PINGRESP_BYTES`` are the
allocation-light pieces the broker's hot path uses.
"""

from __future__ import annotations

import functools
import struct

from edgebroker.mqtt import packets as P
from edgebroker.mqtt.packets import (
    MAX_REMAINING_LENGTH, Connack, Connect, Publish, Subscribe, Suback, Unsubscribe,
)
from edgebroker.mqtt.properties import encode_properties

_U16 = struct.Struct("!H")
_ACK = struct.Struct("!BBH")
_HEAD_SMALL = struct.Struct("!BBH")  # first byte, 1-byte remaining length, topic length
_pack_u16 = _U16.pack
_pack_ack = _ACK.pack
_pack_head_small = _HEAD_SMALL.pack


def remaining_length(n: int) -> bytes:
    # Written out per length (7 bits a byte, the high bit says another follows): a 64 KiB
    # payload's header is encoded once per message.
    if n < 128:
        return _RL1[n]
    if n < 16_384:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 2_097_152:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} exceeds {MAX_REMAINING_LENGTH}")
    return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80, n >> 21))


_RL1 = [bytes((i,)) for i in range(128)]


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def string_field(s: str) -> bytes:
    raw = s.encode("utf-8")
    return binary_field(raw)


def binary_field(raw: bytes) -> bytes:
    if len(raw) > 0xFFFF:
        raise ValueError(f"field of {len(raw)} bytes does not fit a 2-byte length")
    return _pack_u16(len(raw)) + raw


def encode_publish_head(topic_bytes: bytes, payload_len: int, qos: int, retain: bool,
                        dup: bool, packet_id: int | None) -> bytes:
    """Everything of a PUBLISH frame before the payload: frame = head + payload.

    ``topic_bytes`` is the UTF-8 topic name; ``packet_id`` is used only when qos > 0.
    """
    first = 0x30 | qos << 1 | retain | dup << 3
    tlen = len(topic_bytes)
    if qos:
        rl = tlen + 4 + payload_len
        if rl < 128:
            return _pack_head_small(first, rl, tlen) + topic_bytes + _pack_u16(packet_id)
        return b"".join((bytes((first,)), remaining_length(rl), _pack_u16(tlen), topic_bytes,
                         _pack_u16(packet_id)))
    rl = tlen + 2 + payload_len
    if rl < 128:
        return _pack_head_small(first, rl, tlen) + topic_bytes
    return b"".join((bytes((first,)), remaining_length(rl), _pack_u16(tlen), topic_bytes))


_ACK_FIRST = {
    P.PUBACK: 0x40, P.PUBREC: 0x50, P.PUBREL: 0x62, P.PUBCOMP: 0x70, P.UNSUBACK: 0xB0,
}


def encode_ack(packet_type: int, packet_id: int) -> bytes:
    """A PUBACK/PUBREC/PUBREL/PUBCOMP/UNSUBACK frame for ``packet_id``."""
    return _pack_ack(_ACK_FIRST[packet_type], 2, packet_id)


# encode_ack(PUBACK, packet_id) without a Python frame: one per QoS 1 PUBLISH received.
encode_puback = functools.partial(_pack_ack, _ACK_FIRST[P.PUBACK], 2)


def encode_connack(session_present: bool, return_code: int) -> bytes:
    return bytes((0x20, 2, 1 if session_present else 0, return_code))


PINGRESP_BYTES = b"\xd0\x00"
PINGREQ_BYTES = b"\xc0\x00"
DISCONNECT_BYTES = b"\xe0\x00"


def encode_connect(p: Connect) -> bytes:
    """A CONNECT of ``p.protocol_level`` (3, 4 or 5: 5.0 adds the property sections; 0x80
    added to it for ``p.bridge``, the bridge marker)."""
    flags = 0x02 if p.clean_session else 0
    v5 = p.protocol_level == P.PROTOCOL_5
    level = p.protocol_level | (0x80 if p.bridge else 0)
    parts = [string_field(p.protocol_name), bytes((level,)), b"",
             _pack_u16(p.keepalive)]
    if v5:
        parts.append(encode_properties(p.properties))
    parts.append(string_field(p.client_id))
    will = p.will
    if will is not None:
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
        if v5:
            parts.append(encode_properties(will.properties))
        parts.append(string_field(will.topic))
        parts.append(binary_field(will.payload))
    if p.username is not None:
        flags |= 0x80
        parts.append(string_field(p.username))
    if p.password is not None:
        flags |= 0x40
        parts.append(binary_field(p.password))
    parts[2] = bytes((flags,))
    return frame(0x10, b"".join(parts))


def _enc_connack(p: Connack) -> bytes:
    return encode_connack(p.session_present, p.return_code)


def _enc_publish(p: Publish) -> bytes:
    topic = p.topic.encode("utf-8")
    return encode_publish_head(topic, len(p.payload), p.qos, bool(p.retain), bool(p.dup),
                               p.packet_id) + p.payload


def _enc_id_only(p) -> bytes:
    return encode_ack(p.type, p.packet_id)


def _enc_subscribe(p: Subscribe) -> bytes:
    body = [_pack_u16(p.packet_id)]
    for topic_filter, qos in p.topics:
        body.append(string_field(topic_filter))
        body.append(bytes((qos,)))
    return frame(0x82, b"".join(body))


def _enc_suback(p: Suback) -> bytes:
    return frame(0x90, _pack_u16(p.packet_id) + bytes(p.return_codes))


def _enc_unsubscribe(p: Unsubscribe) -> bytes:
    return frame(0xA2, _pack_u16(p.packet_id) + b"".join(string_field(t) for t in p.topics))


_ENCODERS = {
    P.CONNECT: encode_connect, P.CONNACK: _enc_connack, P.PUBLISH: _enc_publish,
    P.PUBACK: _enc_id_only, P.PUBREC: _enc_id_only, P.PUBREL: _enc_id_only,
    P.PUBCOMP: _enc_id_only, P.SUBSCRIBE: _enc_subscribe, P.SUBACK: _enc_suback,
    P.UNSUBSCRIBE: _enc_unsubscribe, P.UNSUBACK: _enc_id_only,
    P.PINGREQ: lambda p: PINGREQ_BYTES, P.PINGRESP: lambda p: PINGRESP_BYTES,
    P.DISCONNECT: lambda p: DISCONNECT_BYTES,
}


def encode(packet) -> bytes:
    """One complete frame for ``packet`` (any of the 14 packet classes)."""
    return _ENCODERS[packet.type](packet)
