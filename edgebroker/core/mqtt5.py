"""What an MQTT 5.0 connection adds to a ``Client``: the limits its CONNECT set (the client's
Receive Maximum, Maximum Packet Size, Topic Alias Maximum, Request Problem Information), its
inbound topic aliases and Session Expiry Interval, and the broker's 5.0 answers: the
CONNACK's properties, refusals with reason codes, and DISCONNECTs the server sends.

A 3.1.1 connection has none of this (``Client.v5`` is None): its packets never reach the
code here. docs/protocol.md ("MQTT 5.0") says what the broker does where the specification
leaves a choice.
"""

from __future__ import annotations

from edgebroker import errors as E
from edgebroker.errors import ProtocolError
from edgebroker.mqtt import properties as Q
from edgebroker.mqtt.encode5 import encode_ack5, encode_connack5, encode_disconnect5

NEVER_EXPIRES = 0xFFFFFFFF

# A 3.1.1 CONNACK refusal code -> the 5.0 reason code that says the same.
CONNACK_REASONS = {
    1: E.UNSUPPORTED_PROTOCOL_VERSION, 2: E.CLIENT_ID_NOT_VALID, 3: E.SERVER_UNAVAILABLE,
    4: E.BAD_USERNAME_OR_PASSWORD, 5: E.NOT_AUTHORIZED,
}
# Limits that refuse a CONNECT (Sessions.admission) -> a more precise 5.0 reason code.
ADMISSION_REASONS = {
    "memory_limit": E.SERVER_BUSY, "max_connections": E.QUOTA_EXCEEDED,
    "listener_max_connections": E.QUOTA_EXCEEDED, "max_sessions": E.QUOTA_EXCEEDED,
}


class Told:
    """The broker's limits a 5.0 CONNACK announces (``Conn5.told``). (A plain class: the
    typing module's NamedTuple would cost the broker memory, tests/server/test_lazy_imports.)"""

    __slots__ = ("max_qos", "retain_available", "receive_maximum", "max_topic_alias")

    def __init__(self, max_qos: int, retain_available: bool, receive_maximum: int,
                 max_topic_alias: int):
        self.max_qos = max_qos
        self.retain_available = retain_available
        self.receive_maximum = receive_maximum
        self.max_topic_alias = max_topic_alias


class Conn5:
    """A 5.0 connection's own state (``Client.v5``)."""

    __slots__ = ("receive_maximum", "max_packet_size", "out_alias_maximum", "aliases",
                 "problem_info", "session_expiry", "out_aliases", "auth_method", "auth",
                 "auth_reply", "told")

    def __init__(self, props: dict | None, limits):
        props = props or {}
        # What the CONNACK tells the client, kept for the connection's life: a reload that
        # changes these limits applies to connections made after it (the client was told).
        self.told = Told(limits.max_qos, limits.retain_available, limits.receive_maximum,
                         limits.max_topic_alias)
        # What the client accepts: the broker sends no more than this (flow control, sizes).
        self.receive_maximum = props.get(Q.RECEIVE_MAXIMUM, 65535)
        self.max_packet_size = props.get(Q.MAXIMUM_PACKET_SIZE, 0)   # 0: the protocol's limit
        # The topic aliases the broker may use sending to it (with outbound_topic_aliases):
        # its Topic Alias Maximum, at most max_outbound_topic_aliases as it was at CONNECT.
        self.out_alias_maximum = min(props.get(Q.TOPIC_ALIAS_MAXIMUM, 0),
                                     limits.max_outbound_topic_aliases)
        self.problem_info = props.get(Q.REQUEST_PROBLEM_INFO, 1) == 1
        self.session_expiry = props.get(Q.SESSION_EXPIRY, 0)
        self.aliases: dict[int, str] | None = None   # inbound: alias -> topic name
        # Outbound: topic -> alias, an OrderedDict, least recently used first (core.router5).
        self.out_aliases: dict[bytes, int] | None = None
        # Enhanced authentication (core/handlers/auth.py): the method the CONNECT named, the
        # exchange running (at CONNECT or a re-authentication), the data for the CONNACK.
        self.auth_method: str | None = None
        self.auth = None
        self.auth_reply: bytes | None = None


