"""Exactly once across a crash: persistent sessions' QoS 2 exchanges, journaled as they move.

The snapshot (core.persistence) is taken at most about once a second. On its own, a crash
would forget the QoS 2 exchanges that moved since: a message the subscriber already has would
be read from the log again and sent with a new packet id (delivered twice), and a PUBLISH
whose PUBREC had not gone out would be logged again when its publisher re-sends it. What a
restart needs to prevent both is appended here, one record per step, before the packet that
depends on it leaves the broker:

- ``O`` a QoS 2 message sent to a session: client id, packet id, log offset, size, retain,
  and the shared subscription group's key when a group gave it (its backlog then skips it);
- ``G`` a message published at QoS 2 that a shared subscription group gave a member at QoS 0,
  or at QoS 1 and the member acknowledged it (the member was granted less): the group's key
  and the log offset (its backlog skips it, as for an ``O`` record with the group;
  core.shared); a QoS 1 copy not acknowledged at a crash goes to the group again;
- ``R`` its PUBREC came: PUBREL goes out (re-sent after a restart, never the PUBLISH);
- ``C`` its PUBCOMP came: the exchange is over;
- ``I`` a QoS 2 PUBLISH from a session's client, logged at an offset, with its message's
  digest (core.handlers.publish; files written before it was kept have none): its packet id
  awaits PUBREL (a re-send, with DUP or the same message without, is then not logged again);
- ``F`` that PUBREL came;
- ``D`` the session ended (a clean session took its client id);
- ``W`` a delayed will ended (core.wills): published (or dropped) or cancelled by its client
  coming back, by client id and the will's serial; a restart does not restore it.

Clean sessions are not journaled (nothing of them survives a restart), but for the QoS 2
messages shared subscription groups give them (``O`` with the group, ``R``, ``C``; ``C`` also
when the session ends first): a restart does not give those to another member, and counts those
without PUBREC as lost. A snapshot's new file records again those still awaiting it. A record
is one JSON array per line, in ``exchanges-<generation>.jsonl`` in the state directory. Each
snapshot starts a new generation and names it; once that snapshot is on disk the snapshot
writer deletes the older files. At start the files from the snapshot's generation on are
applied to what the snapshot restored (``ExchangeRestore.apply_exchanges``), and the records of
each session's QoS 2 messages keep its catch-up from sending them again; the inbound packet ids
of sessions it lacks are kept for their clients' next connection (core.exchange_restore).

Records are gathered and written with one ``os.write`` before anything they cover can be
sent (a will's ``W``: before its PUBLISH can reach the log): ahead of each log write
(``Journal.end_pass``: an inbound QoS 2 message's id never reaches the disk after its
record), and ahead of every flush of a connection
(``Broker.before_send``, called by the transports' ``flush``), which covers the records
routing made after the log write. With the operating system they survive a crash of the process; the
flusher thread fsyncs the file with the log (docs/persistence.md says what a power cut can
take). A failing write is logged once per failing spell and counted
(``exchange_write_errors``): until writes work again a crash may repeat a QoS 2 message, as
it would without the journal.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import deque

from edgebroker.files import NotRegularFile, numbered_files, read_small_file

log = logging.getLogger("edgebroker.broker")

PREFIX = "exchanges-"
SUFFIX = ".jsonl"
_NAME = re.compile(r"exchanges-(\d+)\.jsonl\Z")
# The journal asks for a snapshot (which starts a new file) once its file holds this much.
SNAPSHOT_BYTES = 4 * 1024 * 1024


def path(state_dir: str, generation: int) -> str:
    return os.path.join(state_dir, f"{PREFIX}{generation}{SUFFIX}")


def generations(state_dir: str) -> list[int]:
    """The generations of the journal files in ``state_dir``, ascending."""
    return numbered_files(state_dir, _NAME)


# kind -> the record's length (``O``: without and with the group's key)
# (``I``: without a digest, as written before it was kept, and with it)
_LENGTHS = {"O": (6, 7), "R": (3,), "C": (3,), "I": (4, 5), "F": (3,), "D": (2,),
            "W": (3,), "G": (3,)}


def _whole(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def damage(record) -> str | None:
    """Why ``record`` (a parsed line) is no record ``apply_exchanges`` can apply; None: it
    is one. Each kind's length and the type and range of each field are checked."""
    if type(record) is not list or not record or record[0] not in _LENGTHS:
        return "not a record"
    if len(record) not in _LENGTHS[record[0]]:
        return f"{len(record)} fields for a {record[0]!r} record"
    if type(record[1]) is not str:
        return "a client id that is no string"
    if record[0] == "G":     # (the group's key, then the log offset)
        return (None if _whole(record[2], 0, (1 << 63) - 1)
                else f"offset {str(record[2])[:40]!r}")
    if record[0] == "W":
        return (None if _whole(record[2], 0, (1 << 63) - 1)
                else f"will serial {str(record[2])[:40]!r}")
    if len(record) > 2 and not _whole(record[2], 1, 0xFFFF):
        return f"packet id {str(record[2])[:40]!r}"
    if len(record) > 3 and not _whole(record[3], 0, (1 << 63) - 1):
        return f"offset {str(record[3])[:40]!r}"
    if record[0] == "I":
        if len(record) > 4 and not _whole(record[4], 0, 0xFFFFFFFF):
            return f"digest {str(record[4])[:40]!r}"
        return None
    if len(record) > 4 and not _whole(record[4], 0, (1 << 63) - 1):
        return f"size {str(record[4])[:40]!r}"
    if len(record) > 5 and type(record[5]) not in (bool, int):
        return f"retain {str(record[5])[:40]!r}"
    if len(record) > 6 and type(record[6]) is not str:
        return "a group key that is no string"
    return None


