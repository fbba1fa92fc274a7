"""The topic-table flood of issue 26 (item 3), as a short bounded script.

Ten client ids each publish ``--per-client`` QoS 0 messages to distinct topics (10 x 10,000
at the defaults: as many as ``max_topics``), then a well-behaved client publishes to new
topics at QoS 0 (is it delivered to a subscriber?) and at QoS 1 (PUBACK, or disconnected?).
Prints one JSON line with the figures: how long the flood took, what the well-behaved client
got, and the broker's own counters (topics tracked, limit hits, drops, evictions).

    python3 bench/attack_topics.py                    # this checkout's broker
    python3 bench/attack_topics.py --repo /work/main  # another checkout's (a before figure)

Every wait is bounded (``--timeout``); the broker runs with its default limits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import brokers  # noqa: E402
import mqttraw as m  # noqa: E402


def flood(port: int, clients: int, per_client: int, timeout: float) -> float:
    """Seconds for ``clients`` x ``per_client`` QoS 0 publishes to distinct topics."""
    conns = []
    for c in range(clients):
        raw = m.RawClient("127.0.0.1", port, timeout=timeout)
        raw.connect(f"flood-{c}")
        conns.append(raw)
    start = time.monotonic()
    for c, raw in enumerate(conns):
        raw.send(b"".join(m.publish(f"flood/{c}/{i}", b"x") for i in range(per_client)))
    for raw in conns:
        raw.ping(timeout=timeout)  # PINGRESP after every PUBLISH before it was handled
    took = time.monotonic() - start
    for raw in conns:
        raw.close()
    return took


def well_behaved(port: int, new_topics: int, timeout: float) -> dict:
    sub = m.RawClient("127.0.0.1", port, timeout=timeout)
    sub.connect("good-sub")
    sub.subscribe("good/#", qos=1)
    pub = m.RawClient("127.0.0.1", port, timeout=timeout)
    pub.connect("good-pub")
    for i in range(new_topics):
        pub.publish(f"good/qos0/{i}", b"q0")
    pub.ping(timeout=timeout)
    delivered = sum(1 for p in sub.ping(timeout=timeout) if p.type == m.PUBLISH)
    acked = 0
    closed = False
    for i in range(new_topics):
        pub.send(m.publish(f"good/qos1/{i}", b"q1", qos=1, packet_id=i + 1))
        try:
            pub.wait_for(lambda p: p.type == m.PUBACK, timeout=timeout)
        except (m.ConnectionClosed, OSError, TimeoutError):
            closed = True
            break
        acked += 1
    sub.close()
    pub.close()
    return {"qos0_sent": new_topics, "qos0_delivered": delivered, "qos1_sent": new_topics,
            "qos1_acked": acked, "qos1_disconnected": closed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--per-client", type=int, default=10_000)
    ap.add_argument("--new-topics", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = brokers.parse_with_repo(ap)
    broker = brokers.Edgebroker().start()
    try:
        took = flood(broker.port, args.clients, args.per_client, args.timeout)
        good = well_behaved(broker.port, args.new_topics, args.timeout)
        stats = broker.admin_stats() or {}
    finally:
        broker.stop()
    counters = stats.get("counters", {})
    print(json.dumps({
        "repo": brokers.REPO, "flood_publishes": args.clients * args.per_client,
        "flood_seconds": round(took, 2), **good, "topics": stats.get("topics"),
        "limit_hits": {k: v for k, v in stats.get("limit_hits", {}).items()
                       if k.startswith("max_topics") and v},
        "dropped": {k: v for k, v in stats.get("dropped", {}).items() if v},
        "topics_evicted": counters.get("topics_evicted"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
