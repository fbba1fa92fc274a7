"""A full disk, for real: a 1 MiB tmpfs mounted by the test in a private mount namespace.

The test re-runs itself under ``unshare --mount`` (plus ``--user --map-root-user`` when not
root), so the mount is private to that process and disappears with it, even if the test dies.
Inside, it mounts the tmpfs, fills it with a filler file and the log, and checks: the write
fails with ENOSPC and a clear error naming the file, the file is left exactly as it was (no
partial record), the records stay pending and are written when space returns, nothing written
before is lost, and the log reopens cleanly.
"""

from __future__ import annotations

import errno
import os

import pytest

from edgebroker.commitlog import CommitLog, Flusher, LogFullError, LogWriteError

from diskfull import fill, fill_up, in_private_mount_namespace, mount_tmpfs

from .logutil import Clock, append_n, open_log, segment_files

@pytest.mark.parametrize("payload_size", [3000, 40_000])  # copied / written from where it is
def test_disk_full_loses_nothing_and_recovers(tmp_path, request, payload_size):
    if not in_private_mount_namespace(request):
        return
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    fill(mnt / "filler", 600 * 1024)
    log = open_log(mnt / "log", segment_bytes=64 * 1024)
    fl = Flusher(log, "batch", flush_interval_ms=10)
    fl.start()
    payload = os.urandom(payload_size)
    written = 0
    error = None
    for i in range(1000):
        log.append(1000 + i, 1, False, b"dev", b"t/%d" % i, payload)
        try:
            written = log.write_pending()
        except LogWriteError as exc:
            error = exc
            break
        fl.notify_written()
    assert error is not None, "the tmpfs never filled up"
    assert error.errno == errno.ENOSPC
    assert str(mnt / "log") in str(error) and "No space left on device" in str(error)
    pending = log.next_offset - written
    assert pending >= 1 and log.pending_bytes > 0
    # No partial record: every segment file ends exactly after its last valid record.
    for seg in log.segments():
        assert os.path.getsize(seg.path) == seg.size_bytes
    # fsync is unaffected. Stop the flusher (its small files come and go) and take any page
    # that came free, then: retrying while still full fails the same way and changes nothing.
    fl.stop()
    assert log.durable_offset == written
    fill_up(mnt / "filler2")
    with pytest.raises(LogWriteError):
        log.write_pending()
    assert log.written_offset == written
    # Readers see everything written so far.
    assert [r.offset for r in log.read_range(0)] == list(range(written))
    # Appends beyond max_pending_bytes are refused, not buffered without bound.
    log.options.max_pending_bytes = log.pending_bytes + 100
    with pytest.raises(LogFullError):
        log.append(0, 0, False, b"", b"t", b"x" * 200)
    # Space comes back: everything pending is written, in order, nothing lost.
    (mnt / "filler").unlink()
    (mnt / "filler2").unlink()
    fl = Flusher(log, "batch", flush_interval_ms=10)
    fl.start()
    assert log.write_pending() == written + pending
    fl.notify_written()
    fl.stop()
    assert log.durable_offset == written + pending
    got = list(log.read_range(0))
    assert [r.offset for r in got] == list(range(written + pending))
    assert all(r.payload == payload for r in got)
    log.close()
    log = CommitLog.open(str(mnt / "log"), log.options)
    assert log.recovery.damage == [] and log.next_offset == written + pending
    log.close()


def test_disk_full_while_creating_a_segment(tmp_path, request):
    """The roll needs a new file and index room: when that fails the records wait too."""
    if not in_private_mount_namespace(request):
        return
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    log = open_log(mnt / "log", segment_bytes=4096)
    log.append(1, 0, False, b"c", b"t", b"x" * 3000)
    log.write_pending()
    # Fill every remaining byte, then append a record that needs a new segment.
    fill_up(mnt / "filler")
    off = log.append(2, 0, False, b"c", b"t", b"y" * 3000)
    with pytest.raises(LogWriteError) as info:
        log.write_pending()
    assert info.value.errno == errno.ENOSPC
    (mnt / "filler").unlink()
    log.write_pending()
    assert log.read(off).payload == b"y" * 3000
    assert [s.records for s in log.segments()] == [1, 1]
    log.close()
    assert len(segment_files(mnt / "log")) == 2


