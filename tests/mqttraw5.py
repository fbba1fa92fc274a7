"""A small, independent MQTT 5.0 encoder/decoder and a blocking raw-socket client for the tests.

Written from the OASIS MQTT Version 5.0 specification; like ``mqttraw`` (3.1.1, whose
primitives it shares) it imports nothing from ``edgebroker``, so a codec bug in the broker
cannot hide behind the same bug in the tests.

Properties (section 2.2.2): ``PROPERTIES`` gives each identifier its name, type and the packets
it may appear in (``WILL`` for the will properties). ``prop(ident, value)`` encodes one property
(any identifier; ``kind`` forces a type, for unknown identifiers or wrong types) and
``props(items)`` a property section: its length, then the properties, from a dict or a list of
(identifier, value) pairs, in order (a list may repeat an identifier). ``props_raw(body,
length=...)`` wraps raw bytes, with a length that may lie. Every builder's ``props`` is None
(an empty section), a dict or list for ``props()``, or ``bytes``: the whole section as given.

Builders return the exact bytes of one packet; the acknowledgements take the short forms the
specification allows when ``reason`` (and ``props``) is None. ``parse(first_byte, body)`` and
``split_frames5`` read packets back (every type, server-to-client ones above all) as
``Packet5`` objects whose ``properties`` is a dict (User Property: a list of (name, value)
pairs; a PUBLISH's Subscription Identifiers: a list). The parser is strict: an unknown or
misplaced property, a repeated one, or a field running past the end raises MalformedPacket.
"""

from __future__ import annotations

import struct

import mqttraw
from mqttraw import (
    CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP,
    PUBLISH, PUBREC, PUBREL, SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE, ConnectionClosed,
    MalformedPacket, mqtt_str, packet, pingreq, pingresp, to_bytes, varint,
)

__all__ = [
    "AUTH", "CONNACK", "CONNECT", "DISCONNECT", "PINGREQ", "PINGRESP", "PUBACK", "PUBCOMP",
    "PUBLISH", "PUBREC", "PUBREL", "SUBACK", "SUBSCRIBE", "UNSUBACK", "UNSUBSCRIBE",
    "ConnectionClosed", "MalformedPacket", "pingreq", "pingresp",
]

AUTH = 15  # the packet type 5.0 adds (section 3.15)

# ---------------------------------------------------------------------------------------------
# Properties (section 2.2.2.2)
# ---------------------------------------------------------------------------------------------

PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_ID = 0x0B
SESSION_EXPIRY = 0x11
ASSIGNED_CLIENT_ID = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTH_METHOD = 0x15
AUTH_DATA = 0x16
REQUEST_PROBLEM_INFO = 0x17
WILL_DELAY = 0x18
REQUEST_RESPONSE_INFO = 0x19
RESPONSE_INFO = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUB_AVAILABLE = 0x28
SUB_ID_AVAILABLE = 0x29
SHARED_SUB_AVAILABLE = 0x2A

# Data types (section 1.5).
BYTE, U16, U32, VARINT, STRING, BINARY, PAIR = (
    "byte", "two byte integer", "four byte integer", "variable byte integer", "string",
    "binary data", "string pair")

WILL = "will"  # the will properties of a CONNECT

_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)
_PUB = (PUBLISH, WILL)

