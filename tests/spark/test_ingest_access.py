"""The ingest job where it may not do everything: a second pass while one runs (refused, nothing
written twice), a landing area it may read but not change (a bad batch is left there, named
once, and the rest checkpointed), a batch file it cannot open (the rest ingested); and the gaps
of two lives of a gateway id at the same offsets.

The job runs as a user without root's override (setpriv drops it when the tests run as root;
the folders and files are made 0555 and 0000, which then refuse the owner too), in a
subprocess of its own: one local[1] Spark application for all the passes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebroker.spark.files import PassRunning, pass_lock
from edgebroker.spark.ingest import ingest_once

from spark.test_ingest import ms, table
from spark.test_ingest_landing import DAY_MS, T0, ingest_watched, land

REPO = Path(__file__).resolve().parents[2]
UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] \
    if os.geteuid() == 0 else []
# Run by the subprocess: passes over each landing area given, one JSON report per line; then
# (for the move's own error) a file moved directly, when one is given.
JOB = """
import json, sys
from sparklocal import local_session
from edgebroker.spark.files import _Fs
from edgebroker.spark.ingest import ingest_once
spark = local_session("access", **{"spark.master": "local[1]",
                                   "spark.sql.shuffle.partitions": "1"})
runs = json.loads(sys.argv[1])
for landing, warehouse, passes in runs["passes"]:
    for _ in range(passes):
        print(json.dumps(ingest_once(spark, landing, warehouse)), flush=True)
try:
    if runs.get("move"):
        _Fs(spark).move(*runs["move"])
except OSError as exc:
    print(json.dumps({"move_error": str(exc)}), flush=True)
spark.stop()
"""


def run_unprivileged(tmp_path: Path, runs: dict) -> list[dict]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    done = subprocess.run([*UNPRIVILEGED, sys.executable, "-c", JOB, json.dumps(runs)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_second_pass_while_one_runs_is_refused_and_no_row_is_added_twice(spark, tmp_path,
                                                                            caplog):
    """Each pass reads the checkpoint and messages, then appends: two at once both found
    every file new and every row absent, and wrote each twice. The second pass here starts
    while the first holds the lock (from the first's log line after its first pass over the
    files) and must stop at once, naming the lock file and the holder."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    for b in range(3):
        land(landing, [(o, T0 + o, b"p") for o in range(b * 10, b * 10 + 10)])
    refused, started = [], []

    class Second(logging.Handler):
        def emit(self, record):
            if not started and "new batches" in record.getMessage():
                started.append(record)
                with pytest.raises(PassRunning) as exc:
                    ingest_once(spark, str(landing), str(warehouse))
                refused.append(str(exc.value))
    report = ingest_watched(spark, landing, warehouse, Second(), caplog)
    lock = warehouse / "_checkpoint" / "ingest.lock"
    assert refused == [f"another ingest pass holds {lock} (pid {os.getpid()}); this one does "
                       f"nothing: one pass at a time per checkpoint folder"]
    assert report["rows_added"] == 30
    assert sorted(r.offset for r in table(spark, warehouse, "messages")) == list(range(30))
    assert len(table(spark, warehouse, "_checkpoint/files")) == 3
    # Released with its pass: the next one runs (and adds nothing).
    assert ingest_once(spark, str(landing), str(warehouse))["files_new"] == 0


