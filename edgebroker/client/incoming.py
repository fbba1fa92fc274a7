"""What a client connection does with each packet from the server: plain functions
``handler(conn, packet, events)`` in a table per state (``CONNECTING``, ``CONNECTED``), which
Connection.receive_data dispatches through; a packet not in its state's table is a protocol
error of the server. Each handler appends its events and queues what the server is owed."""

from __future__ import annotations

import logging
import zlib

from edgebroker.errors import (
    PACKET_ID_NOT_FOUND, PROTOCOL_ERROR, REASON_NAMES, RECEIVE_MAXIMUM_EXCEEDED,
    TOPIC_ALIAS_INVALID, ProtocolError,
)
from edgebroker.client.events import (
    Acked, ConnectFailed, Connected, Disconnected, Message, Oversized, Subscribed, Unsubscribed,
)
from edgebroker.client.oversize import SKIPPED
from edgebroker.client.requests import PUBLISH, STAGE_PUBREL, SUBSCRIBE, UNSUBSCRIBE
from edgebroker.client.resume import resend, subscribe_again
from edgebroker.client.states import CONNECTED, CONNECTING
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.decode5 import REASONS
from edgebroker.mqtt.encode import encode_ack, encode_puback
from edgebroker.mqtt.encode5 import encode_ack5, encode_disconnect5
from edgebroker.mqtt.properties import (
    ASSIGNED_CLIENT_ID, MAXIMUM_PACKET_SIZE, MAXIMUM_QOS, REASON_STRING, RECEIVE_MAXIMUM,
    RETAIN_AVAILABLE, SERVER_KEEP_ALIVE, TOPIC_ALIAS, TOPIC_ALIAS_MAXIMUM,
)

log = logging.getLogger("edgebroker.client")

# 3.1.1 CONNACK return codes (section 3.2.2.3).
_CONNACK_311 = {1: "unacceptable protocol version", 2: "identifier rejected",
                3: "server unavailable", 4: "bad user name or password", 5: "not authorized"}


def on_connack(conn, p: P.Connack, events: list) -> None:
    code = p.return_code
    if code:
        if conn._v5:
            reason = REASON_NAMES.get(code, "refused")
            text = (p.properties or {}).get(REASON_STRING)
            reason = f"{reason}: {text}" if text else reason
        else:
            reason = _CONNACK_311.get(code, f"return code {code}")
        conn._lose()
        conn._out = []
        events.append(ConnectFailed(code, reason))
        return
    if p.session_present and conn.clean_start:
        raise ProtocolError("CONNACK with Session Present 1 in answer to a clean start",
                            rule="MQTT-3.2.2-4", reason=PROTOCOL_ERROR)
    # A 3.1 CONNACK has no Session Present flag (the byte is reserved, 0), yet a 3.1 server
    # keeps the session of a client that connects with cleansession 0: it is taken as kept.
    present = p.session_present or conn.protocol == P.PROTOCOL_31 and not conn.clean_start
    conn._move(CONNECTED)
    conn._reuse_logged = False
    props = p.properties
    if props:
        conn._window = min(conn.max_inflight, props.get(RECEIVE_MAXIMUM, 0xFFFF))
        conn._server_max_qos = props.get(MAXIMUM_QOS, 2)
        conn._server_retain = bool(props.get(RETAIN_AVAILABLE, 1))
        conn._server_max_packet = props.get(MAXIMUM_PACKET_SIZE, 0)
        conn._server_aliases = props.get(TOPIC_ALIAS_MAXIMUM, 0)
        conn._ka = props.get(SERVER_KEEP_ALIVE, conn.keepalive)
        conn.client_id = props.get(ASSIGNED_CLIENT_ID, conn.client_id)
    if not present:
        conn._incoming_qos2.clear()   # a new session: no PUBREL will come for them
        conn._unacked.clear()         # nor a resend to acknowledge
    events.append(Connected(present, code, props))
    resend(conn, present)
    if not present and conn.resubscribe and conn._subscriptions:
        subscribe_again(conn)
    conn._pump()


def digest(topic: str, payload, retain) -> int:
    """A QoS 2 message's digest, kept per packet id held for its PUBREL: the function of the
    broker side (core/handlers/publish.py), CRC-32 of the topic's UTF-8 then of the payload,
    started from the topic's length and RETAIN."""
    return zlib.crc32(payload, zlib.crc32(topic.encode(), 2 * len(topic) + retain))


