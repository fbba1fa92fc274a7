"""The runners of bench/run.py's scenarios (defined in ``scenarios``), one per kind, and
``run``, which runs one scenario against one broker.

Each runner starts fresh broker processes, drives them with the load-generator processes of
``loadgen``, and returns one record (a dict, one JSON line) for one broker and round. Every
wait is bounded; every child process and broker is reaped in a ``finally``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import brokers
import loadgen
from bridge_bench import run_bridge_drain
from procs import (CTX, Inbox, RunError, cpu_snapshot, others_cpu_pct, reap, spawn,
                   start_broker, stop_broker)
from scenarios import (CONNECT_TIME_LIMIT, CONNECT_WINDOW, FLOOD_TOPIC, GEN_PROCS, HOST,
                       IDLE_GRACE, READY_TIMEOUT, SCENARIOS, STUCK_RCVBUF, V311_PLAIN, PeakRss,
                       broker_cfg, edge_seconds, load_of, own_figures, pct, scaled, split,
                       time_limit)

SETTLE_MAX = 5.0           # how long to wait for a broker's RSS to stop changing
SETTLE_STEP = 0.25
SETTLE_TOLERANCE = 64 * 1024


# ----- publishers -> subscribers ----------------------------------------------------------------

def pair_load(spec: dict, broker, args, disturb: str | None = None) -> dict:
    """The publishers -> subscribers load of ``spec`` on a running broker; returns its figures.

    disturb "stuck": a subscriber on the same filter that never reads sits next to the load;
    "flood": a client publishes QoS 0 to FLOOD_TOPIC as fast as it can for as long as the load
    runs (started with the publishers)."""
    count = scaled(spec, args.scale)
    limit = time_limit(spec, args)
    keyed = spec.get("keyed", False)
    procs = []
    release = CTX.Event()
    peak = None
    try:
        inbox = Inbox()
        q = inbox.q
        go = CTX.Event()
        pubs_done = CTX.Event()
        expected_per_conn = count * spec["pubs"]
        per_proc = split(spec["subs"], spec["sub_procs"])
        for i, n in enumerate(per_proc):
            procs.append(spawn(loadgen.subscriber, i, HOST, broker.port, n, spec["sub_filter"],
                               spec["qos"], expected_per_conn * n, limit + 5.0,
                               spec.get("idle_grace", IDLE_GRACE), q, go, pubs_done, False,
                               keyed))
        inbox.wait({"sub": len(per_proc)}, READY_TIMEOUT, broker)
        if disturb == "stuck":
            procs.append(spawn(loadgen.stuck_subscriber, 0, HOST, broker.port,
                               spec["sub_filter"], spec["qos"], STUCK_RCVBUF, q, release))
            inbox.wait({"stuck": 1}, READY_TIMEOUT, broker)
        elif disturb == "flood":
            procs.append(spawn(loadgen.publisher, 0, HOST, broker.port, FLOOD_TOPIC, 64, 0,
                               10 ** 12, 0, limit, q, go, release, "flood"))
            inbox.wait({"flood": 1}, READY_TIMEOUT, broker)
        for i in range(spec["pubs"]):
            procs.append(spawn(loadgen.publisher, i, HOST, broker.port, f"bench/{i}",
                               spec["payload"], spec["qos"], count, spec["window"], limit, q, go,
                               None, "pub", keyed))
        inbox.wait({"pub": spec["pubs"]}, READY_TIMEOUT, broker)
        cpu0 = broker.cpu_seconds()
        if spec.get("peak_rss"):
            peak = PeakRss(broker)
        go.set()
        t_go = time.monotonic()
        pubs = inbox.wait({"pub": spec["pubs"]}, limit + loadgen.CLOSE_GRACE + 5.0, broker,
                          "result")["pub"]
        pubs_done.set()
        subs = inbox.wait({"sub": len(per_proc)}, limit + 15.0, broker, "result")["sub"]
        cpu = broker.cpu_seconds() - cpu0
        rss = broker.rss_bytes()
        wall = time.monotonic() - t_go
        rss_peak, rss_how = peak.peak() if peak is not None else (None, None)
        rss_parts = broker.rss_parts() if peak is not None else None
        own = broker.admin_stats() if keyed else None
        release.set()
        flood = (inbox.wait({"flood": 1}, 5.0, broker, "result")["flood"][0]
                 if disturb == "flood" else None)
    finally:
        release.set()
        if peak is not None:
            peak.peak()
        reap(procs)

    sent = sum(p["sent"] for p in pubs)
    acked = sum(p["acked"] for p in pubs)
    # Keyed QoS 1: loss is of acknowledged messages, counted as distinct messages delivered
    # (a duplicate does not make up for a lost one).
    expected = (acked if keyed else sent) * spec["subs"]
    received = sum(s["count"] for s in subs)
    delivered = sum(s["unique"] for s in subs) if keyed else received
    firsts = [s["first"] for s in subs if s["first"] is not None]
    lasts = [s["last"] for s in subs if s["last"] is not None]
    t_pub0 = min(p["t_start"] for p in pubs)
    # Main figure: first PUBLISH sent -> last delivery received. (First -> last *received*
    # flatters a broker that reads and routes a large batch before it sends anything.)
    span = (max(lasts) - t_pub0) if lasts else 0.0
    span_rx = (max(lasts) - min(firsts)) if firsts else 0.0
    per = spec["payload"] / 1e6 if spec["unit"] == "MB/s" else 1.0
    # No delivery: no figure (the run is reported as empty, not as 0 msg/s).
    value = delivered / span * per if span > 0 and delivered else None
    value_rx = delivered / span_rx * per if span_rx > 0 else None
    # Publishers end when the broker closes after their DISCONNECT: everything was read by then.
    pub_span = max(p["t_end"] for p in pubs) - t_pub0
    sub_cpu = sum(s["cpu"] for s in subs)
    out = {
        "value": round(value, 1) if value else None, "unit": spec["unit"],
        "value_first_to_last_rx": round(value_rx, 1) if value_rx else None,
        "delivered": delivered, "expected": expected, "sent": sent,
        "loss_pct": pct(expected - delivered, expected),
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
        "time_limit": limit,
    }
    if keyed:
        out.update(acked=acked, duplicates=received - delivered)
    if rss_peak is not None:
        out.update(broker_rss_peak_mb=round(rss_peak / 2 ** 20, 1), rss_peak_from=rss_how,
                   broker_rss_parts_end=rss_parts)
    if own is not None:
        out["broker_own"] = own_figures(own)
    if flood is not None:
        fspan = flood["t_sent"] - flood["t_start"]
        out["flooder_sent"] = flood["sent"]
        out["flooder_rate"] = round(flood["sent"] / fspan, 1) if fspan > 0 else None
    return out


def run_pair(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    broker = start_broker(broker_cls, broker_cfg(spec, broker_cls))
    try:
        return pair_load(spec, broker, args)
    finally:
        stop_broker(broker)


def run_versus(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    """The load without and with the disturbance (fresh brokers, the order alternating by
    round); the record is the disturbed run's, plus the undisturbed figures and the ratio."""
    load = load_of(spec)
    cfg = broker_cfg(spec, broker_cls)
    variants = (None, spec["disturb"]) if round_no % 2 else (spec["disturb"], None)
    got = {}
    for disturb in variants:
        broker = start_broker(broker_cls, cfg)
        try:
            got[disturb] = pair_load(load, broker, args, disturb)
        finally:
            stop_broker(broker)
    rec = got[spec["disturb"]]
    base = got[None]
    rec.update(value_without=base["value"], loss_pct_without=base["loss_pct"],
               broker_cpu_pct_without=base["broker_cpu_pct"],
               kept_pct=(round(100.0 * rec["value"] / base["value"], 1)
                         if rec["value"] and base["value"] else None),
               disturbance=spec["disturb"], order=[v or "without" for v in variants])
    return rec


