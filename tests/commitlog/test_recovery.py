"""Recovery at open, on real files damaged the ways crashes and disks damage them: a torn last
record (cut at every byte), a flipped byte in the middle, a zero-filled tail, a missing, short or
corrupt index, a damaged header, a crash between segments. Nothing valid is lost, nothing
damaged is served, and the log is writable afterwards."""

from __future__ import annotations

import os

import pytest

from edgebroker.commitlog import CommitLog, LogFormatError
from edgebroker.commitlog.format import segment_header

from .logutil import (
    append_n, as_tuple, expected, flip_byte, open_log, parse_index, parse_segment, segment_files,
)

T0 = 1_700_000_000_000


def make_log(path, n=40, **kw):
    log = open_log(path, **kw)
    append_n(log, n)
    log.write_pending()
    log.close()
    return path


def offsets(path, **kw):
    log = open_log(path, **kw)
    try:
        return [r.offset for r in log.read_range(0)], log
    finally:
        log.close()


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("stem", ["99999999999999999999", f"{1 << 63:020d}",
                                  f"{(1 << 64) - 2:020d}",
                                  f"{1 << 62:020d}", "\u00b2" * 20])
def test_a_segment_name_past_the_largest_offset_is_a_foreign_file(tmp_path, readonly, stem):
    """Twenty digits above 2^62 - 1 (or digits that are not ASCII) name no segment, nor index:
    the files are left alone and the log opens. Above 2^64 - 1 a read-only open raised
    OverflowError in the C helper, a writable one struct.error; a segment named 2^63 or more
    with a valid header took the C helper's appends for failures (each message logged twice),
    one at 2^64 - 2 stopped a start, and "²" digits raised ValueError."""
    path = make_log(tmp_path / "log", n=5)
    stray, index = path / f"{stem}.seg", path / f"{stem}.idx"
    body = segment_header(int(stem)) if stem.isascii() and int(stem) < 1 << 64 else b"not one"
    stray.write_bytes(body)
    index.write_bytes(b"not an index")
    log = CommitLog.open(str(path), readonly=True) if readonly else open_log(path)
    try:
        assert [r.offset for r in log.read_range(0)] == list(range(5))
        if not readonly:
            assert log.append(T0, 1, False, b"c", b"t", b"next") == 5
            log.write_pending()
            assert [r.offset for r in log.read_range(0)] == list(range(6))
    finally:
        log.close()
    assert stray.read_bytes() == body and index.read_bytes() == b"not an index"


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path):
    src = make_log(tmp_path / "src", n=6)
    seg = segment_files(src)[0]
    recs = parse_segment(seg)
    last = recs[-1]
    full = seg.read_bytes()
    idx = (seg.with_suffix(".idx")).read_bytes()
    for cut in range(last["position"], len(full)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / seg.name).write_bytes(full[:cut])
        (d / seg.with_suffix(".idx").name).write_bytes(idx)
        log = open_log(d)
        assert log.next_offset == 5, cut
        assert [r.offset for r in log.read_range(0)] == [0, 1, 2, 3, 4]
        assert os.path.getsize(d / seg.name) == last["position"]  # the torn bytes are gone
        if cut > last["position"]:
            assert log.counters.torn_bytes_truncated == cut - last["position"]
            assert [x.kind for x in log.recovery.damage] == ["torn"]
        # And it appends where the torn record was.
        assert log.append(T0, 1, False, b"c", b"t", b"new") == 5
        log.write_pending()
        log.close()
        log = open_log(d)
        assert log.read(5).payload == b"new" and log.read(4) is not None
        log.close()


