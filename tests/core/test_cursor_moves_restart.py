"""Cursors that retention or ``max_session_lag_age`` moved forward, across a restart: the gap is
counted and logged once (a shared subscription group's move is in the next snapshot, as a
session's is), and the records skipped after the logged first move of a ``max_session_lag_age``
episode are logged at a clean stop before the session catches up (docs/persistence.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

import mqttraw as m
from conftest import until

pytestmark = pytest.mark.timeout(90)


def _snapshot(data_dir: str) -> dict:
    try:
        with open(f"{data_dir}/sessions.json") as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return {}


def _publish(b, client_id: str, topic: str, n: int, size: int = 200, start: int = 0) -> None:
    pub = b.client(client_id)
    for first in range(start, start + n, 500):
        count = min(500, start + n - first)
        pub.send(b"".join(m.publish(topic, b"%06d" % i + b"x" * size, qos=1,
                                    packet_id=1 + i % 1000)
                          for i in range(first, first + count)))
        for _ in range(count):
            pub.expect(m.PUBACK, 10)
    pub.disconnect()


GROUP_GAP = re.compile(r"shared subscription '(.*)': log records (\d+) to (\d+) are lost to it")


def _first_offset(data_dir: str) -> int:
    return min(int(name[:-4]) for name in os.listdir(f"{data_dir}/log") if name.endswith(".seg"))


def test_a_group_cursor_moved_by_retention_is_saved_so_a_crash_counts_the_gap_once(
        broker, uid):
    """retention_bytes deletes records an offline member's group still needed: the group's
    cursor moves forward (counted, logged), and the next snapshot holds the new cursor. After
    a SIGKILL the restart goes on from there: the gap is neither logged nor counted again."""
    log = {"segment_bytes": 8192, "retention_bytes": 65536}
    b = broker(log=log)
    data_dir = b.config["data_dir"]
    share = f"$share/g/{uid}/#"
    p = b.client(f"{uid}-P", clean=False)
    assert p.subscribe(share, qos=1).codes == [1]
    p.disconnect()
    # A burst, then a trickle: retention deletes records the group's backlog needs, and its
    # cursor moves forward, by retention's check or by the group's next read from the log.
    _publish(b, f"{uid}-pub", f"{uid}/x", 1500)
    for i in range(1500, 2000, 25):         # (over a second or two: several deletions)
        _publish(b, f"{uid}-pub", f"{uid}/x", 25, start=i)
        time.sleep(0.05)

    def saved_after_last_move():
        moves = [GROUP_GAP.search(line) for line in b.logs]
        moves = [int(g.group(3)) + 1 for g in moves if g and g.group(1) == share]
        groups = {g["key"]: g["cursor"] for g in _snapshot(data_dir).get("shared", ())}
        return (moves and moves[-1] == _first_offset(data_dir) == groups.get(share)
                and moves[-1])
    moved_to = until(saved_after_last_move, 15, "the snapshot holds the group's last move")
    assert b.stats()["dropped"]["log_gap"] > 0
    b.stop(signal.SIGKILL)
    b2 = broker(data_dir=data_dir, log=log)
    again = b2.client(f"{uid}-P", clean=False)
    first = again.recv_publish(10)
    assert int(first.payload[:6]) >= moved_to, first.payload[:6]
    assert b2.stats()["dropped"].get("log_gap", 0) == 0
    assert not [line for line in b2.logs if "lost to it" in line]


MOVED = re.compile(r"log records (\d+) to (\d+) are lost to it")
COUNTED = re.compile(r"(\d+) more records were lost to it for max_session_lag_age")


def test_a_stop_in_a_max_session_lag_age_episode_logs_what_it_counted(broker, uid):
    """An offline session's cursor is moved every second (max_session_lag_age): the first move
    is logged with its offsets, the next ones only counted. A SIGTERM before it catches up logs
    that count; after the restart every record lost to it is in some log line."""
    limits = {"max_session_lag_age": 1.0}
    b = broker(limits=limits)
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(16):                         # 4 s: the cursor is moved several times
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
        time.sleep(0.25)
    pub.disconnect()
    assert b.stop() == 0
    mine = [line for line in b.logs if f"'{uid}-s'" in line]
    stopped = [int(c.group(1)) for c in map(COUNTED.search, mine) if c]
    assert len(stopped) == 1 and stopped[0] > 0, mine
    b2 = broker(data_dir=data_dir, limits=limits)
    again = b2.client(f"{uid}-s", clean=False)
    got = [int(p.payload) for p in again.ping() if p.type == m.PUBLISH]
    gap = b2.client_row(f"{uid}-s")["drops"]["log_gap"]
    assert got == list(range(gap, 16)), (gap, got)
    mine += [line for line in b2.logs if f"'{uid}-s'" in line]
    logged = sum(int(b) - int(a) + 1 for a, b in (g.groups() for g in map(MOVED.search, mine)
                                                    if g))
    logged += sum(int(c.group(1)) for c in map(COUNTED.search, mine) if c)
    assert logged == gap, (gap, mine)
