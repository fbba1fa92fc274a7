"""Metrics the broker exposes: one snapshot of broker-wide figures, and per-client rows.

``snapshot(broker, now)`` is built from counters the broker keeps up to date
as it goes (no pass over clients or sessions), so it is cheap enough to build
every second. The same dict is what the admin socket's ``stats`` returns and
what the Prometheus endpoint renders (server/metrics_http.py).

``client_rows(broker, now)`` is one dict per connected client. Rates are the
change since the previous time the client was looked at (at most once a
second), so a refreshing ``inspect clients --watch`` shows current rates.

``PassTimes`` keeps the durations of the last 1024 loop passes in a ring:
one store per pass, the quantiles are computed only when asked.
"""

from __future__ import annotations

import heapq

from edgebroker import __version__
from edgebroker.core.catchup import IN_STEP
from edgebroker.core.catchup_run import waiting
from edgebroker.core.limits import DROPS, LIMITS, REFUSALS

PROTOCOL_NAMES = {3: "3.1", 4: "3.1.1", 5: "5.0"}

RING = 1024  # a power of two


class PassTimes:
    __slots__ = ("ring", "index", "count", "total")

    def __init__(self):
        self.ring = [0.0] * RING
        self.index = 0
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        i = self.index
        self.ring[i] = seconds
        self.index = (i + 1) & (RING - 1)
        self.count += 1
        self.total += seconds

    def quantiles(self, *qs: float) -> list[float]:
        n = self.count if self.count < RING else RING
        if not n:
            return [0.0 for _ in qs]
        values = sorted(self.ring[:n])
        return [values[min(n - 1, int(q * n))] for q in qs]


# Rows of `inspect clients` can be sorted by any of these (descending; "id" ascending).
SORT_KEYS = ("msgs_in_rate", "msgs_out_rate", "bytes_in_rate", "bytes_out_rate", "msgs_in",
             "msgs_out", "bytes_in", "bytes_out", "dropped", "throttled_seconds",
             "pending_write_bytes", "queued", "inflight", "subscriptions", "connected_seconds", "id")


def snapshot(broker, now: float) -> dict:
    """Broker-wide figures (JSON-ready): counters, gauges, limits hit, refusals, drops."""
    stats = broker.stats
    p50, p99 = broker.pass_times.quantiles(0.5, 0.99)
    guard = broker.memory
    throttled = broker.throttled_seconds
    for client in broker.throttled:
        throttled += now - client.throttle_start
    timer_entries, timer_entries_dead = broker.timer_figures()
    busy_poll = broker.busy_poll
    contention = broker.cpu_contention
    return {
        "version": __version__,
        "uptime_seconds": now - broker.started,
        "clients_connected": broker.clients_connected,
        "sockets_open": broker.sockets_open,
        "sessions": len(broker.sessions),
        "subscriptions": broker.subscriptions.count + broker.shared_members,
        **broker.shared_figures(),
        "retained_messages": broker.retained.count,
        "topics": len(broker.topics),
        "queued_messages": broker.queued_messages,
        "queued_bytes": broker.queued_bytes,
        "sessions_behind": len(broker.behind),
        "lag_records_max": _max_lag(broker),
        "throttled_clients": len(broker.throttled),
        "throttled_seconds": throttled,
        "timer_entries": timer_entries,
        "timer_entries_dead": timer_entries_dead,
        "counters": stats.as_dict(),
        "limit_hits": dict(broker.limit_hits),
        "refused": dict(broker.refused),
        "dropped": dict(broker.dropped),
        "loop": {"pass_p50_seconds": p50, "pass_p99_seconds": p99,
                 "passes": broker.pass_times.count, "busy_seconds": broker.pass_times.total,
                 "busy_polls_hit": busy_poll.hits if busy_poll is not None else 0,
                 "busy_polls_missed": busy_poll.missed if busy_poll is not None else 0,
                 **_contention(contention)},
        "process": {"rss_bytes": guard.rss, "cpu_seconds": guard.cpu_seconds,
                    "memory_limit_bytes": guard.limit, "memory_over_limit": guard.over,
                    "memory_kept_bytes": guard.kept, "memory_released": guard.released,
                    "allocated_blocks": guard.blocks},
        "log": broker.journal.figures() if broker.journal is not None else None,
        "upload": broker.upload_figures() if broker.upload_figures is not None else None,
        "bridges": (broker.bridge_figures(broker.journal.wall_ms())
                    if broker.bridge_figures is not None else None),
    }


def _max_lag(broker) -> int:
    """Records between the oldest cursor and the head of the log (0: none behind), from the
    first record still in the log (CommitLog.lag)."""
    if not broker.behind or broker.journal is None:
        return 0
    commit_log = broker.journal.log
    oldest = min(s.cursor.unsent(s.queue, s.retained_queued) for s in broker.behind)
    return commit_log.next_offset - max(oldest, commit_log.first_offset)


