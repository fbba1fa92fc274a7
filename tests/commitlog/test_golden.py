"""Golden files of format versions 1 and 2 (tests/commitlog/golden/, made by make_golden.py
there): the writer produces the version 2 ones byte for byte (and a version 1 log it appends to
keeps its segments and goes on in version 2 ones), version 1 logs still read, and the damaged
variants of both read as documented."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebroker import _native
from edgebroker.commitlog import CommitLog

from .golden.make_golden import (
    N, N_MIXED, find_record, record, record2, segment_records, write_mixed, write_v2,
)
from .logutil import as_tuple

GOLDEN = Path(__file__).resolve().parent / "golden"


def copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(GOLDEN / name, d)
    return d


def want(i: int) -> tuple:
    ts, qos, retain, cid, topic, payload = record(i)
    return (i, ts, qos, retain, cid, topic, payload)


def want2(i: int) -> tuple:
    """Record i of the version 2 logs, properties last."""
    return (i, *record2(i))


def with_properties(r) -> tuple:
    return (*as_tuple(r), r.properties)


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix in (".seg", ".idx")}


def versions(d: Path) -> list[int]:
    return [int.from_bytes(p.read_bytes()[8:10], "little") for p in sorted(d.glob("*.seg"))]


@pytest.mark.parametrize("name, write", [("v2", write_v2), ("mixed", write_mixed)])
def test_writer_output_is_byte_for_byte_the_golden_log(tmp_path, name, write):
    write(tmp_path / "log")
    assert files(tmp_path / "log") == files(GOLDEN / name)


def test_golden_logs_have_the_versions_they_claim():
    assert versions(GOLDEN / "v1") == [1, 1]
    assert versions(GOLDEN / "v2") == [2, 2]
    assert versions(GOLDEN / "mixed") == [1, 1, 2]
    # Two of every three version 2 records have properties (attributes bit 3); v1 has none.
    seg = sorted((GOLDEN / "v2").glob("*.seg"))[0]
    data = seg.read_bytes()
    bits = [data[pos + 24] & 8 for pos, _ in segment_records(seg)[:6]]
    assert bits == [0, 8, 8, 0, 8, 8]


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_v2_log_reads_back_with_its_properties(tmp_path, readonly):
    d = copy("v2", tmp_path)
    log = CommitLog.open(str(d), readonly=readonly)
    assert [with_properties(r) for r in log.read_range(0)] == [want2(i) for i in range(N)]
    assert [with_properties(r) for r in log.scan(b"golden/1")] == \
        [want2(i) for i in range(N) if i % 4 == 1]
    assert log.recovery.damage == [] and log.recovery.index_rebuilt == []
    assert log.verify().ok
    log.close()


def test_golden_mixed_log_reads_across_both_versions(tmp_path):
    """The upgrade: version 1 segments before, version 2 after, read side by side by every
    reader; appending goes on in the version 2 segment."""
    d = copy("mixed", tmp_path)
    log = CommitLog.open(str(d))
    everything = [want(i) + (b"",) for i in range(N)] + \
        [want2(i) for i in range(N, N + N_MIXED)]
    assert [with_properties(r) for r in log.read_range(0)] == everything
    assert [with_properties(r) for r in log.scan(b"golden/+", start=50)] == everything[50:]
    assert [r.offset for r in log.read_since(record(58)[0])] == list(range(58, N + N_MIXED))
    # The cursor reads of a catching-up session, across the version boundary.
    got, start = [], 40
    while start < log.next_offset:
        batch, start = log.read_batch(start, None, 7, 1 << 20, 1 << 20)
        got += [(r[0], r[4], r[5], r[7]) for r in batch]
    assert got == [(e[0], e[5], e[6], e[7]) for e in everything[40:]]
    assert log.verify().ok
    log.append(*record2(N + N_MIXED))
    log.write_pending()
    assert with_properties(log.read(N + N_MIXED)) == want2(N + N_MIXED)
    log.close()
    assert versions(d) == [1, 1, 2]
    assert files(d)["00000000000000000000.seg"] == files(GOLDEN / "v1")["00000000000000000000.seg"]


def test_locate_gives_the_properties_and_the_payload_range(tmp_path):
    """What the core sends a record from the log with: the payload's file range lies after
    the properties (version 2) and right after the topic (version 1)."""
    d = copy("mixed", tmp_path)
    log = CommitLog.open(str(d))
    for offset in (7, N + 1, N + 3):       # version 1; with all properties; with none
        for _ in range(2):                  # before and after its segment was checked whole
            where = log.locate(offset)
            _ts, _qos, _retain, _cid, topic, payload, props = record2(offset)
            assert where.topic == topic and where.properties == (props if offset >= N else b"")
            assert os.pread(where.fd, where.payload_length, where.payload_position) == payload
            log.verify_step()
    log.close()


@pytest.mark.parametrize("name, offset", [("v2-badr", 10), ("v2-flipped", 20)])
@pytest.mark.parametrize("readonly", [False, True])
def test_golden_damaged_v2_record_is_skipped(tmp_path, name, offset, readonly):
    d = copy(name, tmp_path)
    log = CommitLog.open(str(d), readonly=readonly)
    assert [with_properties(r) for r in log.read_range(0)] == \
        [want2(i) for i in range(N) if i != offset]
    assert log.read(offset) is None and log.locate(offset) is None
    assert [(x.kind, x.offset) for x in log.damage] == [("corrupt", offset)]
    report = log.verify()
    assert not report.ok and [(x.kind, x.offset) for x in report.damage] == [("corrupt", offset)]
    log.close()


def test_a_record_with_the_properties_bit_in_a_version_1_segment_is_damage(tmp_path):
    """Bit 3 of the attributes means properties only in version 2: in a version 1 segment
    the record is damage, even with a right CRC, and the records around it are read."""
    d = copy("v1", tmp_path)
    seg, pos, length = find_record(d, 5)
    data = bytearray(seg.read_bytes())
    data[pos + 24] |= 8
    data[pos:pos + 4] = _native.crc32c(bytes(data[pos + 4:pos + length])).to_bytes(4, "little")
    seg.write_bytes(bytes(data))
    log = CommitLog.open(str(d))
    assert [r.offset for r in log.read_range(0)] == [i for i in range(N) if i != 5]
    assert [(x.kind, x.offset, x.length) for x in log.damage] == [("corrupt", 5, length)]
    log.close()


def test_a_bad_properties_length_at_the_tail_is_a_torn_tail(tmp_path):
    """Recovery of the last segment: a last record whose R the other lengths contradict is
    cut off at start like any incomplete tail."""
    d = copy("v2", tmp_path)
    seg, pos, length = find_record(d, N - 1)
    data = bytearray(seg.read_bytes())
    data[pos + 34:pos + 38] = (int.from_bytes(data[pos + 34:pos + 38], "little") + 1) \
        .to_bytes(4, "little")
    data[pos:pos + 4] = _native.crc32c(bytes(data[pos + 4:pos + length])).to_bytes(4, "little")
    seg.write_bytes(bytes(data))
    log = CommitLog.open(str(d))
    assert log.next_offset == N - 1 and log.counters.torn_bytes_truncated == length
    log.close()
    assert seg.stat().st_size == pos


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_log_reads_back(tmp_path, readonly):
    d = copy("v1", tmp_path)
    log = CommitLog.open(str(d), readonly=readonly)
    assert [as_tuple(r) for r in log.read_range(0)] == [want(i) for i in range(N)]
    assert [s.records for s in log.segments()] == [51, 9]
    assert log.recovery.damage == [] and log.recovery.index_rebuilt == []
    log.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_torn(tmp_path, readonly):
    d = copy("v1-torn", tmp_path)
    last = sorted(d.glob("*.seg"))[-1]
    pos, _ = segment_records(GOLDEN / "v1" / last.name)[-1]
    log = CommitLog.open(str(d), readonly=readonly)
    assert [r.offset for r in log.read_range(0)] == list(range(N - 1))
    assert log.next_offset == N - 1
    log.close()
    assert last.stat().st_size == (pos if not readonly else (GOLDEN / "v1-torn" / last.name).stat().st_size)


@pytest.mark.parametrize("readonly", [False, True])
def test_golden_flipped(tmp_path, readonly):
    d = copy("v1-flipped", tmp_path)
    log = CommitLog.open(str(d), readonly=readonly)
    assert [as_tuple(r) for r in log.read_range(0)] == [want(i) for i in range(N) if i != 20]
    assert log.read(20) is None
    assert [(x.kind, x.offset) for x in log.damage] == [("corrupt", 20)]
    log.close()


def test_golden_noindex(tmp_path):
    d = copy("v1-noindex", tmp_path)
    log = CommitLog.open(str(d))
    assert [as_tuple(r) for r in log.read_range(0)] == [want(i) for i in range(N)]
    log.close()
    assert files(d) == files(GOLDEN / "v1")  # the index is back, identical


def test_golden_zerotail(tmp_path):
    d = copy("v1-zerotail", tmp_path)
    log = CommitLog.open(str(d))
    assert log.next_offset == N and log.counters.torn_bytes_truncated == 4096
    log.close()
    assert files(d) == files(GOLDEN / "v1")


@pytest.mark.parametrize("name, rc, verdict", [
    ("v1", 0, "OK"), ("v1-flipped", 1, "DAMAGED"), ("v1-torn", 0, "note"),
    ("v1-noindex", 0, "index"), ("v1-zerotail", 0, "note"), ("v2", 0, "OK"),
    ("v2-badr", 1, "DAMAGED"), ("v2-flipped", 1, "DAMAGED"), ("mixed", 0, "OK"),
])
def test_inspect_verify_on_the_golden_variants(tmp_path, name, rc, verdict):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "log").symlink_to(GOLDEN / name)  # read-only use: nothing may change
    before = files(GOLDEN / name)
    r = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "verify", "--data-dir",
                        str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert r.returncode == rc, r.stdout + r.stderr
    assert verdict in r.stdout
    assert files(GOLDEN / name) == before


def _doc_blocks() -> list[bytes]:
    """The hex dumps in docs/log-format.md's code blocks (the leading two-digit hex tokens of
    each line; what follows them is commentary)."""
    import re
    text = (Path(__file__).resolve().parents[2] / "docs" / "log-format.md").read_text()
    out = []
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        data = bytearray()
        for line in block.splitlines():
            for token in line.split():
                if not re.fullmatch(r"[0-9a-f]{2}", token):
                    break
                data.append(int(token, 16))
        if data:
            out.append(bytes(data))
    return out


def test_the_examples_in_the_format_document_are_what_the_code_writes():
    from edgebroker.commitlog.format import segment_header
    from edgebroker.mqtt import properties as p
    props = p.encode_body({p.CONTENT_TYPE: "text/plain", p.USER_PROPERTY: [("unit", "C")]})
    plain = _native.record_header(5, 1700000000123, 5, b"dev-1", b"a/b", b"21.5")
    with_props = _native.record_header(6, 1700000000456, 1, b"dev-1", b"a/b", b"21.5", props)
    blocks = _doc_blocks()
    assert plain + b"dev-1a/b21.5" in blocks
    assert with_props + b"dev-1a/b" + props + b"21.5" in blocks
    assert segment_header(0) in blocks
    assert (GOLDEN / "v1" / "00000000000000000000.seg").read_bytes()[:32] in blocks


def test_a_version_1_last_segment_without_records_becomes_version_2(tmp_path):
    """Only a header (a version 1 broker stopped right after a roll): nothing to keep, so the
    segment takes a version 2 header and the records with properties go into it."""
    d = tmp_path / "log"
    d.mkdir()
    (d / "00000000000000000000.seg").write_bytes(
        (GOLDEN / "v1" / "00000000000000000000.seg").read_bytes()[:32])
    log = CommitLog.open(str(d))
    log.append(*record2(1))
    log.write_pending()
    log.close()
    assert versions(d) == [2]
    log = CommitLog.open(str(d), readonly=True)
    assert [with_properties(r) for r in log.read_range(0)] == [(0, *record2(1))]
    log.close()


def test_log_properties_keep_the_message_s_and_drop_one_hop_s(tmp_path):
    """What the core stores (core.mqtt5: message_properties, then logged): the properties as
    sent, minus Topic Alias and Subscription Identifier; read back as they were."""
    from edgebroker.core.mqtt5 import logged, message_properties
    from edgebroker.mqtt import properties as p

    def log_properties(props):
        return logged(*message_properties(props))
    sent = {p.TOPIC_ALIAS: 7, p.CONTENT_TYPE: "text/plain", p.SUBSCRIPTION_ID: [3, 9],
            p.USER_PROPERTY: [("b", "2"), ("a", "1")], p.MESSAGE_EXPIRY: 60}
    stored = log_properties(sent)
    kept = {p.CONTENT_TYPE: "text/plain", p.USER_PROPERTY: [("b", "2"), ("a", "1")],
            p.MESSAGE_EXPIRY: 60}
    assert p.decode_body(stored) == kept and list(p.decode_body(stored)) == list(kept)
    assert log_properties({p.TOPIC_ALIAS: 7}) == log_properties(None) == b""
    log = CommitLog.open(str(tmp_path / "log"))
    log.append(1, 1, False, b"c", b"t", b"x", stored)
    log.append(2, 1, False, b"c", b"t", b"y", log_properties({p.TOPIC_ALIAS: 7}))
    log.write_pending()
    assert [(r.payload, r.properties) for r in log.read_range(0)] == [(b"x", stored), (b"y", b"")]
    log.close()
