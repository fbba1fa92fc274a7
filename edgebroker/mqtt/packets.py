"""MQTT control packets as plain objects (no I/O, no encoding here).

Field names follow the 3.1.1 specification; the fields only MQTT 5.0 has (reason codes,
``properties``: see mqtt/properties.py) keep their defaults (0, None) in 3.1.1 packets.
Strings are ``str`` (already validated UTF-8); binary fields (payloads, passwords) are
``bytes``.
"""

from __future__ import annotations

# Control packet types (fixed header, high nibble of the first byte).
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15  # MQTT 5.0 only

MAX_REMAINING_LENGTH = 268435455  # four bytes of variable-length integer
MAX_PACKET_SIZE = MAX_REMAINING_LENGTH + 5

NAMES = {
    CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK",
    PUBREC: "PUBREC", PUBREL: "PUBREL", PUBCOMP: "PUBCOMP", SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK", UNSUBSCRIBE: "UNSUBSCRIBE", UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ", PINGRESP: "PINGRESP", DISCONNECT: "DISCONNECT", AUTH: "AUTH",
}

# Packets only a server may send; a server receiving one closes the connection.
SERVER_TO_CLIENT_ONLY = frozenset({CONNACK, SUBACK, UNSUBACK, PINGRESP})

SUBACK_FAILURE = 0x80

# MQTT 5.0 subscription options (section 3.8.3.1), beside the QoS in the low two bits.
SUB_NO_LOCAL = 0x04
SUB_RETAIN_AS_PUBLISHED = 0x08
SUB_RETAIN_HANDLING = 0x30  # >> 4: 0 send retained, 1 only if new, 2 never

PROTOCOL_311 = 4   # "MQTT", level 4
PROTOCOL_31 = 3    # "MQIsdp", level 3
PROTOCOL_5 = 5     # "MQTT", level 5


def _all_slots(cls) -> tuple[str, ...]:
    """Slot names of ``cls`` and its bases, base classes first."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        names.extend(klass.__dict__.get("__slots__", ()))
    return tuple(names)


class Packet:
    __slots__ = ()
    type: int = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._field_names = _all_slots(cls)

    def _fields(self):
        return tuple(getattr(self, name) for name in self._field_names)

    def __eq__(self, other):
        return type(self) is type(other) and self._fields() == other._fields()

    def __hash__(self):
        return hash((type(self), tuple(f for f in self._fields() if type(f) is not dict
                                       and type(f) is not list)))

    def __repr__(self):
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._field_names)
        return f"{type(self).__name__}({inner})"


class Will:
    __slots__ = ("topic", "payload", "qos", "retain", "properties")

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 properties: dict | None = None):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties

    def _key(self):
        return self.topic, self.payload, self.qos, self.retain, self.properties

    def __eq__(self, other):
        return isinstance(other, Will) and self._key() == other._key()

    def __hash__(self):
        return hash((self.topic, self.payload, self.qos, self.retain))

    def __repr__(self):
        props = f", properties={self.properties!r}" if self.properties else ""
        return (f"Will({self.topic!r}, {self.payload!r}, qos={self.qos}, retain={self.retain}"
                f"{props})")


class Connect(Packet):
    __slots__ = ("client_id", "clean_session", "keepalive", "will", "username", "password",
                 "protocol_level", "protocol_name", "properties", "bridge")
    type = CONNECT

    def __init__(self, client_id: str = "", clean_session: bool = True, keepalive: int = 60,
                 will: Will | None = None, username: str | None = None,
                 password: bytes | None = None, protocol_level: int = PROTOCOL_311,
                 protocol_name: str | None = None, properties: dict | None = None,
                 bridge: bool = False):
        self.client_id = client_id
        self.clean_session = clean_session
        self.keepalive = keepalive
        self.will = will
        self.username = username
        self.password = password
        self.protocol_level = protocol_level
        if protocol_name is None:
            protocol_name = "MQIsdp" if protocol_level == PROTOCOL_31 else "MQTT"
        self.protocol_name = protocol_name
        self.properties = properties
        # The bridge marker (Mosquitto's try_private): 0x80 on a 3.1/3.1.1 protocol level,
        # which ``protocol_level`` holds without it.
        self.bridge = bridge


class Connack(Packet):
    __slots__ = ("session_present", "return_code", "properties")
    type = CONNACK

    def __init__(self, session_present: bool = False, return_code: int = 0,
                 properties: dict | None = None):
        self.session_present = session_present
        self.return_code = return_code  # MQTT 5.0: the reason code
        self.properties = properties


class Publish(Packet):
    __slots__ = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
    type = PUBLISH

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int | None = None,
                 properties: dict | None = None):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties


class _IdOnly(Packet):
    """PUBACK, PUBREC, PUBREL, PUBCOMP: a packet identifier (and in 5.0 a reason code and
    properties)."""
    __slots__ = ("packet_id", "reason_code", "properties")

    def __init__(self, packet_id: int, reason_code: int = 0, properties: dict | None = None):
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


class Puback(_IdOnly):
    __slots__ = ()
    type = PUBACK


class Pubrec(_IdOnly):
    __slots__ = ()
    type = PUBREC


class Pubrel(_IdOnly):
    __slots__ = ()
    type = PUBREL


class Pubcomp(_IdOnly):
    __slots__ = ()
    type = PUBCOMP


class Unsuback(Packet):
    __slots__ = ("packet_id", "reason_codes", "properties")
    type = UNSUBACK

    def __init__(self, packet_id: int, reason_codes: list[int] | None = None,
                 properties: dict | None = None):
        self.packet_id = packet_id
        self.reason_codes = reason_codes  # MQTT 5.0 only: one per topic filter
        self.properties = properties


class Subscribe(Packet):
    """``topics``: (topic filter, subscription options byte). The byte's low two bits are the
    requested QoS, the rest is 0 in 3.1.1; in 5.0 bit 2 is No Local, bit 3 Retain As
    Published, bits 4-5 Retain Handling (``SUB_*`` below)."""
    __slots__ = ("packet_id", "topics", "properties")
    type = SUBSCRIBE

    def __init__(self, packet_id: int, topics: list[tuple[str, int]],
                 properties: dict | None = None):
        self.packet_id = packet_id
        self.topics = list(topics)
        self.properties = properties


class Suback(Packet):
    __slots__ = ("packet_id", "return_codes", "properties")
    type = SUBACK

    def __init__(self, packet_id: int, return_codes: list[int],
                 properties: dict | None = None):
        self.packet_id = packet_id
        self.return_codes = list(return_codes)  # MQTT 5.0: the reason codes
        self.properties = properties


class Unsubscribe(Packet):
    __slots__ = ("packet_id", "topics", "properties")
    type = UNSUBSCRIBE

    def __init__(self, packet_id: int, topics: list[str], properties: dict | None = None):
        self.packet_id = packet_id
        self.topics = list(topics)
        self.properties = properties


class _Empty(Packet):
    __slots__ = ()


class Pingreq(_Empty):
    __slots__ = ()
    type = PINGREQ


class Pingresp(_Empty):
    __slots__ = ()
    type = PINGRESP


class _Reasoned(Packet):
    """DISCONNECT and AUTH: in 5.0 a reason code and properties, both optional (0, None)."""
    __slots__ = ("reason_code", "properties")

    def __init__(self, reason_code: int = 0, properties: dict | None = None):
        self.reason_code = reason_code
        self.properties = properties


class Disconnect(_Reasoned):
    __slots__ = ()
    type = DISCONNECT


class Auth(_Reasoned):
    __slots__ = ()
    type = AUTH
