"""The scenarios of bench/run.py: what each one loads the broker with, how it is measured, and
its target from issues 6 and 4 (see bench/README.md), with the small helpers the runners and
the ceilings use (a scenario's load, broker settings, scaled counts and time limit, the
broker's peak RSS, edgebroker's own figures, the protocol variants).

The runners that carry a scenario out are in ``runners``; the generator's and the log disk's
ceilings in ``ceiling``. Both import this module, never the other way round.
"""

from __future__ import annotations

import threading

HOST = "127.0.0.1"
READY_TIMEOUT = 20.0
IDLE_GRACE = 1.0
DEFAULT_TIME_LIMIT = 20.0

EDGE_SECONDS = 30          # the edge workload's publishing window (times --scale, at least 2 s)
EDGE_PAYLOAD = 100
GEN_PROCS = 4              # generator processes for the idle clients and the edge devices
CONNECT_WINDOW = 16        # connection attempts under way at once per generator process
CONNECT_TIME_LIMIT = 60.0  # for opening all connections of a run
STUCK_RCVBUF = 4096        # the stuck subscriber's SO_RCVBUF (the kernel doubles it)
FLOOD_TOPIC = "flood/0"    # nobody subscribes to it
FLOOD_RATE = 20_000        # edgebroker's messages_rate in "throttled" (per client)
RSS_SAMPLE = 0.05          # s between RSS samples where the kernel's high-water mark is unknown
LOG_QUEUE_TIME_LIMIT = 60.0   # burst_qos1, reconnect_backlog: s for the publishers, and the drain
LOG_QUEUE_IDLE_GRACE = 5.0    # a pause this long in deliveries ends the subscriber (shows as loss)
INFLIGHT_DEFAULT = 20      # max_inflight_messages: edgebroker's default and Mosquitto's


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
    # (issue 22's target: 1.0x; the first benchmark issue asked 0.8x)
    "large_64k": _pair("1 publisher -> 1 subscriber, QoS 0, 64 KiB payloads",
                       1, 1, 1, 0, 65_536, 40_000, 0, "bench/0", unit="MB/s",
                       target=[vs_mosquitto("value", ">=", 1.0)]),
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


def split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def pct(part, whole, digits: int = 3):
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


# ----- protocol variants -------------------------------------------------------------------------

V311_PLAIN = (4, "none")    # the default variant: MQTT 3.1.1 clients


def variant_label(level: int, flavour: str = "none") -> str:
    """"3.1.1", "5.0", or "5.0+<flavour>" (run.py --protocol, --properties)."""
    if level == 4:
        return "3.1.1"
    return "5.0" if flavour == "none" else f"5.0+{flavour}"

