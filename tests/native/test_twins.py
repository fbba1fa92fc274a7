"""The C helper and its pure-Python twin give identical results (hypothesis, random inputs), and
both give the right ones (known vectors, an independent model).

These tests call both backends directly, so they need the C build: without it they fail."""

from __future__ import annotations

import errno
import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgebroker._native import _cbackend as C
from edgebroker._native import _pure as P
from edgebroker._native._common import (
    RESYNC_FOUND, SCAN_BAD, SCAN_END, SCAN_ENTRY_WORDS, SCAN_FULL, SCAN_PARTIAL,
)
from edgebroker.mqtt.topics import topic_matches

import mqttraw

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REC = struct.Struct("<IIQQBBHHI")


# ------------------------------------------------------------------------------------- CRC32C

def test_crc32c_known_values():
    # The standard check value, and RFC 3720 (iSCSI) test vectors.
    for impl in (C, P):
        assert impl.crc32c(b"123456789") == 0xE3069283
        assert impl.crc32c(bytes(32)) == 0x8A9136AA
        assert impl.crc32c(b"\xff" * 32) == 0x62A8AB43
        assert impl.crc32c(bytes(range(32))) == 0x46DD794E
        assert impl.crc32c(b"") == 0


def test_crc32c_method_is_reported():
    assert C.CRC_METHOD in ("sse4.2", "armv8-crc", "slicing-by-8")


@SETTINGS
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1), st.integers(0, 16))
def test_crc32c_twins(data, seed, skip):
    # Unaligned starts exercise the byte-at-a-time head of the C loops.
    view = memoryview(data)[min(skip, len(data)):]
    assert C.crc32c(view, seed) == P.crc32c(view, seed)
    assert C.crc32c(data[10:], C.crc32c(data[:10])) == C.crc32c(data)


@pytest.mark.parametrize("size", [3 * 1024 - 1, 3 * 1024, 3 * 1024 + 1, 6 * 1024 + 13, 65_536,
                                  100_003])
def test_crc32c_twins_on_inputs_long_enough_for_three_lanes(size):
    rnd = random.Random(size)
    data = rnd.randbytes(size + 8)
    for skip in (0, 1, 5):
        view = memoryview(data)[skip:skip + size]
        seed = rnd.getrandbits(32)
        assert C.crc32c(view, seed) == P.crc32c(view, seed)
    # Split anywhere, continued: the same as in one go.
    cut = rnd.randrange(size)
    assert C.crc32c(data[cut:], C.crc32c(data[:cut])) == C.crc32c(data)


@SETTINGS
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2, 4, 5, 6]),
       st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=300))
def test_record_header_twins(offset, ts, attrs, cid, topic, payload):
    head = C.record_header(offset, ts, attrs, cid, topic, payload)
    assert head == P.record_header(offset, ts, attrs, cid, topic, payload)
    crc, length, o, t, a, r, cl, tl, pl = REC.unpack(head)
    assert (length, o, t, a, r, cl, tl, pl) == (34 + len(cid) + len(topic) + len(payload), offset,
                                                 ts, attrs, 0, len(cid), len(topic), len(payload))
    assert crc == P.crc32c(head[4:] + cid + topic + payload)


@SETTINGS
@given(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2, 4, 5, 6, 8, 13]),
       st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=300),
       st.binary(min_size=1, max_size=300))
def test_record_header_with_properties_twins(offset, attrs, cid, topic, payload, props):
    """Format version 2: the properties bit set, R after the 34 bytes, the CRC over client
    id, topic, properties and payload in that order."""
    head = C.record_header(offset, 7, attrs, cid, topic, payload, props)
    assert head == P.record_header(offset, 7, attrs, cid, topic, payload, props)
    crc, length, o, t, a, r, cl, tl, pl = REC.unpack(head[:34])
    assert len(head) == 38 and head[34:] == struct.pack("<I", len(props))
    assert (length, o, a, r, cl, tl, pl) == (
        38 + len(cid) + len(topic) + len(props) + len(payload), offset, (attrs & 7) | 8, 0,
        len(cid), len(topic), len(payload))
    assert crc == P.crc32c(head[4:] + cid + topic + props + payload)
    # No properties: the version 1 header, the bit cleared whatever the caller passed.
    assert C.record_header(offset, 7, attrs, cid, topic, payload, b"") == \
        P.record_header(offset, 7, attrs & 7, cid, topic, payload)


# ------------------------------------------------------------------------------- topic filters

LEVEL = st.sampled_from(["a", "b", "", "+", "#", "$x", "ab", "a+", "#b"])


