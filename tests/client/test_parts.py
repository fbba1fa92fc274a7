"""The event loop's parts on their own: the spool's files, the back-off, the throttle, the
state file's writing."""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest

from edgebroker.client import spool as S
from edgebroker.client.backoff import STABLE_AFTER, Backoff
from edgebroker.client.commands import Throttle
from edgebroker.client.requests import make_subscribe
from edgebroker.client.spool import Spool
from edgebroker.client.statefile import read_state, write_state


def drain(spool) -> list:
    out = []
    while (req := next(spool)) is not None:
        out.append(req)
    return out


def test_spool_gives_in_order_and_forgets_what_was_answered(tmp_path):
    path = tmp_path / "spool"
    with Spool(path) as sp:
        for i in range(5):
            sp.append("t", b"%d" % i, 1, token=f"k{i}")
        sp.append(make_subscribe([("f/#", 1)]))
        reqs = drain(sp)
        assert [r.payload for r in reqs[:5]] == [b"0", b"1", b"2", b"3", b"4"]
        assert reqs[5].kind == "subscribe" and reqs[0].token == "k0"
        assert sp.unacked == 6
        sp.acked(reqs[1])
        sp.acked(reqs[3])
        sp.acked(reqs[3])            # twice: no harm
        assert sp.unacked == 4 and next(sp) is None
    with Spool(path) as sp:          # another process: what was not answered, in order
        again = drain(sp)
        assert [r.payload for r in again] == [b"0", b"2", b"4", b""]
        assert sp.unacked == 4


def test_spool_cuts_a_record_a_crash_left_half_written(tmp_path):
    path = tmp_path / "spool"
    with Spool(path) as sp:
        sp.append("t", b"whole", 1)
        sp.append("t", b"cut", 1)
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(size - 3)
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"whole"]
        sp.append("t", b"after", 1)
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"whole", b"after"]
    with open(path, "r+b") as fh:    # a flipped bit in the first: damage, skipped
        fh.seek(10)
        byte = fh.read(1)
        fh.seek(10)
        fh.write(bytes((byte[0] ^ 1,)))
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"after"]


def test_spool_compacts_and_keeps_numbers_rising(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "COMPACT_AFTER", 4)
    path = tmp_path / "spool"
    with Spool(path) as sp:
        for i in range(6):
            sp.append("t", b"%d" % i, 1)
        reqs = drain(sp)
        before = os.path.getsize(path)
        for r in reqs[:4]:
            sp.acked(r)
        assert os.path.getsize(path) < before                 # rewritten without them
        assert os.path.getsize(f"{path}.acked") == 0
        seq = sp.append("t", b"6", 1)
        assert seq == 7
        sp.acked(reqs[4])
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"5", b"6"]
        assert sp.append("t", b"7", 1) == 8
    # Once compaction has removed the answered 7 to 9 and emptied PATH.acked, a Spool opened
    # later starts past what the files still hold: those numbers come again (as
    # docs/client.md says), never one a file still names.
    with Spool(path) as sp:
        reqs = drain(sp)                                  # seq 6, 7, 8
        assert sp.append("t", b"8", 1) == 9
        for r in [*reqs[1:], next(sp)]:
            sp.acked(r)                                   # 7, 8, 9: compaction
        assert os.path.getsize(f"{path}.acked") == 0
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"5"]
        assert sp.append("t", b"again", 1) == 7


