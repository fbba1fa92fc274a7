"""What the user asks a client connection to do (``Request``), the errors of asking wrongly,
a request's packet (``publish_frame``, ``other_frame``) and its form in the state file
(``to_state``/``from_state``, docs/client.md).
"""

from __future__ import annotations

import base64

from edgebroker.client.propcheck import WHERE, property_problem
from edgebroker.errors import EdgebrokerError, ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode, encode_publish_head
from edgebroker.mqtt.encode5 import encode5, encode_publish_head5
from edgebroker.mqtt.packets import SUB_RETAIN_HANDLING
from edgebroker.mqtt.properties import encode_properties
from edgebroker.mqtt.topics import validate_topic_filter, validate_topic_name

PUBLISH = "publish"
SUBSCRIBE = "subscribe"
UNSUBSCRIBE = "unsubscribe"

# The token of the SUBSCRIBE a connection makes again itself (Connection's ``resubscribe``).
RESUBSCRIBE = "edgebroker.client:resubscribe"

# The token of the PUBRELs a connection sends for packet ids that an earlier connection (an
# earlier process) may have left at the server past PUBREC (client/resume.py's ``release``).
RELEASE = "edgebroker.client:release"


def is_release(req) -> bool:
    """``req`` is one of ``release``'s PUBRELs (not the user's)."""
    token = req.token
    return token.__class__ is str and token == RELEASE

# Where a QoS 2 publish is: PUBLISH sent (or to send), waiting for PUBREC; PUBREL sent (the
# server has the message), waiting for PUBCOMP.
STAGE_PUBLISH = 0
STAGE_PUBREL = 1


class ClientError(EdgebrokerError):
    """The user asked the client for something it cannot do (a bad topic, QoS, filter...)."""


class QueueFull(ClientError):
    """``max_queued`` requests are already waiting: the producer must wait (``can_publish``)."""


class Request:
    """One publish, subscribe or unsubscribe, from the call that made it to its
    acknowledgement. ``packet_id`` is None for QoS 0, and until the request is sent."""

    __slots__ = ("kind", "token", "packet_id", "topic", "payload", "qos", "retain",
                 "properties", "filters", "stage")

    def __init__(self, kind: str, token=None, topic: str | None = None, payload: bytes = b"",
                 qos: int = 0, retain: bool = False, properties: dict | None = None,
                 filters: list | None = None):
        self.kind = kind
        self.token = token
        self.packet_id: int | None = None
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.filters = filters
        self.stage = STAGE_PUBLISH

    def __repr__(self) -> str:
        if self.kind == PUBLISH:
            return (f"Request(publish {self.topic!r} qos={self.qos} pid={self.packet_id} "
                    f"token={self.token!r} {len(self.payload)} bytes)")
        return f"Request({self.kind} {self.filters!r} pid={self.packet_id} token={self.token!r})"


# Topics already checked, remembered (up to this many; then the set starts again).
_VALID_TOPICS_KEPT = 4096
_topics_ok: set = set()


def make_publish(topic: str, payload=b"", qos: int = 0, retain: bool = False,
                 properties: dict | None = None, token=None) -> Request:
    """A publish request (not sent yet: ``Connection.submit`` or the event loop sends it);
    ClientError names what is wrong. ``payload``: bytes-like, or str (sent as UTF-8)."""
    global _topics_ok
    if type(payload) is not bytes:
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        elif isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        else:
            raise ClientError(f"payload must be bytes or str, not {type(payload).__name__}")
    if topic not in _topics_ok:
        if not isinstance(topic, str):
            raise ClientError(f"topic must be a str, not {type(topic).__name__}")
        try:
            validate_topic_name(topic)
        except ProtocolError as exc:
            raise ClientError(f"cannot publish to {topic!r}: {exc}") from None
        if len(_topics_ok) >= _VALID_TOPICS_KEPT:
            _topics_ok = set()
        _topics_ok.add(topic)
    if qos not in (0, 1, 2):
        raise ClientError(f"QoS must be 0, 1 or 2, not {qos!r}")
    if len(payload) > _PAYLOAD_CHECKED and len(payload) > largest_payload(topic, qos):
        raise ClientError(f"publish to {topic!r}: {len(payload):,} bytes of payload, over "
                          f"MQTT's largest message: {largest_payload(topic, qos):,} bytes "
                          f"with this topic")
    if properties is not None:
        _check_properties(properties, PUBLISH, f"publish to {topic!r}")
    return Request(PUBLISH, token, topic, payload, qos, retain, properties)


