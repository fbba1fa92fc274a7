"""Option values the commands cannot use are one usage line (exit 2) or one error line, not a
traceback: waits too long for the calls that make them (`--timeout`, `--watch`), fields too
long for an MQTT packet, and bytes of the command line that are not UTF-8."""

import subprocess

import pytest

from conftest import REPO, broker_command, run_cli


def usage_error(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, r.stderr
    return r.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["inf", "1e10", "nan", "0", "-1", "3e6"])
def test_waits_the_commands_cannot_make_are_usage_errors(value):
    """`pub --timeout inf` (or 3e6: over the event loop's millisecond wait) and `inspect
    clients --watch inf` (or 1e10) were taken, then ended in OverflowError."""
    why = f"{value}: must be above 0 and at most 1000000 seconds"
    r = run_cli("pub", "-p", "1", "-t", "a", "-m", "x", "--timeout", value)
    assert usage_error(r) == f"edgebroker pub: error: argument --timeout: {why}"
    r = run_cli("sub", "-p", "1", "-t", "a", "--timeout", value)
    assert usage_error(r) == f"edgebroker sub: error: argument --timeout: {why}"
    r = run_cli("inspect", "clients", "--socket", "/nonexistent", "--watch", value)
    assert usage_error(r) == f"edgebroker inspect clients: error: argument --watch: {why}"


def test_the_longest_wait_is_taken(srv):
    r = run_cli("pub", "-p", str(srv.port), "-t", "a", "-m", "x", "--timeout", "1e6")
    assert (r.returncode, r.stderr) == (0, "")
    r = run_cli("inspect", "clients", "--data-dir", str(srv.config["data_dir"]), "--watch",
                "1e6", "--iterations", "1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