def client_row(client, now: float) -> dict:
    transport = client.transport
    session = client.session
    rates = _rates(client, transport, now)
    throttled = client.throttled_time
    if client.throttled_until:
        throttled += now - client.throttle_start
    drops = dict(session.drops) if session is not None and session.drops else {}
    return {
        "id": client.client_id,
        "peer": client.peer,
        "listener": client.listener_address,
        # The MQTT version spoken: "3.1", "3.1.1" or "5.0".
        "protocol": PROTOCOL_NAMES.get(client.protocol_level, str(client.protocol_level)),
        "connected_seconds": now - client.created,
        "msgs_in": client.msgs_in,
        "msgs_out": transport.msgs_out,
        "bytes_in": transport.bytes_in,
        "bytes_out": transport.bytes_out,
        "msgs_in_rate": rates[0],
        "msgs_out_rate": rates[1],
        "bytes_in_rate": rates[2],
        "bytes_out_rate": rates[3],
        "dropped": sum(drops.values()),
        "drops": drops,
        "throttled": bool(client.throttled_until),
        "throttled_seconds": throttled,
        "pending_write_bytes": transport.out_bytes,
        "inflight": len(session.inflight) if session is not None else 0,
        "queued": waiting(session) if session is not None else 0,
        "queued_bytes": session.queue_bytes if session is not None else 0,
        "subscriptions": _subscriptions(session) if session is not None else 0,
        "topics_created": client.broker.topics.created_by(client.client_id),
        # Reading from the log (core.catchup): its cursor (None: in step) and lag.
        **(client.broker.lag(session) if session is not None else IN_STEP),
    }


def _subscriptions(session) -> int:
    """Its subscriptions, shared ones included."""
    return len(session.subscriptions) + (len(session.shared) if session.shared else 0)


def _rates(client, transport, now: float) -> tuple:
    """Per-second rates of (msgs in, msgs out, bytes in, bytes out) since the last sample."""
    totals = (client.msgs_in, transport.msgs_out, transport.bytes_in, transport.bytes_out)
    sample = client.rate_sample
    if sample is None:
        since = max(now - client.created, 1.0)     # over at least a second, as later ones
        rates = tuple(v / since for v in totals)
    elif now - sample[0] >= 1.0:
        since = now - sample[0]
        rates = tuple((v - old) / since for v, old in zip(totals, sample[1]))
    else:
        return sample[2]
    client.rate_sample = (now, totals, rates)
    return rates


_RATE_INDEX = {"msgs_in_rate": 0, "msgs_out_rate": 1, "bytes_in_rate": 2, "bytes_out_rate": 3}
_KEYS = {  # the sort key alone, without building a whole row
    "msgs_in": lambda c, now: c.msgs_in,
    "msgs_out": lambda c, now: c.transport.msgs_out,
    "bytes_in": lambda c, now: c.transport.bytes_in,
    "bytes_out": lambda c, now: c.transport.bytes_out,
    "dropped": lambda c, now: sum(c.session.drops.values()) if c.session.drops else 0,
    "throttled_seconds": lambda c, now: c.throttled_time + (
        now - c.throttle_start if c.throttled_until else 0.0),
    "pending_write_bytes": lambda c, now: c.transport.out_bytes,
    "queued": lambda c, now: waiting(c.session),
    "inflight": lambda c, now: len(c.session.inflight),
    "subscriptions": lambda c, now: _subscriptions(c.session),
    "connected_seconds": lambda c, now: now - c.created,
}


def client_rows(broker, now: float, sort: str = "msgs_in_rate", limit: int = 0) -> tuple[int, list]:
    """(number of connected clients, rows sorted by ``sort``, the first ``limit`` or all).

    Only the sort key is computed for every client; whole rows only for those returned.
    """
    clients = [s.client for s in broker.sessions.values() if s.client is not None]
    if sort == "id":
        chosen = (heapq.nsmallest(limit, clients, key=lambda c: c.client_id) if limit
                  else sorted(clients, key=lambda c: c.client_id))
    else:
        if sort in _RATE_INDEX:
            i = _RATE_INDEX[sort]
            value = lambda c: _rates(c, c.transport, now)[i]  # noqa: E731
        else:
            get = _KEYS[sort]
            value = lambda c: get(c, now)  # noqa: E731
        keyed = [(value(c), c.client_id, c) for c in clients]
        order = lambda item: (-item[0], item[1])  # noqa: E731 (largest first, then by id)
        keyed = heapq.nsmallest(limit, keyed, key=order) if limit else sorted(keyed, key=order)
        chosen = [c for _, _, c in keyed]
    return len(clients), [client_row(c, now) for c in chosen]


def all_names() -> dict[str, tuple[str, ...]]:
    return {"limits": LIMITS, "refusals": REFUSALS, "drops": DROPS}


def _contention(contention) -> dict:
    """Whether the loop waits for a CPU (server/contention.py; nothing without a loop)."""
    if contention is None:
        return {"cpu_contended": False, "cpu_contention_episodes": 0,
                "cpu_contended_seconds": 0.0, "cpu_wait_share": 0.0}
    return {"cpu_contended": contention.contended,
            "cpu_contention_episodes": contention.episodes,
            "cpu_contended_seconds": contention.seconds,
            "cpu_wait_share": contention.wait_share}
