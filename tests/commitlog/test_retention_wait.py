"""The disk limit's wait for the session snapshot (commitlog/retention.py ``plan``): the log may
go past retention_bytes by at most SNAPSHOT_WAIT_SEGMENTS segments of records and index
entries. A sealed segment's room (its index file's 64 KiB until the flusher trims it) counts
toward the total, not toward the segments the wait allows: counted there too, it doubled the
allowance with small segments, and a 1 MiB disk sized as docs/upload.md advises filled (upload8)."""

from __future__ import annotations

from edgebroker.commitlog import retention
from edgebroker.commitlog.format import INDEX_ENTRY_SIZE

ROOM = 65536        # an untrimmed index file


class Sealed:
    """What ``plan`` reads of a segment: sealed, 300 records of 200 bytes, its index room
    not trimmed yet."""

    def __init__(self, base: int, sealed: bool = True):
        self.sealed = sealed
        self.count = 300
        self.size = 60_000
        self.next_offset = base + self.count
        self.max_timestamp = 0

    def disk_bytes(self) -> int:
        return self.size + (ROOM if self.sealed else self.count * INDEX_ENTRY_SIZE)


def test_the_snapshot_wait_allows_two_segments_of_records_not_of_room():
    segments = [Sealed(i * 300) for i in range(4)] + [Sealed(1200, sealed=False)]
    total = sum(s.disk_bytes() for s in segments)
    wait = retention.SNAPSHOT_WAIT_SEGMENTS * (60_000 + 300 * INDEX_ENTRY_SIZE)
    over = wait + 20_000      # past two segments of records, within two of records + room
    victims, waiting = retention.plan(segments, 0, 0, total - over, 1 << 40, saved_offset=0)
    # The oldest goes (counted as records the snapshot did not cover); the rest is within
    # the wait.
    assert [v[0] for v in victims] == segments[:1] and waiting
    victims, waiting = retention.plan(segments, 0, 0, total - wait, 1 << 40, saved_offset=0)
    assert victims == [] and waiting      # within the wait: for the snapshot to be written