@st.composite
def filter_and_topic(draw):
    f = "/".join(draw(st.lists(LEVEL, min_size=1, max_size=5)))
    t = "/".join(draw(st.lists(st.sampled_from(["a", "b", "", "$x", "ab", "$SYS"]), min_size=1, max_size=5)))
    return f, t


@SETTINGS
@given(filter_and_topic())
def test_topic_matches_twins_and_the_mqtt_module(ft):
    f, t = ft
    fb, tb = f.encode(), t.encode()
    assert C.topic_matches(fb, tb) == P.topic_matches(fb, tb) == topic_matches(f, t)


@pytest.mark.parametrize("f, t, want", [
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("+", "", True), ("+/+", "/", True),
    ("#", "$SYS/x", False), ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/x", True),
    ("a/+", "a", False), ("a", "a/", False), ("a/+/c", "a//c", True), ("", "", True),
])
def test_topic_matches_table(f, t, want):
    assert C.topic_matches(f.encode(), t.encode()) is want
    assert P.topic_matches(f.encode(), t.encode()) is want


# -------------------------------------------------------------------------- record scanning

def make_records(specs, start_offset=0):
    """A segment body (no header) from (timestamp, attrs, cid, topic, payload[, properties])
    specs."""
    out = bytearray()
    for k, (ts, attrs, cid, topic, payload, *props) in enumerate(specs):
        props = props[0] if props else b""
        out += P.record_header(start_offset + k, ts, attrs, cid, topic, payload, props) + cid \
            + topic + props + payload
    return bytes(out)


RECORD_SPEC = st.tuples(st.integers(0, 2**40), st.sampled_from([0, 1, 2, 4, 5, 6]),
                        st.binary(max_size=6), st.sampled_from([b"a", b"a/b", b"b/c", b"$s/a", b""]),
                        st.binary(max_size=60),
                        st.sampled_from([b"", b"", b"\x01\x01", b"\x02\x00\x00\x00\x3c",
                                         b"\x26\x00\x01k\x00\x01v" * 3]))


@st.composite
def damaged_segment(draw):
    specs = draw(st.lists(RECORD_SPEC, max_size=12))
    data = bytearray(make_records(specs, draw(st.integers(0, 5))))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "junk", "zeros"]))
        if kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif kind == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)):]
        elif kind == "junk":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=40))
        elif kind == "zeros":
            data += bytes(draw(st.integers(1, 100)))
    return bytes(data)


def run_scan(impl, data, buf_len, min_offset, flt, max_out, ts, version=2):
    out = array("Q", bytes(8 * SCAN_ENTRY_WORDS * max_out))
    res = impl.scan(memoryview(data)[:buf_len], len(data), 1000, min_offset, flt, out, ts,
                    version)
    return res, list(out[:res.matched * SCAN_ENTRY_WORDS])


@SETTINGS
@given(damaged_segment(), st.data())
def test_scan_twins(data, draw):
    buf_len = draw.draw(st.integers(0, len(data)))
    min_offset = draw.draw(st.integers(0, 8))
    flt = draw.draw(st.sampled_from([None, b"#", b"a/#", b"+/b", b"a", b"$s/+"]))
    max_out = draw.draw(st.integers(0, 15))
    ts = draw.draw(st.integers(0, 2**41))
    version = draw.draw(st.sampled_from([1, 2]))
    assert run_scan(C, data, buf_len, min_offset, flt, max_out, ts, version) == \
        run_scan(P, data, buf_len, min_offset, flt, max_out, ts, version)


@SETTINGS
@given(damaged_segment(), st.data())
def test_build_index_resync_and_index_check_twins(data, draw):
    buf_len = draw.draw(st.integers(0, len(data)))
    min_offset = draw.draw(st.integers(0, 8))
    base = draw.draw(st.integers(0, 3))
    max_entries = draw.draw(st.integers(0, 15))
    version = draw.draw(st.sampled_from([1, 2]))
    results = []
    for impl in (C, P):
        out = bytearray(16 * max_entries)
        res = impl.build_index(memoryview(data)[:buf_len], len(data), 32, base, min_offset, 7, out,
                               version=version)
        results.append((res, bytes(out[:16 * res.count])))
    assert results[0] == results[1]
    start = draw.draw(st.integers(0, max(len(data), 0)))
    assert C.resync(data[:buf_len], len(data), start, min_offset, version) == \
        P.resync(data[:buf_len], len(data), start, min_offset, version)
    index = results[0][1] + bytes(16 * draw.draw(st.integers(0, 2)))
    size = draw.draw(st.integers(0, 32 + len(data) + 10))
    n = len(index) // 16
    assert C.index_check(index, n, size) == P.index_check(index, n, size)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 2**40)), max_size=40),
       st.integers(0, 2**32 - 1), st.integers(0, 2**41))
