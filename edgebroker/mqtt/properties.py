"""MQTT 5.0 properties (section 2.2.2): their identifiers, types, the packets each may appear
in, and their decoding and encoding, with no I/O.

A packet's properties are a ``dict`` from identifier to value, in the order they came, or
None when there are none (most packets). Values: ``int`` for the integer types, ``str`` for
strings, ``bytes`` for binary data; User Property (0x26) is a list of (name, value) pairs, in
order; Subscription Identifier (0x0B) is a list of ints in a PUBLISH (a server sends one per
matching subscription) and one int in a SUBSCRIBE.

Rules the decoder applies (each error names the rule): an identifier unknown, or not allowed
in the packet, or a value running past the end, makes the packet malformed (section 2.2.2.2);
a property given twice where only User Property and a PUBLISH's Subscription Identifiers may
repeat, a byte flag other than 0 or 1, a zero where zero has no meaning (Receive Maximum,
Maximum Packet Size, Topic Alias, Subscription Identifier) and a Response Topic with a
wildcard character are protocol errors.
"""

from __future__ import annotations

from itertools import chain

from edgebroker.errors import TOPIC_ALIAS_INVALID
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.fields import (
    DISCOURAGED, malformed, protocol_error, read_binary, read_str, read_u16, read_u32,
    read_varint,
)

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

# Value types (section 1.5).
BYTE, U16, U32, VARINT, STRING, BINARY, PAIR = range(7)

# Where the will's properties sit (not a packet type: 0 is reserved).
WILL = 0
_ACKS = (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP)

# identifier -> (name, type, the packets it may appear in)
PROPERTIES: dict[int, tuple[str, int, frozenset]] = {
    PAYLOAD_FORMAT: ("Payload Format Indicator", BYTE, frozenset((P.PUBLISH, WILL))),
    MESSAGE_EXPIRY: ("Message Expiry Interval", U32, frozenset((P.PUBLISH, WILL))),
    CONTENT_TYPE: ("Content Type", STRING, frozenset((P.PUBLISH, WILL))),
    RESPONSE_TOPIC: ("Response Topic", STRING, frozenset((P.PUBLISH, WILL))),
    CORRELATION_DATA: ("Correlation Data", BINARY, frozenset((P.PUBLISH, WILL))),
    SUBSCRIPTION_ID: ("Subscription Identifier", VARINT, frozenset((P.PUBLISH, P.SUBSCRIBE))),
    SESSION_EXPIRY: ("Session Expiry Interval", U32,
                     frozenset((P.CONNECT, P.CONNACK, P.DISCONNECT))),
    ASSIGNED_CLIENT_ID: ("Assigned Client Identifier", STRING, frozenset((P.CONNACK,))),
    SERVER_KEEP_ALIVE: ("Server Keep Alive", U16, frozenset((P.CONNACK,))),
    AUTH_METHOD: ("Authentication Method", STRING, frozenset((P.CONNECT, P.CONNACK, P.AUTH))),
    AUTH_DATA: ("Authentication Data", BINARY, frozenset((P.CONNECT, P.CONNACK, P.AUTH))),
    REQUEST_PROBLEM_INFO: ("Request Problem Information", BYTE, frozenset((P.CONNECT,))),
    WILL_DELAY: ("Will Delay Interval", U32, frozenset((WILL,))),
    REQUEST_RESPONSE_INFO: ("Request Response Information", BYTE, frozenset((P.CONNECT,))),
    RESPONSE_INFO: ("Response Information", STRING, frozenset((P.CONNACK,))),
    SERVER_REFERENCE: ("Server Reference", STRING, frozenset((P.CONNACK, P.DISCONNECT))),
    REASON_STRING: ("Reason String", STRING, frozenset((
        P.CONNACK, *_ACKS, P.SUBACK, P.UNSUBACK, P.DISCONNECT, P.AUTH))),
    RECEIVE_MAXIMUM: ("Receive Maximum", U16, frozenset((P.CONNECT, P.CONNACK))),
    TOPIC_ALIAS_MAXIMUM: ("Topic Alias Maximum", U16, frozenset((P.CONNECT, P.CONNACK))),
    TOPIC_ALIAS: ("Topic Alias", U16, frozenset((P.PUBLISH,))),
    MAXIMUM_QOS: ("Maximum QoS", BYTE, frozenset((P.CONNACK,))),
    RETAIN_AVAILABLE: ("Retain Available", BYTE, frozenset((P.CONNACK,))),
    USER_PROPERTY: ("User Property", PAIR, frozenset((
        P.CONNECT, P.CONNACK, P.PUBLISH, WILL, *_ACKS, P.SUBSCRIBE, P.SUBACK, P.UNSUBSCRIBE,
        P.UNSUBACK, P.DISCONNECT, P.AUTH))),
    MAXIMUM_PACKET_SIZE: ("Maximum Packet Size", U32, frozenset((P.CONNECT, P.CONNACK))),
    WILDCARD_SUB_AVAILABLE: ("Wildcard Subscription Available", BYTE, frozenset((P.CONNACK,))),
    SUB_ID_AVAILABLE: ("Subscription Identifier Available", BYTE, frozenset((P.CONNACK,))),
    SHARED_SUB_AVAILABLE: ("Shared Subscription Available", BYTE, frozenset((P.CONNACK,))),
}

