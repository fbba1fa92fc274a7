"""A broker whose wall clock the test steps (as NTP does on a gateway without a real-time
clock): ``shifted(path)`` is a ``wrap`` for the broker fixture that runs it with time.time and
time.time_ns shifted by the milliseconds in the file at ``path`` (read again at most every
50 ms; the test writes it). The monotonic clock is left alone."""

from __future__ import annotations

import sys

SHIFTED = """
import runpy, sys, time
path = sys.argv.pop(1)
real_ns, seen = time.time_ns, [0, -1.0]
def shift_ms():
    now = time.monotonic()
    if now - seen[1] > 0.05:
        try:
            with open(path) as fh:
                seen[0] = int(fh.read() or 0)
        except (OSError, ValueError):
            pass
        seen[1] = now
    return seen[0]
time.time_ns = lambda: real_ns() + shift_ms() * 1_000_000
time.time = lambda: time.time_ns() / 1e9
sys.argv[0] = "edgebroker"
runpy.run_module("edgebroker", run_name="__main__", alter_sys=True)
"""


def shifted(path):
    """The broker fixture's ``wrap``: the broker's wall clock shifted by the file's ms."""
    return lambda cmd: [sys.executable, "-c", SHIFTED, str(path), *cmd[cmd.index("serve"):]]
