"""A 5.0 session's delayed will in the session snapshot (core.snapshot; docs/persistence.md).

A will waiting out its Will Delay Interval when a snapshot is taken is kept in its session's
entry as ``"will"``: what publishing it after a restart needs (core.wills restores it), and
its serial, by which the exchange journal (core.exchanges) says it ended after the snapshot.
"""

from __future__ import annotations

import binascii   # base64 (the base64 module over it: more memory)
import logging

from edgebroker.errors import ProtocolError, name_shown
from edgebroker.mqtt.properties import WILL, decode_body
from edgebroker.records import record

log = logging.getLogger("edgebroker.snapshot")


@record
class WillState:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    # Its will properties encoded without their length: those its PUBLISH is made of, then
    # its Message Expiry Interval (core.mqtt5's ``logged``; older brokers wrote them as the
    # CONNECT had them, Will Delay Interval too): core.wills' ``kept_will`` reads either.
    properties: bytes = b""
    due_ms: int = 0                 # the wall-clock time (ms since the epoch) it is due at
    username: str | None = None     # its client's user name
    # The address of the listener its client came in on (None: none, or an older file whose
    # will no ACL applied to), and whether an ACL applied to it then: a will whose listener is
    # not served after a restart is dropped only when one did (its ACL is unknown).
    listener: str | None = None
    acl: bool = True
    # The broker's number for this will (core.wills), which the exchange journal's ``W``
    # record names when it ends after the snapshot (published, or cancelled): a restart then
    # does not restore it. 0: written before wills had one (its ``W`` records name 0 too).
    serial: int = 0


def will_json(w: WillState) -> dict:
    doc = {"topic": w.topic, "payload": binascii.b2a_base64(w.payload, newline=False).decode(),
           "qos": w.qos, "retain": w.retain, "due_ms": w.due_ms}
    if w.properties:
        doc["properties"] = binascii.b2a_base64(w.properties, newline=False).decode()
    if w.username is not None:
        doc["username"] = w.username
    if w.listener is not None:
        doc["listener"] = w.listener
        if not w.acl:
            doc["acl"] = False      # (older brokers wrote a listener only when one applied)
    if w.serial:
        doc["serial"] = w.serial
    return doc


def read_will(doc, path: str, client_id: str) -> WillState | None:
    """A session entry's ``"will"`` (None: none). A QoS past 2 is left out, logged with the
    file and the session; a field of the wrong type raises as a damaged snapshot does."""
    if doc is None:
        return None
    qos = int(doc["qos"])
    if qos not in (0, 1, 2):
        log.error("%s: session %s: the QoS %d of its delayed will is out of range: the will "
                  "is left out", path, name_shown(client_id), qos)
        return None
    properties = binascii.a2b_base64(doc.get("properties", ""), strict_mode=True)
    try:
        decode_body(properties, WILL)
    except ProtocolError as exc:
        log.error("%s: session %s: the properties of its delayed will do not decode (%s): "
                  "it is published without them", path, name_shown(client_id), exc)
        properties = b""
    username, listener = doc.get("username"), doc.get("listener")
    return WillState(str(doc["topic"]), binascii.a2b_base64(doc["payload"], strict_mode=True),
                     qos, bool(doc["retain"]), properties, int(doc["due_ms"]),
                     None if username is None else str(username),
                     None if listener is None else str(listener), doc.get("acl", True) is not False,
                     int(doc.get("serial", 0)))