# ----- a persistent subscriber's backlog ---------------------------------------------------------

def run_backlog(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    """A persistent QoS 1 subscriber subscribes and leaves; the publishers send the backlog
    (keyed, with a window); the subscriber reconnects (clean session 0) and drains it.

    Figures: the drain rate (distinct messages / reconnect -> last message), loss of
    acknowledged messages and duplicates, the broker's RSS with the backlog queued (settled)
    and its peak during the drain."""
    count = scaled(spec, args.scale)
    limit = time_limit(spec, args)
    grace = spec.get("idle_grace", IDLE_GRACE)
    client_id = f"bench-backlog-{os.getpid()}-{round_no}"
    broker = start_broker(broker_cls, broker_cfg(spec, broker_cls))
    procs = []
    busy = []
    peak = None
    try:
        inbox = Inbox()
        q = inbox.q
        loadgen.ping_once(HOST, broker.port, "bench-warmup")
        rss0, _, _ = settle_rss(broker)
        loadgen.persistent_subscribe(HOST, broker.port, client_id, spec["sub_filter"], spec["qos"])
        go = CTX.Event()
        for i in range(spec["pubs"]):
            procs.append(spawn(loadgen.publisher, i, HOST, broker.port, f"bench/{i}",
                               spec["payload"], spec["qos"], count, spec["window"], limit, q, go,
                               None, "pub", True))
        inbox.wait({"pub": spec["pubs"]}, READY_TIMEOUT, broker)
        go.set()
        pubs = inbox.wait({"pub": spec["pubs"]}, limit + loadgen.CLOSE_GRACE + 5.0, broker,
                          "result")["pub"]
        reap(procs)
        procs = []
        acked = sum(p["acked"] for p in pubs)
        rss_backlog, _, settled = settle_rss(broker)
        parts_backlog = broker.rss_parts()
        own_before = broker.admin_stats()

        # The drain: the subscriber connects when "go" is set (the clock starts just before).
        drain_go = CTX.Event()
        done = CTX.Event()
        done.set()              # nothing more is published: a pause of ``grace`` s ends it
        procs.append(spawn(loadgen.subscriber, 0, HOST, broker.port, 1, spec["sub_filter"],
                           spec["qos"], acked, limit, grace, q, drain_go, done, False, True,
                           client_id, True))
        inbox.wait({"sub": 1}, READY_TIMEOUT, broker)
        busy = [busy_process(limit + grace + 10.0) for _ in range(spec.get("busy", 0))]
        cpu0 = broker.cpu_seconds()
        peak = PeakRss(broker)
        drain_go.set()
        sub = inbox.wait({"sub": 1}, limit + grace + 10.0, broker, "result")["sub"][0]
        cpu = broker.cpu_seconds() - cpu0
        rss_peak, rss_how = peak.peak()
        rss_end = broker.rss_bytes()
        parts_end = broker.rss_parts()
        own = broker.admin_stats()
    finally:
        if peak is not None:
            peak.peak()
        for p in busy:
            p.kill()
            p.wait(10)
        reap(procs)
        stop_broker(broker)

    sent = sum(p["sent"] for p in pubs)
    t_pub0 = min(p["t_start"] for p in pubs)
    pub_span = max(p["t_end"] for p in pubs) - t_pub0
    delivered = sub["unique"]
    t_connect = sub["t_go"]
    span = (sub["last"] - t_connect) if sub["last"] is not None else 0.0
    span_rx = (sub["last"] - sub["first"]) if sub["first"] is not None else 0.0
    out = {
        "value": round(delivered / span, 1) if span > 0 and delivered else None,
        "unit": spec["unit"],
        "value_first_to_last_rx": round(delivered / span_rx, 1) if span_rx > 0 else None,
        "delivered": delivered, "duplicates": sub["count"] - delivered, "expected": acked,
        "sent": sent, "acked": acked, "loss_pct": pct(acked - delivered, acked),
        "session_present": all(sub["session_present"]),
        "drain_s": round(span, 4), "first_delivery_s": (round(sub["first"] - t_connect, 4)
                                                        if sub["first"] is not None else None),
        "subscriber_ended": [sub["ended"]],
        "subscriber_busy_pct": round(100.0 * sub["cpu"] / span, 1) if span > 0 else None,
        "ingest_rate": round(sent / pub_span, 1) if pub_span > 0 else None,
        "publisher_timed_out": any(p["timed_out"] for p in pubs),
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_pct": round(100.0 * cpu / span, 1) if span > 0 else None,
        "rss_before_mb": round(rss0 / 2 ** 20, 1),
        "broker_rss_backlog_mb": round(rss_backlog / 2 ** 20, 1), "backlog_rss_settled": settled,
        "broker_rss_peak_mb": round(rss_peak / 2 ** 20, 1), "rss_peak_from": rss_how,
        "broker_rss_mb": round(rss_end / 2 ** 20, 1),
        "broker_rss_parts_backlog": parts_backlog, "broker_rss_parts_end": parts_end,
        "count_per_publisher": count, "payload": spec["payload"], "qos": spec["qos"],
        "publishers": spec["pubs"], "window": spec["window"], "time_limit": limit,
        "busy_processes": len(busy),
    }
    if own is not None:
        out["broker_own"] = own_figures(own)
    if own_before is not None:
        out["broker_own_backlog"] = own_figures(own_before)
    return out


def busy_process(seconds: float) -> subprocess.Popen:
    """A process that keeps one CPU busy for at most ``seconds`` (reconnect_backlog_busy)."""
    return subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + "
                             f"{seconds}\nwhile time.monotonic() < end: pass"])


