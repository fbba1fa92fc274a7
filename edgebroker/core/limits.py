"""Limits: the pieces the broker uses to keep devices from hurting each other.

No sockets and no clock of their own (times are passed in), so each piece is
tested with plain numbers:

- ``TokenBucket`` (edgebroker/rates.py): a rate with a burst.
- ``PublishRate``: the messages and bytes buckets of one client.
- ``ControlRate``: the control packet rate, one number per client.
- ``TopicTable``: the distinct topics the broker tracks, who created them, and
  their expiry. It is a cache of admission decisions (a topic published to in
  the current period is in ``current``: one dict lookup per PUBLISH on the hot
  path) and the bound on retained messages, the only per-topic state that
  lasts. Generations: at each rotation the previous one (topics idle for a
  whole period) is forgotten unless retained; when the table is full a new
  topic evicts one not published to lately instead of being refused, so the
  clients that create topics fastest are refused by their own
  ``max_topics_per_client``, not everyone by ``max_topics``. No pass ever
  scans topics that are in use.
- ``EventLog``: one log line per event kind per period, with the number of
  suppressed repeats, for broker-wide events (a connection flood).
- ``PeerLog``: the lines about refused or misbehaving connections, one per
  kind and source address per period, then a count, so that an attack cannot
  flood the log.

Names of limits (``LIMITS``), refusal reasons (``REFUSALS``) and drop
reasons (``DROPS``) are listed here once; metrics, $SYS and the admin socket
publish every one of them, zero or not.
"""

from __future__ import annotations

import logging
import math

from edgebroker.rates import TokenBucket

# Limit names, as counted in Broker.limit_hits (docs/limits.md says what one hit is).
LIMITS = (
    "max_connections", "listener_max_connections", "max_connection_rate", "connect_timeout",
    "max_keepalive", "max_packet_size", "max_client_id_length", "max_topic_length",
    "max_topic_levels", "max_topics", "max_topics_per_client", "max_subscriptions_per_client",
    "max_inflight_messages", "max_inflight_bytes", "max_queued_messages", "max_queued_bytes",
    "max_pending_write_bytes", "messages_rate", "bytes_rate", "memory_limit", "open_files",
    "max_lag_bytes", "max_lag_age", "max_sessions", "control_rate", "receive_maximum",
)

# Why a connection was refused (CONNACK != 0, or closed before CONNECT for not speaking MQTT).
REFUSALS = (
    "max_connections", "listener_max_connections", "memory_limit", "max_client_id_length",
    "max_keepalive", "client_id", "protocol_version", "tls", "http", "not_mqtt", "auth",
    "auth_busy", "websocket", "max_sessions", "open_files", "payload_format", "max_topic_length",
    "max_topic_levels", "will", "packet_too_large",
)

# Why an application message was dropped (not delivered to one subscriber, or not routed).
DROPS = (
    "max_queued_messages", "max_queued_bytes", "max_pending_write_bytes", "max_topics",
    "max_topics_per_client", "max_topic_length", "max_topic_levels", "memory_limit", "sys_topic",
    "acl", "max_lag", "log_gap", "not_logged", "session_expired", "message_expired",
    "packet_too_large", "payload_format", "shared_no_room", "shared_left", "bridge_in",
    "bridge_refused", "bridge_unsendable", "bridge_link_lost", "restart_qos0",
)


def zero_counts(names) -> dict[str, int]:
    return {name: 0 for name in names}


# A throttled client is read again once this many seconds' worth of its rate is back (at most
# its burst): waking it for every single token would cost two epoll_ctl and a timer each time.
RESUME_SECONDS = 0.02


def burst_of(rate: float, burst: int) -> float:
    """A configured burst, where 0 means one second's worth of the rate (at least 1)."""
    return float(burst) if burst else max(1.0, float(math.ceil(rate)))


