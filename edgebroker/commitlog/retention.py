"""Which sealed segments to delete: a plain function of the segments, the clock and the limits.

Rules (docs/log-format.md, "Retention"):

* Only sealed segments are deleted, oldest first, and never the last segment (its name carries
  the next offset across a restart, so offsets never go back).
* While the log is over ``retention_bytes`` the oldest sealed segment goes, uploaded or not: the
  disk limit wins. A segment deleted before it was uploaded is *forced*; the caller counts and
  logs it.
* Otherwise a segment goes when it was uploaded (every record's offset is below the uploaded
  mark; the caller passes ``1 << 63`` when no uploader is configured), no session still needs
  it (every record's offset is below ``hold_offset``, the oldest cursor of a session that
  reads from the log) and its newest record is ``retention_ms`` or more old.
* Neither rule deletes a segment holding records at or past ``saved_offset``: the broker's
  session snapshot on disk does not cover them yet (a restart replays them: retained messages
  set there live only in the log until then). When the disk limit wants such a segment the
  plan says it waits; the broker then writes a snapshot, or (it cannot, in time) lets the
  segment go by passing no ``saved_offset``, and counts what that deletes. The disk limit
  waits only while the log is over ``retention_bytes`` by at most ``SNAPSHOT_WAIT_SEGMENTS``
  segments (each holds descriptors the open files budget counts: file_set's
  ``descriptors_at_retention``); a burst faster than that deletes them all the same,
  counted as the caller counts any record deleted at or past ``saved_offset``.
"""

from __future__ import annotations

from collections.abc import Sequence

# Segments the log may grow past retention_bytes while the disk limit waits for a snapshot.
SNAPSHOT_WAIT_SEGMENTS = 2


def plan(segments: Sequence, uploaded_offset: int, now_ms: int, retention_bytes: int,
         retention_ms: int, hold_offset: int = 1 << 63, saved_offset: int = 1 << 63
         ) -> tuple[list[tuple[object, bool, str]], bool]:
    """``(segment, forced, reason)`` for each segment to delete, oldest first; and whether
    the disk limit waits for ``saved_offset`` to move."""
    victims = []
    sizes = [s.disk_bytes() for s in segments]
    total = sum(sizes)
    may_wait = SNAPSHOT_WAIT_SEGMENTS * max(sizes, default=0)   # past retention_bytes
    for seg, seg_bytes in zip(segments[:-1], sizes):
        if not seg.sealed:
            break
        uploaded = seg.next_offset <= uploaded_offset
        if seg.next_offset > saved_offset and total - retention_bytes <= may_wait:
            return victims, total > retention_bytes
        if total > retention_bytes:
            victims.append((seg, not uploaded, f"the log is over retention_bytes "
                                               f"({total} > {retention_bytes} bytes)"))
        elif (uploaded and seg.next_offset <= hold_offset
              and (seg.count == 0 or seg.max_timestamp + retention_ms <= now_ms)):
            victims.append((seg, False, "older than retention_ms" + (
                ", and uploaded" if uploaded_offset < 1 << 63 else " (no uploader)")))
        else:
            break
        total -= seg_bytes
    return victims, False