# Byte properties whose only values are 0 and 1.
_FLAGS = frozenset((PAYLOAD_FORMAT, REQUEST_PROBLEM_INFO, REQUEST_RESPONSE_INFO, MAXIMUM_QOS,
                    RETAIN_AVAILABLE, WILDCARD_SUB_AVAILABLE, SUB_ID_AVAILABLE,
                    SHARED_SUB_AVAILABLE))
# Integer properties for which 0 is a protocol error, with the rule that says so.
_NOT_ZERO = {RECEIVE_MAXIMUM: "MQTT-3.1.2.11.3", MAXIMUM_PACKET_SIZE: "MQTT-3.1.2.11.4",
             TOPIC_ALIAS: "MQTT-3.3.2-8", SUBSCRIPTION_ID: "MQTT-3.8.2.1.2"}
MAX_VARINT = 268_435_455


def where_name(where: int) -> str:
    return "will properties" if where == WILL else f"{P.NAMES[where]} properties"


def decode_properties(buf: bytes, p: int, end: int, where: int) -> tuple[dict | None, int]:
    """The property section at ``buf[p]`` (its length, then the properties) of a packet of
    type ``where`` (or ``WILL``): (properties or None, position after the section)."""
    if p < end and buf[p] == 0:  # no properties: the usual case
        return None, p + 1
    what = where_name(where)
    length, p = read_varint(buf, p, end, f"{what} length")
    stop = p + length
    if stop > end:
        raise malformed(f"{what} ({length} bytes) run past the end of the packet")
    props: dict = {}
    runs = where in _USER_ALLOWED
    while p < stop:
        ident = buf[p]
        if ident == USER_PROPERTY and runs:
            pairs, q = _user_properties(buf, p, stop)
            if q != p:
                if USER_PROPERTY in props:
                    props[USER_PROPERTY].extend(pairs)
                else:
                    props[USER_PROPERTY] = pairs
                p = q
                continue
            # A string of the run is not valid: the rest of the section is decoded one
            # property at a time, which says what is wrong (trying the run again after each
            # pair would cost the square of their number).
            runs = False
        if ident >= 0x80:  # identifiers are variable byte integers; none needs two bytes
            ident, p = read_varint(buf, p, stop, f"{what} identifier")
        else:
            p += 1
        spec = PROPERTIES.get(ident)
        if spec is None:
            raise malformed(f"{what} hold an unknown property identifier {ident:#04x}",
                            rule="MQTT-2.2.2.2")
        name, kind, allowed = spec
        if where not in allowed:
            raise malformed(f"{what} hold {name} ({ident:#04x}), which that packet does not "
                            f"carry", rule="MQTT-2.2.2.2")
        label = f"{what}: {name}"
        if kind == BYTE:
            if p >= stop:
                raise malformed(f"{label} runs past the end of the properties")
            value = buf[p]
            p += 1
        elif kind == U16:
            value = read_u16(buf, p, stop, label)
            p += 2
        elif kind == U32:
            value = read_u32(buf, p, stop, label)
            p += 4
        elif kind == VARINT:
            value, p = read_varint(buf, p, stop, label)
        elif kind == STRING:
            value, p = read_str(buf, p, stop, label)
        elif kind == BINARY:
            value, p = read_binary(buf, p, stop, label)
        else:
            key, p = read_str(buf, p, stop, f"{label} name")
            value, p = read_str(buf, p, stop, f"{label} value")
            props.setdefault(USER_PROPERTY, []).append((key, value))
            continue
        if ident in _FLAGS and value > 1:
            raise protocol_error(f"{label} is {value} (must be 0 or 1)", "MQTT-2.2.2.2")
        if value == 0 and ident in _NOT_ZERO:
            error = protocol_error(f"{label} is 0", _NOT_ZERO[ident])
            if ident == TOPIC_ALIAS:  # answered as an alias past the maximum is (Mosquitto too)
                error.reason = TOPIC_ALIAS_INVALID
            raise error
        if ident == RESPONSE_TOPIC and ("+" in value or "#" in value):
            raise protocol_error(f"{label} {value!r} contains a wildcard character",
                                 "MQTT-3.3.2-14")
        if ident == SUBSCRIPTION_ID and where == P.PUBLISH:
            props.setdefault(SUBSCRIPTION_ID, []).append(value)
            continue
        if ident in props:
            raise protocol_error(f"{label} given more than once", "MQTT-2.2.2.2")
        props[ident] = value
    return props or None, p


