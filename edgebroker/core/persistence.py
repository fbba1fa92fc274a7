"""The broker's state across restarts: capture, restore, replay (the format is core.snapshot).

Persistent sessions are kept by log offset (and size), never by payload; retained messages
whole. ``capture`` is taken by ``Broker._maintain`` (core.timers) when sessions or
subscriptions changed (``_snapshot_dirty``), at most every ``SNAPSHOT_DEBOUNCE`` seconds, and
at least every ``SNAPSHOT_EVERY`` while messages flow; the server writes it
(``submit_snapshot``). At start the server calls ``restore`` with the last snapshot, then
``replay`` with the log records written after it. docs/persistence.md describes the whole.
"""

from __future__ import annotations

import logging

from edgebroker.core import snapshot as snap
from edgebroker.core.mqtt5 import stored_properties
from edgebroker.core.retained import stored_ref
from edgebroker.core.session import Message, Outgoing, Session
from edgebroker.errors import name_shown
from edgebroker.mqtt.topics import is_shared

log = logging.getLogger("edgebroker.broker")

# A snapshot is written at most this often after a change to sessions or subscriptions, and at
# least this often while messages flow (bounding the log replay at start).
SNAPSHOT_DEBOUNCE = 1.0
SNAPSHOT_EVERY = 30.0
# retention_bytes waits at most this long for a snapshot covering the records it would delete.
RETENTION_WAIT = 5.0


