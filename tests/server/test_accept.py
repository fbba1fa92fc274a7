"""Accepting: Listener.on_event hands the loop each waiting connection, a TCP socket with
TCP_NODELAY (inherited from the listening socket) named by its peer; the descriptor table is
grown once up front (reserve_descriptors)."""

import os
import selectors
import socket
import subprocess
import sys

import pytest

from conftest import open_files_allowed
from edgebroker.config import ListenerConfig
from edgebroker.server.descriptors import reserve_descriptors
from edgebroker.server.listeners import Listener


class FakeLoop:
    """What a Listener needs from the server loop."""

    accept_gate = None
    descriptors_short = False

    class broker:
        sockets_open = 0

        class memory:       # below memory_limit (core.memory.MemoryGuard)
            over = False

    def __init__(self):
        self.added = []

    @staticmethod
    def socket_room():
        return 1 << 20

    def add_connection(self, sock, peer, listener):
        self.added.append((sock, peer, listener))


def test_accepted_connections_are_tcp_sockets_with_nodelay():
    loop = FakeLoop()
    listener = Listener(loop, ListenerConfig(host="127.0.0.1", port=0))
    clients = []
    try:
        clients = [socket.create_connection(listener.sock.getsockname()) for _ in range(3)]
        listener.on_event(selectors.EVENT_READ)
        assert [peer for _, peer, _ in loop.added] == [
            f"127.0.0.1:{c.getsockname()[1]}" for c in clients]
        for sock, _, owner in loop.added:
            assert owner is listener
            assert (sock.family, sock.type) == (socket.AF_INET, socket.SOCK_STREAM)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        for sock, _, _ in loop.added:
            sock.close()
        for c in clients:
            c.close()
        listener.sock.close()


@pytest.fixture
def files_3000():
    with open_files_allowed(3000):
        yield


def test_reserve_descriptors_grows_the_table_once(files_3000):
    # A fresh process, so that nothing else grew its table before.
    code = ("from edgebroker.server.descriptors import reserve_descriptors\n"
            "def size():\n"
            "    return int([l for l in open('/proc/self/status') if l.startswith('FDSize:')][0]"
            ".split()[1])\n"
            "before = size(); reserve_descriptors(3000); print(before, size())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before < 3000 <= after


def test_reserve_descriptors_closes_nothing(files_3000):
    r, w = os.pipe()
    kept = os.dup2(w, 2999)                 # a descriptor open where the reservation goes
    try:
        reserve_descriptors(3000)
        os.write(kept, b"x")
        assert os.read(r, 1) == b"x"
    finally:
        for fd in (r, w, kept):
            os.close(fd)
