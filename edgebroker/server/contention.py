"""Whether the core thread has to wait for a CPU (``CpuContention``), from the kernel's
scheduler figures for that thread (``/proc/thread-self/schedstat``: time run and time spent
runnable but waiting for a CPU, in nanoseconds).

Two ways the loop serves a session catching up from the log assume that the subscriber has a
CPU of its own while the broker works: the busy poll for acknowledgements (``BusyPoll``) and
the window sent in pieces, the first ones at once (``Transport.send_now``). When every CPU is
taken (other programs on the gateway, a one-core board), the poll spins on a CPU the
subscriber needs and each early piece wakes a subscriber that then takes the broker's CPU
from it: a backlog drains at half the rate it does without them. So while the loop waits for
a CPU for ``ENTER`` or more of the time it wants one, it does neither; once that is below
``LEAVE`` again it goes back to them (docs/persistence.md, "Busy CPUs").
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("edgebroker.loop")

SCHEDSTAT = "/proc/thread-self/schedstat"
CHECK_SECONDS = 0.2   # how often the loop looks
ENTER = 0.10          # waited this share of the time it wanted a CPU (run + wait): contended
LEAVE = 0.05          # ... below this share again: not contended
MIN_DEMAND = 0.01     # the loop wanted a CPU at least this share of the period for it to count


class CpuContention:
    """``contended``: the loop waited for a CPU for ``ENTER`` of its time or more in the last
    period (and not below ``LEAVE`` since). Checked at most every ``CHECK_SECONDS`` by
    ``check``, on the loop's own thread (the file names the thread that opens it). A period
    in which the loop hardly wanted a CPU ends contention. Without the file (a kernel without
    scheduler statistics) it never says contended."""

    __slots__ = ("path", "fd", "contended", "episodes", "wait_share", "next_check", "_last",
                 "seconds")

    def __init__(self, path: str = SCHEDSTAT):
        self.path = path
        self.fd = -1              # opened by the first check (on the loop's thread)
        self.contended = False
        self.episodes = 0         # times it became contended
        self.seconds = 0.0        # time spent contended (whole periods, up to the last check)
        self.wait_share = 0.0     # the last period's share of waiting
        self.next_check = 0.0
        self._last: tuple[float, int, int] | None = None   # (clock, run ns, wait ns)

    def check(self, now: float) -> bool:
        """Read the thread's figures (the loop calls this when ``now`` reaches
        ``next_check``): True when ``contended`` changed."""
        self.next_check = now + CHECK_SECONDS
        figures = self._read()
        if figures is None:
            return False
        run, wait = figures
        last, self._last = self._last, (now, run, wait)
        if last is None or now <= last[0]:
            return False
        period = now - last[0]
        ran, waited = run - last[1], wait - last[2]
        wanted = ran + waited
        if wanted < MIN_DEMAND * period * 1e9:
            # Too idle a period to tell: an idle loop is not kept from anything.
            return self._leave("the core thread is idle")
        if self.contended:
            self.seconds += period
        self.wait_share = share = waited / wanted
        if not self.contended and share >= ENTER:
            self.contended = True
            self.episodes += 1
            log.info("the core thread waited for a CPU %.0f%% of the time it wanted one: busy "
                     "polling and early sends to sessions catching up are off until that is "
                     "below %.0f%% (episode %d)", share * 100, LEAVE * 100, self.episodes)
            return True
        if share < LEAVE:
            return self._leave(f"the core thread waits for a CPU {share:.0%} of the time")
        return False

    def _leave(self, why: str) -> bool:
        """No longer contended (True when it was)."""
        if not self.contended:
            return False
        self.contended = False
        log.debug("%s: busy polling and early sends are back on", why)
        return True

    def _read(self) -> tuple[int, int] | None:
        if not self.path:
            return None
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            fields = os.pread(self.fd, 128, 0).split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            self.close()
            self.path = ""        # not again
            self.contended = False
            return None

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
