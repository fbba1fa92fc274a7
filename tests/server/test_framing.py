"""The framing seam (server/framing.py): a framing between a byte stream and the core unframes
what is read, frames what the core writes (also in front of a log-backed chunk's head, whose
payload still leaves with sendfile), sends the endpoint's replies and closes when it says so."""

import os
import selectors
import socket
import struct

import pytest

import mqttraw as m
from edgebroker import config
from edgebroker.core.broker import Broker
from edgebroker.server.framing import LINGER, Framing
from edgebroker.server.transport import Transport
from edgebroker.server.websocket import WebSocketInput

READ = selectors.EVENT_READ


class LengthPrefixed:
    """A toy sans-I/O endpoint: frames are a 2-byte length and the bytes; length 0 closes."""

    open = True
    more = False        # never stops early: no frame without payload bytes

    def __init__(self):
        self.pending = b""
        self.closed = False

    def hold(self, data):
        self.pending += bytes(data)

    def receive(self, data, noise_left=0):
        self.pending += bytes(data)
        mqtt = []
        while len(self.pending) >= 2:
            (n,) = struct.unpack(">H", self.pending[:2])
            if n == 0:
                self.closed = True
                return WebSocketInput(mqtt, b"\0\0", "closed by the peer", True)
            if len(self.pending) < 2 + n:
                break
            mqtt.append(self.pending[2:2 + n])
            self.pending = self.pending[2 + n:]
        return WebSocketInput(mqtt, b"", None, True)

    @staticmethod
    def frame_head(n):
        return struct.pack(">H", n)

    def closing(self, why=0):
        return b"" if self.closed else b"\0\0"


class FakeLoop:
    """What a Transport needs from the server loop."""

    def __init__(self, broker):
        self.selector = selectors.DefaultSelector()
        self.dirty = []
        self.broker = broker
        self.buffer = bytearray(65536)
        self.view = memoryview(self.buffer)
        self.large_budget = 1 << 20
        self.stopping = False

    @staticmethod
    def log_generation():
        return 0

    def forget(self, transport):
        try:
            self.selector.unregister(transport.sock)
        except (KeyError, ValueError):
            pass

    def released(self, transport):
        pass

    def flush(self):
        for t in self.dirty:
            t.dirty = False
            if t.out:
                t.flush()
            if t.closing:
                t.shutdown()
        self.dirty.clear()


@pytest.fixture
def framed():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.settimeout(2)
    broker = Broker(config.from_dict({}), lambda: 100.0)
    loop = FakeLoop(broker)
    stream = Transport(loop, a, "peer")
    loop.selector.register(a, READ, stream)
    stream.sniff = None
    stream.client = framing = Framing(stream, LengthPrefixed())
    framing.client = broker.connection_made(framing)
    yield loop, stream, framing, b
    a.close()
    b.close()


def unframe(data):
    out = b""
    while data:
        (n,) = struct.unpack(">H", data[:2])
        out += data[2:2 + n]
        data = data[2 + n:]
    return out


def recv_all(sock, n):
    data = b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


def test_bytes_are_unframed_in_any_split_and_answers_framed(framed):
    loop, stream, framing, peer = framed
    connect = m.connect("c1")
    wire = struct.pack(">H", 3) + connect[:3] + struct.pack(">H", len(connect) - 3) + connect[3:]
    for i in range(0, len(wire), 5):
        peer.send(wire[i:i + 5])
        stream.on_event(READ)
    assert framing.client.connected
    loop.flush()
    connack = m.connack()
    assert recv_all(peer, 2 + len(connack)) == struct.pack(">H", len(connack)) + connack
    assert framing.out_bytes == 0 and framing.bytes_in == len(wire)


def test_log_backed_output_keeps_its_file_range_behind_the_frame_header(framed, tmp_path):
    loop, stream, framing, peer = framed
    payload = os.urandom(10000)
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 7 + payload)
    fd = os.open(path, os.O_RDONLY)
    try:
        framing.write_file(b"HEAD", fd, 7, len(payload), 0)
        assert stream.out[0].head == struct.pack(">H", 4 + len(payload)) + b"HEAD"
        assert stream.out[0].length == len(payload)      # still a range of the file
        loop.flush()
        got = recv_all(peer, 2 + 4 + len(payload))
    finally:
        os.close(fd)
    assert unframe(got) == b"HEAD" + payload


def closing_handshake(stream, peer, expected):
    """The peer gets ``expected``, then the end of the stream; its end closes the stream (at
    the end of the loop's pass)."""
    assert recv_all(peer, len(expected)) == expected
    assert peer.recv(10) == b""                 # the broker's end (FIN), reading on
    assert not stream.closed
    peer.send(b"\0\0")                          # an answer after the close is dropped
    stream.on_event(READ)
    assert not stream.closed
    peer.shutdown(socket.SHUT_WR)
    stream.on_event(READ)
    stream.loop.flush()
    assert stream.closed


