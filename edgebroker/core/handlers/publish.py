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

from edgebroker.commitlog.errors import LogFullError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.fields import check_code_points
from edgebroker.mqtt.encode import encode_ack, encode_puback

log = logging.getLogger("edgebroker.client")

# At most this many denied topics are logged per connection (all are counted).
_DENIALS_LOGGED = 16


def on_publish(client, p: P.Publish) -> None:
    broker = client.broker
    qos = p.qos
    client.msgs_in += 1
    if broker.clock() - client.last_seen < broker.prompt_gap:
        # A fast publisher (it sent something moments ago) may be waiting for this
        # PUBACK: no coalescing delay for it (Broker.prompt).
        broker.prompt = True
    topic = p.topic
    if topic in broker.known_topics and client.acl is None:
        publish = broker.publish  # the common case: only admitted topics are known
    else:
        publish = _publisher(client, p)
        if publish is None:
            return
    try:
        if qos == 0:
            publish(topic, p.payload, 0, p.retain, client)
            return
        pid = p.packet_id
        if qos == 1:
            offset = publish(topic, p.payload, 1, p.retain, client)
            broker.acknowledge(client, offset, encode_puback(pid))
        else:
            # Exactly once: route on first receipt, ignore re-sends (DUP set) until PUBREL.
            offset = None
            awaiting = client.session.awaiting_release
            if pid not in awaiting or not p.dup:
                if pid in awaiting:
                    _reused_id(client, pid)
                offset = publish(topic, p.payload, 2, p.retain, client)
                session = client.session
                session.own_awaiting_release().add(pid)
                if offset is not None and not session.clean and broker.exchanges is not None:
                    broker.exchanges.received(session.client_id, pid, offset)
            broker.acknowledge(client, offset, encode_ack(P.PUBREC, pid))
    except LogFullError:
        # Not logged, so neither routed nor acknowledged: the client sends
        # it again after reconnecting. Its socket is no longer read meanwhile.
        return
    broker.stats.packets_sent += 1


def on_publish_rated(client, p: P.Publish) -> None:
    """PUBLISH when messages_rate or bytes_rate is set: handled, then charged."""
    on_publish(client, p)
    if client.closed:
        return
    over = client.rate.charge(len(p.payload) + len(p.topic.encode()), client.last_seen)
    if over is not None:
        client.throttle(*over)  # this message went through; reading stops after it


def _reused_id(client, pid: int) -> None:
    """A QoS 2 PUBLISH without DUP for a packet id still awaiting PUBREL: a re-send sets
    DUP (MQTT-3.3.1-1), so this is a new message and the client has finished the old
    exchange. That happens after a crash, when the snapshot still held the id: routed,
    as a new message must be (MQTT-4.3.3-2)."""
    client.warn_once("qos2_id_reused",
                     "QoS 2 PUBLISH with packet id %d (DUP 0) while that id awaits PUBREL: taken "
                     "as a new message (the id was held from before a crash, or the client does "
                     "not set DUP on re-sends)", pid)


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


def _drop_sys_publish(topic: str, payload: bytes, qos: int, retain: bool, client) -> None:
    broker = client.broker
    broker.stats.publish_received += 1
    broker.drop("sys_topic", client.session)
    client.warn_once("sys_topic", "publish to %r dropped: $SYS topics are written only by the "
                     "broker", topic)


def _drop_denied_publish(topic: str, payload: bytes, qos: int, retain: bool, client) -> None:
    broker = client.broker
    stats = broker.stats
    stats.publish_received += 1
    stats.acl_publish_denied += 1
    broker.drop("acl", client.session)
    logged = client.denied_logged
    if logged is None:
        logged = client.denied_logged = set()
    if topic in logged or len(logged) > _DENIALS_LOGGED:
        return
    logged.add(topic)
    if len(logged) > _DENIALS_LOGGED:
        log.warning("%s: more publishes denied by the ACL; counted, no longer logged for "
                    "this connection", client.describe())
    else:
        log.warning("%s: publish to %r denied by the ACL; dropped", client.describe(), topic)


def _refuse_publish(client, p: P.Publish, limit: str) -> None:
    """A PUBLISH to a topic the topic table does not admit."""
    broker = client.broker
    broker.hit(limit)
    broker.drop(limit, client.session)
    broker.stats.publish_received += 1
    value = broker.memory.limit if limit == "memory_limit" else getattr(broker.limits, limit)
    if p.qos == 0:
        client.warn_once(limit, "publish to new topic %r refused: %s (%d); QoS 0 messages to "
                         "new topics are dropped", p.topic, limit, value)
        return
    log.warning("%s: publish to new topic %r refused: %s (%d); closing the connection "
                "(QoS %d: MQTT 3.1.1 has no negative acknowledgement)", client.describe(),
                p.topic, limit, value, p.qos)
    client.close(will=True)
