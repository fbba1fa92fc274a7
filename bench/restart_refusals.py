"""Connections refused across one broker restart: a listener the broker binds itself against
socket activation (the sockets held as systemd holds edgebroker.socket's; docs/deploy.md).

    .venv/bin/python bench/restart_refusals.py [self-bind] [activation]

For each mode: start the broker on one port, then a client thread connects and sends CONNECT
every 2 ms while the broker gets SIGTERM, exits and starts again on the same port, until
0.3 s after the new one is ready. Prints the connects tried, how many were refused, and how
many got CONNACK 0. Loopback only; not part of `make test`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import mqttraw as m  # noqa: E402
from fakesystemd import SocketUnit  # noqa: E402

PACE = 0.002            # seconds between two connects
AFTER_READY = 0.3       # seconds of connects after the new broker is ready
READY_TIMEOUT = 15.0


def start(config: str, unit: SocketUnit | None) -> subprocess.Popen:
    """The broker, once it says it is ready."""
    cmd = [sys.executable, "-m", "edgebroker", "serve", "-c", config]
    if unit is not None:
        cmd = unit.wrap(cmd)
    proc = subprocess.Popen(cmd, pass_fds=unit.fds if unit is not None else (), cwd=REPO,
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    deadline = time.monotonic() + READY_TIMEOUT
    for line in proc.stderr:
        if " ready" in line:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"broker not ready within {READY_TIMEOUT} s")
    threading.Thread(target=proc.stderr.read, daemon=True).start()   # keep the pipe drained
    return proc


def run(mode: str, tmp: str) -> str:
    unit = None
    if mode == "activation":
        unit = SocketUnit()
        port = unit.listen_tcp("mqtt", backlog=4096)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    config = os.path.join(tmp, f"{mode}.toml")
    with open(config, "w") as fh:
        fh.write(f'data_dir = "{tmp}/{mode}"\nsys_interval = 0\n\n'
                 f'[[listener]]\nhost = "127.0.0.1"\nport = {port}\n')
    broker = start(config, unit)
    done = threading.Event()
    tried = refused = 0
    clients: list[m.RawClient] = []

    def connect_all_along():
        nonlocal tried, refused
        while not done.is_set():
            tried += 1
            try:
                c = m.RawClient("127.0.0.1", port, timeout=10)
                c.send(m.connect(""))
                clients.append(c)
            except ConnectionRefusedError:
                refused += 1
            done.wait(PACE)

    thread = threading.Thread(target=connect_all_along)
    thread.start()
    done.wait(0.2)
    began = time.monotonic()
    broker.terminate()
    broker.wait(10)
    broker = start(config, unit)
    gap = time.monotonic() - began
    done.wait(AFTER_READY)
    done.set()
    thread.join()
    served = 0
    for c in clients:
        try:
            served += c.expect(m.CONNACK, timeout=5).rc == 0
        except (m.ConnectionClosed, OSError):
            pass            # accepted by the old broker just before it stopped, then closed
        c.close()
    broker.terminate()
    broker.wait(10)
    if unit is not None:
        unit.close()
    return (f"{mode:10s}: restart (SIGTERM to ready) {gap:.2f} s; {tried} connects, "
            f"{refused} refused, {served} CONNACK 0, {len(clients) - served} closed by the stop")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ebrestart") as tmp:
        for mode in sys.argv[1:] or ("self-bind", "activation"):
            print(run(mode, tmp), flush=True)


if __name__ == "__main__":
    main()
