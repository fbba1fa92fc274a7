"""An fsync that fails, under a running broker: with `durability = "sync"` nothing is
acknowledged until an fsync covers it, and everything is once fsync works again; with
`"batch"` acknowledgements go on (the records are with the OS) while the durable offset stays
where it was. Both are counted and logged once per failing spell (docs/persistence.md).

The failure is real to the broker: a small library (tests/faults/fsync_fault.c), loaded with
LD_PRELOAD, makes fsync()/fdatasync() of the log's files return EIO while a flag file exists.
"""

import subprocess
from pathlib import Path

import pytest

import mqttraw as m

SHIM = Path(__file__).parent / "faults" / "fsync_fault.c"
N = 3


@pytest.fixture
def failing_fsync(tmp_path, monkeypatch):
    """The flag file: while it exists, fsyncs of files under a `log/` directory fail."""
    lib = tmp_path / "fsync_fault.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(SHIM), "-ldl"],
                   check=True)
    flag = tmp_path / "fail-fsync"
    monkeypatch.setenv("LD_PRELOAD", str(lib))
    monkeypatch.setenv("EB_FAULT_FLAG", str(flag))
    monkeypatch.setenv("EB_FAULT_PATH", "/log/")
    return flag


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