def taken(conn, qos: int, pid: int | None, dup: bool, known: int | None = None) -> bool:
    """A PUBLISH from the server at ``qos`` with ``pid`` (QoS 2: ``known``, its digest; None
    for an oversized one, whose payload is not read): acknowledged now (PUBACK, PUBREC)
    unless ``auto_ack`` is off; False for a QoS 2 one given out already (a resend: its PUBREC
    sent again unless the caller has yet to acknowledge it). Over the Receive Maximum: the
    protocol error.

    Under a packet id awaiting its PUBREL, a QoS 2 PUBLISH with the digest of the held one
    (the same topic, payload and RETAIN) is a resend, whatever its DUP: not given out again
    (MQTT-4.3.3-2). Mosquitto restarted from its save after a crash sends a saved message
    again with DUP 0. One with another digest is a different message, whatever its DUP: the
    server forgot the exchange (a restart from an older save of its sessions) and took the id
    as free. It is given out, in place of the held one (counted in ``ids_reused``, logged once
    per connection): taking it for a resend would lose it, as the server counts it delivered
    once it has our PUBREC. It is Mosquitto's rule, and edgebroker's broker side's for DUP 0.
    When a digest is missing (an oversized PUBLISH, or an id of a state file that kept none),
    DUP decides: set, a resend (MQTT-3.3.1-1); not set, a new message. (So a new message
    identical in topic, payload and RETAIN under a held id is taken for a resend: dropped.)"""
    if qos == 1:
        if conn.auto_ack:
            conn._out.append(encode_puback(pid))
    elif qos == 2:
        held = conn._incoming_qos2
        if pid in held:
            was = held[pid]
            if dup if was is None or known is None else was == known:
                conn.duplicates_dropped += 1
                if pid not in conn._unacked:   # (not yet acknowledged: ack() sends the PUBREC)
                    conn._out.append(encode_ack(P.PUBREC, pid))
                return False
            _reused(conn, pid, dup, was is None or known is None)
        elif len(held) >= conn._receive_max:
            raise ProtocolError(f"a QoS 2 PUBLISH beyond the Receive Maximum "
                                f"({conn._receive_max})", rule="MQTT-3.3.4-9",
                                reason=RECEIVE_MAXIMUM_EXCEEDED)
        held[pid] = known
        if conn.auto_ack:
            conn._out.append(encode_ack(P.PUBREC, pid))
    return True


def _reused(conn, pid: int, dup: bool, by_dup: bool) -> None:
    conn.ids_reused += 1
    if not conn._reuse_logged:
        conn._reuse_logged = True
        why = ("DUP 0, and no digest of one of them to compare" if by_dup
               else "another topic, payload or RETAIN than the held one")
        log.warning("client %r: the server sent a different QoS 2 message (DUP %d) under packet "
                    "id %d, which still awaited its PUBREL (%s): the server forgot that "
                    "exchange (its session was restored from an older state); taken as a new "
                    "message (counted in ids_reused; logged once per connection)",
                    conn.client_id, dup, pid, why)


def on_publish(conn, p: P.Publish, events: list) -> None:
    topic = p.topic
    props = p.properties
    if props is not None and TOPIC_ALIAS in props:
        topic = _alias(conn, topic, props[TOPIC_ALIAS])
    qos = p.qos
    pid = p.packet_id
    auto = conn.auto_ack
    known = digest(topic, p.payload, p.retain) if qos == 2 else None
    if not taken(conn, qos, pid, p.dup, known):
        return
    message = Message(topic, p.payload, qos, p.retain, p.dup, props, pid)
    if qos and not auto:
        conn._unacked[pid] = message
    events.append(message)


def _alias(conn, topic: str, alias: int) -> str:
    if alias > conn._alias_max:
        raise ProtocolError(f"PUBLISH with Topic Alias {alias}, above the Topic Alias "
                            f"Maximum the client sent ({conn._alias_max})",
                            rule="MQTT-3.3.2-10", reason=TOPIC_ALIAS_INVALID)
    if topic:
        conn._aliases[alias] = topic
        return topic
    known = conn._aliases.get(alias)
    if known is None:
        raise ProtocolError(f"PUBLISH with an empty topic name and Topic Alias {alias}, "
                            f"which names no topic yet", rule="MQTT-3.3.2.3.4",
                            reason=PROTOCOL_ERROR)
    return known


def on_ack(conn, p, events: list) -> None:
    """PUBACK (QoS 1) and PUBCOMP (QoS 2): the request is done."""
    pid = p.packet_id
    req = conn._inflight.get(pid)
    if req is None or req.kind is not PUBLISH or req.qos != (1 if p.type == P.PUBACK else 2):
        conn.unexpected_acks += 1
        return
    if req.qos == 2 and req.stage != STAGE_PUBREL:
        raise ProtocolError(f"PUBCOMP for packet identifier {pid} before its PUBREC (no "
                            f"PUBREL was sent)", rule="MQTT-4.3.3", reason=PROTOCOL_ERROR)
    conn._answered(req)
    code = p.reason_code    # (one not listed: the lenient client decoder, mqtt/decode5.py)
    events.append(Acked(req, code, code >= 0x80 and code not in REASONS[p.type]))


