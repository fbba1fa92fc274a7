"""edgebroker.logs: the broker's log lines, and ``Frequent`` lines that skip the LogRecord."""

import io
import logging
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


@pytest.mark.parametrize("with_time", [True, False])
@pytest.mark.parametrize("created", [1_700_000_000.0, 1_700_000_000.0009, 1_700_000_000.5,
                                     1_700_000_000.9999, 1_700_000_001.001])
def test_line_formatter_writes_what_the_standard_formatter_writes(created, with_time):
    fmt = logs.WITH_TIME if with_time else logs.WITHOUT_TIME
    ours = logs.LineFormatter(with_time)
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


def test_frequent_lines_without_time_under_systemd(edgebroker_logger, monkeypatch):
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    stream = io.StringIO()
    logs.install("info", stream)
    logs.Frequent(logging.getLogger("edgebroker.client")).info("%s disconnected", "x")
    assert stream.getvalue() == "INFO x disconnected\n"


def test_frequent_is_logger_info_without_an_installed_handler(edgebroker_logger, caplog):
    with caplog.at_level(logging.INFO, logger="edgebroker.client"):
        logs.Frequent(logging.getLogger("edgebroker.client")).info("%s connected", "x")
    [record] = caplog.records
    assert record.getMessage() == "x connected"
    assert record.funcName == "test_frequent_is_logger_info_without_an_installed_handler"
