"""A signal while the broker starts: SIGHUP is a reload once serving; SIGTERM and SIGINT end
the process at once while it reads its configuration, and are a clean stop once the state is
restored when they come after that."""

import os
import signal
import threading

import pytest

from conftest import default_config, toml_dumps


def start_reading_a_pipe(broker, tmp_path):
    """A broker whose configuration file is a named pipe, so the start-up waits for the test
    at a known point (reading it); and the event that lets the test's writer go on."""
    fifo = tmp_path / "edgebroker.toml"
    os.mkfifo(fifo)
    text = toml_dumps(default_config(tmp_path))
    b = broker(config_file=False, args=["-c", str(fifo)], wait=False)
    opened, signalled = threading.Event(), threading.Event()

    def write_first():
        with open(fifo, "w") as fh:        # returns once the broker opened the file
            opened.set()
            signalled.wait(15)
            fh.write(text)

    threading.Thread(target=write_first, daemon=True).start()
    if not opened.wait(15):
        with open(fifo, "rb"):   # unblocks the writer
            pass
        raise AssertionError(f"the broker never opened {fifo}:\n{b.log_text()}")
    return b, fifo, signalled


def test_sighup_while_starting_is_a_reload_once_serving(broker, tmp_path):
    """A SIGHUP while the broker reads its file (a `systemctl reload` during a long restore,
    say) ended the process, SIGHUP's default action. Now the broker starts and then reloads:
    a pipe cannot be read again, so the reload is refused, saying so."""
    b, fifo, signalled = start_reading_a_pipe(broker, tmp_path)
    b.send_signal(signal.SIGHUP)    # while it reads the file
    signalled.set()
    b.wait_ready()
    line = b.wait_log("reload failed", timeout=10)
    assert line and line.endswith(f"{fifo}: not a regular file (a pipe), read at start: it "
                                  f"cannot be read again; restart to change the "
                                  f"configuration"), b.log_text()
    assert b.alive()
    assert b.client("after-reload").ping() == []


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, -signal.SIGTERM),
                                             (signal.SIGINT, 130)])
def test_stop_signal_while_reading_the_configuration_ends_the_process(broker, tmp_path, signum,
                                                                       status):
    """The configuration read from a pipe (`-c /dev/stdin`, a FIFO) waits for its writer: a
    stop signal then ends the process at once, as its default action does. The handler that
    defers a stop until the state is restored was installed before the read: the signal
    interrupted the read, which went on waiting, and only SIGKILL ended the process (and a
    writer coming later got a whole start-up first)."""
    b, fifo, signalled = start_reading_a_pipe(broker, tmp_path)
    try:
        assert b.stop(signum, timeout=10) == status, b.log_text()    # while it reads the file
    finally:
        with open(fifo, "rb") as fh:    # the writer writes to the test, not to a closed pipe
            signalled.set()
            fh.read()
    assert not (tmp_path / "data").exists()
