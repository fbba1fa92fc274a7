"""retention_bytes and the session snapshot: records the snapshot on disk does not cover yet.

A restart replays the log from the last snapshot's offset; a retained message set after it is
only in the log until the next snapshot is written. Before, retention_bytes deleted such
records at once, and a crash then lost an acknowledged retained message. Now retention waits
(up to 5 s) for a snapshot covering them, and past that deletes them with a warning, counted
in retention_unsaved_records. The snapshot writer is held by a real fault: fsync of its
temporary file waits while a flag file exists (tests/faults/fsync_fault.c, "hang" mode)."""

from pathlib import Path

import pytest

import shims
from conftest import until

LOG = {"segment_bytes": 16384, "retention_bytes": 65536}


@pytest.fixture
def held_snapshots(tmp_path, monkeypatch):
    """The flag file: while it exists, writing the session snapshot waits in its fsync."""
    lib = shims.build("fsync_fault", tmp_path)
    flag = tmp_path / "hold-snapshot"
    monkeypatch.setenv("LD_PRELOAD", str(lib))
    monkeypatch.setenv("EB_FAULT_FLAG", str(flag))
    monkeypatch.setenv("EB_FAULT_PATH", "sessions.json.tmp")
    monkeypatch.setenv("EB_FAULT_MODE", "hang")
    yield flag
    flag.unlink(missing_ok=True)    # (before the broker's stop: its final snapshot)



def _retained_then_traffic(b, uid, flag: Path):
    """A retained message acknowledged while the snapshot writer is held, then about 75 KB
    of messages: retention_bytes (64 KiB) wants the segment that holds it, so the broker
    asks for a snapshot, which waits in its fsync (the log over the limit by less than the
    two segments it may grow past it meanwhile)."""
    until(lambda: Path(b.config["data_dir"], "sessions.json").exists(), 10,
           "the start's snapshot")
    flag.touch()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/cfg", b"21.5", qos=1, retain=True)        # PUBACK received
    for _ in range(75):
        pub.publish(f"{uid}/data", b"z" * 1000, qos=1)
    pub.disconnect()
    until(lambda: Path(f"{flag}.waiting").exists(), 5, "a snapshot being written")


def _retained_after_restart(broker, b, uid) -> list:
    b2 = broker(data_dir=b.config["data_dir"], log=LOG)
    c = b2.client(f"{uid}-c")
    c.subscribe(f"{uid}/cfg", qos=1)
    return [(p.topic, p.payload) for p in c.ping() if p.name == "PUBLISH"]


def test_retention_waits_for_the_snapshot_so_a_crash_keeps_a_retained_message(
        broker, uid, held_snapshots):
    b = broker(log=LOG)
    _retained_then_traffic(b, uid, held_snapshots)
    until(lambda: b.stats()["log"]["retention_waits"], 5, "retention waiting for a snapshot")
    assert not [line for line in b.logs if "deleted segment" in line], b.log_text()
    b.stop(9)                                           # SIGKILL, the snapshot still held
    held_snapshots.unlink()
    assert _retained_after_restart(broker, b, uid) == [(f"{uid}/cfg", b"21.5")]


def test_retention_deletes_unsaved_records_after_a_while_counted_and_logged(
        broker, uid, held_snapshots):
    b = broker(log=LOG)
    _retained_then_traffic(b, uid, held_snapshots)
    assert b.wait_log(lambda line: "retention_bytes deletes log records from offset" in line,
                      timeout=10), b.log_text()
    until(lambda: b.stats()["counters"].get("retention_unsaved_records"), 5,
           "retention_unsaved_records counted")
    mark = b.mark()
    held_snapshots.unlink()                             # the snapshot is written now
    assert b.wait_log(lambda line: "session snapshot written again" in line, timeout=5,
                      start=mark), b.log_text()
    # The snapshot written holds the retained message whole: a crash now keeps it.
    b.stop(9)
    assert _retained_after_restart(broker, b, uid) == [(f"{uid}/cfg", b"21.5")]


def test_a_burst_past_the_wait_allowance_deletes_at_once_counted(broker, uid, held_snapshots):
    """The log may grow past retention_bytes by two segments while retention waits (their
    descriptors are in the open files budget): a burst beyond that deletes the oldest ones
    at once, the records no snapshot covered counted and named in the deletion's line."""
    b = broker(log=LOG)
    until(lambda: Path(b.config["data_dir"], "sessions.json").exists(), 10,
           "the start's snapshot")
    held_snapshots.touch()
    pub = b.client(f"{uid}-p")
    for _ in range(300):
        pub.publish(f"{uid}/data", b"z" * 1000, qos=1)
    assert pub.ping() == []
    line = b.wait_log(lambda ln: "deleted segment" in ln and "not yet covered by the session "
                      "snapshot" in ln, timeout=10)
    assert line, b.log_text()
    until(lambda: b.stats()["counters"].get("retention_unsaved_records"), 10,
           "retention_unsaved_records counted")
    segments = len(list(Path(b.config["data_dir"], "log").glob("*.seg")))
    assert segments <= 8, segments