def test_staged_appends_fail_and_recover_like_the_long_way(tmp_path, request):
    """Small records are built in C into a staging area (CommitLog.append). Two logs, one
    with staging and one without, each on its own 1 MiB tmpfs that fills up at the same
    record: both refuse, keep and finally write exactly the same, byte for byte."""
    if not in_private_mount_namespace(request):
        return
    import random
    rnd = random.Random(11)
    mounts = [tmp_path / "staged", tmp_path / "long"]
    logs = []
    for mnt in mounts:
        mount_tmpfs(mnt, "1m")
        fill(mnt / "filler", 700 * 1024)
        logs.append(open_log(mnt / "log", segment_bytes=64 * 1024, max_pending_bytes=20_000))
    logs[1]._open_stage = lambda seg: None
    failures = refused = 0

    def both(call):
        out = []
        for log in logs:
            try:
                out.append(call(log))
            except (LogWriteError, LogFullError) as exc:
                out.append(type(exc).__name__)
        assert out[0] == out[1]
        return out[0]

    for i in range(3000):
        payload = b"p%d-" % i * rnd.randrange(40)
        if rnd.random() < 0.02:
            payload = bytes(17_000)  # held by reference, the long way in both
        refused += both(lambda log: log.append(1000 + i, 1, False, b"dev", b"t/%d" % (i % 7),
                                               payload)) == "LogFullError"
        assert logs[0].pending_bytes == logs[1].pending_bytes
        assert logs[0].next_offset == logs[1].next_offset
        if rnd.random() < 0.2:
            failures += both(lambda log: log.write_pending()) == "LogWriteError"
    assert failures and refused, (failures, refused)  # the disk filled; appends were refused
    for mnt in mounts:
        (mnt / "filler").unlink()
    assert both(lambda log: log.write_pending()) == logs[0].next_offset
    for log in logs:
        log.close()
    names = [sorted(p.name for p in (mnt / "log").iterdir()) for mnt in mounts]
    assert names[0] == names[1]
    for name in names[0]:
        assert (mounts[0] / "log" / name).read_bytes() == (mounts[1] / "log" / name).read_bytes()


def test_no_segment_file_is_made_ahead_while_little_space_is_free(tmp_path, request):
    # Making one takes segment_bytes of blocks at once: with less than twice that free the
    # last blocks stay for the files that need them (the log's own writes among them).
    if not in_private_mount_namespace(request):
        return
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    log = open_log(mnt / "log", segment_bytes=256 * 1024)
    log.make_spares()
    fill(mnt / "filler", 600 * 1024)                    # under 512 KiB free
    assert log.prepare_spare() is False
    assert not [n for n in os.listdir(mnt / "log") if n.endswith(".tmp")]
    os.unlink(mnt / "filler")
    assert log.prepare_spare() is True                  # space again: made
    assert [n for n in os.listdir(mnt / "log") if n.startswith("next-segment-")]
    log.close()
    assert not [n for n in os.listdir(mnt / "log") if n.endswith(".tmp")]


@pytest.mark.parametrize("segment_kib", [512, 64])
def test_open_on_a_full_disk(tmp_path, request, caplog, segment_kib):
    """A log reopened on a full disk opens (the rebuilt index stays in memory, the index
    room waits): its records read, a write fails like any write on a full disk, and
    succeeds once space returns; nothing is damaged. With 512 KiB segments the index room made
at the open (32 KiB) needs blocks the disk lacks; with 64 KiB ones it fits in the index
file's last block."""
    if not in_private_mount_namespace(request):
        return
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    log = open_log(mnt / "log", segment_bytes=segment_kib * 1024)
    offsets = append_n(log, 50)
    log.write_pending()
    log.close()
    fill_up(mnt / "filler")
    log = open_log(mnt / "log", segment_bytes=segment_kib * 1024)   # before: LogError, No space left
    assert "kept in memory" in caplog.text
    assert ("no room to append yet" in caplog.text) == (segment_kib == 512), caplog.text
    assert [r.offset for r in log.read_range(0)] == offsets
    off = log.append(2, 1, False, b"c", b"t", b"z" * 5000)
    with pytest.raises(LogWriteError) as info:
        log.write_pending()
    assert info.value.errno == errno.ENOSPC
    (mnt / "filler").unlink()
    assert log.write_pending() == off + 1
    log.close()
    log = open_log(mnt / "log", segment_bytes=segment_kib * 1024)
    assert log.recovery.damage == [] and log.read(off).payload == b"z" * 5000
    assert [r.offset for r in log.read_range(0)] == offsets + [off]
    report = log.verify()
    assert not report.damage and not report.index_problems, report
    log.close()