# identifier -> (name, type, where it may appear): Table 2-4.
PROPERTIES = {
    PAYLOAD_FORMAT: ("Payload Format Indicator", BYTE, _PUB),
    MESSAGE_EXPIRY: ("Message Expiry Interval", U32, _PUB),
    CONTENT_TYPE: ("Content Type", STRING, _PUB),
    RESPONSE_TOPIC: ("Response Topic", STRING, _PUB),
    CORRELATION_DATA: ("Correlation Data", BINARY, _PUB),
    SUBSCRIPTION_ID: ("Subscription Identifier", VARINT, (PUBLISH, SUBSCRIBE)),
    SESSION_EXPIRY: ("Session Expiry Interval", U32, (CONNECT, CONNACK, DISCONNECT)),
    ASSIGNED_CLIENT_ID: ("Assigned Client Identifier", STRING, (CONNACK,)),
    SERVER_KEEP_ALIVE: ("Server Keep Alive", U16, (CONNACK,)),
    AUTH_METHOD: ("Authentication Method", STRING, (CONNECT, CONNACK, AUTH)),
    AUTH_DATA: ("Authentication Data", BINARY, (CONNECT, CONNACK, AUTH)),
    REQUEST_PROBLEM_INFO: ("Request Problem Information", BYTE, (CONNECT,)),
    WILL_DELAY: ("Will Delay Interval", U32, (WILL,)),
    REQUEST_RESPONSE_INFO: ("Request Response Information", BYTE, (CONNECT,)),
    RESPONSE_INFO: ("Response Information", STRING, (CONNACK,)),
    SERVER_REFERENCE: ("Server Reference", STRING, (CONNACK, DISCONNECT)),
    REASON_STRING: ("Reason String", STRING,
                    (CONNACK, *_ACKS, SUBACK, UNSUBACK, DISCONNECT, AUTH)),
    RECEIVE_MAXIMUM: ("Receive Maximum", U16, (CONNECT, CONNACK)),
    TOPIC_ALIAS_MAXIMUM: ("Topic Alias Maximum", U16, (CONNECT, CONNACK)),
    TOPIC_ALIAS: ("Topic Alias", U16, (PUBLISH,)),
    MAXIMUM_QOS: ("Maximum QoS", BYTE, (CONNACK,)),
    RETAIN_AVAILABLE: ("Retain Available", BYTE, (CONNACK,)),
    USER_PROPERTY: ("User Property", PAIR, (CONNECT, CONNACK, *_PUB, *_ACKS, SUBSCRIBE, SUBACK,
                                            UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH)),
    MAXIMUM_PACKET_SIZE: ("Maximum Packet Size", U32, (CONNECT, CONNACK)),
    WILDCARD_SUB_AVAILABLE: ("Wildcard Subscription Available", BYTE, (CONNACK,)),
    SUB_ID_AVAILABLE: ("Subscription Identifier Available", BYTE, (CONNACK,)),
    SHARED_SUB_AVAILABLE: ("Shared Subscription Available", BYTE, (CONNACK,)),
}



def repeatable(ident: int, where) -> bool:
    """Whether a property may appear more than once: User Property anywhere, Subscription
    Identifier in a PUBLISH (one per matching subscription, section 3.3.4)."""
    return ident == USER_PROPERTY or (ident == SUBSCRIPTION_ID and where == PUBLISH)


# The reason codes each packet may carry (section 2.4 and each packet's table).
_PUB_ERRORS = (0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)
REASON_CODES = {
    CONNACK: frozenset((0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A,
                        0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)),
    PUBACK: frozenset((0x00, 0x10, *_PUB_ERRORS)),
    PUBREC: frozenset((0x00, 0x10, *_PUB_ERRORS)),
    PUBREL: frozenset((0x00, 0x92)),
    PUBCOMP: frozenset((0x00, 0x92)),
    SUBACK: frozenset((0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)),
    UNSUBACK: frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)),
    # Table 3-10, and 0x8C (Bad authentication method), which section 2.4 gives DISCONNECT.
    DISCONNECT: frozenset((0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8C, 0x8D,
                           0x8E, 0x8F, 0x90, *range(0x93, 0xA3))),
    AUTH: frozenset((0x00, 0x18, 0x19)),
}

# Subscription options (section 3.8.3.1), beside the maximum QoS in bits 0-1.
NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08


def retain_handling(n: int) -> int:
    return n << 4


def u16(n: int) -> bytes:
    return struct.pack("!H", n)


def u32(n: int) -> bytes:
    return struct.pack("!I", n)


