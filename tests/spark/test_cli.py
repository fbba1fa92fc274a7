"""``python -m edgebroker.spark ingest --continuous`` (the edgebroker-spark command) run
directly, the master from PYSPARK_SUBMIT_ARGS: a pass per interval, new files picked up, a JSON
report each pass, exit 0 on SIGTERM. Its tables are read with pyarrow, no second JVM."""

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


def test_continuous_ingest_picks_up_new_batches_and_stops_on_sigterm(tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_SUBMIT_ARGS="--master local[1] --conf spark.ui.enabled=false "
                                   "--conf spark.sql.shuffle.partitions=1 pyspark-shell")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYSPARK_PYTHON", None)   # the command sets it to its own interpreter
    out = tmp_path / "stdout"
    proc = subprocess.Popen([sys.executable, "-m", "edgebroker.spark", "ingest", "--landing",
                             str(landing), "--warehouse", str(warehouse), "--continuous",
                             "--interval", "0.5"], cwd=tmp_path, env=env,
                            stdout=out.open("wb"), stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: reports(out), timeout=120, what="the first pass")
        assert reports(out)[0]["rows_added"] == 10
        shutil.copy(GOLDEN / "v1-gap.ebb.zst", day / f"{20:020d}-{23:020d}.ebb.zst")
        later = wait_until(lambda: [r for r in reports(out) if r["files_new"]][1:],
                           timeout=120, what="a pass that finds the new batch")
        assert later[0]["files_new"] == 1 and later[0]["gaps_added"] == 1
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
