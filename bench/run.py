#!/usr/bin/env python3
"""edgebroker vs Mosquitto, side by side on one machine, in one run (see bench/README.md).

    python3 bench/run.py [--scenarios fanin_qos0,fanout_qos0,fanin_qos1,large_64k]
                         [--rounds 3] [--brokers edgebroker,mosquitto] [--scale 1.0]

Loopback only; every run is bounded in message count and time; every child
process (brokers, publishers, subscribers) is stopped at the end, also on error
or Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import queue
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import brokers  # noqa: E402
import loadgen  # noqa: E402

CTX = multiprocessing.get_context("fork")
HOST = "127.0.0.1"
READY_TIMEOUT = 20.0
IDLE_GRACE = 1.0

# name -> definition. count is per publisher; "sub_procs" processes share "subs" connections.
SCENARIOS = {
    "fanin_qos0": dict(
        about="4 publishers -> 1 subscriber on bench/+, QoS 0, 64 B payloads",
        pubs=4, subs=1, sub_procs=1, qos=0, payload=64, count=250_000, window=0,
        sub_filter="bench/+", unit="msg/s"),
    "fanout_qos0": dict(
        about="1 publisher -> 50 subscribers on bench/0, QoS 0, 64 B payloads",
        pubs=1, subs=50, sub_procs=2, qos=0, payload=64, count=50_000, window=0,
        sub_filter="bench/0", unit="msg/s"),
    "fanin_qos1": dict(
        about="4 publishers (window 100) -> 1 QoS 1 subscriber on bench/+, 64 B payloads",
        pubs=4, subs=1, sub_procs=1, qos=1, payload=64, count=100_000, window=100,
        sub_filter="bench/+", unit="msg/s"),
    "large_64k": dict(
        about="1 publisher -> 1 subscriber, QoS 0, 64 KiB payloads",
        pubs=1, subs=1, sub_procs=1, qos=0, payload=65_536, count=40_000, window=0,
        sub_filter="bench/0", unit="MB/s"),
}

_children: list = []       # multiprocessing.Process objects still to reap
_brokers: list = []        # Broker objects still to stop


class RunError(Exception):
    pass


# ----- process bookkeeping ----------------------------------------------------------------------

def spawn(target, *args) -> multiprocessing.Process:
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    _children.append(p)
    return p


def reap(procs=None, timeout: float = 3.0) -> None:
    """Join the given children (default: all), terminating then killing stragglers, by PID."""
    procs = list(_children if procs is None else procs)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
        if p in _children:
            _children.remove(p)


def stop_brokers() -> None:
    while _brokers:
        _brokers.pop().stop()


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


# ----- collecting messages from the children -----------------------------------------------------

class Inbox:
    """The children's messages, kept per (kind, role) until asked for (they arrive in any order)."""

    def __init__(self):
        self.q = CTX.Queue()
        self.kept: dict[tuple[str, str], list] = {}

    def wait(self, want: dict, timeout: float, broker=None, kind: str = "ready") -> dict:
        """Wait until ``want[role]`` messages of ``kind`` arrived per role; returns role -> list."""
        deadline = time.monotonic() + timeout
        kept = self.kept
        while any(len(kept.get((kind, r), ())) < n for r, n in want.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = {r: n - len(kept.get((kind, r), ())) for r, n in want.items()}
                raise RunError(f"timed out waiting for {kind} from {missing}"
                               + (f"; broker log tail:\n{broker.log_tail()}" if broker else ""))
            try:
                msg = self.q.get(timeout=min(0.2, left))
            except queue.Empty:
                if broker is not None and not broker.alive():
                    raise RunError(f"{broker.name} exited (status {broker.proc.returncode}):\n"
                                   + broker.log_tail())
                continue
            if msg[0] == "error":
                raise RunError(f"{msg[1]} {msg[2]} failed:\n{msg[3]}")
            kept.setdefault((msg[0], msg[1]), []).append(msg[3] if msg[0] == "result" else msg[2])
        return {r: kept[(kind, r)][:n] for r, n in want.items()}


# ----- one run ------------------------------------------------------------------------------------

def scaled(spec: dict, scale: float) -> int:
    return max(1, int(spec["count"] * scale))


def run_once(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    count = scaled(spec, args.scale)
    limit = args.time_limit
    broker = broker_cls()
    _brokers.append(broker)
    procs = []
    try:
        try:
            broker.start()
        except (RuntimeError, OSError) as exc:
            raise RunError(f"{broker.name} did not start: {exc}\n{broker.log_tail()}") from None
        inbox = Inbox()
        q = inbox.q
        go = CTX.Event()
        pubs_done = CTX.Event()
        expected_per_conn = count * spec["pubs"]
        per_proc = _split(spec["subs"], spec["sub_procs"])
        for i, n in enumerate(per_proc):
            procs.append(spawn(loadgen.subscriber, i, HOST, broker.port, n, spec["sub_filter"],
                               spec["qos"], expected_per_conn * n, limit + 5.0, IDLE_GRACE,
                               q, go, pubs_done))
        inbox.wait({"sub": len(per_proc)}, READY_TIMEOUT, broker)
        for i in range(spec["pubs"]):
            procs.append(spawn(loadgen.publisher, i, HOST, broker.port, f"bench/{i}",
                               spec["payload"], spec["qos"], count, spec["window"], limit, q, go))
        inbox.wait({"pub": spec["pubs"]}, READY_TIMEOUT, broker)
        cpu0 = broker.cpu_seconds()
        go.set()
        t_go = time.monotonic()
        pubs = inbox.wait({"pub": spec["pubs"]}, limit + loadgen.CLOSE_GRACE + 5.0, broker,
                       "result")["pub"]
        pubs_done.set()
        subs = inbox.wait({"sub": len(per_proc)}, limit + 15.0, broker, "result")["sub"]
        cpu1 = broker.cpu_seconds()
        rss = broker.rss_bytes()
        wall = time.monotonic() - t_go
    finally:
        reap(procs)
        broker.stop()
        if broker in _brokers:
            _brokers.remove(broker)

    sent = sum(p["sent"] for p in pubs)
    expected = sent * spec["subs"]
    delivered = sum(s["count"] for s in subs)
    firsts = [s["first"] for s in subs if s["first"] is not None]
    lasts = [s["last"] for s in subs if s["last"] is not None]
    t_pub0 = min(p["t_start"] for p in pubs)
    # Main figure: first PUBLISH sent -> last delivery received. (First -> last *received*
    # flatters a broker that reads and routes a large batch before it sends anything.)
    span = (max(lasts) - t_pub0) if lasts else 0.0
    span_rx = (max(lasts) - min(firsts)) if firsts else 0.0
    per = spec["payload"] / 1e6 if spec["unit"] == "MB/s" else 1.0
    value = delivered / span * per if span > 0 else 0.0
    value_rx = delivered / span_rx * per if span_rx > 0 else None
    cpu = cpu1 - cpu0
    # Publishers end when the broker closes after their DISCONNECT: everything was read by then.
    pub_span = max(p["t_end"] for p in pubs) - t_pub0
    sub_cpu = sum(s["cpu"] for s in subs)
    rec = {
        "scenario": name, "broker": broker_cls.name, "round": round_no,
        "value": round(value, 1), "unit": spec["unit"],
        "value_first_to_last_rx": round(value_rx, 1) if value_rx else None,
        "delivered": delivered, "expected": expected, "sent": sent,
        "loss_pct": round(100.0 * (expected - delivered) / expected, 3) if expected else None,
        "span_s": round(span, 4), "span_rx_s": round(span_rx, 4), "wall_s": round(wall, 3),
        "generator_cpu_s": round(sub_cpu + sum(p["cpu"] for p in pubs), 3),
        "subscriber_busy_pct": (round(100.0 * sub_cpu / (span * len(subs)), 1)
                                if span > 0 else None),
        "ingest_rate": round(sent / pub_span, 1) if pub_span > 0 else None,
        "publisher_timed_out": any(p["timed_out"] for p in pubs),
        "subscriber_ended": sorted({s["ended"] for s in subs}),
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_s_per_100k": round(cpu / delivered * 1e5, 3) if delivered else None,
        "broker_cpu_pct": round(100.0 * cpu / wall, 1) if wall > 0 else None,
        "broker_rss_mb": round(rss / 2 ** 20, 1),
        "count_per_publisher": count, "payload": spec["payload"], "qos": spec["qos"],
        "publishers": spec["pubs"], "subscribers": spec["subs"], "window": spec["window"],
        "limits": brokers.LIMITS, "acl_file": brokers.ACL_FILE,
        "edgebroker_limits": brokers.EDGEBROKER_LIMITS,
    }
    return rec


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# ----- generator ceiling ------------------------------------------------------------------------

def ceiling(args) -> dict:
    """The generator against stand-ins for the broker that do (almost) nothing."""
    out = {}
    limit = args.time_limit
    count = scaled(SCENARIOS["fanin_qos0"], args.scale)
    for label, qos, window, mode, n in (("publishers_qos0", 0, 0, "discard", count),
                                        ("publishers_qos1_w100", 1, 100, "ack",
                                         scaled(SCENARIOS["fanin_qos1"], args.scale))):
        listen = socket.socket()
        listen.bind((HOST, 0))
        listen.listen(64)
        port = listen.getsockname()[1]
        procs = []
        try:
            inbox = Inbox()
            q = inbox.q
            go = CTX.Event()
            procs.append(spawn(loadgen.sink, listen, 4, mode, limit, q))
            for i in range(4):
                procs.append(spawn(loadgen.publisher, i, HOST, port, f"bench/{i}", 64, qos, n,
                                   window, limit, q, go))
            inbox.wait({"pub": 4}, READY_TIMEOUT)
            go.set()
            res = inbox.wait({"pub": 4, "sink": 1}, limit + 15.0, kind="result")
        finally:
            reap(procs)
            listen.close()
        pubs = res["pub"]
        sent = sum(p["sent"] for p in pubs)
        span = max(p["t_end"] for p in pubs) - min(p["t_start"] for p in pubs)
        out[label] = round(sent / span, 1) if span > 0 else None

    listen = socket.socket()
    listen.bind((HOST, 0))
    listen.listen(4)
    port = listen.getsockname()[1]
    n = 4 * count
    procs = []
    try:
        inbox = Inbox()
        q = inbox.q
        go = CTX.Event()
        done = CTX.Event()
        done.set()
        procs.append(spawn(loadgen.feeder, listen, "bench/0", 64, n, limit, q, go))
        procs.append(spawn(loadgen.subscriber, 0, HOST, port, 1, "bench/+", 0, n, limit,
                           IDLE_GRACE, q, go, done))
        inbox.wait({"sub": 1}, READY_TIMEOUT)
        go.set()
        sub = inbox.wait({"sub": 1}, limit + 15.0, kind="result")["sub"][0]
    finally:
        reap(procs)
        listen.close()
    span = (sub["last"] - sub["first"]) if sub["first"] is not None else 0
    out["subscriber_qos0"] = round(sub["count"] / span, 1) if span > 0 else None
    return out


# ----- machine description ---------------------------------------------------------------------

def machine(mosquitto_bin) -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("model name", "hardware", "cpu model"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", brokers.REPO, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", brokers.REPO, "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "mosquitto": brokers.mosquitto_version(mosquitto_bin),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "edgebroker_commit": commit,
    }


# ----- output ----------------------------------------------------------------------------------

def fmt(x, unit=""):
    if x is None:
        return "-"
    if unit == "MB/s" or abs(x) < 100:
        return f"{x:,.1f}"
    return f"{x:,.0f}"


def summary(records: list[dict], names: list[str], broker_names: list[str]) -> str:
    head = (f"{'scenario':<12} {'unit':<6} {'broker':<11} {'median':>10} {'min':>10} {'max':>10} "
            f"{'loss %':>7} {'cpu s/100k':>10} {'cpu %':>6} {'rss MB':>7} {'ok':>4}  ratio edge/mosq")
    lines = [head, "-" * len(head)]
    for name in names:
        unit = SCENARIOS[name]["unit"]
        medians = {}
        for b in broker_names:
            rs = [r for r in records if r["scenario"] == name and r["broker"] == b]
            ok = [r for r in rs if "error" not in r]
            if not rs:
                continue
            if ok:
                vals = [r["value"] for r in ok]
                med = statistics.median(vals)
                medians[b] = med
                loss = statistics.median(r["loss_pct"] or 0.0 for r in ok)
                cpu = statistics.median(r["broker_cpu_s_per_100k"] or 0.0 for r in ok)
                pct = statistics.median(r["broker_cpu_pct"] or 0.0 for r in ok)
                rss = max(r["broker_rss_mb"] for r in ok)
                lines.append(f"{name:<12} {unit:<6} {b:<11} {fmt(med, unit):>10} "
                             f"{fmt(min(vals), unit):>10} {fmt(max(vals), unit):>10} "
                             f"{loss:>7.2f} {cpu:>10.3f} {pct:>6.0f} {rss:>7.1f} "
                             f"{len(ok)}/{len(rs):<2}")
            else:
                lines.append(f"{name:<12} {unit:<6} {b:<11} {'failed':>10} {'':>10} {'':>10} "
                             f"{'':>7} {'':>10} {'':>6} {'':>7} 0/{len(rs):<2}")
        if medians.get("mosquitto") and "edgebroker" in medians:
            lines[-1] += f"  {medians['edgebroker'] / medians['mosquitto']:.3f}"
    return "\n".join(lines)


# ----- main ------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset of: " + ", ".join(SCENARIOS))
    p.add_argument("--rounds", type=int, default=3, help="A B rounds per scenario (default 3)")
    p.add_argument("--brokers", default="edgebroker,mosquitto",
                   help="comma-separated subset of: edgebroker, mosquitto")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every message count by this (default 1.0)")
    p.add_argument("--time-limit", type=float, default=20.0,
                   help="seconds a run's publishers may send for (default 20)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the generator ceiling")
    p.add_argument("--results", default=os.path.join(HERE, "results"),
                   help="directory of the <date>.jsonl files")
    p.add_argument("--acl", metavar="FILE",
                   help="run both brokers with this ACL file (Mosquitto's format; the load "
                        "generator's clients are anonymous)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = p.parse_args(argv)
    if args.acl:
        if not os.path.isfile(args.acl):
            p.error(f"--acl {args.acl}: no such file")
        brokers.ACL_FILE = os.path.abspath(args.acl)
    args.scenario_list = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenario_list if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    args.broker_list = [b.strip() for b in args.brokers.split(",") if b.strip()]
    bad = [b for b in args.broker_list if b not in brokers.BROKERS]
    if bad or not args.broker_list:
        p.error(f"unknown broker(s): {', '.join(bad)}")
    if not 1 <= args.rounds <= 50:
        p.error("--rounds must be 1..50")
    if not 0 < args.scale <= 10:
        p.error("--scale must be in (0, 10]")
    if not 1 <= args.time_limit <= 300:
        p.error("--time-limit must be 1..300 s")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name, spec in SCENARIOS.items():
            print(f"{name:<12} {spec['about']}; {spec['count']:,} messages per publisher")
        return 0
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.monotonic()
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping brokers and load generators", file=sys.stderr)
        return 130
    finally:
        reap(timeout=1.0)
        stop_brokers()
        print(f"(total {time.monotonic() - started:.0f} s)", file=sys.stderr)


def _main(args) -> int:
    if "mosquitto" in args.broker_list:
        brokers.Mosquitto.binary = brokers.ensure_mosquitto()
        if not brokers.Mosquitto.binary:
            print("warning: mosquitto unavailable; running edgebroker only", file=sys.stderr)
            args.broker_list = [b for b in args.broker_list if b != "mosquitto"]
            if not args.broker_list:
                return 1
    info = machine(brokers.Mosquitto.binary or brokers.mosquitto_path())
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    print(f"limits on both brokers: {brokers.LIMITS} (edgebroker also "
          f"{brokers.EDGEBROKER_LIMITS}); loopback only; time limit "
          f"{args.time_limit:g} s per run; scale {args.scale:g}"
          + (f"; ACL file {brokers.ACL_FILE}" if brokers.ACL_FILE else ""), flush=True)

    day = datetime.date.today().isoformat()
    os.makedirs(args.results, exist_ok=True)
    out_path = os.path.join(args.results, f"{day}.jsonl")
    run_id = datetime.datetime.now().isoformat(timespec="seconds")

    gen = None
    if not args.no_ceiling:
        try:
            gen = ceiling(args)
            print("generator ceiling (stand-in sink instead of a broker): "
                  + "; ".join(f"{k} {fmt(v)} msg/s" for k, v in gen.items()), flush=True)
        except (RunError, OSError, RuntimeError) as exc:
            print(f"generator ceiling failed: {exc}", file=sys.stderr)

    records = []
    with open(out_path, "a") as out:
        for name in args.scenario_list:
            spec = SCENARIOS[name]
            print(f"\n{name}: {spec['about']}", flush=True)
            for rnd in range(1, args.rounds + 1):
                for bname in args.broker_list:
                    try:
                        rec = run_once(name, spec, brokers.BROKERS[bname], rnd, args)
                        print(f"  round {rnd} {bname:<10} {fmt(rec['value'], rec['unit']):>10} "
                              f"{rec['unit']:<5} loss {rec['loss_pct']:.2f}%  "
                              f"broker cpu {rec['broker_cpu_s']:.2f} s "
                              f"({rec['broker_cpu_s_per_100k']} s/100k, {rec['broker_cpu_pct']}%)  "
                              f"rss {rec['broker_rss_mb']} MB  span {rec['span_s']:.2f} s  "
                              f"(first->last rx {fmt(rec['value_first_to_last_rx'])})  "
                              f"subscriber busy {rec['subscriber_busy_pct']}%  "
                              f"ingest {fmt(rec['ingest_rate'])} msg/s"
                              + ("  [publisher hit the time limit]"
                                 if rec["publisher_timed_out"] else ""), flush=True)
                    except (RunError, OSError, RuntimeError) as exc:
                        rec = {"scenario": name, "broker": bname, "round": rnd,
                               "error": str(exc)[:2000]}
                        print(f"  round {rnd} {bname:<10} FAILED: {exc}", flush=True)
                    rec.update(run=run_id, date=day, machine=info, generator_ceiling=gen)
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    records.append(rec)

    print("\nsummary (median/min/max over rounds; ratio = edgebroker median / mosquitto median)")
    print(summary(records, args.scenario_list, args.broker_list))
    print(f"\nresults appended to {os.path.relpath(out_path)}")
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
