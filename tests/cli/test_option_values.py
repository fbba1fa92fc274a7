"""Option values the commands cannot use are one usage line (exit 2) or one error line, not a
traceback: waits too long for the calls that make them (`--timeout`, `--watch`, `sub -W`),
fields too long for an MQTT packet, and bytes of the command line that are not UTF-8."""

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
    # `sub -W 0` never timed out, -W -1 and -W nan timed out at once (exit 27); mosquitto_sub
    # refuses them too.
    r = run_cli("sub", "-p", "1", "-t", "a", "-W", value)
    assert usage_error(r) == f"edgebroker sub: error: argument -W/--wait: {why}"
    r = run_cli("inspect", "clients", "--socket", "/nonexistent", "--watch", value)
    assert usage_error(r) == f"edgebroker inspect clients: error: argument --watch: {why}"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_counts_below_1_are_usage_errors(value):
    """`sub -C 0` (and -1) printed for ever and `pub --repeat 0` sent once: mosquitto's
    clients refuse both, and so do ours."""
    r = run_cli("sub", "-p", "1", "-t", "a", "-C", value)
    assert usage_error(r) == f"edgebroker sub: error: argument -C/--count: {value}: must be 1 " \
                             f"or more"
    r = run_cli("pub", "-p", "1", "-t", "a", "-m", "x", "--repeat", value)
    assert usage_error(r) == f"edgebroker pub: error: argument --repeat: {value}: must be 1 " \
                             f"or more"


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_repeat_delays_below_0_or_unbounded_are_usage_errors(value):
    """`pub --repeat-delay -1` or nan sent at once, inf waited for ever."""
    r = run_cli("pub", "-p", "1", "-t", "a", "-m", "x", "--repeat", "2", "--repeat-delay",
                value)
    assert usage_error(r) == f"edgebroker pub: error: argument --repeat-delay: {value}: " \
                             f"must be 0 to 1000000 seconds"


def test_the_longest_wait_is_taken(srv):
    r = run_cli("pub", "-p", str(srv.port), "-t", "a", "-m", "x", "--timeout", "1e6")
    assert (r.returncode, r.stderr) == (0, "")
    r = run_cli("inspect", "clients", "--data-dir", str(srv.config["data_dir"]), "--watch",
                "1e6", "--iterations", "1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_message_is_sent_as_the_bytes_given(srv, uid):
    """`pub -m $'\\xff'` ended in UnicodeEncodeError; mosquitto_pub sends the bytes as given,
    and so does pub now (-m, --will-payload, -P)."""
    sub = srv.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t")
    r = subprocess.run([*broker_command(), "pub", "-p", str(srv.port), "-t", f"{uid}/t", "-m",
                        b"\xff\xfe-not-utf8"], cwd=REPO, capture_output=True, timeout=30)
    assert (r.returncode, r.stderr) == (0, b"")
    assert sub.recv_publish().payload == b"\xff\xfe-not-utf8"


@pytest.mark.parametrize("option, value, problem", [
    ("-u", "u" * 70000, "the user name must be at most 65,535 bytes of UTF-8"),
    ("-P", "p" * 70000, "the password must be at most 65,535 bytes"),
    ("-i", "i" * 70000, "the client id must be at most 65,535 bytes of UTF-8"),
    ("-u", b"\xff", "the user name must be valid UTF-8 (it has a lone surrogate)"),
    ("--will-payload", "w" * 70000, "the will payload must be at most 65,535 bytes"),
])
def test_connect_fields_mqtt_cannot_carry_are_usage_errors(option, value, problem):
    """`pub -u` with a 70,000-character name ended in a traceback (ValueError: field of 70000
    bytes does not fit a 2-byte length)."""
    extra = ["-u", "u"] if option == "-P" else ["--will-topic", "w"] if "will" in option else []
    r = subprocess.run([*broker_command(), "pub", "-p", "1", "-t", "a", "-m", "x", *extra,
                        option, value], cwd=REPO, capture_output=True, timeout=30)
    assert (r.returncode, r.stderr.decode()) == (2, f"edgebroker pub: CONNECT: {problem}\n")
