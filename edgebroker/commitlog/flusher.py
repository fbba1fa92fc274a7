"""The flusher thread: applies the fsync policy to the commit log, off the core thread.

``durability``:

* ``"sync"``: fsync as soon as the core says something was written (``notify_written``); writes
  that arrive during an fsync are covered by the next one (group commit).
* ``"batch"``: fsync when something was written, at most once per ``flush_interval_ms``: the first
  write after a quiet spell is synced at once, later ones wait for the interval.
* ``"none"``: never fsync for the sake of acknowledgements; the OS writes pages back on its own.
  Rolled (sealed) segments are still fsynced, once each, so that what the uploader ships and what
  the next start skips scanning is on disk; and ``stop()`` syncs everything.

After each sync that moved ``durable_offset`` the thread calls ``on_durable(offset)`` (the broker
passes a function that queues a message and wakes its selector loop). When idle it checks one
segment that a reader asked to have verified (``CommitLog.verify_step``). It also closes the
descriptors of segments that retention deleted (``CommitLog.defer_closes``): freeing a
file's blocks can wait for the disk, and the core must not. For the same reason a second,
small thread it starts (``SpareMaker``) makes the next segment's file ahead, with its blocks
allocated (``CommitLog.prepare_spare``): at start and whenever a roll took the last one. It is
a thread of its own because a roll can come while the flusher waits for an fsync.

An fsync error is logged once per failing spell and retried every interval; the durable offset
stays where it was, so nothing waiting for it is acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edgebroker.commitlog.errors import LogError

log = logging.getLogger("edgebroker.commitlog")

DURABILITY = ("none", "batch", "sync")


class Flusher(threading.Thread):
    def __init__(self, log_, durability: str = "batch", flush_interval_ms: int = 100,
                 on_durable: Callable[[int], None] | None = None, name: str = "flusher"):
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {', '.join(DURABILITY)}, got {durability!r}")
        if flush_interval_ms < 1:
            raise ValueError(f"flush_interval_ms must be at least 1, got {flush_interval_ms}")
        super().__init__(name=name, daemon=True)
        self.log = log_
        self.durability = durability
        self.interval = flush_interval_ms / 1000.0
        self.on_durable = on_durable
        # Called before each fsync of the log for acknowledgements (not with "none"): the
        # broker's QoS 2 exchange journal (core.exchanges), which must not lag the log.
        self.also_sync: Callable[[], None] | None = None
        self.syncs = 0
        self.errors = 0
        self._cond = threading.Condition()
        self._written = False
        self._retired = False
        self._stopping = False
        self.spares = SpareMaker(log_)
        self._last_sync = float("-inf")
        self._reported = -1
        self._failing = False

    def notify_written(self) -> None:
        """Something was written (call after ``write_pending`` wrote records). Cheap."""
        if self._written:
            # Not yet taken: the thread clears it before the sync that covers this write.
            return
        with self._cond:
            if not self._written:
                self._written = True
                self._cond.notify()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop: one last sync of everything, then the thread ends; joins it."""
        # Not waited for long: it holds nothing the log needs (a file it is still making is
        # removed by close(), or by the next start).
        self.spares.stop(1.0)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive():
            self.join(timeout)
            if self.is_alive():
                log.error("the flusher thread has not stopped after %g s: an fsync waits for the "
                          "disk; records from offset %d on are not known to be durable", timeout,
                          self.log.durable_offset)

    # -- the thread -----------------------------------------------------------------------------
    def start(self) -> None:
        self.log.defer_closes(self._notify_retired)
        self.log.make_spares(self.spares.want)
        self.spares.start()
        super().start()

    def _notify_retired(self) -> None:
        """Retention deleted a segment: close its files now (they hold its disk space)."""
        with self._cond:
            self._retired = True
            self._cond.notify()

    def run(self) -> None:
        self._reported = self.log.durable_offset
        try:
            while self._wait():
                self._work()
        finally:
            self._sync(sealed_only=False, final=True)
            # From now on (stopping, or the thread failed) the core closes them itself.
            self.log.close_retired(stop=True)

    def _wait(self) -> bool:
        """Block until there is work; False when stopping."""
        with self._cond:
            while not self._stopping:
                if self._retired:
                    # Not under the lock: the core takes it to notify, and a close can wait
                    # for the disk.
                    self._retired = False
                    self._cond.release()
                    try:
                        self.log.close_retired()
                    finally:
                        self._cond.acquire()
                    continue
                now = time.monotonic()
                if self._written or self.log.needs_sync():
                    if self.durability == "sync" and not self._failing:
                        return True
                    due = self._last_sync + self.interval
                    if now >= due:
                        return True
                    self._cond.wait(due - now)
                    continue
                if not self._cond.wait(self.interval):
                    return True  # idle tick: sealed segments, verification
            return False

    def _work(self) -> None:
        with self._cond:
            written = self._written
            self._written = False
        if self.durability == "none":
            self._sync(sealed_only=True)
        elif written or self.log.needs_sync():
            self._sync(sealed_only=False)
        if not written:
            try:
                self.log.verify_step()
            except (OSError, LogError) as exc:
                log.warning("background verification: %s", exc)
            except Exception:  # a bug there must not stop the fsyncs
                log.exception("background verification failed")

    def _sync(self, sealed_only: bool, final: bool = False) -> None:
        if sealed_only and not self.log.needs_sync():
            return
        self._last_sync = time.monotonic()
        if not sealed_only and self.also_sync is not None:
            self.also_sync()
        try:
            durable = self.log.sync(sealed_only=sealed_only)
        except (OSError, LogError) as exc:
            self.errors += 1
            if not self._failing or final:
                log.error("commit log fsync failed: %s; records from offset %d on are not known "
                          "to be durable; retrying every %d ms", exc, self.log.durable_offset,
                          int(self.interval * 1000))
            self._failing = True
            return
        self.syncs += 1
        if self._failing:
            self._failing = False
            log.warning("commit log fsync works again (durable up to offset %d)", durable)
        if durable != self._reported and self.on_durable is not None:
            self._reported = durable
            try:
                self.on_durable(durable)
            except Exception:
                log.exception("on_durable callback failed")


class SpareMaker(threading.Thread):
    """Makes the next segment's file ahead (``CommitLog.prepare_spare``) whenever ``want`` is
    called (by the core, when a new segment took the last one); when it could not (a disk
    too full) it tries again every ``RETRY_SECONDS``; it ends when the log will take no more
    (closed, or a file system that cannot allocate ahead)."""

    RETRY_SECONDS = 1.0

    def __init__(self, log_, name: str = "segment-ahead"):
        super().__init__(name=name, daemon=True)
        self.log = log_
        self._cond = threading.Condition()
        self._wanted = True
        self._stopping = False

    def want(self) -> None:
        with self._cond:
            self._wanted = True
            self._cond.notify()

    def stop(self, timeout: float | None = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        ready, failed = True, False
        while True:
            with self._cond:
                while not (self._wanted or self._stopping):
                    if not self._cond.wait(None if ready else self.RETRY_SECONDS):
                        break
                if self._stopping:
                    return
                self._wanted = False
            try:
                ready = self.log.prepare_spare()
                failed = False
                if ready is None:
                    return
            except Exception:  # a bug here must not end the thread quietly
                if not failed:  # logged once per failing spell
                    log.exception("making the next segment's file ahead failed")
                ready, failed = False, True
