"""A SIGHUP while the broker starts: a reload once serving, not the end of the process."""

import os
import signal
import threading

from conftest import default_config, toml_dumps


def test_sighup_while_starting_is_a_reload_once_serving(broker, tmp_path):
    """The configuration file is a named pipe, so the start-up waits for the test at a known
    point (reading it): a SIGHUP then (a `systemctl reload` during a long restore, say) ended
    the process, SIGHUP's default action. Now the broker starts and then reloads: a pipe
    cannot be read again, so the reload is refused, saying so."""
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
    line = b.wait_log("reload failed", timeout=10)
    assert line and line.endswith(f"{fifo}: not a regular file (a pipe), read at start: it "
                                  f"cannot be read again; restart to change the "
                                  f"configuration"), b.log_text()
    assert b.alive()
    assert b.client("after-reload").ping() == []
