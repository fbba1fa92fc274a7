"""The retained messages' payloads of a session snapshot (format 3): a side file.

``sessions.json`` (core.snapshot) holds each retained message's topic, QoS, offset, expiry and
publisher, and where its bytes are in ``retained-<N>.bin`` next to it (N: the file's
generation, one more for each file written): ``MAGIC``, then each message's payload followed by
its properties, back to back. The document names the file with its size and CRC-32 (checked at
start: a missing, cut off or changed file is a damaged snapshot), each message its position and
lengths (docs/persistence.md). Kept out of the JSON, a payload is never copied to be written
(no base64, no join of them all, no copy cached on its state): a snapshot costs the memory of a
write buffer whatever the retained messages weigh.

The snapshot writer streams a new file, fsyncs it and the directory, then replaces
``sessions.json``; only then are the other side files deleted. A crash leaves the old document
with its file, or the new pair. While no retained message changed since the last snapshot
written, the next ones name the same file (most snapshots change sessions only).
"""

from __future__ import annotations

import binascii   # formats 1 and 2: base64 payloads in the document
import json
import logging
import os
import re
import time
import zlib

from edgebroker.errors import EdgebrokerError, topic_shown
from edgebroker.files import numbered_files, open_regular, open_replaced
from edgebroker.records import field, record

log = logging.getLogger("edgebroker.snapshot")

MAGIC = b"EBRETAINED1\n"
PREFIX, SUFFIX = "retained-", ".bin"
_NAME = re.compile(r"retained-([1-9][0-9]{0,18})\.bin\Z")
BUFFER = 1 << 20       # the write buffer, and the chunk read to check the CRC
YIELD_EVERY = 256      # messages written between two yields of the interpreter


class SnapshotError(EdgebrokerError):
    """The snapshot file exists but cannot be used; the message says why and where.
    ``retained_file``: the side file's path when it is the one at fault."""

    def __init__(self, message: str, retained_file: str | None = None):
        super().__init__(message)
        self.retained_file = retained_file


@record
class RetainedState:
    topic: str
    payload: bytes
    qos: int
    offset: int | None
    # MQTT 5.0: its properties to forward (Message.properties) and the wall-clock time (ms)
    # its Message Expiry Interval ends, None for never.
    properties: bytes = b""
    expires_ms: int | None = None
    # Who published it (a bridge's own client id for what came from its remote; the topic
    # table's creator, max_topics_per_client); "" when not known (older snapshots).
    client_id: str = ""
    # Its JSON entry, once the writer encoded it (it holds ``place``, not the payload).
    encoded: bytes | None = field(default=None, compare=False, repr=False)
    # (position, payload length, properties length) in the side file of generation ``gen``
    # (0: none yet); set by the writer (``RetainedFile.plan``) or read from a document.
    place: tuple[int, int, int] | None = field(default=None, compare=False, repr=False)
    gen: int = field(default=0, compare=False, repr=False)


def name(generation: int) -> str:
    return f"{PREFIX}{generation}{SUFFIX}"


def generations(state_dir: str) -> list[int]:
    """The generations of the side files in ``state_dir``, ascending."""
    return numbered_files(state_dir, _NAME)


def retained_json(r: RetainedState) -> bytes:
    """Its entry in the document (kept on it): its place in the side file, no payload."""
    if r.encoded is None:
        at, size, props = r.place
        r.encoded = json.dumps(
            {"topic": r.topic, "qos": r.qos, "offset": r.offset, "at": at, "size": size,
             **({"props_size": props} if props else {}),
             **({"expires_ms": r.expires_ms} if r.expires_ms is not None else {}),
             **({"client_id": r.client_id} if r.client_id else {})},
            separators=(",", ":")).encode("utf-8")
    return r.encoded


def retained_entry(r: dict) -> RetainedState:
    """A retained message of a document: its bytes in the document (formats 1 and 2, base64)
    or their place in the side file (format 3: read by ``load``). ValueError, KeyError,
    TypeError when a field is of the wrong type."""
    offset, expires = r.get("offset"), r.get("expires_ms")
    state = RetainedState(topic=str(r["topic"]), payload=b"", qos=int(r["qos"]),
                          offset=None if offset is None else int(offset),
                          expires_ms=None if expires is None else int(expires),
                          client_id=str(r.get("client_id", "")))
    if "payload" in r:
        state.payload = binascii.a2b_base64(r["payload"], strict_mode=True)
        state.properties = binascii.a2b_base64(r.get("properties", ""), strict_mode=True)
    else:
        state.place = (int(r["at"]), int(r["size"]), int(r.get("props_size", 0)))
    return state


