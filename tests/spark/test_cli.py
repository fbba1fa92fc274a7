"""``python -m edgebroker.spark ingest --continuous`` (the edgebroker-spark command) run
directly, the master from PYSPARK_SUBMIT_ARGS: a pass per interval, new files picked up, a JSON
report each pass, exit 0 on SIGTERM; a pass that fails (the landing area not mounted yet) is
logged once and retried. Its tables are read with pyarrow, no second JVM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from spark.test_ingest import GOLDEN
from uploader.test_uploader import wait_until

REPO = Path(__file__).resolve().parents[2]


def reports(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]


def golden_landing(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(landing, warehouse, the day folder) with one golden batch of ten records landed."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    return landing, warehouse, day


def start_env() -> dict:
    """The command's environment: Spark local[1] on loopback, this checkout first."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_SUBMIT_ARGS="--master local[1] --conf spark.ui.enabled=false "
                                   "--conf spark.sql.shuffle.partitions=1 pyspark-shell")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYSPARK_PYTHON", None)   # the command sets it to its own interpreter
    return env


def start(tmp_path: Path, landing: Path, warehouse: Path, stderr=subprocess.DEVNULL,
          **popen):
    """The command with --continuous --interval 0.5; its stdout goes to tmp_path/stdout."""
    env = start_env()
    return subprocess.Popen([sys.executable, "-m", "edgebroker.spark", "ingest", "--landing",
                             str(landing), "--warehouse", str(warehouse), "--continuous",
                             "--interval", "0.5"], cwd=tmp_path, env=env,
                            stdout=(tmp_path / "stdout").open("wb"), stderr=stderr, **popen)


def test_continuous_ingest_picks_up_new_batches_and_stops_on_sigterm(tmp_path):
    landing, warehouse, day = golden_landing(tmp_path)
    out = tmp_path / "stdout"
    proc = start(tmp_path, landing, warehouse)
    try:
        wait_until(lambda: reports(out), timeout=120, what="the first pass")
        assert reports(out)[0]["rows_added"] == 10
        shutil.copy(GOLDEN / "v1-gap.ebb.zst", day / f"{20:020d}-{23:020d}.ebb.zst")
        later = wait_until(lambda: [r for r in reports(out) if r["files_new"]][1:],
                           timeout=120, what="a pass that finds the new batch")
        # The header's gap 12..19 and offset 22, missing inside the batch.
        assert later[0]["files_new"] == 1 and later[0]["gaps_added"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    added = sum(r["rows_added"] for r in reports(out))
    assert added == 10 + later[0]["records"]
    assert pq.read_table(warehouse / "messages").num_rows == added
    assert all(r["rows_added"] == 0 for r in reports(out) if not r["files_new"])


def test_continuous_ingest_logs_a_failing_pass_once_and_retries_until_it_works(tmp_path):
    """The landing area not there yet: every pass fails (it does not exist); the command logs
    that in one line, once, keeps trying, and ingests when the folder appears."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    proc = start(tmp_path, landing, warehouse, stderr=err.open("wb"))

    def lines(what: str) -> list:
        return [line for line in err.read_text(errors="replace").splitlines() if what in line]

    try:
        wait_until(lambda: lines("ingest pass failed") or proc.poll() is not None,
                   timeout=90, what="the failed pass logged")
        assert proc.poll() is None, f"exited {proc.returncode} on the failed pass"
        [failed] = lines("ingest pass failed")
        assert f"the landing area file:{landing} does not exist" in failed, failed
        staging = tmp_path / "staging"
        day = staging / "gateway=gw-golden" / "date=2023-11-14"
        day.mkdir(parents=True)
        shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
        staging.rename(landing)   # mounted: all at once
        [report] = wait_until(lambda: reports(out), timeout=120, what="a pass that works")
        assert report["rows_added"] == 10
        [recovered] = wait_until(lambda: lines("succeeded again"), timeout=30,
                                 what="the recovery logged")
        assert "after" in recovered
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert len(lines("ingest pass failed")) == 1
    assert not lines("Traceback")


def test_sigterm_to_the_whole_process_group_stops_it_cleanly(tmp_path):
    """systemctl stop (and timeout(1)) signal every process of the unit, the JVM included:
    the command still exits 0, without a traceback from stopping a Spark that is gone
    already, nor py4j's log of each lost connection."""
    landing, warehouse, day = golden_landing(tmp_path)
    err = tmp_path / "stderr"
    proc = start(tmp_path, landing, warehouse, stderr=err.open("wb"), start_new_session=True)
    try:
        wait_until(lambda: reports(tmp_path / "stdout"), timeout=120, what="the first pass")
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    # (PySpark's accumulator thread may still print the EOF of its socket: not the command's.)
    text = err.read_text(errors="replace")
    assert "edgebroker/spark/cli.py" not in text and "py4j.clientserver" not in text, text


def test_a_jvm_that_dies_on_its_own_makes_the_command_exit_non_zero_in_one_line(tmp_path):
    """Spark's JVM killed (as the OOM killer would), not the command: no later pass can work,
    so the command says so in one line and exits 1 for systemd to start it again, rather than
    failing every pass forever."""
    landing, warehouse, day = golden_landing(tmp_path)
    err = tmp_path / "stderr"
    proc = start(tmp_path, landing, warehouse, stderr=err.open("wb"), start_new_session=True)
    try:
        wait_until(lambda: reports(tmp_path / "stdout"), timeout=120, what="the first pass")
        children = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(proc.pid)],
                                  capture_output=True, text=True, check=True).stdout
        [jvm] = [int(line.split()[0]) for line in children.splitlines() if "java" in line]
        os.kill(jvm, signal.SIGKILL)
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    lines = err.read_text(errors="replace").splitlines()
    [gone] = [line for line in lines if "Spark is gone" in line]
    assert "JVM does not answer" in gone and "exiting" in gone, gone
    assert not [line for line in lines if "retried every" in line]


