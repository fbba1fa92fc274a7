"""The QoS 2 exchange journal at a restart (core.exchanges): applied to what the snapshot
restored, and the inbound packet ids of sessions the snapshot lacks kept for their clients.

``apply_exchanges`` runs at start, after ``Persistence.restore`` and ``replay``. A persistent
session made less than a second before a crash is not in the snapshot, so it is not restored
(nor are its subscriptions); but its client got PUBREC for the QoS 2 messages its ``I``
records cover, and re-sends them after reconnecting (3.1.1 clients do whatever Session Present
says). Those packet ids, with their digests, are kept in ``orphan_ids`` (client id -> {packet
id: (log offset, digest)}; at most what the journal's records held): the client id's next
connection without Clean Start (3.1.1 clean session 0, 5.0 Clean Start 0) gets them in its new
session (``claim_orphan_ids``), so that a re-send of the same message is acknowledged and not
logged again, and its PUBREL is answered with PUBCOMP. A connection with Clean Start drops
them. Until then each snapshot writes their ``I`` records again in its new journal file
(``carry_orphan_ids``), so they survive further crashes. They are dropped, unclaimed, once
persistent_client_expiration (when set) has passed since the start that found them: the
session would have expired by then. docs/persistence.md describes the whole.
"""

from __future__ import annotations

import logging
from collections import Counter

from edgebroker.core.retained import stored_ref
from edgebroker.core.session import AWAIT_COMP, Outgoing, Session
from edgebroker.errors import name_shown

log = logging.getLogger("edgebroker.broker")


def _orphan_record(orphans: dict, record: list, end: int) -> bool:
    """An ``I``, ``F`` or ``D`` record of a session the snapshot lacks, applied to
    ``orphans``; True when it changed them."""
    kind, client_id = record[0], record[1]
    if kind == "I":
        if record[3] >= end:    # (a power cut took its log record: the re-send is new)
            return False
        orphans.setdefault(client_id, {})[record[2]] = (record[3], record[4] if len(record) > 4
                                                        else None)
        return True
    ids = orphans.get(client_id)
    if ids is None:
        return False
    if kind == "D":
        del orphans[client_id]
        return True
    if ids.pop(record[2], None) is None:    # ("F")
        return False
    if not ids:
        del orphans[client_id]
    return True


