"""Retained messages for a SUBSCRIBE, and those a session holds: in order, and kept.

``send_retained`` sends the retained messages matching each granted filter, with the retain
flag, or queues them behind what the session's queue holds. A session that is behind (it
reads the log from its cursor, core.catchup) is owed what its cursor has yet to read: its
copies are held on the cursor (``Cursor.held``) with the log offset the SUBSCRIBE came at,
and go into its queue when the cursor gets there (``release_held``, from
``CatchUp._caught_up``: refill reads no further than the first held offset, ``read_end``).
So they follow the messages published before the SUBSCRIBE and precede those published
after, as for a session in step (MQTT-4.6.0-6). Held copies count in the session's queued
figure; they are kept across a reconnect and a restart as the rest of the session, and go
only with the session (counted as its queue is when it expires).

A retained message sent at SUBSCRIBE may be far older than the log: retention deletes its
record while the retained store keeps the message whole (and the snapshot with it). A session
that goes offline keeps its queue and window as log offsets (``core.session.Stored``); for a
retained message it keeps its topic too (``StoredRetained``), and when the message is to be
sent again it comes from the retained store as long as the store holds that same message (the
same log offset), whether or not the log still has the record. A restart makes such entries
again from the retained messages the snapshot restored. One the store no longer holds
(replaced or cleared since) is read from the log, and counted and logged as lost
(``publish_lost``) when its record is gone, as any other.
"""

from __future__ import annotations

from edgebroker.core.mqtt5 import stored_properties
from edgebroker.core.session import Message, Session, Stored, StoredRetained
from edgebroker.mqtt import packets as P


# Retained messages matched for a SUBSCRIBE that cost the client one packet of its
# control_rate (docs/limits.md, "Control packet rate"); nodes of the retained tree walked to
# find them cost a tenth of a match each (a filter of "+" levels matching nothing may walk
# the whole tree).
RETAINED_PER_PACKET = 100
WALKED_PER_MATCH = 10