# ----- idle connections ---------------------------------------------------------------------------

def settle_rss(broker) -> tuple[int, float, bool]:
    """Wait (bounded) until the broker's RSS stops changing: three samples SETTLE_STEP apart
    within SETTLE_TOLERANCE. Returns (RSS, seconds waited, settled)."""
    t0 = time.monotonic()
    samples = [broker.rss_bytes()]
    while time.monotonic() - t0 < SETTLE_MAX:
        time.sleep(SETTLE_STEP)
        samples.append(broker.rss_bytes())
        last = samples[-3:]
        if len(last) == 3 and max(last) - min(last) <= SETTLE_TOLERANCE:
            return samples[-1], time.monotonic() - t0, True
    return samples[-1], time.monotonic() - t0, False


def run_idle(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    n = spec["conns"]
    broker = start_broker(broker_cls, broker_cfg(spec, broker_cls))
    procs = []
    release = CTX.Event()
    try:
        loadgen.ping_once(HOST, broker.port, "bench-warmup")
        rss0, settle0, settled0 = settle_rss(broker)
        inbox = Inbox()
        q = inbox.q
        go = CTX.Event()
        sweep = CTX.Event()
        shares = split(n, GEN_PROCS)
        for i, k in enumerate(shares):
            procs.append(spawn(loadgen.idle_clients, i, HOST, broker.port, k, 600,
                               CONNECT_WINDOW, CONNECT_TIME_LIMIT, q, go, sweep, release))
        inbox.wait({"idle": len(shares)}, READY_TIMEOUT, broker)
        cpu0 = broker.cpu_seconds()
        go.set()
        conn = inbox.wait({"idle": len(shares)}, CONNECT_TIME_LIMIT + 5.0, broker,
                          "connected")["idle"]
        cpu = broker.cpu_seconds() - cpu0
        rss1, settle1, settled1 = settle_rss(broker)
        sweep.set()
        swept = inbox.wait({"idle": len(shares)}, CONNECT_TIME_LIMIT + 5.0, broker,
                           "result")["idle"]
        if not broker.alive():
            raise RunError(f"{broker.name} exited:\n{broker.log_tail()}")
    finally:
        release.set()
        reap(procs)
        stop_broker(broker)
    connected = sum(c["n"] for c in conn)
    span = max(c["t_end"] for c in conn) - min(c["t_start"] for c in conn)
    alive = sum(s["alive"] for s in swept)
    per_conn = (rss1 - rss0) / n
    return {
        "value": round(per_conn, 1), "unit": spec["unit"], "connections": n,
        "connected": connected, "alive": alive, "loss_pct": pct(n - alive, n),
        "connect_s": round(span, 3), "connect_rate": round(connected / span, 1) if span else None,
        "slow_connects": sum(c["slow"] for c in conn),
        "sweep_s": round(max(s["sweep_s"] for s in swept), 3),
        "rss_before_mb": round(rss0 / 2 ** 20, 2), "broker_rss_mb": round(rss1 / 2 ** 20, 2),
        "settle_s": [round(settle0, 2), round(settle1, 2)], "settled": settled0 and settled1,
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_ms_per_1k_connects": round(cpu / connected * 1e6, 1) if connected else None,
        "broker_cpu_pct": round(100.0 * cpu / span, 1) if span else None,
        "generator_cpu_s": round(sum(c["cpu"] for c in conn), 3),
        "generator_processes": len(shares), "connect_window": CONNECT_WINDOW * len(shares),
    }


# ----- the edge workload --------------------------------------------------------------------------

def run_edge(name: str, spec: dict, broker_cls, round_no: int, args) -> dict:
    n = spec["devices"]
    seconds = edge_seconds(args)
    broker = start_broker(broker_cls, broker_cfg(spec, broker_cls))
    procs = []
    try:
        inbox = Inbox()
        q = inbox.q
        go = CTX.Event()
        pubs_done = CTX.Event()
        start_at = CTX.Value("d", 0.0, lock=False)
        procs.append(spawn(loadgen.subscriber, 0, HOST, broker.port, 1, "devices/+/telemetry",
                           1, n * seconds, seconds + loadgen.ACK_GRACE + 10.0, IDLE_GRACE,
                           q, go, pubs_done, True))
        inbox.wait({"sub": 1}, READY_TIMEOUT, broker)
        for i in range(GEN_PROCS):
            procs.append(spawn(loadgen.devices, i, HOST, broker.port, GEN_PROCS, n, seconds,
                               spec["payload"], CONNECT_WINDOW, q, go, start_at,
                               CONNECT_TIME_LIMIT))
        ready = inbox.wait({"dev": GEN_PROCS}, CONNECT_TIME_LIMIT + 5.0, broker)["dev"]
        start = time.monotonic() + 0.5
        start_at.value = start
        go.set()
        _sleep_until(start, broker)
        cpu0 = broker.cpu_seconds()
        _sleep_until(start + seconds, broker)
        cpu = broker.cpu_seconds() - cpu0
        rss = broker.rss_bytes()
        devs = inbox.wait({"dev": GEN_PROCS}, loadgen.ACK_GRACE + 10.0, broker, "result")["dev"]
        pubs_done.set()
        sub = inbox.wait({"sub": 1}, loadgen.ACK_GRACE + 15.0, broker, "result")["sub"][0]
    finally:
        reap(procs)
        stop_broker(broker)
    sent = sum(d["sent"] for d in devs)
    acked = sum(d["acked"] for d in devs)
    lat = sub.get("latency_ms") or {}
    late = [d["late_ms"] for d in devs if d["late_ms"]]
    return {
        "value": round(lat["p99"], 3) if lat else None, "unit": spec["unit"],
        "latency_ms": {k: round(v, 3) for k, v in lat.items()} if lat else None,
        "devices": n, "seconds": seconds, "sent": sent, "expected": sent,
        "delivered": sub["unique"], "duplicates": sub["count"] - sub["unique"],
        "loss_pct": pct(sent - sub["unique"], sent), "acked": acked,
        "puback_missing": sent - acked,
        "broker_cpu_s": round(cpu, 3), "broker_cpu_pct": round(100.0 * cpu / seconds, 1),
        "broker_rss_mb": round(rss / 2 ** 20, 1),
        "connect_s": round(max(r["connect_s"] for r in ready), 3),
        "slow_connects": sum(r["slow"] for r in ready),
        "generator_late_ms": {"p99": round(max(x["p99"] for x in late), 3),
                              "max": round(max(x["max"] for x in late), 3)} if late else None,
        "generator_late_per_process": [{k: round(v, 3) for k, v in x.items()} for x in late],
        "generator_busy_pct": [round(d["busy_pct"], 1) for d in devs],
        "subscriber_busy_pct": round(100.0 * sub["cpu"] / (seconds + 1), 1),
        "subscriber_ended": sub["ended"],
        "generator_processes": GEN_PROCS,
    }


def _sleep_until(t: float, broker) -> None:
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        if not broker.alive():
            raise RunError(f"{broker.name} exited (status {broker.proc.returncode}):\n"
                           + broker.log_tail())
        time.sleep(min(left, 0.5))


RUNNERS = {"pair": run_pair, "versus": run_versus, "idle": run_idle, "edge": run_edge,
           "backlog": run_backlog, "bridge": run_bridge_drain}


def run(name: str, broker_cls, round_no: int, args, variant: tuple = V311_PLAIN) -> dict:
    """One run of scenario ``name`` against a fresh ``broker_cls``, its clients speaking
    ``variant`` (protocol level, properties flavour: ``loadgen.use_protocol``)."""
    spec = SCENARIOS[name]
    loadgen.use_protocol(*variant)
    rec = {"scenario": name, "kind": spec["kind"], "broker": broker_cls.name, "round": round_no,
           "protocol": variant[0], "properties": variant[1]}
    before = cpu_snapshot()
    rec.update(RUNNERS[spec["kind"]](name, spec, broker_cls, round_no, args))
    # The machine is shared: CPU that processes outside this benchmark used during the run.
    rec.update(other_cpu_pct=others_cpu_pct(before), limits=brokers.LIMITS,
               inflight=brokers.INFLIGHT, acl_file=brokers.ACL_FILE,
               edgebroker_limits=brokers.EDGEBROKER_LIMITS,
               broker_cfg=broker_cfg(spec, broker_cls))
    return rec
