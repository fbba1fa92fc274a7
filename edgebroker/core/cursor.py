"""A session's cursor: where a session behind reads the commit log from (core.catchup), and
what it needs to read it — the filters subscribed while behind, the offset ranges it was
offline in, a cache of topic decisions, the records read and not yet sent, the retained
copies held for SUBSCRIBEs made while behind (core.retained), and what a crash left it unsure
of."""

from __future__ import annotations

from edgebroker.core.filter_set import matching_filters
from edgebroker.core.session import as_stored
from edgebroker.mqtt.trie import CACHED_TOPIC_LENGTH

# Topic decisions cached per session behind (dropped wholesale beyond it; topics of up to
# CACHED_TOPIC_LENGTH bytes). A decision holds at most three (since, QoS) pairs whatever the
# number of matching filters (``Cursor.granted``): about 110 KB a session with 40-byte topics,
# 330 KB with 256-byte ones (docs/limits.md, "Memory").
CACHE_LIMIT = 1024
# Offline ranges kept per session (the oldest goes first: its QoS 0 is then sent after all).
OFFLINE_RANGES = 8


class Cursor:
    """Where a session behind reads the log from, and what it needs to read it."""

    __slots__ = ("offset", "floor", "since", "offline", "cache", "lag_dropped", "aged", "done",
                 "run", "held", "unsure_to", "resubscribed")

    def __init__(self, offset: int, floor: int):
        self.offset = offset       # the first log offset not yet read for the session
        self.floor = floor         # the oldest offset it still needs (its queue and window too)
        self.since: dict[str, int] | None = None    # filter -> offset it was subscribed at
        self.offline: list[list] | None = None      # [from, to or None] offset ranges
        self.cache: dict[bytes, tuple] = {}          # topic -> ((since, qos), ...): granted
        self.lag_dropped = 0       # QoS 0 skipped past max_lag in the current episode
        self.aged = -1             # records skipped for max_session_lag_age after the logged
        #                            move (-1: none logged yet)
        # After a restart: offsets of QoS 2 messages the session was sent after the snapshot
        # (core.exchanges), not to be sent again; None once the cursor is past them all.
        self.done: set[int] | None = None
        # Records read (offsets below ``offset``) and not yet sent: a core.catchup_run.Run,
        # or None.
        self.run = None
        # Retained copies for SUBSCRIBEs made while behind, sent once the cursor reaches the
        # offset each came at: [(offset, Message or Stored, qos, retain)], or None
        # (core.retained).
        self.held: list[tuple] | None = None
        # After a crash: records below this offset the session may have been sent before it
        # (online when the snapshot was taken); at QoS 0 they are not sent again.
        self.unsure_to = 0
        # The log offset at the last SUBSCRIBE again or UNSUBSCRIBE of a filter it held while
        # behind (0: none): offline ranges that ended before it were decided by other QoS.
        self.resubscribed = 0

    def __repr__(self):
        return f"Cursor({self.offset})"

    def unsent(self, queue=(), copies=None) -> int:
        """Where a reader that lost what is in memory goes on from: the first record of the
        run not yet sent, else ``offset`` (what the snapshot keeps). With the session's
        ``queue``, the first record it has not been sent (queued when it fell behind, or a
        batch read ahead into the queue: the queue's first entry, unless one of the retained
        copies sent for a SUBSCRIBE, ``copies``: Session.retained_queued)."""
        run = self.run
        if run is not None and run.i < run.n:
            return run.offsets[run.i]
        if queue:
            ref, _, retain = queue[0]
            offset = ref.offset
            if (offset is not None and offset < self.offset
                    and not (retain and copies and offset in copies)):
                return offset
        return self.offset

    def drop_run(self) -> None:
        """Let go of the records read and not yet sent: they are read again."""
        if self.run is not None:
            self.offset = self.unsent()
            self.run = None

    def granted(self, session, topic: bytes, offset: int) -> int:
        """The QoS ``session`` takes the record at ``offset`` on ``topic`` with; -1: none."""
        entry = self.cache.get(topic)
        if entry is None:
            entry = _decision(session, self.since, topic.decode("utf-8", "replace"))
            if len(topic) <= CACHED_TOPIC_LENGTH:     # (as the subscription trie's cache)
                if len(self.cache) >= CACHE_LIMIT:
                    self.cache.clear()
                self.cache[topic] = entry
        best = -1
        for since, qos in entry:
            if offset >= since and qos > best:
                best = qos
        return best

    def left_offline(self, offset: int, published: int) -> bool:
        """Whether the record at ``offset``, published at QoS ``published`` and taken at QoS
        0, is not sent (``queue_qos0_messages`` off): it came while the session was offline,
        as Mosquitto keeps no QoS 0 message for an offline session. In a range the session
        changed its filters after (SUBSCRIBE again, UNSUBSCRIBE), the QoS they granted then
        is not known: a record published at QoS 1/2 there goes at QoS 0 (MQTT-3.8.4-3: the
        flow of publications is not interrupted)."""
        for start, end in self.offline:
            if offset >= start and (end is None or offset < end):
                return not published or end is None or end > self.resubscribed
        return False

    def went_offline(self, head: int) -> None:
        self.drop_run()
        if self.held:   # log offsets only, as the session's queue (core.sessions)
            self.held = [(at, as_stored(ref), qos, retain) for at, ref, qos, retain in self.held]
        ranges = self.offline
        if ranges is None:
            ranges = self.offline = []
        ranges[:] = [r for r in ranges if r[1] is None or r[1] > self.offset]
        if len(ranges) >= OFFLINE_RANGES:
            del ranges[0]
        ranges.append([head, None])

    def came_back(self, head: int) -> None:
        ranges = self.offline
        if ranges and ranges[-1][1] is None:
            ranges[-1][1] = head
            if ranges[-1][0] >= head:
                ranges.pop()    # offline for no record (a takeover): nothing to decide


def _decision(session, since: dict | None, name: str) -> tuple:
    """What ``Cursor.granted`` needs of ``session``'s filters matching ``name``: (the offset
    a filter counts from, the QoS it grants) pairs, only those that grant more than every
    filter counting from no later (so at most one for each QoS), by offset."""
    subscriptions = session.subscriptions
    matches = matching_filters(session, name)
    if not since:
        return ((0, max(subscriptions[f] for f in matches)),) if matches else ()
    pairs = sorted((since.get(f, 0) if since else 0, -subscriptions[f])
                   for f in matches)
    entry = []
    best = -1
    for offset, qos in pairs:
        if -qos > best:
            best = -qos
            entry.append((offset, best))
    return tuple(entry)


def needed_from(session, offset: int, first: int, whole_queue: bool = True) -> int:
    """The oldest log offset ``session`` still needs: ``offset`` (where its cursor reads
    on), or an older message in its queue or window that the log still holds (from
    ``first``: a retained message queued at SUBSCRIBE may be older than the log).
    ``whole_queue`` False: of the queue, its first entry only (the queue of a session in
    step is in log order but for retained copies, which the retained store keeps; a long
    queue of each of many sessions is not walked every second)."""
    floor = offset
    queue = session.queue
    for ref, _, _ in (queue if whole_queue or len(queue) < 2 else (queue[0],)):
        if ref.offset is not None and first <= ref.offset < floor:
            floor = ref.offset
    for entry in session.inflight.values():
        ref = entry.message
        if ref.offset is not None and first <= ref.offset < floor:
            floor = ref.offset
    return floor