class ExchangeRestore:
    """The exchange journal's part of ``Broker`` at a restart (a mixin beside
    ``Persistence``, which sets ``orphan_ids`` to None)."""

    def apply_exchanges(self, records) -> None:
        """The QoS 2 exchanges journaled after the snapshot (core.exchanges), in order, applied
        to the sessions it restored (after ``restore`` and ``replay``): windows and inbound
        packet ids as they were at the crash, and the messages already sent kept from being
        sent again. Records of sessions the snapshot does not hold (made after it) are left
        out, but for their inbound packet ids (``I``, less those ``F`` or ``D`` ended), kept
        for their clients (``orphan_ids``, the module's doc), and for the QoS 2 messages a
        shared subscription group gave them: not given again, and counted lost if not over
        (``unkept_exchange``; nor are the messages published at QoS 2 a group gave at QoS 1 or
        0, ``G``). Their outbound exchanges (``O``, ``R``, ``C``) need nothing: their
        subscriptions are lost with them, so those messages are not sent to them again.
        Offsets past the log's end are left out (records a power cut took: their messages get
        other offsets). Delayed wills that ended after the snapshot (``W``) are not restored
        (core.wills)."""
        end = self.journal.log.next_offset
        sessions = self.sessions
        retained_at = None      # log offset -> topic of the retained messages, when needed
        sent: dict[Session, list[tuple[int, bool]]] = {}   # (offset, RETAIN as sent)
        shared: dict[str, set[int]] = {}    # group key -> offsets a member was sent
        flying: dict[tuple, str] = {}       # (client id, packet id) -> group key
        wills = set()                       # (client id, serial) of the wills that ended
        orphans: dict[str, dict[int, tuple]] = {}   # (see the module's doc)
        applied = kept = 0
        for record in records:
            kind, client_id = record[0], record[1]
            if kind == "W":
                wills.add((client_id, record[2]))
                applied += 1
                continue
            session = None if kind == "G" else sessions.get(client_id)
            if session is None:     # a group's record, or of a session not restored
                if kind in ("I", "F", "D") and _orphan_record(orphans, record, end):
                    kept += 1
                if kind == "G" or kind == "O" and len(record) > 6 and record[3] < end:
                    applied += 1
                self.unkept_exchange(record, end, shared, flying)
                continue
            applied += 1
            if kind == "D":
                self.drop_session(session)
                sent.pop(session, None)
            elif kind == "O":
                pid, offset, size, retain = record[2:6]
                if offset >= end:
                    applied -= 1
                    continue
                inflight = session.own_inflight()
                old = inflight.pop(pid, None)
                if old is not None:
                    session.inflight_bytes -= old.message.size
                if retained_at is None:
                    retained_at = self.retained_offsets()
                entry = inflight[pid] = Outgoing(stored_ref(offset, size, retained_at), 2,
                                                 bool(retain))
                session.inflight_bytes += size
                if len(record) > 6:     # a shared group gave it: its backlog skips it
                    shared.setdefault(record[6], set()).add(offset)
                    self.restore_flight_group(session, entry, record[6])
                else:                   # its own subscriptions: its catch-up skips it
                    sent.setdefault(session, []).append((offset, bool(retain)))
                    if retain:          # a retained copy: not held for it any more
                        self.forget_held(session, offset)
            elif kind == "R":
                entry = session.inflight.pop(record[2], None)
                if entry is not None:
                    entry.state = AWAIT_COMP
                    session.inflight[record[2]] = entry     # PUBRELs in PUBREC order
            elif kind == "C":
                entry = session.inflight.pop(record[2], None)
                if entry is not None:
                    session.inflight_bytes -= entry.message.size
            elif kind == "I":
                if record[3] < end:
                    # (a file written before digests were kept has none: None)
                    session.own_awaiting_release()[record[2]] = (record[4] if len(record) > 4
                                                                 else None)
                else:
                    applied -= 1
            elif kind == "F":
                session.awaiting_release.pop(record[2], None)
        for session, copies in sent.items():
            self._forget_sent(session, copies)
        if shared:
            self.forget_shared_sent(shared)
        if wills:
            self.forget_ended_wills(wills)
        if flying:
            self.drop("shared_left", None, len(flying))
            log.warning("%d QoS 2 messages of shared subscriptions were in flight to members "
                        "whose sessions the restart does not keep (clean sessions, or made "
                        "after the snapshot): not sent to another member (MQTT-4.8.2-5); "
                        "dropped", len(flying))
        if orphans:
            self.orphan_ids = orphans
            self._orphans_since = self.clock()
        if records:
            log.info("QoS 2 exchange records written after the snapshot: %d applied (to the "
                     "sessions, shared subscription groups and delayed wills it restored); %d of "
                     "inbound exchanges of persistent sessions made after it, which are not "
                     "restored: %d packet ids of %d clients kept for each client's next "
                     "connection without clean start (a re-send is not delivered twice); %d "
                     "left out (outbound exchanges of sessions not restored, whose "
                     "subscriptions are lost with them, so they are sent nothing again; records "
                     "past the log's end; steps with nothing left to act on)", applied, kept,
                     sum(len(ids) for ids in orphans.values()), len(orphans),
                     len(records) - applied - kept)

    def claim_orphan_ids(self, session: Session, clean_start: bool, v5: bool) -> None:
        """``Sessions.attach`` made a new session for a client id ``orphan_ids`` holds: it
        takes those inbound packet ids (awaiting PUBREL, with their digests) unless it
        connected with Clean Start, speaks MQTT 5.0 (told Session Present 0, it discards its
        session state, MQTT-3.2.2-5: it sends neither the re-send nor the PUBREL, and a new
        message under a held id would be taken for a re-send), or persistent_client_expiration
        has passed since the start that found them (then they go: a ``D`` record keeps a crash
        from bringing them back)."""
        client_id = session.client_id
        ids = self.orphan_ids.pop(client_id, None)
        if not self.orphan_ids:
            self.orphan_ids = None
        if ids is None:
            return
        self._snapshot_dirty = True     # the next snapshot: no longer carried
        if clean_start or v5 or self._orphans_expired():
            if self.exchanges is not None:
                self.exchanges.ended(client_id)
            log.info("client %s: %d inbound QoS 2 packet ids of its session lost at the last "
                     "restart dropped (%s)", name_shown(client_id), len(ids),
                     "it connected with clean start" if clean_start else
                     "an MQTT 5.0 client discards its session state at session present 0"
                     if v5 else "persistent_client_expiration passed since that start")
            return
        session.own_awaiting_release().update((pid, digest)
                                              for pid, (_, digest) in ids.items())
        log.info("client %s: its persistent session was made after the last snapshot before "
                 "the restart and is not restored (session present 0), but %d inbound QoS 2 "
                 "packet ids awaiting PUBREL are kept from the exchange journal: a re-send of "
                 "such a message is acknowledged, not delivered again",
                 name_shown(client_id), len(ids))

    def carry_orphan_ids(self) -> bool | None:
        """A snapshot started a new journal file (``capture``): the ``I`` records of the ids
        not yet claimed go in it again, written at once (the older files are deleted once the
        snapshot is on disk), unless persistent_client_expiration has passed since the start: then they go."""
        orphans = self.orphan_ids
        if self._orphans_expired():
            self.orphan_ids = None
            log.info("%d inbound QoS 2 packet ids of %d clients whose sessions were lost at the "
                     "last restart dropped unclaimed: persistent_client_expiration passed",
                     sum(len(ids) for ids in orphans.values()), len(orphans))
            return False
        exchanges = self.exchanges
        for client_id, ids in orphans.items():
            for pid, (offset, digest) in ids.items():
                exchanges.carry(client_id, pid, offset, digest)
        exchanges.write()   # now: the snapshot writer deletes the older files once it is on disk
        # (after it fsyncs this file, before the snapshot: a power cut then keeps them); None:
        # not written (a full disk), so the snapshot is not either (the older files hold them)
        return None if exchanges.failing else True

    def _orphans_expired(self) -> bool:
        cap = self.limits.persistent_client_expiration
        return bool(cap) and self.clock() - self._orphans_since > cap

    def _forget_sent(self, session: Session, copies: list[tuple[int, bool]]) -> None:
        """Keep messages sent before the crash from going out again: for each of ``copies``
        (offset, RETAIN as sent) the first queue entry with both goes (a record's copy and a
        retained copy of it are two), and the cursor skips them (``Cursor.done``)."""
        session.saved = None
        offsets = {offset for offset, _ in copies}
        if any(ref.offset in offsets for ref, _, _ in session.queue):
            left, kept, size = Counter(copies), [], 0
            for entry in session.queue:
                key = (entry[0].offset, entry[2])
                if left[key] > 0:
                    left[key] -= 1
                    size += entry[0].size
                else:
                    kept.append(entry)
            self.queued_messages -= len(session.queue) - len(kept)
            session.queue.clear()
            session.queue.extend(kept)
            session.queue_bytes -= size
            self.queued_bytes -= size
        cursor = session.cursor
        if cursor is not None:
            end = self.journal.log.next_offset if self.journal is not None else cursor.offset
            ahead = {o for o in offsets if cursor.offset <= o < end}
            if ahead:
                cursor.done = ahead if cursor.done is None else cursor.done | ahead
            cursor.floor = min([cursor.floor, *offsets])