def test_index_searches_twins_and_model(entries, rel, ts):
    entries = sorted(entries)
    idx = b"".join(struct.pack("<IIQ", r, p, t) for r, p, t in entries)
    n = len(entries)
    want_rel = next((i for i, e in enumerate(entries) if e[0] >= rel), n)
    assert C.index_find_offset(idx, n, rel) == P.index_find_offset(idx, n, rel) == want_rel
    by_ts = sorted(entries, key=lambda e: e[2])
    idx2 = b"".join(struct.pack("<IIQ", r, p, t) for r, p, t in by_ts)
    want_ts = next((i for i, e in enumerate(by_ts) if e[2] >= ts), n)
    assert C.index_find_time(idx2, n, ts) == P.index_find_time(idx2, n, ts) == want_ts


def test_scan_statuses_by_hand():
    body = make_records([(5, 1, b"c", b"a/b", b"xyz"), (6, 0, b"", b"b", b"")])
    first = 34 + 1 + 3 + 3
    for impl in (C, P):
        res, ents = run_scan(impl, body, len(body), 0, None, 10, 0)
        assert (res.status, res.stop, res.count, res.matched, res.next_offset, res.max_timestamp) == \
            (SCAN_END, len(body), 2, 2, 2, 6)
        assert ents[:5] == [0, 5, 1000, first, 1 | 1 << 8 | 3 << 24]
        res, _ = run_scan(impl, body, first + 10, 0, None, 10, 0)  # the second record is cut
        assert (res.status, res.stop, res.need) == (SCAN_PARTIAL, first, 34)
        res, _ = run_scan(impl, body[:-1], len(body) - 1, 0, None, 10, 0)  # torn: nothing after
        assert (res.status, res.stop) == (SCAN_BAD, first)
        res, _ = run_scan(impl, body, len(body), 0, None, 1, 0)
        assert (res.status, res.stop, res.matched) == (SCAN_FULL, first, 1)
        res, _ = run_scan(impl, body, len(body), 1, None, 10, 0)  # offset 0 is below min_offset
        assert (res.status, res.stop) == (SCAN_BAD, 0)
        assert impl.resync(body, len(body), 1, 1) == (RESYNC_FOUND, first, 0)
        res, ents = run_scan(impl, body, len(body), 0, b"a/#", 10, 0)
        assert (res.count, res.matched, ents[0]) == (2, 1, 0)


def test_the_last_64_bit_offset_is_never_a_records():
    """A record whose offset is 2^64 - 1 leaves no offset for the next: both refuse it (C
    took the next offset as 0 and read on, past a record whose offset went backwards)."""
    last = (1 << 64) - 1
    body = P.record_header(last, 1, 0, b"", b"a", b"x") + b"ax" + \
        P.record_header(5, 1, 0, b"", b"a", b"y") + b"ay"
    low = last - (1 << 32) + 1
    for impl in (C, P):
        res, _ = run_scan(impl, body, len(body), low, None, 10, 0)
        assert (res.status, res.stop, res.count) == (SCAN_BAD, 0, 0)
        res = impl.build_index(body, len(body), 32, low, low, 0, bytearray(64))
        assert (res.status, res.count) == (SCAN_BAD, 0)


def test_index_entries_asked_beyond_the_buffer_are_refused():
    """C reads or writes only inside the buffers it is given (the twin's struct raises)."""
    index = struct.pack("<IIQ", 0, 32, 5)
    for impl, error in ((C, ValueError), (P, struct.error)):
        for call in (lambda: impl.index_find_offset(index, 1000, 3),
                     lambda: impl.index_find_time(index, 1000, 3),
                     lambda: impl.index_check(index, 1000, 100)):
            with pytest.raises(error):
                call()
    body = make_records([(5, 1, b"c", b"a/b", b"xyz")] * 3)
    with pytest.raises(ValueError):
        C.build_index(body, len(body), 32, 0, 0, 0, bytearray(16), max_entries=3)


def with_crc(record: bytearray) -> bytes:
    """``record`` with its CRC made right again: damage only the other rules can find."""
    record[:4] = struct.pack("<I", P.crc32c(bytes(record[4:])))
    return bytes(record)


