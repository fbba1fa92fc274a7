"""A session's cursor: where a session behind reads the commit log from (core.catchup), and
what it needs to read it — the filters subscribed while behind, the offset ranges it was
offline in, a cache of topic decisions, the records read and not yet sent, the retained
copies held for SUBSCRIBEs made while behind (core.retained), and what a crash left it unsure
of."""

from __future__ import annotations

from edgebroker.core.filter_set import matching_filters
from edgebroker.core.session import as_stored
from edgebroker.mqtt.topics import topic_matches
from edgebroker.mqtt.trie import CACHED_TOPIC_LENGTH

# Topic decisions cached per session behind (dropped wholesale beyond it; topics of up to
# CACHED_TOPIC_LENGTH bytes). A decision holds at most three (since, QoS) pairs whatever the
# number of matching filters (``Cursor.granted``): about 110 KB a session with 40-byte topics,
# 330 KB with 256-byte ones (docs/limits.md, "Memory"). (Each matching filter whose QoS was
# lowered while behind, ``Cursor.lowered``, adds at most three more.)
CACHE_LIMIT = 1024
# Offline ranges kept per session (the oldest goes first: its QoS 0 is then sent after all).
OFFLINE_RANGES = 8
# Option changes kept per filter while behind (``Cursor.kept5``; the oldest goes first: the
# records below it are then decided with the next one's options).
KEPT_OPTIONS = 4
# Filters unsubscribed while behind kept per session (``Cursor.owed``); past it the two oldest
# become one for any topic (ANY): a QoS 1/2 record below its end is then owed whatever its
# topic (it errs on sending).
OWED_FILTERS = 8
ANY = ""        # (no topic filter is empty)