def prop(ident: int, value, kind: str | None = None) -> bytes:
    """One property: its identifier (a variable byte integer) and ``value`` encoded as the
    property's type, or as ``kind``. Strings may be given as bytes, sent as they are; a string
    pair is (name, value)."""
    if kind is None:
        kind = PROPERTIES[ident][1]
    head = varint(ident)
    if kind == BYTE:
        return head + bytes((value,))
    if kind == U16:
        return head + u16(value)
    if kind == U32:
        return head + u32(value)
    if kind == VARINT:
        return head + varint(value)
    if kind == PAIR:
        name, text = value
        return head + mqtt_str(name) + mqtt_str(text)
    return head + mqtt_str(value)  # STRING, BINARY


def _items(items):
    """(identifier, value) pairs from a dict (a list value of User Property or Subscription
    Identifier gives one property each) or from a list of pairs, as they are."""
    if isinstance(items, dict):
        for ident, value in items.items():
            if ident in (USER_PROPERTY, SUBSCRIPTION_ID) and isinstance(value, list):
                for one in value:
                    yield ident, one
            else:
                yield ident, value
    else:
        yield from items


def props_raw(body: bytes = b"", length: int | None = None) -> bytes:
    """A property section holding ``body`` as it is; ``length`` may lie about its size."""
    return varint(len(body) if length is None else length) + body


def props(items=None) -> bytes:
    """A property section from a dict or a list of (identifier, value) pairs."""
    if not items:
        return b"\x00"
    return props_raw(b"".join(prop(i, v) for i, v in _items(items)))


def section(p) -> bytes:
    """A builder's ``props`` argument as the bytes of a property section."""
    return p if isinstance(p, (bytes, bytearray)) else props(p)


# ---------------------------------------------------------------------------------------------
# Packet builders
# ---------------------------------------------------------------------------------------------

def connect5(client_id: str | bytes = "", clean_start: bool = True, keepalive: int = 60,
             props=None, will=None, username: str | bytes | None = None,
             password: str | bytes | None = None, flags_override: int | None = None,
             proto_name: bytes = b"MQTT", level: int = 5, header_flags: int = 0) -> bytes:
    """CONNECT (section 3.1). ``will``: (topic, payload[, qos[, retain[, will props]]])."""
    if will is not None:
        topic, message, qos, retain = (*will[:4], 0, False)[:4]
        will = (topic, message, qos, retain, section(will[4] if len(will) > 4 else None))
    return mqttraw.connect(client_id, clean_start, keepalive, will, username, password,
                           proto_name, level, flags_override, header_flags, section(props))


def connack5(session_present: bool = False, reason: int = 0, props=None,
             ack_flags: int | None = None) -> bytes:
    flags = (1 if session_present else 0) if ack_flags is None else ack_flags
    return packet(CONNACK, 0, bytes((flags, reason)) + section(props))


def publish5(topic: str | bytes, payload: str | bytes = b"", qos: int = 0, retain: bool = False,
             dup: bool = False, packet_id: int | None = None, props=None,
             flags: int | None = None) -> bytes:
    """PUBLISH (section 3.3): topic, packet identifier (QoS > 0; 1 unless given), properties,
    payload. ``flags`` overrides the four flag bits."""
    if flags is None:
        flags = (0x08 if dup else 0) | (qos & 3) << 1 | (0x01 if retain else 0)
    body = mqtt_str(topic)
    if packet_id is None and qos > 0:
        packet_id = 1
    if packet_id is not None:
        body += u16(packet_id)
    return packet(PUBLISH, flags, body + section(props) + to_bytes(payload))


def _ack(ptype: int, flags: int, packet_id: int, reason: int | None, props) -> bytes:
    body = u16(packet_id)
    if reason is not None or props is not None:
        body += bytes((reason or 0,))
        if props is not None:
            body += section(props)
    return packet(ptype, flags, body)


