"""Persistent sessions piling up (issue 26, item 4), as a short bounded script.

``--sessions`` client ids each connect with clean session 0, subscribe to one filter and
disconnect, leaving an offline persistent session (a fuzz run left 8,735). Prints one JSON
line: how many were accepted and refused (CONNACK 3), the broker's session count and the
resident memory they added, and, with ``--expiration``, how many are left after that many
seconds (``persistent_client_expiration``) plus five, and when the last one went (counted
from the last disconnect).

    python3 bench/attack_sessions.py --sessions 20000
    python3 bench/attack_sessions.py --sessions 20000 --limits max_sessions=10000
    python3 bench/attack_sessions.py --sessions 2000 --expiration 2
    python3 bench/attack_sessions.py --repo /work/main   # another checkout (a before figure)
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


def leave_sessions(port: int, count: int, timeout: float) -> tuple[int, int]:
    """(accepted, refused with CONNACK 3) of ``count`` persistent sessions left offline."""
    accepted = refused = 0
    deadline = time.monotonic() + timeout
    for i in range(count):
        if time.monotonic() > deadline:
            break
        raw = m.RawClient("127.0.0.1", port, timeout=10)
        ack = raw.connect(f"orphan-{i}", clean=False)
        if ack.rc == 0:
            raw.subscribe(f"orphan/{i}/#", qos=1)
            raw.disconnect()
            accepted += 1
        else:
            assert ack.rc == 3, ack
            raw.close()
            refused += 1
    return accepted, refused


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--expiration", type=float, default=0.0,
                    help="persistent_client_expiration (s); 0: not set")
    ap.add_argument("--limits", action="append", default=[], metavar="KEY=INT",
                    help="another [limits] value, e.g. max_sessions=10000")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = brokers.parse_with_repo(ap)
    limits = {"max_connection_rate": 0}
    if args.expiration:
        limits["persistent_client_expiration"] = args.expiration
    for item in args.limits:
        key, value = item.split("=", 1)
        limits[key] = int(value)
    broker = brokers.Edgebroker({"limits": limits}).start()
    try:
        rss0 = broker.rss_bytes()
        start = time.monotonic()
        accepted, refused = leave_sessions(broker.port, args.sessions, args.timeout)
        took = time.monotonic() - start
        stats = broker.admin_stats() or {}
        rss1 = broker.rss_bytes()
        left = gone_after = None
        if args.expiration:
            ended = time.monotonic()
            deadline = ended + args.expiration + 5
            while time.monotonic() < deadline:
                left = (broker.admin_stats() or {}).get("sessions")
                if left == 0:
                    gone_after = round(time.monotonic() - ended, 1)
                    break
                time.sleep(0.2)
        after = broker.admin_stats() or {}
    finally:
        broker.stop()
    print(json.dumps({
        "repo": brokers.REPO, "tried": args.sessions, "accepted": accepted, "refused": refused,
        "seconds": round(took, 1), "sessions": stats.get("sessions"),
        "rss_added_mb": round((rss1 - rss0) / 1e6, 1),
        "bytes_per_session": round((rss1 - rss0) / max(1, accepted)),
        "refused_by_reason": {k: v for k, v in stats.get("refused", {}).items() if v},
        "sessions_after_expiration": left,
        "all_gone_after_s": gone_after,
        "sessions_expired": after.get("counters", {}).get("sessions_expired"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
