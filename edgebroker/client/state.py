"""A client connection's session as JSON-able data, and back (``Connection.save``/``load``):
the state file's form, docs/client.md "The state file" (tests/client/golden/ has one)."""

from __future__ import annotations

import logging

from edgebroker.client.requests import (
    PUBLISH, STAGE_PUBLISH, ClientError, check_sendable, from_state, properties_from_state,
    properties_to_state, to_state,
)
from edgebroker.client.sending import refusal
from edgebroker.mqtt import packets as P

log = logging.getLogger("edgebroker.client")

STATE_FORMAT = "edgebroker-client-state"
STATE_VERSION = 1


def save_state(conn) -> dict:
    """``conn``'s session (see Connection.save)."""
    queued = [*conn._qos0_out, *conn._queue]
    # (one given out and not yet acknowledged is given out again when it is sent again)
    held = sorted(conn._incoming_qos2.keys() - conn._unacked.keys())
    doc = {
        "format": STATE_FORMAT, "version": STATE_VERSION,
        "client_id": conn.client_id, "protocol": conn.protocol,
        "clean_start": conn.clean_start, "keepalive": conn.keepalive,
        "username": conn.username, "properties": properties_to_state(conn.properties),
        "max_inflight": conn.max_inflight, "max_queued": conn.max_queued,
        "next_packet_id": conn._next_pid,
        "inflight": [to_state(r) for r in conn._inflight.values()],
        "queued": [to_state(r) for r in queued],
        "incoming_qos2": held,
    }
    # Their digests in a key of their own, so that an older version reads the ids still.
    digests = {str(pid): conn._incoming_qos2[pid] for pid in held
               if conn._incoming_qos2[pid] is not None}
    if digests:
        doc["incoming_qos2_digests"] = digests
    if conn.max_qos2_inflight is not None:      # (else the protocol's default)
        doc["max_qos2_inflight"] = conn.max_qos2_inflight
    return doc


def _sendable(conn, req) -> bool:
    """Whether a request of the state file can go out on ``conn``; if not (properties a
    client cannot send, from a version without the checks, or 5.0 ones over 3.1.1) it is
    answered as refused (0x80) at once, logged, and not kept: the server would close the
    connection on it, at every reconnection."""
    try:
        check_sendable(req, conn._v5)
    except ClientError as exc:
        log.warning("state file: %s; answered as refused (0x80)", exc)
        conn._events.append(refusal(req))
        return False
    return True


def load_state(cls, doc: dict, options: dict):
    """A ``cls`` (Connection) with the session ``doc`` holds (see Connection.load)."""
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise ValueError(f"not a client state (format is not {STATE_FORMAT!r})")
    if doc.get("version") != STATE_VERSION:
        raise ValueError(f"client state version {doc.get('version')!r} is not "
                         f"{STATE_VERSION} (written by another edgebroker?)")
    kw = {k: doc[k] for k in ("client_id", "protocol", "clean_start", "keepalive", "username",
                              "max_inflight", "max_queued", "max_qos2_inflight") if k in doc}
    kw["properties"] = properties_from_state(doc.get("properties"))
    kw.update(options)
    client_id = kw.pop("client_id", "")
    protocol = kw.pop("protocol", P.PROTOCOL_311)
    conn = cls(client_id, protocol, **kw)
    for item in doc.get("inflight", ()):
        req = from_state(item)
        if req.packet_id is None or req.packet_id in conn._inflight:
            raise ValueError(f"state file in-flight request {item!r}: no packet_id, or "
                             f"one given twice")
        if req.kind is PUBLISH and not req.qos:
            raise ValueError(f"state file in-flight request {item!r}: QoS 0")
        if _sendable(conn, req):
            conn._inflight[req.packet_id] = req
            conn._n_pub += req.kind is PUBLISH
            conn._n_qos2 += req.kind is PUBLISH and req.qos == 2
    for item in doc.get("queued", ()):
        req = from_state(item)
        req.packet_id = None
        req.stage = STAGE_PUBLISH
        if _sendable(conn, req):
            conn._queue.append(req)
    ids = doc.get("incoming_qos2", ())
    if type(ids) is not list or any(type(i) is not int or not 0 < i < 0x10000 for i in ids):
        raise ValueError(f"state file incoming_qos2 {str(ids)[:60]!r}: not a list of packet "
                         f"ids 1..65535")
    conn._incoming_qos2 = dict.fromkeys(ids)    # (a file without digests: the DUP rule)
    digests = doc.get("incoming_qos2_digests", {})
    if type(digests) is not dict or any(
            not (k.isascii() and k.isdigit() and int(k) in conn._incoming_qos2)
            or type(v) is not int or not 0 <= v <= 0xFFFFFFFF for k, v in digests.items()):
        raise ValueError(f"state file incoming_qos2_digests {str(digests)[:60]!r}: not packet "
                         f"ids of incoming_qos2 (decimal strings) -> whole numbers 0..2**32-1")
    for k, v in digests.items():
        conn._incoming_qos2[int(k)] = v
    pid = doc.get("next_packet_id", 1)
    conn._next_pid = pid if isinstance(pid, int) and 0 < pid < 0x10000 else 1
    return conn
