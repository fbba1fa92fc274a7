"""The scenarios of bench/run.py: what each one loads the broker with, how it is measured, and
its target from issues 6 and 4 (see bench/README.md).

Each runner starts fresh broker processes, drives them with the load-generator processes of
``loadgen``, and returns one record (a dict, one JSON line) for one broker and round. Every
wait is bounded; every child process and broker is reaped in a ``finally``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import brokers
import loadgen
from bridge_bench import run_bridge_drain
from procs import (CTX, Inbox, RunError, cpu_snapshot, others_cpu_pct, reap, spawn,
                   start_broker, stop_broker)

HOST = "127.0.0.1"
READY_TIMEOUT = 20.0
IDLE_GRACE = 1.0
DEFAULT_TIME_LIMIT = 20.0

EDGE_SECONDS = 30          # the edge workload's publishing window (times --scale, at least 2 s)
EDGE_PAYLOAD = 100
GEN_PROCS = 4              # generator processes for the idle clients and the edge devices
CONNECT_WINDOW = 16        # connection attempts under way at once per generator process
CONNECT_TIME_LIMIT = 60.0  # for opening all connections of a run
SETTLE_MAX = 5.0           # how long to wait for a broker's RSS to stop changing
SETTLE_STEP = 0.25
SETTLE_TOLERANCE = 64 * 1024
STUCK_RCVBUF = 4096        # the stuck subscriber's SO_RCVBUF (the kernel doubles it)
FLOOD_TOPIC = "flood/0"    # nobody subscribes to it
FLOOD_RATE = 20_000        # edgebroker's messages_rate in "throttled" (per client)
# The log-disk ceiling copies edgebroker's default [log] settings and the shape of its writes.
LOG_SEGMENT = 16 << 20     # log.segment_bytes
LOG_RETENTION = 1 << 30    # log.retention_bytes
LOG_FLUSH_S = 0.1          # log.flush_interval_ms
LOG_RECORD_EXTRA = 53      # header (34), client id ("bpub-0-<pid>", about 12), topic "bench/0"
LOG_PASS = 4               # records per write: what one loop pass takes in at 64 KiB
RSS_SAMPLE = 0.05          # s between RSS samples where the kernel's high-water mark is unknown
LOG_QUEUE_TIME_LIMIT = 60.0   # burst_qos1, reconnect_backlog: s for the publishers, and the drain
LOG_QUEUE_IDLE_GRACE = 5.0    # a pause this long in deliveries ends the subscriber (shows as loss)
INFLIGHT_DEFAULT = 20      # max_inflight_messages: edgebroker's default and Mosquitto's
SUB_QOS1_CEILING_MAX = 400_000   # messages for the QoS 1 subscriber's ceiling (at most)


# ----- targets ----------------------------------------------------------------------------------
# A target is a list of checks on edgebroker's figures over the rounds: ("vs", field, op, x)
# compares the ratio of the medians edgebroker/Mosquitto, ("abs", field, op, x, agg) compares
# edgebroker's median (agg "median") or worst round (agg "max"/"min") with x.

def vs_mosquitto(field: str, op: str, x: float) -> tuple:
    return ("vs", field, op, x)


def absolute(field: str, op: str, x: float, agg: str = "median") -> tuple:
    return ("abs", field, op, x, agg)


# "The log is the queue" (docs/persistence.md): edgebroker at its DEFAULT configuration (no
# max_queued_*, max_inflight_messages 20, max_pending_write_bytes 1 MiB: a subscriber that falls
# behind reads from the commit log), Mosquitto with its queues unlimited so that it drops
# nothing either (max_queued_messages 0 and max_queued_bytes 0 are "no maximum") and its
# default window, which is edgebroker's too.
LOG_QUEUE_CFG = {
    "edgebroker": {"limits": {"max_inflight_messages": None, "max_queued_messages": None,
                              "max_queued_bytes": None, "max_pending_write_bytes": None}},
    "mosquitto": {"limits": {"max_inflight_messages": INFLIGHT_DEFAULT,
                             "max_queued_messages": 0, "max_queued_bytes": 0}},
}
NO_LOSS = absolute("loss_pct", "<=", 0.0, "max")

RSS_PER_CONNECTION_MAX = 1536    # bytes: issue 4 and 6, "1.5 KB" at 10,000 connections
EDGE_TARGET = [vs_mosquitto("broker_cpu_pct", "<=", 2.0), absolute("value", "<=", 5.0),
               absolute("loss_pct", "<=", 0.0, "max"), absolute("puback_missing", "<=", 0, "max")]
KEPT_TARGET = [absolute("kept_pct", ">", 80.0)]   # issue 4: costing the pair < 20 %


# ----- scenario definitions -----------------------------------------------------------------------

def _pair(about, pubs, subs, sub_procs, qos, payload, count, window, sub_filter, unit="msg/s",
          **extra) -> dict:
    return dict(kind="pair", about=about, pubs=pubs, subs=subs, sub_procs=sub_procs, qos=qos,
                payload=payload, count=count, window=window, sub_filter=sub_filter, unit=unit,
                **extra)


def _fanin_qos1(durability: str, target=None) -> dict:
    return _pair(f"4 publishers (window 100) -> 1 QoS 1 subscriber on bench/+, 64 B payloads; "
                 f"edgebroker's [log] durability = \"{durability}\"",
                 4, 1, 1, 1, 64, 100_000, 100, "bench/+", time_limit=10.0,
                 broker_cfg={"edgebroker": {"log": {"durability": durability}}}, target=target)


def _connections_cfg(n: int) -> dict:
    """Neither broker may refuse any of ``n`` connections, nor run out of file descriptors."""
    return {"edgebroker": {"limits": {"max_connections": n + 100, "max_connection_rate": 0},
                           "nofile": n + 1000},
            "mosquitto": {"mosquitto": ["max_connections -1"], "nofile": n + 1000}}


def _idle(n: int, target) -> dict:
    return dict(kind="idle", about=f"{n:,} idle connections (keepalive 600 s), opened by "
                                   f"{GEN_PROCS} processes", conns=n, unit="B/conn",
                broker_cfg=_connections_cfg(n), target=target)


def _edge(n: int) -> dict:
    return dict(kind="edge", about=f"{n:,} devices, each one {EDGE_PAYLOAD} B QoS 1 message per "
                                   f"second on devices/<id>/telemetry, 1 subscriber on "
                                   f"devices/+/telemetry; {EDGE_SECONDS} s",
                devices=n, payload=EDGE_PAYLOAD, unit="ms p99",
                broker_cfg=_connections_cfg(n + 10), target=EDGE_TARGET,
                target_text="CPU ≤ 2× mosq; p99 ≤ 5 ms; no loss, no PUBACK missing")


SCENARIOS = {
    "fanin_qos0": _pair("4 publishers -> 1 subscriber on bench/+, QoS 0, 64 B payloads",
                        4, 1, 1, 0, 64, 250_000, 0, "bench/+",
                        target=[vs_mosquitto("value", ">=", 0.5)]),
    "fanout_qos0": _pair("1 publisher -> 50 subscribers on bench/0, QoS 0, 64 B payloads",
                         1, 50, 2, 0, 64, 50_000, 0, "bench/0",
                         target=[vs_mosquitto("value", ">=", 0.5)]),
    "fanout_qos1": _pair("1 publisher (window 100) -> 50 QoS 1 subscribers on bench/0, 64 B "
                         "payloads; edgebroker's default durability (\"batch\")",
                         1, 50, 2, 1, 64, 20_000, 100, "bench/0"),
    "fanin_qos1_none": _fanin_qos1("none"),
    "fanin_qos1_batch": _fanin_qos1("batch", [vs_mosquitto("value", ">=", 0.5)]),
    "fanin_qos1_sync": _fanin_qos1("sync"),
    "large_64k": _pair("1 publisher -> 1 subscriber, QoS 0, 64 KiB payloads",
                       1, 1, 1, 0, 65_536, 40_000, 0, "bench/0", unit="MB/s",
                       target=[vs_mosquitto("value", ">=", 0.8)]),
    "idle_1000": _idle(1_000, [vs_mosquitto("connect_rate", ">=", 0.5)]),
    "idle_10000": _idle(10_000, [absolute("value", "<=", RSS_PER_CONNECTION_MAX),
                                 vs_mosquitto("connect_rate", ">=", 0.5)]),
    "edge_5000": _edge(5_000),
    "edge_10000": _edge(10_000),
    "slow_consumer": dict(
        kind="versus", disturb="stuck", load="fanin_qos0", unit="msg/s",
        about="the fanin_qos0 load with and without a stuck subscriber on bench/+ (never reads, "
              f"SO_RCVBUF {STUCK_RCVBUF}); edgebroker with its default max_pending_write_bytes",
        broker_cfg={"edgebroker": {"limits": {"max_pending_write_bytes": None}}},
        target=KEPT_TARGET),
    "throttled": dict(
        kind="versus", disturb="flood", unit="msg/s",
        load=_pair("1 QoS 1 publisher (window 1) -> 1 QoS 1 subscriber on bench/+, 64 B",
                   1, 1, 1, 1, 64, 30_000, 1, "bench/+", time_limit=10.0),
        about="a QoS 1 pair (window 1) with and without a client flooding QoS 0 to "
              f"{FLOOD_TOPIC} as fast as it can; edgebroker throttles it with messages_rate = "
              f"{FLOOD_RATE:,} (Mosquitto has no publish rate limit)",
        broker_cfg={"edgebroker": {"limits": {"messages_rate": FLOOD_RATE}}},
        target=KEPT_TARGET),
    "burst_qos1": _pair(
        "4 publishers (window 100 each) -> 1 QoS 1 subscriber on bench/+, 1,000,000 "
        "(× --scale) QoS 1 messages of 64 B (keyed: loss and duplicates counted per message); "
        "edgebroker at its default configuration (log as the queue, max_inflight_messages 20), "
        "Mosquitto with max_queued_messages 0, max_queued_bytes 0 (no limit) and "
        "max_inflight_messages 20 (its default and edgebroker's)",
        4, 1, 1, 1, 64, 250_000, 100, "bench/+", time_limit=LOG_QUEUE_TIME_LIMIT,
        keyed=True, peak_rss=True, idle_grace=LOG_QUEUE_IDLE_GRACE, broker_cfg=LOG_QUEUE_CFG,
        target=[vs_mosquitto("value", ">=", 1.0), vs_mosquitto("broker_rss_peak_mb", "<=", 0.25),
                NO_LOSS]),
    "reconnect_backlog": dict(
        kind="backlog", unit="msg/s",
        about="a persistent (clean session 0) QoS 1 subscriber on bench/+ subscribes and leaves; "
              "4 publishers (window 100 each) send 1,000,000 (× --scale) QoS 1 messages of "
              "64 B (keyed); it reconnects and drains the backlog: msg/s from reconnect to last "
              "message; "
              "edgebroker at its default configuration (log as the queue), Mosquitto with "
              "max_queued_messages 0, max_queued_bytes 0 (no limit), max_inflight_messages 20 "
              "(its default and edgebroker's), persistence false",
        pubs=4, qos=1, payload=64, count=250_000, window=100, sub_filter="bench/+",
        time_limit=LOG_QUEUE_TIME_LIMIT, idle_grace=LOG_QUEUE_IDLE_GRACE,
        broker_cfg=LOG_QUEUE_CFG, target=[absolute("value", ">=", 200_000), NO_LOSS]),
    "reconnect_backlog_busy": dict(
        kind="backlog", unit="msg/s", busy=1,
        about="reconnect_backlog with one more busy process (a Python loop, bounded by the "
              "time limit) running through the drain, as other programs on a gateway: every "
              "CPU of this 2-core machine is then wanted (docs/persistence.md, \"Busy CPUs\")",
        pubs=4, qos=1, payload=64, count=250_000, window=100, sub_filter="bench/+",
        time_limit=LOG_QUEUE_TIME_LIMIT, idle_grace=LOG_QUEUE_IDLE_GRACE,
        broker_cfg=LOG_QUEUE_CFG, target=[NO_LOSS]),
    "bridge_drain": dict(
        kind="bridge", unit="msg/s", brokers=("edgebroker",),   # Mosquitto is the remote
        about="a backlog of 1,000,000 (× --scale) QoS 0 messages of 64 B in edgebroker's log, "
              "drained by a [[bridge]] (QoS 1, window 100) to a loopback Mosquitto started "
              "after the backlog was logged: msg/s from its start to the last acknowledgement; "
              "the gateway's RSS with the backlog and its peak during the drain, and how much its "
              "heap grew (issue 25: >= 50,000 msg/s, RSS flat; the file-backed part grows "
              "with the log index pages read). Mosquitto has no row: it is the remote",
        count=1_000_000, window=100, time_limit=120.0,
        target=[absolute("value", ">=", 50_000),
                absolute("rss_anon_growth_mb", "<=", 4.0, "max")]),
}


def load_of(spec: dict) -> dict:
    """The publisher/subscriber load of a "pair" or "versus" scenario."""
    load = spec.get("load", spec)
    return SCENARIOS[load] if isinstance(load, str) else load


def broker_cfg(spec: dict, broker_cls) -> dict:
    return spec.get("broker_cfg", {}).get(broker_cls.name, {})


def scaled(spec: dict, scale: float) -> int:
    return max(1, int(spec["count"] * scale))


def time_limit(spec: dict, args) -> float:
    """--time-limit when given, else the scenario's own, else 20 s."""
    return args.time_limit or spec.get("time_limit", DEFAULT_TIME_LIMIT)


