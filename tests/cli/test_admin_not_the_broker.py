"""`inspect` and `upload` commands when something other than the broker answers on the admin
socket (a reply that is not JSON, JSON nested too deep to decode, or JSON that is not an
object): one line saying so and a non-zero exit, not a Python traceback."""

import os
import socket
import threading

import pytest

from conftest import run_cli


class Impostor:
    """A Unix socket server answering each connection's first line with ``answer``."""

    def __init__(self, path: str, answer: bytes, connections: int):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.sock.settimeout(20)
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, args=(connections,), daemon=True)
        self.thread.start()

    def _serve(self, connections: int) -> None:
        for _ in range(connections):
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(20)
                conn.recv(4096)
                conn.sendall(self.answer)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@pytest.mark.parametrize("answer", [b"HTTP/1.0 400 Bad Request\n", b"[]\n", b'"ok"\n',
                                    b"\xff\xfe\n", b"[" * 100_000 + b"\n"])
@pytest.mark.parametrize("command", [("inspect", "stats"), ("inspect", "clients"),
                                     ("upload", "status")])
def test_a_reply_not_from_the_broker_is_one_clear_line(tmp_path, answer, command):
    data = tmp_path / "data"
    data.mkdir()
    (data / "log").mkdir()
    path = str(data / "admin.sock")
    impostor = Impostor(path, answer, 1)
    try:
        r = run_cli(*command, "--data-dir", str(data), timeout=20)
    finally:
        impostor.close()
    assert "Traceback" not in r.stderr, r.stderr
    shown = answer.rstrip(b"\n")[:60]
    assert r.returncode != 0 and r.stderr == (
        f"edgebroker: {path} did not answer as the broker's admin socket does (a JSON object "
        f"per line): it sent {shown!r}\n"), r.stderr
    assert os.path.exists(path)
