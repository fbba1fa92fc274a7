"""A changed retained set is appended to the side file (core.retained_side), not written
whole: a 3.2 MB retained set with one message replaced between snapshots rewrote the whole
3.2 MB at every snapshot (SD-card wear on gateways). The file keeps its generation and grows by
the changed payloads; it is written anew only when the bytes no message uses would be more than
those used; a side file longer than its document (an append whose document a crash left
unwritten) is valid."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from mqttraw import publish
from core.test_snapshot_retained_file import (
    _stopped_with_a_side_file, _verify, check_kept, side_files, snapshot_of,
)

from edgebroker.core.retained_side import RetainedFile, load
from edgebroker.core.snapshot_retained import RetainedState

pytestmark = pytest.mark.timeout(120)

N, SIZE = 200, 16 << 10


def _payload(i: int, version: int) -> bytes:
    return (version << 16 | i).to_bytes(4, "big") * (SIZE // 4)


def _publish(b, pub, uid, versions: dict[int, int]) -> None:
    """Set ``{index: version}`` retained, 100 at a time, each batch answered before the next."""
    items = sorted(versions.items())
    for first in range(0, len(items), 100):
        pub.send(b"".join(publish(f"{uid}/r/{i}", _payload(i, v), retain=True)
                          for i, v in items[first:first + 100]))
        assert pub.ping(timeout=10) == []


def _write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith("write_bytes:"))


def _check_all(b, uid, versions: dict[int, int]) -> None:
    c = b.client(f"{uid}-c")
    c.subscribe(f"{uid}/r/#", qos=0)
    got = {}
    for _ in range(len(versions)):
        p = c.recv_publish(timeout=10)
        got[int(p.topic.rsplit("/", 1)[1])] = p.payload
    assert got.keys() == versions.keys()
    wrong = [i for i, v in versions.items() if got[i] != _payload(i, v)]
    assert not wrong, f"payloads of {len(wrong)} retained messages differ: {wrong[:10]}"


def _the_set_written(broker, uid):
    """A broker holding N retained messages (version 0), in a snapshot's side file: (broker,
    data_dir, publisher, versions, side file name, its size)."""
    b = broker()
    pub = b.client(f"{uid}-p")
    versions = dict.fromkeys(range(N), 0)
    _publish(b, pub, uid, versions)
    name, size, _ = snapshot_of(b, f"{uid}-s0")["retained_file"]
    return b, b.config["data_dir"], pub, versions, name, size


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "stop"])
def test_a_changed_retained_message_is_appended_not_the_whole_set_rewritten(broker, uid, sig):
    b, data_dir, pub, versions, name, size = _the_set_written(broker, uid)
    assert size >= N * SIZE
    before = _write_bytes(b.proc.pid)
    rounds = 5
    for k in range(1, rounds + 1):
        versions[k * 7] = k                  # one message replaced between two snapshots
        _publish(b, pub, uid, {k * 7: k})
        head = snapshot_of(b, f"{uid}-s{k}")["retained_file"]     # (a session change)
        assert head[:2] == [name, size + SIZE], (k, head, name, size)
        assert side_files(data_dir) == [name]
        assert os.path.getsize(Path(data_dir, name)) == head[1]
        size = head[1]
    written = (_write_bytes(b.proc.pid) - before) // rounds
    print(f"bytes written to the state directory per snapshot: {written} "
          f"(retained set {N * SIZE}, {SIZE} changed)")
    # The log record, the document and the appended payload: far below the 3.2 MB set.
    assert written < N * SIZE // 8, written
    # The room kept for the stop's snapshot is twice what it writes at most: the document and
    # the bytes the retained messages use, not the replaced ones left in the file (diff29).
    document = os.path.getsize(Path(data_dir, "sessions.json"))
    reserve = os.path.getsize(Path(data_dir, "sessions.json.reserve"))
    assert reserve <= 2 * (document + N * SIZE + 12) + 65536, (reserve, document)  # (64 KiB steps)
    assert b.stop(sig) == (0 if sig == signal.SIGTERM else -sig)
    _check_all(broker(data_dir=data_dir), uid, versions)


def test_the_side_file_is_written_anew_once_it_holds_more_unused_bytes_than_used(broker, uid):
    b, data_dir, pub, versions, name, size = _the_set_written(broker, uid)
    # Every message replaced: appended (as many unused bytes as used, not more).
    versions = dict.fromkeys(range(N), 1)
    _publish(b, pub, uid, versions)
    head = snapshot_of(b, f"{uid}-s1")["retained_file"]
    assert head[:2] == [name, 2 * size - 12] and side_files(data_dir) == [name]
    # One more: more unused than used, a new generation holding what is used; the old deleted.
    versions[3] = 2
    _publish(b, pub, uid, {3: 2})
    new = snapshot_of(b, f"{uid}-s2")["retained_file"]
    assert new[0] != name and new[1] == size and side_files(data_dir) == [new[0]]
    # Cleared messages leave unused bytes too: 150 of 200 cleared, written anew.
    for i in range(150):
        versions.pop(i)
    pub.send(b"".join(publish(f"{uid}/r/{i}", b"", retain=True) for i in range(150)))
    assert pub.ping(timeout=10) == []
    last = snapshot_of(b, f"{uid}-s3")["retained_file"]
    assert last[0] not in (name, new[0]) and last[1] == 12 + 50 * SIZE
    assert side_files(data_dir) == [last[0]]
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    _check_all(broker(data_dir=data_dir), uid, versions)


def test_a_side_file_longer_than_its_document_is_valid(broker, uid):
    """What a crash between an append and the document's replace leaves: the start restores
    every retained message and ``inspect verify`` says OK; a cut-off one is still damage
    (test_snapshot_retained_file)."""
    data_dir, side = _stopped_with_a_side_file(broker, uid)
    with open(side, "ab") as fh:
        fh.write(b"appended, its document never written" * 100)
    rc, out = _verify(data_dir)
    assert rc == 0 and "DAMAGE" not in out, out
    b = broker(data_dir=data_dir)
    assert b.wait_log("restored 1 persistent sessions and 3 retained messages"), b.log_text()
    check_kept(b, uid)
    assert not any("ERROR" in ln for ln in b.logs), b.log_text()


def test_states_of_a_write_whose_document_failed_are_placed_again(tmp_path):
    """An append done, its document not written (discard): the states it placed are not taken
    as in the file; the next write places them again, and the file reads back right."""
    side = RetainedFile(str(tmp_path))
    a, b, c, d = (RetainedState(t, t.encode() * 10, 0, None) for t in "abcd")
    first = side.plan([a, b])
    assert first.start == 0
    head = side.write(first)
    side.written(head, [a, b])
    assert side.current([a, b]) == head
    failed = side.plan([a, b, c])
    assert (failed.start, failed.name) == (head[1], head[0])
    side.write(failed)
    side.discard(failed)                 # (its document could not be written)
    assert side.current([a, b, c]) is None
    again = side.plan([a, b, c, d])
    assert again.start == head[1] and [r.place[0] for r in again.states] == \
        [head[1], head[1] + 10]          # c placed anew, where the failed append had put it
    head2 = side.write(again)
    assert os.path.getsize(tmp_path / head[0]) == head2[1] == head[1] + 20
    side.written(head2, [a, b, c, d])
    assert side.current([a, b, c, d]) == head2
    read = [RetainedState(r.topic, b"", 0, None, place=r.place) for r in (a, b, c, d)]
    load(str(tmp_path), head2, read, "sessions.json")
    assert [r.payload for r in read] == [r.payload for r in (a, b, c, d)]