def edge_seconds(args) -> int:
    return max(2, round(EDGE_SECONDS * args.scale))


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _pct(part, whole, digits: int = 3):
    return round(100.0 * part / whole, digits) if whole else None


class PeakRss:
    """The broker's peak RSS over a phase (from construction to ``peak``): the kernel's
    high-water mark (VmHWM), reset at the start (``clear_refs``); where that does not work,
    the largest of samples taken every RSS_SAMPLE s by a thread."""

    def __init__(self, broker):
        self.broker = broker
        self.samples = [broker.rss_bytes()]
        self.done = threading.Event()
        self.result = None
        self.thread = None
        self.hwm = broker.reset_peak_rss() and broker.peak_rss_bytes() is not None
        if not self.hwm:
            self.thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
            self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(RSS_SAMPLE):
            try:
                self.samples.append(self.broker.rss_bytes())
            except Exception:       # the broker is gone: the run reports that itself
                return

    def peak(self) -> tuple[int | None, str]:
        """(peak RSS in bytes, how it was measured); the first call ends the phase."""
        if self.result is None:
            self.done.set()
            if self.thread is not None:
                self.thread.join(1.0)
            got = self.broker.peak_rss_bytes() if self.hwm else None
            if got is not None:
                self.result = (got, "VmHWM")
            else:
                try:
                    self.samples.append(self.broker.rss_bytes())
                except Exception:
                    pass
                self.result = (max(self.samples), f"sampled every {RSS_SAMPLE:g} s")
        return self.result


