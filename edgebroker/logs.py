"""The broker's log: one line per event on stderr.

A line is ``2026-01-02 03:04:05,678 INFO message``, or ``<6>INFO message``
when stderr is systemd's journal: the journal adds its own time, and takes
the ``<N>`` prefix (sd-daemon(3): 3 error, 4 warning, 6 info, 7 debug) as the
line's priority, so that ``journalctl -p warning`` finds the warnings.
Stderr is the journal when ``JOURNAL_STREAM`` names its device and inode, as
systemd.exec(5) says to check: the variable alone is inherited by programs
whose stderr was sent elsewhere. ``install`` sends every record of the
``edgebroker`` loggers to one ``LineHandler`` that writes such lines.

The core logs a line for every connect and disconnect: thousands a second
when a gateway's devices reconnect at once. Through ``Logger.info`` each cost
about 18 µs of the loop's CPU time (a ``LogRecord``, the caller's frame, the
handler chain, the formatter, the write), a third of what a whole connect
cost. These lines go through ``Frequent.info`` instead, which formats the same
line and hands it straight to the installed handler: about 5 µs, the write
included. Without an installed handler (tests, a library user's own set-up)
``Frequent.info`` is ``Logger.info``.
"""

from __future__ import annotations

import logging
import os
import sys
import time

WITH_TIME = "%(asctime)s %(levelname)s %(message)s"
WITHOUT_TIME = "%(levelname)s %(message)s"

_handler: LineHandler | None = None   # set by install()

# sd-daemon(3) priority prefixes, by level name.
PRIORITIES = {"CRITICAL": "<2>", "ERROR": "<3>", "WARNING": "<4>", "INFO": "<6>",
              "DEBUG": "<7>"}


def is_journal(stream) -> bool:
    """Whether ``stream`` is the journal's stream that ``JOURNAL_STREAM`` (``device:inode``)
    names: a variable left over in a shell whose stderr goes to a file or a terminal is not."""
    value = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    try:
        st = os.fstat(stream.fileno())
        return (int(device), int(inode)) == (st.st_dev, st.st_ino)
    except (AttributeError, OSError, ValueError):   # no descriptor (StringIO), a bad value
        return False


def priority_prefix(levelname: str, stream=None) -> str:
    """``<N>`` for a line of ``levelname`` written on ``stream`` (stderr) outside the
    loggers, when that is the journal; otherwise nothing."""
    return PRIORITIES.get(levelname, "") if is_journal(stream or sys.stderr) else ""


class LineFormatter(logging.Formatter):
    """``WITH_TIME``, with the time text made once per second, or (for the journal)
    ``WITHOUT_TIME`` after the level's ``<N>`` priority prefix, on every line of a
    record with a traceback."""

    def __init__(self, journal: bool = False):
        super().__init__(WITHOUT_TIME if journal else WITH_TIME)
        self.with_time = not journal
        self._second = (None, "")    # (whole second, its text), replaced as one

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self.with_time:
            return text
        prefix = PRIORITIES.get(record.levelname, "")
        return prefix + text.replace("\n", "\n" + prefix)

    def formatTime(self, record: logging.LogRecord, datefmt=None) -> str:
        return self._time(record.created)

    def _time(self, created: float) -> str:
        whole = int(created)
        second, text = self._second
        if whole != second:
            text = time.strftime(self.default_time_format, self.converter(created))
            self._second = (whole, text)
        # The milliseconds as LogRecord.msecs has them.
        return self.default_msec_format % (text, int((created - whole) * 1000))

    def line(self, created: float, levelname: str, message: str) -> str:
        """The line ``format`` makes of a record without exception or stack information."""
        if self.with_time:
            return f"{self._time(created)} {levelname} {message}"
        return f"{PRIORITIES.get(levelname, '')}{levelname} {message}"


class LineHandler(logging.StreamHandler):
    """A ``StreamHandler`` with a ``LineFormatter`` that also writes lines without a record."""

    def __init__(self, stream=None, journal: bool = False):
        super().__init__(stream)
        self.setFormatter(LineFormatter(journal))

    def write_line(self, levelname: str, message: str) -> None:
        """Write what ``emit`` would for a record of ``message`` made now."""
        text = self.formatter.line(time.time(), levelname, message) + self.terminator
        with self.lock:
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": message,
                                                        "levelname": levelname}))


def install(level: str, stream=None) -> LineHandler:
    """Make a ``LineHandler`` on ``stream`` (stderr) the only output of the ``edgebroker``
    loggers, at ``level``; ``Frequent`` lines go to it from now on."""
    global _handler
    stream = stream if stream is not None else sys.stderr
    handler = LineHandler(stream, journal=is_journal(stream))
    root = logging.getLogger("edgebroker")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    _handler = handler
    return handler


def uninstall() -> None:
    """``Frequent`` lines go through ``Logger.info`` again (tests)."""
    global _handler
    _handler = None


class Frequent:
    """INFO lines of ``logger`` that come once per connection: written as ``logger.info``
    would write them, straight to the installed ``LineHandler``."""

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger):
        self.logger = logger

    def info(self, msg: str, *args) -> None:
        logger = self.logger
        if not logger.isEnabledFor(logging.INFO):
            return
        handler = _handler
        if handler is None:
            logger.info(msg, *args, stacklevel=2)
        else:
            handler.write_line("INFO", msg % args)