_USER_ALLOWED = PROPERTIES[USER_PROPERTY][2]


def _user_properties(buf: bytes, p: int, stop: int) -> tuple[list, int]:
    """The run of User Properties at ``buf[p]`` (identifier, name, value; again, up to
    ``stop``): (their pairs, the position after them). Each string is checked as ``read_str``
    checks it, the code points of all at once, so that a packet of many costs little more
    than its bytes. The run ends before a pair that runs past ``stop``; when a string of it
    is not valid, nothing is taken (``p`` back): the caller decodes one property at a time
    and names what is wrong."""
    # Positions in ``buf`` itself: a copy of the rest of the properties for each run cost a
    # packet alternating User Properties with another property the square of its size.
    cuts: list[int] = []     # for each pair: where its name ends, where its value ends
    add = cuts.append
    q = p
    try:
        while q < stop and buf[q] == USER_PROPERTY:
            b = q + 3 + (buf[q + 1] << 8 | buf[q + 2])
            d = b + 2 + (buf[b] << 8 | buf[b + 1])
            if d > stop:
                break
            add(b)
            add(d)
            q = d
    except IndexError:      # a length past the end: that pair is not part of the run
        pass
    if not cuts:
        return [], p
    try:
        pairs = [(buf[a + 3:b].decode("utf-8"), buf[b + 2:d].decode("utf-8"))
                 for a, b, d in zip([p] + cuts[1:-1:2], cuts[::2], cuts[1::2])]
    except UnicodeDecodeError:
        return [], p
    whole = " ".join(chain.from_iterable(pairs))  # no check spans a join: single code points
    if "\x00" in whole or DISCOURAGED.search(whole) is not None:
        return [], p
    return pairs, q


def _varint(n: int) -> bytes:
    if not 0 <= n <= MAX_VARINT:
        raise ValueError(f"variable byte integer out of range: {n}")
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        if n:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def varint(n: int) -> bytes:
    """A variable byte integer (section 1.5.5)."""
    return _VARINT1[n] if 0 <= n < 128 else _varint(n)


_VARINT1 = [bytes((i,)) for i in range(128)]


def _string(text: str) -> bytes:
    return _binary(text.encode("utf-8"))


def _binary(raw: bytes) -> bytes:
    if len(raw) > 0xFFFF:
        raise ValueError(f"property field of {len(raw)} bytes does not fit a 2-byte length")
    return len(raw).to_bytes(2, "big") + raw


def _one(ident: int, kind: int, value) -> bytes:
    head = bytes((ident,))
    if kind == BYTE:
        return head + bytes((value,))
    if kind == U16:
        return head + value.to_bytes(2, "big")
    if kind == U32:
        return head + value.to_bytes(4, "big")
    if kind == VARINT:
        return head + varint(value)
    if kind == STRING:
        return head + _string(value)
    return head + _binary(bytes(value))


def encode_body(props: dict | None) -> bytes:
    """The properties themselves, without the length in front."""
    if not props:
        return b""
    parts = []
    for ident, value in props.items():
        kind = PROPERTIES[ident][1]
        if kind == PAIR:
            parts.extend(bytes((ident,)) + _string(k) + _string(v) for k, v in value)
        elif isinstance(value, list):  # a PUBLISH's Subscription Identifiers
            parts.extend(_one(ident, kind, v) for v in value)
        else:
            parts.append(_one(ident, kind, value))
    return b"".join(parts)


def decode_body(body, where: int = P.PUBLISH) -> dict | None:
    """Properties kept without their length in front (``encode_body``'s output, as the commit
    log stores a message's: docs/log-format.md), decoded as ``decode_properties`` does, with
    its errors (ProtocolError naming what is wrong); None for none."""
    if not body:
        return None
    buf = varint(len(body)) + bytes(body)
    return decode_properties(buf, 0, len(buf), where)[0]


def encode_properties(props: dict | None) -> bytes:
    """The property section: its length, then the properties."""
    if not props:
        return b"\x00"
    body = encode_body(props)
    return varint(len(body)) + body


def payload_utf8_error(payload, what: str = "PUBLISH payload") -> str | None:
    """With Payload Format Indicator 1 the payload is UTF-8 character data (section
    3.3.2.3.2): what is wrong with it, or None. Only well-formedness is checked: line breaks
    and other control characters are ordinary in text payloads (JSON, CSV)."""
    try:
        bytes(payload).decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{what} is not well-formed UTF-8 at byte {exc.start}"
    return None