OWN_COUNTERS = ("publish_received", "publish_sent", "publish_dropped", "publish_lost",
                "publish_not_logged", "sessions_fell_behind", "sessions_caught_up")


def own_figures(stats: dict) -> dict:
    """What edgebroker's admin socket says about drops and sessions behind (the JSON keeps it
    next to the generator's own count)."""
    counters = stats.get("counters") or {}
    loop = stats.get("loop") or {}
    return {"dropped": stats.get("dropped"), "sessions_behind": stats.get("sessions_behind"),
            "lag_records_max": stats.get("lag_records_max"),
            **{k: counters.get(k) for k in OWN_COUNTERS},
            **{k: loop.get(k) for k in ("passes", "busy_seconds", "busy_polls_hit",
                                        "busy_polls_missed")}}


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
        per_proc = _split(spec["subs"], spec["sub_procs"])
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
        "loss_pct": _pct(expected - delivered, expected),
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
        "sent": sent, "acked": acked, "loss_pct": _pct(acked - delivered, acked),
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
        shares = _split(n, GEN_PROCS)
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
        "connected": connected, "alive": alive, "loss_pct": _pct(n - alive, n),
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
        "loss_pct": _pct(sent - sub["unique"], sent), "acked": acked,
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


V311_PLAIN = (4, "none")    # the default variant: MQTT 3.1.1 clients


