"""A read-only open (``inspect verify``, ``segments``, ``tail``) of a log the broker writes,
while retention deletes its oldest segments: what was deleted since the listing is dropped,
not reported as offsets missing between segments or an index missing."""

from __future__ import annotations

from edgebroker.commitlog import CommitLog

from .logutil import append_n, open_log, segment_files


def test_segments_retention_deletes_during_a_readonly_open_are_no_damage(tmp_path, monkeypatch):
    d = tmp_path / "log"
    log = open_log(d, segment_bytes=4096)
    append_n(log, 300)
    log.write_pending()
    log.close()
    segs = segment_files(d)
    assert len(segs) > 4
    opened = []
    real = CommitLog._open_segment

    def open_then_retention_runs(self, seg, is_last, full_scan):
        opened.append(seg.path)
        if len(opened) == 2:    # the reader holds segment 0; retention deletes 0 and 1
            for p in segs[:2]:
                p.unlink()
                p.with_suffix(".idx").unlink()
        return real(self, seg, is_last, full_scan)

    monkeypatch.setattr(CommitLog, "_open_segment", open_then_retention_runs)
    reader = CommitLog.open(str(d), readonly=True)
    try:
        report = reader.verify()
        assert report.ok, (report.missing, report.index_problems)
        assert report.missing == [] and report.index_problems == []
        assert [s.path for s in reader.segments()] == [str(p) for p in segs[2:]]
        first = int(segs[2].name[:20])
        assert [r.offset for r in reader.read_range(0)] == list(range(first, 300))
    finally:
        reader.close()