def load(state_dir: str, first: int) -> list[list]:
    """The records of the files from generation ``first`` on, in order. A line a crash cut
    short (the last of a file) is left out; so are damaged ones (not JSON, or no record
    ``damage`` accepts), with one warning per file."""
    records = []
    for generation in generations(state_dir):
        if generation < first:
            continue
        name = path(state_dir, generation)
        try:
            lines = read_small_file(name).split(b"\n")
        except NotRegularFile as exc:
            log.error("%s: %s: its QoS 2 exchange records are not applied (a QoS 2 message "
                      "they covered may be delivered twice)", name, exc.strerror)
            continue
        last = len(lines) - 1
        damaged, first_damage = 0, ""
        for number, line in enumerate(lines):
            if not line:
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if number == last:   # an unterminated last line: the write a crash cut off
                    continue
                why = f"not JSON: {type(exc).__name__}"
            else:
                why = damage(record)
                if why is None:
                    records.append(record)
                    continue
            damaged += 1
            first_damage = first_damage or f"line {number + 1}: {why}"
        if damaged:
            log.warning("%s: %d damaged QoS 2 exchange record(s) skipped (the first at %s): "
                        "a QoS 2 message they covered may be delivered twice", name, damaged,
                        first_damage)
    return records


def remove_before(state_dir: str, generation: int) -> None:
    """Delete the files a snapshot of ``generation`` made obsolete (snapshot writer thread);
    OSError when the state directory cannot be listed (the next snapshot tries again)."""
    for old in generations(state_dir):
        if old >= generation:
            break
        try:
            os.unlink(path(state_dir, old))
        except OSError as exc:
            log.warning("cannot delete %s: %s", path(state_dir, old), exc.strerror or exc)


