"""Listener.on_event hands the loop each waiting connection: a TCP socket with TCP_NODELAY
(inherited from the listening socket), named by its peer."""

import selectors
import socket

from edgebroker.config import ListenerConfig
from edgebroker.server.loop import Listener


class FakeLoop:
    """What a Listener needs from the server loop."""

    accept_gate = None

    def __init__(self):
        self.added = []

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
