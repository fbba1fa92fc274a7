"""A link that stalls: a scripted server on loopback sends CONNACK and then stops reading (or
reads slowly and never answers). The client's own buffer stays bounded (the asyncio adapter
and the synchronous loop: about ``OUTPUT_HIGH``, 1 MiB, plus one message), QoS 0 producers
wait (asyncio: ``publish`` waits, ``publish_nowait`` raises QueueFull; a QoS 0 publish is
answered once its bytes left the buffer), and the keepalive finds a peer that takes bytes
but never answers (docs/client.md, Back-pressure and Keepalive)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from edgebroker.client import aio
from edgebroker.client.aio import AsyncClient, QueueFull

CONNACK = b"\x20\x02\x00\x00"


class StallServer:
    """Accepts one client, reads its CONNECT, sends CONNACK, then reads nothing until
    ``go`` is set; then reads everything to the end (``got``: the bytes read)."""

    def __init__(self):
        self.sock = socket.socket()
        # a small receive window: the link stalls after a few KiB, not the kernel's MiBs
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.go = threading.Event()
        self.got = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(20)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(20)
            conn.recv(1024)                     # CONNECT
            conn.sendall(CONNACK)
            self.go.wait(20)
            try:
                while data := conn.recv(1 << 16):
                    self.got += len(data)
            except OSError:
                pass
        self.done.set()

    def close(self):
        self.go.set()
        self.sock.close()
        self.thread.join(20)


@pytest.fixture
def stall():
    server = StallServer()
    yield server
    server.close()


def test_aio_qos0_publish_waits_while_the_buffer_is_full(stall):
    """QoS 0 to a server that stopped reading: publish_nowait raises QueueFull once
    OUTPUT_HIGH bytes wait, with the buffer never past it by more than one message; the
    futures of QoS 0 publishes still in the buffer are not answered; publish() waits, and
    goes on (with every earlier future answered) once the server reads again."""
    payload = b"q" * (64 << 10)
    most = aio.OUTPUT_HIGH + len(payload) + 16

    async def main():
        c = AsyncClient(f"mqtt://127.0.0.1:{stall.port}", "stall", keepalive=0,
                        reconnect="never")
        await c.connect()
        futures = []
        full = None
        for i in range(800):                    # 50 MiB at most: past any kernel buffer
            try:
                futures.append(c.publish_nowait("t", payload))
            except QueueFull as exc:
                full = exc
                break
            await asyncio.sleep(0)              # the deferred flush runs
            assert len(c._out) <= most
        assert full is not None, f"{len(c._out)} bytes wait, and no QueueFull"
        assert "OUTPUT_HIGH" in str(full)
        assert not futures[-1].done()           # its bytes have not left for the socket
        waiting = asyncio.ensure_future(c.publish("t", payload))
        await asyncio.sleep(0.3)
        assert not waiting.done() and len(c._out) <= most
        stall.go.set()
        ack = await asyncio.wait_for(waiting, 10)
        assert ack.reason_code == 0
        assert all(f.done() and f.result().reason_code == 0 for f in futures)
        await c.disconnect()
        return len(futures) + 1

    sent = asyncio.run(asyncio.wait_for(main(), 30))
    assert stall.done.wait(10)
    assert stall.got >= sent * len(payload)


class SilentReader:
    """Sends CONNACK, then only reads (``pace``: 16 KiB each ``pace`` seconds, a slow link;
    0: as fast as it can), never answering; notes when the first PINGREQ came in."""

    def __init__(self, pace: float):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.pace = pace
        self.ping_seen: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(20)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(1)
            conn.recv(1024)                     # CONNECT
            conn.sendall(CONNACK)
            buf = bytearray()
            end = time.monotonic() + 20
            while not self.stop.is_set() and time.monotonic() < end:
                try:
                    data = conn.recv(16384)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
                self._frames(buf)
                if self.pace:
                    self.stop.wait(self.pace)   # the slow link

    def _frames(self, buf: bytearray) -> None:
        while len(buf) >= 2:
            size, shift, i = 0, 0, 1
            while i < len(buf) and i < 5:
                size |= (buf[i] & 0x7F) << shift
                shift += 7
                i += 1
                if not buf[i - 1] & 0x80:
                    break
            else:
                return                          # the length is not all here yet
            if len(buf) < i + size:
                return
            if buf[0] == 0xC0 and self.ping_seen is None:
                self.ping_seen = time.monotonic()
            del buf[:i + size]

    def close(self):
        self.stop.set()
        self.sock.close()
        self.thread.join(20)


@pytest.mark.parametrize("pace", [0.02, 0.0], ids=["slow-reader", "fast-reader"])
def test_sync_keepalive_finds_a_peer_that_reads_but_never_answers(pace):
    """keepalive 1 s, a QoS 0 stream to a peer that reads (slowly, or at once) and never
    answers: PingTimeout comes; bytes leaving the loop's buffer after the PINGREQ left are
    no sign of life, so it comes within a keepalive of the PINGREQ reaching the peer (and
    within 2N of the CONNACK when nothing waits in the loop's buffer)."""
    from edgebroker.client.events import Disconnected, PingTimeout
    from edgebroker.client.loop import EventLoop

    peer = SilentReader(pace)

    def stream():
        while True:
            yield ("t", b"y" * 200, 0)

    loop = EventLoop("127.0.0.1", peer.port, client_id="ka", keepalive=1, requests=stream(),
                     reconnect="never")
    try:
        start = time.monotonic()
        got = None
        while got is None and time.monotonic() - start < 15:
            event = loop.poll(0.5)
            if type(event) in (PingTimeout, Disconnected):
                got = event
        at = time.monotonic()
        assert type(got) is PingTimeout, f"after {at - start:.1f} s: {got!r}"
        if peer.ping_seen is not None:
            assert at - peer.ping_seen <= 1 + 1.0
        if not pace:
            assert at - start <= 2 * 1 + 1.0
    finally:
        loop.shutdown()
        peer.close()


def test_sync_loop_takes_no_request_past_1_mib_waiting(stall):
    """256 KiB QoS 0 messages to a server that stopped reading: the loop stops taking
    requests once 1 MiB waits for the socket, the connection's bytes not yet moved to its
    buffer counted too (not 256 requests of any size per pass); all go once it reads."""
    from edgebroker.client import loop as L
    from edgebroker.client.events import Acked, Connected

    size = 256 << 10
    taken = 0

    def stream():
        nonlocal taken
        while loop.conn.state != "connected":   # (what is queued before goes at CONNACK)
            yield None
        for _ in range(400):                    # 100 MiB at most
            taken += 1
            yield ("t", b"z" * size, 0)

    loop = L.EventLoop("127.0.0.1", stall.port, client_id="ob", keepalive=0,
                       requests=stream(), reconnect="never")
    try:
        while type(loop.poll(5)) is not Connected:
            pass
        peak = 0
        for _ in range(20):                     # ~2 s of passes, the link stalled
            loop.poll(0.1)
            peak = max(peak, len(loop._out))
        assert peak <= L.OUTPUT_HIGH + size + 64
        stalled_at = taken
        assert stalled_at < 400
        stall.go.set()
        acked = 0
        end = time.monotonic() + 30
        while not loop.idle and time.monotonic() < end:
            event = loop.poll(1)
            acked += type(event) is Acked
        assert loop.idle and taken == 400
    finally:
        loop.shutdown()
    assert stall.done.wait(10)
    assert stall.got >= 400 * size
