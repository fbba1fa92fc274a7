"""edgebroker.logs: the broker's log lines, and ``Frequent`` lines that skip the LogRecord."""

import io
import logging
import os
import re

import pytest

from edgebroker import logs

LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO client 'a' from 1\.2\.3\.4:5 "
                  r"connected\n")


@pytest.fixture
def edgebroker_logger():
    """The ``edgebroker`` logger, restored afterwards (``install`` changes it)."""
    root = logging.getLogger("edgebroker")
    saved = root.handlers[:], root.level, root.propagate
    yield root
    logs.uninstall()
    root.handlers[:], root.level, root.propagate = saved


def record_at(created: float, msg: str = "%s connected", args=("x",)) -> logging.LogRecord:
    record = logging.LogRecord("edgebroker.client", logging.INFO, __file__, 1, msg, args, None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0   # as LogRecord computes it
    return record


@pytest.mark.parametrize("journal", [False, True])
@pytest.mark.parametrize("created", [1_700_000_000.0, 1_700_000_000.0009, 1_700_000_000.5,
                                     1_700_000_000.9999, 1_700_000_001.001])
def test_line_formatter_writes_what_the_standard_formatter_writes(created, journal):
    fmt = "<6>" + logs.WITHOUT_TIME if journal else logs.WITH_TIME
    ours = logs.LineFormatter(journal)
    expected = logging.Formatter(fmt).format(record_at(created))
    assert ours.format(record_at(created)) == expected
    assert ours.line(created, "INFO", "x connected") == expected
    # The time text is cached per second: the next call, a second later, has its own.
    assert ours.line(created + 1, "INFO", "x") == logging.Formatter(fmt).format(
        record_at(created + 1, "%s", ("x",)))


def test_line_formatter_keeps_the_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        exc_info = sys.exc_info()
    record = record_at(1_700_000_000.25)
    record.exc_info = exc_info
    text = logs.LineFormatter().format(record)
    assert text.startswith(logging.Formatter(logs.WITH_TIME).formatTime(record) + " INFO x connected\n")
    assert text.endswith("ValueError: boom")


def test_frequent_lines_go_to_the_installed_handler(edgebroker_logger):
    stream = io.StringIO()
    logs.install("info", stream)
    frequent = logs.Frequent(logging.getLogger("edgebroker.client"))
    frequent.info("%s connected", "client 'a' from 1.2.3.4:5")
    logging.getLogger("edgebroker.client").info("%s connected", "client 'a' from 1.2.3.4:5")
    first, second = stream.getvalue().splitlines(keepends=True)
    assert LINE.fullmatch(first) and LINE.fullmatch(second)


def test_frequent_lines_follow_the_level(edgebroker_logger):
    stream = io.StringIO()
    logs.install("warning", stream)
    logs.Frequent(logging.getLogger("edgebroker.client")).info("%s connected", "x")
    assert stream.getvalue() == ""
    edgebroker_logger.setLevel(logging.INFO)     # as a reload does
    logs.Frequent(logging.getLogger("edgebroker.client")).info("%s connected", "x")
    assert stream.getvalue().endswith(" INFO x connected\n")


def journal_file(path, monkeypatch):
    """A file opened for writing that ``JOURNAL_STREAM`` names, as systemd names the
    journal's stream."""
    fh = open(path, "w")
    st = os.fstat(fh.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    return fh


def test_lines_to_the_journal_carry_the_priority_without_time(edgebroker_logger, monkeypatch,
                                                              tmp_path):
    """journald takes ``<N>`` as the line's priority (``journalctl -p warning``): without it
    every line was stored at "info". A traceback's lines are entries of their own."""
    with journal_file(tmp_path / "journal", monkeypatch) as fh:
        logs.install("debug", fh)
        logs.Frequent(logging.getLogger("edgebroker.client")).info("%s disconnected", "x")
        log = logging.getLogger("edgebroker.x")
        log.debug("d")
        log.warning("w")
        log.error("e")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    lines = (tmp_path / "journal").read_text().splitlines()
    assert lines[:5] == ["<6>INFO x disconnected", "<7>DEBUG d", "<4>WARNING w", "<3>ERROR e",
                         "<3>ERROR failed"]
    assert len(lines) > 6 and all(line.startswith("<3>") for line in lines[5:])
    assert lines[-1] == "<3>ValueError: boom"


def test_journal_stream_of_another_file_is_not_the_journal(edgebroker_logger, monkeypatch,
                                                            tmp_path):
    """``JOURNAL_STREAM`` inherited by a shell whose stderr goes elsewhere: plain lines."""
    with journal_file(tmp_path / "journal", monkeypatch), \
            open(tmp_path / "other", "w") as other:
        logs.install("info", other)
        logs.Frequent(logging.getLogger("edgebroker.client")).info("%s disconnected", "x")
        logging.getLogger("edgebroker.x").warning("w")
    first, second = (tmp_path / "other").read_text().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO x disconnected", first)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING w", second)
    assert logs.priority_prefix("ERROR", other) == ""


def test_frequent_is_logger_info_without_an_installed_handler(edgebroker_logger, caplog):
    with caplog.at_level(logging.INFO, logger="edgebroker.client"):
        logs.Frequent(logging.getLogger("edgebroker.client")).info("%s connected", "x")
    [record] = caplog.records
    assert record.getMessage() == "x connected"
    assert record.funcName == "test_frequent_is_logger_info_without_an_installed_handler"
