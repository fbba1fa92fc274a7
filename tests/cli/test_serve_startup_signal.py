"""A SIGHUP while the broker starts: a reload once serving, not the end of the process."""

import os
import signal
import threading

from conftest import default_config, toml_dumps


def _feed(fifo, text: str, timeout: float = 15.0) -> None:
    """Write ``text`` to the named pipe ``fifo`` once the broker opens it for reading (the
    open blocks until then; bounded by ``timeout``)."""
    done = threading.Event()

    def write():
        with open(fifo, "w") as fh:
            fh.write(text)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    if not done.wait(timeout):
        with open(fifo, "rb"):   # unblocks the writer: nobody read it
            pass
        raise AssertionError(f"the broker did not read {fifo} within {timeout} s")


def test_sighup_while_starting_is_a_reload_once_serving(broker, tmp_path):
    """The configuration file is a named pipe, so the start-up waits for the test at a known
    point (reading it): a SIGHUP then (a `systemctl reload` during a long restore, say) ended
    the process, SIGHUP's default action. Now the broker starts and then reloads (reading the
    file again)."""
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
    b.send_signal(signal.SIGHUP)    # while it reads the file
    signalled.set()
    b.wait_ready()
    mark = b.mark()
    _feed(fifo, text)               # the reload reads the file again
    assert b.wait_log("configuration reloaded", timeout=10, start=mark), b.log_text()
    assert b.alive()
    assert b.client("after-reload").ping() == []
