"""This process's memory and CPU time (``ProcessUsage``), and resident memory against
``memory_limit`` (``MemoryGuard``): what the broker refuses new connections, topics and
subscriptions by while it is over (docs/limits.md). ``memory_limit = "auto"`` (the default)
is half of the memory this process may use (``memory_available``): the machine's, or its
control group's limit when that is lower (a systemd ``MemoryMax=``, a container's limit)."""

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


def memory_available(cgroups: str = "/proc/self/cgroup",
                     cgroup_root: str = "/sys/fs/cgroup") -> tuple[int, str] | None:
    """The memory this process may use, in bytes, and where that figure comes from: the
    machine's (``sysconf``), or the lowest memory limit of its control group and the groups
    above it when that is lower (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``; the
    groups from ``cgroups``, their files under ``cgroup_root``). None when not even the
    machine's can be read."""
    try:
        found = (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the machine's memory")
    except (ValueError, OSError):
        return None
    try:
        with open(cgroups, "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            base, name = cgroup_root, "memory.max"                    # v2
        elif "memory" in parts[1].split(","):
            base, name = f"{cgroup_root}/memory", "memory.limit_in_bytes"   # v1
        else:
            continue
        path = parts[2].strip("/")
        while True:
            where = f"{base}/{path}/{name}" if path else f"{base}/{name}"
            limit = _read_limit(where)
            if limit is not None and limit < found[0]:
                found = (limit, where)
            if not path:
                break
            path = path.rpartition("/")[0]
    return found


def _read_limit(path: str) -> int | None:
    """A control group's memory limit from ``path``; None when it has none ("max", or v1's
    page-rounded 2^63) or the file cannot be read."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(64).strip()
    except OSError:
        return None
    if not text.isdigit():
        return None     # "max": no limit
    value = int(text)
    return value if 0 < value < 1 << 62 else None


class MemoryGuard:
    """Resident memory of this process against ``memory_limit`` (checked on a timer).
    ``limit``: the limit in bytes (0: off); ``source``: for "auto", what it is half of."""

    __slots__ = ("limit", "source", "rss", "cpu_seconds", "over", "usage")

    def __init__(self, setting: int | str):
        self.limit = 0
        self.source = ""
        self.configure(setting)
        self.rss = 0
        self.cpu_seconds = 0.0
        self.over = False
        self.usage = ProcessUsage()  # this process; the broker's one (SysTopics reads it too)

    def configure(self, setting: int | str) -> bool:
        """The limit from the ``memory_limit`` setting: bytes, or "auto" (half of
        ``memory_available``; off when that cannot be read). True when it changed."""
        old = self.limit, self.source
        if setting == "auto":
            available = memory_available()
            if available is None:
                self.limit, self.source = 0, "auto: the memory available cannot be read"
            else:
                self.limit = available[0] // 2
                self.source = f"auto: half of {available[0]} bytes ({available[1]})"
        else:
            self.limit, self.source = setting, ""
        return (self.limit, self.source) != old

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
