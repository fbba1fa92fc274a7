"""How a client connection sends a request the first time (Connection's ``_send_qos0``,
``_send_publish`` and ``_send_other`` are these functions) and what a PUBLISH must pass each
time it is sent, also again after a reconnection (client/resume.py's ``send_again``).

A PUBLISH the server said it does not take (its 5.0 CONNACK: Maximum QoS, Retain
Available, Maximum Packet Size, Topic Alias Maximum) is not sent but answered at once with the
reason code the server would give (``Acked``: 0x9B, 0x9A, 0x95, 0x94); the server would close
the connection on it. A request whose packet cannot be made at all (a value no check caught, as in a request
made by hand, or loaded from a state file) is answered as refused (0x80) and logged, rather
than raising out of the loop that drives the connection, at every start again for a request
kept on disk. Both leave the session: the connection goes on.
"""

from __future__ import annotations

import logging

from edgebroker.client.events import Acked, Subscribed, Unsubscribed
from edgebroker.client.requests import (PUBLISH, STAGE_PUBLISH, SUBSCRIBE, Request,
                                        other_frame, publish_frame)
from edgebroker.errors import (PACKET_TOO_LARGE, QOS_NOT_SUPPORTED, RETAIN_NOT_SUPPORTED,
                               TOPIC_ALIAS_INVALID, UNSPECIFIED_ERROR)
from edgebroker.mqtt.properties import TOPIC_ALIAS

log = logging.getLogger("edgebroker.client")

QOS0_HEADS_KEPT = 256    # QoS 0 PUBLISH heads kept (then the cache starts again)
# What making a packet of values no check caught raises (the encoders' own errors).
_CANNOT_ENCODE = (ValueError, TypeError, AttributeError, KeyError, OverflowError)


def refusal(req: Request, code: int = UNSPECIFIED_ERROR):
    """The answer to a request that is not sent: ``Acked``, or ``Subscribed`` /
    ``Unsubscribed`` with ``code`` for each filter."""
    if req.kind is PUBLISH:
        return Acked(req, code)
    codes = [code] * len(req.filters)
    return Subscribed(req, codes) if req.kind is SUBSCRIBE else Unsubscribed(req, codes)


def _cannot_encode(conn, req: Request, exc: Exception) -> None:
    log.warning("%r: its packet cannot be made (%s: %s); answered as refused (0x80)",
                req, type(exc).__name__, exc)
    conn._events.append(refusal(req))


def limit_code(conn, req: Request, frame: list) -> int:
    """The reason code of a PUBLISH (``frame``) beyond what the server said it takes, or 0."""
    if req.qos > conn._server_max_qos:
        return QOS_NOT_SUPPORTED
    if req.retain and not conn._server_retain:
        return RETAIN_NOT_SUPPORTED
    if conn._server_max_packet and sum(map(len, frame)) > conn._server_max_packet:
        return PACKET_TOO_LARGE
    props = req.properties
    if props and props.get(TOPIC_ALIAS, 0) > conn._server_aliases:
        return TOPIC_ALIAS_INVALID      # (a Topic Alias the caller set itself)
    return 0


def publish_or_answer(conn, req: Request, dup: bool) -> list | None:
    """``req``'s PUBLISH (with its packet id, if any), or None when it is answered instead
    (the event is the connection's: ``limit_code``, or the packet cannot be made)."""
    try:
        frame = publish_frame(req, conn._v5, dup)
    except _CANNOT_ENCODE as exc:
        _cannot_encode(conn, req, exc)
        return None
    code = limit_code(conn, req, frame)
    if code:
        conn._events.append(Acked(req, code))
        return None
    return frame


def send_qos0(conn, req: Request) -> None:
    # A QoS 0 PUBLISH's head depends on its topic, length and retain flag only (without
    # properties): kept, so that a stream to a few topics is not encoded per message.
    payload = req.payload
    key = (req.topic, len(payload), req.retain)
    heads = conn._qos0_heads
    head = heads.get(key) if req.properties is None else None
    if head is None:
        frame = publish_or_answer(conn, req, False)
        if frame is None:
            return
        if req.properties is None:
            if len(heads) >= QOS0_HEADS_KEPT:
                heads.clear()
            heads[key] = frame[0]
    else:
        frame = [head, payload] if payload else [head]
        if conn._server_max_packet or not conn._server_retain:
            code = limit_code(conn, req, frame)
            if code:
                conn._events.append(Acked(req, code))
                return
    conn._out.extend(frame)
    conn._qos0_out.append(req)


def send_publish(conn, req: Request) -> bool:
    """Send a QoS 1/2 PUBLISH for the first time; False when no packet id is free."""
    req.stage = STAGE_PUBLISH        # whatever a request given again said
    pid = conn._new_pid()
    if pid is None:
        return False
    req.packet_id = pid
    frame = publish_or_answer(conn, req, False)
    if frame is None:
        req.packet_id = None
        conn._next_pid = pid         # not used after all
        return True
    conn._inflight[pid] = req
    conn._n_pub += 1
    conn._n_qos2 += req.qos == 2
    conn._out.extend(frame)
    return True


def send_other(conn, req: Request) -> bool:
    """Send a SUBSCRIBE or UNSUBSCRIBE; False when no packet id is free."""
    pid = conn._new_pid()
    if pid is None:
        return False
    req.packet_id = pid
    try:
        frame = other_frame(req, conn._v5)
    except _CANNOT_ENCODE as exc:
        req.packet_id = None
        conn._next_pid = pid
        _cannot_encode(conn, req, exc)
        return True
    conn._inflight[pid] = req
    conn._out.append(frame)
    return True


def other_or_answer(conn, req: Request) -> bytes | None:
    """An in-flight SUBSCRIBE or UNSUBSCRIBE again, or None when its packet cannot be made
    (answered as refused)."""
    try:
        return other_frame(req, conn._v5)
    except _CANNOT_ENCODE as exc:
        _cannot_encode(conn, req, exc)
        return None
