"""Cursors that ``retention_bytes`` moves are logged once per episode (core.retention_moves):
with the log at its size limit, every deletion moves each offline session's cursor again; the
first move is logged with its offsets, the next ones only counted (``log_gap``, exact) and
logged as a number when the session comes back, catches up or at a clean stop, and a pass that
moves many sessions logs one line for all of them."""

from __future__ import annotations

import os
import re

import pytest

from conftest import until

pytestmark = pytest.mark.timeout(120)

SESSIONS = 15
PASSES = 4
MOVED = re.compile(r"session '(.*?)': log records (\d+) to (\d+) are lost to it")
COUNTED = re.compile(r"session '(.*?)'.*; (\d+) more records were lost to it for "
                     r"retention_bytes|session '(.*?)': (\d+) more records were lost to it for "
                     r"retention_bytes")
SUMMARY = re.compile(r"retention deleted log records (\d+) to (\d+) \(the log was over "
                     r"retention_bytes\): (\d+) sessions behind")


def _first_offset(data_dir: str) -> int:
    return min(int(name[:-4]) for name in os.listdir(f"{data_dir}/log") if name.endswith(".seg"))


def _counted(line: str) -> tuple[str, int] | None:
    found = COUNTED.search(line)
    if found is None:
        return None
    who, n, who2, n2 = found.groups()
    return (who, int(n)) if who is not None else (who2, int(n2))


def test_offline_sessions_moved_by_retention_again_and_again_are_logged_once(broker, uid):
    """15 offline sessions, each subscribed to its own topic; a publisher keeps the log at
    retention_bytes, so that several deletion passes move every cursor. Each session gets one
    line with its first move and one with the number lost after it (when it is back, or at the
    stop); each pass one summary line. The lines add up to the log_gap counted. Before, each
    pass logged a line for every session (15 × passes)."""
    b = broker(log={"segment_bytes": 4096, "retention_bytes": 16384})
    data_dir = b.config["data_dir"]
    ids = [f"{uid}-d{i}" for i in range(SESSIONS)]
    for i, client_id in enumerate(ids):
        c = b.client(client_id, clean=False)
        assert c.subscribe(f"{uid}/d/{i}/cmd", qos=1).codes == [1]
        c.disconnect()
    pub = b.client(f"{uid}-p")

    def summaries():
        return [s for s in map(SUMMARY.search, b.logs) if s]

    def first_kept():
        """The log's first offset once every cursor is moved to it (counted as log_gap)."""
        first = _first_offset(data_dir)
        return [first] if b.stats()["dropped"].get("log_gap", 0) == SESSIONS * first else None

    firsts = set()
    for _ in range(4 * PASSES):               # 10 KB a burst: a deletion for most
        for i in range(30):
            pub.publish(f"{uid}/telemetry", b"%04d" % i + b"t" * 300, qos=1)
        [first] = until(first_kept, 10, "every cursor moved to the first record kept")
        if first:
            firsts.add(first)
        if len(firsts) >= PASSES:
            break
    assert len(firsts) >= PASSES, firsts
    gap = b.stats()["dropped"]["log_gap"]
    last = max(firsts) - 1                      # the last record deleted
    back = b.client(ids[0], clean=False)
    b.wait_log(lambda ln: f"'{ids[0]}' is back;" in ln, timeout=10)
    back.ping()
    assert b.client_row(ids[0])["drops"]["log_gap"] == last + 1
    assert b.stop() == 0
    moved = [g for g in map(MOVED.search, b.logs) if g]
    counted = [c for c in map(_counted, b.logs) if c]
    for client_id in ids:
        mine = [g for g in moved if g.group(1) == client_id]
        assert len(mine) == 1, [g.group(0) for g in mine]
        assert [n for who, n in counted if who == client_id] == [
            last - int(mine[0].group(3))], client_id
    logged = sum(int(g.group(3)) - int(g.group(2)) + 1 for g in moved)
    logged += sum(n for _, n in counted)
    assert logged == gap == SESSIONS * (last + 1)
    passes = summaries()               # one line a pass, for all the sessions it moved
    assert len(firsts) <= len(passes) <= 4 * PASSES, [s.group(0) for s in passes]
    assert all(int(s.group(3)) == SESSIONS for s in passes), [s.group(0) for s in passes]
    assert [int(s.group(1)) for s in passes[1:]] == [int(s.group(2)) + 1 for s in passes[:-1]]
    assert int(passes[0].group(1)) == 0 and int(passes[-1].group(2)) == last
