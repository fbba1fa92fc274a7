"""One segment: the ``.seg`` file of records and its ``.idx`` file of fixed-width entries.

The writer keeps the index of the segment it appends to mmapped read-write, with room for more
entries allocated ahead with ``posix_fallocate`` (so a full disk shows up as an error there, never
as SIGBUS on a page fault); after seal the index is trimmed to its entries (by the flusher
thread, before it fsyncs the index). Sealed indexes are mmapped read-only. A read-only reader
(``edgebroker inspect``, while the broker runs) keeps the index of every segment above the
recovery point in memory, built by scanning, so it never maps a file the writer may still
append to or trim.

The ``.seg`` file of the segment appended to has its blocks allocated ahead, up to
``segment_bytes``, without changing its size (``preallocate``): a write into allocated blocks
costs the core thread less than one that allocates them. A new segment takes a file made so
ahead by another thread (``create_files``, ``CommitLog.prepare_spare``); the flusher frees
what is left of that room once the segment is sealed.
"""

from __future__ import annotations

import errno
import mmap
import os

from edgebroker import _native
from edgebroker.commitlog.errors import LogWriteError
from edgebroker.commitlog.format import (
    FORMAT_VERSION, INDEX_ENTRY, INDEX_ENTRY_SIZE, INDEX_SUFFIX, RECORD_HEADER_SIZE, SEGMENT_SUFFIX,
    segment_name,
)
from edgebroker.files import write_small_file

INDEX_GROW_ENTRIES = 4096    # index room made at first (64 KiB), doubled as it fills
INDEX_BYTES_PER_ENTRY = 256  # a small segment starts with room for one entry per 256 bytes
INDEX_FEWEST_ENTRIES = 64