def test_scan_of_records_with_properties_by_hand():
    """Version 2: the properties bit, R after the header, the topic after the client id as
    ever; in a version 1 segment the same record is damage; an R that the other lengths
    contradict is damage even with a right CRC."""
    props = b"\x03\x00\x04json"
    body = make_records([(5, 1, b"c", b"a/b", b"xyz", props), (6, 0, b"", b"b", b"", b"")])
    first = 38 + 1 + 3 + len(props) + 3
    assert body[24] == 1 | 8 and body[34:38] == struct.pack("<I", len(props))
    for impl in (C, P):
        res, ents = run_scan(impl, body, len(body), 0, None, 10, 0, version=2)
        assert (res.status, res.stop, res.count) == (SCAN_END, len(body), 2)
        assert ents[:5] == [0, 5, 1000, first, 1 | 8 | 1 << 8 | 3 << 24]
        res, ents = run_scan(impl, body, len(body), 0, b"a/+", 10, 0, version=2)
        assert (res.matched, ents[0]) == (1, 0)
        res, _ = run_scan(impl, body, 37, 0, None, 10, 0, version=2)  # R not in the buffer yet
        assert (res.status, res.need) == (SCAN_PARTIAL, first)
        res, _ = run_scan(impl, body, len(body), 0, None, 10, 0, version=1)
        assert (res.status, res.stop, res.count) == (SCAN_BAD, 0, 0)
        assert impl.resync(body, len(body), 0, 0, 1) == (RESYNC_FOUND, first, 0)
        assert impl.resync(body, len(body), 0, 0, 2) == (RESYNC_FOUND, 0, 0)
        for r in (len(props) - 1, len(props) + 1, 0xFFFFFFFF):
            bad = bytearray(body[:first])
            bad[34:38] = struct.pack("<I", r)
            bad = with_crc(bad) + body[first:]
            res, _ = run_scan(impl, bad, len(bad), 0, None, 10, 0, version=2)
            assert (res.status, res.stop) == (SCAN_BAD, 0), r
            assert impl.resync(bad, len(bad), 0, 0, 2) == (RESYNC_FOUND, first, 0)
        # Lengths that leave no room for R, or R = 0 (the bit is set only with properties):
        # implausible from the header alone.
        for length in (34 + 1 + 3 + 3 + 3, 38 + 1 + 3 + 3):
            bad = bytearray(body[:length])
            bad[4:8] = struct.pack("<I", length)
            bad[34:38] = struct.pack("<I", max(length - 38 - 1 - 3 - 3, 0))
            res, _ = run_scan(impl, with_crc(bad), length, 0, None, 10, 0, version=2)
            assert (res.status, res.stop) == (SCAN_BAD, 0), length
        # Bits 4-7 stay reserved in version 2.
        bad = bytearray(body[:first])
        bad[24] |= 0x10
        res, _ = run_scan(impl, with_crc(bad), first, 0, None, 10, 0, version=2)
        assert (res.status, res.stop) == (SCAN_BAD, 0)


# ------------------------------------------------------------------- PUBLISH frames from a scan

VALID_RECORD = st.tuples(st.integers(0, 2**40), st.sampled_from([0, 1, 2, 4, 5, 6]),
                         st.binary(max_size=6), st.sampled_from([b"a", b"a/b", b"b/c", b"x" * 200]),
                         st.one_of(st.binary(max_size=60), st.just(b"p" * 200)))


@SETTINGS
@given(st.lists(VALID_RECORD, min_size=1, max_size=10), st.data())
def test_publish_frames_twins_and_an_independent_decoder(specs, draw):
    body = make_records(specs, 7)
    out = array("Q", bytes(8 * SCAN_ENTRY_WORDS * 16))
    n = C.scan(body, len(body), 1000, 7, None, out).matched
    assert n == len(specs)
    first = draw.draw(st.integers(0, n))
    count = draw.draw(st.integers(0, n - first))
    qos = bytearray(draw.draw(st.lists(st.sampled_from([0, 1, 2, 255]), min_size=n, max_size=n)))
    pids = array("H", draw.draw(st.lists(st.integers(1, 65535), min_size=n, max_size=n)))
    capacity = sum(34 + len(c) + len(t) + len(p) for _, _, c, t, p in specs[first:first + count])
    frames = C.publish_frames(body, 1000, out, first, count, qos, pids, capacity)
    assert frames == P.publish_frames(body, 1000, out, first, count, qos, pids, capacity)
    got = mqttraw.split_frames(bytearray(frames))
    want = [(t.decode(), p, qos[i], pids[i] if qos[i] else None)
            for i, (_, _, _, t, p) in enumerate(specs) if first <= i < first + count and qos[i] != 255]
    assert [(f.topic, f.payload, f.qos, f.packet_id) for f in got] == want
    assert all(f.type == mqttraw.PUBLISH and not f.retain and not f.dup for f in got)


