"""Room kept on the state disk for the uploader's own files.

On a full state disk (the log filled it while the store was out of reach) the uploader still
has to write the intent file, the batch file and the uploaded mark to ship what frees the
disk: retention deletes a segment only once every batch cut from it is uploaded. So
``<state dir>/upload/reserve`` holds ``RESERVE_BYTES`` allocated ahead; a write of the uploader
that finds no room gives it back (the file deleted) and tries once more. It is made again once
there is room (after a batch was shipped), a failure to make it logged once per episode.
"""

from __future__ import annotations

import errno
import logging
import os

from edgebroker.commitlog.segment import preallocate
from edgebroker.files import open_regular, write_zeros

log = logging.getLogger("edgebroker.upload")

FILENAME = "reserve"
RESERVE_BYTES = 256 << 10
# The errors of a disk without room, which the reserve is there for.
NO_ROOM = frozenset((errno.ENOSPC, errno.EDQUOT))


class Reserve:
    """The reserve file of the upload directory (the uploader's thread only)."""

    def __init__(self, upload_dir: str):
        self.path = os.path.join(upload_dir, FILENAME)
        self.held = False
        self._warned = False

    def keep(self) -> None:
        """Make sure the reserve is there, whole (cheap when it is)."""
        if self.held:
            return
        err = 0
        why = None
        try:
            fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT)   # a FIFO: an error
        except OSError as exc:
            err = exc.errno or errno.EIO
            why = exc.strerror
        else:
            try:
                err = preallocate(fd, RESERVE_BYTES)
                if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                    err = write_zeros(fd, RESERVE_BYTES)
                elif not err:
                    os.ftruncate(fd, RESERVE_BYTES)
            except OSError as exc:
                err = exc.errno or errno.EIO
            finally:
                os.close(fd)
        if err:
            try:
                os.unlink(self.path)   # what it could take (a full disk needs it back)
            except OSError:
                pass
            if not self._warned:
                self._warned = True
                log.warning("cannot keep %d bytes for the uploader's files in %s: %s (tried "
                            "again after each batch)", RESERVE_BYTES, self.path,
                            why or os.strerror(err))
            return
        self.held = True
        if self._warned:
            self._warned = False
            log.info("room for the uploader's files kept again: %s", self.path)

    def release(self) -> bool:
        """Give the room back (the file deleted); False when there was none to give."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            self.held = False
            return False
        except OSError as exc:
            log.error("cannot delete %s to make room for the uploader: %s", self.path,
                      exc.strerror or exc)
            return False
        log.warning("the state disk is full: the uploader uses the room kept for it (%s)",
                    self.path)
        self.held = False
        return True


__all__ = ["Reserve", "RESERVE_BYTES", "NO_ROOM"]