def index_room(entries: int, capacity: int, segment_bytes: int) -> int:
    """How many entries a segment's index makes room for when it must hold ``entries``
    (``capacity`` made so far): doubling from ``INDEX_GROW_ENTRIES``, or for segments under
    1 MiB from one entry per ``INDEX_BYTES_PER_ENTRY`` bytes, and never more than records of
    ``segment_bytes`` can need (each has a header): on a disk of a few MiB the room a sealed
    segment holds until the flusher trims it is then a fraction of it, not as much again."""
    if capacity:
        room = capacity * 2
    else:
        room = INDEX_GROW_ENTRIES
        if segment_bytes > 0:
            room = min(room, max(INDEX_FEWEST_ENTRIES, segment_bytes // INDEX_BYTES_PER_ENTRY))
    if segment_bytes > 0:
        room = min(room, segment_bytes // RECORD_HEADER_SIZE + 1)
    return max(entries, room)


def preallocate(fd: int, nbytes: int) -> int:
    """Allocate the blocks of the file's first ``nbytes`` ahead, keeping its size (Linux
    ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``). 0, or the errno when it cannot (a disk too
    full, a file system without it): the writes then allocate as they go."""
    return _native.fallocate(fd, nbytes)

_unpack_entry = INDEX_ENTRY.unpack_from


class Segment:
    __slots__ = (
        "base_offset", "path", "index_path", "fd", "index_fd", "index", "index_capacity", "count",
        "size", "next_offset", "first_timestamp", "max_timestamp", "sealed", "verified",
        "created", "new_file", "index_dirty", "deleted", "index_file_bytes", "index_trim",
        # writer's reservations for records appended but not yet written
        "reserved_size", "reserved_count", "reserved_max_ts", "reserved_first_ts", "full",
        "preallocated", "allocated", "version",
    )

    def __init__(self, directory: str, base_offset: int):
        name = segment_name(base_offset)
        self.base_offset = base_offset
        self.path = os.path.join(directory, name + SEGMENT_SUFFIX)
        self.index_path = os.path.join(directory, name + INDEX_SUFFIX)
        self.fd = -1
        self.index_fd = -1
        self.index: object = b""  # mmap, bytearray or bytes; `count` entries are valid
        self.index_capacity = 0
        self.count = 0
        self.size = 0              # bytes of the file that hold the header and valid records
        self.next_offset = base_offset
        self.first_timestamp: int | None = None
        self.max_timestamp = 0
        self.sealed = False
        self.verified = False      # every record's CRC checked since this process opened it
        self.created = False
        self.new_file = False      # created by this process; its directory entry needs an fsync
        self.index_dirty = False   # the index file changed and needs an fsync
        self.deleted = False
        self.index_file_bytes = 0
        self.index_trim = -1       # sealed: the index file's size once its room is cut off
        self.reserved_size = 0
        self.reserved_count = 0
        self.reserved_max_ts = 0
        self.reserved_first_ts: int | None = None
        self.full = False          # no more appends: seal once its pending records are written
        self.preallocated = False  # blocks past ``size`` allocated ahead (see preallocate)
        self.allocated = 0         # ... up to this many bytes, until the flusher frees them
        self.version = FORMAT_VERSION  # its format version: the rules its records are read by

    def __repr__(self) -> str:
        return f"<Segment {self.base_offset} records={self.count} size={self.size}>"

    # -- index ---------------------------------------------------------------------------------
    def entry(self, i: int) -> tuple[int, int, int]:
        """(offset, position, running max timestamp) of entry ``i``."""
        rel, pos, ts = _unpack_entry(self.index, i * INDEX_ENTRY_SIZE)
        return self.base_offset + rel, pos, ts

    def find_offset(self, offset: int) -> int:
        """Index of the first entry with an offset >= ``offset`` (``count`` when none)."""
        rel = offset - self.base_offset
        if rel <= 0:
            return 0
        if rel > 0xFFFFFFFF:
            return self.count
        return _native.index_find_offset(self.index, self.count, rel) if self.count else 0

    def find_time(self, timestamp_ms: int) -> int:
        if not self.count:
            return 0
        return _native.index_find_time(self.index, self.count, max(timestamp_ms, 0))

    def end_of(self, i: int) -> int:
        """Where the bytes of entry ``i``'s record end at the latest: the next entry's position."""
        return self.entry(i + 1)[1] if i + 1 < self.count else self.size

    def set_index(self, entries, count: int, *, first_timestamp: int | None = None) -> None:
        """Adopt ``count`` entries (an in-memory buffer) as this segment's index."""
        self._release_index()
        self.index = entries
        self.count = count
        self._derive_from_index(first_timestamp)

    def _derive_from_index(self, first_timestamp: int | None = None) -> None:
        if self.count:
            last_offset, _pos, max_ts = self.entry(self.count - 1)
            self.next_offset = last_offset + 1
            self.max_timestamp = max_ts
            self.first_timestamp = self.entry(0)[2] if first_timestamp is None else first_timestamp
        else:
            self.next_offset = max(self.next_offset, self.base_offset)
            self.first_timestamp = None

    def map_index_readonly(self) -> None:
        """mmap the (trimmed, not changing) index file read-only, or hold nothing if empty."""
        self._release_index()
        self.index = self._map_entries(self.count * INDEX_ENTRY_SIZE)

    def _release_index(self) -> None:
        if isinstance(self.index, mmap.mmap):
            try:
                self.index.close()
            except BufferError:
                pass    # a view of it is still held (a read under way): unmapped when it goes
        self.index = b""
        self.index_capacity = 0  # room for entries only in a writable mmap (see write_pending)

    # -- writer: files ---------------------------------------------------------------------------
    def create_files(self, spare: tuple[int, str] | None = None, room: int = 0) -> None:
        """Create (or reuse, after an earlier failed attempt) the two files, with index room.
        ``spare`` (only while the segment has no data file yet): (descriptor, path) of an
        empty file with its blocks allocated ahead, ``room`` bytes, to rename into the
        segment file (closed and removed when that cannot be done)."""
        if spare is not None:
            fd, spare_path = spare
            try:
                os.rename(spare_path, self.path)
                self.fd = fd
                self.preallocated = True
                self.allocated = room
            except OSError:
                try:
                    os.close(fd)
                except OSError:
                    pass
                try:
                    os.unlink(spare_path)
                except OSError:
                    pass
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
            if self.index_fd < 0:
                self.index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise LogWriteError.from_os("cannot create", self.path, exc) from None
        self.created = True
        self.new_file = True

    def open_for_append(self, room: int = 0) -> None:
        """Make an existing segment (the last one at recovery) the one appended to. Appends
        may follow even when this raises ``LogWriteError`` (no room for the index: a full
        disk); the first write then tries again."""
        self.reserved_size = self.size
        self.reserved_count = self.count
        self.reserved_max_ts = self.max_timestamp
        self.reserved_first_ts = self.first_timestamp
        self.created = True
        self.ensure_index_room(self.count + 1, room)
        self.allocate_room(room)

    def allocate_room(self, room: int) -> None:
        """Allocate the segment file's blocks up to ``room`` bytes ahead of the writes (see
        ``preallocate``); nothing when that cannot be done. When it fails part of the way (a
        disk too full for all of it, a quota) none of it is kept: the last free blocks stay
        for whatever file needs them first."""
        if room <= self.size:
            return
        err = preallocate(self.fd, room)
        if err == 0:
            self.preallocated = True
            self.allocated = room
        elif err != errno.ENOSYS:
            try:  # (to the size it has: nothing written is cut)
                os.ftruncate(self.fd, os.fstat(self.fd).st_size)
            except OSError:
                pass

    def ensure_index_room(self, entries: int, segment_bytes: int = 0) -> None:
        """Make the writable index mmap hold at least ``entries`` entries (fallocate ahead;
        how many more: ``index_room``)."""
        if entries <= self.index_capacity and isinstance(self.index, mmap.mmap):
            return
        capacity = index_room(entries, self.index_capacity, segment_bytes)
        nbytes = capacity * INDEX_ENTRY_SIZE
        try:
            if self.index_fd < 0:
                self.index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                        0o640)
            os.posix_fallocate(self.index_fd, 0, nbytes)
        except OSError as exc:
            raise LogWriteError.from_os("cannot grow index", self.index_path, exc) from None
        old = self.index
        try:
            # mmap takes a descriptor of its own: it fails (EMFILE) when none is free.
            new = mmap.mmap(self.index_fd, nbytes, access=mmap.ACCESS_WRITE)
        except OSError as exc:
            raise LogWriteError.from_os("cannot map index", self.index_path, exc) from None
        if not isinstance(old, mmap.mmap) and self.count:
            new[:self.count * INDEX_ENTRY_SIZE] = old[:self.count * INDEX_ENTRY_SIZE]
        if isinstance(old, mmap.mmap):
            old.close()
        self.index = new
        self.index_capacity = capacity
        self.index_file_bytes = max(self.index_file_bytes, nbytes)

    def write_index_file(self, entries, count: int, dir_fd: int | None) -> None:
        """Replace the index file with ``count`` entries (temporary file, fsync, rename)."""
        data = bytes(memoryview(entries)[:count * INDEX_ENTRY_SIZE])
        write_small_file(self.index_path, data, dir_fd)
        if self.index_fd >= 0:
            os.close(self.index_fd)
        self.index_fd = os.open(self.index_path, os.O_RDWR | os.O_CLOEXEC)
        self.index_capacity = 0
        self.index_file_bytes = len(data)
        self.set_index(entries, count, first_timestamp=self.first_timestamp)

    def trim_index(self) -> None:
        """Cut the preallocated room off the index file and map it read-only (or keep it in
        memory, see ``seal_index``)."""
        self.seal_index()
        nbytes = self.count * INDEX_ENTRY_SIZE
        os.ftruncate(self.index_fd, nbytes)
        self.index_file_bytes = nbytes
        self.index_trim = -1

    def seal_index(self) -> str | None:
        """At seal: map the index's entries read-only. Cutting the file's room off is left to
        the flusher thread (``CommitLog.sync``, told by ``index_trim``): freeing the room's
        blocks can wait for the disk (a discard). Until then ``index_file_bytes`` stays the
        file's size, room included: retention counts what the disk holds.

        When the map cannot be made (no descriptor free: the map takes one of its own; or no
        memory map left), the entries are kept as a copy in memory instead, so the segment stays
        readable: the reason is returned (None when mapped)."""
        nbytes = self.count * INDEX_ENTRY_SIZE
        reason = None
        try:
            sealed = self._map_entries(nbytes)
        except OSError:
            # Perhaps just one descriptor short: the writable map holds one. Keep a copy of the
            # entries, let that map go, and try once more.
            sealed = bytes(self.index[:nbytes])
            self._release_index()
            try:
                sealed = self._map_entries(nbytes)
            except OSError as exc:
                reason = exc.strerror or str(exc)
        self._release_index()
        self.index = sealed
        return reason

    def disk_bytes(self) -> int:
        """The bytes its files hold on disk, as retention counts them: the records, the index
        file at its size, and a sealed segment's blocks allocated ahead until the flusher
        frees them (not those of the segment being written: its room is not counted)."""
        data = max(self.size, self.allocated) if self.sealed else self.size
        return data + self.index_file_bytes

    def _map_entries(self, nbytes: int):
        """The first ``nbytes`` of the index file, mapped read-only (b"" for none)."""
        return mmap.mmap(self.index_fd, nbytes, access=mmap.ACCESS_READ) if nbytes else b""

    def close(self) -> None:
        for fd in self.detach():
            try:
                os.close(fd)
            except OSError:
                pass

    def detach(self) -> list[int]:
        """Let go of the files: the descriptors still open, for the caller to close."""
        self._release_index()
        fds = [fd for fd in (self.fd, self.index_fd) if fd >= 0]
        self.fd = self.index_fd = -1
        return fds

    # -- reading --------------------------------------------------------------------------------
    def pread(self, length: int, position: int) -> bytes:
        return os.pread(self.fd, length, position)

