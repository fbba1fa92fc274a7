"""10,000 concurrent connections: all connected and answered PINGREQ; RSS per idle connection.

The test raises RLIMIT_NOFILE to its hard limit before starting the broker, which inherits it.
The clients are plain non-blocking sockets driven by one selector in this process, in batches
(bounded in count and time), so the listen backlog never overflows.
"""

import selectors
import socket
import time

import psutil
import pytest

import mqttraw as m
from conftest import open_files_allowed

N = 10_000
BATCH = 1000
TIMEOUT = 60.0
# A guard against gross regressions only (say, a read buffer kept per idle connection). The
# 1.5 KB target is a memory goal and lives in the benchmark (bench/run.py, idle_10000).
MAX_RSS_PER_CONNECTION = 8192  # bytes


@pytest.fixture
def many_files():
    with open_files_allowed(N + 500):
        yield


def drive(sel: selectors.BaseSelector, socks, want: bytes, deadline: float) -> None:
    """Read from every socket until each got exactly the bytes ``want``."""
    left = {s.fileno(): s for s in socks}
    got = {fd: b"" for fd in left}
    for s in socks:
        sel.modify(s, selectors.EVENT_READ)
    while left:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{len(left)} of {len(socks)} sockets still waiting for {want!r}"
        for key, _ in sel.select(min(remaining, 1.0)):
            fd = key.fd
            if fd not in left:
                continue
            data = key.fileobj.recv(64)
            assert data, f"connection {fd} closed while waiting for {want!r}"
            got[fd] += data
            if len(got[fd]) >= len(want):
                assert got[fd] == want, got[fd]
                del left[fd]


def test_ten_thousand_connections(broker, uid, many_files):
    b = broker(limits={"max_connections": N + 100, "max_connection_rate": 0})
    warm = b.client(f"{uid}-warm")
    proc = psutil.Process(b.proc.pid)
    rss0 = proc.memory_info().rss
    sel = selectors.DefaultSelector()
    socks = []
    deadline = time.monotonic() + TIMEOUT
    try:
        for start in range(0, N, BATCH):
            batch = []
            for i in range(start, min(start + BATCH, N)):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((b.host, b.port))
                socks.append(s)
                batch.append(s)
                sel.register(s, selectors.EVENT_WRITE)
            pending = set(batch)
            while pending:  # connected: writable
                assert time.monotonic() < deadline, f"{len(pending)} connects pending"
                for key, _ in sel.select(1.0):
                    if key.fileobj in pending:
                        key.fileobj.send(m.connect(f"{uid}-{start}-{key.fd}", keepalive=0))
                        pending.discard(key.fileobj)
                        sel.modify(key.fileobj, selectors.EVENT_READ)
            drive(sel, batch, b"\x20\x02\x00\x00", deadline)  # CONNACK accepted
        assert b.stats()["clients_connected"] == N + 1
        t0 = time.monotonic()
        for s in socks:
            s.send(m.pingreq())
        drive(sel, socks, b"\xd0\x00", deadline)             # PINGRESP, all of them
        ping_all = time.monotonic() - t0
        assert warm.ping() == []
        rss1 = proc.memory_info().rss
        per_connection = (rss1 - rss0) / N
        print(f"\n{N} connections: broker RSS {rss0 / 2**20:.1f} MiB -> {rss1 / 2**20:.1f} MiB, "
              f"{per_connection:.0f} bytes per idle connection; PINGREQ to all answered in "
              f"{ping_all:.2f} s")
        assert per_connection <= MAX_RSS_PER_CONNECTION, per_connection
    finally:
        sel.close()
        for s in socks:
            s.close()
