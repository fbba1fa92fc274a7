"""The loop's CPU contention (server/contention.py): from the core thread's scheduler figures
it tells when the thread waits for a CPU, and while it does the loop neither busy-polls for
acknowledgements nor sends a catching-up session's pieces early. Unit tests over a file in
the kernel's format, the two gates, and a real broker whose core thread shares one CPU with
a busy process."""

import os
import selectors
import socket
import subprocess
import sys
import time

import pytest

import mqttraw as m
from conftest import run_cli
from edgebroker.server import contention as C
from edgebroker.server.contention import CpuContention
from edgebroker.server.loop import BusyPoll
from edgebroker.server.transport import Transport
from server.test_busy_poll import FakeTime
from server.test_pause_reasons import FakeLoop

MS = 1_000_000  # nanoseconds


class Schedstat:
    """A file in /proc/<pid>/task/<tid>/schedstat's format: run and wait nanoseconds, and
    timeslices; ``add`` moves them on."""

    def __init__(self, path):
        self.path = path
        self.run = self.wait = 0
        self.write()

    def write(self):
        self.path.write_text(f"{self.run} {self.wait} 7\n")

    def add(self, run_ms: float, wait_ms: float):
        self.run += int(run_ms * MS)
        self.wait += int(wait_ms * MS)
        self.write()


@pytest.fixture
def figures(tmp_path):
    return Schedstat(tmp_path / "schedstat")


def periods(c: CpuContention, stat: Schedstat, start: float, *shares):
    """One CHECK_SECONDS period per (run ms, wait ms), checked at its end: what check said."""
    now = start
    said = []
    for run_ms, wait_ms in shares:
        stat.add(run_ms, wait_ms)
        now += C.CHECK_SECONDS
        said.append(c.check(now))
        assert c.next_check == pytest.approx(now + C.CHECK_SECONDS)
    return said


def test_it_enters_at_a_tenth_of_waiting_and_leaves_below_a_twentieth(figures, caplog):
    c = CpuContention(str(figures.path))
    assert c.check(100.0) is False and not c.contended      # the first look: figures only
    # 5 % of the time wanted spent waiting: not contended.
    assert periods(c, figures, 100.0, (95, 5)) == [False] and not c.contended
    assert c.wait_share == pytest.approx(0.05)
    with caplog.at_level("INFO", logger="edgebroker.loop"):
        # 20 %: contended (said once, logged once).
        assert periods(c, figures, 100.2, (80, 20)) == [True] and c.contended
    assert c.episodes == 1
    assert [r.getMessage() for r in caplog.records] == [
        "the core thread waited for a CPU 20% of the time it wanted one: busy polling and "
        "early sends to sessions catching up are off until that is below 5% (episode 1)"]
    # Between the two marks it stays; below 5 % it leaves.
    assert periods(c, figures, 100.4, (92, 8), (99, 1)) == [False, True]
    assert not c.contended and c.episodes == 1
    assert c.seconds == pytest.approx(2 * C.CHECK_SECONDS)
    # A second episode, ended by a period in which the loop hardly wanted a CPU (under
    # MIN_DEMAND of it: an idle loop is kept from nothing), which is not counted as contended.
    idle = C.MIN_DEMAND * C.CHECK_SECONDS * 1000 / 4
    assert periods(c, figures, 100.8, (50, 50), (idle, idle)) == [True, True]
    assert not c.contended and c.episodes == 2
    assert c.seconds == pytest.approx(2 * C.CHECK_SECONDS)
    assert periods(c, figures, 101.2, (idle, idle)) == [False]


def test_without_the_kernel_figures_it_never_says_contended(tmp_path):
    missing = CpuContention(str(tmp_path / "none"))
    garbage = tmp_path / "garbage"
    garbage.write_text("not figures\n")
    for c in (missing, CpuContention(str(garbage)), CpuContention(path="")):
        assert c.check(1.0) is False and c.check(2.0) is False
        assert not c.contended and c.path == "" and c.fd == -1


