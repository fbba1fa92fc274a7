"""The disk limit's wait for the session snapshot (commitlog/retention.py ``plan``): a sealed
segment's room (its index file's room until the flusher trims it) counts toward the log's
size and toward the segments the wait allows alike, so a log of small segments over the limit
by their rooms alone still waits for the snapshot (tests/core/test_retention_snapshot.py)."""

from __future__ import annotations

from edgebroker.commitlog import retention
from edgebroker.commitlog.format import INDEX_ENTRY_SIZE

ROOM = 65536        # an untrimmed index file
SETTLED = 60_000 + 300 * INDEX_ENTRY_SIZE    # records and index entries


class Sealed:
    """What ``plan`` reads of a segment: 300 records of 200 bytes; ``room``: its index file
    not trimmed yet."""

    def __init__(self, base: int, sealed: bool = True, room: bool = False):
        self.sealed = sealed
        self.count = 300
        self.size = 60_000
        self.next_offset = base + self.count
        self.max_timestamp = 0
        self.room = room

    def disk_bytes(self) -> int:
        return self.size + (ROOM if self.room else self.count * INDEX_ENTRY_SIZE)


def test_room_alone_does_not_end_the_wait():
    """Small segments whose untrimmed index rooms put the log over the limit wait for the
    snapshot all the same (their records are within it)."""
    segments = [Sealed(i * 300, room=True) for i in range(2)] + [Sealed(600, sealed=False)]
    victims, waiting = retention.plan(segments, 0, 0, 3 * SETTLED, 1 << 40, saved_offset=0)
    assert victims == [] and waiting