def session_expiry(conn: Conn5, cap: float) -> int:
    """The Session Expiry Interval the broker grants at CONNECT (``session_expiry_cap``)."""
    return session_expiry_cap(conn.session_expiry, cap)


def session_expiry_cap(wanted: int, cap: float) -> int:
    """A Session Expiry Interval the client asked for, at most ``cap`` seconds
    (persistent_client_expiration) when that is set; a cap past what the four-byte field holds
    is its largest finite value (0xFFFFFFFE)."""
    if cap and wanted and (wanted == NEVER_EXPIRES or wanted > cap):
        return max(1, min(int(cap), NEVER_EXPIRES - 1))
    return wanted


def kept_offline(expiry_interval: int | None, cap: float) -> float:
    """Seconds an offline persistent session is kept (0: for ever): its Session Expiry
    Interval (5.0; None for 3.1.1) at most ``cap`` (persistent_client_expiration, 0: none),
    else ``cap``; 0xFFFFFFFF is for ever."""
    if expiry_interval is None:
        return cap
    seconds = session_expiry_cap(expiry_interval, cap)
    return 0 if seconds == NEVER_EXPIRES else seconds


def receive_window(conn, limits) -> int:
    """A session's ``receive_max``: the 5.0 client's Receive Maximum (``conn``; None for
    3.1.1) when it is below max_inflight_messages, else 0 (the limit is the window). Set at
    CONNECT and again when a reload changes the limit (MQTT-3.3.4-9)."""
    window = conn.receive_maximum if conn is not None else 65535
    return window if window < limits.max_inflight_messages else 0


def connack_properties(broker, client, assigned_id: str | None, keepalive: int | None,
                       expiry: int) -> dict:
    """The properties of an accepting CONNACK: what differs from the protocol's defaults."""
    limits = broker.limits
    props: dict = {}
    conn = client.v5
    if expiry != conn.session_expiry:
        props[Q.SESSION_EXPIRY] = expiry
    if assigned_id is not None:
        props[Q.ASSIGNED_CLIENT_ID] = assigned_id
    if keepalive is not None:
        props[Q.SERVER_KEEP_ALIVE] = keepalive
    told = conn.told
    if told.max_topic_alias:
        props[Q.TOPIC_ALIAS_MAXIMUM] = told.max_topic_alias
    props[Q.MAXIMUM_PACKET_SIZE] = limits.max_packet_size
    if not broker.config.shared_subscriptions:
        props[Q.SHARED_SUB_AVAILABLE] = 0   # available (1) is the default
    if told.receive_maximum < 65535:
        props[Q.RECEIVE_MAXIMUM] = told.receive_maximum
    if told.max_qos < 2:
        props[Q.MAXIMUM_QOS] = told.max_qos
    if not told.retain_available:
        props[Q.RETAIN_AVAILABLE] = 0
    if conn.auth_method is not None:       # MQTT-4.12.0-5
        props[Q.AUTH_METHOD] = conn.auth_method
        if conn.auth_reply is not None:
            props[Q.AUTH_DATA] = conn.auth_reply
    return props


# Properties of one hop or of the will only: never forwarded with a message.
_NOT_FORWARDED = (Q.TOPIC_ALIAS, Q.SUBSCRIPTION_ID, Q.MESSAGE_EXPIRY, Q.WILL_DELAY)


def message_properties(props: dict | None) -> tuple[bytes, int | None]:
    """A PUBLISH's (or will's) properties as the broker keeps them: (the encoded properties
    to forward, without Message Expiry Interval; that interval in seconds, or None)."""
    if props is None:
        return b"", None
    interval = props.get(Q.MESSAGE_EXPIRY)
    if any(k in props for k in _NOT_FORWARDED):
        props = {k: v for k, v in props.items() if k not in _NOT_FORWARDED}
    return Q.encode_body(props), interval