def retained_file_head(value) -> list:
    """A document's ``retained_file``: [name, size, CRC-32]; ValueError when it is not one."""
    if (type(value) is not list or len(value) != 3 or type(value[0]) is not str
            or not _NAME.match(value[0]) or type(value[1]) is not int or value[1] < len(MAGIC)
            or type(value[2]) is not int or not 0 <= value[2] <= 0xFFFFFFFF):
        raise ValueError(f"retained_file {value!r} is not [\"retained-<N>.bin\", size, crc32]")
    return value


class RetainedFile:
    """The side files of one state directory (the snapshot writer's thread only)."""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.head: list | None = None   # [name, size, crc32] the last snapshot written names
        self.size = 0                   # its size
        self._gen = 0                   # its generation
        self._count = 0                 # the messages it holds
        self._next = 0                  # the next generation to write (0: not listed yet)
        self._cleaned = False           # the others deleted (once a snapshot is written)

    def current(self, retained: list[RetainedState]) -> list | None:
        """The head of the side file written last when it holds exactly ``retained`` (each
        state placed in it, and as many), else None: a new one is needed."""
        gen = self._gen
        if self.head is None or len(retained) != self._count:
            return None
        return self.head if all(r.gen == gen for r in retained) else None

    def plan(self, retained: list[RetainedState]) -> list:
        """A new side file for ``retained``: [name, size], each message's place in it set on
        its state (a changed place drops the state's cached entry). Each plan has a new
        generation, so a state placed in a file that was not written is never taken as in
        the one on disk."""
        if not self._next:
            self._next = max(generations(self.state_dir), default=0) + 1
        gen, self._next = self._next, self._next + 1
        at = len(MAGIC)
        for r in retained:
            place = (at, len(r.payload), len(r.properties))
            if place != r.place:
                r.place, r.encoded = place, None
            r.gen = gen
            at += place[1] + place[2]
        return [name(gen), at]

    def write(self, retained: list[RetainedState], planned: list) -> list:
        """Write the side file ``planned`` for ``retained``, each payload streamed as it is
        (through a buffer of ``BUFFER`` bytes: small ones are not a write each), fsynced, its
        directory entry too: its head [name, size, crc32]. OSError when it cannot (the file
        removed: a full disk needs its blocks back)."""
        path = os.path.join(self.state_dir, planned[0])
        fd = open_replaced(path)
        crc = zlib.crc32(MAGIC)
        try:
            with open(fd, "wb", buffering=BUFFER, closefd=False) as fh:
                fh.write(MAGIC)
                for i, r in enumerate(retained, 1):
                    for part in (r.payload, r.properties):
                        if part:
                            fh.write(part)
                            crc = zlib.crc32(part, crc)
                    if i % YIELD_EVERY == 0:
                        time.sleep(0)     # the loop thread's turn (core.snapshot._joined)
            os.fsync(fd)
        except OSError:
            _unlink(path)
            raise
        finally:
            os.close(fd)
        dir_fd = os.open(self.state_dir, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)      # its entry is durable before a document names it
        finally:
            os.close(dir_fd)
        return [planned[0], planned[1], crc]

    def discard(self, planned: list) -> None:
        """A side file written for a document that could not be written."""
        _unlink(os.path.join(self.state_dir, planned[0]))

    def written(self, head: list | None, count: int) -> None:
        """The document naming ``head`` (None: no retained message) is in place: the other
        side files are deleted (those of older snapshots, and of writes a crash cut off)."""
        if head == self.head and self._cleaned:
            return
        self.head, self._count, self._cleaned = head, count, True
        self.size = 0 if head is None else head[1]
        self._gen = 0 if head is None else int(_NAME.match(head[0]).group(1))
        for gen in generations(self.state_dir):
            if gen != self._gen:
                path = os.path.join(self.state_dir, name(gen))
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("cannot delete %s (retained messages of a former snapshot): %s",
                                path, exc.strerror or exc)


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
    if actual != size:
        what = "cut off" if actual < size else "longer"
        raise SnapshotError(f"{file}: damaged ({what}: {actual} bytes, {path} says {size})", file)
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
