"""What survives a restart: persistent sessions and retained messages.

A snapshot is one JSON document (format below, documented in
docs/persistence.md) written to ``<state_dir>/sessions.json`` by a writer
thread: a temporary file, fsync, rename, fsync of the directory, so a crash
leaves either the old or the new snapshot, never a torn one. The retained
messages' payloads are in a side file it names (core.snapshot_retained). The core thread
only takes an immutable view of what changed (core.persistence.capture); the
writer encodes it and touches the disk.

Messages are referenced by commit-log offset, never copied: a session's
queue and unacknowledged window are lists of offsets (with each message's
size, for the byte limits). The snapshot also
records ``log_next_offset``; at start the broker replays the log from there,
so messages and retained updates that arrived after the last snapshot are not
lost to offline sessions. Retained messages are stored whole (in the side file), because
the log segment holding one may be deleted by retention long before it is replaced.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from edgebroker.core import exchanges
from edgebroker.core.snapshot_entries import (
    awaiting_entries, inflight_entry, offline_range, queue_entries, queue_entry, ranged,
    release_digests,
)
from edgebroker.core.snapshot_reserve import NO_ROOM, SnapshotReserve
from edgebroker.core.snapshot_retained import (
    Plan, RetainedFile, RetainedState, SnapshotError, load, retained_entry,
    retained_file_head, retained_json,
)
from edgebroker.core.will_state import WillState, read_will, will_json
from edgebroker.errors import topic_shown
from edgebroker.files import read_small_file, replace_file
from edgebroker.records import field, record

log = logging.getLogger("edgebroker.snapshot")

FORMAT = 3
# format 1: no cursors (every session was in step with the log); 1 and 2: retained payloads
# in the document (base64), not in a side file
READABLE = (1, 2, 3)
FILENAME = "sessions.json"
YIELD_EVERY = 32   # encodings between two yields of the interpreter (see _joined)
LAST_WALL_MS = 253_402_300_799_999   # 9999-12-31T23:59:59.999Z, the last time shown


@record
class SessionState:
    client_id: str
    subscriptions: dict[str, int] = field(default_factory=dict)
    # (packet id, log offset, qos, retain, state, size) in send order.
    inflight: list[tuple[int, int, int, bool, int, int]] = field(default_factory=list)
    # (log offset, qos, retain, size) oldest first. ``size`` is the message's
    # topic + payload bytes (Message.size), counted by the byte limits. A state the broker
    # took (core.persistence) holds the queue's own (message, qos, retain) entries instead,
    # and the writer reads them (``queue_entries``): the loop thread copies no more.
    queue: list[tuple] = field(default_factory=list)
    # Inbound QoS 2 packet id awaiting PUBREL -> its message's digest (None: none kept).
    awaiting_release: dict[int, int | None] = field(default_factory=dict)
    next_id: int = 0
    # The log offset it reads from when behind (core.catchup), else None; the filters
    # subscribed while behind with the offset they match from; the offset ranges it was
    # offline in ([from, to], to None while offline); messages dropped for it, by reason.
    cursor: int | None = None
    since: dict[str, int] = field(default_factory=dict)
    offline: list[list] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    # Offsets past the cursor of QoS 2 messages it was sent before a restart (Cursor.done).
    done: list[int] = field(default_factory=list)
    # Retained copies held for SUBSCRIBEs made while behind (Cursor.held, core.retained):
    # (the log offset the cursor sends them at, the message's log offset, qos, retain, size).
    held: list[tuple[int, int, int, bool, int]] = field(default_factory=list)
    # After a crash: records below it may have been sent before it (Cursor.unsure_to); 0: none.
    unsure_to: int = 0
    # The log offset of its last SUBSCRIBE again or UNSUBSCRIBE while behind (Cursor.resubscribed).
    resubscribed: int = 0
    # (filter, log offset, QoS or 5.0 options): what a filter lowered, or whose options changed,
    # while behind had for the records below the offset (Cursor.lowered, Cursor.kept5).
    lowered: list[tuple[str, int, int]] = field(default_factory=list)
    kept5: list[tuple[str, int, int]] = field(default_factory=list)
    # (filter, from, up to): the records in that offset range that a filter unsubscribed while
    # behind granted QoS 1/2 (Cursor.owed).
    owed: list[tuple[str, int, int]] = field(default_factory=list)
    # Wall-clock time (ms) it went offline, None if it was connected (persistent_client_
    # expiration counts from it; snapshots written before it was kept have none).
    offline_ms: int | None = None
    # MQTT 5.0: its Session Expiry Interval (None: 3.1.1) and its subscriptions' options
    # beyond the QoS: filter -> [options byte, subscription identifier].
    expiry_interval: int | None = None
    sub5: dict[str, list[int]] = field(default_factory=dict)
    # The in-flight entries a shared subscription group gave: packet id -> the group's key.
    groups: dict[int, str] = field(default_factory=dict)
    will: WillState | None = None   # its delayed will, offline within its Will Delay (5.0)
    # Its JSON, once the writer encoded it (an offline session's state is reused by the next
    # snapshots while it does not change, and so is this).
    encoded: bytes | None = field(default=None, compare=False, repr=False)


def first_unsent(s: SessionState, retained: set[int]) -> int | None:
    """The first record a session behind has not been sent (``inspect sessions``): its cursor,
    or its queue's first entry when that is a record before it (queued when it fell behind, or
    read ahead), unless a copy of a retained message the store holds (``retained``: their
    offsets), as the broker's own figures (Cursor.unsent)."""
    if s.cursor is not None and s.queue:
        offset, _, retain, _ = s.queue[0]
        if offset < s.cursor and not (retain and offset in retained):
            return offset
    return s.cursor


