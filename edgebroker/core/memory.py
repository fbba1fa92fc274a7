"""This process's memory and CPU time (``ProcessUsage``), and resident memory against
``memory_limit`` (``MemoryGuard``): what the broker refuses new connections, topics and
subscriptions by while it is over (docs/limits.md)."""

from __future__ import annotations

import os


class ProcessUsage:
    """This process's resident memory and CPU time, ``read()`` -> (RSS bytes, user + system
    seconds), or None when they cannot be read (no descriptor free, say).

    On Linux from ``/proc/self/statm`` and ``/proc/self/stat``: the figures psutil gives,
    without importing psutil (about 1 MiB of the broker's idle memory, docs/deploy.md).
    Elsewhere through psutil, imported here."""

    def __init__(self):
        if os.path.exists("/proc/self/statm"):
            self._page = os.sysconf("SC_PAGE_SIZE")
            self._tick = os.sysconf("SC_CLK_TCK")
            self.read = self._read_proc
        else:
            import psutil
            self._psutil = psutil
            self._process = psutil.Process()
            self.read = self._read_psutil

    def _read_proc(self) -> tuple[int, float] | None:
        try:
            with open("/proc/self/statm", "rb") as fh:
                resident = int(fh.read().split()[1])
            with open("/proc/self/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            return None
        # After the command name (in parentheses, which it may contain): the fields from the
        # third (state) on; utime and stime, in clock ticks, are the 14th and 15th (proc(5)).
        fields = stat[stat.rindex(b")") + 2:].split()
        return resident * self._page, (int(fields[11]) + int(fields[12])) / self._tick

    def _read_psutil(self) -> tuple[int, float] | None:
        process = self._process
        try:
            with process.oneshot():
                rss = process.memory_info().rss
                times = process.cpu_times()
        except (self._psutil.Error, OSError):  # OSError: no descriptor free
            return None
        return rss, times.user + times.system


class MemoryGuard:
    """Resident memory of this process against ``memory_limit`` (checked on a timer)."""

    __slots__ = ("limit", "rss", "cpu_seconds", "over", "usage")

    def __init__(self, limit: int):
        self.limit = limit
        self.rss = 0
        self.cpu_seconds = 0.0
        self.over = False
        self.usage = ProcessUsage()  # this process; the broker's one (SysTopics reads it too)

    def check(self) -> bool | None:
        """Measure; returns the new ``over`` state when it changed, else None."""
        figures = self.usage.read()
        if figures is None:
            return None
        self.rss, self.cpu_seconds = figures
        over = bool(self.limit) and self.rss > self.limit
        if over != self.over:
            self.over = over
            return over
        return None
