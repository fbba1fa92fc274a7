"""The state directory cannot be listed (no descriptor free, EIO) just after a snapshot is
written, when the writer lists it to delete the side files of former snapshots: the snapshot
counts as written (its replay offset kept: retention may delete the log before it), a warning
says the deletion is tried again, and the next snapshot deletes them (diff39 #5: logged as a
failed snapshot with a traceback, its offset not kept, the old side file never deleted).

In-process: the listing is made to fail between the side file's write and the document's
(where the open-files limit, reached by the loop meanwhile, would make it fail)."""

from __future__ import annotations

import errno
import logging
import os
import time

from conftest import until

from edgebroker.core import retained_side, snapshot
from edgebroker.core.snapshot_retained import RetainedState


def test_a_listing_that_fails_after_the_snapshot_is_written_is_retried_at_the_next(
        tmp_path, monkeypatch, caplog):
    state_dir = str(tmp_path)
    (tmp_path / "retained-7.bin").write_bytes(b"the side file of a former run")
    failing = []
    listed, wrote = retained_side.generations, retained_side.RetainedFile.write

    def generations(directory):
        if failing:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return listed(directory)

    def write(self, plan):
        head = wrote(self, plan)
        failing.append(True)        # from now on, until the snapshot is counted written
        return head

    monkeypatch.setattr(retained_side, "generations", generations)
    monkeypatch.setattr(retained_side.RetainedFile, "write", write)
    caplog.set_level(logging.INFO, logger="edgebroker.snapshot")
    writer = snapshot.SnapshotWriter(state_dir)
    writer.start()
    try:
        retained = [RetainedState("a/b", b"payload", 1, 5)]
        now = time.time_ns() // 1_000_000
        writer.submit(snapshot.Snapshot(log_next_offset=100, written_ms=now, retained=retained))
        until(lambda: writer.saved_offset == 100 or writer.failures, 10, "the snapshot's end")
        assert (writer.written, writer.failures, writer.failing) == (1, 0, False)
        assert writer.saved_offset == 100
        assert {"retained-7.bin", "retained-8.bin", "sessions.json"} <= set(os.listdir(state_dir))
        messages = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert messages == [(logging.WARNING, f"cannot list {state_dir} to delete the files "
                             f"former snapshots left (retained messages, QoS 2 exchanges): "
                             f"Too many open files; the snapshot is written, the deletion is "
                             f"tried again at the next one")], messages
        assert not any(r.exc_info for r in caplog.records)
        failing.clear()
        writer.submit(snapshot.Snapshot(log_next_offset=200, written_ms=now + 1,
                                        retained=retained))
        until(lambda: writer.saved_offset == 200 or writer.failures, 10, "the next snapshot")
        assert (writer.written, writer.failures) == (2, 0)
        assert not os.path.exists(tmp_path / "retained-7.bin")
        assert os.path.exists(tmp_path / "retained-8.bin")
        assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    finally:
        writer.stop()
