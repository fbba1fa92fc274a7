"""What the bridge tests share: a pipelined QoS 1 publisher over the raw client, a remote
subscriber that keeps every payload it gets, the bridge's figures, its config table, and a
remote the test plays itself (``FakeRemote``: every byte the bridge gets is the test's)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import mqttraw
import mqttraw5
from client.blocking import raw_over

PIPELINE = 1000     # QoS 1 PUBLISHes sent before their PUBACKs are read


def bridge_table(remote_port: int, rules: list[dict], **settings) -> dict:
    """A [[bridge]] table to ``127.0.0.1:remote_port`` that reconnects quickly."""
    return {"name": "up", "address": f"127.0.0.1:{remote_port}", "reconnect_min": 0.05,
            "reconnect_max": 0.5, "topic": rules, **settings}


def publish_range(client: mqttraw.RawClient, topic: str, start: int, end: int,
                  timeout: float = 60.0, size: int = 0) -> None:
    """Publish payloads ``str(i)`` (zero-padded to ``size`` bytes) for ``start <= i < end``
    with QoS 1, PIPELINE at a time; returns once every one was acknowledged."""
    deadline = time.monotonic() + timeout
    for low in range(start, end, PIPELINE):
        high = min(end, low + PIPELINE)
        pids = set()
        frames = []
        for i in range(low, high):
            pid = client.next_pid()
            pids.add(pid)
            frames.append(mqttraw.publish(topic, str(i).encode().zfill(size), 1,
                                          packet_id=pid))
        client.send(b"".join(frames))
        while pids:
            p = client.wait_for(lambda p: p.type == mqttraw.PUBACK,
                                max(0.1, deadline - time.monotonic()))
            pids.discard(p.packet_id)


class Received:
    """The payloads (as ints) a paho subscriber got, in order, drained from its queue."""

    def __init__(self, paho_client):
        self.client = paho_client
        self.order: list[int] = []
        self.seen: set[int] = set()

    def drain(self, wait: float = 0.0) -> int:
        try:
            while True:
                msg = self.client.messages.get(timeout=wait) if wait else \
                    self.client.messages.get_nowait()
                value = int(msg.payload)
                self.order.append(value)
                self.seen.add(value)
                wait = 0.0
        except Exception:   # queue.Empty
            return len(self.seen)

    def wait_distinct(self, n: int, timeout: float) -> bool:
        """Until ``n`` distinct payloads arrived (bounded)."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < n and time.monotonic() < deadline:
            self.drain(wait=0.2)
        return len(self.seen) >= n

    def duplicates(self) -> list[int]:
        counts: dict[int, int] = {}
        for value in self.order:
            counts[value] = counts.get(value, 0) + 1
        return sorted(v for v, c in counts.items() if c > 1)


def figures(broker, name: str = "up") -> dict:
    found = [b for b in broker.admin("bridges")["bridges"] if b["name"] == name]
    assert found, f"no bridge {name!r}"
    return found[0]


def wait_figure(broker, pred, timeout: float = 10.0, name: str = "up") -> dict:
    """The bridge's figures once ``pred(figures)`` holds (bounded; fails with the last ones)."""
    deadline = time.monotonic() + timeout
    while True:
        fig = figures(broker, name)
        if pred(fig):
            return fig
        assert time.monotonic() < deadline, f"bridge figures never matched: {fig}"
        time.sleep(0.05)


def gateway_up(broker, remote: "FakeRemote", rules: list[dict], local_filter: str):
    """A gateway bridged to ``remote`` with ``rules``, the link up, and a local QoS 1
    subscriber to ``local_filter``: (gateway, the remote's end of the link, subscriber)."""
    gw = broker(bridge=[bridge_table(remote.port, rules)])
    end = remote.accept()
    wait_figure(gw, lambda f: f["state"] == "up")
    local = gw.client("local")
    local.subscribe(local_filter, qos=1)
    return gw, end, local


def checkpoint(data_dir: str | Path, name: str = "up") -> dict:
    return json.loads((Path(data_dir) / f"bridge-{name}.json").read_text())


class FakeRemote:
    """A listening socket on loopback that the test answers as an MQTT 3.1.1 server."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.ends: list[mqttraw.RawClient] = []

    def accept(self, session_present: bool = False, timeout: float = 10.0,
               released: int = 0, subscribe: bool = True, rc: int = 0) -> mqttraw.RawClient:
        """The remote's end of the bridge's next connection (a RawClient over the accepted
        socket): its CONNECT answered (CONNACK), ``released`` PUBRELs expected (for packet
        ids 1 to that: a restart's, bridge/release.py) and answered, then its SUBSCRIBE
        (SUBACK granting what it asked). With ``session_present``, the PUBRELs a reconnect
        sends before it for the ids of the bridge's range not in flight (release.py) are
        answered too, their ids kept in ``end.pool_released``. ``subscribe`` False: the end
        once the CONNACK is sent (a bridge that does not read the link cannot see PUBCOMPs,
        and its SUBSCRIBE waits behind its PUBRELs). ``rc``: the CONNACK's return code (not 0:
        the end once it is sent). ``end.level``: the CONNECT's protocol level byte."""
        self.server.settimeout(timeout)
        sock, _ = self.server.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end = raw_over(None)          # RawClient's fields, then the accepted socket
        end.sock = sock
        self.ends.append(end)
        end.level = end.expect(mqttraw.CONNECT, timeout).body[6]
        end.send(mqttraw.connack(session_present, rc))
        if not subscribe or rc:
            return end
        pids = [end.expect(mqttraw.PUBREL, timeout).packet_id for _ in range(released)]
        assert pids == list(range(1, released + 1)), pids
        end.send(b"".join(mqttraw.pubcomp(pid) for pid in pids))
        end.pool_released = []
        while True:
            sub = end.recv_packet(timeout)
            if sub.type != mqttraw.PUBREL or not session_present:
                break
            end.pool_released.append(sub.packet_id)
            end.send(mqttraw.pubcomp(sub.packet_id))
        assert sub.type == mqttraw.SUBSCRIBE, f"expected SUBSCRIBE, got {sub!r}"
        end.send(mqttraw.suback(int.from_bytes(sub.body[:2], "big"), [sub.body[-1]]))
        return end

    def close(self) -> None:
        for end in self.ends:
            end.close()
        self.server.close()


class FakeRemote5(FakeRemote):
    """``FakeRemote`` speaking MQTT 5.0 (frames built and parsed with mqttraw5): ``accept``
    answers the bridge's CONNECT with ``connack`` (default: success, no properties) and
    expects no SUBSCRIBE (for bridges with out rules only)."""

    def accept(self, connack: bytes | None = None,
               timeout: float = 10.0) -> mqttraw5.RawClient5:
        self.server.settimeout(timeout)
        sock, _ = self.server.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end = raw_over(None)
        end.__class__ = mqttraw5.RawClient5     # the same fields; 5.0 frames
        end.sock = sock
        self.ends.append(end)
        end.expect(mqttraw5.CONNECT, timeout)
        end.send(mqttraw5.connack5() if connack is None else connack)
        return end


def scrape_when(broker, metric: str, label: str, value, timeout: float = 5.0) -> dict:
    """The broker's /metrics samples once ``(metric, label)`` has ``value`` (bounded: the
    endpoint's snapshot is made every second)."""
    from core.test_metrics import METRICS_RE, scrape
    host, port = METRICS_RE.search(broker.wait_log(METRICS_RE)).groups()
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(f"http://{host}:{port}/metrics")
        if samples.get((metric, label)) == value:
            return samples
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)
