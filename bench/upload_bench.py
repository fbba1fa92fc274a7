#!/usr/bin/env python3
"""What the uploader costs the gateway (issue 23): CPU per MB shipped and RSS at a steady rate.

    .venv/bin/python bench/upload_bench.py                      # 5,000 msg/s of 100 B, 30 s
    .venv/bin/python bench/upload_bench.py --rate 2000 --seconds 20 --rounds 3

Side by side in one run, alternating: the same broker and load without ``[upload]`` and with
``url = "file://<temporary landing folder>"`` and ``batch_max_age = 5`` (so batches are cut by
size and by age during the run). The uploader's cost is the difference in broker CPU between the
two (its thread's own time cannot be told apart from the process's), over the bytes it shipped.
Both runs report the broker's peak RSS. The load: one QoS 0 publisher, paced per 10 ms, to one
topic, random payloads (the compressor's worst case); nobody subscribes (the broker logs every
message). Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import mqttraw as m  # noqa: E402  (the tests' independent encoder)

READY_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir: str, upload: str | None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    config = os.path.join(workdir, "edgebroker.toml")
    with open(config, "w") as fh:
        fh.write(f'data_dir = "{workdir}/data"\n')
        if upload:
            fh.write(f'[upload]\nurl = "file://{upload}"\ngateway_id = "bench"\nbatch_max_age = 5\n')
    proc = subprocess.Popen([sys.executable, "-m", "edgebroker", "serve", "-c", config,
                             "--listen", f"127.0.0.1:{port}"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "log"), "w"))
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise SystemExit(f"the broker did not listen within {READY_TIMEOUT} s (log in {workdir})")


def publish(port: int, rate: int, seconds: float, size: int, proc: psutil.Process) -> tuple[int, int]:
    """Send ``rate`` QoS 0 messages per second for ``seconds``; (messages sent, peak RSS)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(m.connect("upload-bench", keepalive=0))
    assert sock.recv(4)[:1] == b"\x20"
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    # Random payloads (compressing them is the uploader's worst case), a different set per tick.
    frames = [m.publish("bench/upload", os.urandom(size)) for _ in range(per_tick * 16)]
    chunks = [b"".join(frames[k * per_tick:(k + 1) * per_tick]) for k in range(16)]
    sent = peak = 0
    start = time.monotonic()
    next_tick = start
    while time.monotonic() - start < seconds:
        sock.sendall(chunks[(sent // per_tick) % 16])
        sent += per_tick
        next_tick += tick
        if sent % (per_tick * 100) == 0:
            peak = max(peak, proc.memory_info().rss)
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    sock.sendall(m.disconnect())
    sock.close()
    return sent, max(peak, proc.memory_info().rss)


def one(upload: bool, args) -> dict:
    workdir = tempfile.mkdtemp(prefix="upload-bench-")
    landing = os.path.join(workdir, "landing") if upload else None
    if landing:
        os.mkdir(landing)
    proc, port = start(workdir, landing)
    ps = psutil.Process(proc.pid)
    try:
        time.sleep(1.0)                         # settle after start
        cpu0 = sum(ps.cpu_times()[:2])
        sent, peak = publish(port, args.rate, args.seconds, args.size, ps)
        time.sleep(6.0 if upload else 1.0)      # the last age-cut batch goes out
        cpu = sum(ps.cpu_times()[:2]) - cpu0
        shipped = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(landing)
                      for f in fs if f.endswith(".ebb.zst")) if landing else 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"sent": sent, "cpu_s": cpu, "peak_rss": peak, "shipped": shipped,
            "seconds": args.seconds + (6.0 if upload else 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for r in range(args.rounds):
        base = one(False, args)
        up = one(True, args)
        extra = up["cpu_s"] - base["cpu_s"] * up["seconds"] / base["seconds"]
        raw_mb = up["sent"] * (args.size + 40) / 1e6    # about a record's bytes in the log
        print(f"round {r + 1}: {args.rate} msg/s of {args.size} B for {args.seconds:g} s; "
              f"broker CPU {base['cpu_s'] / base['seconds'] * 100:.1f}% of a core without "
              f"upload, {up['cpu_s'] / up['seconds'] * 100:.1f}% with it; uploader "
              f"{extra / up['seconds'] * 100:.2f}% of a core, {extra / raw_mb * 1000:.1f} ms "
              f"CPU per MB of log ({up['shipped'] / 1e6:.2f} MB shipped compressed); peak RSS "
              f"{base['peak_rss'] / 2**20:.1f} MiB without, {up['peak_rss'] / 2**20:.1f} MiB with")


if __name__ == "__main__":
    main()
