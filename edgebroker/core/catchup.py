"""The log is the queue: a session that falls behind reads the commit log from its cursor.

Every message a client publishes is in the commit log before it is routed. A session that
cannot take a message now — its window and its small in-memory queue are full, its
connection has ``max_pending_write_bytes`` waiting, or its client is offline — stops being
routed to and keeps a ``Cursor`` instead: the log offset of the first message it has not
been given. Catching up (``refill``, called by ``Router.pump`` when the queue runs dry),
the broker reads forward from the cursor in batches (``CommitLog.read_batch``: the native
scanner validates the records and, for a session with one subscription, filters them by
topic), keeps those that match the session's subscriptions, with the QoS granted, in the
session's queue, and the pump sends them as the window and the connection allow: payloads
below ``COPY_LIMIT`` from memory, larger ones straight from the segment file (sendfile).
When the cursor reaches the head of the log the session is routed to again, in the same
step of the single-threaded core: no message in between is missed or sent twice.

What a session behind holds in memory does not grow with its backlog: the cursor, the
subscriptions made while behind (``since``: from the offset each was made at), the offset
ranges it was offline in (for ``queue_qos0_messages``), a bounded cache of topic decisions,
at most one batch of records, and the retained copies held for SUBSCRIBEs made while behind
(``Cursor.held``, sent when the cursor reaches each SUBSCRIBE's offset: core.retained).

Rules kept (docs/persistence.md):

- order: one session reads the log in offset order, the order messages were accepted;
- overlapping subscriptions: a record is delivered once, at the highest QoS granted among
  the session's matching filters (as for live routing);
- QoS 1/2 are never skipped while their records are in the log; QoS 0 records are skipped
  (counted as dropped, ``max_lag``, logged once per episode) once the session is more than
  ``max_lag_bytes`` behind the head or the record is older than ``max_lag_age``;
- retention deletes segments a cursor needs only when ``retention_bytes`` forces it; a
  cursor below the first record kept, or older than ``max_session_lag_age``, moves on: the
  records skipped (and offsets no segment holds) are counted (``log_gap``) and logged
  (the moves of one episode once: core.retention_moves).
"""

from __future__ import annotations

import logging
from operator import itemgetter

from edgebroker.core.catchup_run import lag_cut
from edgebroker.core.cursor import Cursor, needed_from
from edgebroker.core.mqtt5 import stored_properties
from edgebroker.core.retention_moves import (counts_at_removal, counts_at_stop, episode_ends,
                                             move_below)
from edgebroker.core.router5 import options5, options5_for
from edgebroker.core.session import Message, Stored
from edgebroker.core.timers import Timer
from edgebroker.errors import name_shown, topic_shown

log = logging.getLogger("edgebroker.broker")

# A session's in-memory queue (live messages the window could not take, or a batch read from
# the log) holds up to this many messages or payload bytes; past it the session reads from the
# log. Retained messages sent for a new subscription are not bounded by it (the retained store
# is, by max_topics).
QUEUE_MESSAGES = 256
QUEUE_BYTES = 256 * 1024
# One refill reads at most this many log bytes looking for matching records; a session with a
# long stretch of records it does not want continues in the next loop pass.
SCAN_BYTES = 4 * 1024 * 1024
# All refills of a loop pass (sessions reconnecting at once, the catch-up pass) read at most
# about this many log bytes together; sessions past it go on in the next pass (the catch-up
# timer), so that many sessions behind do not each scan SCAN_BYTES in one pass.
PASS_SCAN_BYTES = 4 * SCAN_BYTES
# ... and hand Python at most about this many records together (each costs the loop a few
# microseconds however small: 500 sessions of several filters each taking a batch of 256 small
# records in one pass made passes of 300 ms, another client's PINGREQ waiting as long).
PASS_RECORDS = 1024
# Records queued, then dropped as they were to be written (5.0 Message Expiry passed, over the
# client's Maximum Packet Size, refused by its ACL) fill neither the window nor the output: past
# this many of them, one pump (or a shared group's hand-out) goes on in the next loop pass.
UNSENT_RECORDS = 1024
NO_HOLD = 1 << 63
# ``CatchUp.lag`` of a session in step with the log (no cursor); read only.
IN_STEP = {"cursor": None, "lag_records": 0, "lag_bytes": 0, "lag_seconds": 0.0}


