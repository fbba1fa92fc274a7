"""Wrong passwords from an address legitimate users share (issue 26, item 7), as a short
bounded script.

Two parts, against one fresh broker with a password file (users ``x`` and ``y``), every
client from 127.0.0.1:

1. lockout: an attacker sends bursts of ``--burst`` wrong passwords for ``x`` every
   ``--period`` seconds, while ``x`` and ``y`` each log in with the right password once a
   second, for ``--seconds``; how many of their logins were accepted and refused;
2. brute force: ``--attempts`` wrong passwords for ``x`` (``--parallel`` connections at a
   time); how many got a password check (CONNACK 4: the hash was computed) and how many
   were refused without one (CONNACK 5).

    python3 bench/attack_logins.py                    # this checkout's broker
    python3 bench/attack_logins.py --repo /work/main  # another checkout's (a before figure)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import brokers  # noqa: E402
import mqttraw as m  # noqa: E402
from secfiles import write_passwords  # noqa: E402

PASSWORDS = {"x": "x-right-password", "y": "y-right-password"}


class PasswordBroker(brokers.Edgebroker):
    password_file = ""

    def command(self) -> list[str]:
        cmd = super().command()
        cfg = cmd[cmd.index("-c") + 1]
        with open(cfg) as fh:
            text = fh.read()
        with open(cfg, "w") as fh:
            fh.write(f"password_file = {self.password_file!r}\n{text}")
        return cmd


def login(port: int, client_id: str, user: str, password: str) -> int:
    raw = m.RawClient("127.0.0.1", port, timeout=30)
    try:
        return raw.connect(client_id, username=user, password=password, timeout=30).rc
    finally:
        raw.close()


def lockout(port: int, seconds: float, period: float, burst: int) -> dict:
    counts = {"x_accepted": 0, "x_refused": 0, "y_accepted": 0, "y_refused": 0}
    start = time.monotonic()
    next_burst = start
    tick = 0
    while time.monotonic() - start < seconds:
        now = time.monotonic()
        if now >= next_burst:
            for i in range(burst):
                login(port, f"attacker-{tick}-{i}", "x", f"guess-{tick}-{i}")
            next_burst += period
        for user in ("x", "y"):
            rc = login(port, f"legit-{user}", user, PASSWORDS[user])
            counts[f"{user}_{'accepted' if rc == 0 else 'refused'}"] += 1
        tick += 1
        time.sleep(max(0.0, start + tick - time.monotonic()))
    return counts


def brute_force(port: int, attempts: int, parallel: int) -> dict:
    codes: dict[int, int] = {}
    started = time.monotonic()
    for first in range(0, attempts, parallel):
        batch = []
        for i in range(first, min(attempts, first + parallel)):
            raw = m.RawClient("127.0.0.1", port, timeout=60)
            raw.send(m.connect(f"brute-{i}", username="x", password=f"brute-{i}"))
            batch.append(raw)
        for raw in batch:
            rc = raw.expect(m.CONNACK, timeout=60).rc
            codes[rc] = codes.get(rc, 0) + 1
            raw.close()
    return {"attempts": attempts, "checked_connack4": codes.get(4, 0),
            "refused_unchecked_connack5": codes.get(5, 0),
            "other": {k: v for k, v in codes.items() if k not in (4, 5)},
            "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--period", type=float, default=60.0)
    ap.add_argument("--burst", type=int, default=10)
    ap.add_argument("--attempts", type=int, default=5000)
    ap.add_argument("--parallel", type=int, default=50)
    args = brokers.parse_with_repo(ap)
    with tempfile.TemporaryDirectory() as tmp:
        PasswordBroker.password_file = str(write_passwords(
            Path(tmp) / "passwd", PASSWORDS))
        out = {"repo": brokers.REPO}
        broker = PasswordBroker({"limits": {"max_connection_rate": 0}}).start()
        try:
            out["lockout"] = lockout(broker.port, args.seconds, args.period, args.burst)
        finally:
            broker.stop()
        broker = PasswordBroker({"limits": {"max_connection_rate": 0}}).start()
        try:
            out["brute_force"] = brute_force(broker.port, args.attempts, args.parallel)
            stats = broker.admin_stats() or {}
            out["brute_force"]["password_checks"] = stats.get("counters", {}).get(
                "password_checks")
        finally:
            broker.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