class PublishRate:
    """A client's publish budget: messages per second and bytes per second."""

    __slots__ = ("messages", "bytes")

    def __init__(self, limits, now: float):
        self.messages = (TokenBucket(limits.messages_rate,
                                     burst_of(limits.messages_rate, limits.messages_burst), now)
                         if limits.messages_rate > 0 else None)
        self.bytes = (TokenBucket(limits.bytes_rate, burst_of(limits.bytes_rate, limits.bytes_burst),
                                  now)
                      if limits.bytes_rate > 0 else None)

    @staticmethod
    def for_limits(limits, now: float) -> "PublishRate | None":
        if limits.messages_rate > 0 or limits.bytes_rate > 0:
            return PublishRate(limits, now)
        return None

    def charge(self, size: int, now: float) -> tuple[str, float] | None:
        """Account one PUBLISH of ``size`` bytes; (limit name, seconds to wait) when over."""
        over = None
        bucket = self.messages
        if bucket is not None and not bucket.spend(1, now):
            over = ("messages_rate", bucket.wait_for_share(RESUME_SECONDS))
        bucket = self.bytes
        if bucket is not None and not bucket.spend(size, now):
            wait = bucket.wait_for_share(RESUME_SECONDS)
            if over is None or wait > over[1]:
                over = ("bytes_rate", wait)
        return over


# What a CONNECT may hold beyond its client id and will topic: a will payload, a user name and
# a password of up to 65,535 bytes each (2 length bytes each), and 64 KiB for MQTT 5.0
# properties (CONNECT and will) and the fixed and variable headers.
_CONNECT_FIELDS = 3 * (2 + 65535) + 65536 + 15


def connect_size_limit(limits) -> int:
    """The largest packet read from a connection before its CONNECT has arrived: the largest
    CONNECT the limits let through (a client id of max_client_id_length, a will topic of
    max_topic_length, ``_CONNECT_FIELDS``), or max_packet_size if smaller. So a caller that
    has not connected holds at most that much of the broker's memory until connect_timeout,
    not max_packet_size (docs/limits.md)."""
    return min(limits.max_packet_size, 2 + limits.max_client_id_length + 2
               + limits.max_topic_length + _CONNECT_FIELDS)


class ControlRate:
    """``control_rate``/``control_burst``: the packets a client sends that are neither PUBLISH
    nor one of its acknowledgements (PINGREQ, SUBSCRIBE, UNSUBSCRIBE, AUTH, and an
    acknowledgement for no message in flight; core.handlers.acks charges some by their
    content). One object for the broker; what a client has used is one number it keeps
    (``Client.control_due``), so that the limit, on by default, costs an idle connection no
    bucket of its own (bench idle_10000: memory per connection).

    The number is when the client's budget is whole again (the "theoretical arrival time" of
    the generic cell rate algorithm): each packet moves it ``interval`` later, from now at the
    earliest; while it is at most ``burst`` intervals ahead, tokens are left, as in a token
    bucket of ``burst`` tokens filling at ``rate`` a second (``TokenBucket``). The packet that
    takes the last token is handled; then the client is not read until about RESUME_SECONDS'
    worth of the rate is back (at most the burst)."""

    __slots__ = ("rate", "interval", "ahead", "resume")

    def __init__(self, rate: float, burst: int):
        self.rate = rate
        self.interval = 1.0 / rate
        burst = burst_of(rate, burst)
        self.ahead = (burst - 1.0) * self.interval        # the most a client may be ahead
        back = min(burst, max(1.0, rate * RESUME_SECONDS))  # tokens back before reading again
        self.resume = (burst - back) * self.interval

    @staticmethod
    def for_limits(limits) -> "ControlRate | None":
        return (ControlRate(limits.control_rate, limits.control_burst)
                if limits.control_rate > 0 else None)

    def charge(self, due: float, now: float, n: int = 1) -> tuple[float, float]:
        """``n`` packets at ``now`` from a client whose number is ``due``: (its new number,
        seconds not to read it; 0.0 while it has tokens left)."""
        due = (due if due > now else now) + n * self.interval
        if due - now <= self.ahead + 1e-9:
            return due, 0.0
        return due, due - now - self.resume

    def allowed(self, due: float, now: float) -> int:
        """How many packets a client whose number is ``due`` may send at ``now`` before it is
        throttled: its tokens left, and the one that takes the last (at least 1)."""
        ahead = self.ahead + 1e-9 - (due - now if due > now else 0.0)
        return max(1, math.floor(ahead / self.interval) + 1)


