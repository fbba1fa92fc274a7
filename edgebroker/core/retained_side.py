"""The retained messages' payloads of a session snapshot (format 3): a side file. Imported
when there are retained messages to write or a side file to read (core.snapshot_retained).

``sessions.json`` (core.snapshot) holds each retained message's topic, QoS, offset, expiry and
publisher, and where its bytes are in ``retained-<N>.bin`` next to it (N: the file's
generation, one more for each file written whole): ``MAGIC``, then payloads each followed by
its properties, back to back. The document names the file with its size and CRC-32 of that
many bytes (checked at start: a missing, cut off or changed file is a damaged snapshot; bytes
past that size are not the document's), each message its position and lengths
(docs/persistence.md). Kept out of the JSON, a payload is never copied to be written (no
base64, no join of them all, no copy cached on its state): a snapshot costs the memory of a
write buffer whatever the retained messages weigh.

While no retained message changed since the last snapshot written, the next ones name the
same file (most snapshots change sessions only). When some did, the writer appends the new
ones to the file past the size the document names (cutting off what a failed append left
there), fsyncs it, then replaces ``sessions.json`` naming the longer file: the bytes of those
replaced stay in the file, unused, until they would be more than those used (``compact``).
Then, or when there is no file yet (a start), it streams a new generation whole, fsyncs it
and the directory, replaces ``sessions.json``, and only then deletes the other side files. A
crash leaves the old document with its file (perhaps longer), or the new pair.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import zlib

from edgebroker.core.snapshot_retained import (
    FILE_NAME, MAGIC, RetainedState, SnapshotError, generations, name,
)
from edgebroker.errors import topic_shown
from edgebroker.files import open_regular, open_replaced

log = logging.getLogger("edgebroker.snapshot")

BUFFER = 1 << 20       # the write buffer, and the chunk read to check the CRC
YIELD_EVERY = 256      # messages written between two yields of the interpreter
# The bytes of replaced or cleared messages a side file may hold beyond as many as it uses
# before it is written anew (``compact``): a small file is not rewritten for each change.
COMPACT_MIN = 1 << 20


class Plan:
    """A write of the side file planned for one snapshot: a new generation whole (``start``
    0) or an append to the current one past its committed ``start`` bytes (``crc``: theirs)."""

    __slots__ = ("name", "size", "start", "crc", "gen", "seq", "states")

    def __init__(self, name, size, start, crc, gen, seq, states):
        self.name, self.size, self.start, self.crc = name, size, start, crc
        self.gen, self.seq, self.states = gen, seq, states

    @property
    def room(self) -> int:
        """The disk blocks it needs (4 KiB each): those of the bytes it writes."""
        return -(-self.size // 4096) * 4096 - self.start // 4096 * 4096


class RetainedFile:
    """The side files of one state directory (the snapshot writer's thread only).

    A state is in the current file when a committed write placed it there: its ``gen`` is the
    file's generation and its ``seq`` one of the writes whose document was put in place
    (``_seqs``). Each plan has a new sequence number, so a state placed by a write that failed
    (the side file's or the document's) is never taken as in the file: it is placed again."""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.head: list | None = None   # [name, size, crc32] the last snapshot written names
        self.size = 0                   # its size
        self._gen = 0                   # its generation
        self._seqs: set[int] = set()    # the committed writes of its states
        self._count = 0                 # the messages of the last snapshot written
        self._used = 0                  # the bytes of the file they use (its header included)
        self._seq = 0                   # the last plan's sequence number
        self._next = 0                  # the next generation to write (0: not listed yet)
        self._pending: tuple[Plan, list] | None = None   # a write done, its document not yet
        self._whole = False             # an append failed: the next write is a new file
        self._cleaned = False           # the others deleted (once a snapshot is written)

    @property
    def used(self) -> int:
        """The bytes of the file the last snapshot's retained messages use (its header
        included): what a new generation of them takes, and more than an append does."""
        return self._used

    def _held(self, r: RetainedState) -> bool:
        return r.gen == self._gen and r.seq in self._seqs

    def _live(self, retained: list[RetainedState]) -> int:
        return len(MAGIC) + sum(len(r.payload) + len(r.properties) for r in retained)

    def current(self, retained: list[RetainedState]) -> list | None:
        """The head of the side file written last when it holds each of ``retained`` and
        not too much else (``compact``), else None: a write is needed."""
        if self.head is None or not retained or not all(map(self._held, retained)):
            return None
        # (all in the file and as many: those of the last snapshot, a state gone never
        # comes back)
        used = self._used if len(retained) == self._count else self._live(retained)
        return None if compact(self.size, used) else self.head

    def plan(self, retained: list[RetainedState]) -> Plan:
        """The write for ``retained``: the states not in the current file appended to it, or
        a new generation holding them all when there is none, or when the bytes no retained
        message uses would be too many after the append (``compact``). Each message's place
        is set on its state (a changed place drops the state's cached entry)."""
        self._seq += 1
        missing = [r for r in retained if not self._held(r)]
        added = sum(len(r.payload) + len(r.properties) for r in missing)
        if (self.head is None or self._whole
                or compact(self.size + added, self._live(retained))):
            if not self._next:
                self._next = max(generations(self.state_dir), default=0) + 1
            gen, self._next = self._next, self._next + 1
            plan = Plan(name(gen), 0, 0, 0, gen, self._seq, retained)
        else:
            plan = Plan(self.head[0], 0, self.size, self.head[2], self._gen, self._seq, missing)
        at = plan.start or len(MAGIC)
        for r in plan.states:
            place = (at, len(r.payload), len(r.properties))
            if place != r.place:
                r.place, r.encoded = place, None
            r.gen, r.seq = plan.gen, plan.seq
            at += place[1] + place[2]
        plan.size = at
        return plan

    def write(self, plan: Plan) -> list:
        """Write ``plan``, each payload streamed as it is (through a buffer of ``BUFFER``
        bytes: small ones are not a write each), fsynced (a new file's directory entry too):
        the file's head [name, size, crc32]. OSError when it cannot (a new file removed: a
        full disk needs its blocks back)."""
        path = os.path.join(self.state_dir, plan.name)
        if plan.start:
            # (bytes past the committed size: an append that failed or that a crash cut off)
            try:
                fd = open_regular(path, os.O_WRONLY)
            except OSError:
                self._whole = True
                raise
            crc = plan.crc
        else:
            fd = open_replaced(path)
            crc = zlib.crc32(MAGIC)
        try:
            if plan.start:
                os.ftruncate(fd, plan.start)
                os.lseek(fd, plan.start, os.SEEK_SET)
            with open(fd, "wb", buffering=BUFFER, closefd=False) as fh:
                if not plan.start:
                    fh.write(MAGIC)
                for i, r in enumerate(plan.states, 1):
                    for part in (r.payload, r.properties):
                        if part:
                            fh.write(part)
                            crc = zlib.crc32(part, crc)
                    if i % YIELD_EVERY == 0:
                        time.sleep(0)     # the loop thread's turn (core.snapshot._joined)
            os.fsync(fd)
        except OSError as exc:
            if not plan.start:
                _unlink(path)
            else:
                try:        # what it wrote gives its blocks back (a full disk needs them)
                    os.ftruncate(fd, plan.start)
                except OSError:
                    pass
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    self._whole = True    # (a full disk: the append is tried again)
            raise
        finally:
            os.close(fd)
        if not plan.start:
            dir_fd = os.open(self.state_dir, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)      # its entry is durable before a document names it
            finally:
                os.close(dir_fd)
        head = [plan.name, plan.size, crc]
        self._pending = (plan, head)
        return head

    def discard(self, plan: Plan) -> None:
        """A side file written for a document that could not be written: a new one deleted
        (the bytes an append added stay past the committed size, unread)."""
        self._pending = None
        if not plan.start:
            _unlink(os.path.join(self.state_dir, plan.name))

    def written(self, head: list | None, retained: list[RetainedState]) -> OSError | None:
        """The document naming ``head`` (None: no retained message) for ``retained`` is in
        place: the write that made it committed, and the other side files deleted when it
        is a new one (those of older snapshots, and of writes a crash cut off). The error
        when the state directory cannot be listed for them (no descriptor free, EIO): the
        snapshot is written all the same, and the next one deletes them."""
        pending, self._pending = self._pending, None
        gen = 0 if head is None else int(FILE_NAME.match(head[0]).group(1))
        if gen != self._gen:
            self._seqs = set()
        committed = pending is not None and pending[1] == head
        if committed:
            self._seqs.add(pending[0].seq)
            self._whole = False
        if committed or len(retained) != self._count:
            # (only the writes of states it still holds: a state gone never comes back)
            self._seqs.intersection_update(r.seq for r in retained if r.gen == gen)
            self._count, self._used = len(retained), self._live(retained)
        cleaned = gen == self._gen and self._cleaned
        self.head, self._gen = head, gen
        self.size = 0 if head is None else head[1]
        if cleaned:
            return None
        try:
            others = generations(self.state_dir)
        except OSError as exc:
            self._cleaned = False
            return exc
        self._cleaned = True
        for other in others:
            if other != gen:
                path = os.path.join(self.state_dir, name(other))
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("cannot delete %s (retained messages of a former snapshot): %s",
                                path, exc.strerror or exc)
        return None


def compact(size: int, live: int) -> bool:
    """A side file of ``size`` bytes whose retained messages use ``live`` (its header
    included) is written anew: when the bytes no message uses any more (replaced or cleared
    since it was written) would be more than those used, and than ``COMPACT_MIN``."""
    return size - live > max(live, COMPACT_MIN)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def load(state_dir: str, head: list, retained: list[RetainedState], path: str) -> None:
    """Read the payloads and properties of ``retained`` (decoded from the document ``path``,
    with their places) from the side file ``head`` names, each by its position: no copy of
    the whole file is held. SnapshotError naming the file when it is missing, not as long as
    the document says, not a side file or its CRC-32 differs (the snapshot is damaged)."""
    _open_checked(state_dir, head, retained, path, read=True)


def verify(state_dir: str, head: list, retained: list[RetainedState], path: str) -> None:
    """Check the side file ``head`` names as ``load`` does, reading no payload into memory
    (``inspect verify``)."""
    _open_checked(state_dir, head, retained, path, read=False)


def _open_checked(state_dir: str, head: list, retained: list[RetainedState], path: str,
                  read: bool) -> None:
    file = os.path.join(state_dir, head[0])
    size, crc = head[1], head[2]
    try:
        fd = open_regular(file, os.O_RDONLY)
    except FileNotFoundError:
        raise SnapshotError(f"{file}: missing (it holds the retained messages of {path})",
                            file) from None
    except OSError as exc:
        raise SnapshotError(f"{file}: cannot read: {exc.strerror}", file) from None
    try:
        _check(fd, file, size, crc, path)
        for r in retained:
            if r.place is None:
                continue
            at, n, m = r.place
            if at < len(MAGIC) or n < 0 or m < 0 or at + n + m > size:
                raise SnapshotError(f"{path}: damaged snapshot (retained message "
                                    f"{topic_shown(r.topic)}: bytes {at} to {at + n + m} of "
                                    f"{head[0]}, which has {size})")
            if read:
                r.payload = _read(fd, n, at, file)
                r.properties = _read(fd, m, at + n, file) if m else b""
    except OSError as exc:
        raise SnapshotError(f"{file}: cannot read: {exc.strerror}", file) from None
    finally:
        os.close(fd)


def _check(fd: int, file: str, size: int, crc: int, path: str) -> None:
    actual = os.fstat(fd).st_size
    if actual < size:   # (longer: an append whose document a crash or an error left unwritten)
        raise SnapshotError(f"{file}: damaged (cut off: {actual} bytes, {path} says {size})",
                            file)
    buf = bytearray(min(BUFFER, size))
    view = memoryview(buf)
    got, pos = 0, 0
    while pos < size:
        n = os.preadv(fd, [view[:min(BUFFER, size - pos)]], pos)
        if n <= 0:
            raise SnapshotError(f"{file}: damaged (cut off at {pos} bytes while read)", file)
        if pos == 0 and bytes(view[:len(MAGIC)]) != MAGIC:
            raise SnapshotError(f"{file}: damaged (no {MAGIC[:-1].decode()} header: not a "
                                f"retained messages file)", file)
        got = zlib.crc32(view[:n], got)
        pos += n
    if got != crc:
        raise SnapshotError(f"{file}: damaged (its CRC-32 is {got:08x}, {path} says "
                            f"{crc:08x})", file)


def _read(fd: int, n: int, at: int, file: str) -> bytes:
    data = os.pread(fd, n, at)
    if len(data) != n:
        raise SnapshotError(f"{file}: damaged (cut off at {at + len(data)} bytes while read)",
                            file)
    return data