def sync_generation(state_dir: str, generation: int) -> None:
    """fsync the journal file of ``generation`` and the state directory (snapshot writer
    thread): records that must be on disk before the files they were in are deleted (a
    restart's unclaimed packet ids, core.exchange_restore). OSError when that fails."""
    fd = os.open(path(state_dir, generation), os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ExchangeJournal:
    """The current journal file and the records of this pass not yet written to it."""

    def __init__(self, state_dir: str, stats):
        self.state_dir = state_dir
        self.stats = stats
        existing = generations(state_dir)
        # A new file for this run: never append after a line a crash may have cut short.
        self.generation = existing[-1] + 1 if existing else 1
        self.lines: list[str] = []
        self.size = 0           # bytes written to the current file
        self.fd = -1            # opened at the first write
        self.failing = False
        self.torn = False       # the file may end in part of a line (see _cut_back)
        # (log offset, client id, packet id) of the ``I`` records whose log record is not yet
        # safe (its PUBREC waits: ``Journal.safe_offset``), oldest first: a snapshot leaves
        # those ids out and writes their ``I`` records again in its new file (``carry``).
        self.unsafe: deque = deque()

    # ----- records (the core thread, while handling packets) ----------------------------------

    def sent(self, client_id: str, pid: int, offset: int, size: int, retain: bool,
             group: str | None = None) -> None:
        record = ["O", client_id, pid, offset, size, retain]
        if group is not None:
            record.append(group)
        self.lines.append(json.dumps(record))

    def given(self, group: str, offset: int) -> None:
        """``G``: a group gave the QoS 2 message at ``offset`` at QoS 0, or at QoS 1 and its
        member acknowledged it."""
        self.lines.append(json.dumps(["G", group, offset]))

    def released(self, client_id: str, pid: int) -> None:
        self.lines.append(json.dumps(["R", client_id, pid]))

    def completed(self, client_id: str, pid: int) -> None:
        self.lines.append(json.dumps(["C", client_id, pid]))

    def received(self, client_id: str, pid: int, offset: int, digest: int) -> None:
        self.lines.append(json.dumps(["I", client_id, pid, offset, digest]))
        self.unsafe.append((offset, client_id, pid))

    def settled(self, safe_offset: int) -> None:
        """The log records below ``safe_offset`` are safe (``Journal``, as it releases their
        acknowledgements): their ``I`` records no longer need carrying."""
        unsafe = self.unsafe
        while unsafe and unsafe[0][0] < safe_offset:
            unsafe.popleft()

    def carry(self, client_id: str, pid: int, offset: int, digest: int | None) -> None:
        """An ``I`` record again, in the file a snapshot just started (``rotate``): the
        snapshot left its packet id out, its log record not being safe yet."""
        record = ["I", client_id, pid, offset]
        if digest is not None:      # (None: an id restored from a file without digests)
            record.append(digest)
        self.lines.append(json.dumps(record))

    def freed(self, client_id: str, pid: int) -> None:
        self.lines.append(json.dumps(["F", client_id, pid]))

    def ended(self, client_id: str) -> None:
        self.lines.append(json.dumps(["D", client_id]))

    def will_ended(self, client_id: str, serial: int) -> None:
        self.lines.append(json.dumps(["W", client_id, serial]))

    # ----- the file -------------------------------------------------------------------------

    def write(self) -> None:
        """Hand this pass's records to the OS (before anything they cover is sent)."""
        data = ("\n".join(self.lines) + "\n").encode("utf-8")
        self.lines = []
        if self.torn:  # a part line the last failure could not cut off: end it first
            data = b"\n" + data
        try:
            if self.fd < 0:
                self.fd = os.open(path(self.state_dir, self.generation),
                                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            self.stats.exchange_write_errors += 1
            self._cut_back()
            if not self.failing:
                self.failing = True
                log.error("cannot write the QoS 2 exchange journal %s: %s; until it works again "
                          "a crash may deliver a QoS 2 message twice", path(self.state_dir,
                                                                            self.generation),
                          exc.strerror or exc)
            return
        if self.torn:
            self.torn = False
            self.size = os.fstat(self.fd).st_size
        else:
            self.size += len(data)
        if self.failing:
            self.failing = False
            log.warning("the QoS 2 exchange journal is written again")

    def _cut_back(self) -> None:
        """A failed write may have left part of a line: cut the file back to its whole lines,
        so that the next record written is not glued to it (and lost at load)."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            self.torn = True

    @property
    def full(self) -> bool:
        """The current file is big enough that a snapshot should start a new one."""
        return self.size >= SNAPSHOT_BYTES

    def rotate(self) -> int:
        """A snapshot is taken now: what it does not cover goes to a new file. Returns the
        generation it names (the first file to apply after it)."""
        if self.lines:
            self.write()
        self.close()
        if self.size or self.torn:
            self.generation += 1
            self.size = 0
            self.torn = False
        return self.generation

    def sync(self) -> None:
        """fsync the current file (the flusher thread, with the log's fsync)."""
        fd = self.fd
        if fd >= 0:
            try:
                os.fdatasync(fd)
            except OSError:
                pass  # closed by a rotation meanwhile, or failing: the next one retries

    def close(self) -> None:
        if self.lines:      # (at a stop: the records the final snapshot carried)
            self.write()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
