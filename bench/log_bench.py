#!/usr/bin/env python3
"""Commit log and C helper micro-benchmarks (not part of `make test`).

    .venv/bin/python bench/log_bench.py                 # everything, in a temp dir under /var/tmp
    .venv/bin/python bench/log_bench.py --dir /mnt/sd   # on the disk you care about
    .venv/bin/python bench/log_bench.py --only append,scan --mb 128

What it measures (data in the page cache: this is CPU cost, not the disk):

* append: records/s and MB/s through ``append`` + ``write_pending`` (one write per batch, no
  fsync), for 64 B and 64 KiB payloads, next to plain ``os.write`` of the same bytes in the
  same batches to a file in the same directory (the ratio is the log's overhead);
* scan: ``CommitLog.verify`` (every record's CRC) and a topic-filter scan, GB/s, with the C
  helper and with the pure-Python twin (on a smaller log: it is slow), and raw CRC32C;
* sendfile: draining a backlog of records to a TCP loopback socket with ``send_batch`` (header
  from memory, payload by sendfile) versus ``pread`` + ``send`` of the same bytes.

It prints one table; `--json` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgebroker import _native  # noqa: E402
from edgebroker.commitlog import CommitLog, LogOptions  # noqa: E402

MB = 1e6


def best(fn, repeat: int = 3) -> float:
    """The fastest of ``repeat`` runs of ``fn()`` (seconds)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_append(root: Path, payload_size: int, total_mb: float, batch: int,
                 fsync_every: int = 0) -> dict:
    """``fsync_every``: 0 = never (page cache: CPU cost); N = fdatasync every N bytes in both
    the log and the plain writer (the disk's cost)."""
    n = max(int(total_mb * MB / (payload_size + 60)), batch)
    payload = os.urandom(payload_size)
    topic = b"site/42/sensor/temperature"
    client = b"device-0042"
    record_bytes = 34 + len(client) + len(topic) + payload_size
    batches_per_sync = max(1, fsync_every // (batch * record_bytes)) if fsync_every else 0

    def run_log():
        d = root / "append"
        shutil.rmtree(d, ignore_errors=True)
        log = CommitLog.open(str(d), LogOptions(segment_bytes=64 << 20, retention_bytes=1 << 40))
        append = log.append
        ts = 1_700_000_000_000
        for k, i in enumerate(range(0, n, batch)):
            for _ in range(batch):
                append(ts, 1, False, client, topic, payload)
            log.write_pending()
            if batches_per_sync and k % batches_per_sync == batches_per_sync - 1:
                log.sync()
        log.close(sync=bool(fsync_every))

    chunk = b"".join(_native.record_header(0, 0, 1, client, topic, payload) + client + topic + payload
                     for _ in range(batch))

    def run_plain():
        path = root / "plain"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for k in range(len(range(0, n, batch))):
                os.write(fd, chunk)
                if batches_per_sync and k % batches_per_sync == batches_per_sync - 1:
                    os.fdatasync(fd)
            if fsync_every:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.unlink(path)

    t_log = best(run_log)
    t_plain = best(run_plain)
    shutil.rmtree(root / "append", ignore_errors=True)
    return {"payload": payload_size, "records": n, "batch": batch, "fsync_every": fsync_every,
            "records_per_s": n / t_log, "mb_per_s": n * record_bytes / t_log / MB,
            "plain_mb_per_s": n * record_bytes / t_plain / MB, "ratio": t_plain / t_log}


def make_log(root: Path, total_mb: float) -> tuple[str, int]:
    d = root / "scan"
    shutil.rmtree(d, ignore_errors=True)
    log = CommitLog.open(str(d), LogOptions(segment_bytes=16 << 20, retention_bytes=1 << 40))
    i = 0
    size = 0
    while size < total_mb * MB:
        for _ in range(256):
            p = os.urandom(64 + (i * 37) % 1024)
            log.append(1_700_000_000_000 + i, 1, False, b"dev-%d" % (i % 97),
                       b"site/%d/sensor/%d" % (i % 13, i % 7), p)
            size += len(p) + 60
            i += 1
        log.write_pending()
    log.close()
    return str(d), i


def bench_scan(root: Path, total_mb: float, python_mb: float) -> dict:
    out = {"crc32c_method": ""}
    for backend, mb in (("c", total_mb), ("python", python_mb)):
        _native.set_backend(backend)
        d, records = make_log(root, mb)
        log = CommitLog.open(d, readonly=True)
        nbytes = sum(s.size_bytes for s in log.segments())
        verify_t = best(lambda: log.verify(), repeat=3 if backend == "c" else 1)
        scan_t = best(lambda: sum(1 for _ in log.scan("site/3/sensor/+")), repeat=3 if backend == "c" else 1)
        log.close()
        blob = os.urandom(8 << 20 if backend == "c" else 1 << 20)
        crc_t = best(lambda: _native.crc32c(blob), repeat=5 if backend == "c" else 1)
        out[backend] = {"log_bytes": nbytes, "records": records,
                        "verify_gb_per_s": nbytes / verify_t / 1e9,
                        "filter_scan_gb_per_s": nbytes / scan_t / 1e9,
                        "crc32c_gb_per_s": len(blob) / crc_t / 1e9}
        if backend == "c":
            out["crc32c_method"] = _native.CRC_METHOD
    _native.set_backend("auto")
    out["verify_ratio"] = out["c"]["verify_gb_per_s"] / out["python"]["verify_gb_per_s"]
    return out


def bench_sendfile(root: Path, records: int, payload_size: int) -> dict:
    d = root / "drain"
    shutil.rmtree(d, ignore_errors=True)
    log = CommitLog.open(str(d), LogOptions(segment_bytes=256 << 20, retention_bytes=1 << 40))
    payload = os.urandom(payload_size)
    for i in range(records):
        log.append(1_700_000_000_000, 1, False, b"dev", b"backlog/topic", payload)
        if i % 64 == 63:
            log.write_pending()
    log.write_pending()
    locs = [log.locate(o) for o in range(records)]
    heads = [b"\x32" + b"\x00" * 20 for _ in range(records)]  # stand-in PUBLISH headers
    total = sum(len(h) + loc.payload_length for h, loc in zip(heads, locs))

    def drain(send_all):
        srv = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        srv.close()
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a.setblocking(False)
        got = [0]

        def reader():
            buf = bytearray(1 << 20)
            while True:
                n = b.recv_into(buf)
                if not n:
                    break
                got[0] += n

        t = threading.Thread(target=reader)
        t.start()
        start = time.perf_counter()
        send_all(a)
        a.close()
        t.join()
        elapsed = time.perf_counter() - start
        b.close()
        assert got[0] == total, (got[0], total)
        return elapsed

    def with_sendfile(sock):
        items = [(h, loc.fd, loc.payload_position, loc.payload_length) for h, loc in zip(heads, locs)]
        item = progress = 0
        while True:
            res = _native.send_batch(sock, items[item:item + 256], 0, progress)
            item += res.item
            progress = res.progress
            if item >= len(items):
                return
            if res.error and res.error != 11:
                raise OSError(res.error, os.strerror(res.error))
            if res.error:
                import select
                select.select([], [sock], [])

    def with_copy(sock):
        import select
        for h, loc in zip(heads, locs):
            data = [h, os.pread(loc.fd, loc.payload_length, loc.payload_position)]
            view = memoryview(b"".join(data))
            while view:
                try:
                    n = sock.send(view)
                    view = view[n:]
                except BlockingIOError:
                    select.select([], [sock], [])

    t_sf = min(drain(with_sendfile) for _ in range(3))
    t_cp = min(drain(with_copy) for _ in range(3))
    log.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"records": records, "payload": payload_size,
            "sendfile_msgs_per_s": records / t_sf, "sendfile_mb_per_s": total / t_sf / MB,
            "copy_msgs_per_s": records / t_cp, "copy_mb_per_s": total / t_cp / MB}


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "kernel": platform.release()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp", help="where to put the files (default /var/tmp)")
    ap.add_argument("--mb", type=float, default=64, help="MB per append run and per scanned log")
    ap.add_argument("--python-mb", type=float, default=4, help="MB of log for the pure-Python scan")
    ap.add_argument("--only", default="append,scan,sendfile")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if _native.BACKEND != "c":
        print(f"the C helper is not available: {_native.FALLBACK_REASON}", file=sys.stderr)
        return 1
    only = set(args.only.split(","))
    root = Path(tempfile.mkdtemp(prefix="edgebroker-bench-", dir=args.dir))
    results: dict = {"machine": machine(), "dir": str(root)}
    try:
        if "append" in only:
            results["append"] = [bench_append(root, 64, args.mb / 4, batch=256),
                                 bench_append(root, 65536, args.mb, batch=16),
                                 bench_append(root, 64, args.mb / 4, batch=256, fsync_every=4 << 20),
                                 bench_append(root, 65536, args.mb, batch=16, fsync_every=4 << 20)]
        if "scan" in only:
            results["scan"] = bench_scan(root, args.mb, args.python_mb)
        if "sendfile" in only:
            results["sendfile"] = [bench_sendfile(root, 20000, 1024), bench_sendfile(root, 2000, 65536)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    m = results["machine"]
    print(f"{m['cpu']}, {m['cores']} cores, Python {m['python']}, Linux {m['kernel']}; files in {args.dir}")
    for r in results.get("append", []):
        sync = "fdatasync every 4 MiB" if r["fsync_every"] else "no fsync (page cache)"
        print(f"append {r['payload']:>6} B payloads, {r['batch']:>3} per write, {sync}: "
              f"{r['records_per_s']:>10,.0f} records/s {r['mb_per_s']:>8,.0f} MB/s   "
              f"plain write of the same bytes {r['plain_mb_per_s']:>8,.0f} MB/s  "
              f"(log = {r['ratio'] * 100:.0f}% of plain)")
    if "scan" in results:
        s = results["scan"]
        for b in ("c", "python"):
            x = s[b]
            print(f"scan   {b:<6} ({x['log_bytes'] / MB:6.1f} MB, {x['records']} records): verify "
                  f"{x['verify_gb_per_s']:6.3f} GB/s, filter scan {x['filter_scan_gb_per_s']:6.3f} GB/s, "
                  f"CRC32C {x['crc32c_gb_per_s']:6.3f} GB/s"
                  + (f" ({s['crc32c_method']})" if b == "c" else ""))
        print(f"scan   C / Python verify: {s['verify_ratio']:.0f}x")
    for r in results.get("sendfile", []):
        print(f"drain  {r['records']} x {r['payload']} B to a TCP socket: send_batch (sendfile) "
              f"{r['sendfile_msgs_per_s']:>9,.0f} msg/s {r['sendfile_mb_per_s']:>7,.0f} MB/s   "
              f"pread+send {r['copy_msgs_per_s']:>9,.0f} msg/s {r['copy_mb_per_s']:>7,.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
