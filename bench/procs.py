"""Process bookkeeping for bench/run.py: the children (load generators) and brokers of a run,
always reaped (join, then terminate, then kill, by PID), and the queue they report through."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time

CTX = multiprocessing.get_context("fork")

_children: list = []       # multiprocessing.Process objects still to reap
_brokers: list = []        # Broker objects still to stop


class RunError(Exception):
    pass


def spawn(target, *args) -> multiprocessing.Process:
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    _children.append(p)
    return p


def reap(procs=None, timeout: float = 3.0) -> None:
    """Join the given children (default: all), terminating then killing stragglers, by PID."""
    procs = list(_children if procs is None else procs)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
        if p in _children:
            _children.remove(p)


def start_broker(broker_cls, cfg: dict | None = None):
    """A fresh broker process, registered so that it is stopped on any exit."""
    broker = broker_cls(cfg)
    _brokers.append(broker)
    try:
        broker.start()
    except (RuntimeError, OSError) as exc:
        stop_broker(broker)
        raise RunError(f"{broker.name} did not start: {exc}\n{broker.log_tail()}") from None
    return broker


def stop_broker(broker) -> None:
    broker.stop()
    if broker in _brokers:
        _brokers.remove(broker)


def stop_brokers() -> None:
    while _brokers:
        _brokers.pop().stop()


def cpu_snapshot() -> tuple[float, float, float]:
    """(monotonic time, busy CPU seconds of the whole machine, CPU seconds of this process and
    of its children that were waited for). Every broker and generator process is a direct child
    that is reaped, so the difference between two snapshots, machine minus ours, is what other
    processes on the machine used meanwhile."""
    busy = 0.0
    try:
        with open("/proc/stat") as fh:
            f = fh.readline().split()
        # user nice system idle iowait irq softirq steal: all but idle and iowait
        busy = (sum(int(x) for x in f[1:4]) + sum(int(x) for x in f[6:9])) \
            / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return time.monotonic(), busy, t.user + t.system + t.children_user + t.children_system


def others_cpu_pct(before: tuple) -> float | None:
    """CPU other processes used since ``before`` (a cpu_snapshot), in % of one core."""
    after = cpu_snapshot()
    wall = after[0] - before[0]
    if wall <= 0 or not before[1]:
        return None
    return round(max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall * 100, 1)


class Inbox:
    """The children's messages, kept per (kind, role) until asked for (they arrive in any order).

    A message is ``(kind, role, idx)`` or ``(kind, role, idx, payload)``; ``("error", role,
    idx, text)`` fails the run."""

    def __init__(self):
        self.q = CTX.Queue()
        self.kept: dict[tuple[str, str], list] = {}

    def wait(self, want: dict, timeout: float, broker=None, kind: str = "ready") -> dict:
        """Wait until ``want[role]`` messages of ``kind`` arrived per role; returns role -> list."""
        deadline = time.monotonic() + timeout
        kept = self.kept
        while any(len(kept.get((kind, r), ())) < n for r, n in want.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = {r: n - len(kept.get((kind, r), ())) for r, n in want.items()}
                raise RunError(f"timed out waiting for {kind} from {missing}"
                               + (f"; broker log tail:\n{broker.log_tail()}" if broker else ""))
            try:
                msg = self.q.get(timeout=min(0.2, left))
            except queue.Empty:
                if broker is not None and not broker.alive():
                    raise RunError(f"{broker.name} exited (status {broker.proc.returncode}):\n"
                                   + broker.log_tail())
                continue
            if msg[0] == "error":
                raise RunError(f"{msg[1]} {msg[2]} failed:\n{msg[3]}")
            kept.setdefault((msg[0], msg[1]), []).append(msg[3] if len(msg) > 3 else msg[2])
        return {r: kept[(kind, r)][:n] for r, n in want.items()}
