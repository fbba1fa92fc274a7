"""Sessions reading the log across records a start could not find (core.catchup): records
damaged in a segment, and a segment missing from the log. What is lost is counted as
``log_gap`` for the session and broker-wide, and logged with the offsets and a true cause."""

import subprocess
import sys
from pathlib import Path

from conftest import REPO


def _log_dir(b) -> Path:
    return Path(b.config["data_dir"]) / "log"


def _received(client, timeout: float = 2.0) -> list[int]:
    got = []
    for _ in range(1000):
        try:
            got.append(int(client.recv_publish(timeout=timeout, ack=True).payload[:4]))
        except (AssertionError, TimeoutError):
            break
    return got


def test_a_damaged_first_record_is_not_called_a_retention_deletion(broker, uid):
    """The first record of the log fails its CRC: the session's cursor below the first record
    kept moves on, counted as log_gap; the line said retention deleted it, which it did not."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(10):
        pub.publish(f"{uid}/t", b"%04d" % i, qos=1)
    pub.disconnect()
    b.stop()
    seg = _log_dir(b) / "00000000000000000000.seg"
    data = bytearray(seg.read_bytes())
    data[32] ^= 0x01                                  # the first record's CRC
    seg.write_bytes(data)
    b2 = broker(data_dir=data_dir)
    mark = b2.mark()
    again = b2.client(f"{uid}-s", clean=False)
    assert _received(again) == list(range(1, 10))
    line = b2.wait_log(lambda ln: "are lost to it" in ln and f"{uid}-s" in ln, start=mark)
    assert line and "log records 0 to 0 are lost" in line, line
    assert "(deleted by retention or damaged)" in line, line
    assert b2.client_row(f"{uid}-s")["drops"] == {"log_gap": 1}


def test_a_segment_missing_from_the_middle_is_reported_and_counted(broker, uid):
    """A segment deleted by hand (or lost by the file system) between two others: the start
    warns with the offsets and the files on either side, `inspect verify` fails, and a session
    reading across the hole counts the records as log_gap with a line naming them. Before,
    all three were silent: the session got 84 of 100 and nothing said so."""
    b, n = _stopped_with_a_session_behind(broker, uid)
    data_dir = b.config["data_dir"]
    segs = sorted(_log_dir(b).glob("*.seg"))
    gone, before, after = segs[3], segs[2], segs[4]
    lo, hi = int(gone.name[:20]), int(after.name[:20])
    gone.unlink()
    gone.with_suffix(".idx").unlink()
    verify = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "verify",
                             "--data-dir", str(data_dir)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert f"MISSING offsets {lo} to {hi - 1}" in verify.stdout, verify.stdout
    b2 = broker(data_dir=data_dir, log={"segment_bytes": 4096})
    [warning] = [ln for ln in b2.logs if "are missing: no segment holds them" in ln]
    assert f"offsets {lo} to {hi - 1}" in warning and before.name in warning, warning
    assert after.name in warning, warning
    mark = b2.mark()
    again = b2.client(f"{uid}-s", clean=False)
    assert _received(again) == [i for i in range(n) if not lo <= i < hi]
    line = b2.wait_log(lambda ln: "missing from the log" in ln and f"{uid}-s" in ln, start=mark)
    assert line and f"log records {lo} to {hi - 1} are lost" in line, line
    assert b2.client_row(f"{uid}-s")["drops"] == {"log_gap": hi - lo}
    assert b2.stats()["dropped"]["log_gap"] == hi - lo


def test_a_damaged_record_a_session_reads_past_is_counted_as_its_gap(broker, uid):
    """A payload byte flipped in a sealed segment below the recovery point: the start does not
    scan it; the session catching up passes over it. Before, it got 99 of 100 and nothing
    counted it: now the session counts it as log_gap with a line naming the offset and the
    file, and the log's damaged regions reach stats and $SYS."""
    b, n = _stopped_with_a_session_behind(broker, uid)
    data_dir = b.config["data_dir"]
    needle = b"%04d" % 30 + b"." * 200
    [seg] = [p for p in sorted(_log_dir(b).glob("*.seg")) if needle in p.read_bytes()]
    assert seg != sorted(_log_dir(b).glob("*.seg"))[-1]   # sealed, below the recovery point
    data = bytearray(seg.read_bytes())
    data[data.index(needle) + 100] ^= 0x01
    seg.write_bytes(data)
    b2 = broker(data_dir=data_dir, log={"segment_bytes": 4096}, sys_interval=1)
    mark = b2.mark()
    watch = b2.client(f"{uid}-w")
    watch.subscribe("$SYS/broker/log/damaged_regions")
    again = b2.client(f"{uid}-s", clean=False)
    assert _received(again) == [i for i in range(n) if i != 30]
    line = b2.wait_log(lambda ln: "are lost to it" in ln and f"{uid}-s" in ln, start=mark)
    assert line and "log records 30 to 30 are lost to it (damaged in" in line, line
    assert seg.name in line, line
    assert b2.client_row(f"{uid}-s")["drops"] == {"log_gap": 1}
    assert b2.stats()["log"]["damaged_regions"] == 1
    for _ in range(10):
        p = watch.recv_publish(timeout=5.0)
        if p.payload == b"1":
            break
    assert p.payload == b"1"


def _stopped_with_a_session_behind(broker, uid):
    """A broker (4 KiB segments, stopped) whose persistent session ``<uid>-s`` is offline
    behind 100 QoS 1 messages of 204 bytes on ``<uid>/t`` (payload ``%04d`` + dots): the
    broker and 100."""
    b = broker(log={"segment_bytes": 4096})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    n = 100
    for i in range(n):
        pub.publish(f"{uid}/t", b"%04d" % i + b"." * 200, qos=1)
    pub.disconnect()
    b.stop()
    return b, n


def test_records_lost_from_the_end_of_the_log_are_counted_for_a_session_behind(broker, uid):
    """After a clean stop the last segment loses its records (truncated to its header): the
    session behind was owed them. Before, only queued and unacknowledged messages were counted
    ("0 ... among them"): the session got the rest, `DROPPED 0` and no line. The same loss in
    the middle of the log was counted as log_gap."""
    b, n = _stopped_with_a_session_behind(broker, uid)
    data_dir = b.config["data_dir"]
    last = sorted(_log_dir(b).glob("*.seg"))[-1]
    lo = int(last.name[:20])
    assert 0 < lo < n
    with open(last, "r+b") as fh:
        fh.truncate(32)                              # its header only
    b2 = broker(data_dir=data_dir, log={"segment_bytes": 4096})
    line = next((ln for ln in b2.logs if "are lost to it" in ln and f"{uid}-s" in ln), None)
    assert line and f"log records {lo} to {n - 1} are lost to it (gone from the end of the " \
                    f"log)" in line, b2.log_text()
    again = b2.client(f"{uid}-s", clean=False)
    assert _received(again) == list(range(lo))
    assert b2.client_row(f"{uid}-s")["drops"] == {"log_gap": n - lo}
    assert b2.stats()["dropped"]["log_gap"] == n - lo
    pub = b2.client(f"{uid}-p")                      # new records take the lost offsets
    pub.publish(f"{uid}/t", b"%04d" % 7777, qos=1)
    assert _received(again) == [7777]