def test_flipped_byte_in_the_middle_is_reported_and_skipped(tmp_path, caplog):
    d = make_log(tmp_path / "log", n=40, segment_bytes=1 << 20)
    seg = segment_files(d)[0]
    victim = parse_segment(seg)[17]
    flip_byte(seg, victim["payload_position"] - 1)  # inside the topic: CRC fails
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        log = open_log(d, segment_bytes=1 << 20)
    assert [r.offset for r in log.read_range(0)] == [i for i in range(40) if i != 17]
    assert log.read(17) is None and log.locate(17) is None
    assert log.read(18) is not None
    [damage] = log.recovery.damage
    assert (damage.kind, damage.offset, damage.position, damage.path) == (
        "corrupt", 17, victim["position"], str(seg))
    msgs = [r.getMessage() for r in caplog.records if "corrupt record" in r.getMessage()]
    assert len(msgs) == 1 and "offset 17" in msgs[0] and str(seg) in msgs[0]
    assert log.next_offset == 40
    # The file is not truncated: valid records follow the damage.
    used = [e for e in parse_index(seg.with_suffix(".idx")) if e != (0, 0, 0)]  # room is preallocated
    assert len(used) == 39
    log.append(T0, 0, False, b"c", b"t", b"more")
    log.write_pending()
    assert log.read(40).payload == b"more"
    log.close()


def test_damaged_length_field_in_the_middle(tmp_path):
    d = make_log(tmp_path / "log", n=40, segment_bytes=1 << 20)
    seg = segment_files(d)[0]
    victim = parse_segment(seg)[9]
    flip_byte(seg, victim["position"] + 5)  # the length: the scan must find record 10 again
    got, log = offsets(d, segment_bytes=1 << 20)
    assert got == [i for i in range(40) if i != 9]
    assert [x.kind for x in log.recovery.damage] == ["corrupt"]


def test_corrupt_last_record_of_a_sealed_segment_is_truncated_like_a_torn_tail(tmp_path):
    d = make_log(tmp_path / "log", n=200, segment_bytes=4096)
    first = segment_files(d)[0]
    recs = parse_segment(first)
    (d / "recovery-point").unlink()  # as after a crash: every segment is scanned
    flip_byte(first, recs[-1]["payload_position"] - 1)
    got, log = offsets(d, segment_bytes=4096)
    lost = recs[-1]["offset"]
    assert got == [i for i in range(200) if i != lost]
    assert os.path.getsize(first) == recs[-1]["position"]


def test_zero_filled_tail(tmp_path):
    d = make_log(tmp_path / "log", n=20, segment_bytes=1 << 20)
    seg = segment_files(d)[0]
    size = os.path.getsize(seg)
    with open(seg, "ab") as fh:
        fh.write(bytes(8192))  # what some filesystems leave after a crash
    got, log = offsets(d, segment_bytes=1 << 20)
    assert got == list(range(20))
    assert os.path.getsize(seg) == size
    assert log.counters.torn_bytes_truncated == 8192


@pytest.mark.parametrize("damage", ["missing", "empty", "short", "odd size", "garbage", "flipped",
                                    "zero tail"])
