"""The loop's poller (epoll directly, or the selectors fallback): same contract for both."""

import socket
import time

import pytest

from edgebroker.server.loop import Loop
from edgebroker.server.poller import EVENT_READ, EVENT_WRITE, EpollPoller, SelectorPoller
from edgebroker.server.transport import Transport


class Owner:
    """A callback with ``sock`` and ``events`` attributes, as the transports are."""

    def __init__(self, sock, events):
        self.sock = sock
        self.events = events

    def __call__(self, mask):
        pass


@pytest.fixture(params=[EpollPoller, SelectorPoller])
def poller(request):
    p = request.param()
    yield p
    p.close()


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_read_write_and_modify(poller, pair):
    a, b = pair
    owner = Owner(a, EVENT_READ)
    poller.register(a, EVENT_READ, owner)
    assert poller.select(0) == []
    b.send(b"x")
    assert poller.select(1) == [(owner, EVENT_READ)]
    poller.modify(a, EVENT_READ | EVENT_WRITE, owner)
    assert poller.select(1) == [(owner, EVENT_READ | EVENT_WRITE)]
    a.recv(1)
    poller.modify(a, EVENT_WRITE, owner)
    assert poller.select(1) == [(owner, EVENT_WRITE)]


def test_register_twice_and_unknown_unregister_raise_key_error(poller, pair):
    a, b = pair
    poller.register(a, EVENT_READ, Owner(a, EVENT_READ))
    with pytest.raises(KeyError):
        poller.register(a, EVENT_READ, Owner(a, EVENT_READ))
    with pytest.raises(KeyError):
        poller.unregister(b)
    with pytest.raises(KeyError):
        poller.modify(b, EVENT_READ, None)
    poller.unregister(a)
    b.send(b"x")
    assert poller.select(0) == []


def test_a_socket_closed_while_registered_can_still_be_unregistered(poller, pair):
    a, b = pair
    c, d = socket.socketpair()
    try:
        poller.register(c, EVENT_READ, Owner(c, EVENT_READ))
        c.close()
        poller.unregister(c)
        with pytest.raises(KeyError):
            poller.unregister(c)
        # The number may come back for another socket: it registers cleanly.
        e = socket.socket()
        try:
            poller.register(e, EVENT_READ, Owner(e, EVENT_READ))
            poller.unregister(e)
        finally:
            e.close()
    finally:
        d.close()


def test_a_paused_reader_is_not_told_to_read_when_the_peer_goes(poller, pair):
    # Watched for output only (reading paused): the peer's close must not turn into READ.
    a, b = pair
    owner = Owner(a, EVENT_WRITE)
    poller.register(a, EVENT_WRITE, owner)
    b.send(b"data the paused reader must not read yet")
    b.close()
    events = poller.select(1)
    assert events and all(cb is owner and mask == EVENT_WRITE for cb, mask in events)


def test_timeouts(poller, pair):
    a, _ = pair
    poller.register(a, EVENT_READ, Owner(a, EVENT_READ))
    assert poller.select(0.0004) == []    # rounded up to a millisecond, not a busy zero
    assert poller.select(-1) == []


def test_a_closed_connection_leaves_the_poller_by_its_descriptor():
    """A connection's socket leaves the poller before it is closed: a closed socket (fileno
    -1) is found only by searching every registration, which made a mass disconnect cost the
    square of the connections (8,000 reset at once held the loop 0.5 s). Also while the
    socket is watched for writing, and not at all once unregistered (a TLS transport between
    its first bytes and the wrap)."""
    loop = Loop(0, time.monotonic)
    unregistered = []
    real = loop.selector.unregister

    def unregister(sock):
        unregistered.append(sock.fileno())
        real(sock)

    loop.selector.unregister = unregister
    peers = []
    transports = []
    for i in range(3):
        a, b = socket.socketpair()
        a.setblocking(False)
        peers.append(b)
        t = Transport(loop, a, f"peer{i}")
        loop.transports.add(t)
        loop.selector.register(a, EVENT_READ, t)
        transports.append(t)
    transports[1]._want(EVENT_READ | EVENT_WRITE)
    transports[2]._want(0)
    unregistered.clear()
    fds = [t.sock.fileno() for t in transports]
    for t in transports:
        t.shutdown()
    assert unregistered == fds[:2]
    assert all(t.events == 0 and t.sock.fileno() == -1 for t in transports)
    assert not loop.transports
    assert loop.selector.select(0) == []     # only the wake-up pair is left, and it is quiet
    for b in peers:
        assert b.recv(16) == b""             # closed
        b.close()
