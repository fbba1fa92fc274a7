"""A bridge's cursor on disk: ``<state_dir>/bridge-<name>.json``.

``{"version": 1, "bridge": NAME, "cursor": C, "sent": S, "packet_ids": N}``: every record
below ``C`` that the bridge forwards was acknowledged by the remote; records from ``C`` up to
``S`` had been sent and were not yet all acknowledged when the file was written (after a
crash they are sent again: counted as resent); the bridge's packet ids are 1 to ``N``: those
the next run releases at the remote (bridge/release.py). ``packet_ids`` may be absent (a
file of an older version): every id is released then. ``"subscriptions": {FILTER: 0}``: the
remote filters the bridge subscribed to that the remote's session may still hold, so the next
run unsubscribes those its rules no longer name (bridge/subscribing.py); a file of an earlier
version may hold a Subscription Identifier instead of 0 (read the same); absent in a file of
an older version: not known then. The
file is written to a temporary name, fsynced and renamed over the old one, then the folder
is fsynced, so a crash leaves the old file or the new one.

The core thread never waits for a disk: ``CheckpointWriter`` is a small thread that writes
the latest cursor each bridge handed it (a later one replaces one not yet written). At
shutdown the app writes the final cursors itself (``write``), after the writer stopped.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from edgebroker.files import read_small_file, replace_file

log = logging.getLogger("edgebroker.bridge")

VERSION = 1
MAX_SUBSCRIPTION_ID = 268_435_455     # a Variable Byte Integer (MQTT 5.0 3.8.2.1.2)


def path_of(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, f"bridge-{name}.json")


class Damaged(Exception):
    """The checkpoint file could not be read; it was moved to ``.damaged`` and logged."""


def load(path: str) -> tuple[int, int, int | None, dict | None] | None:
    """(cursor, sent, packet ids or None, subscriptions or None) from the file; None when
    there is none. A damaged
    file is renamed to ``.damaged``, logged, and raises ``Damaged``: the bridge then starts
    at the head of the log, as a new one, and counts it (``checkpoint_damaged``)."""
    try:
        data = json.loads(read_small_file(path))     # a FIFO there: an error, not a wait
        if type(data) is not dict:
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        cursor, sent = offset(data, "cursor"), offset(data, "sent")
        if data.get("version") != VERSION or sent < cursor:
            raise ValueError("unknown version or offsets")
        ids = data.get("packet_ids")
        if ids is not None and (type(ids) is not int or not 1 <= ids <= 0xFFFF):
            raise ValueError(f"packet_ids {ids!r} is not a number from 1 to 65535")
        subs = data.get("subscriptions")
        if subs is not None and (type(subs) is not dict or not all(
                type(f) is str and f and type(i) is int and 0 <= i <= MAX_SUBSCRIPTION_ID
                for f, i in subs.items())):
            raise ValueError("subscriptions is not an object of filters and identifiers")
        return cursor, sent, ids, subs
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        os.replace(path, path + ".damaged")
        log.error("bridge checkpoint %s cannot be read (%s); moved it to %s.damaged: the bridge "
                  "starts at the head of the log, and what was logged since its last "
                  "checkpoint is not forwarded (counted in checkpoint_damaged)", path, exc, path)
        raise Damaged(path) from exc


def offset(data: dict, key: str) -> int:
    """``data[key]``, a log offset: a whole number >= 0 (JSON's 1e400, Infinity, NaN,
    3.5, true and text are refused with ValueError naming the key)."""
    value = data[key]
    if type(value) is not int or value < 0:
        raise ValueError(f"{key} {str(value)[:40]!r} is not a whole number >= 0")
    return value


def write(path: str, name: str, cursor: int, sent: int, packet_ids: int | None = None,
          subscriptions: dict | None = None) -> None:
    """Write the checkpoint durably (edgebroker.files: temp file, fsync, rename, fsync of the
    folder)."""
    doc = {"version": VERSION, "bridge": name, "cursor": cursor, "sent": max(sent, cursor)}
    if packet_ids is not None:
        doc["packet_ids"] = packet_ids
    if subscriptions is not None:
        doc["subscriptions"] = subscriptions
    data = json.dumps(doc).encode() + b"\n"
    replace_file(path, data)


class CheckpointWriter:
    """The thread that writes bridge checkpoints for the core (latest value wins)."""

    def __init__(self):
        self._wanted: dict[str, tuple] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="bridge-checkpoints", daemon=True)
        self.written = 0
        # path -> writes of that checkpoint that failed (the bridge's checkpoint_failures;
        # updated under the lock by count_failure; read by the core: one dict item)
        self.failed: dict[str, int] = {}
        # path -> the cursor of the last checkpoint this thread wrote (what a crash now keeps;
        # read by the core for the figures: one dict item, set whole)
        self.on_disk: dict[str, int] = {}

    def start(self) -> None:
        self._thread.start()

    def submit(self, path: str, name: str, cursor: int, sent: int,
               packet_ids: int | None = None, subscriptions: dict | None = None) -> None:
        with self._cond:
            self._wanted[path] = (name, cursor, sent, packet_ids, subscriptions)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._stop:
                    self._cond.wait()
                if not self._wanted:
                    return
                path, (name, cursor, sent, packet_ids, subs) = self._wanted.popitem()
            try:
                write(path, name, cursor, sent, packet_ids, subs)
                self.on_disk[path] = cursor
                self.written += 1
            except OSError as exc:
                self.count_failure(path, name, exc)

    @property
    def failures(self) -> int:
        """Failed writes of every checkpoint."""
        with self._cond:
            return sum(self.failed.values())

    def count_failure(self, path: str, name: str, exc: OSError) -> None:
        """A write of ``path`` failed (on this thread, or the bridge's first one at start, on
        the core thread: the counts are updated under the lock)."""
        with self._cond:
            self.failed[path] = self.failed.get(path, 0) + 1
        log.error("bridge %s: cannot write its checkpoint %s: %s (the bridge goes on; after a "
                  "crash it sends again from the last checkpoint written)", name, path,
                  exc.strerror or exc)

    def stop(self) -> None:
        """Write what is waiting, then end the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(10)
