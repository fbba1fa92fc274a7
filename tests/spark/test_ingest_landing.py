"""The ingest job on Spark local[2], on what a landing area holds beyond whole batches: an empty
file is quarantined like any unreadable one, never left unnamed."""

from __future__ import annotations

import shutil

from edgebroker.spark.ingest import ingest_once

from spark.test_ingest import GOLDEN, table


def test_an_empty_batch_file_is_listed_and_quarantined_naming_it(spark, tmp_path):
    """Spark's file scans skip files of 0 bytes: the listing must still see one, and the run
    quarantine it with an error naming it, as it does a batch cut to 5 bytes."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    day = landing / "gateway=gw-golden" / "date=2023-11-14"
    day.mkdir(parents=True)
    shutil.copy(GOLDEN / "v1-plain.ebb.zst", day / f"{0:020d}-{9:020d}.ebb.zst")
    empty = day / f"{10:020d}-{19:020d}.ebb.zst"
    empty.write_bytes(b"")
    cut = day / f"{20:020d}-{29:020d}.ebb.zst"
    cut.write_bytes((GOLDEN / "v1-plain.ebb.zst").read_bytes()[:5])

    report = ingest_once(spark, str(landing), str(warehouse))
    assert (report["files_listed"], report["files_new"], report["rows_added"]) == (3, 3, 10)
    by_name = {q["path"].rsplit("/", 1)[-1]: q for q in report["quarantined"]}
    assert sorted(by_name) == [empty.name, cut.name]
    q = by_name[empty.name]
    assert q["error"] == f"{q['path']}: empty file (0 bytes), not a batch"
    moved = warehouse / "_quarantine" / empty.relative_to(landing)
    assert moved.exists() and moved.stat().st_size == 0 and not empty.exists()
    assert q["moved_to"].endswith(str(moved.relative_to(warehouse)))
    assert sorted(r.path.rsplit("/", 1)[-1] for r in table(spark, warehouse, "quarantine")) \
        == [empty.name, cut.name]

    again = ingest_once(spark, str(landing), str(warehouse))
    assert (again["files_listed"], again["files_new"], again["quarantined"]) == (1, 0, [])
