"""A FIFO where the broker expects one of its state files (put there by hand or by a tool):
its open() would wait for a writer, so a blocking open hung the start before 'ready'. Each
state file read at start is opened without waiting, and something that is not a regular file
is handled as that file's damage (or a clear error), never a hang."""

from __future__ import annotations

import os


def test_fifos_at_the_logs_offset_files_are_unreadable_files_and_the_broker_starts(
        broker, tmp_path):
    log_dir = tmp_path / "data" / "log"
    log_dir.mkdir(parents=True)
    for name in ("uploaded", "recovery-point"):
        os.mkfifo(log_dir / name)
    gw = broker(data_dir=str(tmp_path / "data"))
    for name in ("uploaded", "recovery-point"):
        assert gw.wait_log(lambda ln: f"{log_dir / name}: unreadable (not a regular file "
                                      f"(a FIFO)); using 0" in ln, 5), gw.log_text()
    assert gw.stop() == 0