def test_backoff_full_jitter_and_policies():
    b = Backoff("after_first_success", base=0.5, cap=4.0, rng=lambda: 1.0)
    assert not b.again()                       # never connected: give up
    assert [b.delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.succeeded()
    assert b.again() and b.delay() == 0.5
    low = Backoff("always", rng=lambda: 0.0)
    assert low.again() and low.delay() == 0.0
    assert not Backoff("never").again()
    with pytest.raises(ValueError, match="one of never"):
        Backoff("sometimes")


def test_backoff_floor_and_short_connections():
    """The bridge's use: waits drawn from ``base`` up; a connection lost before STABLE_AFTER
    does not start the count again."""
    b = Backoff("always", base=1.0, cap=60.0, rng=lambda: 0.0, floor=True)
    assert [b.delay() for _ in range(3)] == [1.0, 1.0, 1.0]
    b.succeeded(100.0)
    assert not b.lost(100.0 + STABLE_AFTER - 0.1) and b.attempts == 3
    b.succeeded(200.0)
    assert b.lost(200.0 + STABLE_AFTER) and b.attempts == 0
    high = Backoff("always", base=1.0, cap=60.0, rng=lambda: 1.0, floor=True)
    assert [high.delay() for _ in range(3)] == [1.0, 2.0, 4.0]


def test_throttle_token_bucket():
    t = Throttle(10.0, now=0.0)
    assert t.take(0.0) and not t.take(0.0)
    assert t.ready_at() == pytest.approx(0.1)
    assert not t.take(0.05) and t.take(0.1)
    assert sum(t.take(5.0 + i * 1e-6) for i in range(20)) == 10     # a second's burst at most


def test_state_file_written_whole(tmp_path):
    path = tmp_path / "state.json"
    assert read_state(path) is None
    write_state(path, {"a": 1})
    (tmp_path / "state.json.tmp").write_text("{half")    # a crash while writing the next
    assert read_state(path) == {"a": 1}
    write_state(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and not (tmp_path / "state.json.tmp").exists()
    path.write_text("{nope")
    with pytest.raises(ValueError, match="state.json: not JSON"):
        read_state(path)
    path.write_text("[" * 100_000)        # nested too deep to parse: named the same way
    with pytest.raises(ValueError, match="state.json: not JSON"):
        read_state(path)
    path.write_text("[1, 2]")             # JSON, not an object: AttributeError in EventLoop
    with pytest.raises(ValueError, match=r"state.json: not a JSON object \(list\)"):
        read_state(path)


def test_spool_keeps_no_qos2_stage_and_a_request_given_again_starts_with_publish(tmp_path,
                                                                                monkeypatch):
    """A QoS 2 request past PUBREC when the spool compacts is written without its stage (nor
    packet id): given again after a restart, it is sent as a PUBLISH, and again as a PUBLISH
    (DUP) when the link drops before PUBREC, never as a lone PUBREL."""
    import mqttraw as m
    from edgebroker.client.connection import Connection
    from edgebroker.client.events import Acked
    monkeypatch.setattr(S, "COMPACT_AFTER", 2)
    path = tmp_path / "spool"
    sp = Spool(path)
    for i in range(3):
        sp.append("t", b"m%d" % i, qos=2)
    c = Connection("c", 4, keepalive=0, clean_start=False)
    c.connect(0.0)
    c.data_to_send(0.0)
    c.receive_data(m.connack(), 0.0)
    for req in drain(sp):
        c.submit(req)
    c.data_to_send(0.0)
    c.receive_data(m.pubrec(3) + m.pubrec(1) + m.pubrec(2), 0.0)   # m2: PUBREL stage
    c.data_to_send(0.0)
    for event in c.receive_data(m.pubcomp(1) + m.pubcomp(2), 0.0):
        assert isinstance(event, Acked)
        sp.acked(event.request)                                     # -> compaction
    assert os.path.getsize(f"{path}.acked") == 0
    with open(path, "rb") as fh:
        body = json.loads(fh.read()[8:])
    assert body == {"kind": "publish", "topic": "t", "payload": "bTI=", "qos": 2,
                    "retain": False, "seq": 3}
    sp.close()

    sp = Spool(path)                                # a new process
    c = Connection("c", 4, keepalive=0, clean_start=False)
    c.connect(0.0)
    c.data_to_send(0.0)
    c.receive_data(m.connack(), 0.0)
    [req] = drain(sp)
    c.submit(req)
    assert c.data_to_send(0.0) == m.publish("t", b"m2", qos=2, packet_id=1)
    c.connection_lost()                             # before PUBREC
    c.connect(1.0)
    c.data_to_send(1.0)
    c.receive_data(m.connack(session_present=True), 1.0)
    assert c.data_to_send(1.0) == m.publish("t", b"m2", qos=2, packet_id=1, dup=True)
    sp.close()


def test_spool_a_zero_tail_ends_the_file(tmp_path):
    """A tail of zeros (the file grew, its blocks were never written: a power cut) reads as
    length 0: the end of the valid part, cut off at open; the records before it stay."""
    path = tmp_path / "spool"
    with Spool(path) as sp:
        sp.append("t", b"a", 1)
        sp.append("t", b"b", 1)
    size = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write(b"\0" * 16)
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"a", b"b"]
        assert os.path.getsize(path) == size
        sp.append("t", b"c", 1)
    for body in (b"{not json", b'{"kind":"publish"}', b"[3]"):   # sound CRC, no request
        with open(path, "ab") as fh:
            fh.write(struct.pack(">II", len(body), zlib.crc32(body)) + body)
        with Spool(path) as sp:
            assert [r.payload for r in drain(sp)] == [b"a", b"b", b"c"]


def test_spool_a_torn_acked_number_is_cut_off(tmp_path):
    """A number of PATH.acked cut short (a torn 8-byte write) is cut off at open, so the
    numbers written after it are read right."""
    path = tmp_path / "spool"
    with Spool(path) as sp:
        for i in range(300):
            sp.append("t", b"%d" % i, 1)
        sp.acked(next(sp))                                    # seq 1
    with open(f"{path}.acked", "ab") as fh:
        fh.write(b"\0\0\0")
    with Spool(path) as sp:
        assert sp.unacked == 299
        assert os.path.getsize(f"{path}.acked") == 8
        for _ in range(2):
            sp.acked(next(sp))                                # seq 2 and 3
    raw = open(f"{path}.acked", "rb").read()
    assert [struct.unpack_from(">Q", raw, i)[0] for i in range(0, len(raw), 8)] == [1, 2, 3]
    with Spool(path) as sp:
        assert sp.unacked == 297
        assert next(sp).payload == b"3"


# Run in a child process: RLIMIT_FSIZE (SIGXFSZ ignored) makes a write past the limit fail
# with EFBIG after the bytes below it are written, as a disk filling up does; the child then
# ends without closing the spool, as a crash.
_WRITE_ERROR_CHILD = """
import json, os, resource, signal, sys
from edgebroker.client.spool import Spool
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
def limited(size, call):
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        call()
    except OSError as exc:
        return exc.strerror
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
path = sys.argv[1]
sp = Spool(path)
sp.append("t", b"one", 1)
append_error = limited(os.path.getsize(path) + 20, lambda: sp.append("t", b"x" * 1000, 1))
sp.append("t", b"three", 1)
sp.append("t", b"four", 1)
one, three, four = next(sp), next(sp), next(sp)
sp.acked(one)
ack_error = limited(8 + 4, lambda: sp.acked(three))
sp.acked(four)
print(json.dumps([append_error, ack_error, sp.unacked]))
sys.stdout.flush()
os._exit(0)
"""


def test_spool_a_write_that_fails_part_way_leaves_no_torn_record(tmp_path):
    """An append and an acknowledgement whose write fails half-way (EFBIG here; ENOSPC and
    EIO alike) leave nothing behind: the appends and acknowledgements after them are read
    back after a crash. (The torn record ended the file at the next open, losing the
    requests appended after it; a torn number shifted every later one.) The append raises;
    the acknowledgement does not (the loop's poll() would), its number goes with the next."""
    import subprocess
    import sys
    import edgebroker
    path = tmp_path / "spool"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(edgebroker.__file__)))
    child = subprocess.run([sys.executable, "-c", _WRITE_ERROR_CHILD, str(path)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    append_error, ack_error, unacked = json.loads(child.stdout)
    assert append_error == "File too large" and ack_error is None
    assert unacked == 0
    raw = open(f"{path}.acked", "rb").read()      # 1, then 2 ("three") with 3, whole
    assert [struct.unpack_from(">Q", raw, i)[0] for i in range(0, len(raw), 8)] == [1, 2, 3]
    assert "answers kept in memory" in child.stderr and "written again" in child.stderr
    with Spool(path) as sp:
        assert drain(sp) == []
        assert sp.append("t", b"five", 1) == 4      # the failed append used no number


def test_spool_compaction_replaces_the_file_durably_with_one_fsync(tmp_path, monkeypatch):
    """Compaction goes through edgebroker.files.replace_file: the new file fsynced once (not
    per record), renamed, the directory fsynced."""
    monkeypatch.setattr(S, "COMPACT_AFTER", 4)
    calls = []
    real_replace, real_fsync = S.replace_file, os.fsync
    monkeypatch.setattr(S, "replace_file", lambda p, data: (calls.append(p),
                                                             real_replace(p, data)))
    fsyncs = []
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    path = tmp_path / "spool"
    with Spool(path) as sp:
        for i in range(20):
            sp.append("t", b"%d" % i, 1)
        reqs = drain(sp)
        for r in reqs[:10]:
            sp.acked(r)
    assert calls == [str(path)]
    assert len(fsyncs) == 2                 # the file once, its directory once
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"%d" % i for i in range(10, 20)]


@pytest.mark.parametrize("damage", ["flipped-body-bit", "flipped-length", "zeros"])
def test_spool_damage_inside_the_file_skips_that_record_and_keeps_those_after(tmp_path, caplog,
                                                                              damage):
    """One record of ten damaged on disk (a flipped bit in its body or its length, zeros as
    blocks never written): only it is skipped, with a warning naming the file and the
    offset; the seven after it stay (they were cut off with it, without a word). A torn
    tail behind them is still cut off."""
    path = tmp_path / "spool"
    starts = []
    with Spool(path) as sp:
        for i in range(10):
            starts.append(os.path.getsize(path))
            sp.append("t", b"m%d" % i, 1)
    size = os.path.getsize(path)
    raw = bytearray(path.read_bytes())
    third = starts[2]
    if damage == "flipped-body-bit":
        raw[third + 12] ^= 0x01
    elif damage == "flipped-length":
        raw[third + 2] ^= 0x10
    else:
        raw[third:starts[3]] = bytes(starts[3] - third)
    path.write_bytes(bytes(raw[:-3]))           # and the last record torn
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)] == [b"m%d" % i for i in (0, 1, 3, 4, 5, 6, 7, 8)]
        assert os.path.getsize(path) == starts[9]   # only the torn tail cut
        sp.append("t", b"new", 1)
    assert (f"{path}: {starts[3] - third} bytes at offset {third} are no sound record "
            f"(damaged on disk): skipped; the records after them, from offset {starts[3]}, "
            f"are kept") in caplog.text
    assert f"{path}: the {size - 3 - starts[9]} bytes from offset {starts[9]}" in caplog.text
    with Spool(path) as sp:
        assert [r.payload for r in drain(sp)][-2:] == [b"m8", b"new"]