def puback5(packet_id: int, reason: int | None = None, props=None, flags: int = 0) -> bytes:
    """PUBACK (section 3.4): remaining length 2 when ``reason`` and ``props`` are None, 3 with
    a reason code alone, more with properties (PUBREC, PUBREL, PUBCOMP alike)."""
    return _ack(PUBACK, flags, packet_id, reason, props)


def pubrec5(packet_id: int, reason: int | None = None, props=None, flags: int = 0) -> bytes:
    return _ack(PUBREC, flags, packet_id, reason, props)


def pubrel5(packet_id: int, reason: int | None = None, props=None, flags: int = 0x02) -> bytes:
    return _ack(PUBREL, flags, packet_id, reason, props)


def pubcomp5(packet_id: int, reason: int | None = None, props=None, flags: int = 0) -> bytes:
    return _ack(PUBCOMP, flags, packet_id, reason, props)


def subscribe5(packet_id: int, topics, props=None, flags: int = 0x02) -> bytes:
    """SUBSCRIBE (section 3.8). ``topics``: filters, or (filter, options byte) sent as given."""
    body = u16(packet_id) + section(props)
    for t in topics:
        flt, options = (t, 0) if isinstance(t, (str, bytes)) else t
        body += mqtt_str(flt) + bytes((options & 0xFF,))
    return packet(SUBSCRIBE, flags, body)


def suback5(packet_id: int, codes=(0,), props=None) -> bytes:
    return packet(SUBACK, 0, u16(packet_id) + section(props) + bytes(codes))


def unsubscribe5(packet_id: int, filters, props=None, flags: int = 0x02) -> bytes:
    return packet(UNSUBSCRIBE, flags,
                  u16(packet_id) + section(props) + b"".join(mqtt_str(f) for f in filters))


def unsuback5(packet_id: int, codes=(0,), props=None) -> bytes:
    return packet(UNSUBACK, 0, u16(packet_id) + section(props) + bytes(codes))


def _reasoned(ptype: int, reason: int | None, props, flags: int) -> bytes:
    body = b""
    if reason is not None or props is not None:
        body = bytes((reason or 0,))
        if props is not None:
            body += section(props)
    return packet(ptype, flags, body)


def disconnect5(reason: int | None = None, props=None, flags: int = 0) -> bytes:
    """DISCONNECT (section 3.14): remaining length 0 when ``reason`` and ``props`` are None, 1
    with a reason code alone (AUTH alike)."""
    return _reasoned(DISCONNECT, reason, props, flags)


def auth5(reason: int | None = None, props=None, flags: int = 0) -> bytes:
    return _reasoned(AUTH, reason, props, flags)


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

NAMES = dict(mqttraw.NAMES)
NAMES[AUTH] = "AUTH"
_WHERE = {WILL: "will properties"}