def test_once_says_a_failed_pass_in_one_line_and_makes_no_checkpoint_for_a_missing_landing(
        tmp_path):
    """A mistyped --landing: --once ended in a 28-line traceback (the error last, after the
    Python and py4j frames) and had made <warehouse>/_checkpoint first. Now one line naming
    the landing area, exit 1, nothing made; --debug logs the traceback as well."""
    landing, warehouse = tmp_path / "no-such-landing", tmp_path / "warehouse"
    for debug in ([], ["--debug"]):
        done = subprocess.run(
            [sys.executable, "-m", "edgebroker.spark", "ingest", "--landing", str(landing),
             "--warehouse", str(warehouse), "--once", *debug], cwd=tmp_path, env=start_env(),
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, done.stderr
        said = [line for line in done.stderr.splitlines() if "edgebroker-spark:" in line]
        assert said == [f"edgebroker-spark: ingest pass failed: FileNotFoundError: the landing "
                        f"area file:{landing} does not exist: nothing done"], done.stderr
        assert ("Traceback" in done.stderr) == bool(debug), done.stderr
        assert not warehouse.exists()


def test_an_interval_the_wait_cannot_make_is_a_usage_error(tmp_path):
    """`--interval inf` ran one pass and then ended in an OverflowError traceback; `nan` got
    past the check (nan <= 0 is false) and ran passes back to back. Both, 0 and past the
    longest wait are usage errors (exit 2, one line), before Spark starts."""
    for value in ("inf", "nan", "0", "-1", "1e7", "x"):
        r = subprocess.run([sys.executable, "-m", "edgebroker.spark", "ingest", "--landing",
                            str(tmp_path), "--warehouse", str(tmp_path / "w"), "--continuous",
                            "--interval", value], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (value, r.stderr)
        assert "argument --interval: " + value in r.stderr.splitlines()[-1], r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists()
