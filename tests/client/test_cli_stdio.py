"""`edgebroker pub` / `edgebroker sub` and their standard input and output, as processes against
a real broker: stdin closed for `pub -l`/`-s` and stdout closed for `sub` are one error line
and exit 1 before anything is sent; a write to stdout that fails (ENOSPC) is one line, exit 1,
the message left unacknowledged; Ctrl-C or SIGTERM while `sub` is blocked writing a message to
a full pipe lets it write the whole record, acknowledge it, then exit (no cut-off record, no
QoS 2 duplicate next run), and a second one exits at once (130) with the message unacknowledged."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest

from conftest import REPO, LineCollector, broker_command

# A message larger than a pipe's 64 KiB: `sub` stays blocked writing it until the pipe is read.
BIG = b"M1-" + b"x" * 200_000


def eb(*args, stdin: bytes | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*broker_command(), *args], cwd=REPO, input=stdin,
                          capture_output=True, timeout=30, **kw)


def close_fd(fd):
    """A preexec_fn: the command starts with ``fd`` closed (a shell's ``<&-`` / ``>&-``)."""
    return lambda: os.close(fd)


def read_to_eof(fd: int, timeout: float = 15.0) -> bytes:
    """All of pipe ``fd`` until every writer has closed it, within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk
    pytest.fail(f"the pipe was not closed within {timeout} s ({len(data)} bytes read)")


@pytest.mark.parametrize("option", ["-l", "-s"])
def test_pub_with_stdin_closed_is_one_line_and_sends_nothing(broker, uid, option):
    b = broker()
    r = eb("pub", "-p", str(b.port), "-t", f"{uid}/t", "-r", "-q", "1", option,
           stdin=None, preexec_fn=close_fd(0))
    assert (r.returncode, r.stderr.decode()) == (
        1, f"Error: standard input is closed ({option} reads the message from it)\n")
    r = eb("sub", "-p", str(b.port), "-t", f"{uid}/t", "-W", "1")   # nothing retained
    assert (r.returncode, r.stdout) == (27, b"")


def test_sub_with_stdout_closed_is_one_line_and_subscribes_nothing(broker, uid):
    b = broker()
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "1", "-t", f"{uid}/t",
           preexec_fn=close_fd(1))
    assert (r.returncode, r.stderr.decode()) == (
        1, "Error: standard output is closed: nowhere to print the messages\n")
    r = eb("pub", "-p", str(b.port), "-t", f"{uid}/t", "-q", "1", "-m", "queued?")
    assert r.returncode == 0, r.stderr
    # no session was kept on the filter: a kept session would get "queued?" now
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "1", "-t", f"{uid}/other",
           "-W", "1")
    assert (r.returncode, r.stdout) == (27, b"")


def _sigint_default():
    """(A preexec_fn) SIGINT as at a terminal: a test run in a background job (CI under nohup,
    `make test &`) has it ignored, and `sub` leaves an ignored SIGINT alone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_sub(b, uid, stdout, *extra):
    """`sub -d` on the kept session of ``uid``-c, its stderr lines collected."""
    p = subprocess.Popen([*broker_command(), "sub", "-p", str(b.port), "-c", "-i", f"{uid}-c",
                          "-q", "2", "-t", f"{uid}/t", "-d", *extra], cwd=REPO,
                         stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_sigint_default)
    return p, LineCollector(p.stderr)


def test_sub_that_cannot_write_stdout_is_one_line_and_leaves_the_message(broker, uid):
    b = broker()
    with open("/dev/full", "wb") as full:
        p, err = start_sub(b, uid, full)
    assert err.wait("received SUBACK", 10), err.lines
    r = eb("pub", "-p", str(b.port), "-t", f"{uid}/t", "-q", "1", "-m", "hi")
    assert r.returncode == 0, r.stderr
    assert p.wait(10) == 1
    err.wait(lambda line: False, 5)         # to its end
    assert not any("Traceback" in line for line in err.lines), err.lines
    assert err.lines[-1] == "Error: writing the message to standard output: No space left on device"
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "2", "-t", f"{uid}/t",
           "-C", "1", "-W", "5")
    assert (r.returncode, r.stdout) == (0, b"hi\n"), r.stderr      # not acknowledged


def blocked_writing(b, uid, sig):
    """A `sub` blocked writing BIG to a pipe nobody reads yet, sent ``sig`` once; the read end
    of the pipe and its stderr lines."""
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "2", "-t", f"{uid}/t", "-E")
    assert r.returncode == 0, r.stderr
    r = eb("pub", "-p", str(b.port), "-t", f"{uid}/t", "-q", "2", "-s", stdin=BIG)
    assert r.returncode == 0, r.stderr
    rd, wr = os.pipe()
    try:
        p, err = start_sub(b, uid, wr)
    finally:
        os.close(wr)
    assert select.select([rd], [], [], 10)[0], err.lines    # it has begun writing BIG
    p.send_signal(sig)
    return p, rd, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_writing_finishes_the_message_and_acknowledges_it(broker, uid, sig):
    b = broker()
    p, rd, err = blocked_writing(b, uid, sig)
    try:
        # the handler has run, or (before the fix) the command exited, the message cut off
        seen = err.wait("interrupted: writing the message in full", 10)
        out = read_to_eof(rd)
    finally:
        os.close(rd)
    assert p.wait(10) == 0, err.lines
    assert out == BIG + b"\n", f"{len(out)} bytes written"
    assert seen, err.lines
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "2", "-t", f"{uid}/t",
           "-W", "1")
    assert (r.returncode, r.stdout) == (27, b""), r.stderr            # acknowledged: no duplicate


def test_second_signal_while_writing_exits_at_once_unacknowledged(broker, uid):
    b = broker()
    p, rd, err = blocked_writing(b, uid, signal.SIGTERM)
    try:
        assert err.wait("interrupted: writing the message in full", 10), err.lines
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 130, err.lines
        out = read_to_eof(rd)
    finally:
        os.close(rd)
    assert err.wait("interrupted while writing a message: it is cut off and was not "
                    "acknowledged", 5), err.lines
    assert len(out) < len(BIG) and BIG.startswith(out)
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "2", "-t", f"{uid}/t",
           "-C", "1", "-W", "5")
    assert (r.returncode, r.stdout) == (0, BIG + b"\n"), r.stderr     # sent again, whole


def test_a_non_blocking_stdout_is_waited_for_not_an_error(broker, uid):
    """(diff22) A stdout with O_NONBLOCK (left so by another program on a shared pipe) and a
    reader behind: the write's EAGAIN ended `sub` with exit 1, the record cut off. It waits
    for the pipe now, as a blocking write does."""
    b = broker()
    r = eb("sub", "-p", str(b.port), "-c", "-i", f"{uid}-c", "-q", "2", "-t", f"{uid}/t", "-E")
    assert r.returncode == 0, r.stderr
    r = eb("pub", "-p", str(b.port), "-t", f"{uid}/t", "-q", "2", "-s", stdin=BIG)
    assert r.returncode == 0, r.stderr
    rd, wr = os.pipe()
    os.set_blocking(wr, False)
    try:
        p, err = start_sub(b, uid, wr, "-C", "1")
    finally:
        os.close(wr)
    try:
        assert select.select([rd], [], [], 10)[0], err.lines    # it has begun writing BIG
        out = read_to_eof(rd)
    finally:
        os.close(rd)
    assert p.wait(10) == 0, err.lines
    assert out == BIG + b"\n", f"{len(out)} bytes written"
