"""Segments that overlap (a segment's records appended to the one before it by a bad copy or
restore): the broker reads those offsets from the later segment, but `inspect verify` said OK
and exited 0. It reports the overlap, with the files and the offsets, and exits 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from commitlog.logutil import append_n, open_log, segment_files

REPO = Path(__file__).resolve().parents[2]


def _overlapping(tmp_path) -> tuple[Path, Path, Path, int, int]:
    """A log of 200 records whose second segment also holds the third's records."""
    data = tmp_path / "data"
    log = open_log(data / "log", segment_bytes=4096)
    append_n(log, 200)
    log.write_pending()
    log.close()
    segs = segment_files(data / "log")
    second, third = segs[1], segs[2]
    last = int(segs[3].name[:20]) - 1           # the third's last offset
    with open(second, "ab") as fh:
        fh.write(third.read_bytes()[32:])       # its records, without its header
    second.with_suffix(".idx").unlink()
    return data, second, third, int(third.name[:20]), last


def _verify(data, *fmt):
    return subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "verify", "--data-dir",
                           str(data), *fmt], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_verify_reports_overlapping_segments_and_exits_1(tmp_path):
    data, second, third, a, b = _overlapping(tmp_path)
    r = _verify(data)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"OVERLAP {second} holds offsets {a} to {b}, which {third} holds too"
            in r.stdout), r.stdout
    assert r.stdout.rstrip().endswith("DAMAGED: 1 segment(s) overlapping the next"), r.stdout


def test_verify_json_lists_the_overlap(tmp_path):
    data, second, third, a, b = _overlapping(tmp_path)
    r = _verify(data, "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] is False
    assert out["overlaps"] == [{"path": str(second), "from_offset": a, "to_offset": b,
                                "next": str(third)}]


def test_a_segment_overlapping_two_later_ones_is_named_with_each(tmp_path):
    """The second segment also holds the third's and the fourth's records: the line named
    only the third, with both ranges (offsets the third does not hold)."""
    data = tmp_path / "data"
    log = open_log(data / "log", segment_bytes=4096)
    append_n(log, 300)
    log.write_pending()
    log.close()
    segs = segment_files(data / "log")
    second, third, fourth = segs[1:4]
    with open(second, "ab") as fh:
        fh.write(third.read_bytes()[32:])
        fh.write(fourth.read_bytes()[32:])
    second.with_suffix(".idx").unlink()
    a3, a4, end = (int(s.name[:20]) for s in segs[2:5])
    r = _verify(data)
    assert r.returncode == 1, r.stdout + r.stderr
    overlaps = [ln for ln in r.stdout.splitlines() if ln.startswith("OVERLAP")]
    assert overlaps == [
        f"OVERLAP {second} holds offsets {a3} to {a4 - 1}, which {third} holds too (segments in "
        f"name order must hold increasing offsets; the broker reads them from the later one)",
        f"OVERLAP {second} holds offsets {a4} to {end - 1}, which {fourth} holds too (segments "
        f"in name order must hold increasing offsets; the broker reads them from the later "
        f"one)"], r.stdout
    assert r.stdout.rstrip().endswith("DAMAGED: 1 segment(s) overlapping the next"), r.stdout
    out = json.loads(_verify(data, "--format", "json").stdout)
    assert out["overlaps"] == [
        {"path": str(second), "from_offset": a3, "to_offset": a4 - 1, "next": str(third)},
        {"path": str(second), "from_offset": a4, "to_offset": end - 1,
         "next": str(fourth)}]
