"""A real Mosquitto broker for tests that need a third-party broker (the client library against
another broker, the remote end of a bridge).

``MosquittoBroker(workdir).start()`` runs ``mosquitto -c`` on a free loopback port and returns
once its log says the listener is open; ``stop()`` ends it (SIGTERM, then SIGKILL), and
``start()`` again brings it back on the same port with the same persistence file, as a
restarted remote would. The ``mosquitto_broker`` fixture in conftest.py makes them and stops
them at the end of a test.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

READY_TIMEOUT = 15.0
_LISTENING = re.compile(r"Opening ipv4 listen socket on port (\d+)")
_RUNNING = re.compile(r"mosquitto version \S+ running")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MosquittoBroker:
    def __init__(self, workdir: Path, *, persistence: bool = True, extra: list[str] = ()):
        """``extra``: more mosquitto.conf lines (for example ``max_queued_messages 0``)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o777)   # mosquitto drops privileges to its own user as root
        self.port = free_port()
        self.host = "127.0.0.1"
        self.conf = self.workdir / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true",
                 f"persistence {'true' if persistence else 'false'}",
                 f"persistence_location {self.workdir}/", "autosave_interval 1",
                 "log_dest stderr", "log_type error", "log_type warning", "log_type notice",
                 "log_type information", *extra]
        if os.geteuid() == 0:
            # As root Mosquitto drops to its own user, which cannot enter pytest's private
            # temporary directories: it could not save its persistence file.
            lines.append("user root")
        self.conf.write_text("\n".join(lines) + "\n")
        os.chmod(self.conf, 0o644)
        self.proc: subprocess.Popen | None = None
        self.out = None

    def start(self) -> "MosquittoBroker":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, errors="replace")
        from conftest import LineCollector   # the broker fixture's stderr collector
        self.out = LineCollector(self.proc.stderr)
        # "Opening ... listen socket" comes before the socket listens; "running" after.
        line = self.out.wait(lambda ln: _LISTENING.search(ln) is not None, READY_TIMEOUT)
        if line is not None:
            line = self.out.wait(lambda ln: _RUNNING.search(ln) is not None, READY_TIMEOUT)
        if line is None:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"mosquitto not listening within {READY_TIMEOUT} s "
                                 f"(exit code {self.proc.returncode}):\n{self.out.text()}")
        return self

    def stop(self, kill: bool = False) -> int:
        """End the broker (SIGKILL with ``kill``) and return its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        (self.proc.kill if kill else self.proc.terminate)()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def log_text(self) -> str:
        return self.out.text() if self.out is not None else ""
