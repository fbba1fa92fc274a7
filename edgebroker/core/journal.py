"""The broker's side of the commit log: append, gate acknowledgements, ride out disk trouble.

Every accepted PUBLISH is appended to the log before it is routed. Appends
only buffer; ``end_pass`` hands a whole loop pass of records to the OS in one
write. A QoS 1/2 acknowledgement (PUBACK, PUBREC) waits in ``_acks`` until its
record is safe under the ``durability`` setting:

- ``none``  once written to the OS (the same loop pass);
- ``batch`` once written to the OS too; the flusher thread fsyncs at most
  ``flush_interval_ms`` later, which bounds what a power cut can take;
- ``sync``  once the flusher's fsync right after the write covers it.

Acknowledgements are released in offset order, which is also the order the
PUBLISH packets arrived in (MQTT-4.6.0-2 and -3).

When the disk is full or failing, records stay in memory (bounded by the log's
``max_pending_bytes``) and are retried every second. Meanwhile nothing can be
acknowledged, and a client that publishes at QoS 1/2 is no longer read (TCP
back-pressure) until writes work again; QoS 0 messages are still routed to
live subscribers but not logged (counted). A broker started on a full disk
runs the same way (the log opens without the room it would allocate ahead).
At a stop while failing, the server gives the write a bounded time
(``CommitLog.write_before_stop``); ``retry`` then releases what it wrote.
"""

from __future__ import annotations

import logging
from collections import deque

from edgebroker.commitlog.errors import LogFullError, LogWriteError

log = logging.getLogger("edgebroker.journal")


# A jump of the wall clock against the steady one past this is a step (not a slew, nor a loop
# pass's time between the two readings); the most steps remembered (a record logged before
# the oldest one forgotten is off by that step).
STEP_MS = 2000
MAX_STEPS = 64


