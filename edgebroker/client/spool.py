"""A disk-backed request source for producers that must never block: ``Spool.append`` writes
a request to a file (whether or not the link is up) and returns; the event loop takes the
spool as its source (``EventLoop(requests=spool)``), gets the requests in the order they
were appended, and tells the spool each one answered (``acked``), which is then left out
for good. After a crash (SIGKILL, power cut with ``fsync=True``) a new Spool on the same
path gives again every request not answered: at least once, none lost.

Files (docs/client.md "The spool"): ``PATH`` holds the requests, appended as records
``length (4 bytes, big-endian) | CRC-32 of the body (4 bytes) | body``, the body being the
state file's JSON form of a request (requests.to_state) with its sequence number ``seq``;
``PATH.acked`` holds the sequence numbers answered, 8 bytes each, big-endian. A record that
is not whole and sound (cut short by a crash, a CRC that does not match, length 0 as in a
file grown but never written before a power cut, a body that is not a numbered request) is
cut off at open when no sound record follows it (a torn tail), as is a number of
``PATH.acked`` cut short; one with sound records after it (damage inside the file) is
skipped with a warning naming the file and the offset, and the records after it are kept.
When at least ``COMPACT_AFTER`` answered records make up half the file, the
unanswered ones are written to a new file with one fsync, renamed over ``PATH`` and the
directory fsynced (files.replace_file); then ``PATH.acked`` is emptied.

An append whose write fails (disk full, a file size limit, an I/O error) raises that
OSError and leaves the file as it was: the request is not kept, and what is written later is
read back whole. An acknowledgement whose write fails does not raise (the loop calls
``acked``): its number waits in memory and is written with the next one.

Iterating never ends: when nothing is waiting it yields None ("nothing for now").
``append`` may be called from another thread than the loop's (a lock guards the files).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import zlib
from collections import deque

from edgebroker.client.requests import (Request, check_sendable, from_state, make_publish,
                                        to_state)
from edgebroker.files import replace_file

log = logging.getLogger("edgebroker.client.spool")

COMPACT_AFTER = 1000
_HEAD = struct.Struct(">II")
_SEQ = struct.Struct(">Q")
_BODY_START = b'{"kind":'     # how every record's body begins (requests.to_state's first key)
# What a request's state-file form says about one connection's exchange, not kept in the
# spool: a request given again starts afresh (a new packet id, PUBLISH first).
_PER_CONNECTION = ("packet_id", "stage")


def _record(doc: dict, seq: int) -> dict:
    """The body of ``doc``'s spool record (numbered ``seq``)."""
    for key in _PER_CONNECTION:
        doc.pop(key, None)
    doc["seq"] = seq
    return doc


def _frame(doc: dict) -> bytes:
    """A record as the file holds it: length, CRC-32, body."""
    body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def _parse(raw: bytes, pos: int) -> tuple[dict | None, int]:
    """The record at ``pos`` if it is whole and sound (its body a numbered request), and
    where it ends; (None, 0) if not."""
    if pos + _HEAD.size > len(raw):
        return None, 0
    length, crc = _HEAD.unpack_from(raw, pos)
    after = pos + _HEAD.size + length
    body = raw[pos + _HEAD.size:after]
    if not length or len(body) < length or zlib.crc32(body) != crc:
        return None, 0
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None, 0
    if not isinstance(doc, dict) or type(doc.get("seq")) is not int:
        return None, 0
    return doc, after


def _next_record(raw: bytes, start: int) -> int | None:
    """Where the first sound record at or after ``start`` begins, or None. Every body starts
    with ``_BODY_START`` (JSON escapes the quotes of one inside a string), so only the places
    it is found are tried."""
    i = raw.find(_BODY_START, start + _HEAD.size)
    while i != -1:
        if _parse(raw, i - _HEAD.size)[0] is not None:
            return i - _HEAD.size
        i = raw.find(_BODY_START, i + 1)
    return None


