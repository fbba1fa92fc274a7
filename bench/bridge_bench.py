"""The ``bridge_drain`` scenario of bench/run.py (issue 25): a backlog in the gateway's log
drained by a ``[[bridge]]`` to a loopback Mosquitto.

The gateway (edgebroker) starts with a bridge to a port where no broker listens yet; one
client publishes ``count`` QoS 0 messages of 64 B to ``bench/0`` (pipelined, then one QoS 1
PUBLISH whose PUBACK says all are logged); the bridge cannot forward, so they wait in the log.
Then Mosquitto starts on that port: the bridge connects and forwards the backlog with QoS 1
(window 100). Figures: msg/s from Mosquitto's start to the bridge's last acknowledgement
(the bridge's own ``forwarded`` count, from the admin socket), the gateway's RSS with the
backlog, its peak during the drain (VmHWM, reset before the drain) and at the end, and the
growth of its anonymous memory (the heap) over the drain.

Only edgebroker has bridges here; for Mosquitto the scenario records "not applicable".
"""

from __future__ import annotations

import socket
import time

import brokers
import wire
from procs import RunError, start_broker, stop_broker

HOST = "127.0.0.1"
PAYLOAD = 64
TOPIC = "bench/0"
CHUNK = 10_000       # PUBLISHes per sendall
POLL = 0.25          # s between looks at the bridge's figures


def _publish_backlog(port: int, count: int, time_limit: float) -> float:
    """``count`` QoS 0 PUBLISHes, then a QoS 1 one acknowledged: returns the seconds taken."""
    started = time.monotonic()
    with socket.create_connection((HOST, port), timeout=time_limit) as sock:
        sock.sendall(wire.connect(f"bench-bridge-pub-{port}"))
        if not sock.recv(4):
            raise RunError("the gateway closed the publisher's connection")
        frames = wire.publish(TOPIC, b"x" * PAYLOAD, 0) * CHUNK
        sent = 0
        while sent < count:
            n = min(CHUNK, count - sent)
            sock.sendall(frames if n == CHUNK else wire.publish(TOPIC, b"x" * PAYLOAD, 0) * n)
            sent += n
        sock.sendall(wire.publish(TOPIC, b"end", 1, packet_id=1))
        buf = b""
        while wire.puback(1) not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                raise RunError("the gateway closed the publisher's connection before PUBACK")
            buf = buf[-8:] + chunk
    return time.monotonic() - started


def _bridge(gateway) -> dict | None:
    stats = gateway.admin_stats()
    return stats["bridges"][0] if stats and stats.get("bridges") else None


def run_bridge_drain(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    assert broker_cls.name == "edgebroker", "Mosquitto is the remote end of the bridge"
    count = max(1, int(spec["count"] * args.scale))
    limit = args.time_limit or spec["time_limit"]
    remote = brokers.Mosquitto({"mosquitto": ["max_queued_messages 0"]})
    table = (f'\n[[bridge]]\nname = "bench"\naddress = "{HOST}:{remote.port}"\n'
             f'window = {spec["window"]}\nreconnect_min = 0.05\nreconnect_max = 0.1\n'
             f'topic = [{{pattern = "bench/#", direction = "out", qos = 1}}]\n')
    gateway = start_broker(brokers.Edgebroker, {"toml": table})
    try:
        publish_s = _publish_backlog(gateway.port, count, limit)
        fig = _bridge(gateway)
        if fig is None or fig["state"] == "up":
            raise RunError(f"the bridge is not waiting for its remote: {fig}")
        rss_backlog = gateway.rss_bytes()
        parts_backlog = gateway.rss_parts()
        peak_known = gateway.reset_peak_rss()
        rss_samples = [rss_backlog]
        started = time.monotonic()
        start_broker(lambda cfg: remote)
        deadline = started + limit
        while True:
            fig = _bridge(gateway)
            rss_samples.append(gateway.rss_bytes())
            if fig is not None and fig["forwarded"] >= count + 1:
                break
            if time.monotonic() > deadline:
                raise RunError(f"the bridge forwarded {fig and fig['forwarded']} of {count + 1} "
                               f"in {limit:g} s")
            time.sleep(POLL)
        drain_s = time.monotonic() - started
        peak = gateway.peak_rss_bytes() if peak_known else None
        peak = max(peak or 0, max(rss_samples))
        rss_end = gateway.rss_bytes()
        parts_end = gateway.rss_parts()
    finally:
        stop_broker(gateway)
        stop_broker(remote)
    mb = 2 ** 20
    return {
        "value": round((count + 1) / drain_s, 1), "unit": spec["unit"],
        "messages": count + 1, "drain_s": round(drain_s, 3), "publish_s": round(publish_s, 3),
        "resent": fig["resent"], "reconnects": fig["reconnects"],
        "broker_rss_backlog_mb": round(rss_backlog / mb, 1),
        "broker_rss_peak_mb": round(peak / mb, 1), "broker_rss_mb": round(rss_end / mb, 1),
        "rss_growth_mb": round((peak - rss_backlog) / mb, 1),
        "broker_rss_parts_backlog": parts_backlog, "broker_rss_parts_end": parts_end,
        # The heap (anonymous memory) from backlog to end: what "flat" is about. The rest of
        # the growth is file-backed: the log's index files, memory-mapped, whose pages the
        # reads touch (page cache the kernel may drop).
        "rss_anon_growth_mb": (round(parts_end["anon_mb"] - parts_backlog["anon_mb"], 1)
                               if parts_end and parts_backlog else None),
        "payload": PAYLOAD, "window": spec["window"], "time_limit": limit,
    }
