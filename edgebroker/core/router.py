"""Routing: where a message goes, and how it is written on each subscriber's connection.

The path of one PUBLISH: ``publish`` logs it (``core.journal``), then ``_route``
stores it if retained and delivers it to every matching subscription: QoS 0 at once, QoS
1/2 once the record is written to the OS (``route_written``, at the end of the loop pass),
so that a message its publisher may send again after a crash was never delivered. A QoS 0
frame is encoded once per message (``_frame0``, the frame cache) and offered to each
subscriber's transport; a QoS 1/2 message goes into the session's window (``_send``) or,
when the window, the queue or the transport's ``max_pending`` hold it back, into the
session's queue (``_defer``/``_enqueue``, within max_queued_messages/bytes). ``pump`` moves
queued messages into the window as acknowledgements and the connection's drain allow; a
queued message that is only a log offset (an offline session's) is sent with its payload
straight from the segment file (``_write_from_log``).
"""

from __future__ import annotations

import logging
from collections import deque

from edgebroker.core.catchup import QUEUE_BYTES, QUEUE_MESSAGES
from edgebroker.core.catchup_run import piece_of
from edgebroker.core.client import Client
from edgebroker.core.mqtt5 import logged
from edgebroker.core.router5 import options5
from edgebroker.core.session import (
    EMPTY_DICT, Message, Outgoing, Session, Stored, StoredRetained, as_stored,
)
from edgebroker.errors import name_shown
from edgebroker.mqtt.encode import encode_publish_head
from edgebroker.mqtt.trie import RetainedTree, SubscriptionTrie

log = logging.getLogger("edgebroker.broker")

# Payloads up to this size are joined with their header once per message, so each subscriber
# gets one buffer; larger ones are queued as header + payload to avoid copying them.
_JOIN_LIMIT = 4096


def queue_limit(limits, count: int, size: int) -> str | None:
    """The limit an in-memory queue of ``count`` messages and ``size`` bytes is at (when
    max_queued_messages/bytes bound it: not the log as the queue), or None."""
    if limits.max_queued_messages and count >= limits.max_queued_messages:
        return "max_queued_messages"
    if limits.max_queued_bytes and size >= limits.max_queued_bytes:
        return "max_queued_bytes"
    return None


