"""MQTT 5.0 encoding: packet objects -> frames, with no I/O.

``encode5(packet)`` turns any packet object into one 5.0 frame. ``encode_publish_head5``,
``encode_ack5``, ``encode_connack5`` and ``encode_disconnect5`` are the pieces the broker's
delivery and refusal paths use. Acknowledgements with reason code 0 and no properties take the
short form the specification allows (the packet identifier alone; an empty DISCONNECT).
"""

from __future__ import annotations

import struct

from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import (
    PINGREQ_BYTES, PINGRESP_BYTES, encode_ack, encode_connect, frame, remaining_length,
    string_field,
)
from edgebroker.mqtt.packets import Connack, Publish, Subscribe, Suback, Unsubscribe
from edgebroker.mqtt.properties import encode_properties

_U16 = struct.Struct("!H")
_pack_u16 = _U16.pack
_NO_PROPERTIES = b"\x00"


def encode_publish_head5(topic_bytes: bytes, payload_len: int, qos: int, retain: bool,
                         dup: bool, packet_id: int | None, properties: bytes) -> bytes:
    """Everything of a 5.0 PUBLISH frame before the payload: frame = head + payload.

    ``properties`` is the encoded property section (``encode_properties``); ``packet_id`` is
    used only when qos > 0."""
    first = 0x30 | qos << 1 | retain | dup << 3
    pid = _pack_u16(packet_id) if qos else b""
    rl = 2 + len(topic_bytes) + len(pid) + len(properties) + payload_len
    return b"".join((bytes((first,)), remaining_length(rl), _pack_u16(len(topic_bytes)),
                     topic_bytes, pid, properties))


_FIRST = {P.PUBACK: 0x40, P.PUBREC: 0x50, P.PUBREL: 0x62, P.PUBCOMP: 0x70}


def encode_ack5(packet_type: int, packet_id: int, reason_code: int = 0,
                properties: dict | None = None) -> bytes:
    """A 5.0 PUBACK/PUBREC/PUBREL/PUBCOMP."""
    if not reason_code and not properties:
        return encode_ack(packet_type, packet_id)
    body = _pack_u16(packet_id) + bytes((reason_code,))
    if properties:
        body += encode_properties(properties)
    return frame(_FIRST[packet_type], body)


def encode_connack5(session_present: bool, reason_code: int,
                    properties: dict | None = None) -> bytes:
    return frame(0x20, bytes((1 if session_present else 0, reason_code))
                 + encode_properties(properties))


def encode_disconnect5(reason_code: int = 0, properties: dict | None = None) -> bytes:
    if not reason_code and not properties:
        return b"\xe0\x00"
    body = bytes((reason_code,))
    if properties:
        body += encode_properties(properties)
    return frame(0xE0, body)


def encode_auth(reason_code: int = 0, properties: dict | None = None) -> bytes:
    if not reason_code and not properties:
        return b"\xf0\x00"
    return frame(0xF0, bytes((reason_code,)) + encode_properties(properties))


def _publish(p: Publish) -> bytes:
    return encode_publish_head5(p.topic.encode("utf-8"), len(p.payload), p.qos, bool(p.retain),
                                bool(p.dup), p.packet_id,
                                encode_properties(p.properties)) + bytes(p.payload)


def _subscribe(p: Subscribe) -> bytes:
    body = [_pack_u16(p.packet_id), encode_properties(p.properties)]
    for topic_filter, options in p.topics:
        body.append(string_field(topic_filter))
        body.append(bytes((options,)))
    return frame(0x82, b"".join(body))


def _reason_codes(p, codes) -> bytes:
    # One per topic filter (MQTT-3.9.3-1, MQTT-3.11.3-1): a 5.0 UNSUBACK made the 3.1.1 way
    # (no reason codes) would be a frame every 5.0 receiver refuses.
    if not codes:
        raise ValueError(f"a 5.0 {P.NAMES[p.type]} needs a reason code per topic filter")
    return bytes(codes)


def _suback(p: Suback) -> bytes:
    return frame(0x90, _pack_u16(p.packet_id) + encode_properties(p.properties)
                 + _reason_codes(p, p.return_codes))


def _unsubscribe(p: Unsubscribe) -> bytes:
    return frame(0xA2, _pack_u16(p.packet_id) + encode_properties(p.properties)
                 + b"".join(string_field(t) for t in p.topics))


def _unsuback(p) -> bytes:
    return frame(0xB0, _pack_u16(p.packet_id) + encode_properties(p.properties)
                 + _reason_codes(p, p.reason_codes))


def _connack(p: Connack) -> bytes:
    return encode_connack5(p.session_present, p.return_code, p.properties)


_ENCODERS5 = {
    P.CONNECT: encode_connect, P.CONNACK: _connack, P.PUBLISH: _publish,
    P.PUBACK: lambda p: encode_ack5(p.type, p.packet_id, p.reason_code, p.properties),
    P.SUBSCRIBE: _subscribe, P.SUBACK: _suback, P.UNSUBSCRIBE: _unsubscribe,
    P.UNSUBACK: _unsuback, P.PINGREQ: lambda p: PINGREQ_BYTES,
    P.PINGRESP: lambda p: PINGRESP_BYTES,
    P.DISCONNECT: lambda p: encode_disconnect5(p.reason_code, p.properties),
    P.AUTH: lambda p: encode_auth(p.reason_code, p.properties),
}
for _t in (P.PUBREC, P.PUBREL, P.PUBCOMP):
    _ENCODERS5[_t] = _ENCODERS5[P.PUBACK]
del _t


def encode5(packet) -> bytes:
    """One complete 5.0 frame for ``packet``."""
    return _ENCODERS5[packet.type](packet)
