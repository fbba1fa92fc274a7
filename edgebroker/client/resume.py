"""What a connection sends when a CONNACK comes after a reconnection (client/incoming.py
calls these; connection.py's ``_pump`` sends the rest as the window allows): with Session
Present 1 the requests in flight again, as MQTT says; with Session Present 0 the session
discarded, its requests sent as new ones, and the subscriptions made again
(``resubscribe``). ``release`` sends PUBREL for packet ids an earlier connection may have
left at the server past PUBREC (the bridge, after a restart)."""

from __future__ import annotations

from edgebroker.client.requests import (
    PUBLISH, RELEASE, RESUBSCRIBE, STAGE_PUBLISH, STAGE_PUBREL, SUBSCRIBE, UNSUBSCRIBE,
    ClientError, Request, is_release,
)
from edgebroker.client.states import CONNECTED
from edgebroker.client.sending import other_or_answer, publish_or_answer
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
            # (``release``'s PUBRELs end with the session they were for)
            again = [req for req in inflight.values() if not is_release(req)]
            for req in again:
                req.packet_id = None
                req.stage = STAGE_PUBLISH
            conn._queue.extendleft(reversed(again))
            inflight.clear()
            conn._n_pub = conn._n_qos2 = 0
        conn._resend_wait.clear()
        return
    # In order while the window (perhaps smaller now) allows; the rest by _pump.
    conn._n_pub = conn._n_qos2 = 0
    wait = conn._resend_wait
    wait.clear()
    for req in list(inflight.values()):     # (send_again may answer one)
        if wait or req.kind is PUBLISH and not conn._room(req):
            wait.append(req)
        else:
            send_again(conn, req)


def send_again(conn, req: Request) -> None:
    """A request in flight again, on a connection that kept the session. A PUBLISH goes
    through the checks of its first sending (client/sending.py) against what this server
    said: one it now refuses (a Maximum Packet Size or Maximum QoS smaller than the one it
    was sent under, Retain Available 0), or whose packet cannot be made, is answered as its
    first sending would be and leaves the session, instead of being sent to a server that
    would close the connection on it, again at every reconnection."""
    if req.kind is not PUBLISH:
        frame = other_or_answer(conn, req)
    elif req.stage == STAGE_PUBREL:
        frame = [encode_ack(P.PUBREL, req.packet_id)]
    else:
        frame = publish_or_answer(conn, req, True)
    if frame is None:
        del conn._inflight[req.packet_id]
        return
    if req.kind is PUBLISH:
        conn._n_pub += 1
        conn._n_qos2 += req.qos == 2
        conn._out.extend(frame)
    else:
        conn._out.append(frame)


def release(conn, pids) -> int:
    """On a connection that found its session kept (Session Present 1), before it sends any
    new PUBLISH: a PUBREL for each packet id of ``pids`` not in flight, which an earlier
    connection (an earlier process, whose requests are gone) may have left at the server
    past PUBREC: MQTT-4.4.0-1 owes the server those PUBRELs, and each id it holds takes a
    place of its Receive Maximum. Each PUBREL is a request in flight, counted in the window
    (so new publishes wait until the server has freed as many places as the window needs),
    token ``RELEASE``: its PUBCOMP, whatever its reason code (0x92: the server held nothing
    for it), gives an ``Acked`` with that token. After a reconnection it goes again with
    Session Present 1; with 0 it is dropped (the session it was for is gone). It counts as
    a QoS 2 publish too (``max_qos2_inflight``): the server may hold a message under that
    id. The number of PUBRELs sent."""
    if conn.state is not CONNECTED:
        raise ClientError(f"release needs a connected connection, not {conn.state}")
    inflight = conn._inflight
    frames = conn._out
    sent = 0
    for pid in pids:
        if pid in inflight:
            continue
        req = Request(PUBLISH, RELEASE, "", qos=2)
        req.packet_id = pid
        req.stage = STAGE_PUBREL
        inflight[pid] = req
        frames.append(encode_ack(P.PUBREL, pid))
        sent += 1
    conn._n_pub += sent
    conn._n_qos2 += sent
    return sent
