"""What survives a restart: persistent sessions and retained messages.

A snapshot is one JSON document (format below, documented in
docs/persistence.md) written to ``<state_dir>/sessions.json`` by a writer
thread: a temporary file, fsync, rename, fsync of the directory, so a crash
leaves either the old or the new snapshot, never a torn one. The retained
messages' payloads are in a side file it names (core.retained_side). The core thread
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

import errno
import json
import logging
import os
import threading
import time

from edgebroker.core import exchanges
from edgebroker.core.snapshot_entries import queue_entries, release_digests
from edgebroker.core.snapshot_reserve import NO_ROOM, SnapshotReserve
from edgebroker.core.snapshot_retained import (
    RetainedState, SnapshotError, generations, retained_json,
)
from edgebroker.core.snapshot_state import FILENAME, SessionState, Snapshot
from edgebroker.core.will_state import will_json
from edgebroker.files import read_small_file, replace_file

TYPE_CHECKING = False   # (the side file's module is imported when a snapshot is written)
if TYPE_CHECKING:
    from edgebroker.core.retained_side import Plan, RetainedFile

log = logging.getLogger("edgebroker.snapshot")

FORMAT = 3
YIELD_EVERY = 32   # encodings between two yields of the interpreter (see _joined)


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
    """The snapshot in the document ``data`` (read from ``path``); SnapshotError when it cannot
    be used. Its code is imported only then (core.snapshot_decode): a start with no snapshot
    does not hold it."""
    from edgebroker.core.snapshot_decode import decode
    return decode(data, path)


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
        from edgebroker.core.retained_side import load
        load(state_dir, state.retained_file, state.retained, path)
    return state


def _side_files_left(state_dir: str) -> bool:
    """Whether side files of retained messages are left in ``state_dir`` to delete (a start
    after one with retained messages). A listing that fails (no descriptor free, EIO) is
    taken as none: a later snapshot that can list deletes them; the snapshot is written."""
    try:
        return bool(generations(state_dir))
    except OSError:
        return False


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
        # The side file of the retained messages (core.retained_side): made for the first
        # snapshot with retained messages, or earlier when the state directory has side
        # files (deleted once a snapshot is written); none, and not imported, before.
        self.side: RetainedFile | None = None
        # The last snapshot written: its time (ms) and client ids (None: none in this run).
        self._last: tuple[int, frozenset] | None = None
        self._final_written = False
        self._cond = threading.Condition()
        self._pending: Snapshot | None = None
        self._stopping = False
        self._failing = False
        self._unlisted = False      # the last one could not list what to delete after it
        # The replay offset (``log_next_offset``) of the last snapshot written in this run: the
        # core lets retention delete the log records before it (core.persistence).
        self.saved_offset: int | None = None

    @property
    def failing(self) -> bool:
        """The last snapshot could not be written (the core submits another each second,
        even with nothing changed since)."""
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
                try:
                    self._write(data, final=stopping)
                except Exception:   # (a bug: the thread goes on, the next snapshot retries)
                    self.failures += 1
                    self._failing = True
                    log.exception("cannot write the session snapshot in %s; sessions changed "
                                  "since the last snapshot would be lost in a crash (will "
                                  "retry)", self.state_dir)
            if stopping:
                with self._cond:
                    if self._pending is None:
                        return

    def _carried_on_disk(self, snapshot: Snapshot, final: bool) -> OSError | None:
        """A snapshot whose journal file carries a restart's unclaimed packet ids
        (``carried``, core.exchange_restore) names that file as the first to apply, and the
        older files that held them are deleted after it: the file must be on disk before the
        snapshot is written. The error that keeps this snapshot from being written (the one
        before it, and the older files, stay: a restart still finds the ids), or None. The
        stop's snapshot (``final``) is written all the same: it holds what clients were told is
        kept (sessions, acknowledged messages); the ids may then be lost (a re-send delivered
        twice), which is logged."""
        if snapshot.carried is None:     # the core could not write them in the new file
            problem = "the QoS 2 exchange journal carrying a restart's packet ids could not " \
                      "be written"
        elif not snapshot.carried:
            return None
        else:
            try:
                exchanges.sync_generation(self.state_dir, snapshot.exchanges)
                return None
            except OSError as exc:
                problem = f"cannot fsync the QoS 2 exchange journal: {exc.strerror or exc}"
        if final:
            log.warning("%s (%s): the final session snapshot is written without it; the "
                        "inbound QoS 2 packet ids kept since a restart for clients not back yet "
                        "may be lost, and a re-send of theirs delivered twice", problem,
                        self.state_dir)
            return None
        # (EIO whatever it was: not taken for a full disk's, whose room the reserve is for)
        return OSError(errno.EIO, problem)

    def _write(self, snapshot: Snapshot, final: bool = False) -> None:
        """``final``: the stop's snapshot: with no room on the disk it takes the reserve's."""
        path = os.path.join(self.state_dir, FILENAME)
        retained = snapshot.retained
        side = self.side
        if side is None and (retained or _side_files_left(self.state_dir)):
            from edgebroker.core.retained_side import RetainedFile
            side = self.side = RetainedFile(self.state_dir)
        snapshot.retained_file, planned = None, None
        if side is not None:
            snapshot.retained_file = side.current(retained)     # none changed: kept
            planned = side.plan(retained) if retained and not snapshot.retained_file else None
        error = self._carried_on_disk(snapshot, final)
        data = None
        if error is None:
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
        unlisted = None if side is None else side.written(snapshot.retained_file, retained)
        self._final_written = final
        self.saved_offset = snapshot.log_next_offset
        self._last = (snapshot.written_ms, frozenset(s.client_id for s in snapshot.sessions))
        if self._failing:
            self._failing = False
            if not final:   # (the final one in the reserve's room said so)
                log.warning("session snapshot written again in %s", self.state_dir)
        if snapshot.exchanges is not None:
            try:
                exchanges.remove_before(self.state_dir, snapshot.exchanges)
            except OSError as exc:
                unlisted = unlisted or exc
        if unlisted is not None and not self._unlisted:
            log.warning("cannot list %s to delete the files former snapshots left (retained "
                        "messages, QoS 2 exchanges): %s; the snapshot is written, the deletion "
                        "is tried again at the next one", self.state_dir,
                        unlisted.strerror or unlisted)
        self._unlisted = unlisted is not None
        if not final:
            self.reserve.keep(len(data) + (side.used if side is not None else 0))

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
