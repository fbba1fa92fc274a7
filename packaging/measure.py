"""The frozen binary's three budgets (docs/deploy.md): size, start to listening, idle RSS.

    python3 packaging/measure.py [dist/edgebroker] [--runs 10]

Start to listening: from exec to the broker's READY=1 datagram (sent once its listeners
accept), taken from a notification socket this script binds, as systemd would (best of
--runs after one warm-up start, so the unpacking reads from the page cache: "warm").
Idle RSS: the sum over the binary's two processes (the bootloader and the interpreter it
starts) one second after READY=1, with no client and no configuration file (each process's
figure is shown too), and the same with systemd/edgebroker.toml, as the unit runs it: both
within the budget. It unpacks on disk (under /var/tmp), as the unit has it unpack into
/var/cache/edgebroker: the unpacked files are page cache, and only the pages the processes map
count (docs/deploy.md, "Where it unpacks"). PSS, for
information: the pair's memory with the pages of the libraries both map counted once. Needs
psutil.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil

SIZE_BUDGET = 15 * 1000 * 1000
START_BUDGET = 0.3
RSS_BUDGET = 20 * 1000 * 1000   # 20 MB (issue 24), 19.07 MiB
EXAMPLE_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "systemd",
                              "edgebroker.toml")


def start_once(binary: str, work: str, hold: float,
               config: str | None = None) -> tuple[float, list[int], int]:
    """(seconds from exec to READY=1, the RSS of each process of the tree, bootloader first,
    and their PSS summed, after ``hold`` s idle)."""
    address = os.path.join(work, "notify.sock")
    data = tempfile.mkdtemp(dir=work)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(address)
        notify.settimeout(10.0)
        env = dict(os.environ, NOTIFY_SOCKET=address, TMPDIR=work)
        begin = time.perf_counter()
        args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", data]
        if config:
            args += ["-c", config]
        proc = subprocess.Popen([binary, *args], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                message = notify.recv(4096).decode()
                if "READY=1" in message.split("\n"):
                    elapsed = time.perf_counter() - begin
                    break
            time.sleep(hold)
            tree = psutil.Process(proc.pid)
            figures = [p.memory_full_info() for p in [tree, *tree.children(recursive=True)]]
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(10)
        os.unlink(address)
    if code != 0:
        raise SystemExit(f"{binary} exited with {code} on SIGTERM")
    return elapsed, [f.rss for f in figures], sum(f.pss for f in figures)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binary", nargs="?", default="dist/edgebroker")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    size = os.path.getsize(args.binary)
    with tempfile.TemporaryDirectory(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as work:
        start_once(args.binary, work, 0.0)                 # warm-up: the page cache
        starts = [start_once(args.binary, work, 0.0)[0] for _ in range(args.runs)]
        _, each, pss = start_once(args.binary, work, 1.0)
        _, each_config, _ = start_once(args.binary, work, 1.0, EXAMPLE_CONFIG)
    starts.sort()
    rss = sum(each)
    ok = (size <= SIZE_BUDGET and starts[0] <= START_BUDGET
          and max(rss, sum(each_config)) <= RSS_BUDGET)
    mib = 2 ** 20
    print(f"binary size      {size / 1e6:6.1f} MB   (budget 15 MB)")
    print(f"start to READY   {starts[0]:6.3f} s    best of {len(starts)}, median "
          f"{starts[len(starts) // 2]:.3f} s (budget 0.3 s)")
    print(f"idle RSS         {rss / mib:6.2f} MiB = {rss / 1e6:.2f} MB, both processes: "
          f"bootloader {each[0] / mib:.2f}, broker {sum(each[1:]) / mib:.2f} (budget 20 MB)")
    print(f"  with -c systemd/edgebroker.toml {sum(each_config) / mib:.2f} MiB = "
          f"{sum(each_config) / 1e6:.2f} MB (budget 20 MB, as the unit runs it); PSS of the "
          f"two {pss / mib:.2f} MiB")
    print("within budget" if ok else "OVER BUDGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
