"""A shared subscription group's backlog (core.shared): handed out, and read from the log.

``_drain`` hands the backlog out to members with room, round-robin, passing over an entry only
busy or offline members may read (``_pass_over``). Records dropped as they are written (5.0
Message Expiry passed, too large for the member) fill no window: past UNSENT_RECORDS of them
the hand-out goes on in the next loop pass, as a long stretch of records the group does not
take does.

Past QUEUE_MESSAGES / QUEUE_BYTES in memory a group keeps a cursor into the log, as a session
behind does (core.catchup), and reads the records matching its filter from there in batches
(``_refill``); retention and ``max_session_lag_age`` move a cursor they leave behind, and the
segments the groups still need are held (``check_shared_cursors``). Also what reads a backlog
held as log offsets: the topics of such messages (``_stored_topic``).
"""

from __future__ import annotations

import logging

from edgebroker.core.catchup import QUEUE_BYTES, QUEUE_MESSAGES, SCAN_BYTES, UNSENT_RECORDS
from edgebroker.core.mqtt5 import stored_properties
from edgebroker.core.session import Message, Stored
from edgebroker.core.shared import DENIED, Group
from edgebroker.errors import topic_shown

log = logging.getLogger("edgebroker.broker")


class SharedBacklog:
    """The backlog part of ``Broker``'s shared subscriptions (a mixin beside ``Shared``)."""

    def _drain(self, group: Group) -> None:
        """Hand out the backlog to members with room, round-robin, reading on from the log."""
        queue = group.queue
        taken = 0         # entries taken from the backlog: to members, or refused (ACLs)
        base = None       # taken - publish_sent when it first reads on from the log
        while True:
            left = len(queue)
            while queue:
                ref, qos, retain, topic = queue[0]
                if topic is None and self._guarded(group):
                    topic = self._stored_topic(ref)
                    queue[0] = (ref, qos, retain, topic)   # (looked up once)
                member = self._pick(group, qos, topic)
                if member is None:
                    if not self._pass_over(group):
                        return
                    break       # the room it made may take more from the log
                queue.popleft()
                group.queue_bytes -= ref.size
                if not queue and group.dropped:
                    log.warning("shared subscription %s: its backlog drained; %d messages were "
                                "dropped", topic_shown(group.key), group.dropped)
                    group.dropped = 0
                if member is DENIED:
                    self.stats.acl_deliveries_denied += 1
                    continue
                self._give(member, ref, qos, retain)
            if group.cursor is None:
                return
            # What went out is counted in publish_sent: the rest of what was taken was
            # dropped at write time (expired, too large), a budget per pass.
            taken += left - len(queue)
            if base is None:
                base = taken - self.stats.publish_sent
            elif taken - self.stats.publish_sent - base >= UNSENT_RECORDS:
                self._shared_later(group)
                return
            if not self._refill(group):
                return

    def _pass_over(self, group: Group) -> bool:
        """No member that may read the backlog's head can take it now (ACLs): hand out the
        entries behind it that members with room may read, keeping each topic's order (an
        entry whose topic waits stays behind it). True if any went out."""
        if not self._guarded(group) or not self._room(group):
            return False
        queue = group.queue
        kept = [queue.popleft()]
        waiting = set()         # topics none of whose readers can take one now
        gone = 0
        while queue:
            entry = queue.popleft()
            ref, qos, retain, topic = entry
            if topic is None:
                topic = self._stored_topic(ref)
                entry = (ref, qos, retain, topic)     # (looked up once)
            member = None if topic in waiting else self._pick(group, qos, topic)
            if member is None:
                waiting.add(topic)
                kept.append(entry)
                continue
            group.queue_bytes -= ref.size
            if member is DENIED:
                self.stats.acl_deliveries_denied += 1
            else:
                gone += 1
                self._give(member, ref, qos, retain)
        queue.extend(kept)
        return gone > 0

    def _room(self, group: Group) -> bool:
        """Whether a member could take a QoS 1/2 message now, whatever its topic."""
        limits = self.limits
        for member in group.ring:
            session = member.session
            client = session.client
            if client is None or client.transport.out_bytes >= client.transport.max_pending:
                continue
            if not member.qos or not session.queue and (
                    len(session.inflight) < (session.receive_max or limits.max_inflight_messages)
                    and session.inflight_bytes < limits.max_inflight_bytes):
                return True
        return False

    def _refill(self, group: Group) -> bool:
        """The next batch of the group's records from the log into the room left in its
        backlog (entries that wait for busy or offline members may hold part of it:
        ``Shared._pass_over``). True when draining may go on: something was queued, or it
        caught up."""
        room, room_bytes = QUEUE_MESSAGES - len(group.queue), QUEUE_BYTES - group.queue_bytes
        if room <= 0 or room_bytes <= 0:
            return False
        journal = self.journal
        commit_log = journal.log
        if commit_log.pending_bytes:
            journal.end_pass()
        first = commit_log.first_offset
        if group.cursor < first:
            self._skip_shared(group, first, "deleted by retention or damaged")
        head = self.live_offset()
        cursor = group.cursor
        if cursor >= head:
            self._shared_caught_up(group)
            return True
        if cursor >= commit_log.written_offset:
            return False     # the log cannot write: the next acknowledgement or pass retries
        records, next_offset = commit_log.read_batch(cursor, group.filter_bytes, room,
                                                     room_bytes, SCAN_BYTES)
        if next_offset > head:
            records = [r for r in records if r[0] < head]
            next_offset = head
        if next_offset <= cursor:
            self._skip_shared(group, commit_log.written_offset, "the log cannot be read there")
            return True
        self.count_missing(None, cursor, next_offset, group)
        done = group.done
        queue = group.queue
        queued = 0
        for offset, ts, qos, retain, topic, payload, size, properties in records:
            if qos == 0 or done is not None and offset in done:
                continue
            if payload is None:
                ref = Stored(offset, len(topic) + size)
                name = topic.decode("utf-8", "replace")     # for the members' ACLs
            else:
                name = topic.decode("utf-8", "replace")
                ref = (Message(name, payload, qos, retain, offset, topic, "", *stored_properties(
                    properties, ts, offset, journal, self.clock())) if properties
                       else Message(name, payload, qos, retain, offset, topic))
            queue.append((ref, qos, retain, name))
            group.queue_bytes += ref.size
            queued += 1
        group.cursor = next_offset
        if done is not None and next_offset > max(done):
            group.done = None
        if next_offset >= head:
            self._shared_caught_up(group)
            return True
        if not queued:
            # A long stretch of records it does not take: go on in the next pass.
            self._shared_later(group)
            return False
        return True

    def _shared_later(self, group: Group) -> None:
        self._shared_again.add(group)
        if not self._shared_timer.pending:
            self._shared_timer.start(self, self.clock())

    def _shared_caught_up(self, group: Group) -> None:
        if group.aged > 0:
            log.warning("shared subscription %s caught up with the log; %d more records were "
                        "lost to it for max_session_lag_age after the move logged",
                        topic_shown(group.key), group.aged)
        group.aged = -1
        group.cursor = None
        self.stats.shared_caught_up += 1

    def log_shared_counts_at_stop(self) -> None:
        """At a clean stop: the records groups behind lost for max_session_lag_age after the
        move logged (as ``log_counts_at_stop`` for sessions)."""
        for group in self.groups.values():
            if group.cursor is not None and group.aged > 0:
                log.warning("shared subscription %s: %d more records were lost to it for "
                            "max_session_lag_age after the move logged, up to the stop (it "
                            "had not caught up; a restart logs a new first move)",
                            topic_shown(group.key), group.aged)

    def _on_shared_again(self) -> None:
        groups, self._shared_again = self._shared_again, set()
        for group in groups:
            if group.cursor is not None and self.groups.get(group.key) is group:
                self._drain(group)

    def _skip_shared(self, group: Group, offset: int, why: str) -> int:
        """Move ``group``'s cursor forward to ``offset``: a gap, counted and logged (not when
        ``why`` is empty); the number of records lost."""
        lost = offset - group.cursor
        if lost <= 0:
            return 0
        self.drop("log_gap", None, lost)
        if why:
            log.warning("shared subscription %s: log records %d to %d are lost to it (%s): it "
                        "goes on from %d", topic_shown(group.key), group.cursor, offset - 1, why,
                        offset)
        group.cursor = offset
        self._snapshot_dirty = True     # a restart goes on from here, the gap counted once
        return lost

    def check_shared_cursors(self) -> None:
        """Periodic, after ``check_cursors``: move group cursors that retention or
        ``max_session_lag_age`` left behind, and hold the segments the groups need."""
        journal = self.journal
        if journal is None or not self.groups:
            return
        commit_log = journal.log
        first = commit_log.first_offset
        max_age = self.limits.max_session_lag_age
        oldest = (commit_log.offset_at_time(journal.wall_ms() - int(max_age * 1000))
                  if max_age else 0)
        hold = commit_log.hold_offset
        for group in self.groups.values():
            if group.cursor is not None:
                if group.cursor < first:
                    self._skip_shared(group, first, "retention deleted its segments: the log "
                                                    "was over retention_bytes")
                if group.cursor < oldest and group.aged >= 0:   # moved every second
                    group.aged += self._skip_shared(group, oldest, "")
                elif group.cursor < oldest:
                    self._skip_shared(group, oldest, f"its cursor was older than "
                                                     f"max_session_lag_age ({max_age:g} s); "
                                                     f"the next moves are counted, logged "
                                                     f"when it catches up")
                    group.aged = 0
            if group.backlog:
                floor = group.floor()
                if floor < hold:
                    hold = floor
        commit_log.hold_offset = hold

    def _stored_topic(self, ref) -> str | None:
        """The topic of a message the group holds only as its log offset (restored from a
        snapshot, or handed back by a member), for the members' ACLs; None when its record
        is gone (sending it then counts it lost)."""
        journal = self.journal
        where = journal.log.locate(ref.offset) if journal is not None else None
        return None if where is None else where.topic.decode("utf-8", "replace")