class Persistence:
    """Snapshots' part of ``Broker`` (a mixin over the broker's state)."""

    def _init_persistence(self, commit_log) -> None:
        self.submit_snapshot = None           # set by the server: takes encoded snapshot bytes
        self._snapshot_dirty = False
        self._snapshot_at = self.started      # when the last snapshot was taken
        self._snapshot_offset = commit_log.next_offset if commit_log is not None else 0
        self._retained_saved: dict[str, snap.RetainedState] = {}  # topic -> state (capture)
        self.snapshot_writer = None           # set by the server: its ``saved_offset``
        # The replay offset of the snapshot on disk (the restored one until one is written),
        # since when retention_bytes waits for a newer one, and (it stopped waiting: the
        # snapshot could not be written in time) that offset, until a snapshot is written.
        self._saved_offset = 0
        self._retention_waiting: float | None = None
        self._unsaved_going: int | None = None
        self._unsaved_counted = 0
        # Restored sessions that were connected when the snapshot was written and that the
        # replay queues for (max_queued_messages/bytes set): see ``replay``.
        self._replay_unsure: list[Session] = []
        # Inbound QoS 2 packet ids of sessions the snapshot lacked, for their clients' next
        # connection (core.exchange_restore), and since when (None: none).
        self.orphan_ids: dict[str, dict[int, tuple]] | None = None
        self._orphans_since = 0.0

    def capture(self) -> snap.Snapshot:
        """The state a restart needs: persistent sessions by log offset, retained messages.

        An immutable view, encoded and written by the snapshot writer's thread: the core only
        takes what changed. An offline session's state is reused from the last snapshot until
        it changes (``Session.saved``, cleared where it does); a retained message's, until its
        topic is set again (``RetainedTree.changed``, ``snapshot.save_retained``). The QoS 2
        exchange journal starts a new file here: the snapshot names it, and a restart applies
        it (``apply_exchanges``, core.exchange_restore)."""
        journal = self.journal
        next_offset = journal.log.next_offset if journal is not None else 0
        # Sessions in step with the log and retained messages have everything routed before
        # the live offset; a restart replays from there.
        result = snap.Snapshot(log_next_offset=self.live_offset() if journal is not None else 0,
                               written_ms=journal.wall_ms() if journal is not None else 0)
        exchanges = self.exchanges
        unsafe: dict[str, dict[int, int]] = {}
        if exchanges is not None:
            result.exchanges = exchanges.rotate()
            if self.orphan_ids is not None:   # core.exchange_restore
                result.carried = self.carry_orphan_ids()
            for offset, client_id, pid in exchanges.unsafe:
                unsafe.setdefault(client_id, {})[pid] = offset
        sessions = result.sessions
        now = self.clock()
        for session in self.sessions.values():
            if session.clean:
                if session.shared is not None and session.inflight and exchanges is not None:
                    self.journal_shared_flight(session)
                continue
            state = session.saved
            held = unsafe.get(session.client_id) if unsafe else None
            if (state is None or session.client is not None or held is not None
                    or session.cursor is not None and state.cursor != session.cursor.offset):
                state = self._session_state(session, now, result.written_ms)
                if self.will_timers:
                    state.will = self.will_state(session, now, result.written_ms)
                if session.shared is not None:
                    self.shared_session_state(session, state)
                if held is not None:
                    self._leave_unsafe_out(session, state, held)
                elif session.client is None:
                    session.saved = state
            sessions.append(state)
        saved = self._retained_saved
        snap.save_retained(saved, self.retained, now, result.written_ms)
        result.retained = list(saved.values())
        result.shared = self.capture_shared()
        result.wills = list(self.stopped_wills)
        self._snapshot_dirty = False
        self._snapshot_offset = next_offset
        return result

    def _leave_unsafe_out(self, session: Session, state: snap.SessionState,
                          held: dict[int, int]) -> None:
        """Inbound QoS 2 packet ids whose log record is not safe yet (written to the OS, or
        fsynced with ``durability = "sync"``: its PUBREC waits) stay out of the snapshot: a
        crash may lose that record, and the publisher's re-send (DUP) must then be logged,
        not taken for a duplicate. Their ``I`` records go to the exchange journal's new file
        instead, which a restart applies only when the log holds their offset."""
        awaiting = session.awaiting_release
        state.awaiting_release = {p: d for p, d in state.awaiting_release.items()
                                  if p not in held}
        for pid, offset in held.items():
            if pid in awaiting:
                self.exchanges.carry(session.client_id, pid, offset, awaiting[pid])

    def hold_for_snapshot(self, commit_log, now: float) -> bool:
        """Before retention (``_maintain``): it deletes no log record the snapshot on disk
        does not cover, as a restart replays them (a retained message set there is only in
        the log until the next snapshot). True when the disk limit waits for a snapshot: take
        one now. After ``RETENTION_WAIT`` s, or at once while snapshots cannot be written,
        retention_bytes deletes them all the same: logged once, counted per record."""
        writer = self.snapshot_writer
        if writer is None:
            return False
        if writer.saved_offset is not None:
            self._saved_offset = writer.saved_offset
        saved = commit_log.saved_offset = self._saved_offset
        if self._unsaved_going is not None:
            if saved == self._unsaved_going:
                return False
            self._unsaved_going = None
            commit_log.unsaved_may_go = False
            log.warning("session snapshot written again (log offset %d): retention_bytes waits "
                        "for it again", saved)
        if not commit_log.retention_waits:
            self._retention_waiting = None
            return False
        if self._retention_waiting is None:
            self._retention_waiting = now
            log.debug("retention_bytes waits for a session snapshot covering the log records from "
                     "offset %d on before it deletes them (at most %g s)", saved, RETENTION_WAIT)
        waited = now - self._retention_waiting
        if not writer.failing and waited < RETENTION_WAIT:
            return True
        self._unsaved_going = saved
        commit_log.unsaved_may_go = True
        log.warning("retention_bytes deletes log records from offset %d on, which the session "
                    "snapshot does not cover yet (%s): a crash before the next snapshot is "
                    "written loses the retained messages set in them (counted in "
                    "retention_unsaved_records)", saved,
                    "it cannot be written" if writer.failing
                    else f"none written for {waited:.1f} s")
        return False

    def hold_unsaved_from_start(self) -> None:
        """At start, before the first maintenance: retention keeps the log records the
        snapshot on disk (the one restored, or none) does not cover, as
        ``hold_for_snapshot`` does from then on (a segment rolled in the first second would
        otherwise go, with the retained messages set in it)."""
        if self.journal is not None:
            self.journal.log.saved_offset = self._saved_offset

    def count_unsaved(self, commit_log) -> None:
        """After retention: the records it deleted that no snapshot covered."""
        deleted = commit_log.counters.unsaved_deleted_records
        if deleted != self._unsaved_counted:
            self.stats.retention_unsaved_records += deleted - self._unsaved_counted
            self._unsaved_counted = deleted

    @staticmethod
    def _session_state(session: Session, now: float, written_ms: int) -> snap.SessionState:
        state = snap.SessionState(session.client_id, dict(session.subscriptions),
                                  awaiting_release=dict(session.awaiting_release),
                                  next_id=session._next_id,
                                  drops=dict(session.drops) if session.drops else {})
        if session.offline_at is not None:
            state.offline_ms = written_ms - int((now - session.offline_at) * 1000)
        state.expiry_interval = session.expiry_interval
        if session.sub5:
            state.sub5 = {f: list(v) for f, v in session.sub5.items()}
        cursor = session.cursor
        if cursor is not None:
            state.cursor = cursor.unsent()    # what it read and did not send is read again
            cursor.save_filters(state)    # (since, lowered, kept5, owed)
            state.offline = [list(r) for r in cursor.offline] if cursor.offline else []
            if cursor.done:
                state.done = sorted(cursor.done)
            if cursor.unsure_to > state.cursor:
                state.unsure_to = cursor.unsure_to
            state.resubscribed = cursor.resubscribed
            if cursor.held:
                state.held = [(at, ref.offset, qos, retain, ref.size)
                              for at, ref, qos, retain in cursor.held if ref.offset is not None]
        for pid, entry in session.inflight.items():
            ref = entry.message
            if ref.offset is not None:
                state.inflight.append((pid, ref.offset, entry.qos, entry.retain, entry.state,
                                       ref.size))
        if session.queue:
            # The entries as they are (a copy of the deque in one call; their messages never
            # change): the writer takes offsets and sizes from them (snapshot.queue_entry).
            state.queue = list(session.queue)
        return state

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
        now, wall_ms = self.clock(), self.journal.wall_ms() if self.journal else state.written_ms
        for r in state.retained:
            offset = r.offset if end is None or r.offset is None or r.offset < end else None
            expires = 0.0 if r.expires_ms is None else now + (r.expires_ms - wall_ms) / 1000
            self.retained.set(r.topic, Message(r.topic, r.payload, r.qos, True, offset, None,
                                               r.client_id, r.properties, expires))
        # Entries of retained messages the store holds are sent from there (core.retained).
        retained_at = self.retained_offsets() if state.sessions else {}
        for s in state.sessions:
            if end is not None:
                kept = [e for e in s.inflight if e[1] < end]
                queue = [e for e in s.queue if e[0] < end]
                held = [e for e in s.held if e[1] < end]
                lost += (len(s.inflight) - len(kept) + len(s.queue) - len(queue)
                         + len(s.held) - len(held))
                s.inflight, s.queue, s.held = kept, queue, held
            session = self.sessions[s.client_id] = Session(s.client_id, clean=False)
            self.persistent_sessions += 1
            # Offline since it went: the time the broker was down counts toward the expiry.
            # One connected when the snapshot was written was connected until the broker
            # stopped, which a crash leaves unknown (an idle broker writes no snapshot for
            # hours): it counts as offline from now, never removed for the crash's time.
            since_ms = wall_ms if s.offline_ms is None else s.offline_ms
            session.offline_at = now - max(0, wall_ms - since_ms) / 1000
            session.expiry_interval = s.expiry_interval
            if s.sub5:
                session.sub5 = {f: (o, i) for f, (o, i) in s.sub5.items()
                                if not is_shared(f)} or None
            self._expire_later(session)
            if s.subscriptions:
                subscriptions = session.own_subscriptions()
                for topic_filter, qos in s.subscriptions.items():
                    if is_shared(topic_filter):
                        self.restore_member(session, topic_filter, qos, s.sub5.get(topic_filter))
                        continue
                    self.subscriptions.add(topic_filter, session, qos)
                    subscriptions[topic_filter] = qos
            if s.inflight:
                inflight = session.own_inflight()
                for pid, offset, qos, retain, entry_state, size in s.inflight:
                    entry = inflight[pid] = Outgoing(stored_ref(offset, size, retained_at),
                                                     qos, retain)
                    entry.state = entry_state
                    session.inflight_bytes += size
                for pid, key in s.groups.items():
                    if pid in inflight:
                        self.restore_flight_group(session, inflight[pid], key)
            # Connected when the snapshot was written, until the crash: it may have been sent
            # any of its queue and held copies since, which at QoS 0 go no more (at most once).
            maybe_sent = 0
            if s.offline_ms is None and (s.queue or s.held):
                queue, held = [e for e in s.queue if e[1]], [e for e in s.held if e[2]]
                maybe_sent = len(s.queue) - len(queue) + len(s.held) - len(held)
                s.queue, s.held = queue, held
            if s.queue:
                queue = session.own_queue()
                for offset, qos, retain, size in s.queue:
                    queue.append((stored_ref(offset, size, retained_at), qos, retain))
                    session.queue_bytes += size
                    if qos == 0:
                        session.queued_qos0 += 1
                self.queued_messages += len(queue)
                self.queued_bytes += session.queue_bytes
            if s.awaiting_release:
                session.own_awaiting_release().update(s.awaiting_release)   # (id: digest)
            session._next_id = s.next_id
            if s.drops:
                session.drops = dict(s.drops)
            if maybe_sent:
                self.drop("restart_qos0", session, maybe_sent)
            self._restore_cursor(session, s, state.log_next_offset, retained_at)
            if s.will is not None:
                self.restore_will(session, s.will)      # core.wills
            if session.cursor is None and s.offline_ms is None:
                self._replay_unsure.append(session)     # see replay
        for client_id, will in state.wills:     # sessions that ended at a clean stop
            self.restore_will(Session(client_id, True), will, ended=True)
        lost += self.restore_shared(state.shared, end)
        self._snapshot_offset = self._saved_offset = at = state.log_next_offset
        if end is not None:
            self.stats.publish_lost += lost
            log.warning("the session snapshot was taken at log offset %d but the log ends at %d "
                        "(its last records were not on disk: a power failure or system crash, "
                        "or a damaged tail cut off at recovery): log records %d to %d are gone, "
                        "%d queued or unacknowledged messages of sessions among them", at, end,
                        end, at - 1, lost)

    def _restore_cursor(self, session: Session, s: snap.SessionState, snapshot_offset: int,
                        retained_at: dict[int, str]) -> None:
        """A restored session reads from the log: from its cursor, or (in step with the log
        when the snapshot was taken, or written by a version without cursors) from the
        snapshot's offset, with the log as the queue; else the replay queues for it. Its
        held retained copies go back on its cursor (core.retained)."""
        if self.journal is None or (s.cursor is None and not self.log_queue):
            return
        end = self.journal.log.next_offset
        offset = min(snapshot_offset if s.cursor is None else s.cursor, end)
        if s.cursor is not None and (gone := max(s.cursor, end)) < snapshot_offset:
            self.drop("log_gap", session, snapshot_offset - gone)   # (as a gap it reads over)
            log.warning("session %s: log records %d to %d are lost to it (gone from the end of "
                        "the log)", name_shown(session.client_id), gone, snapshot_offset - 1)
        self.fall_behind(session, offset)
        cursor = session.cursor
        cursor.restore_filters(s, end)
        cursor.resubscribed = min(s.resubscribed, end)     # (online at the snapshot too)
        if s.offline:
            cursor.offline = [list(r) for r in s.offline]
        if s.done:   # (offsets past the log's end: records a power cut took, taken again)
            cursor.done = {o for o in s.done if cursor.offset <= o < end} or None
        if s.held:
            cursor.held = [(min(at, end), stored_ref(offset, size, retained_at), qos, retain)
                           for at, offset, qos, retain, size in s.held]
        # What an earlier crash left it unsure of (it has not read that far since).
        cursor.unsure_to = min(s.unsure_to, end)
        if not cursor.offline or cursor.offline[-1][1] is not None:
            # It was online when the snapshot was taken, until the broker stopped: what it
            # reads up to the log's end now it may have been sent (QoS 0: not again), and it
            # is offline from there on.
            cursor.unsure_to = end
            cursor.went_offline(end)

    def replay(self, records) -> int:
        """Route log records written after the snapshot: retained updates, and the queues of
        offline sessions that do not read from the log (max_queued_messages/bytes set)."""
        count = 0
        self.shared_replayed0 = 0
        for record in records:
            topic = record.topic.decode("utf-8", "replace")
            # As the publish made it: its publisher (No Local) and 5.0 properties (Message
            # Expiry Interval counted from the record's time) too.
            extra = (stored_properties(record.properties, record.timestamp_ms, record.offset,
                                       self.journal, self.clock())
                     if record.properties else ())
            self._route(Message(topic, record.payload, record.qos, record.retain, record.offset,
                                record.topic, record.client_id.decode("utf-8", "replace"),
                                *extra), False)
            count += 1
        if self.shared_replayed0:
            log.info("log replay: %d QoS 0 messages for shared subscription groups not handed "
                     "out again (at most once: each went to a member, or was dropped, before "
                     "the restart)", self.shared_replayed0)
        self.shared_replayed0 = None
        # A session connected when the snapshot was written may have been sent those records
        # already: at QoS 0 not again (the log as the queue does so with Cursor.unsure_to).
        start = self._snapshot_offset
        for session in self._replay_unsure:
            queue = session.queue
            kept, gone = [], []
            for entry in queue:
                ref = entry[0]
                (gone if not entry[1] and ref.offset is not None and ref.offset >= start
                 else kept).append(entry)
            if gone:
                size = sum(e[0].size for e in gone)
                queue.clear()
                queue.extend(kept)
                session.queue_bytes -= size
                session.queued_qos0 -= len(gone)
                self.queued_messages -= len(gone)
                self.queued_bytes -= size
                self.drop("restart_qos0", session, len(gone))
        self._replay_unsure = []
        # The retained messages restored count in the topic table as they did before.
        self.topics.track_retained((m.topic, m.client_id or "") for m in self.retained.values())
        return count