def read_varint(b: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    for i in range(4):
        if pos >= end:
            raise MalformedPacket("variable byte integer runs past the end")
        byte = b[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def _read_field(b: bytes, pos: int, end: int, what: str) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket(f"{what}: length runs past the end")
    (n,) = struct.unpack_from("!H", b, pos)
    if pos + 2 + n > end:
        raise MalformedPacket(f"{what}: {n} bytes run past the end")
    return bytes(b[pos + 2:pos + 2 + n]), pos + 2 + n


def _read_str(b: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    raw, pos = _read_field(b, pos, end, what)
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError as e:
        raise MalformedPacket(f"{what}: not UTF-8 ({e})") from None


def _fixed(b: bytes, pos: int, end: int, n: int, what: str) -> int:
    if pos + n > end:
        raise MalformedPacket(f"{what} runs past the end")
    return int.from_bytes(b[pos:pos + n], "big")


def parse_properties(b: bytes, pos: int, end: int, where) -> tuple[dict, int]:
    """The property section at ``b[pos]`` of a ``where`` (packet type or WILL): (dict, the
    position after it). Strict: see the module doc."""
    label = _WHERE.get(where) or f"{NAMES[where]} properties"
    length, pos = read_varint(b, pos, end)
    stop = pos + length
    if stop > end:
        raise MalformedPacket(f"{label}: length {length} runs past the end")
    out: dict = {}
    while pos < stop:
        ident, pos = read_varint(b, pos, stop)
        if ident not in PROPERTIES:
            raise MalformedPacket(f"{label}: unknown identifier {ident:#04x}")
        name, kind, allowed = PROPERTIES[ident]
        if where not in allowed:
            raise MalformedPacket(f"{label}: {name} does not belong there")
        if kind == BYTE:
            value, pos = _fixed(b, pos, stop, 1, name), pos + 1
        elif kind == U16:
            value, pos = _fixed(b, pos, stop, 2, name), pos + 2
        elif kind == U32:
            value, pos = _fixed(b, pos, stop, 4, name), pos + 4
        elif kind == VARINT:
            value, pos = read_varint(b, pos, stop)
        elif kind == STRING:
            value, pos = _read_str(b, pos, stop, name)
        elif kind == BINARY:
            value, pos = _read_field(b, pos, stop, name)
        else:
            key, pos = _read_str(b, pos, stop, f"{name} name")
            text, pos = _read_str(b, pos, stop, f"{name} value")
            value = (key, text)
        if repeatable(ident, where):
            out.setdefault(ident, []).append(value)
        elif ident in out:
            raise MalformedPacket(f"{label}: {name} given twice")
        else:
            out[ident] = value
    return out, stop


class Packet5(mqttraw.Packet):
    """One decoded 5.0 packet: ``type``, ``flags``, ``body`` and, per type:

    CONNECT: ``protocol_name``, ``level``, ``connect_flags``, ``clean_start``, ``keepalive``,
    ``properties``, ``client_id``, ``will`` (None or (topic, payload, qos, retain, properties)),
    ``username``, ``password``; CONNACK: ``session_present``, ``ack_flags``, ``reason`` (also
    ``rc``), ``properties``; PUBLISH: ``topic``, ``packet_id``, ``properties``, ``payload``,
    ``qos``, ``retain``, ``dup``; PUBACK/PUBREC/PUBREL/PUBCOMP: ``packet_id``, ``reason`` (0
    when left out), ``properties``; SUBSCRIBE: ``packet_id``, ``properties``, ``topics``
    ((filter, options) pairs); SUBACK/UNSUBACK: ``packet_id``, ``properties``, ``codes``;
    UNSUBSCRIBE: ``packet_id``, ``properties``, ``filters``; DISCONNECT/AUTH: ``reason``,
    ``properties``. ``properties`` is a dict, empty when there are none.
    """

    def __init__(self, ptype: int, flags: int, body: bytes):
        self.properties = {}
        self.reason = None
        super().__init__(ptype, flags, body)

    @property
    def name(self) -> str:
        return NAMES.get(self.type, str(self.type))

    def _parse(self):
        b = self.body
        end = len(b)
        t = self.type
        if t == CONNECT:
            self._parse_connect(b, end)
        elif t == CONNACK:
            if end < 3:
                raise MalformedPacket(f"CONNACK with {end} bytes (a 5.0 one has at least 3)")
            self.ack_flags = b[0]
            self.session_present = bool(b[0] & 0x01)
            self.reason = self.rc = b[1]
            self.properties, pos = parse_properties(b, 2, end, CONNACK)
            self._at_end(pos)
        elif t == PUBLISH:
            self.dup = bool(self.flags & 0x08)
            self.qos = (self.flags >> 1) & 0x03
            self.retain = bool(self.flags & 0x01)
            self.topic, pos = _read_str(b, 0, end, "PUBLISH topic")
            if self.qos > 0:
                self.packet_id, pos = _fixed(b, pos, end, 2, "packet identifier"), pos + 2
            self.properties, pos = parse_properties(b, pos, end, PUBLISH)
            self.payload = b[pos:]
        elif t in _ACKS:
            self.packet_id = _fixed(b, 0, end, 2, "packet identifier")
            self.reason = b[2] if end > 2 else 0
            if end > 3:
                self.properties, pos = parse_properties(b, 3, end, t)
                self._at_end(pos)
        elif t in (SUBSCRIBE, UNSUBSCRIBE, SUBACK, UNSUBACK):
            self.packet_id = _fixed(b, 0, end, 2, "packet identifier")
            self.properties, pos = parse_properties(b, 2, end, t)
            if t == SUBACK or t == UNSUBACK:
                self.codes = list(b[pos:])
            elif t == SUBSCRIBE:
                self.topics = []
                while pos < end:
                    flt, pos = _read_str(b, pos, end, "topic filter")
                    self.topics.append((flt, _fixed(b, pos, end, 1, "options")))
                    pos += 1
            else:
                self.filters = []
                while pos < end:
                    flt, pos = _read_str(b, pos, end, "topic filter")
                    self.filters.append(flt)
        elif t in (DISCONNECT, AUTH):
            self.reason = b[0] if end else 0
            if end > 1:
                self.properties, pos = parse_properties(b, 1, end, t)
                self._at_end(pos)
        elif t in (PINGREQ, PINGRESP):
            self._at_end(0)

    def _at_end(self, pos: int) -> None:
        if pos != len(self.body):
            raise MalformedPacket(f"{self.name}: {len(self.body) - pos} bytes after the end")

    def _parse_connect(self, b: bytes, end: int) -> None:
        name, pos = _read_field(b, 0, end, "protocol name")
        self.protocol_name = name
        self.level = _fixed(b, pos, end, 1, "protocol level")
        flags = self.connect_flags = _fixed(b, pos + 1, end, 1, "connect flags")
        self.clean_start = bool(flags & 0x02)
        self.keepalive = _fixed(b, pos + 2, end, 2, "keep alive")
        self.properties, pos = parse_properties(b, pos + 4, end, CONNECT)
        self.client_id, pos = _read_str(b, pos, end, "client identifier")
        self.will = self.username = self.password = None
        if flags & 0x04:
            will_props, pos = parse_properties(b, pos, end, WILL)
            topic, pos = _read_str(b, pos, end, "will topic")
            message, pos = _read_field(b, pos, end, "will payload")
            self.will = (topic, message, flags >> 3 & 3, bool(flags & 0x20), will_props)
        if flags & 0x80:
            self.username, pos = _read_str(b, pos, end, "user name")
        if flags & 0x40:
            self.password, pos = _read_field(b, pos, end, "password")
        self._at_end(pos)

    def __repr__(self) -> str:
        extra = f" props={self.properties}" if self.properties else ""
        if self.type == PUBLISH:
            return (f"<PUBLISH topic={self.topic!r} payload={self.payload[:60]!r} qos={self.qos} "
                    f"retain={int(self.retain)} dup={int(self.dup)} pid={self.packet_id}{extra}>")
        if self.type in (SUBACK, UNSUBACK):
            return f"<{self.name} pid={self.packet_id} codes={self.codes}{extra}>"
        if self.type == CONNACK:
            return f"<CONNACK sp={int(self.session_present)} reason={self.reason:#04x}{extra}>"
        if self.reason is not None:
            pid = f" pid={self.packet_id}" if self.packet_id is not None else ""
            return f"<{self.name}{pid} reason={self.reason:#04x}{extra}>"
        return f"<{self.name} flags={self.flags:#x} body={self.body!r}>"


def parse(frame: bytes) -> Packet5:
    """Exactly one complete frame as a Packet5 (MalformedPacket if it is more or less)."""
    buf = bytearray(frame)
    found = split_frames5(buf)
    if len(found) != 1 or buf:
        raise MalformedPacket(f"not one frame: {len(found)} frames and {len(buf)} bytes more")
    return found[0]


def split_frames5(buf: bytearray) -> list[Packet5]:
    """Remove and decode every complete frame at the start of ``buf``."""
    return mqttraw.split_frames(buf, Packet5)


# ---------------------------------------------------------------------------------------------
# A blocking 5.0 client over a plain socket
# ---------------------------------------------------------------------------------------------

class RawClient5(mqttraw.RawClient):
    """``mqttraw.RawClient`` speaking 5.0: received frames are Packet5 objects, and the MQTT
    helpers send 5.0 packets (each takes ``props``, see the module doc)."""

    packet_class = Packet5

    def connect(self, client_id: str | bytes = "", timeout: float = 5.0, **kw) -> Packet5:
        """Send a 5.0 CONNECT (``kw``: see connect5) and return the CONNACK, whatever its
        reason code."""
        self.client_id = client_id
        self.send(connect5(client_id, **kw))
        return self.expect(CONNACK, timeout)

    def subscribe(self, *topics, qos: int = 0, props=None, timeout: float = 5.0) -> Packet5:
        """SUBSCRIBE (strings take ``qos`` as their options; tuples give their options byte);
        the SUBACK."""
        pid = self.next_pid()
        items = [(t, qos) if isinstance(t, (str, bytes)) else t for t in topics]
        self.send(subscribe5(pid, items, props))
        return self._reply(SUBACK, pid, timeout)

    def unsubscribe(self, *filters, props=None, timeout: float = 5.0) -> Packet5:
        pid = self.next_pid()
        self.send(unsubscribe5(pid, filters, props))
        return self._reply(UNSUBACK, pid, timeout)

    def _reply(self, ptype: int, pid: int, timeout: float) -> Packet5:
        p = self.wait_for(lambda p: p.type == ptype, timeout)
        assert p.packet_id == pid, f"{p!r} for packet id {p.packet_id}, expected {pid}"
        return p

    def publish(self, topic, payload=b"", qos: int = 0, retain: bool = False, props=None,
                timeout: float = 5.0) -> Packet5 | None:
        """Publish and complete the QoS 1/2 exchange. Returns the acknowledgement that ends it
        (PUBACK; PUBREC when its reason code is 0x80 or more, else PUBCOMP), None for QoS 0."""
        if qos == 0:
            self.send(publish5(topic, payload, 0, retain, props=props))
            return None
        pid = self.next_pid()
        self.send(publish5(topic, payload, qos, retain, packet_id=pid, props=props))
        if qos == 1:
            return self.wait_for(lambda p: p.type == PUBACK and p.packet_id == pid, timeout)
        rec = self.wait_for(lambda p: p.type == PUBREC and p.packet_id == pid, timeout)
        if rec.reason >= 0x80:
            return rec
        self.send(pubrel5(pid))
        return self.wait_for(lambda p: p.type == PUBCOMP and p.packet_id == pid, timeout)

    def ack(self, p: Packet5, timeout: float = 5.0, reason: int | None = None) -> None:
        """Acknowledge a received PUBLISH (``reason``: the PUBACK's or PUBREC's reason code)."""
        if p.qos == 1:
            self.send(puback5(p.packet_id, reason))
        elif p.qos == 2:
            self.send(pubrec5(p.packet_id, reason))
            if reason is not None and reason >= 0x80:
                return
            self.wait_for(lambda q: q.type == PUBREL and q.packet_id == p.packet_id, timeout)
            self.send(pubcomp5(p.packet_id))

    def auth(self, reason: int | None = None, props=None) -> None:
        self.send(auth5(reason, props))

    def disconnect(self, reason: int | None = None, props=None) -> None:
        """DISCONNECT (a reason code and properties if given) then close."""
        try:
            self.send(disconnect5(reason, props))
        except OSError:
            pass
        self.close()

    def expect_disconnect(self, timeout: float = 5.0) -> Packet5:
        """The DISCONNECT the server sends before it closes the connection (AssertionError when
        it does not close within ``timeout`` s, or closes without one)."""
        assert self.expect_closed(timeout), "server did not close the connection"
        found = [p for p in self.before_close if p.type == DISCONNECT]
        assert found, f"closed without a DISCONNECT (got {self.before_close})"
        return found[-1]