class Router:
    """Routing's part of ``Broker`` (a mixin over the broker's state: the hot path calls
    these as the broker's own methods, with no extra call or lookup per message)."""

    def _init_router(self) -> None:
        self.subscriptions = SubscriptionTrie()
        self.retained = RetainedTree()
        self._last_topic = (None, b"")    # (topic, its bytes) of the last publish
        self._last_head0 = (b"", -1, b"")  # (topic bytes, payload size, head) of a large QoS 0 frame
        self.queued_messages = 0          # in all sessions' queues
        self.queued_bytes = 0
        # Sessions resumed with more unacknowledged messages than their window: the packet
        # ids still to send again; and (client, log offset) of PUBLISHes whose record went
        # before they were sent, to let go of in the next pass (core.resume).
        self.resends: dict[Session, deque[int]] = {}
        self.records_gone: list[tuple] = []
        # QoS 1/2 messages logged but not yet routed: their records are not yet written to
        # the OS (see publish).
        self.unrouted: deque[Message] = deque()

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, client,
                properties: bytes = b"", expiry: int | None = None) -> int | None:
        """A client's (or a will's) PUBLISH: counted, logged, then routed. ``properties``,
        ``expiry``: a 5.0 message's, to forward, and its Message Expiry Interval (s); the log
        keeps both (core.mqtt5.message_properties).

        Returns the log offset (None when not logged). Raises LogFullError when
        the log cannot take a QoS 1/2 message: it is then not routed either.
        """
        self.stats.publish_received += 1
        # A client sending to one topic over and over (the decoder hands its large frames the
        # same topic string each time): its UTF-8 bytes are encoded once.
        last = self._last_topic
        # A Message Expiry Interval of 0 is read as none, as Mosquitto does (the log keeps it)
        expires = self.clock() + expiry if expiry else 0.0
        if topic is last[0]:
            message = Message(topic, payload, qos, retain, None, last[1], client.client_id,
                              properties, expires)
        else:
            message = Message(topic, payload, qos, retain, None, None, client.client_id,
                              properties, expires)
            self._last_topic = (topic, message.topic_bytes)
        if expiry is not None:
            properties = logged(properties, expiry)
        journal = self.journal
        if journal is not None:
            offset = message.offset = journal.append(client, message.topic_bytes, payload, qos,
                                                     retain, properties)
            if qos or self.unrouted and offset is not None:
                # Routed once its record is written (``route_written``): a crash before then
                # cannot have delivered a message its publisher will send again. QoS 0 goes
                # at once unless it would overtake such a message (order per topic).
                self.unrouted.append(message)
                return offset
        self._route(message)
        return message.offset

    def live_offset(self) -> int:
        """The first log offset not yet routed live: the head of the log, or the first
        message waiting for its record to be written (``route_written``). A session that
        starts reading the log (offline, behind) starts there; one catching up hands over
        to live routing there."""
        unrouted = self.unrouted
        return unrouted[0].offset if unrouted else self.journal.log.next_offset

    def route_written(self) -> None:
        """Route the QoS 1/2 messages whose records the OS now has (in the order they were
        published); those still in memory (the log cannot write) wait. Each leaves
        ``unrouted`` as it is routed: its first entry is where a session catching up hands
        over to live routing (core.catchup)."""
        unrouted = self.unrouted
        written = self.journal.log.written_offset
        route = self._route
        while unrouted and unrouted[0].offset < written:
            route(unrouted.popleft())

    def settle(self) -> None:
        """Before a SUBSCRIBE or UNSUBSCRIBE changes what matches: the messages received
        before it are written now and routed to the subscriptions as they stood, as they
        would have been at the end of the pass (a retained one is then stored for the new
        subscription's retained messages)."""
        if self.unrouted:
            self.journal.end_pass()
            self.route_written()

    def before_close(self) -> None:
        """A connection closes: the log written (its acks go out), routed after the close."""
        if self.unrouted:
            self.journal.end_pass()

    def route(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """The broker's own messages ($SYS): routed, not logged (nor counted as unrouted)."""
        self._route(Message(topic, payload, qos, retain), False)

    def _route(self, message: Message, received: bool = True) -> None:
        """Store if retained, then deliver to every matching subscription. ``received``: a
        PUBLISH received now (a client's, a will's, a bridge's), counted in publish_unrouted
        when nothing takes it; not the broker's own messages, nor records replayed at start."""
        stats = self.stats
        topic, payload, qos = message.topic, message.payload, message.qos
        retain = message.retain
        if retain:
            if payload:
                self.retained.set(topic, message)
            else:
                self.retained.delete(topic)
        targets = self.subscriptions.match(topic)
        if self.groups and self.route_shared(message) and not targets:
            return      # shared subscriptions only (core.shared)
        if not targets:
            if received:
                stats.publish_unrouted += 1
            return
        frame0 = rest0 = None
        sent = 0
        logged = message.offset is not None
        for session, sub_qos in targets:
            if session.cursor is not None and (logged or received):
                if not logged:      # the disk is full: dropped, not to pass older ones
                    self._behind_unlogged(session, message)
                continue  # behind: it reads this message from the log (core.catchup)
            acl = session.acl
            if acl is not None:
                allowed = acl.reads.get(topic)
                if allowed is None:
                    allowed = acl.check_read(topic)
                if not allowed:
                    stats.acl_deliveries_denied += 1
                    continue
            q = qos if qos < sub_qos else sub_qos
            retain_out = False
            if session.sub5 is not None:
                # 5.0 options: No Local, Retain As Published (core.router5).
                best, retain_out = options5(session, message)
                if best < 0:
                    continue
                q = qos if qos < best else best
            client = session.client
            if q == 0:
                if client is None or session.queue:
                    # Offline, or behind a backlog that may hold older QoS 0 messages (order per
                    # topic and QoS, MQTT-4.6.0-6): retained copies, ones queued while offline.
                    if client is None:
                        if self.limits.queue_qos0_messages and not session.clean:
                            self._enqueue(session, message, 0, retain_out)
                        continue
                    if session.queued_qos0:
                        self._enqueue(session, message, 0, retain_out)
                        continue
                if client.v5 is not None or retain_out:   # (3.1.1: a bridge, router5)
                    if self._offer5(client, message, retain_out) is False:
                        self._drop_pending(client, message)
                    continue
                if frame0 is None:
                    frame0, rest0 = self._frame0(message)
                # offer() refuses when max_pending_write_bytes are already waiting.
                if not client.transport.offer(frame0, rest0):
                    self._drop_pending(client, message)
                    continue
                sent += 1
            elif (client is not None and not session.queue
                  and len(session.inflight) < (session.receive_max
                                               or self.limits.max_inflight_messages)
                  and session.inflight_bytes < self.limits.max_inflight_bytes
                  and client.transport.out_bytes < client.transport.max_pending):
                self._send(session, message, q, retain_out)
            else:
                self._defer(session, message, q, retain_out)
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

    def _drop_pending(self, client: Client, message: Message) -> None:
        """A QoS 0 message the connection cannot take: max_pending_write_bytes are waiting.
        The session reads it, and what follows, from the log; not logged, it is dropped."""
        self.hit("max_pending_write_bytes")
        transport = client.transport
        transport.wait_for_drain()
        session = client.session
        if self.log_queue:
            if message.offset is not None:
                if session.cursor is None:
                    client.warn_once("fall_behind:max_pending_write_bytes",
                                     "%d bytes are waiting to be written (max_pending_write_bytes "
                                     "%d), the client does not read fast enough; it reads from the "
                                     "commit log from offset %d on", transport.out_bytes,
                                     transport.max_pending, message.offset)
                    self.fall_behind(session, message.offset)
                    return
            elif session.cursor is not None:
                # Behind already, so it loses nothing the log holds: only this message,
                # which the log does not hold.
                self.drop("not_logged", session)
                return
        self.drop("max_pending_write_bytes", session)
        if not client.pending_dropped:
            client.warn_once("max_pending_write_bytes",
                             "%d bytes are waiting to be written (max_pending_write_bytes %d), the "
                             "client does not read fast enough; dropping QoS 0 messages for it "
                             "until they are written", transport.out_bytes, transport.max_pending)
        client.pending_dropped += 1

    def _defer(self, session: Session, message: Message, qos: int, retain: bool,
               copy: bool = False) -> None:
        """A QoS 1/2 message that cannot be sent now: count why, then queue it."""
        client = session.client
        if client is not None and not session.queue:
            if len(session.inflight) >= (session.receive_max or self.limits.max_inflight_messages):
                client.window_full("max_inflight_messages")
            elif session.inflight_bytes >= self.limits.max_inflight_bytes:
                client.window_full("max_inflight_bytes")
            else:
                self.hit("max_pending_write_bytes")
                client.transport.wait_for_drain()
        self._enqueue(session, message, qos, retain, copy)

    def _send(self, session: Session, ref, qos: int, retain: bool,
              ids: bytes | None = None, group: str | None = None) -> Outgoing | None:
        """Send a QoS 1/2 message in the session's window (the client is online; ``group``: the
        key of the shared group giving it); its entry, None if not sent (``_write_publish``)."""
        pid = session.allocate_id()
        if self._write_publish(session.client, ref, qos, retain, False, pid, ids):
            inflight = session.inflight
            if inflight is EMPTY_DICT:
                inflight = session.own_inflight()
            entry = inflight[pid] = Outgoing(ref, qos, retain)
            session.inflight_bytes += ref.size
            if qos == 2 and (group or not session.clean) and self.exchanges is not None:
                offset = ref.offset
                if offset is not None:
                    self.exchanges.sent(session.client_id, pid, offset, ref.size, retain, group)
            return entry
        return None

    def _write_publish(self, client, message, qos, retain, dup, pid, ids=None) -> bool:
        """Queue one PUBLISH on the client's transport; False if its log record is gone.
        ``ids``: a 5.0 client's Subscription Identifiers (``_write_publish5``)."""
        if client.v5 is not None:
            return self._write_publish5(client, message, qos, retain, dup, pid, ids)
        if type(message) is not Message:
            return self._write_from_log(client, message, qos, retain, dup, pid)
        payload = message.payload
        head = encode_publish_head(message.topic_bytes, len(payload), qos, retain, dup, pid)
        transport = client.transport
        transport.count_publish()
        if len(payload) <= _JOIN_LIMIT:
            transport.write(head + payload)
        else:
            transport.write(head)
            transport.write(payload)
        self.stats.publish_sent += 1
        return True

    def _write_from_log(self, client, stored: Stored, qos, retain, dup, pid) -> bool:
        """Header from memory, payload straight from the segment file (sendfile); a retained
        message the retained store still holds from there (core.retained)."""
        if type(stored) is StoredRetained:
            copy = self.retained_copy(stored)
            if copy is not None:
                return self._write_publish(client, copy, qos, retain, dup, pid)
        offset = stored.offset
        where = self._locate(client, offset)
        if where is None:
            return False
        head = encode_publish_head(where.topic, where.payload_length, qos, retain, dup, pid)
        transport = client.transport
        transport.count_publish()
        transport.write_file(head, where.fd, where.payload_position, where.payload_length, offset)
        self.stats.publish_sent += 1
        return True

    def _may_read(self, acl, client, message) -> bool:
        """Whether ``acl`` lets a queued message out; False counted as a denied delivery, or
        as a lost message for a ``Stored`` one (its topic is in its record) no longer in the
        log."""
        if type(message) is not Stored:     # a Message, or a StoredRetained: its topic
            allowed = acl.can_read(message.topic)
        else:
            where = self._locate(client, message.offset)
            if where is None:
                return False
            allowed = acl.can_read(where.topic.decode("utf-8", "replace"))
        if not allowed:
            self.stats.acl_deliveries_denied += 1
        return allowed

    def _locate(self, client, offset: int):
        """Where the record at ``offset`` is, to send it from (None, counted and logged
        once, when it is no longer in the log)."""
        journal = self.journal
        if journal is not None and offset >= journal.log.written_offset:
            # Logged earlier in this run of passes and not yet handed to the OS (see
            # Loop.run): write it now, so that it can be read back.
            journal.end_pass()
        where = journal.log.locate(offset) if journal is not None else None
        if where is None:
            self.count_lost(client, offset)
        return where

    def _enqueue(self, session: Session, message: Message, qos: int, retain: bool,
                 copy: bool = False) -> None:
        """Queue for later: up to a small bound (not for ``copy``, a retained copy for a
        SUBSCRIBE), past which the session reads from the log (core.catchup); with
        max_queued_messages/bytes set, within them (``queue_full`` says what goes)."""
        if self.log_queue:
            if (copy or len(session.queue) < QUEUE_MESSAGES
                    and session.queue_bytes < QUEUE_BYTES):
                self._append(session, message, qos, retain)
            elif message.offset is not None:
                self.fall_behind(session, message.offset)
            else:
                self.drop("not_logged", session)
            return
        limits = self.limits
        queue = session.queue
        limit = queue_limit(limits, len(queue), session.queue_bytes)
        if limit is not None:
            self.hit(limit)
            full = len(queue), session.queue_bytes     # for the log line: before any drop
            if limits.queue_full == "drop_old":
                dropped = 0
                while queue and queue_limit(limits, len(queue), session.queue_bytes):
                    old, old_qos, old_retain = queue.popleft()
                    if old_retain and session.retained_queued:
                        session.retained_queued.discard(old.offset)
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
                log.warning("session %s: queue full (%d messages, %d bytes; %s); dropping %s "
                            "messages until it drains", name_shown(session.client_id), *full, limit,
                            "the oldest" if limits.queue_full == "drop_old" else "new")
            session.dropped += dropped
            if limits.queue_full != "drop_old":
                return
        self._append(session, message, qos, retain)

    def _append(self, session: Session, message: Message, qos: int, retain: bool) -> None:
        size = message.size
        if session.client is None:
            message = as_stored(message)
            session.saved = None
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
        limits = self.limits
        window = session.receive_max or limits.max_inflight_messages
        if self.resends and session in self.resends:
            self.resend_more(session, window)
        queue = session.queue
        window_bytes = limits.max_inflight_bytes
        transport = client.transport
        max_pending = transport.max_pending
        sent_bytes = 0
        sent = 0
        acked = False     # QoS 1 or 2 sent: acknowledgements to wait for
        piece = piece_of(window)
        burst = 0         # ... since the last piece was sent (WINDOW_PIECES)
        acl = session.acl  # checked again on the way out: a reload, or another user's login
        base = None       # sent - publish_sent when it first reads on from the log
        while True:
            while queue:
                if transport.out_bytes >= max_pending:
                    transport.wait_for_drain()
                    break
                message, qos, retain = queue[0]
                if qos == 0:
                    queue.popleft()
                    session.queued_qos0 -= 1
                    if acl is None or self._may_read(acl, client, message):
                        self._write_publish(client, message, 0, retain, False, None)
                # session.inflight is read each time: _send gives an empty session a dict of
                # its own.
                elif (len(session.inflight) < window
                      and (session.inflight_bytes < window_bytes or not session.inflight)):
                    queue.popleft()
                    if acl is None or self._may_read(acl, client, message):
                        self._send(session, message, qos, retain)
                        acked = True
                        burst += 1
                        if burst == piece:
                            burst = 0
                            if len(session.inflight) < window:
                                transport.send_now()    # the last piece goes with the pass
                else:
                    break
                if retain and session.retained_queued:
                    session.retained_queued.discard(message.offset)
                sent += 1
                sent_bytes += message.size
            # Behind: the next batch from the log once the queue is empty and there is room.
            if queue or session.cursor is None or client.closed:
                break
            if transport.out_bytes >= max_pending:
                transport.wait_for_drain()    # the next batch once this much is written
                break
            if len(session.inflight) >= window:
                break                         # ... once an acknowledgement frees the window
            # What went out is counted in publish_sent: the rest of ``sent`` was dropped at
            # write time (expired, too large, ACL), a budget per pass (core.catchup.read_on).
            if base is None:
                base = sent - self.stats.publish_sent
            if not self.read_on(session, sent - self.stats.publish_sent - base):
                break
            queue = session.queue
        if sent:
            session.queue_bytes -= sent_bytes
            self.queued_messages -= sent
            self.queued_bytes -= sent_bytes
            # A subscriber working through its queue is held back by its window, not by
            # its reading: the next part goes out in this pass (see ``prompt``).
            self.prompt = True
            if acked and session.cursor is not None:
                self.awaiting_acks = transport    # catching up: see server.loop.BusyPoll
        if not queue:
            session.retained_queued = None
        if not queue and session.dropped:
            log.warning("session %s: queue drained; %d messages were dropped while it was full",
                        name_shown(session.client_id), session.dropped)
            session.dropped = 0
        if session.shared:
            self.pump_shared(session)    # its shared subscriptions' backlogs (core.shared)