class TopicTable:
    """The distinct topic names the broker tracks (see the module doc): admitted names, so
    that a PUBLISH to one costs a dictionary lookup, and who created each.

    Three dicts, topic -> creator's client id: ``current`` (published to since the last
    rotation: the hot path's view), ``previous`` (published to in the period before, not
    since) and ``kept`` (idle topics holding a retained message, never evicted). When the
    table is full, a new topic takes the place of one from ``previous`` (``evict``); with
    ``previous`` empty the period ends early (``current`` becomes ``previous``, in O(1)).
    So a topic nobody published to lately goes first, and only the retained messages, the
    one per-topic state that lasts, can fill the table.
    """

    __slots__ = ("current", "previous", "kept", "per_client", "evicted")

    def __init__(self):
        self.current: dict[str, str] = {}    # topic -> client id that created it
        self.previous: dict[str, str] = {}
        self.kept: dict[str, str] = {}       # idle, with a retained message
        self.per_client: dict[str, int] = {}  # client id -> tracked topics it created
        self.evicted = 0                      # topics evicted for a new one, ever

    def __len__(self) -> int:
        return len(self.current) + len(self.previous) + len(self.kept)

    def admit(self, topic: str, client_id: str, limits, memory_over: bool, retained,
              retain: bool) -> str | None:
        """A PUBLISH to ``topic`` (not in ``current``): None if admitted, else the refusing
        limit. ``retained(topic)`` says whether a topic holds a retained message; ``retain``
        whether this PUBLISH would store one. Admitting may end the period early (``current``
        is then a new dict)."""
        creator = self.previous.pop(topic, None)
        if creator is None:
            creator = self.kept.pop(topic, None)
        if creator is not None:
            self.current[topic] = creator
            return None
        problem = check_topic(topic, limits)
        if problem is not None:
            return problem
        if memory_over:
            return "memory_limit"
        created = self.per_client.get(client_id, 0)
        if created >= limits.max_topics_per_client:
            return "max_topics_per_client"
        # Full: evict until there is room (more than one when a reload lowered max_topics
        # below what the table holds).
        while len(self) >= limits.max_topics:
            if not self.evict(retained):
                # Every tracked topic holds a retained message: a retained PUBLISH would
                # add one more, anything else is routed without being tracked.
                return "max_topics" if retain else None
        self.current[topic] = client_id
        # Read again: the eviction may have freed one of this client's own places.
        self.per_client[client_id] = self.per_client.get(client_id, 0) + 1
        return None

    def track_retained(self, topics) -> None:
        """(topic, creator) of retained messages stored without ``admit`` (restored at start
        from the snapshot and the log, or a will): tracked as ``kept``, never refused, so that
        max_topics bounds what comes after them as it bounded them."""
        for topic, creator in topics:
            if topic not in self.current and topic not in self.previous and topic not in self.kept:
                self.kept[topic] = creator
                self.per_client[creator] = self.per_client.get(creator, 0) + 1

    def evict(self, retained) -> bool:
        """Forget one topic without a retained message, the least recently published to as
        far as the generations tell; False if every tracked topic holds one. Each topic is
        looked at once per period, so the cost is O(1) per admitted topic."""
        previous = self.previous
        while True:
            if not previous:
                if not self.current:
                    return False
                previous = self.previous = self.current
                self.current = {}
            topic, creator = previous.popitem()
            if retained(topic):
                self.kept[topic] = creator
                continue
            self._release(creator)
            self.evicted += 1
            return True

    def rotate(self, retained) -> int:
        """Forget the topics not published to since the last rotation, and idle ones whose
        retained message is gone; returns how many."""
        forgotten = self.previous
        self.previous = self.current
        self.current = {}
        kept = self.kept
        dropped = 0
        for topic in [t for t in kept if not retained(t)]:
            self._release(kept.pop(topic))
            dropped += 1
        for topic, creator in forgotten.items():
            if retained(topic):
                kept[topic] = creator
            else:
                self._release(creator)
                dropped += 1
        return dropped

    def _release(self, creator: str) -> None:
        per_client = self.per_client
        left = per_client[creator] - 1
        if left:
            per_client[creator] = left
        else:
            del per_client[creator]

    def created_by(self, client_id: str) -> int:
        return self.per_client.get(client_id, 0)