def variant_label(level: int, flavour: str = "none") -> str:
    """"3.1.1", "5.0", or "5.0+<flavour>" (run.py --protocol, --properties)."""
    if level == 4:
        return "3.1.1"
    return "5.0" if flavour == "none" else f"5.0+{flavour}"


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


# ----- generator ceiling ------------------------------------------------------------------------

def _subscriber_ceiling(n: int, limit: float, qos: int, feeder_extra: tuple,
                        sub_extra: tuple) -> tuple[dict, float]:
    """One subscriber process against a stand-in feeding it ``n`` messages: (its result,
    seconds from its first message to its last)."""
    with _listener() as listen:
        procs = []
        try:
            inbox = Inbox()
            go = CTX.Event()
            done = CTX.Event()
            done.set()
            procs.append(spawn(loadgen.feeder, listen, "bench/0", 64, n, limit, inbox.q, go,
                               *feeder_extra))
            procs.append(spawn(loadgen.subscriber, 0, HOST, listen.getsockname()[1], 1,
                               "bench/+", qos, n, limit, IDLE_GRACE, inbox.q, go, done,
                               *sub_extra))
            inbox.wait({"sub": 1}, READY_TIMEOUT)
            go.set()
            sub = inbox.wait({"sub": 1}, limit + 15.0, kind="result")["sub"][0]
        finally:
            reap(procs)
    return sub, (sub["last"] - sub["first"]) if sub["first"] is not None else 0


