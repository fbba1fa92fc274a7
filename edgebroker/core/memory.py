"""This process's memory and CPU time (``ProcessUsage``), and resident memory against
``memory_limit`` (``MemoryGuard``): what the broker refuses new connections, topics and
subscriptions by while it is over (docs/limits.md). ``memory_limit = "auto"`` (the default)
is half of the memory this process may use (``memory_available``): the machine's, or its
control group's limit when that is lower (a systemd ``MemoryMax=``, a container's limit)."""

from __future__ import annotations

import gc
import os
import sys

from edgebroker import _native


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
    ``limit``: the limit in bytes (0: off); ``source``: for "auto", what it is half of.

    Python keeps most of the memory it frees for reuse instead of returning it to the system,
    so after a peak RSS can stay above the limit with nothing left in it. What the broker holds
    is measured by Python's allocated blocks (``sys.getallocatedblocks``: objects of up to
    512 bytes, which is what connections, sessions, subscriptions and topics are made of; it
    falls when they are freed even if RSS does not): ``blocks``, at each check. Over the
    limit, ``peak`` and ``blocks_peak`` are the highest RSS and blocks, and ``blocks_base``
    the blocks the broker held when the peak began (at the check before it). Once RSS has
    stopped rising (a full garbage collection runs then, freed heap memory goes back to the
    system, and both again every ``COLLECT_EVERY`` checks while it stays over) and the
    blocks have fallen back half-way to the peak's start (``is_released``), the RSS then is
    ``kept``: the broker admits again (``over`` false, ``released`` counted) while RSS stays
    within ``margin()`` of it (and within ``ceiling()`` when below it) and the blocks below
    ``blocks_peak``. Memory reused inside the process admits; RSS growing past it, or holding
    as much as at the peak, is refused again (docs/limits.md, "Memory")."""

    COLLECT_EVERY = 300     # checks (seconds)

    __slots__ = ("limit", "source", "rss", "cpu_seconds", "over", "usage", "blocks",
                 "blocks_base", "blocks_peak", "peak", "kept", "released", "collect_in",
                 "allocated", "release_freed")

    def __init__(self, setting: int | str):
        self.limit = 0
        self.source = ""
        self.rss = 0
        self.cpu_seconds = 0.0
        self.over = False
        self.usage = ProcessUsage()  # this process; the broker's one (SysTopics reads it too)
        self.allocated = sys.getallocatedblocks
        self.release_freed = _native.release_freed_memory   # malloc_trim(0); none: ENOSYS
        self.blocks = self.blocks_base = self.blocks_peak = 0
        self.peak = 0       # highest RSS while over
        self.kept = 0       # RSS kept after a peak, admitted again above the limit (0: none)
        self.released = 0   # times admitted again over kept memory
        self.collect_in = 0  # checks over the limit until the next garbage collection
        self.configure(setting)

    def configure(self, setting: int | str) -> bool:
        """The limit from the ``memory_limit`` setting: bytes, or "auto" (half of
        ``memory_available``; off when that cannot be read). True when it changed. (The
        state of a peak is kept: the next check weighs it against the new limit.)"""
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

    def margin(self) -> int:
        """How far RSS may grow past ``kept`` before it is over again: a tenth of the limit."""
        return self.limit // 10

    def ceiling(self) -> int:
        """Twice the limit: the most RSS admitted over memory kept below it after a peak."""
        return 2 * self.limit

    def is_released(self, blocks: int) -> bool:
        """Whether ``blocks`` is well below the peak's: back at least half-way from
        ``blocks_peak`` to ``blocks_base`` (what the broker held before the peak), and at
        least a thirty-second of the peak's below it (so that a peak the blocks took no part
        in, a limit lowered below the broker's holdings, is not released by their noise)."""
        base, peak = self.blocks_base, self.blocks_peak
        return blocks <= base + (peak - base) // 2 and blocks <= peak - peak // 32

    def give_back(self, rss: int) -> int:
        """Let malloc return the free memory of its heap to the system (``malloc_trim``;
        nothing without glibc); RSS after it (``rss`` when it cannot be read)."""
        self.release_freed()
        figures = self.usage.read()
        if figures is not None:
            rss = self.rss = figures[0]
        return rss

    def check(self) -> bool | None:
        """Measure; returns the new ``over`` state when it changed, else None. (A change to
        false with ``kept`` set: admitted again though RSS is above the limit.)"""
        figures = self.usage.read()
        if figures is None:
            return None
        self.rss, self.cpu_seconds = figures
        rss, limit = self.rss, self.limit
        before = self.blocks
        blocks = self.blocks = self.allocated()
        before = min(before or blocks, blocks)  # what was held before a peak beginning now
        if not limit or rss <= limit:
            over = False
            self.kept = self.blocks_peak = self.peak = 0
        elif not self.over and self.kept:   # admitting over kept memory
            room = self.kept + self.margin()
            if self.kept < self.ceiling():
                room = min(room, self.ceiling())
            over = rss > room or blocks >= self.blocks_peak
            if over:    # a new peak: measured from here (the last one's blocks say nothing
                # of memory held in larger objects, retained payloads say)
                self.kept, self.peak, self.collect_in = 0, rss, 0
                self.blocks_peak, self.blocks_base = blocks, before
        elif not self.over:                 # over the limit from below it: a new peak
            over = True
            self.peak, self.blocks_peak, self.blocks_base, self.collect_in = rss, blocks, before, 0
        elif rss > self.peak:               # rising
            over = True
            self.peak = rss
            self.blocks_peak = max(self.blocks_peak, blocks)
        else:
            self.blocks_peak = max(self.blocks_peak, blocks)
            if not self.is_released(blocks):
                # Objects in reference cycles (a closed client's) are freed only by a full
                # collection, which an idle broker may not run for a long time: one when RSS
                # stops rising, then one every COLLECT_EVERY checks (it stalls the loop for
                # as long as it walks every object: 0.3 s at 3 million).
                self.collect_in -= 1
                if self.collect_in <= 0:
                    self.collect_in = self.COLLECT_EVERY
                    gc.collect()
                    blocks = self.blocks = self.allocated()
                    rss = self.give_back(rss)
            over = not self.is_released(blocks)
            if not over:        # stopped rising, and holding well below the peak: released
                rss = self.give_back(rss)
                if rss > limit:
                    self.kept = rss
                    self.released += 1
                else:           # what went back to the system took it below the limit
                    self.kept = self.blocks_peak = self.peak = 0
        if over != self.over:
            self.over = over
            return over
        return None
