"""The broker's deadline heap: keepalive and CONNECT timeouts, and the broker's own timers.

Keepalive and CONNECT timeouts live in one deadline heap with at most one
live entry per client; an entry that comes due early (the client was active since)
is pushed back to its real deadline, so no pass ever scans all clients. The
same heap runs ``Timer``s: throttled clients' resumes, the memory check, topic
expiry, and the server's own (admin idle, metrics, listener wake-ups). The
server layer calls ``tick`` when ``next_deadline`` comes due; ``tick`` also runs
the $SYS report and the periodic maintenance (log housekeeping, retrying a
failing disk, snapshots).

An entry is a two-item list ``[due, owner]``, and the owner (a client or a
``Timer``) knows its live entry (``timer_entry``). A client that closes leaves
the heap at once (``unschedule``): its entry's owner becomes ``DEAD``, so the
heap no longer holds the client (a keepalive of 65535 s would otherwise keep a
closed connection's objects for 27 hours), and when dead entries are more than
half of the heap it is rebuilt without them, so they cost at most as many
small lists as there are live entries.
"""

from __future__ import annotations

import heapq
import logging

from edgebroker.core.limits import PEER_LOG_PERIOD
from edgebroker.core.persistence import SNAPSHOT_DEBOUNCE, SNAPSHOT_EVERY

log = logging.getLogger("edgebroker.broker")

# Seconds between memory checks (RSS and CPU time through psutil).
HOUSEKEEPING_INTERVAL = 1.0

# Housekeeping cadence (log retention and rolling, retrying a failing disk,
# snapshots), in seconds of the broker's clock.
MAINTENANCE_INTERVAL = 1.0


class _Dead:
    """The owner of a heap entry whose client or ``Timer`` left the heap."""

    __slots__ = ()
    closed = True

    def __lt__(self, other) -> bool:
        return id(self) < id(other)  # equal deadlines in the heap (see Client.__lt__)

    def __repr__(self) -> str:
        return "DEAD"


DEAD = _Dead()


class Timer:
    """A callback run once at ``when`` by the broker's deadline heap.

    It follows the heap's protocol (``deadline``, ``expire``, ``closed``,
    ``timer_entry``), so timers and clients share one heap and one ``tick``.
    """

    __slots__ = ("when", "callback", "timer_entry", "closed", "heap")

    def __init__(self, callback):
        self.callback = callback
        self.when: float | None = None
        self.timer_entry: list | None = None
        self.closed = False
        self.heap = None        # the broker whose heap it was started in

    def __lt__(self, other) -> bool:
        return id(self) < id(other)  # equal deadlines in the heap (see Client.__lt__)

    def start(self, broker, when: float) -> None:
        self.when = when
        self.heap = broker
        broker.schedule(self)

    def cancel(self) -> None:
        """Not to run: it leaves the heap at once (with what its callback holds)."""
        self.when = None
        if self.timer_entry is not None:
            self.heap.unschedule(self)

    @property
    def pending(self) -> bool:
        return self.when is not None

    def deadline(self) -> float | None:
        return self.when

    def expire(self) -> None:
        self.when = None
        self.callback()


