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


def test_a_fifo_at_the_snapshot_is_moved_aside_as_damaged_and_the_broker_starts(
        broker, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "sessions.json")
    gw = broker(data_dir=str(data))
    assert gw.wait_log(lambda ln: "sessions.json: cannot read: not a regular file (a FIFO)"
                                  in ln and "moved it to" in ln, 5), gw.log_text()
    assert (data / "sessions.json.damaged").exists()
    assert gw.stop() == 0


def test_a_fifo_at_a_qos2_exchange_journal_file_is_skipped_with_an_error(broker, tmp_path):
    """The journal is read after a snapshot: a FIFO among its files is named and skipped."""
    gw = broker(data_dir=str(tmp_path / "data"))
    gw.client("s", clean=False).subscribe("t", qos=2)       # a snapshot is written
    assert gw.stop() == 0
    journal = tmp_path / "data" / "exchanges-999999.jsonl"
    os.mkfifo(journal)
    gw = broker(data_dir=str(tmp_path / "data"))
    assert gw.wait_log(lambda ln: f"{journal}: not a regular file (a FIFO): its QoS 2 "
                                  f"exchange records are not applied" in ln, 5), gw.log_text()
    assert gw.stop() == 0


def test_a_fifo_at_the_uploaders_intent_file_is_unreadable_and_the_broker_starts(
        broker, tmp_path):
    upload = tmp_path / "data" / "upload"
    upload.mkdir(parents=True)
    os.mkfifo(upload / "intent")
    gw = broker(data_dir=str(tmp_path / "data"), upload={"url": f"file://{tmp_path}/landing"})
    assert gw.wait_log(lambda ln: f"{upload / 'intent'}: unreadable (not a regular file "
                                  f"(a FIFO))" in ln, 5), gw.log_text()
    assert gw.stop() == 0


def test_fifos_at_the_snapshots_reserve_and_temporary_file_do_not_stop_snapshots(
        broker, tmp_path):
    """The snapshot writer's reserve and the temporary file a snapshot is written to are
    opened for writing: a FIFO there waited for a reader for ever (no snapshot again, and a
    stop that timed out). The reserve is logged as not kept; the temporary file is ours and
    replaced."""
    from conftest import wait_for_snapshot
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "sessions.json.reserve")
    os.mkfifo(data / "sessions.json.tmp")
    gw = broker(data_dir=str(data))
    gw.client("s1", clean=False).subscribe("t", qos=1)
    wait_for_snapshot(str(data), "s1")
    assert gw.wait_log(lambda ln: "cannot keep" in ln and "sessions.json.reserve: not a "
                                  "regular file (a FIFO)" in ln, 5), gw.log_text()
    assert gw.stop() == 0


def test_a_fifo_at_the_uploaders_reserve_does_not_stop_the_start(broker, tmp_path):
    upload = tmp_path / "data" / "upload"
    upload.mkdir(parents=True)
    os.mkfifo(upload / "reserve")
    gw = broker(data_dir=str(tmp_path / "data"), upload={"url": f"file://{tmp_path}/landing"})
    assert gw.wait_log(lambda ln: f"{upload / 'reserve'}: not a regular file (a FIFO)" in ln,
                       5), gw.log_text()
    assert gw.stop() == 0


def test_a_fifo_at_the_uploaders_batch_file_is_replaced_and_the_batch_shipped(
        broker, tmp_path):
    """The batch file is ours, written anew for each batch: a FIFO there (the uploader's
    open waited for a reader for ever) is replaced."""
    from uploader.test_uploader import landed_offsets, publish, upload_config, uploaded, wait_until
    upload = tmp_path / "data" / "upload"
    upload.mkdir(parents=True)
    os.mkfifo(upload / "batch.ebb.zst.tmp")
    landing = tmp_path / "landing"
    landing.mkdir()
    gw = broker(data_dir=str(tmp_path / "data"), upload=upload_config(landing, batch_max_age=1))
    publish(gw, 0, 5)
    wait_until(lambda: uploaded(gw) == 5, timeout=20, what="the batch uploaded")
    assert landed_offsets(landing) == [0, 1, 2, 3, 4]
    assert gw.stop() == 0