# Payloads up to this size fit in any PUBLISH (a topic of at most 65,535 bytes, a packet id,
# properties); only a larger one is measured against largest_payload.
_PAYLOAD_CHECKED = P.MAX_REMAINING_LENGTH - (1 << 20)


def largest_payload(topic: str, qos: int) -> int:
    """The most payload bytes a PUBLISH to ``topic`` can carry: MQTT's largest remaining length
    (268,435,455 bytes: 256 MiB) less the topic and packet id (5.0's properties take at least
    one byte more, which the connection finds when it makes the packet)."""
    return (P.MAX_REMAINING_LENGTH - 2 - len(topic.encode("utf-8", "surrogatepass"))
            - (2 if qos else 0))


def _check_properties(props, kind: str, what: str) -> None:
    problem = property_problem(props, WHERE[kind])
    if problem:
        raise ClientError(f"{what}: {problem}")


def check_sendable(req: Request, v5: bool) -> None:
    """ClientError when ``req`` cannot go out on a connection of that protocol: properties
    or subscription options over 3.1.1, or properties not valid (a Request made by hand)."""
    if not v5 and (req.properties or req.kind is SUBSCRIBE and any(
            options > 2 for _, options in req.filters)):
        raise ClientError(f"{req.kind} with properties or subscription options needs "
                          f"protocol 5")
    if req.properties is not None:
        _check_properties(req.properties, req.kind, repr(req))


def as_request(item) -> Request:
    """A Request as it is, or a publish from a (topic, payload[, qos[, retain]]) tuple."""
    if type(item) is tuple or isinstance(item, tuple):
        return make_publish(*item)
    if isinstance(item, Request):
        return item
    raise ClientError(f"a request must be a Request or a (topic, payload[, qos[, retain]]) "
                      f"tuple, not {type(item).__name__}")


def _check_filter(topic_filter) -> None:
    try:
        validate_topic_filter(topic_filter)
    except (ProtocolError, TypeError, AttributeError) as exc:
        raise ClientError(f"topic filter {topic_filter!r} is not valid: {exc}") from None


def make_subscribe(filters, properties: dict | None = None, token=None) -> Request:
    """A subscribe request: ``filters`` are (filter, QoS or 5.0 options byte) pairs, or
    filters alone (QoS 0)."""
    items = []
    for item in filters:
        topic_filter, options = (item, 0) if isinstance(item, str) else item
        _check_filter(topic_filter)
        if (not isinstance(options, int) or options & 3 == 3 or options & 0xC0
                or options & SUB_RETAIN_HANDLING == SUB_RETAIN_HANDLING):
            raise ClientError(f"subscription options {options!r} for {topic_filter!r} "
                              f"are not valid (QoS 0-2; 5.0 option bits)")
        items.append((topic_filter, options))
    if not items:
        raise ClientError("subscribe needs at least one topic filter")
    if properties is not None:
        _check_properties(properties, SUBSCRIBE, f"subscribe to {items[0][0]!r}")
    return Request(SUBSCRIBE, token, filters=items, properties=properties)


def make_unsubscribe(filters, properties: dict | None = None, token=None) -> Request:
    """An unsubscribe request for ``filters``."""
    items = []
    for topic_filter in filters:
        _check_filter(topic_filter)
        items.append(topic_filter)
    if not items:
        raise ClientError("unsubscribe needs at least one topic filter")
    if properties is not None:
        _check_properties(properties, UNSUBSCRIBE, f"unsubscribe from {items[0]!r}")
    return Request(UNSUBSCRIBE, token, filters=items, properties=properties)


