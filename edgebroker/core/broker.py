"""The broker: sessions, routing, retained messages, wills and timers.

No sockets and no clock of its own: the server layer hands in transports and
a clock, and calls ``tick`` when ``next_deadline`` comes due. Keepalive and
CONNECT timeouts live in one deadline heap with at most one entry per client;
an entry that comes due early (the client was active since) is pushed back to
its real deadline, so no pass ever scans all clients.
"""

from __future__ import annotations

import heapq
import itertools
import logging

from edgebroker.config import Config
from edgebroker.core.client import Client
from edgebroker.core.session import AWAIT_ACK, Message, Outgoing, Session
from edgebroker.core.stats import Stats, SysTopics
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.codec import encode_ack, encode_publish_head
from edgebroker.mqtt.trie import RetainedTree, SubscriptionTrie

log = logging.getLogger("edgebroker.broker")

# Payloads up to this size are joined with their header once per message, so
# each subscriber gets one buffer; larger ones are queued as header + payload
# to avoid copying them.
_JOIN_LIMIT = 4096


class Broker:
    def __init__(self, config: Config, clock):
        self.config = config
        self.limits = config.limits
        self.clock = clock
        self.started = clock()
        self.sessions: dict[str, Session] = {}
        self.subscriptions = SubscriptionTrie()
        self.retained = RetainedTree()
        self.stats = Stats()
        self.clients_connected = 0
        self._timers: list = []
        self._seq = itertools.count()
        self.sys = SysTopics(self, self.started)

    # ----- connections ------------------------------------------------------------------

    def connection_made(self, transport) -> Client:
        self.stats.sockets_accepted += 1
        client = Client(self, transport, self.clock())
        self.schedule(client)
        return client

    def attach(self, client: Client, client_id: str, clean: bool) -> tuple[Session, bool]:
        """Bind a newly connected client to its session; returns (session, present)."""
        old = self.sessions.get(client_id)
        if old is not None and old.client is not None:
            log.info("client %r from %s takes over the session; closing the connection from %s",
                     client_id, client.peer, old.client.peer)
            self.stats.takeovers += 1
            old.client.close(will=True)
            old = self.sessions.get(client_id)
        present = False
        if old is not None and (clean or old.clean):
            self.drop_session(old)
            old = None
        if old is None:
            session = self.sessions[client_id] = Session(client_id, clean)
        else:
            session, present = old, True
        session.client = client
        self.clients_connected += 1
        self.stats.connects_accepted += 1
        return session, present

    def detach(self, client: Client, publish_will: bool) -> None:
        """A connected client's connection ended (its will is still on it)."""
        self.clients_connected -= 1
        session = client.session
        if session is not None and session.client is client:
            session.client = None
            if session.clean:
                self.drop_session(session)
        will = client.will
        if publish_will and will is not None:
            log.info("publishing will of %s on %r", client.describe(), will.topic)
            self.publish(will.topic, will.payload, will.qos, will.retain)

    def drop_session(self, session: Session) -> None:
        for topic_filter in session.subscriptions:
            self.subscriptions.remove(topic_filter, session)
        session.subscriptions.clear()
        session.queue.clear()
        session.inflight.clear()
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]

    def close_all(self) -> None:
        """Close every connection (at shutdown): no wills, sessions kept."""
        for session in list(self.sessions.values()):
            if session.client is not None:
                session.client.will = None
                session.client.close(will=False)

    # ----- timers -----------------------------------------------------------------------

    def schedule(self, client: Client) -> None:
        due = client.deadline()
        if due is None:
            return
        if client.timer_at is None or due < client.timer_at:
            client.timer_at = due
            heapq.heappush(self._timers, (due, next(self._seq), client))

    def next_deadline(self) -> float | None:
        due = self.sys.next_due
        if self._timers and (due is None or self._timers[0][0] < due):
            return self._timers[0][0]
        return due

    def tick(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, client = heapq.heappop(timers)
            client.timer_at = None
            if client.closed:
                continue
            due = client.deadline()
            if due is None:
                continue
            if due <= now:
                client.expire()
            else:
                client.timer_at = due
                heapq.heappush(timers, (due, next(self._seq), client))
        if self.sys.next_due is not None and self.sys.next_due <= now:
            self.sys.publish(now)

    def apply_config(self, config: Config) -> None:
        """Settings that take effect without a restart (SIGHUP)."""
        self.config = config
        self.limits = config.limits
        self.sys.configure(self.clock())

    # ----- routing ----------------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """A client's (or a will's) PUBLISH: counted, then routed."""
        self.stats.publish_received += 1
        self.route(topic, payload, qos, retain)

    def route(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """Store if retained, then deliver to every matching subscription."""
        stats = self.stats
        message = Message(topic, payload, qos, retain)
        if retain:
            if payload:
                self.retained.set(topic, message)
            else:
                self.retained.delete(topic)
        targets = self.subscriptions.match(topic)
        if not targets:
            stats.publish_unrouted += 1
            return
        frame0 = None
        for session, sub_qos in targets:
            acl = session.acl
            if acl is not None:
                allowed = acl.reads.get(topic)
                if allowed is None:
                    allowed = acl.check_read(topic)
                if not allowed:
                    stats.acl_deliveries_denied += 1
                    continue
            q = qos if qos < sub_qos else sub_qos
            client = session.client
            if q == 0:
                if client is None:
                    if self.limits.queue_qos0_messages and not session.clean:
                        self._enqueue(session, message, 0, False)
                    continue
                if frame0 is None:
                    frame0 = self._frame0(message)
                write = client.transport.write
                for part in frame0:
                    write(part)
                stats.publish_sent += 1
            elif (client is not None and not session.queue
                  and len(session.inflight) < self.limits.max_inflight_messages):
                self._send(session, message, q, False)
            else:
                self._enqueue(session, message, q, False)

    @staticmethod
    def _frame0(message: Message) -> tuple:
        payload = message.payload
        head = encode_publish_head(message.topic_bytes, len(payload), 0, False, False, None)
        if len(payload) <= _JOIN_LIMIT:
            return (head + payload,)
        return (head, payload)

    def _send(self, session: Session, message: Message, qos: int, retain: bool) -> None:
        """Send a QoS 1/2 message in the session's window (the client is online)."""
        pid = session.allocate_id()
        session.inflight[pid] = Outgoing(message, qos, retain)
        self._write_publish(session.client, message, qos, retain, False, pid)

    def _write_publish(self, client, message, qos, retain, dup, pid) -> None:
        payload = message.payload
        head = encode_publish_head(message.topic_bytes, len(payload), qos, retain, dup, pid)
        write = client.transport.write
        if len(payload) <= _JOIN_LIMIT:
            write(head + payload)
        else:
            write(head)
            write(payload)
        self.stats.publish_sent += 1

    def _enqueue(self, session: Session, message: Message, qos: int, retain: bool) -> None:
        if len(session.queue) >= self.limits.max_queued_messages:
            self.stats.publish_dropped += 1
            if not session.dropped:
                log.warning("session %r: queue full (%d messages, max_queued_messages); "
                            "dropping new messages until it drains",
                            session.client_id, len(session.queue))
            session.dropped += 1
            return
        session.queue.append((message, qos, retain))

    def pump(self, session: Session) -> None:
        """Move queued messages into the window while the client is online."""
        client = session.client
        if client is None:
            return
        queue = session.queue
        inflight = session.inflight
        window = self.limits.max_inflight_messages
        while queue:
            message, qos, retain = queue[0]
            if qos == 0:
                queue.popleft()
                self._write_publish(client, message, 0, retain, False, None)
            elif len(inflight) < window:
                queue.popleft()
                self._send(session, message, qos, retain)
            else:
                break
        if not queue and session.dropped:
            log.warning("session %r: queue drained; %d messages were dropped while it was full",
                        session.client_id, session.dropped)
            session.dropped = 0

    def resume(self, session: Session) -> None:
        """A persistent session's client is back: re-send the window, then the queue."""
        client = session.client
        for pid, entry in session.inflight.items():
            if entry.state == AWAIT_ACK:
                self._write_publish(client, entry.message, entry.qos, entry.retain, True, pid)
            else:
                client.transport.write(encode_ack(P.PUBREL, pid))
        self.pump(session)

    # ----- subscriptions ----------------------------------------------------------------

    def subscribe(self, session: Session, topics: list[tuple[str, int]]) -> list[int]:
        granted = []
        for topic_filter, qos in topics:
            self.subscriptions.add(topic_filter, session, qos)
            session.subscriptions[topic_filter] = qos
            granted.append(qos)
        return granted

    def send_retained(self, session: Session, topics, granted: list[int]) -> None:
        """Retained messages for new (or replaced) subscriptions, retain flag set."""
        client = session.client
        acl = session.acl
        for (topic_filter, _), max_qos in zip(topics, granted):
            if max_qos == P.SUBACK_FAILURE:
                continue
            for message in self.retained.match(topic_filter):
                if acl is not None and not acl.can_read(message.topic):
                    self.stats.acl_deliveries_denied += 1
                    continue
                qos = message.qos if message.qos < max_qos else max_qos
                if qos == 0:
                    self._write_publish(client, message, 0, True, False, None)
                elif not session.queue and len(session.inflight) < self.limits.max_inflight_messages:
                    self._send(session, message, qos, True)
                else:
                    self._enqueue(session, message, qos, True)

    def unsubscribe(self, session: Session, filters: list[str]) -> None:
        for topic_filter in filters:
            if session.subscriptions.pop(topic_filter, None) is not None:
                self.subscriptions.remove(topic_filter, session)