class RetainedDelivery:
    """The retained messages' part of ``Broker`` (a mixin over the broker's state)."""

    def send_retained(self, session: Session, topics, granted: list[int]) -> None:
        """Retained messages for new (or replaced) subscriptions, retain flag set; held until
        the cursor reaches the SUBSCRIBE's place in the log while the session is behind."""
        client = session.client
        acl = session.acl
        cursor = session.cursor
        if cursor is not None:
            at = self.live_offset()         # what its cursor reads up to first
            held = cursor.held
            pending = {e[1].offset for e in held} if held else set()
            count = len(held) if held else 0
        wanted: dict[str, int] = {}
        for (topic_filter, _), max_qos in zip(topics, granted):
            if max_qos != P.SUBACK_FAILURE:
                wanted[topic_filter] = max_qos      # a filter listed again: once, its last QoS
        if len(wanted) == 1:
            ((topic_filter, max_qos),) = wanted.items()
            matches = [(message, max_qos) for message in self.retained.match(topic_filter)]
        else:
            # One walk for them all: a message matching several of the filters goes once,
            # with the highest QoS among them (as live routing does, MQTT-3.3.5-1).
            matches = list(self.retained.match_filters(wanted))
        examined = len(matches) + self.retained.visited // WALKED_PER_MATCH
        for message, max_qos in matches:
            queued = session.retained_queued
            if queued and message.offset in queued:
                continue    # asked for again (by an earlier SUBSCRIBE): that copy goes
            if message.expires and message.expires <= self.clock():
                # A 5.0 retained message past its Message Expiry Interval: gone, for
                # every subscriber.
                self.retained.delete(message.topic)
                self.drop_expired(session, message.topic)
                continue
            if acl is not None and not acl.can_read(message.topic):
                self.stats.acl_deliveries_denied += 1
                continue
            qos = message.qos if message.qos < max_qos else max_qos
            if cursor is not None:
                if message.offset is None or message.offset not in pending:
                    if cursor.held is None:
                        cursor.held = []
                    cursor.held.append((at, message, qos, True))
                    if message.offset is not None:
                        pending.add(message.offset)
                    session.saved = None
                continue
            # Beyond max_pending_write_bytes retained messages wait in the session's queue
            # (bounded), QoS 0 included, and follow as the connection drains.
            if client.transport.out_bytes >= client.transport.max_pending:
                client.transport.wait_for_drain()
                self._enqueue(session, message, qos, True, True)
            elif qos == 0 and session.queued_qos0:
                self._enqueue(session, message, 0, True, True)  # behind the QoS 0 queued before
            elif qos == 0:
                self._write_publish(client, message, 0, True, False, None)
                continue
            elif (not session.queue and len(session.inflight) < (
                    session.receive_max or self.limits.max_inflight_messages)
                  and session.inflight_bytes < self.limits.max_inflight_bytes):
                self._send(session, message, qos, True)
                continue
            else:
                self._defer(session, message, qos, True, True)
            _queued_retained(session, message)
        if cursor is not None and cursor.held and len(cursor.held) > count:
            _latest_per_topic(cursor)
            self.pump(session)      # they go at once if the cursor is there already
        if examined >= RETAINED_PER_PACKET and client is not None:
            # The work (messages matched, nodes walked) costs the client's control rate as
            # that many packets would: a client subscribing to '#' over and over, or to
            # filters that walk a large retained tree, is throttled, not the loop taken.
            client.charge_control(examined // RETAINED_PER_PACKET)

    def read_end(self, cursor) -> int:
        """Where ``cursor`` reads up to now: the head of the log (``live_offset``), or the
        offset of the first SUBSCRIBE whose retained copies it holds."""
        head = self.live_offset()
        held = cursor.held
        if held is not None and held[0][0] < head:
            return held[0][0]
        return head

    def release_held(self, session: Session) -> bool:
        """The cursor reached ``read_end``: the retained copies held for the SUBSCRIBEs up to
        there go into the queue (behind a batch read up to there), but for those whose Message
        Expiry Interval passed meanwhile (deleted, counted). True when the session is
        still behind: it holds copies for a later SUBSCRIBE, or the log goes on."""
        cursor = session.cursor
        held = cursor.held
        if cursor.offset < held[0][0]:
            # (Refill found no subscription: nothing up to there can match.)
            cursor.offset = held[0][0]
        due = 0
        now = self.clock()
        for at, ref, qos, retain in held:
            if at > cursor.offset:
                break
            due += 1
            # Past its Message Expiry Interval while held: gone, for 3.1.1 subscribers too
            # (as at SUBSCRIBE; their writes do not look at expiry).
            message = ref if type(ref) is Message else (
                self.retained_copy(ref) if type(ref) is StoredRetained else None)
            expires, topic = ((message.expires, message.topic) if message is not None
                              else self._record_expiry(ref))
            if expires and expires <= now:
                if message is not None and self.retained.get(message.topic) is message:
                    self.retained.delete(message.topic)
                self.drop_expired(session, topic)
                continue
            self._enqueue(session, ref, qos, retain, True)
            _queued_retained(session, ref)
        del held[:due]
        if not held:
            cursor.held = None
        session.saved = None
        if not session.clean:
            self._snapshot_dirty = True
        return cursor.held is not None or cursor.offset < self.live_offset()

    def _record_expiry(self, ref) -> tuple[float, str]:
        """When the log record ``ref`` refers to expires (0: never, or not read), and its
        topic: for a held copy the retained store no longer holds (replaced, or deleted as
        expired), read back from the log, where its Message Expiry Interval is among its
        properties."""
        journal = self.journal
        where = journal.log.locate(ref.offset) if journal is not None else None
        if where is None or not where.properties:
            return 0.0, ""
        return (stored_properties(where.properties, where.timestamp_ms, ref.offset, journal,
                                  self.clock())[1], where.topic.decode("utf-8", "replace"))

    def forget_held(self, session: Session, offset: int) -> None:
        """After a crash: the retained copy held for ``session`` at ``offset`` was sent (its
        QoS 2 exchange was journaled): not held, not sent again."""
        cursor = session.cursor
        if cursor is not None and cursor.held:
            cursor.held = [e for e in cursor.held if e[1].offset != offset] or None

    def retained_copy(self, stored: StoredRetained) -> Message | None:
        """The retained store's message when it is still the one ``stored`` refers to (the
        same log offset), else None."""
        message = self.retained.get(stored.topic)
        if message is not None and message.offset == stored.offset:
            return message
        return None

    def retained_offsets(self) -> dict[int, str]:
        """Log offset -> topic of the retained messages in the store (at start: to make a
        restored session's entries ``StoredRetained``, ``stored_ref``)."""
        found: dict[int, str] = {}
        for message in self.retained.values():
            if message.offset is not None:
                found[message.offset] = message.topic
        return found


def stored_ref(offset: int, size: int, retained_at: dict[int, str]) -> Stored:
    """A restored queue or window entry: a ``StoredRetained`` when a retained message in the
    store has its offset (``retained_at``, from ``RetainedDelivery.retained_offsets``)."""
    topic = retained_at.get(offset)
    return Stored(offset, size) if topic is None else StoredRetained(offset, size, topic)


def _latest_per_topic(cursor) -> None:
    """Of the copies ``cursor`` holds for one topic, only the one for the latest SUBSCRIBE
    stays (the topic's retained message then; the earlier ones were replaced in the store
    since): a session behind that subscribes again and again, while the topic changes, holds
    one copy per retained topic, not one per SUBSCRIBE. A copy restored without its topic (a
    message the store no longer held at the restart) stays as it is."""
    held = cursor.held
    seen: set[str] = set()
    keep = []
    for entry in reversed(held):
        topic = getattr(entry[1], "topic", None)
        if topic is not None:
            if topic in seen:
                continue
            seen.add(topic)
        keep.append(entry)
    if len(keep) < len(held):
        keep.reverse()
        cursor.held = keep


def _queued_retained(session: Session, message) -> None:
    """``message`` went to the end of the session's queue as a retained message for a new
    subscription (it may have been dropped instead: max_queued_messages): noted in
    ``Session.retained_queued`` until it is sent or dropped."""
    queue = session.queue
    if queue and queue[-1][0] is message and message.offset is not None:
        pending = session.retained_queued
        if pending is None:
            pending = session.retained_queued = set()
        pending.add(message.offset)