def on_pubrec(conn, p: P.Pubrec, events: list) -> None:
    pid = p.packet_id
    req = conn._inflight.get(pid)
    if req is None or req.kind is not PUBLISH or req.qos != 2:
        conn.unexpected_acks += 1
        if p.reason_code < 0x80:   # let the server end its exchange (5.0: not found)
            conn._out.append(encode_ack5(P.PUBREL, pid, PACKET_ID_NOT_FOUND) if conn._v5
                             else encode_ack(P.PUBREL, pid))
        return
    if p.reason_code >= 0x80:      # refused: the exchange ends here (5.0)
        conn._answered(req)
        events.append(Acked(req, p.reason_code, p.reason_code not in REASONS[P.PUBREC]))
        return
    req.stage = STAGE_PUBREL
    conn._out.append(encode_ack(P.PUBREL, pid))


def on_pubrel(conn, p: P.Pubrel, events: list) -> None:
    pid = p.packet_id
    if pid in conn._incoming_qos2:
        del conn._incoming_qos2[pid]
        conn._unacked.pop(pid, None)   # (a PUBREL before our PUBREC: the exchange ends)
        conn._out.append(encode_ack(P.PUBCOMP, pid))
    else:
        conn._out.append(encode_ack5(P.PUBCOMP, pid, PACKET_ID_NOT_FOUND) if conn._v5
                         else encode_ack(P.PUBCOMP, pid))


def on_suback(conn, p, events: list) -> None:
    pid = p.packet_id
    req = conn._inflight.get(pid)
    want = SUBSCRIBE if p.type == P.SUBACK else UNSUBSCRIBE
    if req is None or req.kind is not want:
        conn.unexpected_acks += 1
        return
    codes = p.return_codes if want is SUBSCRIBE else (p.reason_codes or [])
    if codes and len(codes) != len(req.filters):
        raise ProtocolError(f"{P.NAMES[p.type]} with {len(codes)} codes for "
                            f"{len(req.filters)} topic filters", rule="MQTT-3.9.3-1",
                            reason=PROTOCOL_ERROR)
    conn._answered(req)
    known = conn._subscriptions
    if want is SUBSCRIBE:
        for (topic_filter, options), code in zip(req.filters, codes):
            if code < 0x80:
                known[topic_filter] = (options, req.properties)
            else:
                known.pop(topic_filter, None)
        events.append(Subscribed(req, codes))
    else:
        for i, topic_filter in enumerate(req.filters):
            if i >= len(codes) or codes[i] < 0x80:
                known.pop(topic_filter, None)
        events.append(Unsubscribed(req, codes))


def on_pingresp(conn, p, events: list) -> None:
    conn._ping_due = None


def on_disconnect(conn, p: P.Disconnect, events: list) -> None:
    code = p.reason_code
    reason = REASON_NAMES.get(code, "unknown") if conn._v5 else "DISCONNECT from the server"
    text = (p.properties or {}).get(REASON_STRING)
    conn._lose()
    conn._out = []
    events.append(Disconnected(code, f"{reason}: {text}" if text else reason))


def protocol_error(conn, exc: ProtocolError, events: list, data=b"") -> None:
    """The server broke the protocol (``exc``, in the bytes ``data``): the connection ends
    (5.0: DISCONNECT with the reason code) and the caller closes the transport. Before the
    CONNACK, an answer in HTTP is said to be one (a WebSocket port: its first byte, ``H``,
    reads as a PUBACK with bad flags), and nothing is sent to it."""
    reason = exc.reason
    http = http_answer(data) if conn.state is CONNECTING else None
    conn._lose()
    conn._out = [encode_disconnect5(reason)] if conn._v5 and not http else []
    events.append(Disconnected(reason, http or f"the server broke the protocol: {exc}"))


def http_answer(data) -> str | None:
    """The words for the server's first bytes ``data`` when they begin as an HTTP answer
    does (``HTTP/``, or as much of it as came), else None."""
    head = bytes(data[:5])
    if not head or not b"HTTP/".startswith(head):
        return None
    line = bytes(data[:60]).split(b"\r\n", 1)[0].decode("ascii", "replace")
    return f"the server answered with HTTP, not MQTT ({line!r}): a WebSocket port? use ws://"


def on_skipped(conn, p, events: list) -> None:
    """An oversized PUBLISH read past: acknowledged as a message is (on_publish), and given out
    as ``Oversized``."""
    qos = p.qos
    pid = p.packet_id
    auto = conn.auto_ack
    conn.oversized_dropped += 1
    if not taken(conn, qos, pid, p.dup):
        return
    event = Oversized(p.topic, p.size, conn._max_packet, qos, p.retain, p.dup, pid)
    if qos and not auto:
        conn._unacked[pid] = event
    events.append(event)


# State -> packet type -> handler: what the server may send in each state (SKIPPED: an
# oversized PUBLISH read past, client/oversize.py).
HANDLERS = {
    CONNECTING: {P.CONNACK: on_connack, P.DISCONNECT: on_disconnect},
    CONNECTED: {
        P.PUBLISH: on_publish, P.PUBACK: on_ack, P.PUBREC: on_pubrec, P.PUBREL: on_pubrel,
        P.PUBCOMP: on_ack, P.SUBACK: on_suback, P.UNSUBACK: on_suback,
        P.PINGRESP: on_pingresp, P.DISCONNECT: on_disconnect, SKIPPED: on_skipped,
    },
}
