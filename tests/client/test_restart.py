"""No QoS 1/2 message lost across a process restart: a publishing process shut down
mid-batch hands its state file to the next one; one SIGKILLed mid-batch leaves its spool to
the next one. A subscriber (this process) gets every message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import Proc
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import make_subscribe
from edgebroker.client.statefile import read_state

from client.test_loop import messages

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")


def publisher(*args) -> list[str]:
    return [sys.executable, str(HERE / "publisher_proc.py"), *map(str, args)]


def run_publisher(*args, timeout: float = 60.0) -> str:
    done = subprocess.run(publisher(*args), capture_output=True, text=True, timeout=timeout,
                          env=ENV, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout


def subscriber(remote, uid: str, qos: int) -> EventLoop:
    sub = EventLoop(remote.host, remote.port, client_id=f"{uid}s")
    assert sub.run([make_subscribe([("restart/t", qos)])], timeout=10).complete
    return sub


def test_state_file_carries_qos2_across_a_restart_exactly_once(remote, uid, tmp_path):
    n = 400
    sub = subscriber(remote, uid, 2)
    state = tmp_path / "publisher.json"
    out = run_publisher("state", remote.host, remote.port, state, 0, n, 2, 100)
    next_message = int(out.split()[-1])
    doc = read_state(state)
    unfinished = len(doc["inflight"]) + len(doc["queued"])
    assert unfinished > 0 and next_message < n, "the shutdown was not mid-batch"
    assert any(r.get("stage") == "pubrel" for r in doc["inflight"]) or doc["queued"]
    assert run_publisher("state", remote.host, remote.port, state, next_message, n, 2,
                         0).split() == ["done"]
    got = [m.payload for m in messages(sub, n, 30)]
    assert sorted(got) == sorted(b"m%d" % i for i in range(n))      # each once: QoS 2
    assert read_state(state)["inflight"] == [] and read_state(state)["queued"] == []
    sub.close()


def test_spool_after_sigkill_nothing_lost(remote, uid, tmp_path):
    n = 1000
    sub = subscriber(remote, uid, 1)
    spool = tmp_path / "spool"
    first = Proc(publisher("spool", remote.host, remote.port, spool, n, 1, 1000))
    first.wait_line(lambda line: line == "acked 100", 30)
    first.kill()                                              # SIGKILL, mid-batch
    assert first.p.returncode == -9
    assert os.path.getsize(spool) > 0
    out = run_publisher("spool", remote.host, remote.port, spool, 0, 1, 0)
    assert out.split()[-1] == "done"
    resent = sum(1 for line in out.splitlines() if line.startswith("acked"))
    assert 0 < resent <= n - 100
    got = set()
    while len(got) < n:
        got.update(m.payload for m in messages(sub, 1, 30))
    assert got == {b"m%d" % i for i in range(n)}
    sub.close()
