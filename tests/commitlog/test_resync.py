"""Where a scan goes on after a damaged record, when a payload holds bytes shaped like a log
record (any client can publish that): one flipped bit must not make recovery take such bytes
for a record, and intact records after the damage are never truncated as a torn tail."""

from __future__ import annotations

import os

from .logutil import REC, crc32c, flip_byte, open_log, parse_segment, segment_files


T0 = 1_700_000_000_000


def forged(offset: int, topic: bytes = b"admin/reboot", payload: bytes = b"REBOOT ALL") -> bytes:
    """A valid record (CRC and all) with ``offset``, as a publisher could put in a payload."""
    cid = b"admin"
    body = REC.pack(0, 34 + len(cid) + len(topic) + len(payload), offset, T0, 1, 0, len(cid),
                    len(topic), len(payload))[4:] + cid + topic + payload
    return crc32c(body).to_bytes(4, "little") + body


def log_with(path, carrier: int, inner: bytes, n: int = 20):
    """Records 0..n-1; record ``carrier``'s payload holds ``inner`` after 16 bytes."""
    log = open_log(path, segment_bytes=1 << 20)
    for i in range(n):
        payload = b"x" * 16 + inner if i == carrier else b"reading %02d" % i
        log.append(T0 + i, 1, False, b"dev", b"sensor/t" if i != carrier else b"a/d", payload)
    log.write_pending()
    log.close()
    seg = segment_files(path)[0]
    return seg, parse_segment(seg)


def read_all(path):
    log = open_log(path, segment_bytes=1 << 20)
    try:
        return [(r.offset, r.topic) for r in log.read_range(0)], log
    finally:
        log.close()


def test_flipped_crc_resumes_after_the_record_not_inside_its_payload(tmp_path):
    """The reviewer's case: a record-shaped payload with an offset far ahead, the CRC of the
    record holding it flipped. Before: the forged record was served and the 19 records after it
    truncated as a torn tail."""
    seg, recs = log_with(tmp_path, 0, forged(0xFFFFFF00))
    size = os.path.getsize(seg)
    flip_byte(seg, recs[0]["position"])  # the CRC
    got, log = read_all(tmp_path)
    assert got == [(i, b"sensor/t") for i in range(1, 20)]
    assert [(d.kind, d.position, d.length) for d in log.recovery.damage] == [
        ("corrupt", recs[0]["position"], recs[1]["position"] - recs[0]["position"])]
    assert os.path.getsize(seg) == size and log.counters.torn_bytes_truncated == 0
    assert log.next_offset == 20


def test_flipped_length_scans_but_takes_no_offset_the_bytes_cannot_explain(tmp_path):
    """The length field itself flipped: the extent cannot be trusted, the byte-by-byte search
    passes the forged record (its offset is far more records ahead than could fit) and finds
    record 6."""
    seg, recs = log_with(tmp_path, 5, forged(0xFFFFFF00))
    size = os.path.getsize(seg)
    flip_byte(seg, recs[5]["position"] + 5)
    got, log = read_all(tmp_path)
    assert got == [(i, b"sensor/t") for i in range(20) if i != 5]
    assert [d.kind for d in log.recovery.damage] == ["corrupt"]
    assert os.path.getsize(seg) == size and log.next_offset == 20


def test_records_after_a_forged_candidate_are_never_truncated(tmp_path):
    """A forged record whose offset the skipped bytes can explain (two ahead) in the
    second-last record, whose length is flipped: the scan may take it, but the last record
    (a lower offset) stays in the file: the tail is damage, not a torn tail."""
    seg, recs = log_with(tmp_path, 18, forged(20), n=20)
    size = os.path.getsize(seg)
    flip_byte(seg, recs[18]["position"] + 5)
    got, log = read_all(tmp_path)
    assert [o for o, _ in got][:18] == list(range(18))
    assert os.path.getsize(seg) == size and log.counters.torn_bytes_truncated == 0
    assert all(d.kind == "corrupt" for d in log.recovery.damage)
    assert seg.read_bytes()[recs[19]["position"]:size].endswith(b"reading 19")
