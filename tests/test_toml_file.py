"""toml_file: a configuration file parsed apart (in a child process, as serve's start does it)
gives what parsing it here gives, its problems included; a table marshal cannot carry (one
with a date) is parsed here instead."""

import datetime
import signal

import pytest

from edgebroker import toml_file
from edgebroker.errors import ConfigError


def test_a_file_parsed_apart_gives_the_same_table(tmp_path):
    path = tmp_path / "edgebroker.toml"
    path.write_bytes(b'\xef\xbb\xbflog_level = "info"\n[[listener]]\nport = 1883\n'
                     b'[limits]\nmax_inflight_messages = 20\nratio = 0.5\n')
    table = {"log_level": "info", "listener": [{"port": 1883}],
             "limits": {"max_inflight_messages": 20, "ratio": 0.5}}
    assert toml_file.read_toml(str(path), apart=True) == table
    assert toml_file.read_toml(str(path)) == table


@pytest.mark.parametrize("text, problem", [
    (b'log_level = "info', "not valid TOML: Unterminated string"),
    (b'log_level = "\xff"\n', "not UTF-8 text (byte 13): not valid TOML"),
    (b"n = " + b"9" * 5000 + b"\n", "not valid TOML: an integer of more than 4300 digits"),
])
def test_its_problems_are_those_of_a_file_parsed_here(tmp_path, text, problem):
    path = tmp_path / "edgebroker.toml"
    path.write_bytes(text)
    messages = []
    for apart in (True, False):
        with pytest.raises(ConfigError) as caught:
            toml_file.read_toml(str(path), apart=apart)
        messages.append(caught.value.problems)
    assert messages[0] == messages[1]
    assert messages[0][0].startswith(f"{path}: {problem}")


def test_a_date_is_parsed_here(tmp_path):
    path = tmp_path / "edgebroker.toml"
    path.write_text("log_level = 1979-05-27\n")
    assert toml_file.read_toml(str(path), apart=True) == {"log_level": datetime.date(1979, 5, 27)}


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        toml_file.read_toml(str(tmp_path / "none.toml"), apart=True)


def test_a_file_parsed_apart_with_sigchld_ignored(tmp_path):
    """A launcher may start the broker with SIGCHLD ignored: the kernel then reaps the parsing
    child itself and waitpid fails (ChildProcessError); the table it sent is used (diff38:
    serve ended with a traceback at start)."""
    path = tmp_path / "edgebroker.toml"
    path.write_text('log_level = "info"\n')
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert toml_file.read_toml(str(path), apart=True) == {"log_level": "info"}
    finally:
        signal.signal(signal.SIGCHLD, old)