def ceiling(args, names: list[str], variant: tuple = V311_PLAIN) -> dict:
    """The generator against stand-ins for the broker that do (almost) nothing, for the parts
    of the generator the chosen scenarios use, its clients speaking ``variant``."""
    loadgen.use_protocol(*variant)
    specs = [SCENARIOS[n] for n in names]
    loads = [load_of(s) for s in specs if s["kind"] in ("pair", "versus", "backlog")]
    out = {}
    limit = args.time_limit or DEFAULT_TIME_LIMIT
    wanted = []
    if any(ld["qos"] == 0 and ld["pubs"] > 1 for ld in loads):
        wanted.append(("publishers_qos0", 4, 0, 0, "discard",
                       scaled(SCENARIOS["fanin_qos0"], args.scale)))
    if any(ld["qos"] == 1 and ld["window"] > 1 for ld in loads):
        wanted.append(("publishers_qos1_w100", 4, 1, 100, "ack",
                       scaled(SCENARIOS["fanin_qos1_batch"], args.scale)))
    if any(ld["qos"] == 1 and ld["window"] == 1 for ld in loads):
        wanted.append(("publisher_qos1_w1", 1, 1, 1, "ack",
                       scaled(SCENARIOS["throttled"]["load"], args.scale)))
    for label, npubs, qos, window, mode, n in wanted:
        with _listener() as listen:
            procs = []
            try:
                inbox = Inbox()
                go = CTX.Event()
                procs.append(spawn(loadgen.sink, listen, npubs, mode, limit, inbox.q))
                for i in range(npubs):
                    procs.append(spawn(loadgen.publisher, i, HOST, listen.getsockname()[1],
                                       f"bench/{i}", 64, qos, n, window, limit, inbox.q, go))
                inbox.wait({"pub": npubs}, READY_TIMEOUT)
                go.set()
                res = inbox.wait({"pub": npubs, "sink": 1}, limit + 15.0, kind="result")
            finally:
                reap(procs)
        pubs = res["pub"]
        sent = sum(p["sent"] for p in pubs)
        span = max(p["t_end"] for p in pubs) - min(p["t_start"] for p in pubs)
        out[label + " msg/s"] = round(sent / span, 1) if span > 0 else None

    if any(ld["qos"] == 0 for ld in loads):
        n = 4 * scaled(SCENARIOS["fanin_qos0"], args.scale)
        sub, span = _subscriber_ceiling(n, limit, 0, (), ())
        out["subscriber_qos0 msg/s"] = round(sub["count"] / span, 1) if span > 0 else None

    if any(ld.get("keyed") or ld["kind"] == "backlog" for ld in loads):
        # The keyed QoS 1 subscriber behind a window of INFLIGHT_DEFAULT: a broker that sends
        # the next messages as PUBACKs free the window cannot deliver faster than this.
        n = min(4 * scaled(SCENARIOS["burst_qos1"], args.scale), SUB_QOS1_CEILING_MAX)
        sub, span = _subscriber_ceiling(n, limit, 1, (INFLIGHT_DEFAULT,), (False, True))
        out[f"subscriber_qos1_w{INFLIGHT_DEFAULT} msg/s"] = (round(sub["unique"] / span, 1)
                                                             if span > 0 else None)

    idle = [s["conns"] for s in specs if s["kind"] == "idle"]
    if idle:
        out.update(_idle_ceiling(max(idle)))
    edge = [s["devices"] for s in specs if s["kind"] == "edge"]
    if edge:
        out.update(_edge_ceiling(max(edge), args))
    big = [s for s in specs if s["kind"] == "pair" and s["unit"] == "MB/s"]
    if big:
        out.update(log_disk_ceiling(scaled(big[0], args.scale), big[0]["payload"]))
    return out