# ---------------------------------------------------------------------------------------------
# The state file's form (JSON): bytes as base64, property identifiers as decimal strings
# ---------------------------------------------------------------------------------------------

_PLAIN = (str, int, float, bool)


def properties_to_state(props: dict | None):
    if not props:
        return None
    out = {}
    for ident, value in props.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = {"b64": base64.b64encode(bytes(value)).decode("ascii")}
        elif isinstance(value, list):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[str(ident)] = value
    return out


def properties_from_state(doc) -> dict | None:
    if not doc:
        return None
    out = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            value = base64.b64decode(value["b64"])
        elif isinstance(value, list):
            value = [tuple(v) if isinstance(v, list) else v for v in value]
        out[int(key)] = value
    return out


def to_state(req: Request) -> dict:
    """A request as the state file keeps it. The token is kept when it is a JSON scalar (str,
    int, float, bool); any other token is left out (it comes back as None)."""
    doc: dict = {"kind": req.kind}
    if req.token is not None and isinstance(req.token, _PLAIN):
        doc["token"] = req.token
    if req.packet_id is not None:
        doc["packet_id"] = req.packet_id
    if req.kind == PUBLISH:
        doc.update(topic=req.topic, payload=base64.b64encode(bytes(req.payload)).decode("ascii"),
                   qos=req.qos, retain=req.retain)
        if req.stage == STAGE_PUBREL:
            doc["stage"] = "pubrel"
    else:
        doc["filters"] = [list(f) if isinstance(f, tuple) else f for f in req.filters]
    props = properties_to_state(req.properties)
    if props is not None:
        doc["properties"] = props
    return doc


def from_state(doc: dict) -> Request:
    """``to_state``'s inverse; a ValueError names what is wrong in ``doc``."""
    kind = doc.get("kind")
    try:
        if kind == PUBLISH:
            req = Request(PUBLISH, doc.get("token"), doc["topic"],
                          base64.b64decode(doc["payload"], validate=True), int(doc["qos"]),
                          bool(doc["retain"]), properties_from_state(doc.get("properties")))
            if doc.get("stage") == "pubrel":
                req.stage = STAGE_PUBREL
        elif kind in (SUBSCRIBE, UNSUBSCRIBE):
            filters = [tuple(f) if isinstance(f, list) else f for f in doc["filters"]]
            req = Request(SUBSCRIBE if kind == SUBSCRIBE else UNSUBSCRIBE, doc.get("token"),
                          filters=filters,
                          properties=properties_from_state(doc.get("properties")))
        else:
            raise ValueError(f"unknown request kind {kind!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"state file request {doc!r}: {exc}") from None
    pid = doc.get("packet_id")
    if pid is not None:
        if not isinstance(pid, int) or not 0 < pid < 65536:
            raise ValueError(f"state file request {doc!r}: packet_id out of range")
        req.packet_id = pid
    return req


def publish_frame(req: Request, v5: bool, dup: bool) -> list:
    """A publish request's PUBLISH: its head and, when there is one, its payload."""
    payload = req.payload
    if v5:
        head = encode_publish_head5(req.topic.encode(), len(payload), req.qos, req.retain,
                                    dup, req.packet_id, encode_properties(req.properties))
    else:
        head = encode_publish_head(req.topic.encode(), len(payload), req.qos, req.retain, dup,
                                   req.packet_id)
    return [head, payload] if payload else [head]


def other_frame(req: Request, v5: bool) -> bytes:
    """A subscribe or unsubscribe request's SUBSCRIBE or UNSUBSCRIBE."""
    cls = P.Subscribe if req.kind is SUBSCRIBE else P.Unsubscribe
    packet = cls(req.packet_id, req.filters, req.properties)
    return encode5(packet) if v5 else encode(packet)