class Timers:
    """The heap's part of ``Broker`` (a mixin over the broker's state)."""

    def _init_timers(self) -> None:
        """The heap and the broker's own timers (once ``started``, ``limits`` and ``memory``
        are set)."""
        self._timers: list = []  # [due, client or Timer or DEAD]; equal dues ordered by __lt__
        self._timers_dead = 0    # entries whose owner is DEAD
        self._housekeeping = Timer(self._on_housekeeping)
        self._housekeeping.start(self, self.started + HOUSEKEEPING_INTERVAL)
        self._topic_expiry = Timer(self._on_topic_expiry)
        self._topic_expiry.start(self, self.started + self.limits.topic_expiry)
        self._peer_log_period = Timer(self._on_peer_log_period)
        self._peer_log_period.start(self, self.started + self._peer_log_every())
        self._maintenance_due = self.started + MAINTENANCE_INTERVAL

    def schedule(self, client) -> None:
        """Put a client (or a ``Timer``) in the heap at its ``deadline()``, unless it is there
        earlier (an entry due later is replaced)."""
        due = client.deadline()
        if due is None:
            return
        entry = client.timer_entry
        if entry is not None:
            if entry[0] <= due:
                return
            entry[1] = DEAD
            self._timers_dead += 1
        client.timer_entry = entry = [due, client]
        heapq.heappush(self._timers, entry)

    def unschedule(self, client) -> None:
        """Take a closed client (or a ``Timer``) out of the heap: its entry no longer refers
        to it; the heap is rebuilt without such entries once they are more than half of it."""
        entry = client.timer_entry
        if entry is None:
            return
        client.timer_entry = None
        entry[1] = DEAD
        self._timers_dead = dead = self._timers_dead + 1
        timers = self._timers
        if dead * 2 > len(timers):
            # In place: tick may be going through this very list.
            timers[:] = [e for e in timers if e[1] is not DEAD]
            heapq.heapify(timers)
            self._timers_dead = 0

    def timer_figures(self) -> tuple[int, int]:
        """(entries in the heap, entries whose client or timer left it)."""
        return len(self._timers), self._timers_dead

    def next_deadline(self) -> float:
        due = self._maintenance_due
        if self.sys.next_due is not None and self.sys.next_due < due:
            due = self.sys.next_due
        if self._timers and self._timers[0][0] < due:
            return self._timers[0][0]
        return due

    def tick(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            entry = heapq.heappop(timers)
            client = entry[1]
            if client is DEAD:
                self._timers_dead -= 1
                continue
            client.timer_entry = None
            if client.closed:
                continue
            due = client.deadline()
            if due is None:
                continue
            if due <= now:
                try:
                    client.expire()
                except Exception:
                    log.exception("internal error expiring %s", client.callback
                                  if type(client) is Timer else client.describe())
            else:
                entry[0] = due
                client.timer_entry = entry
                heapq.heappush(timers, entry)
        if self.sys.next_due is not None and self.sys.next_due <= now:
            self.sys.publish(now)
        if self._maintenance_due <= now:
            self._maintenance_due = now + MAINTENANCE_INTERVAL
            self._maintain(now)

    def _maintain(self, now: float) -> None:
        journal = self.journal
        if journal is not None:
            journal.watch_clock()
            if journal.retry():
                # Writes work again: the acknowledgements it released go out in this pass,
                # and sessions behind read what could not be written.
                self.prompt = True
                self.resume_behind()
            # Cursors first: they hold segments from age retention (a gap retention made in
            # this call is seen by the next one, or by the session's next read).
            self.check_cursors(now)
            self.check_shared_cursors()
            for consumer in self.log_consumers:
                hold = consumer.hold()
                if hold < journal.log.hold_offset:
                    journal.log.hold_offset = hold
            wanted = self.hold_for_snapshot(journal.log, now)
            try:
                journal.log.housekeeping()
            except Exception:
                log.exception("commit log housekeeping failed")
            self.count_unsaved(journal.log)
        else:
            wanted = False
        if self.submit_snapshot is None:
            return
        next_offset = journal.log.next_offset if journal is not None else 0
        exchanges = self.exchanges
        # (retained changes too many to list: the snapshot takes every retained message)
        # A failed snapshot is tried again each second, with nothing changed too; not while a
        # restart's unclaimed QoS 2 ids are carried (each try would write them in a new
        # journal file, which a failed snapshot leaves: one file a second).
        writer = self.snapshot_writer
        dirty = (self._snapshot_dirty or wanted or self.retained.all_changed
                 or writer is not None and writer.failing and self.orphan_ids is None)
        if ((dirty and now - self._snapshot_at >= SNAPSHOT_DEBOUNCE)
                or (next_offset != self._snapshot_offset and now - self._snapshot_at >= SNAPSHOT_EVERY)
                or exchanges is not None and exchanges.full):
            self.submit_snapshot(self.capture())
            self._snapshot_at = now

    def _on_housekeeping(self) -> None:
        now = self.clock()
        self._housekeeping.start(self, now + HOUSEKEEPING_INTERVAL)
        self.rate_debts.prune(now)
        self.events.flush(now)      # repeats whose period ended with no event to say them
        guard = self.memory
        kept = guard.kept
        changed = guard.check()
        if changed is True and kept:
            why = (f"is past {guard.ceiling()} bytes, twice the limit" if kept < guard.ceiling()
                   < guard.rss else
                   f"grew past the {kept} bytes kept after the last peak by over {guard.margin()}"
                   if guard.rss > kept + guard.margin() else
                   f"the broker holds {guard.blocks} allocated blocks, as many as at the last "
                   f"peak ({guard.blocks_peak})")
            log.warning("memory use %d bytes is above memory_limit (%d) and %s: refusing new "
                        "connections and new topics and subscriptions again", guard.rss,
                        guard.limit, why)
        elif changed is True:
            log.warning("memory use %d bytes is above memory_limit (%d): refusing new connections "
                        "and new topics and subscriptions until it falls below", guard.rss,
                        guard.limit)
        elif changed is False and guard.kept:
            log.warning("memory use %d bytes is above memory_limit (%d) but is memory kept after "
                        "a peak of %d: the broker holds %d allocated blocks, down from %d then "
                        "(%d before it); accepting new connections, topics and subscriptions "
                        "again until memory grows %d bytes past it or holds as much as at the "
                        "peak", guard.rss, guard.limit, guard.peak, guard.blocks,
                        guard.blocks_peak, guard.blocks_base, guard.margin())
            if guard.kept > guard.ceiling():
                log.warning("memory kept after the peak, %d bytes, is past twice memory_limit "
                            "(%d bytes): Python keeps it for reuse though the broker holds no "
                            "more than before the peak (a restart gives it back; a fast flood "
                            "overshoots a limit by a second's growth)", guard.kept,
                            guard.ceiling())
        elif changed is False and not guard.limit:
            log.warning("memory_limit turned off (memory use %d bytes): accepting new "
                        "connections, topics and subscriptions again", guard.rss)
        elif changed is False:
            log.warning("memory use %d bytes is below memory_limit (%d) again: accepting new "
                        "connections, topics and subscriptions", self.memory.rss,
                        self.memory.limit)

    def _peer_log_every(self) -> float:
        """Seconds between the peer log's summaries (core.limits.PeerLog; 0: it counts nothing,
        and is looked at once a minute)."""
        return self.peer_log.period or PEER_LOG_PERIOD

    def _on_peer_log_period(self) -> None:
        now = self.clock()
        self._peer_log_period.start(self, now + self._peer_log_every())
        self.peer_log.flush(now)

    def flush_logs(self, now: float) -> None:
        """At shutdown: what the rate-limited logs only counted so far (the peer log's counts,
        the repeats of broker-wide events), and the counts cursors keep to log when they
        catch up (core.catchup, core.shared_backlog)."""
        self.peer_log.flush(now)
        self.events.flush(now, final=True)
        self.log_counts_at_stop()
        self.log_shared_counts_at_stop()

    def _on_topic_expiry(self) -> None:
        now = self.clock()
        self._topic_expiry.start(self, now + self.limits.topic_expiry)
        forgotten = self.topics.rotate(self.has_retained)
        self.known_topics = self.topics.current
        if forgotten:
            log.debug("forgot %d topics idle for over topic_expiry (%g s)", forgotten,
                      self.limits.topic_expiry)
