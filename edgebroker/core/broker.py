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

from collections import deque

from edgebroker.commitlog.errors import LogFullError
from edgebroker.config import Config
from edgebroker.core import snapshot as snap
from edgebroker.core.client import Client
from edgebroker.core.journal import Journal
from edgebroker.core.session import AWAIT_ACK, Message, Outgoing, Session, as_offset
from edgebroker.core.stats import Stats, SysTopics
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.codec import encode_ack, encode_publish_head
from edgebroker.mqtt.trie import RetainedTree, SubscriptionTrie

log = logging.getLogger("edgebroker.broker")

# Payloads up to this size are joined with their header once per message, so
# each subscriber gets one buffer; larger ones are queued as header + payload
# to avoid copying them.
_JOIN_LIMIT = 4096

# Housekeeping cadence (log retention and rolling, retrying a failing disk,
# snapshots), in seconds of the broker's clock.
MAINTENANCE_INTERVAL = 1.0
# A snapshot is written at most this often after sessions or subscriptions
# change, and at least this often while messages flow (bounding the log replay
# at start).
SNAPSHOT_DEBOUNCE = 1.0
SNAPSHOT_EVERY = 30.0


class Broker:
    def __init__(self, config: Config, clock, commit_log=None, wall_ms=None):
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
        self.journal = (Journal(commit_log, config.log.durability, wall_ms, self.stats)
                        if commit_log is not None else None)
        self.submit_snapshot = None           # set by the server: takes encoded snapshot bytes
        self._snapshot_dirty = False
        self._snapshot_at = self.started      # when the last snapshot was taken
        self._snapshot_offset = commit_log.next_offset if commit_log is not None else 0
        self._maintenance_due = self.started + MAINTENANCE_INTERVAL
        self._lost_warned = False
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
        if not clean:
            self._snapshot_dirty = True
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
            else:
                self._go_offline(session)
        will = client.will
        if not publish_will or will is None:
            return
        if will.topic.startswith("$SYS"):
            self.stats.publish_dropped += 1
            log.warning("will of %s on %r dropped: $SYS topics are written only by the broker",
                        client.describe(), will.topic)
            return
        log.info("publishing will of %s on %r", client.describe(), will.topic)
        try:
            self.publish(will.topic, will.payload, will.qos, will.retain, client)
        except LogFullError:
            log.error("will of %s on %r lost: the commit log cannot take it",
                      client.describe(), will.topic)

    def _go_offline(self, session: Session) -> None:
        """Keep only log offsets for an offline session: its backlog costs no payload memory."""
        session.queue = deque((as_offset(ref), qos, retain) for ref, qos, retain in session.queue)
        for entry in session.inflight.values():
            entry.message = as_offset(entry.message)
        self._snapshot_dirty = True

    def drop_session(self, session: Session) -> None:
        if not session.clean:
            self._snapshot_dirty = True
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

    def next_deadline(self) -> float:
        due = self._maintenance_due
        if self.sys.next_due is not None and self.sys.next_due < due:
            due = self.sys.next_due
        if self._timers and self._timers[0][0] < due:
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
                try:
                    client.expire()
                except Exception:
                    log.exception("internal error expiring %s", client.describe())
            else:
                client.timer_at = due
                heapq.heappush(timers, (due, next(self._seq), client))
        if self.sys.next_due is not None and self.sys.next_due <= now:
            self.sys.publish(now)
        if self._maintenance_due <= now:
            self._maintenance_due = now + MAINTENANCE_INTERVAL
            self._maintain(now)

    def _maintain(self, now: float) -> None:
        journal = self.journal
        if journal is not None:
            journal.retry()
            try:
                journal.log.housekeeping()
            except Exception:
                log.exception("commit log housekeeping failed")
        if self.submit_snapshot is None:
            return
        next_offset = journal.log.next_offset if journal is not None else 0
        if ((self._snapshot_dirty and now - self._snapshot_at >= SNAPSHOT_DEBOUNCE)
                or (next_offset != self._snapshot_offset and now - self._snapshot_at >= SNAPSHOT_EVERY)):
            self.submit_snapshot(snap.encode(self.capture()))
            self._snapshot_at = now

    def apply_config(self, config: Config) -> None:
        """Settings that take effect without a restart (SIGHUP)."""
        self.config = config
        self.limits = config.limits
        self.sys.configure(self.clock())

    # ----- routing ----------------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, client) -> int | None:
        """A client's (or a will's) PUBLISH: counted, logged, then routed.

        Returns the log offset (None when not logged). Raises LogFullError when
        the log cannot take a QoS 1/2 message: it is then not routed either.
        """
        self.stats.publish_received += 1
        message = Message(topic, payload, qos, retain)
        journal = self.journal
        if journal is not None:
            message.offset = journal.append(client, message.topic_bytes, payload, qos, retain)
        self._route(message)
        return message.offset

    def route(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """The broker's own messages ($SYS): routed, not logged."""
        self._route(Message(topic, payload, qos, retain))

    def _route(self, message: Message) -> None:
        """Store if retained, then deliver to every matching subscription."""
        stats = self.stats
        topic, payload, qos = message.topic, message.payload, message.qos
        retain = message.retain
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
                if client is None or session.queue:
                    # Offline, or behind a backlog that may hold older QoS 0
                    # messages (order per topic and QoS, MQTT-4.6.0-6).
                    if self.limits.queue_qos0_messages and not session.clean:
                        self._enqueue(session, message, 0, False)
                        continue
                    if client is None:
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

    def _send(self, session: Session, ref, qos: int, retain: bool) -> None:
        """Send a QoS 1/2 message in the session's window (the client is online)."""
        pid = session.allocate_id()
        if self._write_publish(session.client, ref, qos, retain, False, pid):
            session.inflight[pid] = Outgoing(ref, qos, retain)

    def _write_publish(self, client, message, qos, retain, dup, pid) -> bool:
        """Queue one PUBLISH on the client's transport; False if its log record is gone."""
        if type(message) is not Message:
            return self._write_from_log(client, message, qos, retain, dup, pid)
        payload = message.payload
        head = encode_publish_head(message.topic_bytes, len(payload), qos, retain, dup, pid)
        write = client.transport.write
        if len(payload) <= _JOIN_LIMIT:
            write(head + payload)
        else:
            write(head)
            write(payload)
        self.stats.publish_sent += 1
        return True

    def _write_from_log(self, client, offset: int, qos, retain, dup, pid) -> bool:
        """Header from memory, payload straight from the segment file (sendfile)."""
        journal = self.journal
        where = journal.log.locate(offset) if journal is not None else None
        if where is None:
            self.stats.publish_lost += 1
            if not self._lost_warned:
                self._lost_warned = True
                log.warning("queued message at log offset %d for %s is no longer in the log "
                            "(deleted by retention or damaged); skipped (counted in "
                            "$SYS/broker/publish/messages/lost; logged once)", offset,
                            client.describe())
            return False
        head = encode_publish_head(where.topic, where.payload_length, qos, retain, dup, pid)
        client.transport.write_file(head, where.fd, where.payload_position, where.payload_length,
                                    offset)
        self.stats.publish_sent += 1
        return True

    def _enqueue(self, session: Session, message: Message, qos: int, retain: bool) -> None:
        if len(session.queue) >= self.limits.max_queued_messages:
            self.stats.publish_dropped += 1
            if not session.dropped:
                log.warning("session %r: queue full (%d messages, max_queued_messages); "
                            "dropping new messages until it drains",
                            session.client_id, len(session.queue))
            session.dropped += 1
            return
        if session.client is None:
            message = as_offset(message)
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
        gone = []
        for pid, entry in session.inflight.items():
            if entry.state == AWAIT_ACK:
                if not self._write_publish(client, entry.message, entry.qos, entry.retain, True, pid):
                    gone.append(pid)
            else:
                client.transport.write(encode_ack(P.PUBREL, pid))
        for pid in gone:
            del session.inflight[pid]
        self.pump(session)

    # ----- subscriptions ----------------------------------------------------------------

    def subscribe(self, session: Session, topics: list[tuple[str, int]]) -> list[int]:
        granted = []
        for topic_filter, qos in topics:
            self.subscriptions.add(topic_filter, session, qos)
            session.subscriptions[topic_filter] = qos
            granted.append(qos)
        if not session.clean:
            self._snapshot_dirty = True
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
                if not session.clean:
                    self._snapshot_dirty = True

    # ----- persistence ------------------------------------------------------------------

    def capture(self) -> snap.Snapshot:
        """The state a restart needs: persistent sessions by log offset, retained messages."""
        journal = self.journal
        next_offset = journal.log.next_offset if journal is not None else 0
        result = snap.Snapshot(log_next_offset=next_offset,
                               written_ms=journal.wall_ms() if journal is not None else 0)
        for session in self.sessions.values():
            if session.clean:
                continue
            state = snap.SessionState(session.client_id, dict(session.subscriptions),
                                      awaiting_release=list(session.awaiting_release),
                                      next_id=session._next_id)
            for pid, entry in session.inflight.items():
                offset = as_offset(entry.message)
                if type(offset) is int:
                    state.inflight.append((pid, offset, entry.qos, entry.retain, entry.state))
            for ref, qos, retain in session.queue:
                offset = as_offset(ref)
                if type(offset) is int:
                    state.queue.append((offset, qos, retain))
            result.sessions.append(state)
        for message in self.retained.match("#"):
            result.retained.append(snap.RetainedState(message.topic, message.payload,
                                                      message.qos, message.offset))
        self._snapshot_dirty = False
        self._snapshot_offset = next_offset
        return result

    def restore(self, state: snap.Snapshot) -> None:
        """Load a snapshot into an empty broker (at start, before any client connects)."""
        for r in state.retained:
            self.retained.set(r.topic, Message(r.topic, r.payload, r.qos, True, r.offset))
        for s in state.sessions:
            session = self.sessions[s.client_id] = Session(s.client_id, clean=False)
            for topic_filter, qos in s.subscriptions.items():
                self.subscriptions.add(topic_filter, session, qos)
                session.subscriptions[topic_filter] = qos
            for pid, offset, qos, retain, entry_state in s.inflight:
                entry = session.inflight[pid] = Outgoing(offset, qos, retain)
                entry.state = entry_state
            session.queue.extend(s.queue)
            session.awaiting_release.update(s.awaiting_release)
            session._next_id = s.next_id
        self._snapshot_offset = state.log_next_offset

    def replay(self, records) -> int:
        """Route log records written after the snapshot (retained updates, offline queues)."""
        count = 0
        for record in records:
            topic = record.topic.decode("utf-8", "replace")
            self._route(Message(topic, record.payload, record.qos, record.retain, record.offset))
            count += 1
        return count

    def acknowledge(self, client, offset: int | None, frame: bytes) -> None:
        if self.journal is None:
            client.transport.write(frame)
        else:
            self.journal.acknowledge(client, offset, frame)

    def end_pass(self) -> None:
        if self.journal is not None:
            self.journal.end_pass()
