"""Golden files of format version 1 (tests/commitlog/golden/, made by make_golden.py there): the
writer still produces them byte for byte, and the damaged variants read as documented."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebroker.commitlog import CommitLog

from .golden.make_golden import N, record, segment_records, write_v1
from .logutil import as_tuple

GOLDEN = Path(__file__).resolve().parent / "golden"


def copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(GOLDEN / name, d)
    return d


def want(i: int) -> tuple:
    ts, qos, retain, cid, topic, payload = record(i)
    return (i, ts, qos, retain, cid, topic, payload)


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix in (".seg", ".idx")}


def test_writer_output_is_byte_for_byte_the_golden_log(tmp_path):
    write_v1(tmp_path / "log")
    assert files(tmp_path / "log") == files(GOLDEN / "v1")


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_log_reads_back(tmp_path, readonly):
    d = copy("v1", tmp_path)
    log = CommitLog.open(str(d), readonly=readonly)
    assert [as_tuple(r) for r in log.read_range(0)] == [want(i) for i in range(N)]
    assert [s.records for s in log.segments()] == [51, 9]
    assert log.recovery.damage == [] and log.recovery.index_rebuilt == []
    log.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_torn(tmp_path, readonly):
    d = copy("v1-torn", tmp_path)
    last = sorted(d.glob("*.seg"))[-1]
    pos, _ = segment_records(GOLDEN / "v1" / last.name)[-1]
    log = CommitLog.open(str(d), readonly=readonly)
    assert [r.offset for r in log.read_range(0)] == list(range(N - 1))
    assert log.next_offset == N - 1
    log.close()
    assert last.stat().st_size == (pos if not readonly else (GOLDEN / "v1-torn" / last.name).stat().st_size)


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_flipped(tmp_path, readonly):
    d = copy("v1-flipped", tmp_path)
    log = CommitLog.open(str(d), readonly=readonly)
    assert [as_tuple(r) for r in log.read_range(0)] == [want(i) for i in range(N) if i != 20]
    assert log.read(20) is None
    assert [(x.kind, x.offset) for x in log.damage] == [("corrupt", 20)]
    log.close()


def test_golden_noindex(tmp_path):
    d = copy("v1-noindex", tmp_path)
    log = CommitLog.open(str(d))
    assert [as_tuple(r) for r in log.read_range(0)] == [want(i) for i in range(N)]
    log.close()
    assert files(d) == files(GOLDEN / "v1")  # the index is back, identical


def test_golden_zerotail(tmp_path):
    d = copy("v1-zerotail", tmp_path)
    log = CommitLog.open(str(d))
    assert log.next_offset == N and log.counters.torn_bytes_truncated == 4096
    log.close()
    assert files(d) == files(GOLDEN / "v1")


@pytest.mark.parametrize("name, rc, verdict", [
    ("v1", 0, "OK"), ("v1-flipped", 1, "DAMAGED"), ("v1-torn", 0, "note"),
    ("v1-noindex", 0, "index"), ("v1-zerotail", 0, "note"),
])
def test_inspect_verify_on_the_golden_variants(tmp_path, name, rc, verdict):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "log").symlink_to(GOLDEN / name)  # read-only use: nothing may change
    before = files(GOLDEN / name)
    r = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "verify", "--data-dir",
                        str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert r.returncode == rc, r.stdout + r.stderr
    assert verdict in r.stdout
    assert files(GOLDEN / name) == before