def check_topic(topic: str, limits) -> str | None:
    """The limit a topic name or filter breaks (max_topic_length/levels), or None."""
    max_length = limits.max_topic_length
    if len(topic) > max_length // 4 and len(topic.encode("utf-8", "surrogatepass")) > max_length:
        return "max_topic_length"
    if topic.count("/") >= limits.max_topic_levels:
        return "max_topic_levels"
    return None


class EventLog:
    """Logs an event kind at most once per ``period`` seconds, counting the repeats in between.
    The next event after the period says how many there were; ``flush`` (the broker's
    housekeeping, each second, and the shutdown) reports those no event followed."""

    __slots__ = ("logger", "period", "_last", "_suppressed", "_latest")

    def __init__(self, logger: logging.Logger, period: float = 60.0):
        self.logger = logger
        self.period = period
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._latest: dict[str, tuple] = {}   # kind -> (level, message, args) of the last one

    def log(self, level: int, kind: str, now: float, message: str, *args) -> None:
        last = self._last.get(kind)
        if last is not None and now - last < self.period:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            self._latest[kind] = (level, message, args)
            return
        self._last[kind] = now
        repeats = self._suppressed.pop(kind, 0)
        self._latest.pop(kind, None)
        if repeats:
            message += " (%d more like this in the last %.0f s, not logged)"
            args = (*args, repeats, now - last)
        elif last is None:
            message += " (repeats are logged at most once per %.0f s)"
            args = (*args, self.period)
        self.logger.log(level, message, *args)

    def flush(self, now: float, final: bool = False) -> None:
        """Log the repeats of each kind whose period is over (``final``: of every kind) with no
        event since to say them: the last of them, with their number. The next event of the
        kind is then logged when it comes."""
        if not self._suppressed:
            return
        for kind in list(self._suppressed):
            last = self._last[kind]
            if now - last < self.period and not final:
                continue
            repeats = self._suppressed.pop(kind)
            level, message, args = self._latest.pop(kind)
            self.logger.log(level, message + " (the last of %d like this in the last %.0f s "
                            "that were not logged when they came)", *args, repeats, now - last)
            self._last[kind] = now - self.period


# What ``PeerLog`` counts, by kind: the words of its summary lines ("N more <these> from ...").
PEER_EVENTS = {
    "protocol_error": "protocol violations",
    "max_packet_size": "packets over max_packet_size",
    "packet_too_large": "CONNECTs refused or connections closed: their CONNACK, AUTH, "
                        "SUBACK or UNSUBACK over the client's Maximum Packet Size",
    "connect_timeout": "connections closed for connect_timeout (no CONNECT, or a password "
                       "check not finished)",
    "auth": "CONNECTs refused for their user name or password (CONNACK 4 or 5)",
    "auth_throttled": "logins refused unchecked for a user name or address throttled "
                      "after failed logins (CONNACK 5)",
    "auth_busy": "logins refused unchecked, too many password checks waiting (CONNACK 3)",
    "client_id": "CONNECTs refused for their client id",
    "will": "CONNECTs refused for their will",
    "protocol_version": "CONNECTs refused for their protocol version",
    "max_client_id_length": "CONNECTs refused for max_client_id_length",
    "max_keepalive": "CONNECTs refused for max_keepalive",
    "max_connections": "CONNECTs refused for max_connections",
    "max_sessions": "CONNECTs refused for max_sessions",
    "listener_max_connections": "CONNECTs refused for a listener's max_connections",
    "memory_limit": "CONNECTs refused for memory_limit",
    "open_files": "connections refused for the open files limit",
    "tls": "TLS handshakes on a plain MQTT listener",
    "http": "HTTP requests on an MQTT listener",
    "not_mqtt": "connections not starting with CONNECT",
    "websocket": "refused WebSocket upgrades",
    "tls_handshake": "failed TLS handshakes",
    "tls_error": "connections closed for a broken TLS stream (after the handshake)",
    "tls_handshake_timeout": "TLS handshakes not finished within handshake_timeout",
    "held_output": "connections not read while replies they do not read wait",
    "publish_refused": "connections closed for a PUBLISH to a new topic a topic limit refused",
    "receive_maximum": "connections closed for a QoS 2 PUBLISH beyond receive_maximum (QoS 2 "
                       "messages awaiting PUBREL)",
}