@record
class GroupState:
    """A shared subscription group's backlog (core.shared): its members are the sessions
    whose ``subscriptions`` hold its key."""
    key: str                        # "$share/<ShareName>/<filter>"
    cursor: int | None = None       # the log offset it reads from when behind
    # (log offset, qos, retain, size), handed out first; with the QoS 1 messages its online
    # members had not acknowledged (a restart gives them to a member anew).
    queue: list[tuple[int, int, bool, int]] = field(default_factory=list)
    # Offsets past the cursor of QoS 2 messages it gave a member before a restart (the
    # exchange journal said so; ``Group.done``): not handed out again.
    done: list[int] = field(default_factory=list)


def save_retained(saved: dict[str, RetainedState], retained, now: float,
                  written_ms: int) -> None:
    """Bring ``saved`` (topic -> the state the last snapshot held) up to date with the retained
    store ``retained`` (mqtt.trie.RetainedTree): its topics set or cleared since (``changed``),
    or, when it stopped listing them (``all_changed``: more changes than messages held, and
    than CHANGED_LIMIT), every message it holds, those unchanged keeping their state (and its
    encoding). ``$SYS`` topics are left out: they are published anew."""
    if retained.all_changed:
        retained.all_changed = False
        retained.changed = set()
        old = saved.copy()
        saved.clear()
        for message in retained.values():
            topic = message.topic
            if not topic.startswith("$SYS"):
                state = _retained_state(message, now, written_ms)
                kept = old.get(topic)
                saved[topic] = kept if kept == state else state
    elif retained.changed:
        changed, retained.changed = retained.changed, set()
        for topic in changed:
            message = retained.get(topic)
            if message is None or topic.startswith("$SYS"):
                saved.pop(topic, None)
            else:
                saved[topic] = _retained_state(message, now, written_ms)


def _retained_state(message, now: float, written_ms: int) -> RetainedState:
    expires_ms = (None if not message.expires else
                  written_ms + int((message.expires - now) * 1000))
    return RetainedState(message.topic, message.payload, message.qos, message.offset,
                         message.properties, expires_ms, message.client_id)


@record
class Snapshot:
    log_next_offset: int = 0
    written_ms: int = 0
    sessions: list[SessionState] = field(default_factory=list)
    retained: list[RetainedState] = field(default_factory=list)
    shared: list[GroupState] = field(default_factory=list)
    # The first QoS 2 exchange journal generation to apply after it (core.exchanges); None:
    # none (a snapshot written before the journal, or without one).
    exchanges: int | None = None
    # (client id, will) of clients connected at a clean stop whose session ended then: the
    # next start publishes them (core.wills' ``keep_will_at_stop``).
    wills: list[tuple[str, WillState]] = field(default_factory=list)
    # [name, size, crc32] of the side file holding the retained messages' bytes (format 3;
    # None: none, or they are in the document: formats 1 and 2).
    retained_file: list | None = None


