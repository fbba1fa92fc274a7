"""Shared subscription groups across restarts (core.shared): what a snapshot holds of them and
what a restart makes of it.

A persistent member's shared subscriptions are among its session's subscriptions
(``shared_session_state``); a group's backlog is held as log offsets and its cursor
(``capture_shared``), led by the QoS 1 messages it gave online sessions (members, or
ones that left it since) that they had not acknowledged, which a restart hands out again.
At start the members come back with their sessions (``restore_member``), then the backlogs
(``restore_shared``); the QoS 2 exchange journal (core.exchanges) then takes out of a
group's backlog what the group gave a member after the snapshot (``forget_shared_sent``).
docs/persistence.md describes the format.
"""

from __future__ import annotations

import logging

from edgebroker.core.session import AWAIT_ACK, Stored
from edgebroker.core.shared import Group
from edgebroker.core.snapshot_state import GroupState
from edgebroker.errors import ProtocolError, name_shown, topic_shown
from edgebroker.mqtt.topics import parse_shared

log = logging.getLogger("edgebroker.broker")


class SharedState:
    """The snapshot part of ``Broker``'s shared subscriptions (a mixin beside ``Shared``)."""

    def _returning(self, session) -> list:
        """A session's unacknowledged QoS 1 messages of groups that go on, which a restart
        gives back to them (as its disconnect would); also of groups it has left since."""
        groups = self.groups
        return [entry for entry in session.inflight.values()
                if entry.group is not None and entry.qos == 1 and entry.state == AWAIT_ACK
                and groups.get(entry.group.key) is entry.group]

    def shared_session_state(self, session, state) -> None:
        """A persistent session's snapshot state gets its shared subscriptions (with their
        5.0 options) and loses the QoS 1 messages its groups get back (``capture_shared``)."""
        for key, member in session.shared.items():
            state.subscriptions[key] = member.qos
            if member.options or member.sub_id:
                state.sub5[key] = [member.options, member.sub_id]
        returning = {id(entry) for entry in self._returning(session)}
        if returning:
            kept = {pid for pid, entry in session.inflight.items() if id(entry) not in returning}
            state.inflight = [e for e in state.inflight if e[0] in kept]
        groups = {pid: entry.group.key for pid, entry in session.inflight.items()
                  if entry.group is not None and id(entry) not in returning}
        if groups:
            state.groups = groups

    def capture_shared(self) -> list[GroupState]:
        """The groups' backlogs for a snapshot, each led by the unacknowledged QoS 1 messages
        of the online sessions it gave them to (members, or sessions that left it since: a
        clean one is not kept)."""
        flying: dict = {}       # group -> its entries in online sessions' windows
        for session in self.sessions.values():
            if session.shared is not None and session.client is not None and session.inflight:
                for entry in self._returning(session):
                    flying.setdefault(entry.group, []).append(entry)
        states = []
        for group in self.groups.values():
            entries = [(entry.message.offset, entry.group_qos, entry.group_retain,
                        entry.message.size) for entry in flying.get(group, ())
                       if entry.message.offset is not None]
            entries += [(ref.offset, qos, retain, ref.size) for ref, qos, retain, _ in group.queue
                        if ref.offset is not None]
            if entries or group.cursor is not None:
                done = sorted(group.done) if group.done and group.cursor is not None else []
                states.append(GroupState(group.key, group.cursor, entries, done))
        return states

    def restore_member(self, session, key: str, qos: int, options5) -> None:
        """A restored session's shared subscription (from its ``subscriptions``): kept
        whatever the limits are now, as its other subscriptions (they apply to new ones)."""
        options, sub_id = options5 if options5 else (0, 0)
        try:
            name, topic_filter = parse_shared(key)
        except ProtocolError as exc:
            log.warning("session %s: shared subscription %s in the snapshot not restored: %s",
                        name_shown(session.client_id), topic_shown(key), exc)
            return
        self.join_shared(session, key, name, topic_filter, qos, options, sub_id)

    def restore_flight_group(self, session, entry, key: str) -> None:
        """A restored in-flight entry a group gave (the snapshot's ``groups``, or an ``O``
        record of the exchange journal): it keeps its group's key, so that its session ending
        counts it as ``shared_left`` (MQTT-4.8.2-5) and a 5.0 member's resend carries the
        shared subscription's identifier. Its group is one apart from the live ones, as one
        that ended: a QoS 1 one stays with the session (``Shared.hand_over``)."""
        try:
            name, topic_filter = parse_shared(key)
        except ProtocolError as exc:
            log.warning("session %s: the in-flight message at log offset %s names a shared "
                        "subscription %s that is not one (%s): restored as a plain one",
                        name_shown(session.client_id), entry.message.offset, topic_shown(key), exc)
            return
        entry.group = Group(key, name, topic_filter)
        entry.group_qos, entry.group_retain = entry.qos, entry.retain
        if session.shared is None:
            session.shared = {}

    def journal_shared_flight(self, session) -> None:
        """A new exchange journal file (a snapshot): the QoS 2 messages groups gave this clean
        session, still awaiting PUBREC, are recorded in it again, so that a crash after the
        snapshot counts them lost (``ExchangeRestore.apply_exchanges``)."""
        exchanges = self.exchanges
        for pid, entry in session.inflight.items():
            group = entry.group
            ref = entry.message
            if (group is not None and entry.qos == 2 and entry.state == AWAIT_ACK
                    and ref.offset is not None):
                exchanges.sent(session.client_id, pid, ref.offset, ref.size, entry.retain,
                               group.key)

    @staticmethod
    def unkept_exchange(record: list, end: int, shared: dict, flying: dict) -> None:
        """``ExchangeRestore.apply_exchanges``: a group's ``G`` record, or one of a
        session the restart does not keep (clean, or made after the snapshot). What a group
        gave (``O`` with its key, ``G``) goes into ``shared`` (group key
        -> offsets): not given again. An ``O``'s exchange not over (no ``R``, ``C`` or ``D``)
        stays in ``flying`` ((client id, packet id) -> group key): lost. Offsets past the
        log's ``end`` are left out (records a power cut took: their messages got others)."""
        kind, name = record[0], record[1]
        if kind == "G":
            if record[2] < end:
                shared.setdefault(name, set()).add(record[2])
        elif kind == "O" and len(record) > 6 and record[3] < end:
            shared.setdefault(record[6], set()).add(record[3])
            flying[name, record[2]] = record[6]
        elif kind in ("R", "C"):
            flying.pop((name, record[2]), None)
        elif kind == "D":
            for key in [k for k in flying if k[0] == name]:
                del flying[key]

    def forget_shared_sent(self, sent: dict[str, set[int]]) -> None:
        """After a restart: QoS 2 messages a group gave a member before the crash (the exchange
        journal: group key -> log offsets) are not handed out again by that group's backlog."""
        for key, offsets in sent.items():
            group = self.groups.get(key)
            if group is None:
                continue
            queue = group.queue
            if any(ref.offset in offsets for ref, _, _, _ in queue):
                kept = [e for e in queue if e[0].offset not in offsets]
                queue.clear()
                queue.extend(kept)
                group.queue_bytes = sum(e[0].size for e in kept)
            if group.cursor is not None:
                end = self.journal.log.next_offset if self.journal is not None else group.cursor
                ahead = {o for o in offsets if group.cursor <= o < end}
                if ahead:
                    group.done = ahead if group.done is None else group.done | ahead

    def restore_shared(self, states: list[GroupState], end: int | None) -> int:
        """The groups' backlogs from a snapshot (after their members). ``end``: the log's end
        when it ends before the snapshot's offsets (a power cut); entries past it are lost.
        Returns how many entries were lost."""
        lost = 0
        log_end = self.journal.log.next_offset if self.journal is not None else 0
        for state in states:
            group = self.groups.get(state.key)
            queue = [e for e in state.queue if end is None or e[0] < end]
            lost += len(state.queue) - len(queue)
            if group is None:
                if queue:
                    self.drop("shared_left", None, len(queue))
                    log.warning("shared subscription %s in the snapshot has no persistent member "
                                "left: %d queued messages dropped", topic_shown(state.key),
                                len(queue))
                continue
            for offset, qos, retain, size in queue:
                group.queue.append((Stored(offset, size), qos, retain, None))
                group.queue_bytes += size
            if state.cursor is not None:
                group.cursor = min(state.cursor, log_end)
                if state.done:   # (past the log's end: records a power cut took)
                    done = {o for o in state.done if o < log_end}
                    group.done = (done | (group.done or set())) or None
        return lost


__all__ = ["SharedState"]
