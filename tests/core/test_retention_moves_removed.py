"""A session whose cursor retention_bytes or max_session_lag_age moved again after the logged
first move, removed before it comes back or catches up (persistent_client_expiration, a
clean-start reconnect): the records counted after the first move are logged when it is
removed, so the lines add up to the log_gap counted (diff39 #3: they were counted, never
logged)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from conftest import toml_dumps, until

pytestmark = pytest.mark.timeout(120)

MOVED = re.compile(r"session '(.*?)': log records (\d+) to (\d+) are lost to it")
COUNTED = re.compile(r"session '(.*?)': (\d+) more records were lost to it for (\w+) after the "
                     r"move logged, (.*)")


def _first_offset(data_dir: str) -> int:
    return min(int(name[:-4]) for name in os.listdir(f"{data_dir}/log") if name.endswith(".seg"))


def _offline(b, ids, uid) -> None:
    for i, client_id in enumerate(ids):
        c = b.client(client_id, clean=False)
        assert c.subscribe(f"{uid}/d/{i}/cmd", qos=1).codes == [1]
        c.disconnect()


def _expire_now(b) -> None:
    """persistent_client_expiration 1 s by a reload: the offline sessions expire."""
    config = dict(b.config, limits=dict(b.config.get("limits", {}),
                                        persistent_client_expiration=1))
    b.config_path.write_text(toml_dumps(config))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "configuration reloaded" in ln, timeout=10, start=mark)


def _removed(b, expired: str, discarded: str) -> None:
    """``discarded`` reconnects with clean session 1, ``expired`` expires."""
    mark = b.mark()
    b.client(discarded, clean=True).disconnect()
    assert b.wait_log(lambda ln: f"'{discarded}' discarded" in ln, timeout=10, start=mark)
    _expire_now(b)
    assert b.wait_log(lambda ln: f"persistent session '{expired}' removed" in ln, timeout=10,
                      start=mark)


def _logged(b, ids, reason: str) -> dict:
    """Per session: (records in its logged moves, its counted lines)."""
    out = {}
    for client_id in ids:
        moves = [g for g in map(MOVED.search, b.logs) if g and g.group(1) == client_id]
        counts = [c for c in map(COUNTED.search, b.logs) if c and c.group(1) == client_id]
        assert all(c.group(3) == reason for c in counts), [c.group(0) for c in counts]
        out[client_id] = (sum(int(g.group(3)) - int(g.group(2)) + 1 for g in moves),
                          [(int(c.group(2)), c.group(4)) for c in counts])
    return out


def test_retention_moves_of_a_session_expired_or_discarded_are_logged(broker, uid):
    b = broker(log={"segment_bytes": 4096, "retention_bytes": 16384})
    data_dir = b.config["data_dir"]
    ids = [f"{uid}-exp", f"{uid}-cs"]
    _offline(b, ids, uid)
    pub = b.client(f"{uid}-p")

    def first_kept():
        """The log's first offset once every cursor is moved to it (counted as log_gap)."""
        first = _first_offset(data_dir)
        return [first] if b.stats()["dropped"].get("log_gap", 0) == len(ids) * first else None

    firsts = set()
    for _ in range(16):                       # 10 KB a burst: a deletion for most
        for i in range(30):
            pub.publish(f"{uid}/telemetry", b"%04d" % i + b"t" * 300, qos=1)
        [first] = until(first_kept, 10, "every cursor moved to the first record kept")
        if first:
            firsts.add(first)
        if len(firsts) >= 3:
            break
    assert len(firsts) >= 3, firsts           # a first move, then at least two counted
    gap = b.stats()["dropped"]["log_gap"]
    _removed(b, ids[0], ids[1])
    assert b.stop() == 0
    logged = _logged(b, ids, "retention_bytes")
    for client_id in ids:
        moved, counts = logged[client_id]
        assert counts == [(max(firsts) - moved, "before it was removed")], (client_id, counts)
    assert sum(moved + sum(n for n, _ in counts) for moved, counts in logged.values()) == gap


def test_max_session_lag_age_moves_of_a_session_expired_or_discarded_are_logged(broker, uid):
    b = broker(limits={"max_session_lag_age": 1.0})
    ids = [f"{uid}-exp", f"{uid}-cs"]
    _offline(b, ids, uid)
    pub = b.client(f"{uid}-p")

    def moved_again():
        """Each cursor moved once logged, and then again (log_gap above the logged move)."""
        logged = _logged(b, ids, "max_session_lag_age")
        gap = b.stats()["dropped"].get("log_gap", 0)
        return (all(moved for moved, _ in logged.values())
                and gap > sum(moved for moved, _ in logged.values()) + len(ids))

    for i in range(200):                      # paced: records age past 1 s while it goes on
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
        if i >= 8 and moved_again():
            break
        time.sleep(0.1)
    assert moved_again()
    pub.disconnect()
    gap = b.stats()["dropped"]["log_gap"]
    _removed(b, ids[0], ids[1])
    assert b.stop() == 0
    logged = _logged(b, ids, "max_session_lag_age")
    assert all(len(counts) == 1 and counts[0][0] > 0 and counts[0][1] == "before it was removed"
               for _, counts in logged.values()), logged
    assert sum(moved + sum(n for n, _ in counts) for moved, counts in logged.values()) == gap