def test_close_while_full_writes_into_the_segment_file_made_ahead(tmp_path, request, caplog):
    """At close, records that a full disk kept in memory get the blocks of the next
    segment's file made ahead (freed for them): nothing is lost."""
    if not in_private_mount_namespace(request):
        return
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    log = open_log(mnt / "log", segment_bytes=256 * 1024)
    first = log.append(1000, 1, False, b"d", b"t", b"first")
    log.write_pending()                  # (a first segment would take the file made ahead)
    log.make_spares()
    assert log.prepare_spare() is True
    fill_up(mnt / "filler")
    log.append(9999, 1, False, b"d", b"t", b"last" * 2000)
    with pytest.raises(LogWriteError):
        log.write_pending()
    log.close()
    assert "freed the next segment's file made ahead" in caplog.text
    assert "are lost" not in caplog.text
    log = open_log(mnt / "log", segment_bytes=256 * 1024)
    assert [r.payload for r in log.read_range(first)] == [b"first", b"last" * 2000]
    log.close()


def _counted_and_on_disk(log) -> tuple[int, int, int]:
    """What retention counts for the sealed segments, the blocks their files hold on disk
    (``st_blocks``: the room allocated ahead included), and how many files that is."""
    sealed = [s for s in log._segments if s.sealed]
    on_disk = sum(os.stat(p).st_blocks * 512 for s in sealed for p in (s.path, s.index_path))
    return sum(s.disk_bytes() for s in sealed), on_disk, 2 * len(sealed)


@pytest.mark.parametrize("roll", ["size", "age"])
def test_retention_bytes_counts_the_room_of_sealed_segments_until_the_flusher_frees_it(
        tmp_path, request, roll):
    """(retention1 #2: retention counted a sealed segment's index at its entries while the
    file still held its 64 KiB room until the flusher trimmed it, and a segment sealed by age
    at its records while its file held segment_bytes: with small segments and a flusher
    behind, a 1 MiB disk filled under a retention_bytes of 400,000.) Here the flusher never
    runs until the end, the worst case: the log stays within the disk, and what retention
    counts is what the files hold (to the page: tmpfs counts whole pages)."""
    if not in_private_mount_namespace(request):
        return
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    clock = Clock()
    log = open_log(mnt / "log", clock, segment_bytes=64 * 1024, segment_ms=1000,
                   retention_bytes=400_000)
    log.make_spares()
    payload = bytes(200)
    for i in range(3000):                  # about ten segments' worth of records by size
        log.append(clock.now, 1, False, b"dev", b"t", payload)
        if i % 50 < 49:
            continue
        log.write_pending()                # before: ENOSPC ("cannot grow index")
        if roll == "age":                  # a few records a segment, sealed by segment_ms
            clock.now += 1000
            log.housekeeping()
        log.prepare_spare()                # (the segment-ahead thread)
        counted, on_disk, files = _counted_and_on_disk(log)
        assert counted <= on_disk <= counted + 4095 * files, (i, counted, on_disk)
    assert log.counters.segments_deleted > 0 and log.counters.write_errors == 0
    log.sync()                             # the flusher catches up: trims, frees the room
    counted, on_disk, files = _counted_and_on_disk(log)
    assert counted <= on_disk <= counted + 4095 * files, (counted, on_disk)
    assert all(s.index_file_bytes == s.count * 16 for s in log._segments if s.sealed)
    log.close()
