"""Room kept on the disk for the final session snapshot of a stop.

A full disk makes every snapshot fail, the one written at the stop too, and a persistent
session made during the full spell (a SUBACK sent, a QoS 1 message acknowledged for it) would
not survive the restart. So next to the snapshot a file, ``sessions.json.reserve``, holds
blocks allocated ahead (``commitlog.segment.preallocate``, as the log makes its next segment's
file ahead: ``commitlog.spare``): twice the size of the last snapshot written (its retained
messages' side file included, core.retained_side), at least ``MIN_BYTES``. The snapshot writer (core.snapshot) grows it after a write, and a final snapshot
that finds no room cuts the room it needs from the reserve's end (the rest stays, so that the
commit log closing after it does not take it) and is written there. The next start makes it
whole again.
"""

from __future__ import annotations

import errno
import logging
import os

from edgebroker.commitlog.segment import preallocate
from edgebroker.files import open_regular, write_zeros

log = logging.getLogger("edgebroker.snapshot")

FILENAME = "sessions.json.reserve"
MIN_BYTES = 64 << 10
# Given back beyond the snapshot's own bytes (rounded up to 4 KiB): a directory block, should
# its temporary file's entry need one.
SLACK_BYTES = 4 << 10
# The errors of a disk without room, which the reserve is there for.
NO_ROOM = frozenset((errno.ENOSPC, errno.EDQUOT))


class SnapshotReserve:
    """The reserve file of one state directory (the snapshot writer's thread only)."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, FILENAME)
        self.size = 0           # bytes allocated (0: none, or not known yet)
        self._warned = False    # a failure to keep it logged (until it works again)

    def keep(self, snapshot_bytes: int) -> None:
        """Make sure the reserve holds room for a snapshot of about ``snapshot_bytes`` (with as
        much again for its growth); grown, never shrunk. Its size is its allocated room, so that
        ``release`` can give back only what is needed. A failure is logged once, and tried again
        after the next snapshot."""
        want = max(MIN_BYTES, 2 * snapshot_bytes)
        want = -(-want // MIN_BYTES) * MIN_BYTES
        if want <= self.size:
            return
        try:
            fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT)   # a FIFO: an error
        except OSError as exc:
            self._failed(exc.strerror or os.strerror(exc.errno or errno.EIO), want)
            return
        try:
            want = max(want, os.fstat(fd).st_size)      # one a former run made
            err = preallocate(fd, want)
            if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                err = write_zeros(fd, want)    # a file system that cannot allocate ahead
            elif not err:
                os.ftruncate(fd, want)          # (over blocks allocated: takes no more)
        except OSError as exc:
            err = exc.errno or errno.EIO
        finally:
            os.close(fd)
        if err:
            self._failed(os.strerror(err), want)
            return
        self.size = want
        if self._warned:
            self._warned = False
            log.info("room for the final session snapshot kept again: %s (%d bytes)",
                     self.path, want)

    def release(self, nbytes: int | None = None) -> bool:
        """Give back the room of ``nbytes`` (and a little for the file's metadata) from the
        reserve's end, all of it for None (the file deleted), for the final snapshot; only that
        room, so that nothing else takes the rest meanwhile. False when there is none left."""
        try:
            size = os.stat(self.path).st_size
            keep = 0 if nbytes is None else size - _rounded(nbytes + SLACK_BYTES)
            if keep > 0:
                os.truncate(self.path, keep)
            else:
                os.unlink(self.path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("cannot shrink %s to make room for the final session snapshot: %s",
                      self.path, exc.strerror or exc)
            return False
        self.size = max(0, keep)
        return size > 0

    def _failed(self, why: str, want: int) -> None:
        if not self._warned:
            self._warned = True
            log.warning("cannot keep %d bytes for the final session snapshot in %s: %s; a stop "
                        "while the disk is full may not be able to write it (will retry)",
                        want, self.path, why)


def _rounded(nbytes: int, block: int = 4096) -> int:
    return -(-nbytes // block) * block