def test_publish_frames_refuses_what_is_not_there():
    body = make_records([(5, 1, b"c", b"a/b", b"xyz"), (6, 0, b"", b"b", b"")])
    out = array("Q", bytes(8 * SCAN_ENTRY_WORDS * 4))
    C.scan(body, len(body), 1000, 0, None, out)
    pids = array("H", [1, 2])
    for impl in (C, P):
        assert impl.publish_frames(body, 1000, out, 0, 0, bytearray(2), pids, 0) == b""
        with pytest.raises(ValueError):
            impl.publish_frames(body, 1000, out, 1, 2, bytearray(2), pids, 100)  # past the arrays
        with pytest.raises(ValueError):
            impl.publish_frames(body, 1000, out, 0, 1, bytearray([3, 0]), pids, 100)  # QoS 3
        with pytest.raises(ValueError):
            impl.publish_frames(body, 1000, out, 0, 2, bytearray(2), pids, 10)  # no room
        with pytest.raises(ValueError):
            impl.publish_frames(body[:40], 1000, out, 0, 1, bytearray(2), pids, 100)  # cut short
        with pytest.raises(ValueError):
            impl.publish_frames(body, 1001, out, 0, 1, bytearray(2), pids, 100)  # not in buf


# ----------------------------------------------------------------------------- send batches

@pytest.mark.parametrize("impl", [C, P], ids=["c", "python"])
def test_send_batch_partial_writes_and_eagain(tmp_path, impl):
    """A small SO_SNDBUF and a peer that reads late: the batch stops at EAGAIN mid-item and is
    resumed from where it said; the peer gets every byte in order."""
    blob = os.urandom(1 << 20)
    path = tmp_path / "file"
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)
    items = [(b"head-%d|" % i, fd, i * 40_000, 30_000 + i) for i in range(20)] + [(b"tail", fd, 0, 0)]
    want = b"".join(h + blob[p:p + n] for h, _fd, p, n in items)
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.setblocking(False)
    got = bytearray()
    item = progress = 0
    stops = 0
    try:
        while True:
            res = impl.send_batch(a, items, item, progress)
            item, progress = res.item, res.progress
            if res.error == 0:
                assert item == len(items) and progress == 0
                break
            assert res.error == errno.EAGAIN
            stops += 1
            b.setblocking(False)
            try:
                while True:
                    got += b.recv(65536)
            except BlockingIOError:
                pass
        a.close()
        while chunk := b.recv(65536):
            got += chunk
    finally:
        b.close()
        os.close(fd)
    assert stops > 3
    assert bytes(got) == want


@pytest.mark.parametrize("impl", [C, P], ids=["c", "python"])
def test_send_batch_errors(tmp_path, impl):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        res = impl.send_batch(a, [(b"h", fd, 0, 10)])  # the file is shorter than the range
        assert (res.sent, res.item, res.progress, res.error) == (4, 0, 4, errno.ENODATA)
        b.close()
        res = impl.send_batch(a, [(b"h", fd, 0, 3)])
        assert res.error == errno.EPIPE and res.sent == 0
    finally:
        a.close()
        os.close(fd)


@pytest.mark.parametrize("impl", [C, P], ids=["c", "python"])
def test_send_batch_over_tcp_with_cork(tmp_path, impl):
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    fd = os.open(path, os.O_RDONLY)
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    a.setblocking(False)
    try:
        res = impl.send_batch(a, [(b"<", fd, 2, 3), (b">", fd, 0, 1)], cork=True)
        assert res == (6, 2, 0, 0)
        a.close()
        got = b""
        while chunk := b.recv(100):
            got += chunk
        assert got == b"<234>0"
    finally:
        b.close()
        srv.close()
        os.close(fd)


# ------------------------------------------------------------------------ backend selection

