"""The same ingest job on a Spark standalone cluster on loopback (a master and one worker
started from the scripts pyspark ships), submitted with ``spark-submit --master
spark://127.0.0.1:PORT`` and the job file unchanged: the same tables as a local run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from edgebroker.spark.ingest import ingest_once

from spark.test_ingest import GOLDEN, table
from uploader.test_uploader import wait_until

SPARK_HOME = os.path.dirname(pyspark.__file__)
REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "edgebroker" / "spark" / "cli.py"


def spark_env() -> dict:
    env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def start(tmp_path: Path, name: str, args: list[str], ready: str) -> tuple[subprocess.Popen, str]:
    """A Spark daemon in the foreground (spark-class), and the first match of ``ready`` in its
    log once it appears."""
    out = tmp_path / f"{name}.log"
    proc = subprocess.Popen([f"{SPARK_HOME}/bin/spark-class", *args], cwd=tmp_path,
                            env=spark_env(), stdout=out.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)

    def found():
        assert proc.poll() is None, f"{name} exited:\n{out.read_text()[-3000:]}"
        m = re.search(ready, out.read_text())
        return m and m.group(0)
    return proc, wait_until(found, timeout=90, what=f"the Spark {name}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path):
    daemons = []
    try:
        master, url = start(tmp_path, "master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
            "--webui-port", "0"], r"spark://127\.0\.0\.1:\d+")
        daemons.append(master)
        worker, _ = start(tmp_path, "worker", [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
            "--webui-port", "0", "--cores", "2", "--memory", "1g",
            "--work-dir", str(tmp_path / "work"), url],
            r"Successfully registered with master")
        daemons.append(worker)
        yield url
    finally:
        for proc in reversed(daemons):
            stop(proc)


def landing_area(root: Path) -> Path:
    day = root / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    shutil.copy(GOLDEN / "v1-gap.ebb.zst", day / f"{20:020d}-{23:020d}.ebb.zst")
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / "copy.ebb.zst")
    (day / f"{30:020d}-{39:020d}.ebb.zst").write_bytes(b"not a batch")
    return root


def tables(spark, warehouse: Path) -> dict:
    return {
        "messages": sorted(tuple(r) for r in table(spark, warehouse, "messages")),
        "topic_hourly": sorted(tuple(r) for r in table(spark, warehouse, "topic_hourly")),
        "gaps": sorted(tuple(r)[:4] for r in table(spark, warehouse, "gaps")),
        "quarantined": sorted(p.relative_to(warehouse).as_posix()
                              for p in (warehouse / "_quarantine").rglob("*.ebb.zst")),
    }


def test_the_job_on_a_standalone_cluster_gives_the_local_result(spark, cluster, tmp_path):
    landing = landing_area(tmp_path / "cluster-landing")
    warehouse = tmp_path / "cluster-warehouse"
    run = subprocess.run(
        [f"{SPARK_HOME}/bin/spark-submit", "--master", cluster,
         "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=2",
         str(JOB), "ingest", "--landing", str(landing), "--warehouse", str(warehouse), "--once"],
        cwd=tmp_path, env=spark_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(report) == 1 and '"rows_added": 14' in report[0], run.stdout
    work = tmp_path / "work"
    assert list(work.glob("app-*/*/stderr")), "an executor of the worker ran the job"

    local_landing = landing_area(tmp_path / "local-landing")
    local_warehouse = tmp_path / "local-warehouse"
    ingest_once(spark, str(local_landing), str(local_warehouse))
    got, want = tables(spark, warehouse), tables(spark, local_warehouse)
    assert got == want
    assert len(got["messages"]) == 14 and got["quarantined"] == [
        f"_quarantine/gateway=gw-golden/date=2023-11-14/{30:020d}-{39:020d}.ebb.zst"]
