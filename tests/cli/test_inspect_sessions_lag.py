"""`inspect sessions` reads the session snapshot: a session behind that read a batch ahead into
its queue (two filters: not a run) is shown from the first record it has not been sent, as the
live figures are, not from its cursor past the batch."""

from __future__ import annotations

import json
import os

import mqttraw as m
from conftest import run_cli, wait_for_snapshot


def _figures_start_at(b, client_id: str, unsent: int, n: int) -> None:
    """Once the snapshot shows ``client_id`` behind with a batch read ahead: its live figures
    and `inspect sessions` both start at ``unsent`` of ``n`` records."""
    data = b.config["data_dir"]
    wait_for_snapshot(data, client_id, pred=lambda s: s["cursor"] is not None
                      and s["queue"] and s["cursor"] > unsent)
    live = b.client_row(client_id)
    assert (live["cursor"], live["lag_records"]) == (unsent, n - unsent), live
    r = run_cli("inspect", "sessions", "--data-dir", data, "--format", "json")
    assert r.returncode == 0, r.stderr
    shown = {s["client_id"]: s for s in json.loads(r.stdout)["sessions"]}[client_id]
    assert (shown["cursor"], shown["lag_records"]) == (unsent, n - unsent), shown


def test_inspect_sessions_counts_the_batch_read_ahead_as_not_read(broker, uid):
    b = broker()
    sub = b.client(f"{uid}-sub", clean=False)
    sub.subscribe(f"{uid}/a/#", qos=1)
    sub.subscribe(f"{uid}/b/#", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-pub")
    n = 1500
    pub.send(b"".join(m.publish(f"{uid}/a/x", b"%d" % i, qos=1, packet_id=1 + i % 1000)
                      for i in range(n)))
    for _ in range(n):
        pub.expect(m.PUBACK, 10)
    back = b.raw()
    assert back.connect(f"{uid}-sub", clean=False).session_present is True
    window = [back.recv_publish(5, ack=False) for _ in range(20)]
    assert [int(p.payload) for p in window] == list(range(20))
    _figures_start_at(b, f"{uid}-sub", 20, n)


def test_a_retained_publish_sent_as_published_is_not_taken_for_a_retained_copy(broker, uid):
    """A 5.0 subscription with Retain As Published queues live retained PUBLISHes with their
    retain flag: the first of them is still the first record not sent (only the copies sent
    for a SUBSCRIBE are set aside)."""
    import mqttraw5 as R
    b = broker()
    sub = R.RawClient5(b.host, b.port)
    sub.connect(f"{uid}-sub", clean_start=False, props={R.SESSION_EXPIRY: 300})
    sub.subscribe((f"{uid}/a/#", 0x01 | 0x08))      # QoS 1, Retain As Published
    sub.disconnect()
    pub = b.client(f"{uid}-pub")
    n = 1500
    pub.send(b"".join(m.publish(f"{uid}/a/x", b"%d" % i, qos=1, retain=True,
                                packet_id=1 + i % 1000) for i in range(n)))
    for _ in range(n):
        pub.expect(m.PUBACK, 10)
    back = R.RawClient5(b.host, b.port)
    back.connect(f"{uid}-sub", clean_start=False, props={R.SESSION_EXPIRY: 300})
    window = [back.recv_publish(5, ack=False) for _ in range(20)]
    assert all(p.retain for p in window)
    _figures_start_at(b, f"{uid}-sub", 20, n)


def test_records_retention_deleted_are_a_gap_not_lag(broker, uid):
    """A connected session with its window full falls behind; retention_bytes deletes records
    it had not been sent (counted as log_gap). Its lag in records, live and in `inspect
    sessions` (and `lag_records_max`), starts at the first record still in the log, as its
    lag in bytes does: the records deleted were not also counted as lag."""
    b = broker(log={"segment_bytes": 8192, "retention_bytes": 65536})
    data = b.config["data_dir"]
    sub = b.client(f"{uid}-sub", clean=False)
    sub.subscribe(f"{uid}/#", qos=1)
    pub = b.client(f"{uid}-pub")
    n = 1500
    for start in range(0, n, 500):
        pub.send(b"".join(m.publish(f"{uid}/x", b"%06d" % i + b"x" * 200, qos=1,
                                    packet_id=1 + i % 1000) for i in range(start, start + 500)))
        for _ in range(500):
            pub.expect(m.PUBACK, 10)
    window = [sub.recv_publish(5, ack=False) for _ in range(20)]
    assert [int(p.payload[:6]) for p in window] == list(range(20))
    snapshot = wait_for_snapshot(data, f"{uid}-sub", timeout=10,
                                 pred=lambda s: s["drops"].get("log_gap", 0) > 0)
    first = min(int(name[:-4]) for name in os.listdir(f"{data}/log") if name.endswith(".seg"))
    assert snapshot["log_next_offset"] == n and first > 20 + 256
    live = b.client_row(f"{uid}-sub")
    assert live["cursor"] < first and live["lag_records"] == n - first, live
    assert b.stats()["lag_records_max"] == n - first
    r = run_cli("inspect", "sessions", "--data-dir", data, "--format", "json")
    assert r.returncode == 0, r.stderr
    shown = {s["client_id"]: s for s in json.loads(r.stdout)["sessions"]}[f"{uid}-sub"]
    assert shown["cursor"] < first and shown["lag_records"] == n - first, shown
    assert shown["lag_bytes"] == live["lag_bytes"] > 0