class Cursor:
    """Where a session behind reads the log from, and what it needs to read it."""

    __slots__ = ("offset", "floor", "since", "offline", "cache", "lag_dropped", "aged", "gone",
                 "done", "run", "held", "unsure_to", "resubscribed", "lowered", "kept5", "owed")

    def __init__(self, offset: int, floor: int):
        self.offset = offset       # the first log offset not yet read for the session
        self.floor = floor         # the oldest offset it still needs (its queue and window too)
        self.since: dict[str, int] | None = None    # filter -> offset it was subscribed at
        self.offline: list[list] | None = None      # [from, to or None] offset ranges
        self.cache: dict[bytes, tuple] = {}          # topic -> ((since, qos), ...): granted
        self.lag_dropped = 0       # QoS 0 skipped past max_lag in the current episode
        self.aged = -1             # records skipped for max_session_lag_age after the logged
        #                            move (-1: none logged yet)
        self.gone = -1             # the same for retention_bytes (core.retention_moves)
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
        # Filters subscribed again at a lower QoS while behind: filter -> [(offset, QoS)], the
        # QoS it granted the records below that offset (the SUBSCRIBE's), which keep it as in
        # the queue of a session in step; by offset, at most two (each QoS above the filter's
        # own, which a SUBSCRIBE at a higher QoS takes away); None: none.
        self.lowered: dict[str, list[tuple[int, int]]] | None = None
        # Filters whose 5.0 options (No Local, Retain As Published) a SUBSCRIBE changed while
        # behind: filter -> [(offset, options)], the options the records below that offset
        # are decided with, as they were for the queue of a session in step (a message not
        # taken under No Local never became part of its state, MQTT-4.5.0-1); by offset, at
        # most KEPT_OPTIONS; None: none (core.router5.options5_for).
        self.kept5: dict[str, list[tuple[int, int]]] | None = None
        # Filters unsubscribed while behind that granted QoS 1/2 to records not read yet:
        # [(filter, from, up to)], the offsets of the records each granted more than 0 (from
        # its SUBSCRIBE while behind, else 0; up to its UNSUBSCRIBE, or the end of its
        # ``lowered`` steps if it was lowered to 0). A QoS 1/2 record there that the other
        # filters take at QoS 0 was owed at its QoS when published: it is never skipped (nor
        # as perhaps sent before a crash, ``unsure_to``). In the order unsubscribed, at
        # most OWED_FILTERS; None: none.
        self.owed: list[tuple[str, int, int]] | None = None

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
            entry = _decision(session, self.since, self.lowered,
                              topic.decode("utf-8", "replace"))
            if len(topic) <= CACHED_TOPIC_LENGTH:     # (as the subscription trie's cache)
                if len(self.cache) >= CACHE_LIMIT:
                    self.cache.clear()
                self.cache[topic] = entry
        best = -1
        for since, qos in entry:
            if offset < since:
                break
            best = qos
        return best

    def subscribed_again(self, topic_filter: str, old: int, new: int, at: int) -> None:
        """``topic_filter``, held at QoS ``old``, is subscribed again at QoS ``new`` when the
        log's next offset is ``at``: a lower QoS counts only for the records from ``at`` on
        (those before keep ``old``, as a queued message keeps its QoS for a session in step
        and in Mosquitto); a higher one counts for the older records too. The same QoS
        again (paho subscribes at every connect) changes nothing."""
        if new == old:
            return
        self.resubscribed = at            # (left_offline)
        self.cache.clear()
        lowered = self.lowered
        read = self.unsent()
        steps = [(until, qos) for until, qos in (lowered or {}).get(topic_filter, ())
                 if qos > new and until > read]
        if new < old and at > read:
            steps.append((at, old))
        if steps:
            if lowered is None:
                lowered = self.lowered = {}
            lowered[topic_filter] = steps
        elif lowered:
            lowered.pop(topic_filter, None)
            if not lowered:
                self.lowered = None

    def unsubscribed(self, topic_filter: str, qos: int, at: int) -> None:
        """``topic_filter``, held at QoS ``qos``, is unsubscribed when the log's next offset
        is ``at``: it matches no record not read yet. Those it granted QoS 1/2 are owed
        (``owed``): sent at QoS 0 if another filter takes them, also those published while
        the session was offline (``left_offline`` does not apply to them)."""
        self.cache.clear()
        start = self.since.pop(topic_filter, 0) if self.since else 0
        steps = self.lowered.pop(topic_filter, None) if self.lowered else None
        if self.lowered is not None and not self.lowered:
            self.lowered = None
        if self.kept5 and self.kept5.pop(topic_filter, None) and not self.kept5:
            self.kept5 = None
        until = at if qos else steps[-1][0] if steps else 0   # (steps: QoS above 0)
        read = self.unsent()
        if until > start and until > read:
            owed = [entry for entry in self.owed or () if entry[2] > read]
            owed.append((topic_filter, start, until))
            if len(owed) > OWED_FILTERS:
                first, second = owed[0], owed[1]
                owed[:2] = [(ANY, min(first[1], second[1]), max(first[2], second[2]))]
            self.owed = owed

    def owed_at(self, name: str, offset: int) -> bool:
        """Whether the record at ``offset`` on topic ``name``, published at QoS 1/2 and taken
        at QoS 0, was owed at its QoS: a filter unsubscribed since granted it more."""
        for topic_filter, start, until in self.owed:
            if start <= offset < until and (topic_filter == ANY
                                            or topic_matches(topic_filter, name)):
                return True
        return False

    def options_changed(self, topic_filter: str, old: int, at: int) -> None:
        """A SUBSCRIBE changes ``topic_filter``'s 5.0 options (No Local, Retain As Published)
        from ``old`` when the log's next offset is ``at``: the records before it are still
        decided with ``old`` (``kept5``), those from ``at`` on with the new ones."""
        read = self.unsent()
        if at <= read:
            return
        kept = self.kept5
        if kept is None:
            kept = self.kept5 = {}
        steps = [(until, options) for until, options in kept.get(topic_filter, ())
                 if until > read]
        if not steps or steps[-1][0] < at:    # (at the same offset: no record between)
            steps.append((at, old))
        kept[topic_filter] = steps[-KEPT_OPTIONS:]

    def read_past(self) -> None:
        """Forget the lowered QoS, the options kept and the filters owed of records already
        read (``lowered``, ``kept5``, ``owed``): the scanner's run (core.catchup_run), which
        takes one QoS for all, is used again once none is left."""
        read = self.unsent()
        if self.owed is not None:
            self.owed = [entry for entry in self.owed if entry[2] > read] or None
        if self.lowered is not None:
            kept = _unread(self.lowered, read)
            if kept != self.lowered:
                self.cache.clear()
                self.lowered = kept
        if self.kept5 is not None:
            self.kept5 = _unread(self.kept5, read)

    def save_filters(self, state) -> None:
        """Put ``since``, ``lowered``, ``kept5`` and ``owed`` into ``state``
        (core.snapshot.SessionState)."""
        state.since = dict(self.since) if self.since else {}
        if self.owed:
            state.owed = list(self.owed)
        if self.lowered:
            state.lowered = _listed(self.lowered)
        if self.kept5:
            state.kept5 = _listed(self.kept5)

    def restore_filters(self, state, end: int) -> None:
        """Take ``since``, ``lowered``, ``kept5`` and ``owed`` from ``state``, for a log that
        ends at ``end`` (offsets past it were lost to a power cut: the records there now came
        after)."""
        if state.since:
            self.since = {f: min(o, end) for f, o in state.since.items()}
        self.lowered = _steps_from(state.lowered, self.offset, end)
        self.kept5 = _steps_from(state.kept5, self.offset, end)
        self.owed = [(f, start, min(until, end)) for f, start, until in state.owed
                     if min(until, end) > self.offset] or None

    def left_offline(self, offset: int, published: int) -> bool:
        """Whether the record at ``offset``, published at QoS ``published`` and taken at QoS
        0, is not sent (``queue_qos0_messages`` off): it came while the session was offline,
        as Mosquitto keeps no QoS 0 message for an offline session. In a range the session
        subscribed again at another QoS after, the QoS its filters granted then is not known:
        a record published at QoS 1/2 there goes at QoS 0 (MQTT-3.8.4-3: the flow of
        publications is not interrupted; one an unsubscribed filter owed: ``owed``)."""
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


