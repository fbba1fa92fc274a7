"""`edgebroker sub` acknowledges a QoS 1/2 message only once it has printed it (or skipped it
with -T / -R): with a kept session (-c), `-C 1` run after run takes the queued messages one at
a time, none lost (they came in one read and were acknowledged unprinted before), none twice
(a close with unread bytes sent a reset, and the broker dropped the acknowledgement)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, broker_command

JOBS = [f"job{i}" for i in range(1, 6)]


def eb(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*broker_command(), *args], cwd=REPO, input=stdin,
                          capture_output=True, timeout=30)


def queue_offline(remote, uid, qos, topic, lines):
    """Make the kept session of ``uid``-c on ``{uid}/#``, then publish ``lines`` to ``topic``."""
    r = eb("sub", "-h", remote.host, "-p", str(remote.port), "-c", "-i", f"{uid}-c",
           "-q", str(qos), "-t", f"{uid}/#", "-E")
    assert r.returncode == 0, r.stderr
    r = eb("pub", "-h", remote.host, "-p", str(remote.port), "-t", topic, "-q", str(qos), "-l",
           stdin="".join(f"{ln}\n" for ln in lines).encode())
    assert r.returncode == 0, r.stderr


def consume(remote, uid, qos, *extra, wait="5"):
    return eb("sub", "-h", remote.host, "-p", str(remote.port), "-c", "-i", f"{uid}-c",
              "-q", str(qos), "-t", f"{uid}/#", "-W", wait, *extra)


@pytest.mark.parametrize("qos", [1, 2])
def test_count_one_takes_the_queue_one_at_a_time(remote, uid, qos):
    queue_offline(remote, uid, qos, f"{uid}/jobs", JOBS)
    printed = []
    for _ in range(len(JOBS) + 2):            # a repeat or two would show, then stop
        r = consume(remote, uid, qos, "-C", "1")
        assert r.returncode == 0, (printed, r.stderr)     # 27: timed out, the queue was lost
        printed += r.stdout.decode().split()
        if printed[-1] == JOBS[-1]:
            break
    assert printed == JOBS
    r = consume(remote, uid, qos, wait="1")   # nothing left
    assert (r.returncode, r.stdout) == (27, b"")


def test_skipped_with_filter_out_are_acknowledged(remote, uid):
    queue_offline(remote, uid, 1, f"{uid}/skip", ["s1"])
    r = eb("pub", "-h", remote.host, "-p", str(remote.port), "-t", f"{uid}/keep", "-q", "1",
           "-l", stdin=b"k1\nk2\n")
    assert r.returncode == 0, r.stderr
    r = consume(remote, uid, 1, "-C", "1", "-T", f"{uid}/skip")
    assert (r.returncode, r.stdout) == (0, b"k1\n"), r.stderr
    r = consume(remote, uid, 1, wait="2")     # s1 skipped on purpose is gone; k2 is not
    assert (r.returncode, r.stdout) == (27, b"k2\n"), r.stderr
