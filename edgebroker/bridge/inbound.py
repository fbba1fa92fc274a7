"""A bridge's inbound side: messages from the remote's subscriptions published here.

Each message goes through the core's own publish path (``Broker.publish``: logged, routed
to the local subscribers, retained when flagged) under the local topic its ``in`` rule maps
it to, with the limits a client's PUBLISH meets: ``$SYS`` topics are dropped, a topic not
yet known must be admitted by the topic table (max_topics, max_topics_per_client: the
bridge's client id counts as one client), a retained message is dropped when
``retain_available`` is false. Each drop is counted (``dropped``, reason ``bridge_in``) and
logged once per bridge and reason.

The publisher id written in the log is the bridge's client id: that is the origin marker
the outbound side reads to never send such a record back out (docs/bridge.md).

When the commit log cannot take a QoS 1/2 message (a full or failing disk) the journal
pauses its publisher: here that stops reading the link (``LinkAsPublisher.pause_reading``),
so the remote holds what follows, and the message itself is counted as dropped.
"""

from __future__ import annotations

import logging

from edgebroker.commitlog.errors import LogFullError

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


class Inbound:
    def __init__(self, name: str, broker, rules, publisher: LinkAsPublisher):
        self.name = name
        self.broker = broker
        self.rules = rules
        self.publisher = publisher
        self.received = 0        # messages from the remote published here
        self.dropped = 0
        self._warned: set[str] = set()

    def message(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        local = self.rules.incoming(topic)
        if local is None:
            return self._drop("unasked", f"a message on {topic!r}, which no in rule matches")
        if local.startswith("$SYS"):
            return self._drop("sys_topic", f"a message for {local!r}: $SYS topics are "
                                           f"written only by the broker")
        broker = self.broker
        if retain and not broker.limits.retain_available:
            return self._drop("retain_available", f"a retained message for {local!r} while "
                                                  f"retain_available is false")
        if local not in broker.known_topics:
            refused = broker.admit_topic(local, self.publisher, retain)
            if refused is not None:
                return self._drop(refused, f"a message for the new topic {local!r}: {refused}")
        try:
            broker.publish(local, payload, qos, retain, self.publisher)
        except LogFullError:
            return self._drop("log_full", f"a QoS {qos} message for {local!r}: the commit log "
                                          f"cannot write (reading the link pauses until it can)")
        self.received += 1

    def _drop(self, reason: str, what: str) -> None:
        self.dropped += 1
        self.broker.drop("bridge_in", None, 1)
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("bridge %s: dropped %s (counted as dropped, bridge_in; logged once per "
                        "reason)", self.name, what)