def run_python(code: str, env_native: str, block_c: bool = False) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with EDGEBROKER_NATIVE set; ``block_c`` makes the
    compiled module unimportable, as on a machine where the build failed."""
    prelude = ""
    if block_c:
        prelude = textwrap.dedent("""
            import sys
            class _Block:
                def find_spec(self, name, path=None, target=None):
                    if name == "edgebroker._native._edgebroker_c":
                        raise ImportError("blocked by the test: no C build")
            sys.meta_path.insert(0, _Block())
        """)
    env = dict(os.environ, EDGEBROKER_NATIVE=env_native)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_backend_choice_auto_c_python():
    code = "import edgebroker, edgebroker._native as n; print(n.BACKEND, edgebroker.__native_backend__)"
    assert run_python(code, "auto").stdout.split() == ["c", "c"]
    assert run_python(code, "c").stdout.split() == ["c", "c"]
    assert run_python(code, "python").stdout.split() == ["python", "python"]
    assert run_python(code, "").stdout.split() == ["c", "c"]


def test_without_the_c_build_auto_falls_back_and_says_so_once():
    code = """
        import logging
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        import edgebroker._native as n
        n.log_backend()
        print(n.BACKEND)
    """
    r = run_python(code, "auto", block_c=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["python"]
    lines = [ln for ln in r.stderr.splitlines() if "native helper" in ln]
    assert len(lines) == 1 and lines[0].startswith("WARNING")
    assert "pure Python" in lines[0] and "not built" in lines[0]


def test_without_the_c_build_c_is_a_clear_error():
    r = run_python("import edgebroker._native", "c", block_c=True)
    assert r.returncode != 0
    assert "NativeUnavailableError: EDGEBROKER_NATIVE=c but the C helper is not built" in r.stderr
    r = run_python("import edgebroker._native", "fast")
    assert "EDGEBROKER_NATIVE='fast': expected one of auto, c, python" in r.stderr


def test_the_commands_say_a_wrong_choice_in_one_line_and_exit_2():
    """A wrong EDGEBROKER_NATIVE (or c without the build) ended every command, --version too,
    in a traceback and exit 1; it is a configuration error (docs/config.md)."""
    code = """
        import sys
        from edgebroker.cli.main import main
        sys.exit(main(["--version"]))
    """
    for native, block_c, said in [
            ("fast", False, "EDGEBROKER_NATIVE='fast': expected one of auto, c, python"),
            ("c", True, "EDGEBROKER_NATIVE=c but the C helper is not built")]:
        r = run_python(code, native, block_c=block_c)
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"edgebroker: config error: {said}"), line


def test_scan_result_layout_matches_the_header():
    from edgebroker._native._edgebroker_c import lib
    from edgebroker import _native
    for name in ("SEGMENT_HEADER_SIZE", "RECORD_HEADER_SIZE", "INDEX_ENTRY_SIZE", "SCAN_ENTRY_WORDS",
                 "SCAN_END", "SCAN_PARTIAL", "SCAN_BAD", "SCAN_FULL", "RESYNC_NONE", "RESYNC_FOUND",
                 "RESYNC_CANDIDATE"):
        assert getattr(lib, "EB_" + name) == getattr(_native, name), name


def test_header_writer_gives_record_header_until_its_next_call():
    for backend in (C, P):
        header = backend.header_writer()
        first = bytes(header(1, 2, 1, b"c", b"t", b"p" * 5))
        assert first == P.record_header(1, 2, 1, b"c", b"t", b"p" * 5)
        assert bytes(header(9, 8, 0, b"", bytearray(b"x/y"), memoryview(b"q"))) == \
            P.record_header(9, 8, 0, b"", b"x/y", b"q")
        assert bytes(header(9, 8, 0, b"", b"x/y", b"q", b"\x01\x01")) == \
            P.record_header(9, 8, 0, b"", b"x/y", b"q", b"\x01\x01")
        assert len(header(9, 8, 0, b"", b"x/y", b"q")) == 34


# ------------------------------------------------------------------ the log's staging area

STAGE_FIELDS = ("used", "count", "next_offset", "position", "max_ts", "staged_first_ts")


def _staging(impl, capacity, entries, base, position, segment_bytes, first_ts, segment_ms,
             max_ts):
    staging = impl.appender(capacity, entries)
    a = staging.state
    a.base_offset, a.next_offset, a.position = base, base + 3, position
    a.segment_bytes, a.first_ts, a.segment_ms, a.max_ts = segment_bytes, first_ts, segment_ms, max_ts
    a.big_payload = 200
    return staging


RECORD_ARGS = st.tuples(st.integers(-5, 3000), st.integers(-1, 3), st.booleans(),
                        st.binary(max_size=20), st.binary(max_size=30), st.binary(max_size=260),
                        st.sampled_from([b"", b"", b"\x01\x01", b"\x26\x00\x01k\x00\x02vv" * 5]))


@SETTINGS
@given(st.lists(RECORD_ARGS, max_size=30), st.integers(0, 2000), st.integers(1, 12),
       st.integers(100, 5000), st.integers(0, 1000), st.integers(1, 3000))
def test_append_record_twins(records, capacity, entries, segment_bytes, first_ts, segment_ms):
    stagings = [_staging(impl, capacity, entries, 1000, 40, segment_bytes, first_ts, segment_ms,
                         first_ts) for impl in (C, P)]
    for ts, qos, retain, cid, topic, payload, props in records:
        got = [impl.append_record(s.state, ts, qos, retain, cid, len(cid), topic, len(topic),
                                  payload, len(payload), props, len(props))
               for impl, s in zip((C, P), stagings)]
        assert got[0] == got[1]
        c, p = (s.state for s in stagings)
        assert [getattr(c, f) for f in STAGE_FIELDS] == [getattr(p, f) for f in STAGE_FIELDS]
    c, p = stagings
    used, count = c.state.used, c.state.count
    assert c.data[:used] == p.data[:used] and c.index[:count * 16] == p.index[:count * 16]
    # What was staged is a run of valid records, and the index entries say where they are.
    if count:
        res = P.build_index(bytes(c.data[:used]), used, 40, 1000, 1003, 0,
                            bytearray(16 * count))
        assert (res.status, res.count, res.stop) == (SCAN_END, count, used)


def test_append_record_refuses_what_the_log_must_handle():
    for impl in (C, P):
        # 300 staged bytes, 4 index entries; the segment: 1000 bytes, 1000 ms from ts 500.
        s = _staging(impl, 300, 4, 1000, 40, 1000, 500, 1000, 600)
        a = s.state

        def add(ts=550, qos=1, retain=False, cid=b"c", topic=b"t/1", payload=b"x" * 10):
            return impl.append_record(a, ts, qos, retain, cid, len(cid), topic, len(topic),
                                      payload, len(payload), b"", 0)
        assert add() == 1003 and a.position == 40 + 48 and a.max_ts == 600  # 48-byte records
        assert add(ts=-1) == -1                      # negative timestamp
        assert add(qos=3) == -1 and add(qos=-1) == -1
        assert add(payload=b"x" * 200) == -1         # big payload: held by reference instead
        assert add(ts=1500) == -1                    # segment_ms after the segment's first record
        assert add(ts=700, retain=True) == 1004 and a.max_ts == 700 and a.staged_first_ts == 550
        assert add(payload=b"y" * 199) == -1         # 237 bytes: past the 300 staged bytes
        assert add() == 1005 and add() == 1006 and a.count == 4
        assert add(payload=b"") == -1                # the 4 index entries are used up
        assert [a.used, a.count, a.next_offset, a.position] == [48 * 4, 4, 1007, 40 + 48 * 4]
        # A record that would end past segment_bytes: the segment rolls first.
        s = _staging(impl, 300, 4, 1000, 900, 1000, 500, 1000, 600)
        assert impl.append_record(s.state, 550, 0, False, b"", 0, b"t", 1, b"x" * 65, 65,
                                  b"", 0) == 1003
        assert impl.append_record(s.state, 550, 0, False, b"", 0, b"t", 1, b"x" * 1, 1,
                                  b"", 0) == -1
        # Properties count in the record's length: 38 + 1 + 4 + 1 bytes, then no room for 1 more.
        s = _staging(impl, 300, 4, 1000, 900, 1000, 500, 1000, 600)
        assert impl.append_record(s.state, 550, 0, False, b"", 0, b"t", 1, b"x", 1,
                                  b"\x01\x01" * 2, 4) == 1003 and s.state.position == 944
        assert s.data[:44] == P.record_header(1003, 550, 0, b"", b"t", b"x", b"\x01\x01" * 2) \
            + b"t" + b"\x01\x01" * 2 + b"x"
        assert impl.append_record(s.state, 550, 0, False, b"", 0, b"t", 1, b"x" * 17, 17,
                                  b"\x01\x01", 2) == -1
    with pytest.raises(TypeError):  # the C build takes bytes only; the log sends others the long way
        C.append_record(a, 1, 0, False, b"", 0, b"t", 1, bytearray(b"x"), 1, b"", 0)
    with pytest.raises(TypeError):
        C.append_record(a, 1, 0, False, b"", 0, b"t", 1, b"x", 1, bytearray(b"\x01\x01"), 2)


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), RECORD_ARGS, st.integers(0, 400)), max_size=30),
       st.integers(0, 2000), st.integers(1, 12), st.integers(100, 5000), st.integers(0, 1000),
       st.integers(1, 3000))
def test_append_held_twins(records, capacity, entries, segment_bytes, first_ts, segment_ms):
    """Records staged whole and records whose payload is held apart, mixed: the same bytes,
    index entries, held list and positions; with each held payload after its record (as the
    log writes them), the result is a run of valid records."""
    stagings = [_staging(impl, capacity, entries, 1000, 40, segment_bytes, first_ts, segment_ms,
                         first_ts) for impl in (C, P)]
    file = bytearray()  # what the log writes: staged bytes, each held payload after its record
    taken = 0           # staged bytes already in ``file``
    held_count = 0
    for held, (ts, qos, retain, cid, topic, payload, props), held_len in records:
        c, p = (s.state for s in stagings)
        used = c.used
        if held:
            body = bytearray(random.Random(held_len).randbytes(held_len))  # as received
            got = [impl.append_held(s.state, ts, qos, retain, cid, len(cid), topic, len(topic),
                                    body, held_len, props, len(props))
                   for impl, s in zip((C, P), stagings)]
        else:
            got = [impl.append_record(s.state, ts, qos, retain, cid, len(cid), topic,
                                      len(topic), payload, len(payload), props, len(props))
                   for impl, s in zip((C, P), stagings)]
        assert got[0] == got[1]
        assert [getattr(c, f) for f in STAGE_FIELDS] == [getattr(p, f) for f in STAGE_FIELDS]
        if held and got[0] >= 0:
            # The held list says where its payload goes: after its staged bytes.
            held_count += 1
            assert stagings[0].held[held_count - 1] == c.used
            file += stagings[0].data[taken:c.used] + body
            taken = c.used
    c, p = stagings
    used, count = c.state.used, c.state.count
    assert c.data[:used] == p.data[:used] and c.index[:count * 16] == p.index[:count * 16]
    assert c.state.held_count == p.state.held_count == held_count
    assert c.held[:held_count] == p.held[:held_count]
    file += c.data[taken:used]
    if count:
        res = P.build_index(bytes(file), len(file), 40, 1000, 1003, 0, bytearray(16 * count))
        assert (res.status, res.count, res.stop) == (SCAN_END, count, len(file))
        assert c.state.position == 40 + len(file)


def test_append_held_refuses_what_the_log_must_handle():
    for impl in (C, P):
        # 160 staged bytes, 3 index entries; the segment: 100,000 bytes, 1000 ms from ts 500.
        s = _staging(impl, 160, 3, 1000, 40, 100_000, 500, 1000, 600)
        a = s.state

        def held(ts=550, qos=0, cid=b"c", topic=b"t/1", size=70_000):
            return impl.append_held(a, ts, qos, False, cid, len(cid), topic, len(topic),
                                    bytes(size), size, b"", 0)
        assert held() == 1003                       # 38 bytes staged, 70,038 in the segment
        assert [a.used, a.position] == [38, 40 + 70_038]
        assert held(size=30_000) == -1              # past segment_bytes: the segment rolls
        assert held(qos=3) == -1 and held(ts=-1) == -1 and held(ts=1500) == -1
        assert held(cid=b"c" * 130, size=1) == -1   # 167 more bytes do not fit the 160 staged
        assert held(size=0) == 1004 and held(size=5) == 1005
        assert held(size=1) == -1 and a.used == 114  # the 3 index entries are used up
        # The first record's header: its CRC covers the payload, which is not staged.
        assert s.data[:34] == P.record_header(1003, 550, 0, b"c", b"t/1", bytes(70_000))
        assert a.held_count == 3 and s.held[:3].tolist() == [38, 76, 114]
        # The held list has room for as many records as the index: when it is full, -1.
        s = _staging(impl, 1000, 4, 1000, 40, 100_000, 500, 1000, 600)
        s.state.held_capacity = 1
        assert impl.append_held(s.state, 550, 0, False, b"", 0, b"t", 1, b"x" * 9, 9,
                                b"", 0) == 1003
        assert impl.append_held(s.state, 550, 0, False, b"", 0, b"t", 1, b"x" * 9, 9,
                                b"", 0) == -1
        # With properties: staged after the topic, the held payload goes after them.
        s = _staging(impl, 1000, 4, 1000, 40, 100_000, 500, 1000, 600)
        assert impl.append_held(s.state, 550, 0, False, b"c", 1, b"t", 1, bytes(9), 9,
                                b"\x01\x01", 2) == 1003
        assert s.held[0] == s.state.used == 38 + 1 + 1 + 2
        assert s.data[:42] == P.record_header(1003, 550, 0, b"c", b"t", bytes(9), b"\x01\x01") \
            + b"ct\x01\x01"
    with pytest.raises(TypeError):
        C.append_held(a, 1, 0, False, b"", 0, bytearray(b"t"), 1, b"x", 1, b"", 0)



# ----------------------------------------------------------------------------------- fallocate

@pytest.mark.parametrize("impl", [C, P], ids=["c", "python"])
def test_fallocate_twins_allocate_ahead_and_keep_the_size(tmp_path, impl):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDWR)
    try:
        assert impl.fallocate(fd, 1 << 20) == 0
        st = os.fstat(fd)
        assert st.st_size == 100 and st.st_blocks * 512 >= 1 << 20
        assert impl.fallocate(-1, 4096) == errno.EBADF
    finally:
        os.close(fd)
