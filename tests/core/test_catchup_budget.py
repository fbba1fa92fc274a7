"""Many sessions behind reconnecting at once share one scan budget per pass (core.catchup,
PASS_SCAN_BYTES): driven in-process with a real commit log, each catch-up pass reads at most
about the budget of the log for all of them together (it read SCAN_BYTES for each), and
every session still gets its message. The budgets are made small to keep the log small."""

from __future__ import annotations

import time

import pytest

import mqttraw as m
from edgebroker import config
from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.log import CommitLog
from edgebroker.core import catchup
from edgebroker.core.broker import Broker
from edgebroker.core.testing import FakeTransport

SESSIONS = 8
SCAN = 128 * 1024
PASS = 2 * SCAN
CHUNK = 64 * 1024          # the reader reads whole chunks: a read may go this much over


@pytest.fixture
def core(tmp_path, monkeypatch):
    monkeypatch.setattr(catchup, "SCAN_BYTES", SCAN)
    monkeypatch.setattr(catchup, "PASS_SCAN_BYTES", PASS, raising=False)
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(segment_bytes=1 << 20))
    broker = Broker(config.Config(), time.monotonic, commit_log=log,
                    wall_ms=lambda: time.time_ns() // 1_000_000)
    yield broker
    log.close()


def _connect(broker, client_id: str, clean: bool = True):
    transport = FakeTransport(client_id, max_pending=1 << 20)
    client = transport.client = broker.connection_made(transport)
    client.data_received(m.connect(client_id, clean=clean))
    return client, transport


def _received(transport) -> list[str]:
    data = b"".join(bytes(x) for x in transport.out)
    return [p.topic for p in m.split_frames(bytearray(data)) if p.type == m.PUBLISH]


def test_sessions_reconnecting_at_once_share_the_pass_scan_budget(core):
    for i in range(SESSIONS):
        client, _ = _connect(core, f"s{i}", clean=False)
        client.data_received(m.subscribe(1, [(f"s{i}/x", 1)]))
        client.data_received(m.disconnect())
    pub, pub_t = _connect(core, "pub")
    payload = b"z" * 1000
    for _ in range(4):               # ~3 MiB the sessions do not want, then one each
        pub.data_received(b"".join(m.publish("other", payload) for _ in range(800)))
        core.end_pass()
    pub.data_received(b"".join(m.publish(f"s{i}/x", b"mine", qos=1, packet_id=1)
                               for i in range(SESSIONS)))
    core.end_pass()
    pub_t.flush()
    commit_log = core.journal.log
    sessions = [core.sessions[f"s{i}"] for i in range(SESSIONS)]
    unread = {s: commit_log.bytes_after(s.cursor.offset) for s in sessions}
    assert min(unread.values()) > SESSIONS * SCAN

    def read_in_pass() -> int:
        total = 0
        for s in sessions:
            left = commit_log.bytes_after(s.cursor.offset) if s.cursor is not None else 0
            total += unread[s] - left
            unread[s] = left
        return total

    transports = [_connect(core, f"s{i}", clean=False)[1] for i in range(SESSIONS)]
    assert read_in_pass() <= PASS + SCAN + CHUNK      # the CONNECT pass
    passes = 0
    while any(s.cursor is not None for s in sessions) and passes < 1000:
        core._on_catch_up()                              # the next passes
        assert read_in_pass() <= PASS + SCAN + CHUNK
        passes += 1
    assert passes > 1
    for i, transport in enumerate(transports):
        assert _received(transport) == [f"s{i}/x"]


def test_sessions_of_many_filters_share_a_record_budget_per_pass(core, monkeypatch):
    """Sessions with two filters take every record of a stretch into Python (the scanner
    filters for one filter only), each costing the loop a few microseconds: 500 of them
    reconnecting at once took 256 or more each in one pass, 300 ms passes (catchup5). A pass
    hands Python at most about PASS_RECORDS of them together (the last read may go over by a
    chunk's worth); the rest go on in the next passes, and every session still gets all of
    its messages."""
    monkeypatch.setattr(catchup, "PASS_RECORDS", 512, raising=False)
    for i in range(SESSIONS):
        client, _ = _connect(core, f"r{i}", clean=False)
        client.data_received(m.subscribe(1, [(f"r{i}/x", 1), ("all/#", 1)]))
        client.data_received(m.disconnect())
    pub, pub_t = _connect(core, "pub")
    pub.data_received(b"".join(m.publish("other", b"o", qos=1, packet_id=1 + n % 60000)
                               for n in range(3000)))
    pub.data_received(b"".join(m.publish(f"r{i}/x", b"mine", qos=1, packet_id=1)
                               for i in range(SESSIONS)))
    core.end_pass()
    pub_t.flush()
    commit_log = core.journal.log
    handed = []
    read_batch = commit_log.read_batch

    def counted(*args, **kw):
        records, next_offset = read_batch(*args, **kw)
        handed.append(len(records))
        return records, next_offset

    monkeypatch.setattr(commit_log, "read_batch", counted)

    def read_in_pass() -> int:
        total = sum(handed)
        handed.clear()
        return total

    sessions = [core.sessions[f"r{i}"] for i in range(SESSIONS)]
    transports = [_connect(core, f"r{i}", clean=False)[1] for i in range(SESSIONS)]
    most = 512 + max(catchup.QUEUE_MESSAGES, 2 * 1024)
    assert read_in_pass() <= most                               # the CONNECT pass
    passes = 0
    while any(s.cursor is not None for s in sessions) and passes < 1000:
        core._on_catch_up()
        assert read_in_pass() <= most
        passes += 1
    assert passes > 1
    for i, transport in enumerate(transports):
        assert _received(transport) == [f"r{i}/x"]
