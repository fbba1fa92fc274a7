"""packaging/entry.py, the one-file binary's entry point, run by this interpreter: `serve`
stops when the process that started it (the bootloader, in the binary) is gone. A SIGKILL of
the bootloader, the unit's main process (a supervisor or `kill -9` stopping the main pid), left
the broker serving as an orphan, holding the port and the state directory: the next start
failed with "Address already in use". tests/frozen/test_binary.py does it with the binary."""

import re
import signal
import socket
import sys

from conftest import REPO, Proc
from frozen.conftest import assert_stopped_as_orphan, kill_quietly

ENTRY = REPO / "packaging" / "entry.py"


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(x) for x in fh.read().split()]


def test_serve_stops_when_the_process_that_started_it_is_killed(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))     # this checkout's edgebroker
    # A shell that starts the broker and waits: the broker's parent, as the bootloader is.
    parent = Proc(["sh", "-c", '"$@" & wait', "sh", sys.executable, str(ENTRY), "serve",
                   "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")])
    broker = None
    try:
        line = parent.wait_line(re.compile(r"listening on 127\.0\.0\.1:\d+"), timeout=20)
        port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
        parent.wait_line(lambda ln: ln.endswith(" ready"), timeout=20)
        [broker] = children(parent.p.pid)
        parent.kill(signal.SIGKILL)
        stopped = parent.out.wait(lambda ln: ln.endswith("stopped"), timeout=10)
        assert stopped, f"the orphan did not stop:\n{parent.out.text()}"
        parent.out.join(10)
        assert parent.out.eof, parent.out.text()        # the broker's end of the pipe: closed
        assert_stopped_as_orphan(parent.lines, parent.out.text(), parent.p.pid)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the port is still held"
    finally:
        kill_quietly(broker)
        parent.kill()
