"""An fsync that fails, under a running broker: with `durability = "sync"` nothing is
acknowledged until an fsync covers it, and everything is once fsync works again; with
`"batch"` acknowledgements go on (the records are with the OS) while the durable offset stays
where it was. Both are counted and logged once per failing spell (docs/persistence.md).

The failure is real to the broker: a small library (tests/faults/fsync_fault.c), loaded with
LD_PRELOAD, makes fsync()/fdatasync() of the log's files return EIO while a flag file exists,
or (its "hang" mode) wait as for a disk that does not answer: the broker must still stop.
"""

import time
from pathlib import Path

import pytest

import mqttraw as m
import shims

N = 3


def _load_shim(tmp_path, monkeypatch, flag_name: str, path_part: str, mode: str = ""):
    """Brokers started from now on load the shim; fsyncs of files whose path contains
    ``path_part`` fail (``mode`` "hang": wait) while the returned flag file exists."""
    lib = shims.build("fsync_fault", tmp_path)
    flag = tmp_path / flag_name
    monkeypatch.setenv("LD_PRELOAD", str(lib))
    monkeypatch.setenv("EB_FAULT_FLAG", str(flag))
    monkeypatch.setenv("EB_FAULT_PATH", path_part)
    if mode:
        monkeypatch.setenv("EB_FAULT_MODE", mode)
    return flag


@pytest.fixture
def failing_fsync(tmp_path, monkeypatch):
    """The flag file: while it exists, fsyncs of files under a `log/` directory fail."""
    return _load_shim(tmp_path, monkeypatch, "fail-fsync", "/log/")


def _publish(b, uid):
    """N QoS 1 messages in one send: the broker reads, logs and writes them in one pass."""
    pub = b.raw()
    pub.connect(f"{uid}-p")
    pub.send(b"".join(m.publish(f"{uid}/t", b"m%d" % i, qos=1, packet_id=i)
                      for i in range(1, N + 1)))
    return pub


def test_sync_acknowledges_only_after_fsync_works_again(broker, uid, failing_fsync):
    b = broker(log={"durability": "sync", "flush_interval_ms": 50})
    failing_fsync.touch()
    mark = b.mark()
    pub = _publish(b, uid)
    assert b.wait_log(lambda line: "commit log fsync failed" in line, timeout=10, start=mark), \
        b.log_text()
    # The messages are written and held: no PUBACK while no fsync covers them.
    fig = b.stats()["log"]
    assert fig["acks_waiting"] == N and fig["fsync_errors"] >= 1, fig
    assert fig["durable_offset"] == 0 and fig["written_offset"] == fig["next_offset"] == N, fig
    failing_fsync.unlink()
    assert [pub.expect(m.PUBACK, timeout=10).packet_id for _ in range(N)] == list(range(1, N + 1))
    assert b.wait_log(lambda line: "commit log fsync works again" in line, start=mark)
    fig = b.stats()["log"]
    assert fig["acks_waiting"] == 0 and fig["durable_offset"] == fig["written_offset"], fig
    # Logged once for the whole failing spell, however many retries failed.
    assert sum("commit log fsync failed" in line for line in b.logs[mark:]) == 1


def test_batch_acknowledges_while_fsync_fails(broker, uid, failing_fsync):
    b = broker(log={"durability": "batch", "flush_interval_ms": 50})
    failing_fsync.touch()
    mark = b.mark()
    pub = _publish(b, uid)
    assert [pub.expect(m.PUBACK, timeout=10).packet_id for _ in range(N)] == list(range(1, N + 1))
    assert b.wait_log(lambda line: "commit log fsync failed" in line, timeout=10, start=mark)
    fig = b.stats()["log"]
    assert fig["fsync_errors"] >= 1 and fig["durable_offset"] < fig["written_offset"], fig
    failing_fsync.unlink()
    assert b.wait_log(lambda line: "commit log fsync works again" in line, timeout=10,
                      start=mark)
    assert b.stats()["log"]["durable_offset"] == b.stats()["log"]["written_offset"]


def test_the_broker_stops_when_the_disk_stops_answering(broker, uid, tmp_path, monkeypatch):
    """Every fsync under the broker's state directory hangs (the shim's "hang" mode: a disk
    that does not answer). SIGTERM still stops the broker, each wait for the disk bounded:
    the flusher, the final snapshot and the log's close each give up after 10 s and say so,
    and the exit status (1) says the final snapshot is missing.
    Nothing the hung fsyncs did not finish is called durable; the next start finds every
    acknowledged message."""
    flag = _load_shim(tmp_path, monkeypatch, "disk-hangs", str(tmp_path), mode="hang")
    b = broker(log={"durability": "batch", "flush_interval_ms": 50})
    sub = b.raw()
    sub.connect(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.close()
    # The snapshot holding the persistent session and its subscription is on disk (at most
    # 1 s after they changed) before the disk stops answering.
    snapshot = Path(b.config["data_dir"]) / "sessions.json"
    _wait_for(lambda: snapshot.exists() and f'"{uid}/t"'.encode() in snapshot.read_bytes())
    flag.touch()
    pub = _publish(b, uid)
    # batch: acknowledged once written to the OS, whatever the fsyncs do.
    assert [pub.expect(m.PUBACK, timeout=10).packet_id for _ in range(N)] == list(range(1, N + 1))
    _wait_for(flag.with_name("disk-hangs.waiting").exists)   # the shim: an fsync hangs now
    assert b.stop(timeout=60) == 1          # without its final snapshot (docs/persistence.md)
    text = b.log_text()
    assert "the flusher thread has not stopped after 10 s" in text, text
    assert "the session snapshot was not written within 10 s" in text, text
    assert "stopped without the final session snapshot (exit status 1)" in text, text
    assert "an fsync of the log has not finished after 10 s" in text, text
    flag.unlink()
    monkeypatch.delenv("LD_PRELOAD")
    again = broker(data_dir=b.config["data_dir"], log={"durability": "batch"})
    assert again.stats()["log"]["next_offset"] >= N
    sub = again.raw()
    sub.connect(f"{uid}-s", clean=False)
    got = [sub.expect(m.PUBLISH, timeout=10).payload for _ in range(N)]
    assert got == [b"m%d" % i for i in range(1, N + 1)]


def _wait_for(condition, timeout: float = 10.0) -> None:
    """Wait (bounded) for a file the broker or the shim writes."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