def _dumps(doc) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def _session_json(s: SessionState) -> bytes:
    if s.encoded is None:
        s.encoded = _dumps(
            {"client_id": s.client_id,
             "subscriptions": sorted(s.subscriptions.items()),
             "inflight": [list(e) for e in s.inflight],
             "queue": [list(e) for e in queue_entries(s)],
             "awaiting_release": sorted(s.awaiting_release),
             **({"release_digests": digests} if (digests := release_digests(s)) else {}),
             "next_id": s.next_id,
             "cursor": s.cursor,
             "since": sorted(s.since.items()),
             "offline": [list(r) for r in s.offline],
             "drops": s.drops,
             "offline_ms": s.offline_ms,
             **({"done": s.done} if s.done else {}),
             **({"held": [list(e) for e in s.held]} if s.held else {}),
             **({"unsure_to": s.unsure_to} if s.unsure_to else {}),
             **({"resubscribed": s.resubscribed} if s.resubscribed else {}),
             **({"lowered": [list(e) for e in s.lowered]} if s.lowered else {}),
             **({"kept5": [list(e) for e in s.kept5]} if s.kept5 else {}),
             **({"owed": [list(e) for e in s.owed]} if s.owed else {}),
             **({"expiry": s.expiry_interval} if s.expiry_interval is not None else {}),
             **({"sub5": sorted(s.sub5.items())} if s.sub5 else {}),
             **({"groups": sorted(s.groups.items())} if s.groups else {}),
             **({"will": will_json(s.will)} if s.will is not None else {})})
    return s.encoded


def encode(snapshot: Snapshot) -> bytes:
    """The JSON document, one small encoding per session and retained message (each kept on
    its state for the next snapshots), so that the thread encoding it never holds the
    interpreter for long at a time. The retained messages must have their place in the side
    file (``RetainedFile.plan``), which ``snapshot.retained_file`` names."""
    head = {"format": FORMAT, "written_ms": snapshot.written_ms,
            "log_next_offset": snapshot.log_next_offset}
    if snapshot.exchanges is not None:
        head["exchanges"] = snapshot.exchanges
    if snapshot.retained_file is not None:
        head["retained_file"] = snapshot.retained_file
    shared = b""
    if snapshot.shared:
        shared = b',"shared":' + _dumps([{"key": g.key, "cursor": g.cursor,
                                           "queue": [list(e) for e in g.queue],
                                           **({"done": g.done} if g.done else {})}
                                          for g in snapshot.shared])
    if snapshot.wills:
        shared += b',"wills":' + _dumps([{"client_id": c, **will_json(w)}
                                          for c, w in snapshot.wills])
    return b"".join((_dumps(head)[:-1], b',"sessions":[',
                     _joined(snapshot.sessions, _session_json), b'],"retained":[',
                     _joined(snapshot.retained, retained_json), b"]", shared, b"}"))


def _joined(states, to_json) -> bytes:
    parts = []
    encoded = 0
    for state in states:
        if state.encoded is None:
            encoded += 1
            if encoded % YIELD_EVERY == 0:
                # Let the loop thread have the interpreter (it waits up to the switch
                # interval otherwise, 5 ms, each time it wants it back).
                time.sleep(0)
        parts.append(to_json(state))
    return b",".join(parts)