def test_figures_that_go_away_end_contention(figures):
    c = CpuContention(str(figures.path))
    c.check(1.0)
    periods(c, figures, 1.0, (50, 50))
    assert c.contended
    figures.path.unlink()
    c.close()                     # (the open file would still be read)
    assert c.check(1.4) is False and not c.contended and c.path == ""


def test_the_real_file_is_this_threads_and_grows():
    c = CpuContention()
    run, wait = c._read()
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:
        pass
    # (the kernel brings the figure up to date at its ticks: up to 10 ms behind)
    assert c._read()[0] - run >= 25 * MS
    c.close()


def test_no_busy_poll_while_contended(figures):
    c = CpuContention(str(figures.path))
    c.check(1.0)
    periods(c, figures, 1.0, (50, 50))
    t = FakeTime(ready_on={1})
    bp = BusyPoll(200, c)
    assert t.poll(bp) == 0 and t.calls == 0 and (bp.hits, bp.missed) == (0, 0)
    periods(c, figures, 1.2, (100, 0))
    assert t.poll(bp) == 1 and bp.hits == 1


def test_send_now_waits_for_the_pass_while_contended_offer_does_not(figures):
    """A piece sent early (send_now) goes with the pass's flush while the loop waits for a
    CPU; offer's own early send (a connection over max_pending) goes all the same."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.settimeout(2)
    loop = FakeLoop()
    loop.contention = c = CpuContention(str(figures.path))
    loop.broker = type("B", (), {"before_send": lambda self: None,
                                 "stats": type("S", (), {"bytes_sent": 0})()})()
    t = Transport(loop, a, "peer", max_pending=4)
    loop.selector.register(a, selectors.EVENT_READ, t)
    try:
        c.check(1.0)
        periods(c, figures, 1.0, (50, 50))
        t.write(b"piece")
        t.send_now()
        assert t.out_bytes == 5 and loop.dirty == [t]
        t.offer(b"more")            # over max_pending: it sends what is queued first
        assert t.out_bytes == 4 and b.recv(100) == b"piece"
        periods(c, figures, 1.2, (100, 0))
        t.send_now()
        assert t.out_bytes == 0 and b.recv(100) == b"more"
    finally:
        a.close()
        b.close()


def test_a_core_thread_sharing_its_cpu_is_contended_until_it_has_it_again(broker, uid):
    """The broker's core thread and a busy process on one CPU, while a publisher keeps the
    broker busy: the stats, `inspect stats` and the log say so; once the busy process ends,
    the loop is not contended any more and the episode's time is counted."""
    b = broker()
    cpus = os.sched_getaffinity(b.proc.pid)
    cpu = min(cpus)
    os.sched_setaffinity(b.proc.pid, {cpu})     # the main thread: the loop's
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        pub = b.raw()
        pub.connect(f"{uid}-p")
        frames = b"".join(m.publish(f"{uid}/t", b"x" * 200) for _ in range(500))

        def busy_until(pred, what):
            deadline = time.monotonic() + 30
            while True:
                for _ in range(10):
                    pub.send(frames)
                assert pub.ping(timeout=20) == []
                loop = b.stats()["loop"]
                if pred(loop):
                    return loop
                assert time.monotonic() < deadline, f"not {what} within 30 s: {loop}"

        loop = busy_until(lambda s: s["cpu_contended"], "contended")
        assert loop["cpu_contention_episodes"] >= 1
        assert b.wait_log(lambda ln: "the core thread waited for a CPU" in ln)
        r = run_cli("inspect", "stats", "--data-dir", b.config["data_dir"])
        assert "CPU-CONTENDED now (no busy polls, no early sends)" in r.stdout, r.stdout
    finally:
        hog.kill()
        hog.wait(10)
        os.sched_setaffinity(b.proc.pid, cpus)
    loop = busy_until(lambda s: not s["cpu_contended"], "back to not contended")
    assert loop["cpu_contended_seconds"] > 0
    assert b.alive()
