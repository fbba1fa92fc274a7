"""The commit log's errors: each names the file (and position or offset) it is about."""

from __future__ import annotations

import os

from edgebroker.errors import EdgebrokerError


class LogError(EdgebrokerError):
    """Base class of the commit log's errors."""


class LogFormatError(LogError):
    """A file in the log directory cannot be used as it is (unknown format version, wrong name,
    a segment whose header disagrees with its name). Never raised for damaged records: those are
    reported and skipped."""


class LogLockedError(LogError):
    """Another process has the log directory open for writing."""


class LogWriteError(LogError):
    """Writing or syncing the log failed (disk full, I/O error). Nothing acknowledged is lost:
    the records that were being written stay pending and the file is left as it was, so the
    same call can be retried once the cause is gone. ``errno`` and ``path`` say what failed."""

    def __init__(self, message: str, *, errno: int = 0, path: str = ""):
        super().__init__(message)
        self.errno = errno
        self.path = path

    @classmethod
    def from_os(cls, what: str, path: str, exc: OSError) -> "LogWriteError":
        reason = exc.strerror or os.strerror(exc.errno or 0) or str(exc)
        return cls(f"{what} {path}: {reason}", errno=exc.errno or 0, path=path)


class LogFullError(LogError):
    """``append`` refused a record: writes are failing and more than ``max_pending_bytes`` are
    waiting to be written. The record was not taken; the caller counts it as dropped."""
