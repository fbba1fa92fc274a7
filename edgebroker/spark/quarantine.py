"""The ingest job's last step for the batch files it could not read: a row in the
``quarantine`` table, then the file moved out of the landing area to
``<warehouse>/_quarantine/<its path under the landing area>`` (docs/spark.md).

A file is judged by the bytes the run read, seconds or minutes before it is moved; the file at
that path may have been replaced since (the dir sink replaces a torn copy at a batch's name by
the whole batch). So a file is moved only while its length and modification time are those
the run read: checked before the rows are written and again right before each move. A file
that changed is left in the landing area for the next run, which reads it again; it is
logged and named in the report (``changed_since_read``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

log = logging.getLogger("edgebroker.spark")

QUARANTINE_DDL = "path string, moved_to string, error string, time timestamp"


class Unreadable:
    """A file set apart without being read (an empty one), like a summary row of kind error:
    its path, error, and the length and modification time (ms) it had when listed."""

    def __init__(self, path: str, error: str, length: int, mtime: int):
        self.path, self.error, self.length, self.mtime = path, error, length, mtime


def _changed(fs, r, report: dict, after_row: bool = False) -> bool:
    """Whether the file at ``r.path`` is no longer the one the run judged; logged, and named
    in the report, when it is."""
    now = fs.stamp(r.path)
    if now == (r.length, r.mtime):
        return False
    what = "gone" if now is None else f"{now[0]} bytes, modified at {now[1]} ms"
    log.warning("%s changed since this run read it (%d bytes, modified at %d ms; now %s): "
                "not quarantined, left for the next run to read%s", r.path, r.length, r.mtime,
                what, " (its quarantine row names a move that did not happen)"
                if after_row else "")
    report["changed_since_read"].append(r.path)
    return True


def quarantine(spark, fs, bad: list, landing: str, warehouse: str, table: tuple, unmoved: str,
               report: dict) -> None:
    """Record and move each file of ``bad`` (summary rows of kind error, ``Unreadable``) that
    is still the file the run read; ``landing``, ``warehouse``: qualified paths; ``table``:
    the quarantine table's folder, and that path as Spark's readers take it (pattern
    characters escaped); ``unmoved``: the checkpoint's table of the bad files left in place.
    Each row goes into the table before its file moves: a crash in between leaves the file in
    the landing area, read again by the next run, which finds its row there already (the same
    path and destination) and only moves it.

    A file whose folder the job cannot write (a landing area it may read but not change) is
    not moved: its row says so (``moved_to`` null, the cause in its error), and the checkpoint
    names it (``unmoved``, with its length and modification time) for later runs to skip it
    while it is unchanged. A move that fails all the same is logged with its cause and tried
    again by the next run; the pass goes on either way."""
    now = datetime.now(timezone.utc)
    bad = [r for r in bad if not _changed(fs, r, report)]
    planned, stuck, causes = [], [], {}
    for r in bad:
        folder = r.path.rsplit("/", 1)[0]
        if folder not in causes:
            causes[folder] = fs.write_error(folder)
        if causes[folder]:
            stuck.append((r, f"{r.error}; not moved out of the landing area: its folder "
                             f"cannot be written ({causes[folder]})"))
            continue
        rel = r.path[len(landing) + 1:] if r.path.startswith(landing + "/") else \
            r.path.rsplit("/", 1)[-1]
        planned.append((r, (r.path, fs.free_name(f"{warehouse}/_quarantine/{rel}"), r.error,
                            now)))
    rows = [p for _, p in planned] + [(r.path, None, error, now) for r, error in stuck]
    if rows:
        known = set()
        if fs.exists(table[0]):
            known = {(q.path, q.moved_to)
                     for q in spark.read.schema(QUARANTINE_DDL).parquet(table[1])
                     .select("path", "moved_to").collect()}
        rows = [p for p in rows if p[:2] not in known]
        if rows:
            (spark.createDataFrame(rows, QUARANTINE_DDL)
             .coalesce(1).write.mode("append").parquet(table[0]))
    if stuck:
        (spark.createDataFrame([(r.path, r.length, r.mtime, error, now) for r, error in stuck],
                               "path string, length long, mtime long, error string, "
                               "time timestamp")
         .coalesce(1).write.mode("append").parquet(unmoved))
    for r, error in stuck:
        log.error("%s left in the landing area, skipped by later runs while unchanged: %s",
                  r.path, error)
        report["not_moved"].append({"path": r.path, "error": error})
    for r, (path, dst, error, _) in planned:
        if _changed(fs, r, report, after_row=True):
            continue
        try:
            fs.move(path, dst)
        except OSError as exc:
            log.error("%s not quarantined, left in the landing area for the next run to move "
                      "(its quarantine row names %s): %s", path, dst, exc)
            report["not_moved"].append({"path": path, "error": f"{error}; {exc}"})
            continue
        moved = fs.stamp(dst)
        if moved is None or moved[0] != r.length:
            # Replaced between the check and the rename: put it back when its name is free.
            # (Its length tells: a store whose rename is a copy, S3A's, gives the moved file
            # a new modification time, and it would go back and forth at every run.)
            back = not fs.exists(path)
            if back:
                fs.move(dst, path)
            log.error("%s changed while it was being quarantined: the file moved to %s is "
                      "not the one read (%s)", path, dst,
                      "moved back for the next run to read" if back else
                      "its name is taken again; move it back into the landing area by hand")
            report["changed_since_read"].append(path)
            continue
        log.error("quarantined %s (moved to %s): %s", path, dst, error)
        report["quarantined"].append({"path": path, "moved_to": dst, "error": error})
