"""What a connection sends when a CONNACK comes after a reconnection (client/incoming.py
calls these; connection.py's ``_pump`` sends the rest as the window allows): with Session
Present 1 the requests in flight again, as MQTT says; with Session Present 0 the session
discarded, its requests sent as new ones, and the subscriptions made again
(``resubscribe``)."""

from __future__ import annotations

from edgebroker.client.requests import (
    PUBLISH, RESUBSCRIBE, STAGE_PUBLISH, STAGE_PUBREL, SUBSCRIBE, UNSUBSCRIBE, Request,
    other_frame, publish_frame,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode_ack


def subscribe_again(conn) -> None:
    """After a CONNACK without a session: SUBSCRIBE again the filters the server had
    granted (but those of an UNSUBSCRIBE not yet answered), one request per set of
    properties, before anything queued: the requests not answered, which ``resend`` put
    back at the front of the queue, follow (token RESUBSCRIBE)."""
    leaving = {f for req in (*conn._inflight.values(), *conn._queue)
               if req.kind is UNSUBSCRIBE for f in req.filters}
    groups: dict = {}
    for topic_filter, (options, props) in conn._subscriptions.items():
        if topic_filter not in leaving:
            groups.setdefault(id(props), (props, []))[1].append((topic_filter, options))
    waiting = []
    for props, filters in groups.values():
        req = Request(SUBSCRIBE, RESUBSCRIBE, filters=filters, properties=props)
        if not conn._send_other(req):
            waiting.append(req)
    conn._queue.extendleft(reversed(waiting))


def resend(conn, session_present: bool) -> None:
    """After CONNACK, what was sent and not answered. Session Present 1: sent again in
    the order first sent, DUP=1 (PUBREL for a QoS 2 publish past PUBREC). Session
    Present 0: the server has no session, so ours is discarded (MQTT-3.2.2-5, 4.4.0-1):
    every request not answered goes back to the front of the queue and is sent as a new
    one (DUP=0, a new packet id, a QoS 2 publish from its PUBLISH even past PUBREC: at
    least once rather than lost)."""
    inflight = conn._inflight
    if not session_present:
        if inflight:
            for req in inflight.values():
                req.packet_id = None
                req.stage = STAGE_PUBLISH
            conn._queue.extendleft(reversed(inflight.values()))
            inflight.clear()
            conn._n_pub = 0
        conn._resend_wait.clear()
        return
    # In order while the window (perhaps smaller now) allows; the rest by _pump.
    conn._n_pub = 0
    wait = conn._resend_wait
    wait.clear()
    for req in inflight.values():
        if wait or req.kind is PUBLISH and conn._n_pub >= conn._window:
            wait.append(req)
        else:
            send_again(conn, req)


def send_again(conn, req: Request) -> None:
    """A request in flight again, on a connection that kept the session."""
    if req.kind is not PUBLISH:
        conn._out.append(other_frame(req, conn._v5))
        return
    conn._n_pub += 1
    if req.stage == STAGE_PUBREL:
        conn._out.append(encode_ack(P.PUBREL, req.packet_id))
    else:
        conn._out.extend(publish_frame(req, conn._v5, True))
