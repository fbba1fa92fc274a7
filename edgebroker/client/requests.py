"""What the user asks a client connection to do (``Request``), the errors of asking wrongly,
and a request's form in the state file (``to_state``/``from_state``, docs/client.md).
"""

from __future__ import annotations

import base64

from edgebroker.errors import EdgebrokerError

PUBLISH = "publish"
SUBSCRIBE = "subscribe"
UNSUBSCRIBE = "unsubscribe"

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