class CatchUp:
    """Catching up's part of ``Broker`` (a mixin over the broker's state)."""

    def _init_catchup(self) -> None:
        self.behind: set = set()            # sessions with a cursor
        # Online sessions to go on with in the next pass (behind, or with room made in
        # their window by Resume.let_go_of_gone).
        self._catch_up_again: set = set()
        self._catch_up_timer = Timer(self._on_catch_up)
        # What is left of the budgets shared by refills (PASS_SCAN_BYTES, PASS_RECORDS),
        # whole again at the end of each pass and at each catch-up pass: once spent, refills
        # wait for the next one.
        self._scan_left = PASS_SCAN_BYTES
        self._records_left = PASS_RECORDS
        self._first_offset = 0              # the log's first offset at the last check
        self.log_queue = self._log_is_queue(self.limits)

    def _log_is_queue(self, limits) -> bool:
        """Sessions that fall behind read from the log unless the in-memory queue limits are
        set (then they keep their Mosquitto meaning: a bounded queue that drops)."""
        return (self.journal is not None and not limits.max_queued_messages
                and not limits.max_queued_bytes)

    def fall_behind(self, session, offset: int) -> None:
        """``session`` reads from ``offset`` on from the log, and is no longer routed to."""
        session.cursor = Cursor(offset, needed_from(session, offset,
                                                    self.journal.log.first_offset))
        self.behind.add(session)
        self.stats.sessions_fell_behind += 1

    def _caught_up(self, session) -> None:
        cursor = session.cursor
        if cursor.held is not None and self.release_held(session):
            return      # its retained copies held up to here are queued; it reads on after
        if cursor.lag_dropped:
            log.warning("session %s caught up with the log; %d QoS 0 messages were skipped "
                        "while it was behind by more than max_lag_bytes or max_lag_age",
                        name_shown(session.client_id), cursor.lag_dropped)
        if cursor.aged > 0:
            log.warning("session %s caught up with the log; %d more records were lost to it "
                        "for max_session_lag_age after the move logged",
                        name_shown(session.client_id), cursor.aged)
        episode_ends(session, "caught up with the log")
        session.cursor = None
        self.behind.discard(session)
        self._catch_up_again.discard(session)
        self.stats.sessions_caught_up += 1
        if not session.clean:
            self._snapshot_dirty = True

    def log_counts_at_stop(self) -> None:
        """At a clean stop: what sessions behind counted to log when they catch up (a restart
        starts new episodes; a crash loses these lines, not the counters)."""
        for session in self.behind:
            counts_at_stop(session)

    def read_on(self, session, unsent: int) -> bool:
        """``Router.pump`` emptied the queue of ``session`` (behind, online, with room):
        the rest of a run read from the log, else the next batch. ``unsent``: the records
        the pump dropped at write time so far; past UNSENT_RECORDS the session goes on in
        the next pass. True when the pump may go on."""
        if unsent >= UNSENT_RECORDS:
            self._go_on_later(session)
            return False
        cursor = session.cursor
        if cursor.run is not None:
            # Records read from the log as a run (core.catchup_run.Run), sent a piece
            # (one native call, one write) at a time.
            if not self.send_run(session, cursor.run):
                return False
            cursor.run = None
            return True
        return self.refill(session)

    def _behind_unlogged(self, session, message) -> None:
        """A QoS 0 message the log could not take (disk full) for ``session``, behind: sent
        or queued now, it would pass the older messages the session has yet to read from the
        log (order per topic and QoS, MQTT-4.6.0-6). It is dropped for the session
        (``not_logged``), counted when the session would have taken it."""
        if session.client is None and not (self.limits.queue_qos0_messages
                                           and not session.clean):
            return      # offline, it takes no QoS 0 messages
        acl = session.acl
        if acl is not None and not acl.can_read(message.topic):
            return
        if session.sub5 is not None and options5(session, message)[0] < 0:
            return      # 5.0 No Local
        self.drop("not_logged", session)

    def _go_on_later(self, session) -> None:
        self._catch_up_again.add(session)
        if not self._catch_up_timer.pending:
            self._catch_up_timer.start(self, self.clock())

    def refill(self, session) -> bool:
        """Read the next batch of ``session``'s records from the log into its queue (the
        client is online, its queue empty). True when the pump may go on: something was
        queued, or the session caught up and is routed to again."""
        cursor = session.cursor
        journal = self.journal
        commit_log = journal.log
        if commit_log.pending_bytes:
            # Records appended in this pass are written now, so that they can be read.
            journal.end_pass()
        first = commit_log.first_offset
        if cursor.offset < first:
            # Below the first record kept: retention deleted it, or it is damaged (a first
            # record that fails its CRC; a segment that lost every record): not told apart.
            self._skip(session, first, "deleted by retention or damaged")
        # Where live routing takes over: the head of the log, or the first message logged
        # but not yet routed (Router.live_offset); before it, retained copies held for a
        # SUBSCRIBE made while behind (core.retained).
        head = self.read_end(cursor)
        if cursor.offset >= head:
            self._caught_up(session)
            return True
        if cursor.offset >= commit_log.written_offset:
            return False          # the log cannot write (journal.retry resumes the session)
        subscriptions = session.subscriptions
        if not subscriptions:
            # Nothing can match: what is left of the log is read at once.
            self._caught_up(session)
            return True
        scan = self._scan_left
        if scan <= 0 or self._records_left <= 0:
            self._go_on_later(session)     # the pass's scan budget is spent
            return False
        scan = min(scan, SCAN_BYTES)
        start = cursor.offset
        topic_filter = None
        limits = self.limits
        if cursor.lowered is not None or cursor.kept5 is not None or cursor.owed is not None:
            cursor.read_past()
        # 5.0 options (No Local, Retain As Published; those a filter had before a SUBSCRIBE
        # changed them while behind: Cursor.kept5): core.router5
        sub5 = session.sub5 is not None or cursor.kept5 is not None
        if len(subscriptions) == 1 and not cursor.since:
            topic_filter = next(iter(subscriptions)).encode("utf-8")
            if (session.acl is None and cursor.done is None and session.client.v5 is None
                    and not sub5 and cursor.lowered is None and cursor.owed is None):
                # The scanner's filter is the whole decision: the records go out as a run
                # (3.1.1 frames: a 5.0 client's PUBLISH has more to say, core.router5; a
                # session a 5.0 client made may have No Local on the filter).
                found = commit_log.read_run(start, topic_filter, scan)
                if found is not None:
                    self._scanned(start, found[1])
                    return self._take_run(session, found, head, subscriptions[
                        next(iter(subscriptions))])
        records, next_offset = commit_log.read_batch(start, topic_filter, QUEUE_MESSAGES,
                                                     QUEUE_BYTES, scan, client_ids=sub5)
        self._scanned(start, next_offset)
        self._records_left -= len(records)
        if next_offset > head:
            records = [r for r in records if r[0] < head]
            next_offset = head
        if next_offset <= cursor.offset:
            # Nothing could be read from there although it is written (damage the readers
            # reported): what is left is lost to it, rather than asking again every pass.
            self._skip(session, commit_log.written_offset, "the log cannot be read there")
            return True
        lag_bytes = limits.max_lag_bytes
        drop_qos0 = bool(lag_bytes) and commit_log.bytes_after(cursor.offset) > lag_bytes
        if drop_qos0 and records:
            # QoS 0 is skipped only up to where it is within max_lag_bytes of the end: the
            # batch ends there (the next one reads the rest without skipping).
            cut = lag_cut(commit_log, records, 0, len(records), lag_bytes, itemgetter(0))
            if not cut:
                drop_qos0 = False
            elif cut < len(records):
                next_offset = records[cut][0]
                del records[cut:]
        self.count_missing(session, cursor.offset, next_offset)
        max_age = limits.max_lag_age
        too_old = journal.wall_ms() - int(max_age * 1000) if max_age else -1
        offline = cursor.offline
        keep_offline_qos0 = limits.queue_qos0_messages and not session.clean
        acl = session.acl
        queue = session.own_queue() if records else session.queue
        queued = queued_bytes = 0
        lagging = maybe_sent = 0
        unsure_to = cursor.unsure_to
        owed_by = cursor.owed
        done = cursor.done
        v5 = session.client.v5 is not None
        own_id = session.client_id.encode("utf-8")
        for offset, ts, qos, retain, topic, payload, size, properties, *publisher in records:
            if done is not None and offset in done:
                continue      # sent before a restart, its exchange journaled (see Cursor.done)
            published = qos
            granted = cursor.granted(session, topic, offset)
            if granted < 0:
                continue
            if granted < qos:
                qos = granted
            name = topic.decode("utf-8", "replace")
            retain_out = False
            own = False
            if sub5:
                own = publisher[0] == own_id
                best, retain_out = options5_for(session, name, retain, own, offset)
                if best < 0:
                    continue
                if best < qos:
                    qos = best
            if acl is not None:
                allowed = acl.reads.get(name)
                if allowed is None:
                    allowed = acl.check_read(name)
                if not allowed:
                    self.stats.acl_deliveries_denied += 1
                    continue
            if qos == 0:
                # A QoS 1/2 message taken at QoS 0 only since a filter that granted it more
                # was unsubscribed while behind was owed when published: sent at QoS 0, never
                # skipped (Cursor.owed, docs/persistence.md).
                owed = published and owed_by is not None and cursor.owed_at(name, offset)
                if offset < unsure_to and not owed:
                    maybe_sent += 1       # at most once: perhaps sent before a crash
                    continue
                # Not kept while offline: what it takes at QoS 0 (uncounted, as live
                # routing to an offline session).
                if (offline and not keep_offline_qos0 and not owed
                        and cursor.left_offline(offset, published)):
                    continue
                if (drop_qos0 or ts < too_old) and not owed:
                    lagging += 1
                    continue
                session.queued_qos0 += 1
            if payload is None:
                ref = Stored(offset, len(topic) + size)
            elif properties and v5:  # (a 3.1.1 subscriber gets none)
                ref = Message(name, payload, qos, False, offset, topic,
                              session.client_id if own else "", *stored_properties(
                                  properties, ts, offset, journal, self.clock()))
            else:
                ref = Message(name, payload, qos, False, offset, topic,
                              session.client_id if own else "")
            queue.append((ref, qos, retain_out))
            queued += 1
            queued_bytes += ref.size
        if lagging:
            self._lag_drop(session, lagging, drop_qos0)
        if maybe_sent:
            self.drop("restart_qos0", session, maybe_sent)
        session.queue_bytes += queued_bytes
        self.queued_messages += queued
        self.queued_bytes += queued_bytes
        cursor.offset = next_offset
        if done is not None and next_offset > max(done):
            cursor.done = None
        if not session.clean:
            self._snapshot_dirty = True   # a restart goes on from here
        if next_offset >= head:
            self._caught_up(session)
            return True
        if not queued:
            # A long stretch of records it does not take: go on in the next pass.
            self._go_on_later(session)
            return False
        return True

    def _scanned(self, start: int, end: int) -> None:
        """A refill read the log from ``start`` to ``end``: spent from the pass's budget."""
        if end > start:
            commit_log = self.journal.log
            self._scan_left -= commit_log.bytes_after(start) - commit_log.bytes_after(end)

    def new_pass_budgets(self) -> None:
        """The scan and record budgets of a loop pass, whole again (at the end of a pass, and
        when the catch-up timer goes on with the sessions left over)."""
        self._scan_left = PASS_SCAN_BYTES
        self._records_left = PASS_RECORDS

    def _on_catch_up(self) -> None:
        self.new_pass_budgets()
        if self.records_gone:
            self.let_go_of_gone()         # (core.resume)
        sessions, self._catch_up_again = self._catch_up_again, set()
        for session in sessions:
            if session.client is not None:
                self.pump(session)

    def resume_behind(self) -> None:
        """The log writes again: sessions waiting for records it could not write go on."""
        for session in list(self.behind):
            if session.client is not None and not session.queue:
                self.pump(session)

    def _lag_drop(self, session, count: int, by_bytes: bool) -> None:
        cursor = session.cursor
        self.drop("max_lag", session, count)
        self.hit("max_lag_bytes" if by_bytes else "max_lag_age")
        if not cursor.lag_dropped:
            limits = self.limits
            log.warning("session %s is behind the head of the log by more than %s: skipping its "
                        "QoS 0 messages until it catches up (counted as dropped, max_lag; logged "
                        "once per episode)", name_shown(session.client_id),
                        f"max_lag_bytes ({limits.max_lag_bytes})" if by_bytes
                        else f"max_lag_age ({limits.max_lag_age:g} s)")
        cursor.lag_dropped += count

    def count_missing(self, session, start: int, end: int, group=None) -> None:
        """A read that went from ``start`` to ``end`` passed over offsets no segment holds (a
        segment missing from the log, CommitLog.missing_between) or damaged records (readers
        skip them, CommitLog.damaged_between): they are lost to ``session`` (or to the shared
        subscription ``group``), counted and logged."""
        commit_log = self.journal.log
        gaps = [(a, b, "missing from the log: no segment holds them")
                for a, b in commit_log.missing_between(start, end)]
        gaps += [(a, b, f"damaged in {path}")
                 for a, b, path in commit_log.damaged_between(start, end)]
        for a, b, why in gaps:
            self.drop("log_gap", session, b - a)
            who = (f"session {name_shown(session.client_id)}" if group is None
                   else f"shared subscription {topic_shown(group.key)}")
            log.warning("%s: log records %d to %d are lost to it (%s)", who, a, b - 1, why)

    def _skip(self, session, offset: int, why: str) -> int:
        """Move ``session``'s cursor forward to ``offset``: a gap, counted and logged (not
        when ``why`` is empty); the number of records lost."""
        cursor = session.cursor
        cursor.drop_run()      # what it read and did not send is gone too, where it is lost
        lost = offset - cursor.offset
        if lost <= 0:
            return 0
        self.drop("log_gap", session, lost)
        if why:
            log.warning("session %s: log records %d to %d are lost to it (%s): it goes on from "
                        "%d", name_shown(session.client_id), cursor.offset, offset - 1, why, offset)
        cursor.offset = offset
        if cursor.floor < offset:
            cursor.floor = offset
        session.saved = None
        if not session.clean:
            self._snapshot_dirty = True
        return lost

    def check_cursors(self, now: float) -> None:
        """Periodic (core.timers): hold the segments cursors need from age retention, and
        move cursors that retention or ``max_session_lag_age`` left behind."""
        commit_log = self.journal.log if self.journal is not None else None
        if commit_log is None:
            return
        behind = self.behind
        first = commit_log.first_offset
        due = commit_log.offset_at_time(self.journal.wall_ms()
                                        - commit_log.options.retention_ms)
        for session in list(behind):
            if (session.client is None and not session.subscriptions
                    and session.cursor.held is None):
                self._nothing_to_read(session)
        if first > self._first_offset:
            move_below(self, first, self._first_offset)    # (core.retention_moves)
            self._first_offset = first
        max_age = self.limits.max_session_lag_age
        if max_age and behind:
            oldest = commit_log.offset_at_time(self.journal.wall_ms() - int(max_age * 1000))
            for session in list(behind):
                cursor = session.cursor
                if cursor.offset >= oldest:
                    continue
                if cursor.aged >= 0:    # moved every second while it is that far behind
                    cursor.aged += self._skip(session, oldest, "")
                    continue
                self._skip(session, oldest, f"its cursor was older than max_session_lag_age "
                                            f"({max_age:g} s); the next moves are counted, "
                                            f"logged when it catches up")
                cursor.aged = 0
        # A connected session reads and is acknowledged: what it needs moves on (offline,
        # it stays where _go_offline left it). Worked out again only for cursors that hold
        # records age retention would delete, so that it costs nothing most of the time.
        hold = NO_HOLD
        for session in behind:
            cursor = session.cursor
            if cursor.floor < due and session.client is not None:
                cursor.floor = needed_from(session, cursor.unsent(), first)
            if cursor.floor < hold:
                hold = cursor.floor
        if due > first:
            # The others (connected and in step, or offline without a cursor) hold what their
            # window and queue go back to: such a message is kept in memory while its client
            # is connected, but only its offset once it goes offline or in the snapshot.
            for session in self.sessions.values():
                if (session.inflight or session.queue) and session not in behind:
                    floor = needed_from(session, hold, first, whole_queue=False)
                    if floor < hold:
                        hold = floor
        commit_log.hold_offset = hold

    def _nothing_to_read(self, session) -> None:
        """Nothing past ``session``'s cursor can be for it: offline, no subscriptions of its
        own (shared ones read their groups' backlogs; _go_offline gives such a session no
        cursor), no retained copies held; a cursor restored from the snapshot, or kept from
        before it unsubscribed. It is in step from now on: no lag, no segment held (a
        SUBSCRIBE when it is back takes what follows, as for any session in step)."""
        counts_at_removal(session, "before its cursor was dropped (nothing in the log can be "
                                   "for it: no subscriptions)")
        session.cursor = None
        self.behind.discard(session)
        self._catch_up_again.discard(session)
        session.saved = None
        if not session.clean:
            self._snapshot_dirty = True

    def lag(self, session) -> dict:
        """How far ``session`` is behind the head of the log (the admin socket, metrics),
        from the first record it has not been sent (records read ahead count as not read)."""
        cursor = session.cursor
        if cursor is None or self.journal is None:
            return IN_STEP
        unsent = cursor.unsent(session.queue, session.retained_queued)
        return {"cursor": unsent, **self.journal.log.lag(unsent, self.journal.wall_ms())}


__all__ = ["CatchUp", "Cursor", "IN_STEP", "QUEUE_MESSAGES", "QUEUE_BYTES"]