def test_endpoint_close_sends_its_reply_and_ends_the_connection(framed):
    loop, stream, framing, peer = framed
    peer.send(b"\0\0")
    stream.on_event(READ)
    assert framing.client.closed and framing.lingering
    closing_handshake(stream, peer, b"\0\0")


def test_core_facing_figures_and_settings_are_the_streams(framed):
    _, stream, framing, _ = framed
    framing.count_publish()
    framing.wait_for_drain()
    framing.max_pending = 123
    assert (stream.msgs_out, stream.want_drain, stream.max_pending) == (1, True, 123)
    assert framing.offer(b"ab", b"cd") and stream.out == [struct.pack(">H", 4) + b"ab", b"cd"]


def test_a_connection_the_broker_ends_gets_the_endpoints_close_frame(framed):
    loop, stream, framing, peer = framed
    framing.client.close(will=False)
    closing_handshake(stream, peer, b"\0\0")


def test_a_peer_that_never_ends_is_closed_after_the_linger(framed):
    loop, stream, framing, peer = framed
    scheduled = []
    loop.broker.schedule = scheduled.append     # the broker's timer heap, seen from here
    framing.close()
    assert framing.lingering and not stream.closed
    [timer] = scheduled
    assert timer.when == 100.0 + LINGER
    timer.expire()
    loop.flush()
    assert stream.closed


def framed_bytes(packet: bytes) -> bytes:
    return struct.pack(">H", len(packet)) + packet


def test_answers_to_what_came_before_a_close_go_out_before_the_close_frame(framed):
    loop, stream, framing, peer = framed
    peer.send(framed_bytes(m.connect("c1")) + framed_bytes(m.pingreq()) + b"\0\0")
    stream.on_event(READ)
    assert framing.client.closed and framing.lingering
    expected = framed_bytes(m.connack()) + framed_bytes(m.pingresp()) + b"\0\0"
    closing_handshake(stream, peer, expected)


def test_a_lingering_socket_counts_as_open_until_it_closes(framed):
    loop, stream, framing, peer = framed
    broker = loop.broker
    assert broker.sockets_open == 1
    stream.pause_reading("rate")            # a throttled client ...
    framing.client.close(will=False)
    assert framing.lingering and broker.sockets_open == 1
    assert stream.reading                   # ... is read again, to see the peer's end
    closing_handshake(stream, peer, b"\0\0")
    assert broker.sockets_open == 0


def test_a_lingering_socket_stops_counting_when_the_linger_ends(framed):
    loop, stream, framing, peer = framed
    scheduled = []
    loop.broker.schedule = scheduled.append
    framing.client.close(will=False)
    assert loop.broker.sockets_open == 1
    [timer] = scheduled
    timer.expire()
    loop.flush()
    assert stream.closed and loop.broker.sockets_open == 0


class FewFrames(LengthPrefixed):
    """The toy endpoint, reading at most two frames per receive (as the WebSocket endpoint
    stops at MAX_FRAMES), the rest left for a later one."""

    more = False

    def receive(self, data, noise_left=0):
        self.pending += bytes(data)
        mqtt = []
        while len(self.pending) >= 2 and len(mqtt) < 2:
            (n,) = struct.unpack(">H", self.pending[:2])
            if len(self.pending) < 2 + n:
                break
            mqtt.append(self.pending[2:2 + n])
            self.pending = self.pending[2 + n:]
        self.more = len(self.pending) >= 2
        return WebSocketInput(mqtt, b"", None, True, False, b"", 0, self.more)


def test_frames_left_for_the_next_pass_hold_what_a_tls_read_hands_over_meanwhile(framed):
    """A TLS read goes on while OpenSSL holds decrypted bytes, handing the framing more in
    the same pass after its endpoint stopped at its frame bound: those bytes wait behind the
    frames left (they were read at once, another bound's worth each time), and all of them
    are read, in order, from the next pass on."""
    loop, stream, framing, peer = framed
    framing.endpoint = FewFrames()
    loop.broker.schedule = lambda timer: None      # the timers are run by hand below
    framing.data_received(framed_bytes(m.connect("c1")) + framed_bytes(m.pingreq()) * 3)
    assert framing.client.connected and framing.reader.pending  # the rest: a later pass
    framing.data_received(framed_bytes(m.pingreq()) * 4)        # the same pass, from TLS
    framing.data_received(framed_bytes(m.pingreq()) * 4)
    loop.flush()
    answers = framed_bytes(m.connack()) + framed_bytes(m.pingresp())
    assert recv_all(peer, len(answers)) == answers
    peer.settimeout(0.2)
    with pytest.raises(socket.timeout):
        peer.recv(100)                  # nothing more in this pass
    passes = 0
    while framing.reader.pending and passes < 20:   # the later passes: two frames each
        framing.reader.expire()
        loop.flush()
        passes += 1
    assert passes == 5
    pongs = framed_bytes(m.pingresp()) * 10
    peer.settimeout(2)
    assert recv_all(peer, len(pongs)) == pongs