def _unread(steps_by_filter: dict, read: int) -> dict | None:
    """``Cursor.lowered`` or ``Cursor.kept5`` without the steps below ``read``."""
    kept = {}
    for topic_filter, steps in steps_by_filter.items():
        steps = [step for step in steps if step[0] > read]
        if steps:
            kept[topic_filter] = steps
    return kept or None


def _listed(steps_by_filter: dict) -> list:
    """``Cursor.lowered`` or ``Cursor.kept5`` as the snapshot keeps it."""
    return [(f, until, value) for f, steps in sorted(steps_by_filter.items())
            for until, value in steps]


def _steps_from(listed: list, offset: int, end: int) -> dict | None:
    """``_listed`` back, for a cursor at ``offset`` in a log that ends at ``end``."""
    steps_by_filter = {}
    for topic_filter, until, value in listed:
        if min(until, end) > offset:
            steps_by_filter.setdefault(topic_filter, []).append((min(until, end), value))
    return steps_by_filter or None


def kept_options(options: int, steps: list, offset: int) -> int:
    """The 5.0 options a filter with ``options`` and these ``Cursor.kept5`` steps decides
    the record at ``offset`` with."""
    for until, old in steps:
        if offset < until:
            return old
    return options


def kept_qos(qos: int, steps: list, offset: int) -> int:
    """The QoS a filter granting ``qos`` with these ``Cursor.lowered`` steps grants the
    record at ``offset``."""
    for until, old in steps:
        if offset < until:
            return old if old > qos else qos
    return qos


def _decision(session, since: dict | None, lowered: dict | None, name: str) -> tuple:
    """What ``Cursor.granted`` needs of ``session``'s filters matching ``name``: (the offset
    from which, the QoS granted) pairs, by offset, each up to the next one. Without lowered
    filters these are only those that grant more than every filter counting from no later
    (so at most one for each QoS)."""
    subscriptions = session.subscriptions
    matches = matching_filters(session, name)
    if lowered and any(f in lowered for f in matches):
        return _steps(subscriptions, since, lowered, matches)
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


def _steps(subscriptions, since: dict | None, lowered: dict, matches) -> tuple:
    """``_decision`` when a matching filter was lowered while behind: the QoS granted is no
    longer higher the later the record, so each change of it is a pair."""
    spans = []            # (from, up to or None, QoS)
    for f in matches:
        start = since.get(f, 0) if since else 0
        spans.append((start, None, subscriptions[f]))
        spans.extend((start, until, qos) for until, qos in lowered.get(f, ()) if until > start)
    entry = []
    for point in sorted({s for s, _, _ in spans} | {u for _, u, _ in spans if u is not None}):
        qos = max((q for s, u, q in spans if s <= point and (u is None or point < u)),
                  default=-1)
        if entry and entry[-1][1] == qos or not entry and qos < 0:
            continue
        entry.append((point, qos))
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
