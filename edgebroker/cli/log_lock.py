"""Whether a process holds a commit log's lock (the flock a broker takes on ``log/.lock`` for
as long as it runs), told from /proc/locks: nothing is locked or opened for writing, so a
read-only command may ask it while a broker starts."""

from __future__ import annotations

import os

PROC_LOCKS = "/proc/locks"
MAX_LINES = 100_000     # /proc/locks lines read at most (one a lock held on the machine)


def held(log_dir: str) -> bool | None:
    """True when a process holds the exclusive flock on ``log_dir``'s lock file, False when
    none does, None when it cannot be told (no lock file, no /proc/locks)."""
    from edgebroker.commitlog.recovery import LOCK_FILE   # the commit log: on use
    try:
        st = os.stat(os.path.join(log_dir, LOCK_FILE))
        fh = open(PROC_LOCKS, encoding="ascii", errors="replace")
    except OSError:
        return None
    # A line: "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2663060 0 EOF" (major:minor in hex).
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with fh:
        for _, line in zip(range(MAX_LINES), fh):
            # (a process waiting for a lock has "->" after the number: not a holder)
            fields = line.split()
            if fields[1:2] == ["FLOCK"] and fields[3:4] == ["WRITE"] and fields[5:6] == [wanted]:
                return True
    return False
