"""A bridge's inbound side: messages from the remote's subscriptions published here.

Each message goes through the core's own publish path (``Broker.publish``: logged, routed
to the local subscribers, retained when flagged) under the local topic its ``in`` rule maps
it to, with the limits a client's PUBLISH meets: ``$SYS`` topics are dropped, a topic not
yet known must be a valid topic name (the prefixes may make it empty or too long), be
admitted by the topic table (max_topics, max_topics_per_client: the
bridge's client id counts as one client) and hold no control character or non-character
(``check_code_points``), a retained message is dropped when ``retain_available`` is false,
and so is a 5.0 message with Payload Format Indicator 1 whose payload is not UTF-8.
A PUBLISH over ``max_packet_size`` (the connection's limit) is read past by the connection
(client/oversize.py, without its payload) and dropped (``oversized``): acknowledged, as it
can never be taken here and the remote would else send it first again at every connection,
holding back all behind it. Any other packet over the limit closes the link
(``too_large``). The remote's retained message for a topic whose local retained message is
newer and not yet at the remote is dropped (``_stale``, docs/bridge.md "Retained
messages"). Each drop is counted (``dropped``, reason ``bridge_in``) and
logged once per bridge and reason.

On MQTT 5.0 a message's properties go with it, as with a client's PUBLISH (user properties,
content type, response topic, correlation data, payload format indicator; not its Topic
Alias, resolved by the connection, nor a Subscription Identifier): logged, forwarded to 5.0
subscribers, and its Message Expiry Interval (the remote's, already counted down by the
time it waited there) counted down here from its arrival (MQTT-3.3.2-5, -6, -15 to -20).

On MQTT 5.0 a message two overlapping ``in`` rules match may come once per subscription:
each copy is published (bridge/subscribing.py says why none is skipped).

The publisher id written in the log is the bridge's client id: that is the origin marker
the outbound side reads to never send such a record back out (docs/bridge.md).

A QoS 1/2 message is acknowledged to the remote (PUBACK, PUBREC: the connection runs with
``auto_ack=False``) only once its record is safe under ``durability``, through the journal's
own gate (``Journal.acknowledge``, as a client's PUBACK): the journal hands the ``Message``
back to ``LinkAsPublisher.transport.write`` (``Bridge.write``). So a crash or a
power cut before the write leaves the message unacknowledged, and the remote sends it again.
A message dropped here is acknowledged at once (behind the ones waiting): it is not wanted.

When the commit log cannot take a QoS 1/2 message (a full or failing disk) the journal
pauses its publisher: here that stops reading the link (``LinkAsPublisher.pause_reading``),
so the remote holds what follows. The messages already read are held in order, not
acknowledged (at most one read of the link), and published again when the log writes again
(``retry``).
"""

from __future__ import annotations

import logging

from edgebroker.bridge.outbound import shown
from edgebroker.bridge.rules import topic_problem
from edgebroker.client.events import Oversized
from edgebroker.commitlog.errors import LogFullError
from edgebroker.core.mqtt5 import message_properties
from edgebroker.errors import ProtocolError
from edgebroker.mqtt.fields import check_code_points
from edgebroker.mqtt.properties import PAYLOAD_FORMAT, payload_utf8_error

log = logging.getLogger("edgebroker.bridge")


class LinkAsPublisher:
    """What the core's publish path asks of a publisher, for the bridge's inbound side."""

    __slots__ = ("client_id", "client_id_bytes", "transport", "closed", "acl", "session")

    def __init__(self, client_id: str, transport):
        self.client_id = client_id
        self.client_id_bytes = client_id.encode("utf-8")
        self.transport = transport   # pause_reading / resume_reading (the bridge's link)
        self.closed = False
        self.acl = None
        self.session = None

    def describe(self) -> str:
        return f"bridge client {self.client_id!r}"

    # The journal's pause while the commit log cannot write: the link is not read.
    def stop_reading(self, reason: str) -> None:
        self.transport.pause_reading(reason)

    def read_again(self, reason: str) -> None:
        self.transport.resume_reading(reason)