def test_index_damage_is_rebuilt(tmp_path, damage):
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    seg = segment_files(d)[0]  # sealed, below the recovery point: only the index is checked
    idx = seg.with_suffix(".idx")
    good = idx.read_bytes()
    if damage == "missing":
        idx.unlink()
    elif damage == "empty":
        idx.write_bytes(b"")
    elif damage == "short":
        idx.write_bytes(good[:len(good) // 2 // 16 * 16])
    elif damage == "odd size":
        idx.write_bytes(good[:-5])
    elif damage == "garbage":
        idx.write_bytes(os.urandom(len(good)))
    elif damage == "flipped":
        flip_byte(idx, 16 * 7 + 5)  # a position byte of entry 7
    elif damage == "zero tail":
        idx.write_bytes(good + bytes(4096))
    log = open_log(d, segment_bytes=4096)
    assert [r.offset for r in log.read_range(0)] == list(range(300))
    assert [as_tuple(log.read(i)) for i in (0, 5, 7, 299)] == [
        expected(i, T0 + i * 10) for i in (0, 5, 7, 299)]
    log.close()
    assert idx.read_bytes() == good  # rebuilt to the same bytes
    log = open_log(d, segment_bytes=4096)
    assert log.recovery.index_rebuilt == []
    log.close()


def test_flipped_index_entry_is_repaired_when_used(tmp_path):
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    seg = segment_files(d)[0]
    idx = seg.with_suffix(".idx")
    good = idx.read_bytes()
    # Entry 7 points into the middle of record 6 instead of at record 7: the cheap check at open
    # cannot see it; the first read of offset 7 finds no record there and rebuilds the index.
    entries = parse_index(idx)
    bad = bytearray(good)
    bad[7 * 16 + 4:7 * 16 + 8] = (entries[6][1] + 3).to_bytes(4, "little")
    idx.write_bytes(bytes(bad))
    log = open_log(d, segment_bytes=4096)
    assert log.recovery.index_rebuilt == []
    assert as_tuple(log.read(7)) == expected(7, T0 + 70)
    assert log.counters.index_rebuilds == 1
    log.close()
    assert idx.read_bytes() == good


def test_a_wrong_timestamp_in_the_last_index_entry_is_rebuilt(tmp_path):
    """The last entry's timestamp (the running maximum age retention goes by) was not
    checked at open: far in the future (a flipped high bit), the segment was never deleted
    by age. Now it is checked against its record and the entry before it."""
    ts = T0 + 10 * 365 * 86_400_000
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    idx = segment_files(d)[0].with_suffix(".idx")
    good = idx.read_bytes()
    bad = bytearray(good)
    bad[-8:] = ts.to_bytes(8, "little")
    idx.write_bytes(bytes(bad))
    log = open_log(d, segment_bytes=4096)
    assert [p for p, _why in log.recovery.index_rebuilt] == [str(idx)]
    assert log.segments()[0].last_timestamp_ms == parse_index(idx)[-1][2] != ts
    log.close()
    assert idx.read_bytes() == good


def _entry_moved_into_its_record(d, k=7):
    """Entry ``k`` of the first segment's index moved forward into its own record (a flipped
    bit: the index's structure still holds, so the check at open passes it)."""
    idx = segment_files(d)[0].with_suffix(".idx")
    good = idx.read_bytes()
    bad = bytearray(good)
    bad[k * 16 + 4:k * 16 + 8] = (parse_index(idx)[k][1] + 16).to_bytes(4, "little")
    idx.write_bytes(bytes(bad))
    return idx, good


def _from_7(log, how):
    if how == "read_range":
        return [r.offset for r in log.read_range(7, 12)]
    if how == "scan":
        return [r.offset for r in log.scan("#", 7, 12)]
    if how == "read_batch":
        return [r[0] for r in log.read_batch(7, None, 5, 1 << 20, 1 << 20)[0]][:5]
    if how == "read_run":
        (_data, _base, entries, n), _next = log.read_run(7, None, 1 << 20, 1 << 20)
        return list(entries[0:5 * 5:5])
    assert how == "locate"
    where = log.locate(7)
    return [where.offset] + [log.locate(i).offset for i in range(8, 12)]


@pytest.mark.parametrize("how", ["read_range", "scan", "read_batch", "read_run", "locate"])
def test_a_read_that_starts_at_a_wrong_index_entry_loses_no_record(tmp_path, how):
    """A session catching up from offset 7 (read_batch, read_run), a replay, a scan and a
    sendfile (locate of a checked segment) start at the position the index gives: they
    skipped record 7 as damage (reported corrupt) and left the index file wrong. Now the
    entry is checked against the record's header, the index is rebuilt, counted and logged."""
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    idx, good = _entry_moved_into_its_record(d)
    log = open_log(d, segment_bytes=4096)
    assert log.recovery.index_rebuilt == []
    report = log.verify()
    assert report.ok and report.index_problems == [(str(idx), (
        "entry 7 does not match the records (the records are read right: a read that starts "
        "at the entry checks it and has the index rebuilt)"))]
    if how == "locate":   # the segment checked whole by the flusher, as a locate has it
        assert log.locate(0).offset == 0 and log.verify_step()
        assert log.counters.index_rebuilds == 0
    assert _from_7(log, how) == [7, 8, 9, 10, 11]
    assert log.damage == [] and log.counters.corrupt_regions == 0
    assert log.counters.index_rebuilds == 1
    assert idx.read_bytes() == good
    assert _from_7(log, how) == [7, 8, 9, 10, 11] and log.counters.index_rebuilds == 1
    log.close()


def test_the_uploader_finds_its_record_past_a_wrong_index_entry(tmp_path, caplog):
    """The uploader's source position came from the index unchecked: the batch lost record 7.
    It is now found by walking the segment (the uploader's thread leaves the index file to
    the core's readers: logged once)."""
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    idx, good = _entry_moved_into_its_record(d)
    records = parse_segment(segment_files(d)[0])
    log = open_log(d, segment_bytes=4096)
    for _ in range(2):
        src = log.upload_source(7)
        try:
            assert src.position == records[7]["position"]
        finally:
            os.close(src.fd)
    src = log.upload_source(8)
    os.close(src.fd)
    assert src.position == records[8]["position"]
    log.close()
    assert [r.getMessage() for r in caplog.records].count(
        f"{idx}: entry for offset 7 does not lead to its record (a damaged index); the upload "
        f"found its records by walking the segment") == 1


def test_an_index_rebuilt_by_a_read_never_shows_the_uploader_a_half_made_index(tmp_path):
    """A read on the core thread that meets a wrong entry has the index rebuilt by scanning,
    while the uploader's thread asks ``upload_source`` about the same segment. The rebuild
    closed the index's map and emptied the segment for the scan, unlocked: the uploader got
    "mmap closed" errors or the next segment (its records then reported as a gap). Now the
    new index is made aside and put in place under the log's lock."""
    import threading
    seg_bytes = 4 << 20
    log = open_log(tmp_path / "log", segment_bytes=seg_bytes)
    n = 0
    while len(segment_files(tmp_path / "log")) < 2 and n < 200_000:
        append_n(log, 5000, start_ts=T0 + 10 * n)
        n += 5000
        log.write_pending()
    log.close()
    assert len(segment_files(tmp_path / "log")) >= 2
    first = segment_files(tmp_path / "log")[0]
    _entry_moved_into_its_record(tmp_path / "log")
    log = open_log(tmp_path / "log", segment_bytes=seg_bytes)
    errors, wrong, calls = [], [], [0]
    stop = threading.Event()

    def uploader():
        while not stop.is_set() and calls[0] < 1_000_000:
            calls[0] += 1
            try:
                src = log.upload_source(1000)
            except Exception as exc:        # (what the uploader's round would fail with)
                errors.append(repr(exc))
                continue
            os.close(src.fd)
            if src.path != str(first):
                wrong.append(src.path)

    thread = threading.Thread(target=uploader)
    thread.start()
    try:
        while calls[0] < 100:               # the uploader's thread is going
            stop.wait(0.001)
        got = [r.offset for r in log.read_range(7, 12)]
    finally:
        stop.set()
        thread.join(10)
    assert got == [7, 8, 9, 10, 11] and log.counters.index_rebuilds == 1
    assert errors == [] and wrong == []
    log.close()


def test_damaged_segment_header_is_reported_records_still_read(tmp_path):
    d = make_log(tmp_path / "log", n=30, segment_bytes=1 << 20)
    seg = segment_files(d)[0]
    flip_byte(seg, 3)
    got, log = offsets(d, segment_bytes=1 << 20)
    assert got == list(range(30))
    assert log.recovery.header_damage and "checksum" in log.recovery.header_damage[0][1]
    assert seg.read_bytes()[:8] == b"EDGEBLOG"  # the last segment's header is rewritten


def test_crash_right_after_creating_a_segment(tmp_path):
    d = make_log(tmp_path / "log", n=30, segment_bytes=1 << 20)
    (d / "00000000000000000030.seg").write_bytes(b"EDGEB")  # torn header, no records
    (d / "00000000000000000030.idx").write_bytes(b"")
    log = open_log(d, segment_bytes=1 << 20)
    assert log.next_offset == 30
    assert log.append(T0, 0, False, b"c", b"t", b"x") == 30
    log.write_pending()
    log.close()
    got, _ = offsets(d, segment_bytes=1 << 20)
    assert got == list(range(31))
    assert (d / "00000000000000000030.seg").read_bytes()[:8] == b"EDGEBLOG"


def test_unsynced_sealed_segment_with_a_hole_after_power_loss(tmp_path):
    """The records of a rolled segment that never reached the disk: later records (in the next
    segment) survive, the lost ones are reported, offsets go on after the last record."""
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    (d / "recovery-point").unlink()
    first = segment_files(d)[1]
    recs = parse_segment(first)
    cut = recs[len(recs) // 2]["position"]
    with open(first, "r+b") as fh:
        fh.seek(cut)
        fh.write(bytes(os.path.getsize(first) - cut))  # zeros where the unsynced pages were
    log = open_log(d, segment_bytes=4096)
    lost = {r["offset"] for r in recs[len(recs) // 2:]}
    assert [r.offset for r in log.read_range(0)] == [i for i in range(300) if i not in lost]
    assert log.next_offset == 300
    assert [x.kind for x in log.recovery.damage] == ["torn"]
    log.close()


def test_sealed_segment_that_lost_every_record_is_removed(tmp_path):
    """Power loss before a rolled segment was synced, while the next one was: the first holds
    only zeros after its header. It is truncated, then removed (no records); the rest reads."""
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    (d / "recovery-point").unlink()
    victim = segment_files(d)[1]
    lost = {r["offset"] for r in parse_segment(victim)}
    with open(victim, "r+b") as fh:
        fh.seek(32)
        fh.write(bytes(os.path.getsize(victim) - 32))
    log = open_log(d, segment_bytes=4096)
    assert [r.offset for r in log.read_range(0)] == [i for i in range(300) if i not in lost]
    assert (str(victim), "no records") in log.recovery.removed
    assert not victim.exists() and not victim.with_suffix(".idx").exists()
    log.close()


def test_orphans_and_temporary_files_are_removed(tmp_path):
    d = make_log(tmp_path / "log", n=10)
    (d / "00000000000000000500.idx").write_bytes(b"x" * 16)
    (d / "uploaded.tmp").write_bytes(b"half")
    log = open_log(d)
    assert sorted(os.path.basename(p) for p, _ in log.recovery.removed) == [
        "00000000000000000500.idx", "uploaded.tmp"]
    assert not (d / "uploaded.tmp").exists()
    log.close()


def test_reader_reports_damage_without_changing_files(tmp_path):
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    (d / "recovery-point").unlink()
    segs = segment_files(d)
    flip_byte(segs[0], parse_segment(segs[0])[3]["payload_position"] - 1)
    segs[1].with_suffix(".idx").unlink()
    with open(segs[-1], "ab") as fh:
        fh.write(b"\xff" * 50)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    ro = CommitLog.open(str(d), readonly=True)
    assert [r.offset for r in ro.read_range(0)] == [i for i in range(300) if i != 3]
    assert [x.offset for x in ro.damage] == [3]
    ro.close()
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


def test_recovery_time_is_logged(tmp_path, caplog):
    d = make_log(tmp_path / "log", n=10)
    with caplog.at_level("INFO", logger="edgebroker.commitlog"):
        log = open_log(d)
    msg = [r.getMessage() for r in caplog.records if "opened in" in r.getMessage()]
    assert msg and "offsets 0..9" in msg[0] and " s (" in msg[0]
    assert log.recovery.seconds >= 0
    log.close()


@pytest.mark.parametrize("where", ["last", "middle", "short"])
def test_a_foreign_file_with_a_segment_name_is_refused_untouched(tmp_path, where):
    """A file that is not a segment (wrong magic, and a header checksum that does not match
    either) is refused with an error naming it; it was taken for a damaged header: truncated
    as a torn tail and deleted, or its header overwritten when it sorted last."""
    d = make_log(tmp_path / "log", n=200, segment_bytes=4096)
    bases = [int(p.name[:20]) for p in segment_files(d)]
    base = {"last": 10**12, "middle": bases[1] + 1, "short": bases[1] + 1}[where]
    foreign = d / f"{base:020d}.seg"
    content = b"notes" if where == "short" else b"This is my notes file, not a log segment.\n" * 50
    foreign.write_bytes(content)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.suffix == ".seg"}
    with pytest.raises(LogFormatError) as exc:
        open_log(d, segment_bytes=4096)
    assert str(foreign) in str(exc.value) and "not an edgebroker log segment" in str(exc.value)
    assert foreign.read_bytes() == content
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.suffix == ".seg"} == before


def test_a_flipped_bit_in_the_magic_of_a_segment_is_header_damage(tmp_path):
    """The rest of the header (version, length, base offset) still says it is ours."""
    d = make_log(tmp_path / "log", n=200, segment_bytes=4096)
    first = segment_files(d)[0]
    flip_byte(first, 0)
    got, log = offsets(d, segment_bytes=4096)
    assert got == list(range(200))
    assert [p for p, _ in log.recovery.header_damage] == [str(first)]


@pytest.mark.parametrize("fill", [b"\0", b"\xff"])
def test_a_last_segment_whose_first_block_a_crash_left_blank_is_header_damage(tmp_path, fill):
    """A power cut after a roll can leave the new segment's first block as zeros (the file
    system's fill) or erased flash: header damage, repaired, the records after it read; the
    foreign-file rule refused it and the broker did not start."""
    d = make_log(tmp_path / "log", n=300, segment_bytes=64 * 1024)
    last = segment_files(d)[-1]
    with open(last, "r+b") as f:
        f.write(fill * 4096)
    got, log = offsets(d, segment_bytes=64 * 1024)
    assert [p for p, _ in log.recovery.header_damage] == [str(last)]
    assert got and got == sorted(got) and got[-1] == 299


def test_a_segment_missing_from_the_middle_is_reported(tmp_path, caplog):
    """No segment holds the offsets of one deleted by hand: the open names the range and the
    files on either side, readers are told the range (missing_between), verify fails."""
    d = make_log(tmp_path / "log", n=300, segment_bytes=4096)
    segs = segment_files(d)
    lo, hi = int(segs[2].name[:20]), int(segs[3].name[:20])
    segs[2].unlink()
    with caplog.at_level("WARNING", logger="edgebroker.commitlog"):
        got, log = offsets(d, segment_bytes=4096)
    assert got == [i for i in range(300) if not lo <= i < hi]
    assert log.recovery.missing == [(lo, hi, str(segs[1]), str(segs[3]))]
    [msg] = [r.getMessage() for r in caplog.records if "are missing" in r.getMessage()]
    assert f"offsets {lo} to {hi - 1}" in msg and str(segs[1]) in msg and str(segs[3]) in msg
    log = open_log(d, segment_bytes=4096)
    try:
        assert log.missing_between(0, 300) == [(lo, hi)]
        assert log.missing_between(lo + 1, hi - 1) == [(lo + 1, hi - 1)]
        assert log.missing_between(hi, 300) == []
        report = log.verify()
        assert not report.ok and report.missing == [(lo, hi, str(segs[1]), str(segs[3]))]
    finally:
        log.close()