# PeerLog's period (seconds), and how many (kind, source address) pairs it tracks at most.
PEER_LOG_PERIOD = 60.0
PEER_LOG_SOURCES = 1000


def source_of(peer: str) -> str:
    """The source address of a connection named ``peer`` (server/peers.py's
    ``format_peer``, or a Unix listener's peer): the host without the port; for a Unix socket
    its path and the connecting process's uid."""
    if peer.startswith("["):
        end = peer.find("]")
        return peer[1:end] if end > 0 else peer
    if peer.startswith("unix:"):
        at = peer.find(" (pid ")
        uid = peer.rfind(", uid ")
        if at < 0 or uid < at:
            return peer
        return f"{peer[:at]} (uid {peer[uid + 6:].rstrip(')')})"
    host, colon, port = peer.rpartition(":")
    return host if colon and port.isdigit() else peer


class PeerLog:
    """The log lines of refused or misbehaving connections, by kind and source address.

    The first line of a kind (``PEER_EVENTS``) from an address is logged at once, in full;
    further ones from the same address are only counted until the period ends (``flush``,
    every ``period`` seconds), which logs one line per (kind, address) that had more: "N more
    <kind> from <address> in the last 60 s". An address quiet for a whole period is forgotten,
    so its next line is logged in full again. At most ``max_sources`` (kind, address) pairs
    are tracked; lines from further addresses are counted per kind, the first of each logged
    in full, and summed up in one line per kind. Metrics count every event; this only decides
    what is written."""

    __slots__ = ("period", "max_sources", "_seen", "_others", "_since")

    def __init__(self, now: float, period: float = PEER_LOG_PERIOD,
                 max_sources: int = PEER_LOG_SOURCES):
        """``period`` 0: every line is logged (nothing is counted or tracked)."""
        self.period = period
        self.max_sources = max_sources
        self._seen: dict[tuple[str, str], list] = {}   # (kind, source) -> [more, logger, level]
        self._others: dict[str, list] = {}             # kind -> [more, logger, level]
        self._since = now

    def log(self, logger: logging.Logger, level: int, kind: str, peer: str, message: str,
            *args) -> None:
        if self.period <= 0:
            logger.log(level, message, *args)
            return
        key = (kind, source_of(peer))
        seen = self._seen
        entry = seen.get(key)
        if entry is not None:
            entry[0] += 1
            return
        if len(seen) < self.max_sources:
            seen[key] = [0, logger, level]
        else:
            other = self._others.get(kind)
            if other is not None:
                other[0] += 1
                return
            self._others[kind] = [0, logger, level]
        logger.log(level, message, *args)

    def flush(self, now: float) -> None:
        """The end of a period: one line per (kind, address) with lines only counted."""
        elapsed = now - self._since
        self._since = now
        seen = self._seen
        for key, entry in list(seen.items()):
            more, logger, level = entry
            if not more:
                del seen[key]
                continue
            entry[0] = 0
            kind, source = key
            logger.log(level, "%d more %s from %s in the last %.0f s (counted, not logged)",
                       more, PEER_EVENTS.get(kind, kind), source, elapsed)
        for kind, (more, logger, level) in self._others.items():
            if more:
                logger.log(level, "%d more %s from addresses not tracked (over %d addresses "
                           "were tracked) in the last %.0f s (counted, not logged)", more,
                           PEER_EVENTS.get(kind, kind), self.max_sources, elapsed)
        self._others.clear()

    def __len__(self) -> int:
        return len(self._seen)