class Inbound:
    def __init__(self, name: str, broker, rules, publisher: LinkAsPublisher):
        self.name = name
        self.broker = broker
        self.rules = rules
        self.publisher = publisher
        self.received = 0        # messages from the remote published here
        self.dropped = 0
        self.held: list = []     # Messages the log could not take, in order (see retry)
        # The first log offset not handed to the remote before this link's SUBSCRIBE (None:
        # not subscribed on this link); ``acked_below``: the outbound cursor (see _stale).
        self.fresh_from: int | None = None
        self.acked_below = None
        self.v5 = False
        # The remote keeps the retain flag as published on live messages: 5.0 (Retain As
        # Published) or 3.1.1 with the bridge marker accepted (bridge/reconnect.py)
        self.as_published = False
        self._warned: set[str] = set()

    def message(self, event) -> None:
        """A ``Message`` event from the remote: published here, acknowledged when written."""
        if self.held:
            self.held.append(event)      # behind those waiting for the log
            return
        topic, payload, qos, retain = event.topic, event.payload, event.qos, event.retain
        local = self.rules.incoming(topic)
        if local is None:
            return self._drop(event, "unasked", f"a message on {shown(topic)}, which no in rule "
                                                f"matches")
        if local.startswith("$SYS"):
            return self._drop(event, "sys_topic", f"a message for {local!r}: $SYS topics are "
                                                  f"written only by the broker")
        broker = self.broker
        if retain and not broker.limits.retain_available:
            return self._drop(event, "retain_available", f"a retained message for {local!r} "
                                                         f"while retain_available is false")
        if retain and self._stale(local, topic):
            return self._drop(event, "retained_stale", f"the remote's retained message for "
                              f"{local!r}: this broker holds a newer one, not yet at the "
                              f"remote (it goes out behind the subscription)")
        props = event.properties     # (5.0) forwarded unaltered, the expiry counted from now
        if props and props.get(PAYLOAD_FORMAT) == 1:
            problem = payload_utf8_error(payload)
            if problem is not None:     # as a client's PUBLISH (refused there with 0x99)
                return self._drop(event, "payload_format", f"a message for {local!r}: "
                                  f"{problem} (Payload Format Indicator 1)")
        if local not in broker.known_topics:
            problem = topic_problem(local)
            if problem is not None:     # the prefixes made it so (empty, too long)
                return self._drop(event, "topic_invalid", f"a message on {shown(topic)}: its "
                                  f"local topic {shown(local)} is no valid topic name "
                                  f"({problem[:200]})")
            try:    # as a client's PUBLISH: checked once per topic, when it is new
                check_code_points(local, "topic")
            except ProtocolError as exc:
                return self._drop(event, "code_points", f"a message for {local!r}: {exc}")
            refused = broker.admit_topic(local, self.publisher, retain)
            if refused is not None:
                broker.hit(refused)     # a limit reached, as for a client's PUBLISH
                return self._drop(event, refused, f"a message for the new topic {local!r}: "
                                                  f"{refused}")
        properties, expiry = message_properties(props) if props else (b"", None)
        try:
            offset = broker.publish(local, payload, qos, retain, self.publisher, properties,
                                    expiry)
        except LogFullError:
            self.held.append(event)
            if "log_full" not in self._warned:
                self._warned.add("log_full")
                log.warning("bridge %s: the commit log cannot take a QoS %d message for %s: "
                            "held, not acknowledged, and reading the link paused until the "
                            "log writes again (logged once)", self.name, qos, shown(local))
            return
        self.received += 1
        if qos:
            broker.acknowledge(self.publisher, offset, event)

    def _stale(self, local: str, remote: str) -> bool:
        """Whether a retained message from the remote for ``local`` is older than the local
        retained message there: one published here (not by this bridge) that goes out to the
        same remote topic and was not handed to the remote before this link's SUBSCRIBE, so
        the remote's answer to it cannot hold it. On plain 3.1.1 a retained flag comes only
        with that answer (live deliveries have retain 0, MQTT-3.3.1-9); on 5.0 (Retain As
        Published) and on 3.1.1 with the bridge marker a live one may carry it too: there the
        local one must also not be acknowledged by the remote yet (a message the remote took
        after ours is newer)."""
        fresh = self.fresh_from
        if fresh is None:
            return False
        newest = None
        for message in reversed(self.broker.unrouted):   # logged, not yet stored (this pass)
            if message.retain and message.topic == local:
                newest = message
                break
        if newest is None:
            newest = self.broker.retained.get(local)
        if newest is None or newest.offset is None or newest.offset < fresh:
            return False
        if newest.client_id == self.publisher.client_id:
            return False
        if self.as_published and newest.offset < self.acked_below():
            return False
        out = self.rules.outgoing(local.encode("utf-8"))
        return out is not None and out[0] == remote and out[2] is None

    def link_lost(self) -> None:
        """The link broke and the remote keeps the session: held QoS 1 messages cannot be
        acknowledged any more, and the remote sends them again on the next link (a new
        ``Message``): not kept, so none is published twice. QoS 2 ones stay (the connection
        gives their identifier out once, and answers it when acknowledged); QoS 0 ones are
        never sent again."""
        if self.held:
            self.held = [event for event in self.held if event.qos != 1]

    def retry(self) -> None:
        """The log writes again: publish the held messages, in order (those the log still
        cannot take are held again)."""
        held, self.held = self.held, []
        for event in held:
            (self.oversized if type(event) is Oversized else self.message)(event)

    def oversized(self, event) -> None:
        """An ``Oversized`` event: a PUBLISH over ``max_packet_size`` that the connection read
        past. Dropped and acknowledged (in order, behind the messages waiting): it can never
        be taken here, and the link goes on."""
        if self.held:
            self.held.append(event)      # behind those waiting for the log
            return
        self.broker.hit("max_packet_size")
        self._drop(event, "too_large", f"a message of {event.size} bytes on "
                   f"{shown(event.topic)}, over max_packet_size ({event.limit}): acknowledged "
                   f"to the remote, which would else send it again first at every connection")

    def too_large(self, what: str) -> None:
        """The remote sent a packet over ``max_packet_size`` that is no PUBLISH (the link is
        closed: its body cannot be read past)."""
        self.broker.hit("max_packet_size")
        self._count("packet_too_large", f"a packet from the remote ({what}); the link is "
                                        f"closed and connects again")

    def _drop(self, event, reason: str, what: str) -> None:
        if event.qos:   # not wanted here: acknowledged, behind the acknowledgements waiting
            self.broker.acknowledge(self.publisher, None, event)
        self._count(reason, what)

    def _count(self, reason: str, what: str) -> None:
        self.dropped += 1
        self.broker.drop("bridge_in", None, 1)
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("bridge %s: dropped %s (counted as dropped, bridge_in; logged once per "
                        "reason)", self.name, what)