def decode(data: bytes, path: str = FILENAME) -> Snapshot:
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise SnapshotError(f"{path}: damaged snapshot (a JSON {type(doc).__name__}, "
                                f"not an object)")
        if doc.get("format") not in READABLE:
            raise SnapshotError(f"{path}: snapshot format {doc.get('format')!r} is not one of "
                                f"{', '.join(map(str, READABLE))} (written by a newer edgebroker?)")
        exchanges, side = doc.get("exchanges"), doc.get("retained_file")
        snap = Snapshot(log_next_offset=int(doc["log_next_offset"]),
                        written_ms=int(doc.get("written_ms", 0)),
                        exchanges=None if exchanges is None else int(exchanges),
                        retained_file=None if side is None else retained_file_head(side))
        if not 0 <= snap.written_ms <= LAST_WALL_MS:
            raise SnapshotError(f"{path}: damaged snapshot (written_ms {snap.written_ms} is "
                                f"not a time from 1970 to 9999)")
        for s in doc["sessions"]:
            snap.sessions.append(ranged(SessionState(
                client_id=str(s["client_id"]),
                subscriptions={str(f): int(q) for f, q in s["subscriptions"]},
                inflight=[inflight_entry(e) for e in s["inflight"]],
                queue=[queue_entry(e) for e in s["queue"]],
                awaiting_release=awaiting_entries(s),
                next_id=int(s.get("next_id", 0)),
                cursor=None if s.get("cursor") is None else int(s["cursor"]),
                since={str(f): int(o) for f, o in s.get("since", ())},
                offline=[offline_range(r) for r in s.get("offline", ())],
                drops={str(k): int(v) for k, v in s.get("drops", {}).items()},
                done=[int(o) for o in s.get("done", ())],
                held=[(int(a), int(o), int(q), bool(r), int(n)) for a, o, q, r, n in
                      s.get("held", ())],
                unsure_to=max(0, int(s.get("unsure_to", 0))),
                resubscribed=max(0, int(s.get("resubscribed", 0))),
                lowered=[(str(f), int(o), int(q)) for f, o, q in s.get("lowered", ())],
                kept5=[(str(f), int(o), int(v)) for f, o, v in s.get("kept5", ())],
                owed=[(str(f), int(a), int(b)) for f, a, b in s.get("owed", ())],
                offline_ms=None if s.get("offline_ms") is None else int(s["offline_ms"]),
                expiry_interval=None if s.get("expiry") is None else int(s["expiry"]),
                sub5={str(f): [int(o), int(i)] for f, (o, i) in s.get("sub5", ())},
                groups={int(p): str(k) for p, k in s.get("groups", ())},
                will=read_will(s.get("will"), path, str(s["client_id"]))), path))
        for r in doc["retained"]:
            offset = r.get("offset")
            if int(r["qos"]) not in (0, 1, 2) or offset is not None and int(offset) < 0:
                log.error("%s: retained message %s: QoS %r or offset %r out of range; left out",
                          path, topic_shown(str(r["topic"])), r["qos"], offset)
                continue
            state = retained_entry(r)
            if state.place is not None and snap.retained_file is None:
                raise ValueError("a retained message in a side file the snapshot does not name")
            snap.retained.append(state)
        for g in doc.get("shared", ()):
            snap.shared.append(GroupState(
                key=str(g["key"]), cursor=None if g.get("cursor") is None else int(g["cursor"]),
                queue=[queue_entry(e) for e in g["queue"]],
                done=[int(o) for o in g.get("done", ())]))
        for w in doc.get("wills", ()):
            will = read_will(w, path, str(w["client_id"]))
            if will is not None:
                snap.wills.append((str(w["client_id"]), will))
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError,
            RecursionError) as exc:
        # a field of the wrong JSON type, a number int() cannot take (1e400, Infinity), or
        # nested too deep to parse
        raise SnapshotError(f"{path}: damaged snapshot ({type(exc).__name__}: {exc})") from None
    return snap


def read(state_dir: str, payloads: bool = True) -> Snapshot | None:
    """The snapshot in ``state_dir``, None if there is none. ``payloads`` False: the retained
    messages' payloads and properties are not read (left empty; ``inspect``)."""
    path = os.path.join(state_dir, FILENAME)
    try:
        data = read_small_file(path)     # a FIFO there: an error, no wait
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc.strerror}") from None
    state = decode(data, path)
    if payloads and state.retained_file is not None:
        load(state_dir, state.retained_file, state.retained, path)
    return state