def log_disk_ceiling(records: int, payload: int, directory: str | None = None) -> dict:
    """What the brokers' state disk takes of a log of ``records`` records of ``payload``
    bytes, written by plain ``pwritev`` calls (no broker, no per-record Python): the bytes
    edgebroker writes, ``LOG_PASS`` records per call, in ``LOG_SEGMENT`` files, the way
    edgebroker's log and flusher write them with their defaults. A second thread fdatasyncs the
    file being written every ``LOG_FLUSH_S``, and a full one once, then drops it from the page
    cache. Past ``LOG_RETENTION`` the writer deletes the oldest file while it is still open,
    and the second thread closes it, so that freeing its blocks (which can wait for the disk:
    a discard) does not hold the writer, as in edgebroker.

    Returns the payload MB/s the disk sustained (a broker that logs every byte forwards no
    faster) and the writing thread's CPU time per record (what the write alone costs the
    thread that makes it)."""
    root = tempfile.mkdtemp(prefix="bench-logdisk-", dir=directory or brokers.state_root()[0])
    chunk = os.urandom(payload + LOG_RECORD_EXTRA)
    parts = [chunk] * LOG_PASS
    lock = threading.Lock()
    # full: descriptors of files to sync once (kept open until deleted);
    # doomed: descriptors of deleted files, to close (in the pass after they were listed, so
    # never while the same pass syncs them)
    state = {"fd": -1, "full": [], "doomed": [], "stop": False, "error": None}

    def sync() -> None:
        while True:
            with lock:
                stop = state["stop"]
                full, state["full"] = state["full"], []
                doomed, state["doomed"] = state["doomed"], []
                fd = os.dup(state["fd"]) if state["fd"] >= 0 else -1
            try:
                for f in doomed:
                    os.close(f)
                for f in full:
                    os.fdatasync(f)
                    os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
                if fd >= 0:
                    os.fdatasync(fd)
            except OSError as exc:
                state["error"] = exc
                return
            finally:
                if fd >= 0:
                    os.close(fd)
            if stop:
                return
            time.sleep(LOG_FLUSH_S)

    syncer = threading.Thread(target=sync, name="logdisk-sync")
    files: list[tuple[str, int]] = []    # (path, descriptor), oldest first
    written = position = 0
    total = records * len(chunk)
    try:
        syncer.start()
        cpu0 = time.thread_time()
        t0 = time.monotonic()
        while written < total and state["error"] is None:
            if state["fd"] < 0 or position + len(chunk) * LOG_PASS > LOG_SEGMENT:
                path = os.path.join(root, f"{written:020d}.seg")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
                files.append((path, fd))
                with lock:
                    if state["fd"] >= 0:
                        state["full"].append(state["fd"])
                    state["fd"] = fd
                position = 0
                while len(files) * LOG_SEGMENT > LOG_RETENTION:
                    old_path, old_fd = files.pop(0)
                    os.unlink(old_path)
                    with lock:
                        state["full"] = [f for f in state["full"] if f != old_fd]
                        state["doomed"].append(old_fd)
            n = os.pwritev(state["fd"], parts, position)
            position += n
            written += n
        with lock:
            state["stop"] = True
        syncer.join()
        elapsed = time.monotonic() - t0
        cpu = time.thread_time() - cpu0
    finally:
        with lock:
            state["stop"] = True
        if syncer.is_alive():
            syncer.join()
        with lock:
            for f in state["doomed"]:
                os.close(f)
        for path, fd in files:
            os.close(fd)
            os.unlink(path)
        os.rmdir(root)
    if state["error"] is not None:
        raise RunError(f"log-disk ceiling: {state['error']}")
    done = written / len(chunk)
    size = f"{payload >> 10} KiB" if payload >= 1024 else f"{payload} B"
    return {f"log disk, {size} records MB/s": round(done * payload / elapsed / 1e6, 1),
            "log disk write CPU us/record": round(1e6 * cpu / done, 1)}


