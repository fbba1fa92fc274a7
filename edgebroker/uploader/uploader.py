"""The uploader: a thread of ``edgebroker serve`` that ships the commit log in batches.

Each round it takes the first record not uploaded yet (the log's uploaded mark), finds it in a
sealed, fsynced segment (``CommitLog.upload_source``: a duplicate descriptor, so the core may
delete the file meanwhile), cuts a batch there (``cutter.plan``: up to ``batch_bytes`` of
records or the segment's end), records the batch's range in the intent file (fsynced), writes
the batch file (fsynced too) into ``<state dir>/upload/`` and has the sink store it under its
deterministic name (gateway, day, offsets and the log's life id: life.py), retrying with
full-jitter exponential back-off; then it advances the uploaded mark.

Batches cut by age: the broker sets ``CommitLog.upload_age_ms`` so the log seals its segment
being written once the first record is ``batch_max_age`` old, and that segment's end ends the
batch. The intent file makes a crash harmless: after a restart the batch is cut again from the
range the intent names (even if ``batch_bytes`` changed), so the object gets the same name and
the same bytes, and the landing area holds every record once.

Pause and resume (``edgebroker upload pause|resume``, through the admin socket): a paused
uploader starts no new put and no retry; a put in flight finishes. ``run_once`` (the CLI's
``upload run --once``, on a log no broker holds) ships every sealed batch in the caller's thread
and returns; a permanent error ends it.

The thread only reads sealed segment files and calls ``upload_source``, ``upload_backlog`` and
``mark_uploaded`` (each takes the log's lock briefly); it never waits for the core thread.
Memory: the batch is streamed (1 MiB reads through the compressor), whatever ``batch_bytes``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

from edgebroker.commitlog.recovery import UPLOADED_FILE
from edgebroker.errors import EdgebrokerError
from edgebroker.files import write_small_file
from edgebroker.uploader import cutter
from edgebroker.uploader.figures import backlog_batches, figures_of
from edgebroker.uploader.batch import (
    BatchFormatError, BatchHeader, read_batch_file, records_id,
)
from edgebroker.uploader.intent import INTENT_FILE, Intent, read_intent
from edgebroker.uploader.life import open_life
from edgebroker.uploader.reserve import NO_ROOM, Reserve
from edgebroker.uploader.throttle import Stopped, Throttle  # noqa: F401  (also here)
from edgebroker.uploader.configure import (  # noqa: F401  (also the uploader's names)
    default_gateway_id, gateway_id_of, open_sink,
)
from edgebroker.uploader.sinks import (  # noqa: F401  (also the uploader's names)
    PermanentSinkError, SinkError, TransientSinkError,
)

log = logging.getLogger("edgebroker.upload")

UPLOAD_DIR = "upload"
SPOOL_FILE = "batch.ebb.zst.tmp"
POLL_SECONDS = 0.5
BACKOFF_BASE = 1.0
BACKOFF_CAP = 60.0
STOP_WAIT = 10.0
# While backing off after "no answer" errors, the sink's reachable() is asked this often, so
# uploading resumes within seconds of the link's return (not after a back-off of up to 60 s).
PROBE_SECONDS = 3.0


class LocalError(EdgebrokerError):
    """A file of the uploader's own (intent, batch file, uploaded mark) could not be written:
    the message names it. Retried with back-off, counted in ``local_errors``."""


class Uploader:
    def __init__(self, commit_log, state_dir: str, upload_config, clock_ms=None):
        self.log = commit_log
        self.config = upload_config
        self.gateway_id = gateway_id_of(upload_config)
        self.sink = open_sink(upload_config)
        self.prefix = ""
        self.dir = os.path.join(state_dir, UPLOAD_DIR)
        self.spool = os.path.join(self.dir, SPOOL_FILE)
        self.reserve = Reserve(self.dir)
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._stop = threading.Event()
        self._wake = threading.Event()   # set by stop, resume and pause: a wait ends early
        self.paused = False
        self._kick = False               # set by resume: a back-off in progress ends now
        self.once = False                # run_once: a permanent error raises instead of retrying
        self._thread: threading.Thread | None = None
        self._dir_fd = -1
        self.throttle = Throttle(upload_config.upload_bandwidth, self._stop.wait)
        self._lock = threading.Lock()
        self._logged_error = ""
        self.intent: Intent | None = None
        self.life = ""               # the log's life id, in object names (life.py)
        # figures (read by figures(), any thread)
        self.batches = 0
        self.bytes_raw = 0
        self.bytes_shipped = 0     # compressed bytes stored by the sink
        self.records = 0
        self.retries = 0
        self.permanent_errors = 0
        self.local_errors = 0
        self.alarm = False
        self.last_error = ""
        self.last_error_time = 0.0
        self.last_success_time = 0.0
        self.retry_at = 0.0        # wall time of the next try while backing off, else 0
        self.gap_offsets = 0
        self.backlog = (0, 0, None, 0)
        # The newest uploaded record's timestamp (lag_seconds): the record just below the
        # uploaded mark, from an earlier run; 0 when the log does not hold it (nothing was
        # uploaded yet, or retention deleted it).
        mark = commit_log.uploaded_offset
        below = commit_log.read(mark - 1) if mark > commit_log.first_offset else None
        self.shipped_max_ts = below.timestamp_ms if below is not None else 0
        self.state = "idle"

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.life, self.intent = open_life(self.log, self.dir)
        self.reserve.keep()
        self.log.upload_age_ms = int(self.config.batch_max_age * 1000)
        log.info("uploading the log to %s as gateway %s (batches of up to %d bytes or %g s%s)",
                 self.sink.name, self.gateway_id, self.config.batch_bytes,
                 self.config.batch_max_age,
                 f", at most {self.config.upload_bandwidth} bytes/s"
                 if self.config.upload_bandwidth else "")
        self._thread = threading.Thread(target=self._run, name="edgebroker-uploader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        interrupt = getattr(self.sink, "interrupt", None)
        if interrupt is not None:   # a put waiting for a store that does not answer ends now
            interrupt()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
            if self._thread.is_alive():
                log.warning("the uploader did not stop within %g s (a sink that does not "
                            "answer); the intent file keeps its batch for the next start",
                            STOP_WAIT)
                return      # its sink and directory stay open under it until the exit
        if self.log.uploaded_unsaved:   # a last try (the next start would report a gap)
            try:
                self.log.mark_uploaded(self.log.uploaded_offset)
            except OSError as exc:
                log.error("cannot write the uploaded mark at the stop: %s", exc)
        self.sink.close()
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                worked = self.step()
            except Stopped:
                return
            except Exception as exc:  # a local disk error, or a bug: keep the thread alive
                failures += 1
                bug = not isinstance(exc, LocalError)
                if self._local_error(f"uploader: {exc!r}" if bug else str(exc)) and bug:
                    log.exception("uploader round failed; retrying")
                if self._wait(_backoff(failures)):
                    return
                continue
            if failures:
                log.info("the uploader's rounds work again, after %d failed", failures)
                self._logged_error = ""
            failures = 0
            if not worked and self._wait(POLL_SECONDS):
                return

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less when woken (pause, resume, stop); True when stopping."""
        self._wake.wait(seconds)
        self._wake.clear()
        return self._stop.is_set()

    def _hold_while_paused(self) -> None:
        while self.paused:
            self.state = "paused"
            self.backlog = self.log.upload_backlog(self.log.uploaded_offset)   # for the figures
            if self._wait(POLL_SECONDS):
                raise Stopped

    # -- run-time controls (any thread) ---------------------------------------------------------
    def pause(self) -> bool:
        """Stop starting puts and retries; True when it was running."""
        was, self.paused = self.paused, True
        self._wake.set()
        if not was:
            log.info("uploading paused (edgebroker upload resume goes on)")
        return not was

    def resume(self) -> str:
        """Go on at once (a back-off in progress is cut short): what it changed, "paused" (it
        was), "alarm" or "retrying" (a back-off after a permanent or a transient error, cut
        short: the batch goes again now), else ""."""
        backing_off = ("alarm" if self.alarm else "retrying") if self.retry_at else ""
        was = "paused" if self.paused else backing_off
        self.paused = False
        self._kick = True
        self._wake.set()
        if was == "paused":
            log.info("uploading resumed")
        return was

    def run_once(self, progress=None) -> int:
        """Ship every batch sealed now, in this thread; the number shipped. ``progress(figures)``
        after each batch. Transient errors are retried with back-off (Ctrl-C ends the wait);
        a permanent one raises PermanentSinkError, a file of its own it cannot write (the
        uploaded mark included, tried once more at the end) LocalError."""
        os.makedirs(self.dir, exist_ok=True)
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.life, self.intent = open_life(self.log, self.dir)
        self.reserve.keep()
        self.once = True
        shipped = 0
        try:
            while self.step():
                shipped += 1
                if progress is not None:
                    progress(self.figures())
            self._mark_saved()
        finally:
            self.sink.close()
            os.close(self._dir_fd)
            self._dir_fd = -1
        return shipped

    # -- one round -------------------------------------------------------------------------------
    def step(self) -> bool:
        """Ship one batch if one is ready: True when one was shipped."""
        self._hold_while_paused()
        mark = self.log.uploaded_offset
        if self.log.uploaded_unsaved:   # a full disk had no room for its file: try again
            self._mark(mark)
        self.backlog = self.log.upload_backlog(mark)
        intent = self.intent
        if intent is not None and intent.last < mark:
            intent = self.intent = None   # shipped, and the mark says so
        if intent is not None and self.log.first_offset > intent.first:
            if self._ship_spool(intent, "deleted by retention_bytes"):
                return True
            intent = None
        start = mark
        while True:
            src = self.log.upload_source(start)
            if src is None:
                self.state = "idle" if not self.alarm else "alarm"
                return False
            try:
                batch = cutter.plan(src, start, self.config.batch_bytes,
                                    intent.last if intent is not None else None, self._damaged)
                vanished = False   # the log no longer holds all the intent's records
                if intent is not None and (batch.first, batch.last) == (
                        intent.first, intent.last) and batch.count <= intent.last - intent.first:
                    vanished = True   # records inside found damaged: the same name, fewer
                elif intent is not None and (batch.first, batch.last) != (intent.first,
                                                                          intent.last):
                    if batch.count and batch.first < intent.first:   # another log's intent?
                        log.warning("the intent file names offsets %d..%d but the log now "
                                    "holds %d..%d there; cutting afresh", intent.first,
                                    intent.last, batch.first, batch.last)
                        intent = self.intent = None
                        batch = cutter.plan(src, start, self.config.batch_bytes, None,
                                            self._damaged)
                    else:
                        vanished = True
                if batch.count and not vanished:
                    gap = (mark, batch.first - mark) if batch.first > mark else (0, 0)
                    key = cutter.key_for(batch, self.prefix, self.gateway_id, self.life,
                                         intent and intent.key)
                    if intent is None:
                        intent = Intent(batch.first, batch.last, gap[0], gap[1], key)
                        path = os.path.join(self.dir, INTENT_FILE)
                        self._with_room(path, lambda: write_small_file(
                            path, intent.encode(), self._dir_fd))
                        self.intent = intent
                    gap = (intent.gap_first, intent.gap_length)
                    header = cutter.header_for(batch, src.fd, self.gateway_id, *gap)
                    size = self._with_room(
                        f"{self.spool} (the batch of {src.path})",
                        lambda: cutter.build(batch, src.fd, header, self.spool, self._dir_fd))
            finally:
                os.close(src.fd)   # before a put of the batch file, which may take long
            if vanished:
                held = f"{batch.count} ({batch.first}..{batch.last})" if batch.count else "none"
                if self._ship_spool(intent, f"the log holds {held} of them now: a segment "
                                    f"removed or damaged since"):
                    return True
                intent = None
                continue
            if not batch.count:  # nothing valid left in this segment: look further on
                start = src.next_offset
                continue
            break
        if gap[1]:
            log.warning("offsets %d..%d were never uploaded (deleted by retention_bytes before "
                        "upload, or damaged); the batch %s reports the gap", gap[0],
                        gap[0] + gap[1] - 1, key)
        self._ship_and_mark(key, size, header)
        return True

    def _ship_and_mark(self, key: str, size: int, header: BatchHeader) -> None:
        self._ship(key, size, records_id(header))
        self._mark(header.last_offset + 1)
        self.reserve.keep()
        with self._lock:
            self.batches += 1
            self.records += header.record_count
            self.bytes_raw += header.raw_length
            self.bytes_shipped += size
            self.gap_offsets += header.gap_length
            self.shipped_max_ts = max(self.shipped_max_ts, header.max_timestamp_ms)
            self.last_success_time = time.time()
        log.debug("shipped %s: %d records, %d bytes (%d raw)", key, header.record_count, size,
                  header.raw_length)

    def _ship_spool(self, intent: Intent, why: str) -> bool:
        """The log no longer holds all the intent's records (``why``): ``retention_bytes``
        deleted them while the broker was down between a put and its mark, or a segment was
        removed or found damaged at the start. Ship the batch file built for them again when
        it is whole (the store may hold it already), rather than report records that may be
        stored as a gap; False when it is not whole (then the put never began): the batch is
        cut afresh from what the log holds, and what it lacks counts as a gap."""
        try:
            header, _ = read_batch_file(self.spool)
        except BatchFormatError as exc:
            log.warning("the log no longer holds offsets %d..%d of the intent file (%s), and "
                        "their batch file is not whole (%s): cutting afresh from what the log "
                        "holds", intent.first, intent.last, why, exc)
            self.intent = None
            return False
        if ((header.first_offset, header.last_offset, header.gateway_id)
                != (intent.first, intent.last, self.gateway_id)):
            log.warning("the log no longer holds offsets %d..%d of the intent file (%s), and "
                        "the batch file holds %d..%d: cutting afresh from what the log holds",
                        intent.first, intent.last, why, header.first_offset,
                        header.last_offset)
            self.intent = None
            return False
        log.info("the log no longer holds offsets %d..%d of the intent file (%s); shipping "
                 "their batch file %s again", intent.first, intent.last, why, intent.key)
        self._ship_and_mark(intent.key, os.path.getsize(self.spool), header)
        self.intent = None
        return True

    def _with_room(self, path: str, write):
        """``write()`` of ``path``; when the disk has no room, once more with the reserve given
        back. LocalError, naming ``path``, when it fails."""
        for last in (False, True):
            try:
                return write()
            except OSError as exc:
                if last or exc.errno not in NO_ROOM or not self.reserve.release():
                    raise LocalError(f"uploader: cannot write {path}: "
                                     f"{exc.strerror or exc}") from None

    def _mark(self, offset: int) -> None:
        """Advance the uploaded mark; its file written with the reserve's room if need be
        (else the mark moves in memory only: ``CommitLog.mark_uploaded``)."""
        path = os.path.join(self.log.directory, UPLOADED_FILE)
        self._with_room(path, lambda: self.log.mark_uploaded(offset))
        if self.log.uploaded_unsaved and self.reserve.release():
            self._with_room(path, lambda: self.log.mark_uploaded(offset))

    def _mark_saved(self) -> None:
        """The end of ``run_once``: a mark held in memory only (no room for its file) is
        written now, or LocalError naming the file (no later round would write it)."""
        if not self.log.uploaded_unsaved:
            return
        offset = self.log.uploaded_offset
        self._mark(offset)
        if self.log.uploaded_unsaved:
            path = os.path.join(self.log.directory, UPLOADED_FILE)
            raise LocalError(f"uploader: cannot write {path}: no room on its disk (full, or "
                             f"over quota); offsets below {offset} landed all the same, and the "
                             f"next run finds them there and writes the mark")

    def _damaged(self, damage) -> None:
        log.warning("%s; not uploaded", damage.describe())

    def _ship(self, key: str, size: int, records_id: str) -> None:
        """Store the batch file under ``key``, retrying until it is stored (or the broker
        stops): transient errors with full-jitter back-off (1 s base, 60 s cap), permanent ones
        raise the alarm and are retried every 60 s (someone may fix the landing area)."""
        attempt = failed = 0   # transient failures (the back-off), all failures (the log)
        while True:
            self._hold_while_paused()
            self.state = "uploading" if not self.alarm else "alarm"
            unreachable = False
            try:
                self.sink.put(key, self.spool, size, self.throttle, records_id)
            except Stopped:   # the throttle's wait, ended by the stop
                self._cut_short(key)
                raise
            except PermanentSinkError as exc:
                self._cut_short(key)
                self._note_error(str(exc), permanent=True)
                if self.once:
                    raise
                delay = BACKOFF_CAP
            except (TransientSinkError, SinkError) as exc:
                self._cut_short(key)
                self._note_error(str(exc), permanent=False)
                attempt += 1
                delay = max(_backoff(attempt), min(exc.retry_after, BACKOFF_CAP))
                unreachable = getattr(exc, "unreachable", False)
            else:
                if failed:   # named as the error lines name it
                    log.info("upload of %s succeeded after %d failed attempt%s; uploading "
                             "resumed", self.sink.object_name(key), failed, "s"[:failed > 1])
                self.alarm = False
                self._logged_error = ""
                return
            failed += 1
            with self._lock:
                self.retries += 1
            self.state = "alarm" if self.alarm else "retrying"
            if self._back_off(delay, unreachable):
                raise Stopped

    def _cut_short(self, key: str) -> None:
        """A put failed: Stopped when the broker's stop ended it (the sink's interrupt), not
        counted as an error."""
        if self._stop.is_set():
            log.info("stopping: the upload of %s was cut short; it goes again at the next start",
                     key)
            raise Stopped

    def _back_off(self, delay: float, unreachable: bool) -> bool:
        """Wait ``delay`` s before the next try; after "no answer" errors ask the sink every
        PROBE_SECONDS whether the link is back and end the wait when it is. True: stopping."""
        probe = getattr(self.sink, "reachable", None) if unreachable else None
        deadline = time.monotonic() + delay
        self._kick = False   # (before retry_at: a resume seeing retry_at set is not lost)
        self.retry_at = time.time() + delay
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or self.paused or self._kick:
                    return self._stop.is_set()
                if self._wait(min(left, PROBE_SECONDS) if probe else left):
                    return True
                if probe is not None and deadline - time.monotonic() > 0 and probe():
                    log.info("the upload store answers again; retrying now")
                    return self._stop.is_set()
        finally:
            self.retry_at = 0.0

    def _local_error(self, message: str) -> bool:
        """A round failed on the uploader's own files (or a bug): counted, in the state, logged
        once per distinct error; True when logged now."""
        with self._lock:
            self.local_errors += 1
            self.last_error = message
            self.last_error_time = time.time()
        self.state = "local_error"
        if message == self._logged_error:
            return False
        self._logged_error = message
        log.warning("%s; retrying with back-off (the batch waits in the log)", message)
        return True

    def _note_error(self, message: str, permanent: bool) -> None:
        with self._lock:
            self.last_error = message
            self.last_error_time = time.time()
            if permanent:
                self.permanent_errors += 1
            self.alarm = permanent   # (docs/metrics.md: 1 while the last try failed permanently)
        if permanent and self.once:
            return   # run_once raises it: the CLI prints it, and no retry comes
        if message != self._logged_error:  # each distinct error logged once
            self._logged_error = message
            if permanent:
                log.error("upload alarm: %s; the data stays in the log (retried every %g s)",
                          message, BACKOFF_CAP)
            else:
                log.warning("upload failed: %s; retrying with back-off", message)

    # -- figures ---------------------------------------------------------------------------------
    def figures(self) -> dict:
        """The uploader's side of the stats (any thread)."""
        return figures_of(self)


def _backoff(attempt: int) -> float:
    """Full jitter: a uniform delay up to 1 s × 2^(attempt-1), capped at 60 s."""
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** max(attempt - 1, 0)))


__all__ = ["Uploader", "LocalError", "open_sink", "Intent", "read_intent", "Throttle", "default_gateway_id",
           "gateway_id_of", "backlog_batches", "UPLOAD_DIR", "INTENT_FILE"]
