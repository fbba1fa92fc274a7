"""Catching up in runs: a session behind with one subscription sends the log's records with
nothing made per record.

``CatchUp.refill`` hands what ``CommitLog.read_run`` found to ``_take_run``: the scanner's
entries over one chunk become the cursor's ``Run``, and ``send_run`` builds the PUBLISH
frames of what the window and the connection take with one native call
(``_native.publish_frames``) and one write per piece (WINDOW_PIECES). Runs are for 3.1.1
subscribers and records without properties (core.catchup says when); everything else goes
through ``refill``'s batches.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

from edgebroker import _native
from edgebroker.commitlog.format import RECORD_HEADER_SIZE
from edgebroker.core.session import EMPTY_DICT, Outgoing, Stored

# A window's worth of QoS 1/2 messages (of a run here, of a queue in Router.pump) is
# written in this many pieces, each but the one that fills the window sent at once (the
# last goes with the loop pass's flush): the subscriber starts on the first while
# the broker makes the next, and acknowledges in pieces too, so the two keep working side
# by side rather than taking turns (a window of 20 at the default: about 1.1-1.3x the drain
# rate of one write per window on a 2-core VM, bench/RESULTS.md).
WINDOW_PIECES = 3


def piece_of(window: int) -> int:
    """QoS 1/2 messages per piece of a window (WINDOW_PIECES)."""
    return -(-window // WINDOW_PIECES)


def lag_cut(commit_log, items, lo: int, hi: int, bound: int, offset_of=None) -> int:
    """The index of the first of ``items[lo:hi]`` (ascending offsets, or records with
    ``offset_of``) that a reader may take no more than ``bound`` bytes behind the end of the
    log (``hi`` if none): max_lag_bytes skips QoS 0 before it only. A binary search, a few
    ``bytes_after`` calls per batch and only while a session is behind that far."""
    bytes_after = commit_log.bytes_after
    while lo < hi:
        mid = (lo + hi) // 2
        item = items[mid]
        if bytes_after(item if offset_of is None else offset_of(item)) > bound:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Run:
    """Records a session catching up read from the log and has not all been sent yet: the
    scanner's entries (``_native.scan``) for the records of one chunk of a segment that match
    its one subscription, over the chunk itself (``data``, from file position ``base``). Nothing
    is made per record until it is sent; then ``Broker.send_run`` builds the PUBLISH frames
    of what the window and the connection take, one native call
    (``_native.publish_frames``) and one write per piece. Held on ``Cursor.run``; the
    cursor's offset is already past it (as past the records of a batch in the session's
    queue)."""

    __slots__ = ("data", "base", "entries", "n", "i", "offsets", "metas", "lengths", "times",
                 "qos", "pids", "top", "skip_offline", "drop_qos0", "too_old")

    def __init__(self, data, base: int, entries, n: int, top: int):
        self.data = data
        self.base = base
        self.entries = entries
        self.n = n                    # records in the run
        self.i = 0                    # the first not yet sent
        words = _native.SCAN_ENTRY_WORDS
        self.offsets = entries[0::words]
        self.times = entries[1::words]
        self.lengths = entries[3::words]
        self.metas = entries[4::words]
        self.qos = bytearray(n)       # per record as sent: 0-2, or 255 (skipped)
        self.pids = array("H", bytes(2 * n))  # packet ids as sent (QoS 1 and 2)
        self.top = top                # the QoS the subscription granted
        # Records taken at QoS 0: skipped silently when published while the session was
        # offline (skip_offline, see Cursor.left_offline), as dropped past max_lag (counted).
        self.skip_offline = False
        self.drop_qos0 = False
        self.too_old = -1


def waiting(session) -> int:
    """Messages ``session`` holds for its client beyond the window: its queue, what its
    cursor read from the log and has not sent (its run), and the retained copies it holds."""
    cursor = session.cursor
    if cursor is None:
        return len(session.queue)
    run = cursor.run
    return (len(session.queue) + (run.n - run.i if run is not None else 0)
            + (len(cursor.held) if cursor.held else 0))




class CatchUpRuns:
    """Runs' part of ``Broker`` (a mixin over the broker's state, beside ``CatchUp``)."""

    def _take_run(self, session, found: tuple, head: int, top: int) -> bool:
        """``refill`` with what ``CommitLog.read_run`` found: the run becomes the cursor's
        (records from ``head`` on are left to live routing). As ``refill``'s result."""
        cursor = session.cursor
        commit_log = self.journal.log
        found_run, next_offset = found
        if next_offset > head:
            next_offset = head
        if next_offset <= cursor.offset:
            self._skip(session, commit_log.written_offset, "the log cannot be read there")
            return True
        self.count_missing(session, cursor.offset, next_offset)
        run = None
        if found_run is not None:
            data, base, entries, n = found_run
            run = Run(data, base, entries, n, top)
            if run.offsets[n - 1] >= head:
                run.n = bisect_left(run.offsets, head, 0, n)
            if run.n:
                limits = self.limits
                lag_bytes = limits.max_lag_bytes
                if lag_bytes and commit_log.bytes_after(cursor.offset) > lag_bytes:
                    # QoS 0 skipped only up to where it is within max_lag_bytes of the end:
                    # the run ends there (what follows is read again, without skipping).
                    cut = lag_cut(commit_log, run.offsets, 0, run.n, lag_bytes)
                    if cut:
                        run.drop_qos0 = True
                        if cut < run.n:
                            run.n, next_offset = cut, run.offsets[cut]
                max_age = limits.max_lag_age
                if max_age:
                    run.too_old = self.journal.wall_ms() - int(max_age * 1000)
                run.skip_offline = bool(cursor.offline) and not (limits.queue_qos0_messages
                                                                 and not session.clean)
                cursor.run = run
            else:
                run = None
        cursor.offset = next_offset
        if not session.clean:
            self._snapshot_dirty = True   # a restart goes on from here
        if run is not None:
            return True
        if next_offset >= head:
            self._caught_up(session)
            return True
        # A long stretch of records it does not take: go on in the next pass.
        self._catch_up_again.add(session)
        if not self._catch_up_timer.pending:
            self._catch_up_timer.start(self, self.clock())
        return False

    def send_run(self, session, run: Run) -> bool:
        """Send what the window and the connection take of ``run`` (the client is online and
        its queue empty): the PUBLISH frames of each piece (WINDOW_PIECES) in one write, each
        sent at once but the one that fills the window. True when all of the run is sent (or
        let go of: the session has an ACL now)."""
        if session.acl is not None:
            # An ACL came after the run was read (a reload): what is left of it is read
            # again through ``refill``'s batches, which check it (nothing is lost: the
            # cursor goes back to the first record not sent).
            session.cursor.drop_run()
            return True
        client = session.client
        transport = client.transport
        limits = self.limits
        window = limits.max_inflight_messages
        window_bytes = limits.max_inflight_bytes
        piece = piece_of(window)
        inflight = session.inflight
        if inflight is EMPTY_DICT:
            inflight = session.own_inflight()
        held = was_held = len(inflight)
        held_bytes = session.inflight_bytes
        room = transport.max_pending - transport.out_bytes
        i = run.i
        n = run.n
        offsets, metas, lengths = run.offsets, run.metas, run.lengths
        qos, pids, top = run.qos, run.pids, run.top
        pid = session._next_id
        journal_qos2 = not session.clean and self.exchanges is not None
        hdr = RECORD_HEADER_SIZE
        lagging = maybe_sent = 0
        unsure_to = session.cursor.unsure_to
        while True:
            first = i
            sent = 0
            end = held + piece
            while i < n:
                meta = metas[i]
                q = meta & 3
                if q > top:
                    q = top
                size = lengths[i] - hdr - (meta >> 8 & 0xFFFF)
                if q:
                    if (held >= window or held_bytes >= window_bytes and held or room <= 0
                            or held >= end):
                        break
                    while True:      # the next packet id not in use (Session.allocate_id)
                        pid = pid + 1 if pid < 65535 else 1
                        if pid not in inflight:
                            break
                    inflight[pid] = Outgoing(Stored(offsets[i], size), q, False)
                    held += 1
                    held_bytes += size
                    pids[i] = pid
                    if q == 2 and journal_qos2:
                        self.exchanges.sent(session.client_id, pid, offsets[i], size, False)
                elif (offsets[i] < unsure_to or run.skip_offline
                        and session.cursor.left_offline(offsets[i], meta & 3)
                        or run.drop_qos0 or run.times[i] < run.too_old):
                    # As refill: perhaps sent before a crash, taken at QoS 0 and published
                    # while the session was offline (not kept), or past max_lag (counted).
                    if offsets[i] < unsure_to:
                        maybe_sent += 1
                    elif not (run.skip_offline
                              and session.cursor.left_offline(offsets[i], meta & 3)):
                        lagging += 1
                    qos[i] = 255
                    i += 1
                    continue
                elif room <= 0:
                    break
                qos[i] = q
                room -= size
                sent += 1
                i += 1
            session._next_id = pid
            session.inflight_bytes = held_bytes
            run.i = i
            if i == first:
                break
            if not session.clean:
                self._snapshot_dirty = True   # the snapshot's cursor (Cursor.unsent) moved
            if not sent:
                continue        # only records skipped
            entries = run.entries
            words = _native.SCAN_ENTRY_WORDS
            start, last = first * words, (i - 1) * words
            # Every frame is shorter than its record: the records' span is room enough.
            frames = _native.publish_frames(run.data, run.base, entries, first, i - first, qos,
                                            pids, entries[last + 2] + entries[last + 3]
                                            - entries[start + 2])
            transport.write(frames)
            transport.count_publish(sent)
            self.stats.publish_sent += sent
            self.prompt = True
            if held > was_held:
                self.awaiting_acks = transport    # see server.loop.BusyPoll
            if i >= n or held < end or held >= window or room <= 0:
                break           # the run, the window or the connection's room ends here
            transport.send_now()
            room = transport.max_pending - transport.out_bytes
        if lagging:
            self._lag_drop(session, lagging, run.drop_qos0)
        if maybe_sent:
            self.drop("restart_qos0", session, maybe_sent)
        if room <= 0:
            transport.wait_for_drain()
        return i >= n