def logged(forward: bytes, interval: int | None) -> bytes:
    """What the commit log keeps of a message's properties (docs/log-format.md): those it is
    forwarded with (``message_properties``), then its Message Expiry Interval."""
    return forward if interval is None else forward + b"\x02" + interval.to_bytes(4, "big")


def stored_properties(stored: bytes, timestamp_ms: int, offset: int, journal,
                      now: float) -> tuple[bytes, float]:
    """The properties of the log record at ``offset`` (as docs/log-format.md stores them) ->
    (the encoded properties to forward, the broker-clock time it expires at, 0 for never).
    ``now`` is the broker's clock; the time since the record was logged is
    ``Journal.logged_ago``'s.
    Bytes that do not decode are forwarded as none."""
    try:
        props = Q.decode_body(stored)
    except ProtocolError:
        return b"", 0.0
    forward, interval = message_properties(props)
    if not interval:        # none, or 0: read as none (Router.publish)
        return forward, 0.0
    return forward, now + interval - journal.logged_ago(timestamp_ms, offset) / 1000


def reason_string(conn: Conn5 | None, text: str, props: dict | None = None) -> dict | None:
    """``props`` with a Reason String, when the client did not ask for no problem
    information (only CONNACK, PUBLISH and DISCONNECT carry one regardless)."""
    if conn is not None and not conn.problem_info:
        return props
    props = dict(props) if props else {}
    props[Q.REASON_STRING] = text[:200]
    return props


def within(conn: Conn5 | None, build, props: dict | None) -> bytes:
    """``build(props)``, or ``build(None)`` when that frame is larger than the client's
    Maximum Packet Size: the Reason String is left out rather than exceed it (MQTT-3.1.2-24,
    MQTT-3.2.2-19, MQTT-3.4.2-2, MQTT-3.5.2-2, MQTT-3.14.2-3)."""
    frame = build(props)
    if props and conn is not None and conn.max_packet_size and len(frame) > conn.max_packet_size:
        return build(None)
    return frame


def accepting_frame(conn: Conn5, present: bool, props: dict) -> bytes:
    """The accepting CONNACK; when it is larger than the client's Maximum Packet Size, the
    properties a client may go without (it then assumes no Topic Alias Maximum and no
    Maximum Packet Size; the broker still applies its own) are left out (MQTT-3.1.2-24).
    Still too large, it is not sent: ``connect.accept`` refuses the CONNECT instead."""
    return within(conn, lambda kept: encode_connack5(present, 0, props if kept else {
        k: v for k, v in props.items() if k not in (Q.TOPIC_ALIAS_MAXIMUM,
                                                    Q.MAXIMUM_PACKET_SIZE)}), props)


def refusal_frame(conn: Conn5 | None, reason: int, why: str) -> bytes:
    """A refusing CONNACK (reason code >= 0x80) saying why."""
    return within(conn, lambda props: encode_connack5(False, reason, props),
                  {Q.REASON_STRING: why[:200]})


def refusal_within(conn, reason: int, why: str) -> tuple[bytes | None, str]:
    """The refusing CONNACK for ``conn`` (Conn5, or anything with its ``max_packet_size``),
    and what the log says was done: None, closed without one, when even without its Reason
    String it is larger than the client's Maximum Packet Size (MQTT-3.1.2-24)."""
    frame = refusal_frame(conn, reason, why)
    limit = conn.max_packet_size
    if limit and len(frame) > limit:
        return None, (f"closed: a CONNACK {reason:#04x} would be larger than its Maximum "
                      f"Packet Size ({limit})")
    return frame, f"CONNACK {reason:#04x}"


def disconnect_frame(conn: Conn5 | None, reason: int, why: str) -> bytes:
    """A DISCONNECT the server sends before closing, saying why."""
    return within(conn, lambda props: encode_disconnect5(reason, props),
                  {Q.REASON_STRING: why[:200]} if why else None)


def refusing_ack(conn: Conn5 | None, kind: int, packet_id: int, reason: int, why: str) -> bytes:
    """A PUBACK or PUBREC with a refusing reason code, saying why when the client wants
    problem information."""
    return within(conn, lambda props: encode_ack5(kind, packet_id, reason, props),
                  reason_string(conn, why))
