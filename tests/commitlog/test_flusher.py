"""The flusher thread and ``sync()`` from another thread while the core thread appends, writes,
rolls and deletes segments."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import shims

from edgebroker.commitlog import Flusher

from .logutil import append_n, open_log


def durable_queue():
    q: queue.Queue = queue.Queue()
    return q, q.put


@pytest.mark.parametrize("durability", ["batch", "sync"])
def test_written_records_become_durable_and_are_reported(tmp_path, durability):
    log = open_log(tmp_path / "log")
    q, on_durable = durable_queue()
    fl = Flusher(log, durability, flush_interval_ms=50, on_durable=on_durable)
    fl.start()
    try:
        append_n(log, 10)
        log.write_pending()
        fl.notify_written()
        assert q.get(timeout=5) == 10
        assert log.durable_offset == 10
        append_n(log, 5)
        log.write_pending()
        fl.notify_written()
        assert q.get(timeout=5) == 15
    finally:
        fl.stop()
    assert not fl.is_alive()
    log.close()


def test_batch_groups_fsyncs_by_the_interval(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=1 << 20)
    fl = Flusher(log, "batch", flush_interval_ms=100)
    fl.start()
    try:
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            append_n(log, 5)
            log.write_pending()
            fl.notify_written()
            time.sleep(0.002)
        elapsed = time.monotonic() - start
    finally:
        fl.stop()
    assert fl.syncs <= elapsed / 0.1 + 3  # not one per write (there were hundreds)
    assert log.durable_offset == log.written_offset
    log.close()


def test_sync_mode_syncs_each_notification_promptly(tmp_path):
    log = open_log(tmp_path / "log")
    q, on_durable = durable_queue()
    fl = Flusher(log, "sync", flush_interval_ms=10_000, on_durable=on_durable)
    fl.start()
    try:
        for i in range(1, 6):
            append_n(log, 1)
            log.write_pending()
            t0 = time.monotonic()
            fl.notify_written()
            assert q.get(timeout=5) == i
            assert time.monotonic() - t0 < 2.0  # not waiting for the (long) interval
    finally:
        fl.stop()
    log.close()


def test_none_only_syncs_rolled_segments_and_at_stop(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=4096)
    q, on_durable = durable_queue()
    fl = Flusher(log, "none", flush_interval_ms=20, on_durable=on_durable)
    fl.start()
    try:
        append_n(log, 300)  # several rolls
        log.write_pending()
        fl.notify_written()
        rp = tmp_path / "log" / "recovery-point"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if rp.exists() and json.loads(rp.read_text())["recovery_point"] == log.segments()[-1].base_offset:
                break
            time.sleep(0.02)
        # Rolled segments were fsynced (the recovery point moved past them) ...
        assert json.loads(rp.read_text())["recovery_point"] == log.segments()[-1].base_offset
        # ... but nothing was reported durable for acknowledgements.
        assert log.durable_offset == 0 and q.empty()
    finally:
        fl.stop()
    assert q.get(timeout=1) == 300  # the final sync at stop
    assert log.durable_offset == 300
    log.close()


def test_stop_makes_everything_durable(tmp_path):
    log = open_log(tmp_path / "log")
    fl = Flusher(log, "batch", flush_interval_ms=60_000)
    fl.start()
    append_n(log, 7)
    log.write_pending()
    fl.stop()
    assert log.durable_offset == 7
    log.close()


def test_bad_settings():
    with pytest.raises(ValueError, match="durability"):
        Flusher(None, "sometimes")
    with pytest.raises(ValueError, match="flush_interval_ms"):
        Flusher(None, "batch", 0)


def test_sync_from_another_thread_while_appending_rolling_and_deleting(tmp_path):
    """The core thread appends, writes, rolls (small segments) and runs retention (which deletes
    segments) while a second thread calls sync() as fast as it can. No errors, the durable
    offset only grows and never passes what was written, every record is readable."""
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=40_000)
    stop = threading.Event()
    seen = []
    errors = []

    def syncer():
        try:
            while not stop.is_set():
                written_before = log.written_offset
                d = log.sync()
                assert d >= written_before
                seen.append(d)
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=syncer)
    t.start()
    try:
        for _ in range(300):
            append_n(log, 7)
            log.write_pending()
            log.housekeeping()
            assert log.durable_offset <= log.written_offset
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors
    assert seen == sorted(seen) and len(seen) > 10
    assert log.sync() == log.written_offset == 2100
    assert log.counters.segments_deleted > 0 and log.counters.segments_rolled > 20
    assert [r.offset for r in log.read_range(0)] == list(range(log.first_offset, 2100))
    # Every sealed segment's index was trimmed by a sync (none before the roll that sealed it).
    for seg in log.segments()[:-1]:
        idx = tmp_path / "log" / f"{seg.base_offset:020d}.idx"
        assert idx.stat().st_size == seg.records * 16
    log.close()


def _not_tmpfs(tmp_path):
    """A directory on a disk file system (tmpfs pages cannot be dropped from memory)."""
    best, fstype = "", ""
    with open("/proc/mounts") as fh:
        for line in fh:
            mount, kind = line.split()[1:3]
            if str(tmp_path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
                best, fstype = mount, kind
    if fstype not in ("tmpfs", "ramfs"):
        return tmp_path
    return Path(tempfile.mkdtemp(dir="/var/tmp"))


def resident_pages(path) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages in all), with mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_sealed_segments_leave_the_page_cache_once_fsynced(tmp_path):
    base = _not_tmpfs(tmp_path)
    try:
        log = open_log(base / "log", segment_bytes=256 * 1024)
        for i in range(40):  # 40 × 32 KiB: a few segments
            log.append(1_700_000_000_000 + i, 1, False, b"dev", b"t/big", bytes([i]) * 32768)
        log.write_pending()
        segments = [str(base / "log" / f"{s.base_offset:020d}.seg") for s in log.segments()]
        assert len(segments) >= 4
        assert all(resident_pages(p)[0] > 0 for p in segments)  # just written: cached
        assert log.sync() == 40
        for path in segments[:-1]:
            assert resident_pages(path)[0] == 0, path  # sealed and on disk: dropped
        cached, pages = resident_pages(segments[-1])
        assert cached == pages  # the segment being written stays cached
        assert [log.read(i).payload[0] for i in range(40)] == list(range(40))  # still readable
        log.close()
    finally:
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


def _retention_deletes_the_first_segment(log) -> tuple:
    """Fill 4 KiB segments (retention 8 KiB) until the first is deleted: (it, its descriptors)."""
    fds = []
    for i in range(40):
        log.append(1_700_000_000_000 + i, 0, False, b"c", b"t", b"x" * 1500)
        log.write_pending()
        if i == 5:
            first = log._segments[0]
            fds = [first.fd, first.index_fd]
            assert all(os.fstat(fd).st_nlink == 1 for fd in fds)
    assert first.deleted and log.counters.segments_deleted >= 3
    return first, fds


def _closed(fds) -> bool:
    """Closed: each number is free, or a live file has it now (not the deleted one)."""
    for fd in fds:
        try:
            if os.fstat(fd).st_nlink == 0:
                return False
        except OSError:
            pass
    return True


def test_the_flusher_closes_what_retention_deleted(tmp_path):
    """The last close of a deleted segment frees its blocks, which can wait for the disk (a
    synchronous discard, say): with a flusher running, the core leaves it to the flusher,
    which does it at once (not at its next interval: the files hold disk space)."""
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=8192)
    fl = Flusher(log, "none", flush_interval_ms=60_000)  # no idle tick during the test
    closers = []
    closed = threading.Event()
    close_retired = log.close_retired

    def watched(stop=False):  # the real close, and who made it
        if log._retired:
            closers.append(threading.current_thread())
            closed.set()
        close_retired(stop)
    log.close_retired = watched
    fl.start()
    try:
        _, fds = _retention_deletes_the_first_segment(log)
        assert closed.wait(10)
    finally:
        fl.stop()
    assert closers and all(t is fl for t in closers)
    assert _closed(fds)
    log.close()


def test_after_the_flusher_stops_the_core_closes_deleted_segments_itself(tmp_path):
    """Whoever deletes a segment closes its files again once the flusher has ended (stopping,
    or a failed thread): nothing waits for a thread that is gone."""
    log = open_log(tmp_path / "log", segment_bytes=4096, retention_bytes=8192)
    fl = Flusher(log, "none", flush_interval_ms=60_000)
    fl.start()
    fl.stop()
    _, fds = _retention_deletes_the_first_segment(log)
    assert log._retired is None and _closed(fds)
    log.close()


HANG_SCRIPT = r'''
import json, logging, os, sys, time
sys.path.insert(0, os.environ["EB_TESTS"])
from edgebroker.commitlog import Flusher, log as clog
from commitlog.logutil import append_n, open_log
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
clog.CLOSE_SYNC_WAIT = 0.5
path, flag = sys.argv[1], os.environ["EB_FAULT_FLAG"]
log = open_log(path, segment_bytes=4096)
fl = Flusher(log, "sync", flush_interval_ms=50)
fl.start()
open(flag, "w").close()                     # from now on fsyncs of the log wait
append_n(log, 300)                          # several segments
written = log.write_pending()
fl.notify_written()
deadline = time.monotonic() + 10
while not os.path.exists(flag + ".waiting") and time.monotonic() < deadline:
    time.sleep(0.01)
fl.stop(timeout=0.5)                        # gives up: the thread waits in an fsync
alive = fl.is_alive()
log.close()                                 # must not report the waiting fsync as done
durable = log.durable_offset
os.unlink(flag)                             # the disk answers again
fl.join(10)
rp = os.path.join(path, "recovery-point")
print(json.dumps({"written": written, "alive_after_stop": alive, "durable_at_close": durable,
                  "recovery_point": json.load(open(rp))["recovery_point"] if os.path.exists(rp)
                  else None, "flusher_ended": not fl.is_alive()}))
'''


def test_close_does_not_count_an_fsync_that_still_waits_for_the_disk(tmp_path):
    """The flusher's fsync hangs (a disk that does not answer, made real by an LD_PRELOAD
    shim: tests/faults/fsync_fault.c). stop() gives up waiting for the thread; close() must
    then neither run a sync of its own that finds nothing left and calls everything durable,
    nor record a recovery point that the next start would trust without scanning."""
    lib = shims.build("fsync_fault", tmp_path)
    env = dict(os.environ, LD_PRELOAD=str(lib), EB_FAULT_FLAG=str(tmp_path / "hang"),
               EB_FAULT_PATH="/log/", EB_FAULT_MODE="hang",   # every fsync of the log hangs
               EB_TESTS=str(Path(__file__).parent.parent))
    proc = subprocess.run([sys.executable, "-c", HANG_SCRIPT, str(tmp_path / "log")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["written"] == 300 and out["alive_after_stop"] and out["flusher_ended"], out
    assert out["durable_at_close"] < 300, out
    assert out["recovery_point"] in (None, 0), out
    assert "the flusher thread has not stopped after 0.5 s" in proc.stderr
    assert "an fsync of the log has not finished after 0.5 s" in proc.stderr
    # The next start scans what was not known to be synced and finds everything.
    log = open_log(tmp_path / "log", segment_bytes=4096)
    assert log.next_offset == 300 and log.recovery.damage == []
    log.close()


def test_the_flusher_makes_each_new_segments_file_ahead(tmp_path):
    log = open_log(tmp_path / "log", segment_bytes=64 * 1024)
    fl = Flusher(log, "batch", flush_interval_ms=10)
    fl.start()
    try:
        for i in range(4):
            assert log.spare_ready.wait(10)   # made at start, and again after each roll
            spares = [n for n in os.listdir(tmp_path / "log") if n.startswith("next-segment-")]
            assert len(spares) == 1
            log.append(1_700_000_000_000 + i, 1, False, b"dev", b"t", bytes([i]) * 60_000)
            log.write_pending()               # a segment of its own: it takes the spare
            tail = log._tail
            assert tail.base_offset == i and tail.preallocated
            assert os.stat(tail.path).st_blocks * 512 >= 64 * 1024 > tail.size
    finally:
        fl.stop()
        log.close()
    assert not [n for n in os.listdir(tmp_path / "log") if n.startswith("next-segment-")]
    with open_log(tmp_path / "log") as log:
        assert [r.payload[0] for r in log.read_range(0)] == [0, 1, 2, 3]
