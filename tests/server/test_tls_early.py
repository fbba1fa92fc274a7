"""A TLS connection's early send (``send_now`` in the middle of a pass, server/tls.py): a
chunk the TLS layer did not take is offered again as the very same object, and until the
socket has room no further early send is tried; an error in an early send is left for the
pass's own flush. The TLS socket is a stand-in around a real socket pair, to make its
send refuse on cue."""

import errno
import selectors
import socket
import ssl

import pytest

from edgebroker.server.contention import CpuContention
from edgebroker.server.handshakes import HandshakeTimers
from edgebroker.server.tls import OPEN, TLSTransport, load_ssl
from server.test_pause_reasons import FakeLoop

WRITE = selectors.EVENT_WRITE


class RefusingSSL:
    """What TLSTransport.flush uses of an SSLSocket; ``refusals`` say what the next sends
    raise (None: take everything)."""

    def __init__(self, sock, *refusals):
        self.sock = sock
        self.refusals = list(refusals)
        self.offered = []

    def fileno(self):
        return self.sock.fileno()

    def send(self, data):
        self.offered.append(data)
        refusal = self.refusals.pop(0) if self.refusals else None
        if refusal is not None:
            raise refusal
        return len(data)


class Stats:
    bytes_sent = 0


class Limits:
    connect_timeout = 10.0


class Broker:
    stats = Stats()
    limits = Limits()

    def before_send(self):
        pass


@pytest.fixture
def transport():
    load_ssl()            # as a TLS listener does before its first connection
    a, b = socket.socketpair()
    a.setblocking(False)
    loop = FakeLoop(Broker())
    loop.contention = CpuContention(path="")
    loop.handshakes = HandshakeTimers()
    loop.clock = lambda: 0.0
    server = type("Server", (), {"handshake_timeout": 10.0})()
    t = TLSTransport(loop, a, "peer", server)
    loop.selector.register(a, selectors.EVENT_READ, t)
    t.state = OPEN
    yield t
    a.close()
    b.close()


def test_a_refused_early_chunk_is_offered_again_unchanged(transport):
    t = transport
    t.sock = RefusingSSL(t.sock, ssl.SSLWantWriteError())
    t.write(b"a" * 100)
    t.write(b"b" * 100)
    t.send_now()
    assert len(t.sock.offered) == 1 and t.chunk_pending
    chunk = t.out[0]
    assert chunk == b"a" * 100 + b"b" * 100 and t.out_bytes == 200
    assert t.events & WRITE, "watched for room"
    t.write(b"c" * 10)
    t.send_now()                                     # no room yet: not tried again
    assert len(t.sock.offered) == 1
    t.flush()                                        # the socket has room (the loop's call)
    assert t.sock.offered[1] is chunk, "the same object, as OpenSSL requires"
    assert not t.chunk_pending and not t.out and t.out_bytes == 0
    assert not t.events & WRITE


def test_an_error_in_an_early_send_is_left_for_the_pass(transport):
    t = transport
    t.sock = RefusingSSL(t.sock, OSError(errno.EPIPE, "Broken pipe"))
    t.write(b"piece")
    t.send_now()
    assert t.state is OPEN and not t.closed and t.out_bytes == 5
    assert t.events & WRITE, "the pass's flush (on the socket's event) reports it"
    t.send_now()
    assert len(t.sock.offered) == 1, "not tried again in the pass"
