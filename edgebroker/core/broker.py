"""The broker: sessions, routing, retained messages, wills and timers.

No sockets and no clock of its own: the server layer hands in transports and
a clock, and calls ``tick`` when ``next_deadline`` comes due. Keepalive and
CONNECT timeouts live in one deadline heap with at most one entry per client;
an entry that comes due early (the client was active since) is pushed back to
its real deadline, so no pass ever scans all clients. The same heap runs the
limits' timers (``core.limits.Timer``): throttled clients' resumes, the
memory check, topic expiry.

Limits (docs/limits.md): every hit is counted by limit name in
``limit_hits``, every refused connection by reason in ``refused``, every
dropped message by reason in ``dropped`` (and in ``stats.publish_dropped``).
"""

from __future__ import annotations

import heapq
import logging

from collections import deque

from edgebroker.commitlog.errors import LogFullError
from edgebroker.config import Config
from edgebroker.core import snapshot as snap
from edgebroker.core.client import Client
from edgebroker.core.journal import Journal
from edgebroker.core.limits import (
    DROPS, LIMITS, REFUSALS, EventLog, MemoryGuard, Timer, TopicTable, check_topic, zero_counts,
)
from edgebroker.core.metrics import PassTimes
from edgebroker.core.session import (
    AWAIT_ACK, EMPTY_DICT, EMPTY_QUEUE, Message, Outgoing, Session, Stored, as_stored,
)
from edgebroker.core.stats import Stats, SysTopics
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode_ack, encode_publish_head
from edgebroker.mqtt.trie import RetainedTree, SubscriptionTrie

log = logging.getLogger("edgebroker.broker")

# Payloads up to this size are joined with their header once per message, so
# each subscriber gets one buffer; larger ones are queued as header + payload
# to avoid copying them.
_JOIN_LIMIT = 4096
# Seconds between memory checks (RSS and CPU time through psutil).
HOUSEKEEPING_INTERVAL = 1.0

# Housekeeping cadence (log retention and rolling, retrying a failing disk,
# snapshots), in seconds of the broker's clock.
MAINTENANCE_INTERVAL = 1.0
# A snapshot is written at most this often after sessions or subscriptions
# change, and at least this often while messages flow (bounding the log replay
# at start).
SNAPSHOT_DEBOUNCE = 1.0
SNAPSHOT_EVERY = 30.0
# A PUBLISH is answered without the coalescing delay when its connection sent something
# less than this many coalesce_ms before (see Broker.prompt).
PROMPT_GAP_FACTOR = 20


def prompt_gap(config: Config) -> float:
    """Seconds: a PUBLISH this soon after its connection's previous packet is answered at once."""
    return config.coalesce_ms / 1000 * PROMPT_GAP_FACTOR