class _listener:
    """A listening socket on loopback for a stand-in broker, closed on exit."""

    def __init__(self, backlog: int = 1024):
        self.sock = socket.socket()
        self.backlog = backlog

    def __enter__(self) -> socket.socket:
        self.sock.bind((HOST, brokers.free_port()))
        self.sock.listen(self.backlog)
        return self.sock

    def __exit__(self, *exc) -> None:
        self.sock.close()


def _idle_ceiling(n: int) -> dict:
    """Connect rate of the idle-client processes against a stand-in that only answers."""
    brokers.raise_nofile(n + 1000)
    with _listener() as listen:
        procs = []
        release = CTX.Event()
        try:
            inbox = Inbox()
            go = CTX.Event()
            sweep = CTX.Event()
            procs.append(spawn(loadgen.acceptor, listen, n, CONNECT_TIME_LIMIT, inbox.q))
            shares = _split(n, GEN_PROCS)
            for i, k in enumerate(shares):
                procs.append(spawn(loadgen.idle_clients, i, HOST, listen.getsockname()[1], k, 600,
                                   CONNECT_WINDOW, CONNECT_TIME_LIMIT, inbox.q, go, sweep,
                                   release))
            inbox.wait({"idle": len(shares)}, READY_TIMEOUT)
            go.set()
            conn = inbox.wait({"idle": len(shares)}, CONNECT_TIME_LIMIT, kind="connected")["idle"]
            sweep.set()
            inbox.wait({"idle": len(shares)}, CONNECT_TIME_LIMIT, kind="result")
            release.set()
            inbox.wait({"acceptor": 1}, 15.0, kind="result")
        finally:
            release.set()
            reap(procs)
    span = max(c["t_end"] for c in conn) - min(c["t_start"] for c in conn)
    return {f"connect_{n} conn/s": round(n / span, 1) if span > 0 else None}


def _edge_ceiling(n: int, args) -> dict:
    """The device processes against a stand-in that answers PUBACKs: how late their schedule
    runs when the broker costs nothing (3 s of sending)."""
    brokers.raise_nofile(n + 1000)
    seconds = 3
    with _listener() as listen:
        procs = []
        try:
            inbox = Inbox()
            go = CTX.Event()
            start_at = CTX.Value("d", 0.0, lock=False)
            procs.append(spawn(loadgen.acceptor, listen, n, CONNECT_TIME_LIMIT + seconds + 15,
                               inbox.q))
            for i in range(GEN_PROCS):
                procs.append(spawn(loadgen.devices, i, HOST, listen.getsockname()[1], GEN_PROCS,
                                   n, seconds, EDGE_PAYLOAD, CONNECT_WINDOW, inbox.q, go,
                                   start_at, CONNECT_TIME_LIMIT))
            inbox.wait({"dev": GEN_PROCS}, CONNECT_TIME_LIMIT + 5.0)
            start_at.value = time.monotonic() + 0.2
            go.set()
            devs = inbox.wait({"dev": GEN_PROCS}, seconds + loadgen.ACK_GRACE + 10.0,
                              kind="result")["dev"]
        finally:
            reap(procs)
    late = [d["late_ms"] for d in devs if d["late_ms"]]
    return {f"edge_{n} late p99 ms": round(max(x["p99"] for x in late), 3) if late else None,
            f"edge_{n} late max ms": round(max(x["max"] for x in late), 3) if late else None,
            f"edge_{n} busy % per process": max(round(d["busy_pct"], 1) for d in devs)}
