"""A signal while the broker starts: SIGHUP is a reload once serving, SIGTERM and SIGINT a
clean stop once the state is restored; neither ends the process at once."""

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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_while_starting_is_a_clean_stop(broker, tmp_path, signum):
    """A `systemctl stop` during a long restore ended the process at once (status 143): no
    line said why, and the admin socket stayed behind. Now the broker logs the signal, stops
    as it does when serving (without saying it is ready), and exits with 0."""
    b, fifo, signalled = start_reading_a_pipe(broker, tmp_path)
    b.send_signal(signum)    # while it reads the file
    signalled.set()
    assert b.stop(signum) == 0, b.log_text()
    lines = [line.split(" ", 3)[-1] for line in b.logs]
    assert f"{signum.name} during start-up: stopping" in lines, b.log_text()
    assert lines[-1] == "stopped", b.log_text()
    assert not any(line.endswith(" ready") for line in lines), b.log_text()
    assert not (tmp_path / "data" / "admin.sock").exists()
