"""PUBLISH from a client: limits, ACL, $SYS, then the broker's ``publish`` and the acknowledgement.

The hot path: a topic already known (admitted by the topic table) from a client
without an ACL goes straight to ``broker.publish``. Limits on PUBLISH
(docs/limits.md): a topic not yet tracked must be admitted by the topic table
(QoS 0 over a limit: dropped; QoS 1/2: the connection closes, as 3.1.1 has no
negative acknowledgement). A client over its publish rate is throttled
(``on_publish_rated``): its socket is not read until its bucket refills (a timer
in the broker's heap), so TCP pushes back on it alone.
"""

from __future__ import annotations

import logging
import zlib

from edgebroker.commitlog.errors import LogFullError
from edgebroker.core import mqtt5
from edgebroker.core.handlers.acks import charge_properties, forget_inherited
from edgebroker.errors import (
    NOT_AUTHORIZED, PAYLOAD_FORMAT_INVALID, PROTOCOL_ERROR, QOS_NOT_SUPPORTED, QUOTA_EXCEEDED,
    RECEIVE_MAXIMUM_EXCEEDED, RETAIN_NOT_SUPPORTED, TOPIC_ALIAS_INVALID, ProtocolError, shown,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt import properties as Q
from edgebroker.mqtt.fields import check_code_points
from edgebroker.mqtt.encode import encode_ack, encode_puback
from edgebroker.mqtt.properties import payload_utf8_error

log = logging.getLogger("edgebroker.client")


def on_publish(client, p: P.Publish, properties: bytes = b"", expiry: int | None = None) -> None:
    broker = client.broker
    qos = p.qos
    client.msgs_in += 1
    if broker.clock() - client.last_seen < broker.prompt_gap:
        # A fast publisher (it sent something moments ago) may be waiting for this
        # PUBACK: no coalescing delay for it (Broker.prompt).
        broker.prompt = True
    if qos == 2 and client.v5 is None:      # (5.0: the Receive Maximum, in on_publish5)
        awaiting = client.session.awaiting_release
        if (len(awaiting) >= broker.limits.receive_maximum and p.packet_id not in awaiting
                and not forget_inherited(client, awaiting)):
            return _over_receive_maximum(client, p, len(awaiting))
    topic = p.topic
    if p.retain and not broker.limits.retain_available and client.v5 is None:  # (5.0: above)
        raise ProtocolError("retained PUBLISH and retain_available is false",
                            rule="retain_available", reason=RETAIN_NOT_SUPPORTED)
    if topic in broker.known_topics and client.acl is None:
        publish = broker.publish  # the common case: only admitted topics are known
    else:
        publish = _publisher(client, p)
        if publish is None:
            return
    try:
        if qos == 0:
            publish(topic, p.payload, 0, p.retain, client, properties, expiry)
            return
        pid = p.packet_id
        if qos == 1:
            offset = publish(topic, p.payload, 1, p.retain, client, properties, expiry)
            broker.acknowledge(client, offset, encode_puback(pid))
        else:
            # Exactly once: route on first receipt; until PUBREL, a re-send (DUP set, or the
            # same message without DUP, MQTT-4.3.3-2) is acknowledged, not routed again.
            offset = None
            session = client.session
            awaiting = session.awaiting_release
            # The message's digest, the same in every process (the snapshot and the exchange
            # journal keep it): CRC-32 of the topic's UTF-8, then of the payload (bytes, or a
            # bytearray when large), started from the topic's length and RETAIN.
            digest = zlib.crc32(p.payload, zlib.crc32(topic.encode(), 2 * len(topic) + p.retain))
            held = awaiting.get(pid, _NOT_HELD)
            if held is _NOT_HELD or not p.dup and held != digest:
                if held is not _NOT_HELD:
                    _reused_id(client, pid, held is None)
                offset = publish(topic, p.payload, 2, p.retain, client, properties, expiry)
                session.own_awaiting_release()[pid] = digest
                if offset is not None and not session.clean and broker.exchanges is not None:
                    broker.exchanges.received(session.client_id, pid, offset, digest)
            inherited = client.inherited
            if inherited:
                inherited.discard(pid)  # the client goes on with it here: not forgotten
            broker.acknowledge(client, offset, encode_ack(P.PUBREC, pid))
    except LogFullError:
        # Not logged, so neither routed nor acknowledged: the client sends
        # it again after reconnecting. Its socket is no longer read meanwhile.
        return
    broker.stats.packets_sent += 1


def on_publish_rated(client, p: P.Publish) -> None:
    """PUBLISH when messages_rate or bytes_rate is set: handled, then charged."""
    on_publish(client, p)
    _charge(client, p, client.broker.clock())


def _charge(client, p: P.Publish, now: float, extra: int = 0) -> None:
    if client.closed:
        return
    # (At the time it is handled: ``last_seen`` is the read before, maybe long ago.)
    over = client.rate.charge(len(p.payload) + len(p.topic.encode()) + extra, now)
    if over is not None:
        client.throttle(*over)  # this message went through; reading stops after it


# The properties of the last 5.0 PUBLISH and what message_properties made of them (the
# decoder hands PUBLISHes with the same property section as the last one the same dict).
_last_forwarded: tuple = (None, b"", None)


def on_publish5(client, p: P.Publish) -> None:
    """A 5.0 PUBLISH: its Topic Alias resolved (or set), its properties checked and kept for
    the subscribers; refusals answered with a reason code where QoS > 0 has one."""
    told = client.v5.told        # what its CONNACK said, whatever a reload changed since
    if p.qos > told.max_qos:
        raise ProtocolError(f"PUBLISH with QoS {p.qos}, above the Maximum QoS ({told.max_qos})",
                            rule="MQTT-3.2.2-11", reason=QOS_NOT_SUPPORTED)
    if p.retain and not told.retain_available:
        raise ProtocolError("retained PUBLISH while Retain Available is 0",
                            rule="MQTT-3.3.1-8", reason=RETAIN_NOT_SUPPORTED)
    awaiting = client.session.awaiting_release
    if (p.qos == 2 and len(awaiting) >= told.receive_maximum and p.packet_id not in awaiting
            and not forget_inherited(client, awaiting)):
        client.broker.hit("receive_maximum")    # (logged as the 3.1.1 case: core.violations)
        raise ProtocolError(f"QoS 2 PUBLISH (packet id {p.packet_id}) refused: {len(awaiting)} "
                            f"QoS 2 messages from it await their PUBREL (receive_maximum "
                            f"{told.receive_maximum}, its Receive Maximum)", rule="MQTT-3.3.4-7",
                            reason=RECEIVE_MAXIMUM_EXCEEDED)
    props = p.properties
    if props is not None:
        alias = props.get(Q.TOPIC_ALIAS)
        if alias is not None:
            p.topic = _alias(client, p.topic, alias)
        if Q.SUBSCRIPTION_ID in props:
            raise ProtocolError("PUBLISH from a client with a Subscription Identifier",
                                rule="MQTT-3.3.4-6", reason=PROTOCOL_ERROR)
        if Q.USER_PROPERTY in props:
            charge_properties(client, p)    # their decoding cost the loop by their number
        if props.get(Q.PAYLOAD_FORMAT) == 1:
            problem = payload_utf8_error(p.payload)
            if problem is not None:
                return _refuse5(client, p, PAYLOAD_FORMAT_INVALID, "payload_format",
                                problem + " (Payload Format Indicator 1)")
    broker = client.broker
    if p.topic not in broker.known_topics or client.acl is not None:
        publish = _publisher(client, p)
        if publish is None:
            return
        if publish is _drop_sys_publish or publish is _drop_denied_publish:  # counted, refused
            publish(p.topic, p.payload, p.qos, p.retain, client)
            if p.qos:
                _answer5(client, p, NOT_AUTHORIZED, f"publish to {p.topic!r} not authorized")
            return
    global _last_forwarded
    last = _last_forwarded
    if props is last[0]:     # the decoder's dict for the same section as the last PUBLISH's
        properties, expiry = last[1], last[2]
    else:
        properties, expiry = mqtt5.message_properties(props)
        _last_forwarded = (props, properties, expiry)
    on_publish(client, p, properties, expiry)


def on_publish5_rated(client, p: P.Publish) -> None:
    on_publish5(client, p)
    # Its properties (User Properties may be most of a packet) are paid for too.
    last = _last_forwarded
    extra = len(last[1]) if p.properties is not None and last[0] is p.properties else 0
    _charge(client, p, client.broker.clock(), extra)


def _alias(client, topic: str, alias: int) -> str:
    """The topic a 5.0 PUBLISH with Topic Alias ``alias`` goes to (setting the alias when it
    names a topic)."""
    maximum = client.v5.told.max_topic_alias
    if alias > maximum:
        raise ProtocolError(f"PUBLISH with Topic Alias {alias}, above the Topic Alias Maximum "
                            f"({maximum})", rule="MQTT-3.3.2-9", reason=TOPIC_ALIAS_INVALID)
    conn = client.v5
    if topic:
        if conn.aliases is None:
            conn.aliases = {}
        conn.aliases[alias] = topic
        return topic
    known = conn.aliases.get(alias) if conn.aliases is not None else None
    if known is None:
        raise ProtocolError(f"PUBLISH with an empty topic name and Topic Alias {alias}, which "
                            f"names no topic yet", rule="MQTT-3.3.2.3.4", reason=PROTOCOL_ERROR)
    return known


def _refuse5(client, p: P.Publish, reason: int, drop: str, why: str) -> None:
    """A 5.0 PUBLISH refused: QoS 0 closes the connection with DISCONNECT ``reason`` (it has
    no acknowledgement to say it in); QoS 1/2 get it in their PUBACK/PUBREC."""
    broker = client.broker
    broker.stats.publish_received += 1
    broker.drop(drop, client.session)
    if not p.qos:
        raise ProtocolError(why, rule="MQTT-3.3.2.3.2", reason=reason)
    client.warn_once(drop, "PUBLISH to %s refused (reason %#04x): %s",
                     shown(p.topic, 200, "characters"), reason, why)
    _answer5(client, p, reason, why)


def _answer5(client, p: P.Publish, reason: int, why: str) -> None:
    """PUBACK or PUBREC with a refusing reason code (a refused QoS 2 exchange ends there)."""
    kind = P.PUBACK if p.qos == 1 else P.PUBREC
    frame = mqtt5.refusing_ack(client.v5, kind, p.packet_id, reason, why)
    client.broker.acknowledge(client, None, frame)
    client.broker.stats.packets_sent += 1


def _over_receive_maximum(client, p: P.Publish, awaiting: int) -> None:
    """A 3.1.1 client's QoS 2 PUBLISH while ``receive_maximum`` of its QoS 2 messages await
    their PUBREL: the connection closes, as 3.1.1 has no negative acknowledgement (5.0:
    DISCONNECT 0x93). Neither routed nor acknowledged, the message is the client's to send
    again. What it published before in this read is written and acknowledged first (as
    ``Client.violation`` does): a client that pipelines more than the limit (paho-mqtt
    re-sends its whole queue at a reconnect) gets through that many on each connection."""
    broker = client.broker
    broker.hit("receive_maximum")
    broker.stats.publish_received += 1
    # A client that reconnects to try again is logged as a refused connection is (PeerLog).
    broker.peer_log.log(log, logging.WARNING, "receive_maximum", client.peer,
                        "%s: QoS 2 PUBLISH (packet id %d) to %s refused: %d QoS 2 messages from "
                        "it await their PUBREL (receive_maximum %d); closing the connection "
                        "(MQTT 3.1.1 has no negative acknowledgement)", client.describe(),
                        p.packet_id, shown(p.topic, 200, "characters"), awaiting,
                        broker.limits.receive_maximum)
    broker.before_close()   # the PUBRECs of those taken go out before the close
    client.close(will=True)


_NOT_HELD = object()    # (awaiting_release.get's default: None is a held id without digest)


def _reused_id(client, pid: int, restarted: bool) -> None:
    """A QoS 2 PUBLISH without DUP for a packet id still awaiting PUBREL, and not the message
    that id was received with (another topic, payload or RETAIN; or the id is held from
    before a restart from a snapshot or exchange journal written before they kept digests):
    a new message, so the client has finished the old exchange. Routed, as a new message
    must be (MQTT-4.3.3-2), as Mosquitto does."""
    why = ("the id is held from before a restart, whose saved state kept no digest to compare"
           if restarted else "another topic, payload or RETAIN than the message held")
    client.warn_once("qos2_id_reused",
                     "QoS 2 PUBLISH with packet id %d (DUP 0) while that id awaits PUBREL: taken "
                     "as a new message (%s)", pid, why)


def _publisher(client, p: P.Publish):
    """What takes a PUBLISH to a topic not yet known, or from a client under an ACL:
    ``broker.publish``, or a function that drops it; None when a topic limit refused it
    (the refusal is handled)."""
    broker = client.broker
    topic = p.topic
    known = topic in broker.known_topics
    if not known:
        # Checked once per topic: a known topic passed this check when admitted.
        check_code_points(topic, "PUBLISH topic name")
    # $SYS belongs to the broker: clients' publishes there are acknowledged
    # (3.1.1 has no negative ack) and dropped, as Mosquitto does. So are
    # publishes the ACL does not allow. Neither becomes a known topic.
    if topic.startswith("$SYS"):
        return _drop_sys_publish
    acl = client.acl
    if acl is not None:
        allowed = acl.writes.get(topic)     # cached decision; computed once per topic
        if allowed is None:
            allowed = acl.can_write(topic)
        if not allowed:
            return _drop_denied_publish
    if not known:
        refused = broker.admit_topic(topic, client, p.retain)
        if refused is not None:
            _refuse_publish(client, p, refused)
            return None
    return broker.publish


def _drop_sys_publish(topic: str, payload: bytes, qos: int, retain: bool, client, *_) -> None:
    broker = client.broker
    broker.stats.publish_received += 1
    broker.drop("sys_topic", client.session)
    client.warn_once("sys_topic", "publish to %s dropped: $SYS topics are written only by the "
                     "broker", shown(topic, 200, "characters"))


def _drop_denied_publish(topic: str, payload: bytes, qos: int, retain: bool, client,
                         *_) -> None:
    broker = client.broker
    stats = broker.stats
    stats.publish_received += 1
    stats.acl_publish_denied += 1
    broker.drop("acl", client.session)
    client.warn_first("acl_publish", topic, "more publishes denied by the ACL",
                      "publish to %s denied by the ACL; dropped", shown(topic, 200, "characters"))


def _refuse_publish(client, p: P.Publish, limit: str) -> None:
    """A PUBLISH to a topic the topic table does not admit. A 3.1.1 QoS 1/2 one closes the
    connection; what the client published before it in this read is acknowledged first (as
    ``Client.violation`` does), so that the client does not send those messages again."""
    broker = client.broker
    broker.hit(limit)
    broker.drop(limit, client.session)
    broker.stats.publish_received += 1
    value = broker.memory.limit if limit == "memory_limit" else getattr(broker.limits, limit)
    topic = shown(p.topic, 200, "characters")
    if p.qos == 0:
        client.warn_once("publish:" + limit, "publish to new topic %s refused: %s (%d); QoS 0 "
                         "messages to new topics are dropped", topic, limit, value)
        return
    if client.v5 is not None:
        client.warn_once("publish:" + limit, "publish to new topic %s refused: %s (%d); answered "
                         "with reason 0x97 (quota exceeded)", topic, limit, value)
        _answer5(client, p, QUOTA_EXCEEDED, f"new topic refused: {limit} ({value})")
        return
    # A client that reconnects to try again is logged as a refused connection is: the
    # first line from its address in full, then a count a minute (core.limits.PeerLog).
    broker.peer_log.log(log, logging.WARNING, "publish_refused", client.peer,
                        "%s: publish to new topic %s refused: %s (%d); closing the connection "
                        "(QoS %d: MQTT 3.1.1 has no negative acknowledgement)",
                        client.describe(), topic, limit, value, p.qos)
    broker.before_close()   # what it published before in this read is acknowledged first
    client.close(will=True)
