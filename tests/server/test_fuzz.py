"""Fuzzing a live broker: generated and mutated inputs (tests/fuzzgen.py, seeded) over many
connections, MQTT and MQTT over WebSockets, pipelined; then the broker must still serve a
normal client, be back near the descriptors and memory it started with, have logged no
traceback, and have a log that verifies.

``EDGEBROKER_FUZZ_INPUTS`` (default 200,000, what CI runs) and ``EDGEBROKER_FUZZ_SEED`` set
the size and the seed; ``make fuzz`` runs a million or more (README.md).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil
import pytest

from conftest import run_cli
from fuzzgen import Fuzzer

INPUTS = int(os.environ.get("EDGEBROKER_FUZZ_INPUTS", "200000"))
SEED = os.environ.get("EDGEBROKER_FUZZ_SEED", "26")
WORKERS = 4                 # connections at a time
WEBSOCKET_SHARE = 0.1       # of the connections
# After the run: descriptors allowed above what the broker had before it (but the log's
# files), and RSS above a broker restarted on the same saved state.
FDS_SLACK = 2
RSS_SLACK = 32 * 1024 * 1024   # 1,000,000 inputs: 52 MiB after, 39 MiB restarted


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.inputs = self.connections = self.websocket = self.unanswered = 0


def _send(address, data: bytes) -> bool | None:
    """One connection: send ``data``, half-close, read until the broker closes. True when
    everything was sent, False when the broker closed first, None when it had not closed
    within 5 s of the half-close."""
    sock = socket.create_connection(address, timeout=5)
    try:
        try:
            sock.sendall(data)
        except OSError:
            return False
        try:
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):
                pass
        except socket.timeout:
            return None
        except OSError:
            pass
        return True
    finally:
        sock.close()


def _worker(k: int, mqtt, ws, counts: Counts, deadline: float) -> None:
    fz = Fuzzer(f"{SEED}-{k}")
    while time.monotonic() < deadline:
        with counts.lock:
            if counts.inputs >= INPUTS:
                return
        inputs = fz.stream()
        data = b"".join(inputs)
        over_ws = fz.rng.random() < WEBSOCKET_SHARE
        sent = _send(ws if over_ws else mqtt, fz.websocket(data) if over_ws else data)
        with counts.lock:
            counts.connections += 1
            counts.websocket += over_ws
            counts.unanswered += sent is None
            if sent is not False:       # (what a broker that closed first did not take: uncounted)
                counts.inputs += len(inputs)


def _descriptors(proc: psutil.Process, log_dir: str) -> int:
    """The broker's descriptors but the commit log's files (which grow with the log)."""
    return proc.num_fds() - sum(f.path.startswith(log_dir) for f in proc.open_files())


def _settled(proc: psutil.Process, log_dir: str, fds: int, timeout: float) -> int:
    """The broker's descriptors (but the log's) once back within the slack, or at the
    timeout (closing connections may take a loop pass or two)."""
    deadline = time.monotonic() + timeout
    while True:
        now = _descriptors(proc, log_dir)
        if now <= fds + FDS_SLACK or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def _serves(b, uid: str) -> None:
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#", qos=1)
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/t", b"still serving", qos=1)
    assert sub.recv_publish().payload == b"still serving"
    sub.disconnect()
    pub.disconnect()


# The run's own deadline, and the time the checks and a restart may take after it.
RUN_SECONDS = 60 + INPUTS / 2000


@pytest.mark.timeout(RUN_SECONDS + 120)
def test_fuzzed_inputs_leave_the_broker_serving(broker, uid):
    # The connection rate limit is off: it is tested on its own, and would only slow this.
    b = broker(listener=[{"host": "127.0.0.1", "port": 0},
                         {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}],
               limits={"max_connection_rate": 0})
    mqtt, ws = b.listeners
    proc = psutil.Process(b.proc.pid)
    log_dir = os.path.join(b.config["data_dir"], "log")
    _serves(b, f"{uid}-before")
    fds, rss = _descriptors(proc, log_dir), proc.memory_info().rss

    counts = Counts()
    started = time.monotonic()
    deadline = started + RUN_SECONDS               # a bound, not a speed goal
    threads = [threading.Thread(target=_worker, args=(k, mqtt, ws, counts, deadline))
               for k in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline - time.monotonic() + 30)
    seconds = time.monotonic() - started
    print(f"fuzz: {counts.inputs} inputs over {counts.connections} connections "
          f"({counts.websocket} WebSocket) in {seconds:.1f} s, seed {SEED}; "
          f"{counts.unanswered} not closed by the broker within 5 s of the client's FIN")
    assert counts.inputs >= INPUTS, f"only {counts.inputs} inputs sent by the deadline"
    assert b.alive(), b.log_text()[-3000:]
    assert counts.unanswered == 0

    _serves(b, uid)
    now_fds = _settled(proc, log_dir, fds, timeout=15)
    assert now_fds <= fds + FDS_SLACK, \
        f"descriptors (but the log's files) {fds} before, {now_fds} after"
    now_rss = proc.memory_info().rss
    counters = b.stats()["counters"]
    print(f"the broker took {counters['packets_received']} packets, closed "
          f"{counters['protocol_errors']} connections for protocol errors")
    # Most inputs reach the packet handlers, not only the socket: the valid ones before
    # each connection's first mutated one.
    assert counters["packets_received"] >= INPUTS // 2
    text = b.log_text()
    assert "Traceback" not in text and "internal error" not in text, \
        text[text.find("Traceback") - 2000:][:6000]
    assert b.stop() == 0
    verify = run_cli("inspect", "verify", "--data-dir", b.config["data_dir"], timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # Memory: against a broker restarted on the same saved state (retained messages,
    # sessions), which holds what the fuzzed one legitimately does.
    again = broker(data_dir=b.config["data_dir"])
    _serves(again, f"{uid}-again")
    restarted = psutil.Process(again.proc.pid).memory_info().rss
    print(f"descriptors {fds} -> {now_fds} (but the log's files); RSS {rss >> 20} MiB before, "
          f"{now_rss >> 20} MiB after, {restarted >> 20} MiB restarted on the same state")
    assert now_rss <= restarted + RSS_SLACK, \
        f"RSS {now_rss >> 20} MiB after the fuzz, {restarted >> 20} MiB after a restart"