class Broker:
    def __init__(self, config: Config, clock, commit_log=None, wall_ms=None):
        self.config = config
        self.limits = config.limits
        self.clock = clock
        self.started = clock()
        # The loop may hold a pass's log write and output for up to coalesce_ms, gathering
        # more (Loop.run), unless something queued answers a client that waits for it:
        # ``prompt`` says so (set by the core, cleared by the loop when it sends). A PUBLISH
        # counts as waited for when its connection sent something less than ``prompt_gap``
        # before: the delay then costs no client more than 1/PROMPT_GAP_FACTOR of its rate.
        self.prompt = False
        self.prompt_gap = prompt_gap(config)
        self.sessions: dict[str, Session] = {}
        self.subscriptions = SubscriptionTrie()
        self.retained = RetainedTree()
        self.stats = Stats()
        self.clients_connected = 0
        self._timers: list = []  # (due, client or Timer); equal dues are ordered by __lt__
        self.sockets_open = 0
        self.listener_connected: dict[str, int] = {}
        self.topics = TopicTable()
        self.known_topics = self.topics.current  # the hot path's view (see _on_topic_expiry)
        self._last_topic = (None, b"")    # (topic, its bytes) of the last publish
        self._last_head0 = (b"", -1, b"")  # (topic bytes, payload size, head) of a large QoS 0 frame
        self.queued_messages = 0          # in all sessions' queues
        self.queued_bytes = 0
        self.throttled: set[Client] = set()
        self.throttled_seconds = 0.0      # of throttles that ended
        self.limit_hits = zero_counts(LIMITS)
        self.refused = zero_counts(REFUSALS)
        self.dropped = zero_counts(DROPS)
        self.pass_times = PassTimes()     # filled by the server loop
        self.events = EventLog(log)
        self.memory = MemoryGuard(self.limits.memory_limit)
        self.memory.check()
        self._housekeeping = Timer(self._on_housekeeping)
        self._housekeeping.start(self, self.started + HOUSEKEEPING_INTERVAL)
        self._topic_expiry = Timer(self._on_topic_expiry)
        self._topic_expiry.start(self, self.started + self.limits.topic_expiry)
        self.journal = (Journal(commit_log, config.log.durability, wall_ms, self.stats)
                        if commit_log is not None else None)
        if self.journal is not None:
            self.acknowledge = self.journal.acknowledge  # one call less per QoS 1/2 PUBLISH
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
        self.sockets_open += 1
        client = Client(self, transport, self.clock())
        self.schedule(client)
        return client

    def admission(self, client: Client, client_id: str) -> tuple[str, str] | None:
        """Why a valid CONNECT cannot be accepted now: (limit, explanation), or None."""
        old = self.sessions.get(client_id)
        old_client = old.client if old is not None else None
        limits = self.limits
        if self.memory.over:
            return "memory_limit", (f"memory use {self.memory.rss} bytes is above memory_limit "
                                    f"({self.memory.limit})")
        if old_client is None and self.clients_connected >= limits.max_connections:
            return "max_connections", f"{self.clients_connected} clients connected (max_connections)"
        listener = client.transport.listener
        cap = listener.max_connections if listener is not None else 0
        address = client.listener_address
        if cap and (old_client is None or old_client.listener_address != address):
            count = self.listener_connected.get(address, 0)
            if count >= cap:
                return "listener_max_connections", (f"{count} clients connected on listener "
                                                    f"{address} (its max_connections)")
        return None

    def hit(self, limit: str) -> None:
        self.limit_hits[limit] += 1

    def drop(self, reason: str, session: Session | None, count: int = 1) -> None:
        """Count ``count`` messages dropped for ``reason`` (broker-wide and on the session)."""
        self.stats.publish_dropped += count
        self.dropped[reason] += count
        if session is not None:
            drops = session.drops
            if drops is None:
                drops = session.drops = {}
            drops[reason] = drops.get(reason, 0) + count

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
        address = client.listener_address
        if address:
            self.listener_connected[address] = self.listener_connected.get(address, 0) + 1
        self.stats.connects_accepted += 1
        return session, present

    def detach(self, client: Client, publish_will: bool) -> None:
        """A connected client's connection ended (its will is still on it)."""
        self.clients_connected -= 1
        address = client.listener_address
        if address:
            self.listener_connected[address] -= 1
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
            self.drop("sys_topic", None)
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
        """Keep only log offsets (and sizes) for an offline session: no payload memory."""
        if session.queue:
            session.queue = deque((as_stored(ref), qos, retain)
                                  for ref, qos, retain in session.queue)
        for entry in session.inflight.values():
            entry.message = as_stored(entry.message)
        self._snapshot_dirty = True

    def drop_session(self, session: Session) -> None:
        if not session.clean:
            self._snapshot_dirty = True
        for topic_filter in session.subscriptions:
            self.subscriptions.remove(topic_filter, session)
        session.subscriptions.clear()
        self.queued_messages -= len(session.queue)
        self.queued_bytes -= session.queue_bytes
        session.queue = EMPTY_QUEUE
        session.queue_bytes = 0
        session.queued_qos0 = 0
        session.inflight.clear()
        session.inflight_bytes = 0
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
            heapq.heappush(self._timers, (due, client))

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
            _, client = heapq.heappop(timers)
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
                    log.exception("internal error expiring %s", client.describe()
                                  if type(client) is Client else client.callback)
            else:
                client.timer_at = due
                heapq.heappush(timers, (due, client))
        if self.sys.next_due is not None and self.sys.next_due <= now:
            self.sys.publish(now)
        if self._maintenance_due <= now:
            self._maintenance_due = now + MAINTENANCE_INTERVAL
            self._maintain(now)

    def _maintain(self, now: float) -> None:
        journal = self.journal
        if journal is not None:
            if journal.retry():
                # Writes work again: the acknowledgements it released go out in this pass.
                self.prompt = True
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
        old = self.limits
        self.config = config
        self.limits = config.limits
        self.prompt_gap = prompt_gap(config)
        now = self.clock()
        self.memory.limit = config.limits.memory_limit
        if config.limits.topic_expiry != old.topic_expiry:
            self._topic_expiry.start(self, now + config.limits.topic_expiry)
        self.sys.configure(now)

    def _on_housekeeping(self) -> None:
        now = self.clock()
        self._housekeeping.start(self, now + HOUSEKEEPING_INTERVAL)
        changed = self.memory.check()
        if changed is True:
            log.warning("memory use %d bytes is above memory_limit (%d): refusing new connections "
                        "and new topics until it falls below", self.memory.rss, self.memory.limit)
        elif changed is False:
            log.warning("memory use %d bytes is below memory_limit (%d) again: accepting new "
                        "connections and topics", self.memory.rss, self.memory.limit)

    def _on_topic_expiry(self) -> None:
        now = self.clock()
        self._topic_expiry.start(self, now + self.limits.topic_expiry)
        retained = self.retained
        forgotten = self.topics.rotate(lambda topic: retained.get(topic) is not None)
        self.known_topics = self.topics.current
        if forgotten:
            log.debug("forgot %d topics idle for over topic_expiry (%g s)", forgotten,
                      self.limits.topic_expiry)

    # ----- routing ----------------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, client) -> int | None:
        """A client's (or a will's) PUBLISH: counted, logged, then routed.

        Returns the log offset (None when not logged). Raises LogFullError when
        the log cannot take a QoS 1/2 message: it is then not routed either.
        """
        self.stats.publish_received += 1
        # A client sending to one topic over and over (the decoder hands its large frames the
        # same topic string each time): its UTF-8 bytes are encoded once.
        last = self._last_topic
        if topic is last[0]:
            message = Message(topic, payload, qos, retain, None, last[1])
        else:
            message = Message(topic, payload, qos, retain)
            self._last_topic = (topic, message.topic_bytes)
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
        frame0 = rest0 = None
        sent = 0
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
                    # messages (order per topic and QoS, MQTT-4.6.0-6): retained
                    # ones queued at SUBSCRIBE, or ones queued while offline.
                    if client is None:
                        if self.limits.queue_qos0_messages and not session.clean:
                            self._enqueue(session, message, 0, False)
                        continue
                    if session.queued_qos0:
                        self._enqueue(session, message, 0, False)
                        continue
                if frame0 is None:
                    frame0, rest0 = self._frame0(message)
                # offer() refuses when max_pending_write_bytes are already waiting.
                if not client.transport.offer(frame0, rest0):
                    self._drop_pending(client)
                    continue
                sent += 1
            elif (client is not None and not session.queue
                  and len(session.inflight) < self.limits.max_inflight_messages
                  and session.inflight_bytes < self.limits.max_inflight_bytes
                  and client.transport.out_bytes < client.transport.max_pending):
                self._send(session, message, q, False)
            else:
                self._defer(session, message, q, False)
        stats.publish_sent += sent

    def _frame0(self, message: Message) -> tuple:
        """(first part, rest or None) of the QoS 0 frame, encoded once per message; the head
        of a large one is kept for the next message of the same topic and size."""
        payload = message.payload
        n = len(payload)
        topic_bytes = message.topic_bytes
        if n <= _JOIN_LIMIT:
            return encode_publish_head(topic_bytes, n, 0, False, False, None) + payload, None
        last = self._last_head0
        if last[1] == n and last[0] == topic_bytes:
            return last[2], payload
        head = encode_publish_head(topic_bytes, n, 0, False, False, None)
        self._last_head0 = (topic_bytes, n, head)
        return head, payload

    def _drop_pending(self, client: Client) -> None:
        """A QoS 0 message not queued: max_pending_write_bytes are waiting on the connection."""
        self.hit("max_pending_write_bytes")
        self.drop("max_pending_write_bytes", client.session)
        transport = client.transport
        transport.want_drain = True
        if not client.pending_dropped:
            client.warn_once("max_pending_write_bytes",
                             "%d bytes are waiting to be written (max_pending_write_bytes %d), the "
                             "client does not read fast enough; dropping QoS 0 messages for it "
                             "until they are written", transport.out_bytes, transport.max_pending)
        client.pending_dropped += 1

    def _defer(self, session: Session, message: Message, qos: int, retain: bool) -> None:
        """A QoS 1/2 message that cannot be sent now: count why, then queue it."""
        client = session.client
        if client is not None and not session.queue:
            if len(session.inflight) >= self.limits.max_inflight_messages:
                self.hit("max_inflight_messages")
            elif session.inflight_bytes >= self.limits.max_inflight_bytes:
                self.hit("max_inflight_bytes")
            else:
                self.hit("max_pending_write_bytes")
                client.transport.want_drain = True
        self._enqueue(session, message, qos, retain)

    def _send(self, session: Session, ref, qos: int, retain: bool) -> None:
        """Send a QoS 1/2 message in the session's window (the client is online)."""
        pid = session.allocate_id()
        if self._write_publish(session.client, ref, qos, retain, False, pid):
            inflight = session.inflight
            if inflight is EMPTY_DICT:
                inflight = session.own_inflight()
            inflight[pid] = Outgoing(ref, qos, retain)
            session.inflight_bytes += ref.size

    def _write_publish(self, client, message, qos, retain, dup, pid) -> bool:
        """Queue one PUBLISH on the client's transport; False if its log record is gone."""
        if type(message) is not Message:
            return self._write_from_log(client, message, qos, retain, dup, pid)
        payload = message.payload
        head = encode_publish_head(message.topic_bytes, len(payload), qos, retain, dup, pid)
        transport = client.transport
        transport.msgs_out += 1
        if len(payload) <= _JOIN_LIMIT:
            transport.write(head + payload)
        else:
            transport.write(head)
            transport.write(payload)
        self.stats.publish_sent += 1
        return True

    def _write_from_log(self, client, stored: Stored, qos, retain, dup, pid) -> bool:
        """Header from memory, payload straight from the segment file (sendfile)."""
        offset = stored.offset
        journal = self.journal
        if journal is not None and offset >= journal.log.written_offset:
            # Logged earlier in this run of passes and not yet handed to the OS (see
            # Loop.run): write it now, so that it can be read back.
            journal.end_pass()
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
        transport = client.transport
        transport.msgs_out += 1
        transport.write_file(head, where.fd, where.payload_position, where.payload_length, offset)
        self.stats.publish_sent += 1
        return True

    def _enqueue(self, session: Session, message: Message, qos: int, retain: bool) -> None:
        """Queue for later, within max_queued_messages/bytes (``queue_full`` says what goes)."""
        limits = self.limits
        queue = session.queue
        max_messages = limits.max_queued_messages
        max_bytes = limits.max_queued_bytes
        if len(queue) >= max_messages or session.queue_bytes >= max_bytes:
            limit = "max_queued_messages" if len(queue) >= max_messages else "max_queued_bytes"
            self.hit(limit)
            if limits.queue_full == "drop_old":
                dropped = 0
                while queue and (len(queue) >= max_messages or session.queue_bytes >= max_bytes):
                    old, old_qos, _ = queue.popleft()
                    if old_qos == 0:
                        session.queued_qos0 -= 1
                    session.queue_bytes -= old.size
                    self.queued_messages -= 1
                    self.queued_bytes -= old.size
                    dropped += 1
                self.drop(limit, session, dropped)
            else:
                dropped = 1
                self.drop(limit, session)
            if not session.dropped:
                log.warning("session %r: queue full (%d messages, %d bytes; %s); dropping %s "
                            "messages until it drains", session.client_id, len(queue),
                            session.queue_bytes, limit,
                            "the oldest" if limits.queue_full == "drop_old" else "new")
            session.dropped += dropped
            if limits.queue_full != "drop_old":
                return
        size = message.size
        if session.client is None:
            message = as_stored(message)
        session.own_queue().append((message, qos, retain))
        if qos == 0:
            session.queued_qos0 += 1
        session.queue_bytes += size
        self.queued_messages += 1
        self.queued_bytes += size

    def pump(self, session: Session) -> None:
        """Move queued messages into the window while the client is online and reading."""
        client = session.client
        if client is None:
            return
        queue = session.queue
        limits = self.limits
        window = limits.max_inflight_messages
        window_bytes = limits.max_inflight_bytes
        transport = client.transport
        max_pending = transport.max_pending
        sent_bytes = 0
        sent = 0
        while queue:
            if transport.out_bytes >= max_pending:
                transport.want_drain = True
                break
            message, qos, retain = queue[0]
            if qos == 0:
                queue.popleft()
                session.queued_qos0 -= 1
                self._write_publish(client, message, 0, retain, False, None)
            # session.inflight is read each time: _send gives an empty session a dict of its own.
            elif (len(session.inflight) < window
                  and (session.inflight_bytes < window_bytes or not session.inflight)):
                queue.popleft()
                self._send(session, message, qos, retain)
            else:
                break
            sent += 1
            sent_bytes += message.size
        if sent:
            session.queue_bytes -= sent_bytes
            self.queued_messages -= sent
            self.queued_bytes -= sent_bytes
            # A subscriber working through its queue is held back by its window, not by
            # its reading: the next part goes out in this pass (see ``prompt``).
            self.prompt = True
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
            session.inflight_bytes -= session.inflight.pop(pid).message.size
        self.pump(session)

    # ----- subscriptions ----------------------------------------------------------------

    def subscribe(self, session: Session, topics: list[tuple[str, int]]) -> list[int]:
        """Add subscriptions; a filter over a limit gets 0x80 (counted, logged once per client)."""
        granted = []
        limits = self.limits
        for topic_filter, qos in topics:
            problem = check_topic(topic_filter, limits)
            if (problem is None and topic_filter not in session.subscriptions
                    and len(session.subscriptions) >= limits.max_subscriptions_per_client):
                problem = "max_subscriptions_per_client"
            if problem is not None:
                self.hit(problem)
                if session.client is not None:
                    session.client.warn_once(problem, "subscription to %r refused (SUBACK 0x80): %s "
                                             "(%d)", topic_filter, problem, getattr(limits, problem))
                granted.append(P.SUBACK_FAILURE)
                continue
            self.subscriptions.add(topic_filter, session, qos)
            session.own_subscriptions()[topic_filter] = qos
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
                # Beyond max_pending_write_bytes retained messages wait in the session's queue
                # (bounded), QoS 0 included, and follow as the connection drains.
                if client.transport.out_bytes >= client.transport.max_pending:
                    client.transport.want_drain = True
                    self._enqueue(session, message, qos, True)
                elif qos == 0 and session.queued_qos0:
                    self._enqueue(session, message, 0, True)  # behind the QoS 0 queued before
                elif qos == 0:
                    self._write_publish(client, message, 0, True, False, None)
                elif (not session.queue and len(session.inflight) < self.limits.max_inflight_messages
                      and session.inflight_bytes < self.limits.max_inflight_bytes):
                    self._send(session, message, qos, True)
                else:
                    self._defer(session, message, qos, True)

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
                ref = entry.message
                if ref.offset is not None:
                    state.inflight.append((pid, ref.offset, entry.qos, entry.retain, entry.state,
                                           ref.size))
            for ref, qos, retain in session.queue:
                if ref.offset is not None:
                    state.queue.append((ref.offset, qos, retain, ref.size))
            result.sessions.append(state)
        for message in self.retained.match("#"):
            result.retained.append(snap.RetainedState(message.topic, message.payload,
                                                      message.qos, message.offset))
        self._snapshot_dirty = False
        self._snapshot_offset = next_offset
        return result

    def restore(self, state: snap.Snapshot) -> None:
        """Load a snapshot into an empty broker (at start, before any client connects).

        The snapshot is written when taken; the log's records reach the disk by the
        durability setting. After a power failure the log may end before offsets the
        snapshot holds, and the next messages get those offsets again: such entries are
        not restored (counted as lost), or they would deliver those other messages."""
        end = self.journal.log.next_offset if self.journal is not None else None
        if end is None or state.log_next_offset <= end:
            end = None  # every offset in the snapshot is in the log (or retention took it)
        lost = 0
        for r in state.retained:
            offset = r.offset if end is None or r.offset is None or r.offset < end else None
            self.retained.set(r.topic, Message(r.topic, r.payload, r.qos, True, offset))
        for s in state.sessions:
            if end is not None:
                kept = [e for e in s.inflight if e[1] < end]
                queue = [e for e in s.queue if e[0] < end]
                lost += len(s.inflight) - len(kept) + len(s.queue) - len(queue)
                s.inflight, s.queue = kept, queue
            session = self.sessions[s.client_id] = Session(s.client_id, clean=False)
            if s.subscriptions:
                subscriptions = session.own_subscriptions()
                for topic_filter, qos in s.subscriptions.items():
                    self.subscriptions.add(topic_filter, session, qos)
                    subscriptions[topic_filter] = qos
            if s.inflight:
                inflight = session.own_inflight()
                for pid, offset, qos, retain, entry_state, size in s.inflight:
                    entry = inflight[pid] = Outgoing(Stored(offset, size), qos, retain)
                    entry.state = entry_state
                    session.inflight_bytes += size
            if s.queue:
                queue = session.own_queue()
                for offset, qos, retain, size in s.queue:
                    queue.append((Stored(offset, size), qos, retain))
                    session.queue_bytes += size
                    if qos == 0:
                        session.queued_qos0 += 1
                self.queued_messages += len(queue)
                self.queued_bytes += session.queue_bytes
            if s.awaiting_release:
                session.own_awaiting_release().update(s.awaiting_release)
            session._next_id = s.next_id
        self._snapshot_offset = state.log_next_offset
        if end is not None:
            self.stats.publish_lost += lost
            log.warning("the session snapshot was taken at log offset %d but the log ends at %d "
                        "(its last records were not on disk: a power failure or system crash, "
                        "or a damaged tail cut off at recovery): %d queued or unacknowledged messages of persistent "
                        "sessions that were not yet on disk are lost", state.log_next_offset,
                        end, lost)

    def replay(self, records) -> int:
        """Route log records written after the snapshot (retained updates, offline queues)."""
        count = 0
        for record in records:
            topic = record.topic.decode("utf-8", "replace")
            self._route(Message(topic, record.payload, record.qos, record.retain, record.offset))
            count += 1
        return count

    def acknowledge(self, client, offset: int | None, frame: bytes) -> None:
        """Send ``frame`` (a PUBACK or PUBREC) once ``offset`` is safe; with a log, the
        instance's ``acknowledge`` is the journal's own."""
        client.transport.write(frame)

    def end_pass(self) -> None:
        if self.journal is not None:
            self.journal.end_pass()