class SnapshotWriter(threading.Thread):
    """Encodes and writes the newest submitted snapshot (older unwritten ones are skipped),
    then deletes the QoS 2 exchange journal files it made obsolete. Keeps room on the disk for
    the final snapshot of a stop (core.snapshot_reserve)."""

    def __init__(self, state_dir: str):
        super().__init__(name="snapshot", daemon=True)
        self.state_dir = state_dir
        self.written = 0
        self.failures = 0
        self.reserve = SnapshotReserve(state_dir)
        self.side = RetainedFile(state_dir)
        # The last snapshot written: its time (ms) and client ids (None: none in this run).
        self._last: tuple[int, frozenset] | None = None
        self._final_written = False
        self._cond = threading.Condition()
        self._pending: Snapshot | None = None
        self._stopping = False
        self._failing = False
        # The replay offset (``log_next_offset``) of the last snapshot written in this run: the
        # core lets retention delete the log records before it (core.persistence).
        self.saved_offset: int | None = None

    @property
    def failing(self) -> bool:
        """The last snapshot could not be written."""
        return self._failing

    def submit(self, data: Snapshot) -> None:
        with self._cond:
            self._pending = data
            self._cond.notify()

    def stop(self, final: Snapshot | None = None, timeout: float = 10.0) -> bool:
        """Write ``final`` (if given) and anything pending, then end the thread. False when
        the final snapshot is not on disk (logged as an error, with what is lost)."""
        with self._cond:
            if final is not None:
                self._pending = final
            self._stopping = True
            self._cond.notify()
        if self.is_alive():
            self.join(timeout)
            if self.is_alive():
                log.error("the session snapshot was not written within %g s (the disk does not "
                          "answer); stopping without it: the next start replays the log from the "
                          "last snapshot written", timeout)
                return False
        elif self._pending is not None:
            self._write(self._pending, final=True)  # the thread never started
        return self._final_written or final is None

    def run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopping:
                    self._cond.wait()
                data, self._pending = self._pending, None
                stopping = self._stopping
            if data is not None:
                self._write(data, final=stopping)
            if stopping:
                with self._cond:
                    if self._pending is None:
                        return

    def _write(self, snapshot: Snapshot, final: bool = False) -> None:
        """``final``: the stop's snapshot: with no room on the disk it takes the reserve's."""
        path = os.path.join(self.state_dir, FILENAME)
        retained = snapshot.retained
        snapshot.retained_file = self.side.current(retained)    # none changed: kept
        planned = self.side.plan(retained) if retained and not snapshot.retained_file else None
        error, data = self._put(path, snapshot, planned)
        if error is not None and final and error.errno in NO_ROOM:
            # The room it needs from the reserve (what its side file's write adds too); all of
            # it if that was not enough.
            need = len(data if data is not None else encode(snapshot))
            need += 0 if planned is None else planned.room
            for room in (need, None):
                if not self.reserve.release(room):
                    break
                log.warning("no room for the final session snapshot in %s: writing it in the "
                            "space kept for it (%s)", self.state_dir, self.reserve.path)
                error, data = self._put(path, snapshot, planned)
                if error is None or error.errno not in NO_ROOM:
                    break
        if error is not None:
            self.failures += 1
            if final:
                self._lost(path, error, snapshot)
            elif not self._failing:
                log.error("cannot write the session snapshot in %s: %s; sessions changed since "
                          "the last snapshot would be lost in a crash (will retry)",
                          self.state_dir, error.strerror or error)
            self._failing = True
            return
        self.written += 1
        self.side.written(snapshot.retained_file, retained)
        self._final_written = final
        self.saved_offset = snapshot.log_next_offset
        self._last = (snapshot.written_ms, frozenset(s.client_id for s in snapshot.sessions))
        if self._failing:
            self._failing = False
            if not final:   # (the final one in the reserve's room said so)
                log.warning("session snapshot written again in %s", self.state_dir)
        if snapshot.exchanges is not None:
            exchanges.remove_before(self.state_dir, snapshot.exchanges)
        if not final:
            self.reserve.keep(len(data) + self.side.used)

    def _put(self, path: str, snapshot: Snapshot, planned: Plan | None
             ) -> tuple[OSError | None, bytes | None]:
        """Write the side file ``planned`` (if any), then the document naming it: (the error,
        the document; None when the side file could not be written)."""
        if planned is not None:
            try:
                snapshot.retained_file = self.side.write(planned)
            except OSError as exc:
                return exc, None
        data = encode(snapshot)
        error = _replace(path, data)
        if error is not None and planned is not None:
            self.side.discard(planned)
        return error, data

    def _lost(self, path: str, error: OSError, snapshot: Snapshot) -> None:
        """The final snapshot could not be written: say what the next start will miss."""
        if self._last is None:
            since = ("the snapshot on disk from before this start (if any); every session "
                     "change of this run is lost")
        else:
            written_ms, ids = self._last
            now = {s.client_id for s in snapshot.sessions}
            new = sorted(now - ids)
            gone = sorted(ids - now)
            since = (f"the snapshot written {max(0, snapshot.written_ms - written_ms) / 1000:.1f}"
                     f" s before the stop: the {len(now)} persistent sessions have their state "
                     f"of then (subscriptions, queues, acknowledgements)")
            if new:
                since += (f"; {len(new)} made since are lost: "
                          + ", ".join(repr(c) for c in new[:10])
                          + (f" and {len(new) - 10} more" if len(new) > 10 else ""))
            if gone:
                since += f"; {len(gone)} removed since come back"
        log.error("cannot write the final session snapshot %s: %s; stopping without it: the "
                  "next start restores %s, then replays the commit log after it",
                  path, error.strerror or error, since)


def _replace(path: str, data: bytes) -> OSError | None:
    try:
        replace_file(path, data)
    except OSError as exc:
        return exc
    return None
