"""Closing the log when its last fsync cannot run: one error line, and the rest of the close
(the indexes, the files, the directory lock) still happens."""

from __future__ import annotations

import os
import resource

from .logutil import append_n, as_tuple, expected, open_log

T0 = 1_700_000_000_000


def test_close_with_no_descriptor_for_the_fsync_logs_it_and_still_closes(tmp_path, caplog):
    """At the open files limit the fsync's ``dup`` fails with EMFILE: close() logs it, naming
    the file, writes no recovery point for what was not synced, and closes its files."""
    log = open_log(tmp_path / "log", segment_bytes=4096)
    append_n(log, 100)           # a few segments, the last ones not fsynced
    log.write_pending()
    before = set(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(before) + 64, hard))
        while True:             # every descriptor taken
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        with caplog.at_level("ERROR", logger="edgebroker.commitlog"):
            log.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1, lines
    assert "cannot duplicate a descriptor to fsync" in lines[0]
    assert str(tmp_path / "log") in lines[0] and "Too many open files" in lines[0]
    assert log.counters.fsync_errors == 1
    assert not (tmp_path / "log" / "recovery-point").exists()
    # Every file of the log closed, the directory lock released: it opens again, all there.
    assert not any(seg.fd >= 0 for seg in log._segments)
    assert len(set(os.listdir("/proc/self/fd")) - before) == 0
    again = open_log(tmp_path / "log", segment_bytes=4096)
    assert [as_tuple(r) for r in again.read_range(0)] == [expected(i, T0 + i * 10)
                                                         for i in range(100)]
    again.close()