class Spool:
    def __init__(self, path, *, fsync: bool = False):
        """``fsync``: each append and acknowledgement is on disk before the call returns
        (survives a power cut; slower). Without it a process crash loses nothing, the
        operating system having the bytes."""
        self.path = os.fspath(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._waiting: deque = deque()      # (seq, record doc) not yet handed to the loop
        self._out: dict = {}                # id(request) -> (seq, request) handed out
        self._acked_in_file = 0
        self._records_in_file = 0
        self._next_seq = 1
        self._unwritten: list = []          # numbers of answers PATH.acked could not take yet
        self._ack_failing = False
        self._open()

    # -- the producer's side ----------------------------------------------------------------
    def append(self, request_or_topic, payload=b"", qos: int = 0, retain: bool = False,
               properties: dict | None = None, token=None) -> int:
        """Keep a request (a Request, or the arguments of make_publish); its sequence
        number (unique among the requests not answered; after compaction and a reopen a
        number of an answered request may come again: docs/client.md)."""
        if isinstance(request_or_topic, Request):
            req = request_or_topic
            check_sendable(req, True)         # ClientError for properties not valid
        else:
            req = make_publish(request_or_topic, payload, qos, retain, properties, token)
        with self._lock:
            seq = self._next_seq
            doc = _record(to_state(req), seq)
            self._write(self._data_fd, _frame(doc))
            self._next_seq += 1
            self._records_in_file += 1
            self._waiting.append((seq, doc))
        return seq

    @property
    def unacked(self) -> int:
        """Requests appended and not answered yet (waiting, or handed to the loop)."""
        with self._lock:
            return len(self._waiting) + len(self._out)

    # -- the loop's side --------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            while self._waiting:
                seq, doc = self._waiting.popleft()
                try:
                    req = from_state(doc)
                except ValueError as exc:
                    # Sound on disk but no request (written by hand, or by another version):
                    # never sendable, so let go of for good rather than stop the loop.
                    log.warning("%s: record %d is no request this client can send (%s); "
                                "skipped and counted as answered", self.path, seq, exc)
                    self._unwritten.append(seq)
                    self._write_acks()
                    continue
                self._out[id(req)] = (seq, req)   # (under the lock: unacked never misses it)
                return req
        return None

    def acked(self, request) -> None:
        """``request`` (one this spool gave) was answered: never give it again. Never raises
        (the loop calls it): while its number cannot be written (disk full) the numbers
        wait in memory and go with the next answer, or at ``close``, with one warning per
        failing spell. A crash meanwhile gives those requests again: duplicates, no loss."""
        with self._lock:
            found = self._out.pop(id(request), None)
            if found is None:
                return
            self._unwritten.append(found[0])
            if not self._write_acks():
                return
            if (self._acked_in_file >= COMPACT_AFTER
                    and 2 * self._acked_in_file >= self._records_in_file):
                try:
                    self._compact()
                except OSError as exc:
                    log.warning("%s: cannot compact the spool (%s); tried again later",
                                self.path, exc.strerror or exc)

    def _write_acks(self) -> bool:
        """Write the numbers of the answers not written yet; False while that fails."""
        unwritten = self._unwritten
        try:
            self._write(self._ack_fd, b"".join(map(_SEQ.pack, unwritten)))
        except OSError as exc:
            if not self._ack_failing:
                self._ack_failing = True
                log.warning("%s.acked: cannot write (%s); %d answers kept in memory until it "
                            "works (a crash meanwhile gives those requests again)", self.path,
                            exc.strerror or exc, len(unwritten))
            return False
        if self._ack_failing:
            self._ack_failing = False
            log.warning("%s.acked: written again (%d answers)", self.path, len(unwritten))
        self._acked_in_file += len(unwritten)
        unwritten.clear()
        return True

    def close(self) -> None:
        with self._lock:
            if self._unwritten and self._data_fd >= 0:
                self._write_acks()              # a last try
            for fd in (self._data_fd, self._ack_fd):
                os.close(fd)
            self._data_fd = self._ack_fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- files --------------------------------------------------------------------------------
    def _write(self, fd: int, data: bytes) -> None:
        """Append ``data`` whole, or not at all: a write that fails part way (ENOSPC, EFBIG,
        EIO) is cut off again before the error is raised, so that no later record (or
        number) lands behind a torn one, which the next open would cut off with them."""
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise

    def _open(self) -> None:
        records, good = self._read_records()
        acked = set()
        try:
            with open(self.path + ".acked", "rb") as fh:
                raw = fh.read()
            acked = {_SEQ.unpack_from(raw, i)[0] for i in range(0, len(raw) - 7, 8)}
        except FileNotFoundError:
            raw = b""
        self._data_fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        os.ftruncate(self._data_fd, good)     # a record cut short by a crash
        self._ack_fd = os.open(self.path + ".acked", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                               0o600)
        if len(raw) % _SEQ.size:              # a number cut short: the next ones stay aligned
            os.ftruncate(self._ack_fd, len(raw) - len(raw) % _SEQ.size)
        self._records_in_file = len(records)
        self._acked_in_file = sum(1 for seq, _ in records if seq in acked)
        self._waiting = deque((seq, doc) for seq, doc in records if seq not in acked)
        # Past every number used, also those only the .acked file still names.
        self._next_seq = max([0, *acked, *(seq for seq, _ in records)]) + 1

    def _read_records(self) -> tuple[list, int]:
        """The sound records of the file, and where the last one ends (what follows it, a
        record a crash cut short, is cut off at open). A record that is not whole and sound
        (length 0, as a file grown by a crash but never written shows, a CRC that does not
        match, a body that is not a numbered request) with a sound record somewhere after it
        is damage inside the file: skipped with a warning naming the file and the offset,
        and the records after it are kept."""
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return [], 0
        records = []
        pos = end = 0
        while pos < len(raw):
            doc, after = _parse(raw, pos)
            if doc is not None:
                records.append((doc["seq"], doc))
                pos = end = after
                continue
            found = _next_record(raw, pos + 1)
            if found is None:
                log.warning("%s: the %d bytes from offset %d are no whole record (a write a "
                            "crash cut short): cut off", self.path, len(raw) - pos, pos)
                break
            log.warning("%s: %d bytes at offset %d are no sound record (damaged on disk): "
                        "skipped; the records after them, from offset %d, are kept",
                        self.path, found - pos, pos, found)
            pos = found
        return records, end

    def _compact(self) -> None:
        keep = sorted([*((seq, doc) for seq, doc in self._waiting),
                       *((seq, _record(to_state(req), seq)) for seq, req in self._out.values())],
                      key=lambda item: item[0])
        # One write and one fsync, the rename, the directory fsynced.
        replace_file(self.path, b"".join(_frame(doc) for _, doc in keep))
        os.close(self._data_fd)
        self._data_fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        os.ftruncate(self._ack_fd, 0)
        self._records_in_file = len(keep)
        self._acked_in_file = 0
