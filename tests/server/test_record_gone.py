"""QoS 1/2 PUBLISHes queued on a connection with their payloads in a log segment (FileChunks),
whose segment retention deletes before they go out: the transport drops them
(Transport._relocate), counts them as lost, and their places in the session's window are let
go of in the next pass (QoS 1 freed, QoS 2 released with PUBREL, core.resume), so the
subscriber goes on receiving; also with a framing (as WebSocket) between the transport and the
core. The real core and the server's Transport over a socketpair, with a real log."""

import selectors
import socket
import time

import pytest

import mqttraw as m
from edgebroker import config
from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.log import CommitLog
from edgebroker.core.broker import Broker
from edgebroker.core.testing import FakeTransport
from edgebroker.server.framing import Framing
from edgebroker.server.transport import FileChunk, Transport
from server.test_framing import LengthPrefixed, unframe
from server.test_pause_reasons import FakeLoop

WINDOW = 3


class LogLoop(FakeLoop):
    """What a Transport asks of the loop about the log, and the pass's flush."""

    def __init__(self, broker, log):
        super().__init__(broker)
        self.log = log
        self.contention = type("NotContended", (), {"contended": False})()

    def log_generation(self):
        return self.log.counters.segments_deleted

    def locate(self, offset):
        return self.log.locate(offset)

    def released(self, transport):
        self.forget(transport)

    def flush(self):
        for t in list(self.dirty):
            t.dirty = False
            if not t.closed and (t.out or t.want_drain):
                t.flush()
        self.dirty.clear()


def _fake_client(core, client_id, clean):
    t = FakeTransport(client_id)
    c = t.client = core.connection_made(t)
    c.data_received(m.connect(client_id, clean=clean))
    return c


def _read(peer, loop, transport, framed: bool) -> list:
    """The packets the subscriber reads until the broker has nothing more to send."""
    got = bytearray()
    for _ in range(200):
        loop.flush()
        transport.flush()
        try:
            got += peer.recv(1 << 16)
        except socket.timeout:
            if not transport.out:
                break
    return m.split_frames(bytearray(unframe(bytes(got))) if framed else got)


@pytest.mark.parametrize("framed", [False, True], ids=["plain", "framed"])
@pytest.mark.parametrize("qos", [1, 2])
def test_publishes_whose_records_are_deleted_before_they_go_out_let_go_of_the_window(
        tmp_path, caplog, qos, framed):
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(segment_bytes=4096,
                                                           retention_bytes=1 << 20))
    core = Broker(config.from_dict({"limits": {"max_inflight_messages": WINDOW,
                                               "queue_qos0_messages": True}}),
                  time.monotonic, commit_log=log, wall_ms=lambda: time.time_ns() // 1_000_000)
    loop = LogLoop(core, log)
    a, peer = socket.socketpair()
    try:
        sub = _fake_client(core, "s", clean=False)
        sub.data_received(m.subscribe(1, [("small", 0), ("big", qos)]))
        sub.data_received(m.disconnect())
        pub = _fake_client(core, "p", clean=True)
        # First a QoS 0 message that fills the socket's buffers when it comes back.
        pub.data_received(m.publish("small", b"s" + b"." * 15000, qos=0))
        for i in range(WINDOW + 2):
            pub.data_received(m.publish("big", b"B%d" % i + b"." * 20000, qos=qos,
                                        packet_id=1 + i))
        core.end_pass()
        # Back on a real socket it does not read yet: behind the QoS 0 message, the window
        # waits in the transport as chunks of the segment files, none started.
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        a.setblocking(False)
        t = Transport(loop, a, "peer")
        loop.selector.register(a, selectors.EVENT_READ, t)
        if framed:
            t.sniff = None
            t.client = framing = Framing(t, LengthPrefixed())
            c = framing.client = core.connection_made(framing)
        else:
            c = t.client = core.connection_made(t)
        c.data_received(m.connect("s", clean=False))
        core.end_pass()
        loop.flush()
        session = core.sessions["s"]
        assert len(session.inflight) == WINDOW
        chunks = [x for x in t.out if type(x) is FileChunk]
        assert len(chunks) == WINDOW and t.file_progress == 0
        # The disk limit deletes the segments of all of them, so no acknowledgement of
        # theirs moves the window on.
        for i in range(4):
            pub.data_received(m.publish("other", b"x" * 5000, qos=1, packet_id=100 + i))
            core.end_pass()
        log.options = LogOptions(segment_bytes=4096, retention_bytes=4096)
        log.housekeeping()
        big = range(chunks[0].offset, chunks[0].offset + WINDOW + 2)    # B0 ... B4
        gone = [offset for offset in big if log.locate(offset) is None]
        assert gone == list(big)
        lost = core.stats.publish_lost
        peer.settimeout(0.2)
        got = []
        released = []
        for _ in range(10):                    # read and answer until nothing comes
            frames = _read(peer, loop, t, framed)
            core.tick(time.monotonic())        # the next pass's timers
            core.end_pass()
            if not frames:
                if not t.out:
                    break
                continue
            got += [p for p in frames if p.type == m.PUBLISH]
            released += [p.packet_id for p in frames if p.type == m.PUBREL]
            c.data_received(b"".join(m.pubcomp(p.packet_id) if p.type == m.PUBREL else
                                     m.puback(p.packet_id) for p in frames if p.packet_id))
        assert core.stats.publish_lost == lost + len(gone)
        warned = [r.getMessage() for r in caplog.records if "no longer in the log" in
                  r.getMessage()]
        assert len(warned) == 1 and "client 's'" in warned[0], warned    # logged once
        assert not session.inflight            # nothing held for what was dropped
        # QoS 2: a client that holds a packet id from an earlier send lets go of it.
        assert len(released) == (WINDOW if qos == 2 else 0)
        # What was not deleted came, in order, and a live message comes too.
        pub.data_received(m.publish("big", b"live", qos=qos, packet_id=200))
        core.end_pass()
        got += _read(peer, loop, t, framed)
        assert [p.payload for p in got if p.topic == "big"] == [b"live"]
    finally:
        a.close()
        peer.close()
        log.close()