class Journal:
    def __init__(self, commit_log, durability: str, wall_ms, stats, clock):
        self.log = commit_log
        self.durability = durability
        self.wall_ms = wall_ms
        # The wall clock (the records' time stamps) less the broker's steady clock, in ms, as
        # last seen; the log's next offset and the wall clock's reading at that look; and the
        # steps of the wall clock seen in this run: (the log's next offset at the look before
        # the step, that at the look that saw it, the time stamp that tells the records logged
        # between the two apart, the step in ms) (``logged_ago``).
        self._clock = clock
        self._offset = wall_ms() - int(clock() * 1000)
        self._seen = (commit_log.next_offset, wall_ms())
        self._steps: list[tuple[int, int, int, int]] = []
        self.stats = stats
        self.failing = False
        # The flusher thread (set by the server): told after records reach the OS; its fsync
        # counters are reported in the stats.
        self.flusher = None
        self._acks: deque = deque()          # (offset, client, frame), offsets ascending
        # Which offset releases acknowledgements: the written one, or (sync) the fsynced one.
        self._after_fsync = durability == "sync"
        self._gate = commit_log.durable_offset if self._after_fsync else commit_log.written_offset
        self._paused: set = set()            # clients not read while the log cannot write
        # The QoS 2 exchange journal (core.exchanges), written before each log write: a
        # received QoS 2 message's record never reaches the disk before its packet id does.
        self.exchanges = None

    def logged_ago(self, timestamp_ms: int, offset: int) -> int:
        """Milliseconds since the record at ``offset`` stamped ``timestamp_ms`` was logged, as
        its Message Expiry counts them: the wall-clock difference (the wall clock read now),
        less each step of the wall clock seen in this run after the record was logged (NTP
        after the boot of a gateway without a real-time clock ages no record; a clock put
        back keeps none young). Which records came before a step is told by their offsets
        (the wall clock may give the same time stamps twice), and for those logged between
        the look before the step and the one that saw it, by their time stamps. Steps before
        this run's start cannot be told from time passing. Never negative."""
        ago = self.watch_clock() - timestamp_ms
        for lo, hi, split, step in self._steps:
            if offset < lo or offset < hi and (timestamp_ms < split if step > 0
                                               else timestamp_ms >= split):
                ago -= step
        return ago if ago > 0 else 0

    def watch_clock(self) -> int:
        """Note a step of the wall clock against the steady one (more than STEP_MS since the
        last look: ``logged_ago``, and the broker's maintenance every second), both read now
        (not a loop pass's time, which a long pass would make look like a step); the wall
        clock's reading (ms)."""
        steady = int(self._clock() * 1000)
        wall_ms = self.wall_ms()
        offset = wall_ms - steady
        step = offset - self._offset
        next_offset = self.log.next_offset
        if step > STEP_MS or step < -STEP_MS:
            # Records logged since the last look: those before the step are stamped from the
            # last look's reading on, those after it from that reading plus the step on (the
            # step is larger than the time between two looks: ranges apart).
            lo, last_wall = self._seen
            steps = self._steps
            if lo == next_offset and steps and steps[-1][0] == steps[-1][1] == lo:
                # Nothing logged since the step before, nor around it: one step of both (a
                # clock flapping on an idle broker keeps one, or none once put right).
                step += steps.pop()[3]
            if step:
                steps.append((lo, next_offset, last_wall + step if step > 0 else last_wall,
                              step))
                del steps[:-MAX_STEPS]
        self._offset = offset
        self._seen = (next_offset, wall_ms)
        return wall_ms

    @property
    def safe_offset(self) -> int:
        """Records below it are safe under ``durability``: their acknowledgements may go."""
        return self._gate

    @property
    def acks_waiting(self) -> int:
        return len(self._acks)

    def append(self, client, topic_bytes: bytes, payload: bytes, qos: int, retain: bool,
               properties: bytes = b"") -> int | None:
        """Log one message; its offset, or None when it is not logged. ``properties``: its
        MQTT 5.0 properties as the log keeps them (``core.mqtt5.logged``), b"" for none.

        Raises LogFullError when a QoS 1/2 message cannot be held (the disk has
        been failing for a while); the caller must then neither route nor
        acknowledge it.
        """
        if self.failing:
            if qos == 0:
                self.stats.publish_not_logged += 1
                return None
            self.pause(client)
        client_id = client.client_id_bytes if client is not None else b""
        try:
            return self.log.append(self.wall_ms(), qos, retain, client_id, topic_bytes, payload,
                                   properties)
        except LogFullError:
            if qos == 0:
                self.stats.publish_not_logged += 1
                return None
            self.stats.publish_refused += 1
            self.pause(client)
            raise

    def acknowledge(self, client, offset: int | None, frame: bytes) -> None:
        """Send ``frame`` once ``offset`` is safe (at once for messages not logged)."""
        if offset is None:
            # Not logged, but it must not overtake earlier acknowledgements.
            if not self._acks:
                client.transport.write(frame)
                return
            offset = self._acks[-1][0]
        if offset < self._gate and not self._acks:
            client.transport.write(frame)
        else:
            self._acks.append((offset, client, frame))

    def durable(self, offset: int) -> bool:
        """The flusher made everything below ``offset`` durable; True when that released
        acknowledgements (publishers wait for them: the loop sends them at once)."""
        return self._after_fsync and self._release(offset)

    def _release(self, gate: int) -> bool:
        if gate <= self._gate:
            return False
        self._gate = gate
        if self.exchanges is not None and self.exchanges.unsafe:
            self.exchanges.settled(gate)
        acks = self._acks
        released = bool(acks) and acks[0][0] < gate
        while acks and acks[0][0] < gate:
            _, client, frame = acks.popleft()
            if not client.closed:
                client.transport.write(frame)
        return released

    def end_pass(self) -> None:
        """Write the records appended so far to the OS in one go: the loop calls it before it
        sends (see ``Loop.run``), and sending a message from the log calls it when that
        message's record is still in memory."""
        if self.failing or not self.log.pending_bytes:
            return
        exchanges = self.exchanges
        if exchanges is not None and exchanges.lines:
            exchanges.write()
        self._write()

    def _write(self) -> bool:
        try:
            written = self.log.write_pending()
        except LogWriteError as exc:
            if not self.failing:
                self.failing = True
                self.stats.log_write_failures += 1
                # Whoever is waiting for an acknowledgement published what could not be written.
                for _, client, _ in self._acks:
                    self.pause(client)
                log.error("commit log cannot write (%s): QoS 1/2 publishers are not read and not "
                          "acknowledged until it can; QoS 0 goes on unlogged; retrying every second",
                          exc)
            return False
        if self.flusher is not None:
            self.flusher.notify_written()
        if not self._after_fsync:
            self._release(written)
        return True

    def retry(self) -> bool:
        """Called every second: while failing, try the pending write again. True when writes
        work again (acknowledgements may have been released, paused publishers resumed)."""
        if not self.failing:
            return False
        if self.log.pending_bytes and not self._write():
            return False
        if not self._after_fsync:  # (written by the log's own retry at a stop)
            self._release(self.log.written_offset)
        self.failing = False
        paused, self._paused = self._paused, set()
        log.warning("commit log writes work again; resuming %d paused publishers", len(paused))
        for client in paused:
            if not client.closed:
                client.read_again("log")
        return True

    def figures(self) -> dict:
        """The log's side of the stats: offsets, acknowledgements waiting, fsyncs."""
        cl, flusher = self.log, self.flusher
        return {"durability": self.durability, "next_offset": cl.next_offset,
                "written_offset": cl.written_offset, "durable_offset": cl.durable_offset,
                "pending_bytes": cl.pending_bytes, "writes": cl.counters.writes,
                "acks_waiting": len(self._acks),
                "writing": not self.failing, "retention_waits": cl.retention_waits,
                "fsyncs": flusher.syncs if flusher is not None else 0,
                "fsync_errors": flusher.errors if flusher is not None else 0,
                "damaged_regions": cl.counters.corrupt_regions}

    def forget(self, client) -> None:
        """A closed client: no longer one to resume (its waiting acknowledgements are
        skipped when they come due)."""
        if self._paused:
            self._paused.discard(client)

    def pause(self, client) -> None:
        if client is not None and client not in self._paused and not client.closed:
            self._paused.add(client)
            client.stop_reading("log")
            self.stats.publishers_paused += 1
