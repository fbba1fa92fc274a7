"""The ingest job over a landing area on a disk with bad sectors: a batch file that opens but
whose bytes past its first 8 KiB fail with EIO is quarantined, its error the file system's, and
the good batches beside it are ingested; the driver's own check of a file reads it to its end.

An LD_PRELOAD shim (eio_shim.c, built here with cc: make's build-deps installs it for the C
helper) makes reads of the files whose path holds ``badsector`` fail from byte 8192 on. Hadoop's
local file system wraps that IOException in FSError, a java.lang.Error, which Spark's
ignoreCorruptFiles does not skip: the whole scan failed, every pass. The job runs in a
subprocess of its own (the shim must be in the JVM from its start): one local[1] Spark
application for all the passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from spark.test_ingest_landing import T0, land

REPO = Path(__file__).resolve().parents[2]
EIO_AT = 8192
# Run by the subprocess: two passes over the landing area, one JSON report per line; then the
# driver's open check of a file it is given.
JOB = """
import json, sys
from sparklocal import local_session
from edgebroker.spark.files import _Fs
from edgebroker.spark.ingest import ingest_once
spark = local_session("read-error", **{"spark.master": "local[1]",
                                       "spark.sql.shuffle.partitions": "1"})
landing, warehouse, probe = sys.argv[1:]
for _ in range(2):
    print(json.dumps(ingest_once(spark, landing, warehouse)), flush=True)
print(json.dumps({"open_error": _Fs(spark).open_error("file:" + probe)}), flush=True)
spark.stop()
"""


def shim(tmp_path: Path) -> Path:
    cc = shutil.which("cc")
    assert cc, "no C compiler (cc): make test's build-deps installs gcc"
    out = tmp_path / "eio_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out),
                    str(Path(__file__).with_name("eio_shim.c")), "-ldl"], check=True,
                   timeout=60)
    return out


def test_batch_files_with_a_bad_sector_are_quarantined_and_the_rest_ingested(tmp_path):
    """Two files with a bad sector among five good ones (the failed scans are halved down to the
    files that fail alone); then a file of the same kind checked by the driver, which read one
    byte of it and called it "opens now" (left for the next run, at every run)."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    good = [land(landing, [(o, T0 + o, b"g%d" % o) for o in range(10)], gateway=f"gw-{i}")
            for i in range(5)]
    bad = []
    for i in (1, 3):   # ~40 KB each, incompressible: the read fails past 8 KiB
        records = [(100 + o, T0 + 100 + o, os.urandom(2000)) for o in range(20)]
        bad.append(land(landing, records, gateway=f"gw-{i}",
                        name=f"badsector-{i}-00000000000000000100.ebb.zst"))
        assert bad[-1].stat().st_size > 4 * EIO_AT
    probe = tmp_path / "badsector-probe.bin"
    probe.write_bytes(os.urandom(3 * EIO_AT))

    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", LD_PRELOAD=str(shim(tmp_path)),
               EIO_MATCH="badsector", EIO_AT=str(EIO_AT))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    done = subprocess.run([sys.executable, "-c", JOB, str(landing), str(warehouse), str(probe)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    first, again, checked = [json.loads(line) for line in done.stdout.splitlines()
                             if line.startswith("{")]

    assert (first["files_new"], first["batches"], first["rows_added"]) == (7, 5, 50)
    assert first["changed_since_read"] == [] and first["not_moved"] == []
    assert sorted(q["path"] for q in first["quarantined"]) == [f"file:{p}" for p in bad]
    for q in first["quarantined"]:
        assert q["error"] == f"{q['path']}: cannot be read (FSError: java.io.IOException: " \
                             f"Input/output error)"
    for p in bad:
        assert not p.exists() and (warehouse / "_quarantine" / p.relative_to(landing)).exists()
    assert all(p.exists() for p in good)
    assert (again["files_listed"], again["files_new"], again["quarantined"]) == (5, 0, [])
    assert "the first pass failed reading a file: " in done.stderr
    assert "more scans to find the files that fail alone (2)" in done.stderr

    assert checked["open_error"] == "FSError: java.io.IOException: Input/output error"
