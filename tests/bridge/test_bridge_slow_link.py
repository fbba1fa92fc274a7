"""A healthy but slow link: the bridge's PINGREQ waits behind its own backlog in the link's
buffer; bytes leaving that buffer count as life, so the link is not dropped as dead (and
the QoS 0 messages handed to it are not lost). But bytes leaving after the PINGREQ left do
not: a remote that reads and never answers (a proxy before a dead broker) is found."""

from __future__ import annotations

import socket
import sys
import threading
import time

import mqttraw

from .helpers import Received, bridge_table, figures, wait_figure

RATE = 100_000       # bytes/s from the gateway to the remote
COUNT, SIZE = 500, 1000   # QoS 0 messages: 5 s of the link, over two keepalives
# The gateway's socket send buffer (a slow WAN link's; on loopback it grows to MBs), so the
# backlog waits in the bridge's own link buffer, as it does on a real slow link.
SMALL_SNDBUF = """
import runpy, socket, sys
connect_ex = socket.socket.connect_ex
def small(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        self.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    return connect_ex(self, address)
socket.socket.connect_ex = small
sys.argv[0] = "edgebroker"
runpy.run_module("edgebroker", run_name="__main__", alter_sys=True)
"""


class SlowRelay:
    """Forwards one connection at a time to ``target``: RATE bytes/s towards it (small
    buffers, so the sender feels it), the other way at once."""

    def __init__(self, target: int):
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self.stopped = False
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self.stopped:
            try:
                near, _ = self.server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            far.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
            self.accepted += 1
            self.socks += [near, far]
            threading.Thread(target=self._pipe, args=(near, far, RATE), daemon=True).start()
            threading.Thread(target=self._pipe, args=(far, near, 0), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, rate: int) -> None:
        start, moved = time.monotonic(), 0
        try:
            while not self.stopped:
                data = src.recv(2048 if rate else 65536)
                if not data:
                    break
                dst.sendall(data)
                moved += len(data)
                ahead = moved / rate - (time.monotonic() - start) if rate else 0
                if ahead > 0:
                    time.sleep(ahead)     # the link's pace
        except OSError:
            pass
        for s in (src, dst):
            s.close()

    def close(self) -> None:
        self.stopped = True
        self.server.close()
        for s in self.socks:
            s.close()


def test_a_slow_link_is_not_taken_for_a_dead_one(broker, mosquitto_broker, paho):
    remote = mosquitto_broker()
    central = paho(remote.port, client_id="central")
    assert central.subscribe("q0/#", 0) == [0]
    got = Received(central)
    relay = SlowRelay(remote.port)
    try:
        rules = [{"pattern": "q0/#", "direction": "out", "qos": 0}]
        gw = broker(bridge=[bridge_table(relay.port, rules, keepalive=1)],
                    wrap=lambda cmd: [sys.executable, "-c", SMALL_SNDBUF, *cmd[3:]])
        wait_figure(gw, lambda f: f["state"] == "up")
        pub = gw.client("pub")
        for i in range(COUNT):
            pub.publish("q0/t", str(i).encode().zfill(SIZE), qos=0)
        pub.ping()
        assert got.wait_distinct(COUNT, 30), (len(got.seen), figures(gw))
        fig = figures(gw)
        assert (fig["connects"], relay.accepted, fig["last_error"]) == (1, 1, ""), fig
    finally:
        relay.close()


class Swallower:
    """The remote's end behind the relay: answers the bridge's CONNECT, then reads all that
    comes and answers nothing (not its PINGREQ either), as a proxy in front of a dead
    broker does; bounded by ``seconds``."""

    def __init__(self, seconds: float = 40.0):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.read = 0
        self.stopped = False
        threading.Thread(target=self._serve, args=(seconds,), daemon=True).start()

    def _serve(self, seconds: float) -> None:
        self.server.settimeout(seconds)
        try:
            sock, _ = self.server.accept()
        except OSError:
            return
        deadline = time.monotonic() + seconds
        sock.settimeout(0.5)
        answered = False
        with sock:
            while not self.stopped and time.monotonic() < deadline:
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.read += len(data)
                if not answered:            # the CONNECT came first: CONNACK, then silence
                    sock.sendall(mqttraw.connack(False))
                    answered = True

    def close(self) -> None:
        self.stopped = True
        self.server.close()


def test_a_remote_that_reads_and_never_answers_is_found_while_the_backlog_drains(broker):
    """Bytes leaving the link's buffer pushed the PINGREQ's deadline back even after the
    PINGREQ itself had left, so a link whose far end reads everything and answers nothing
    was kept as long as a QoS 0 stream drained into it (here 15 s); now it is dropped a
    keepalive or two after its PINGREQ left."""
    remote = Swallower()
    relay = SlowRelay(remote.port)
    try:
        rules = [{"pattern": "q0/#", "direction": "out", "qos": 0}]
        gw = broker(bridge=[bridge_table(relay.port, rules, keepalive=1)],
                    wrap=lambda cmd: [sys.executable, "-c", SMALL_SNDBUF, *cmd[3:]])
        wait_figure(gw, lambda f: f["state"] == "up")
        mark = gw.mark()
        pub = gw.client("pub")
        started = time.monotonic()
        for i in range(3 * COUNT):       # 1.5 MB: 15 s of the link
            pub.publish("q0/t", str(i).encode().zfill(SIZE), qos=0)
        pub.ping()
        line = gw.wait_log(lambda ln: "link to" in ln and "PINGRESP" in ln, 12, mark)
        assert line, gw.log_text()[-2000:]
        assert time.monotonic() - started < 12
        assert remote.read < 3 * COUNT * SIZE     # found before the stream was through
    finally:
        relay.close()
        remote.close()
