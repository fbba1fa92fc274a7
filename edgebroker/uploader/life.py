"""The life id of a log, ``<state dir>/log/life``: 8 lowercase hex digits drawn once for a log
and kept beside its offsets (docs/upload.md, "Object names"). Object names carry it, so a log
that numbers its records from 0 again (a gateway re-imaged, or given a new data directory,
under the same ``gateway_id``) never names a batch as one of an earlier life, while a copy of
the data directory (a cloned image: the same life) still meets its twin's objects and raises
the alarm.

The file goes with the log's offsets: wiping the log folder wipes both. A log without one (a
new log, or one written before life ids) gets one at the uploader's first start; one that
cannot be read or holds anything else gets a new one, with a warning. Either way nothing is
lost: the batch an intent file names keeps the name recorded there, and the batches after the
uploaded mark hold offsets no earlier batch of this log held, so a new id only changes the
names of the batches to come.
"""

from __future__ import annotations

import logging
import os
import re

from edgebroker.files import read_small_file, replace_file
from edgebroker.uploader.batch import SUFFIX
from edgebroker.uploader.intent import INTENT_FILE, Intent, read_intent

log = logging.getLogger("edgebroker.upload")

LIFE_FILE = "life"
_LIFE = re.compile(r"[0-9a-f]{8}")
# The end of an object name with a life id: ``...-<last:020>-<life>.ebb.zst``.
_KEY_LIFE = re.compile(r"\d{20}-\d{20}-([0-9a-f]{8})" + re.escape(SUFFIX) + r"\Z")


def new_life() -> str:
    return os.urandom(4).hex()


def read_life(log_dir: str) -> tuple[str | None, str]:
    """(the life id in ``<log_dir>/life``, "") or (None, what is wrong: "" when there is no
    file)."""
    path = os.path.join(log_dir, LIFE_FILE)
    try:
        text = read_small_file(path)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    value = text.strip().decode("ascii", "replace")
    if not _LIFE.fullmatch(value):
        return None, f"holds {text[:40]!r}, not 8 lowercase hex digits"
    return value, ""


def log_life(commit_log, recorded: str | None = None) -> str:
    """The life id of ``commit_log`` (open for writing): read from its file, else made and
    written there (durably: temporary file, fsync, rename, folder fsync). ``recorded``, the
    life id in the intent file's name, is this log's when the file is there but damaged, or
    missing from a log that holds records (a run that could not write the file: a full disk):
    it is kept. Otherwise a new id is drawn. A file that cannot be written leaves the id for
    this run only (a warning); the intent file's names carry it to the next start."""
    path = os.path.join(commit_log.directory, LIFE_FILE)
    life, problem = read_life(commit_log.directory)
    if life is not None:
        return life
    used = commit_log.next_offset > 0 or commit_log.uploaded_offset > 0
    life = recorded if recorded and (problem or used) else new_life()
    try:
        replace_file(path, life.encode() + b"\n", 0o640)
    except OSError as exc:
        log.warning("%s: cannot write the log's life id %s (%s); it names this run's batches, "
                    "and the next start takes it from the intent file (nothing is lost)", path,
                    life, exc.strerror or exc)
        return life
    if problem:
        log.warning("%s %s: replaced by %s; the batches from the uploaded mark on are named "
                    "with it (the names may change, nothing is lost)", path, problem,
                    f"{life}, the life id of the intent file's batch" if life == recorded
                    else f"a new life id, {life}")
    elif life == recorded:
        log.info("%s was missing: %s, the life id of the intent file's batch, kept (an earlier "
                 "run could not write the file?)", path, life)
    elif used:
        log.info("%s: this log had no life id (written before life ids, or the file removed): %s "
                 "from now on; "
                 "the batches from the uploaded mark on are named with it", path, life)
    return life


def life_of_key(key: str) -> str | None:
    """The life id an object name carries; None for a name without one (cut before life ids)."""
    m = _KEY_LIFE.search(key)
    return m.group(1) if m else None


def open_life(commit_log, upload_dir: str) -> tuple[str, Intent | None]:
    """The uploader's start: the log's life id and the intent file's batch. An intent whose
    name carries another life id is another log's (the log folder was wiped, the upload
    folder kept): the log does not hold its records, so it is dropped (a warning), not taken
    for this log's batch of the same offsets."""
    intent = read_intent(upload_dir)
    other = life_of_key(intent.key) if intent is not None else None
    life = log_life(commit_log, other)
    if other is not None and other != life:
        # Removed, not only dropped: a later start of a log without a life file (this run's
        # could not be written) would take the other life's id from it.
        path = os.path.join(upload_dir, INTENT_FILE)
        log.warning("%s names the batch %s of another life of the log (life id %s, this log's "
                    "is %s): the log folder was replaced since; the file is removed and the "
                    "next batch is cut afresh", path, intent.key, other, life)
        try:
            os.unlink(path)
        except OSError:
            pass        # (the next batch's intent replaces it)
        intent = None
    return life, intent


__all__ = ["LIFE_FILE", "read_life", "log_life", "life_of_key", "open_life", "new_life"]