def test_the_command_refuses_a_pass_while_another_holds_the_lock_in_one_line(tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    land(landing, [(o, T0 + o, b"p") for o in range(10)])
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_SUBMIT_ARGS="--master local[1] --conf spark.ui.enabled=false pyspark-shell")
    env["PYTHONPATH"] = str(REPO)
    with pass_lock(f"file:{warehouse}/_checkpoint") as lock:
        done = subprocess.run([sys.executable, "-m", "edgebroker.spark", "ingest", "--landing",
                               str(landing), "--warehouse", str(warehouse), "--once"],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
    assert done.returncode == 1
    assert f"edgebroker-spark: another ingest pass holds {lock} (pid {os.getpid()})" \
        in done.stderr and "Traceback" not in done.stderr
    assert not (warehouse / "messages").exists()


def test_a_bad_batch_in_a_landing_area_the_job_cannot_change_is_named_once_the_rest_kept(
        tmp_path):
    """Read-only landing area (another user's 0755/0644, here 0555), one torn batch: the move
    failed, every pass failed before its checkpoint, and each left another copy in
    _quarantine and another row. Now: the good batch is ingested and checkpointed, the torn
    one named once (the OS's reason given), no copy made, and later passes skip it."""
    ro, wh = tmp_path / "ro" / "landing", tmp_path / "ro" / "warehouse"
    good = land(ro, [(o, T0 + o, b"g") for o in range(10)])
    torn = land(ro, [(o, T0 + o, b"t") for o in range(10, 20)])
    torn.write_bytes(torn.read_bytes()[:40])
    folders = [ro, *ro.rglob("*")]
    folders = [p for p in folders if p.is_dir()]
    for p in folders:
        p.chmod(0o555)
    dst = wh / "_quarantine" / "by-hand.ebb.zst"
    try:
        reports = run_unprivileged(tmp_path, {
            "passes": [(str(ro), str(wh), 3)],
            "move": (f"file:{torn}", f"file:{dst}")})
    finally:
        for p in folders:
            p.chmod(0o755)
    first, *later, moved = reports

    assert (first["rows_added"], first["quarantined"]) == (10, [])
    [stuck] = first["not_moved"]
    assert stuck["path"] == f"file:{torn}"
    assert "ends inside its frame; not moved out of the landing area: its folder cannot be " \
           "written (" in stuck["error"] and "(Permission denied))" in stuck["error"]
    assert [(r["files_listed"], r["files_new"], r["not_moved"]) for r in later] == \
        [(2, 0, [])] * 2
    assert torn.exists() and not list((wh / "_quarantine").rglob("*.ebb.zst*"))
    [row] = pq_rows(wh / "quarantine")
    assert (row["path"], row["moved_to"], row["error"]) == (f"file:{torn}", None, stuck["error"])
    assert [r["path"] for r in pq_rows(wh / "_checkpoint" / "files")] == [f"file:{good}"]
    # The move itself, refused: its reason given, Hadoop's copy (its fallback) not left.
    assert moved["move_error"].startswith(f"cannot move file:{torn} to file:{dst}: ")
    assert "Permission denied" in moved["move_error"] and not dst.exists()


def test_a_batch_file_the_job_cannot_open_is_quarantined_and_the_rest_ingested(tmp_path):
    """A file of another owner, mode 0600 (here 0000): the first pass's scan failed the whole
    pass, every pass, and the good batch beside it was never ingested."""
    rw, wh2 = tmp_path / "landing", tmp_path / "warehouse"
    land(rw, [(o, T0 + o, b"g") for o in range(10)])
    closed = land(rw, [(o, T0 + o, b"c") for o in range(10, 20)])
    closed.chmod(0)
    closed_first, closed_again = run_unprivileged(tmp_path, {"passes": [(str(rw), str(wh2), 2)]})
    assert closed_first["rows_added"] == 10
    [q] = closed_first["quarantined"]
    assert q["path"] == f"file:{closed}" and q["error"].startswith(
        f"file:{closed}: cannot be opened (FileNotFoundException: ") and \
        q["error"].endswith("(Permission denied))")
    assert not closed.exists() and (wh2 / "_quarantine" / closed.relative_to(rw)).exists()
    assert (closed_again["files_listed"], closed_again["files_new"]) == (1, 0)


def pq_rows(folder: Path) -> list[dict]:
    import pyarrow.parquet as pq
    return pq.read_table(folder).to_pylist()


def test_a_gap_of_a_new_life_at_the_offsets_of_an_old_lifes_damage_gap_is_recorded(
        spark, tmp_path):
    """Life 1 lost offset 5 inside a batch (damage, its time that of offset 6); three days
    later life 2 (offsets from 0 again) reports gap 5..5 in a header: a later time, another
    gap. A re-cut batch of life 1 reporting the hole (its time not later) adds none."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    land(landing, [(o, T0 + o, b"old") for o in range(10) if o != 5])
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 1
    land(landing, [(o, T0 + o, b"old") for o in range(6, 10)], name="recut.ebb.zst",
         gap=(5, 1))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 0
    t1 = T0 + 3 * DAY_MS
    land(landing, [(o, t1 + o, b"new") for o in range(5)])
    land(landing, [(o, t1 + o, b"new") for o in range(6, 10)], gap=(5, 1))
    assert ingest_once(spark, str(landing), str(warehouse))["gaps_added"] == 1
    assert sorted((r.gap_first, r.gap_last, r.reason, ms(r.batch_time))
                  for r in table(spark, warehouse, "gaps")) == \
        [(5, 5, "damage", T0 + 6), (5, 5, "reported", t1 + 6)]


def test_the_lock_is_taken_only_on_a_local_checkpoint_folder(tmp_path):
    with pass_lock("s3a://bucket/warehouse/_checkpoint") as held:
        assert held is None
    with pass_lock(f"file:{tmp_path}/cp") as held:
        assert held == f"{tmp_path}/cp/ingest.lock"
        assert (tmp_path / "cp" / "ingest.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(PassRunning):
            with pass_lock(f"file://{tmp_path}/cp"):
                pass
    with pass_lock(f"file:{tmp_path}/cp"):
        pass
    shutil.rmtree(tmp_path / "cp")
