"""Broker counters and the $SYS topics that publish them.

Names follow Mosquitto's $SYS tree where one exists. ``messages/*`` counts
every MQTT packet, ``publish/messages/*`` only PUBLISH packets, as Mosquitto
does. The ``load/.../1min|5min|15min`` values are Mosquitto's: exponentially
weighted averages of the rate per minute. ``load/.../persecond`` (an
edgebroker addition) is the plain rate over the last interval, per second.

edgebroker additions for limits (docs/metrics.md): ``limits/<name>`` (times
each limit was reached), ``connections/refused/<reason>``,
``publish/messages/dropped/<reason>``, topics, queued messages and bytes,
throttled clients, loop pass time; and, with ``sys_client_metrics``, per
client figures under ``clients/<id>/`` (not retained, so they leave no
trace once the client is gone).
"""

from __future__ import annotations

import math

from edgebroker import __version__
from edgebroker.mqtt.topics import sys_topic_level

# The shortest time $SYS/broker/process/cpu is measured over (CPU time counts in 10 ms ticks).
CPU_SPAN = 0.5


class Stats:
    # ``packets_sent`` holds the packets sent other than PUBLISH (the routing paths count
    # only ``publish_sent``, once per PUBLISH); ``as_dict``, the one reader, reports it as
    # every packet sent: the two added.
    __slots__ = ("packets_received", "packets_sent", "publish_received", "publish_sent",
                 "publish_dropped", "publish_unrouted", "publish_lost", "publish_not_logged",
                 "publish_refused", "log_write_failures", "publishers_paused",
                 "bytes_received", "bytes_sent",
                 "sockets_accepted", "connects_accepted", "connections_refused", "protocol_errors",
                 "keepalive_expired", "connect_timeouts", "takeovers",
                 # throttled clients closed as lost with bytes unread (core.throttling)
                 "throttled_closed_unread", "throttled_unread_bytes",
                 # security: refused logins and ACL denials, TLS handshakes that failed
                 "logins_failed", "logins_refused", "acl_publish_denied", "acl_subscribe_denied",
                 "acl_deliveries_denied", "tls_handshakes_failed",
                 # passwords hashed to check a login, and checks that could not run
                 # (security.authenticator)
                 "password_checks", "password_check_errors",
                 # SCRAM-SHA-256 exchanges that ended (core/handlers/auth.py), re-auth too
                 "scram_succeeded", "scram_failed",
                 # the log as the queue (core.catchup): sessions that fell behind, caught up
                 "sessions_fell_behind", "sessions_caught_up",
                 # QoS 2 exchange journal writes that failed (core.exchanges)
                 "exchange_write_errors",
                 # log records retention_bytes deleted before a session snapshot covered them
                 "retention_unsaved_records",
                 # the topic table (core.limits.TopicTable): topics evicted for new ones
                 "topics_evicted",
                 # offline persistent sessions removed by persistent_client_expiration
                 "sessions_expired",
                 # shared subscriptions (core.shared): QoS 1 messages handed over to another
                 # member, groups that started reading from the log, and caught up
                 "shared_handed_over", "shared_fell_behind", "shared_caught_up")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        """The counters as reported (metrics, $SYS, the admin socket): ``packets_sent`` with
        the PUBLISH packets in."""
        counts = {name: getattr(self, name) for name in self.__slots__}
        counts["packets_sent"] += counts["publish_sent"]
        return counts


# (topic part, counter) pairs that get load averages.
_LOADS = (
    ("messages/received", "packets_received"),
    ("messages/sent", "packets_sent"),
    ("publish/received", "publish_received"),
    ("publish/sent", "publish_sent"),
    ("publish/dropped", "publish_dropped"),
    ("bytes/received", "bytes_received"),
    ("bytes/sent", "bytes_sent"),
    ("connections", "connects_accepted"),
    ("sockets", "sockets_accepted"),
)
_WINDOWS = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))

# Security counters (edgebroker additions).
_SECURITY = (
    ("$SYS/broker/security/logins/failed", "logins_failed"),
    ("$SYS/broker/security/logins/refused", "logins_refused"),
    ("$SYS/broker/security/acl/publish/denied", "acl_publish_denied"),
    ("$SYS/broker/security/acl/subscribe/denied", "acl_subscribe_denied"),
    ("$SYS/broker/security/acl/deliveries/denied", "acl_deliveries_denied"),
    ("$SYS/broker/security/tls/handshakes/failed", "tls_handshakes_failed"),
    ("$SYS/broker/security/password/checks", "password_checks"),
    ("$SYS/broker/security/password/check_errors", "password_check_errors"),
    ("$SYS/broker/security/scram/succeeded", "scram_succeeded"),
    ("$SYS/broker/security/scram/failed", "scram_failed"),
)


# The uploader's figures published under $SYS/broker/upload/ (docs/metrics.md).
_UPLOAD = ("state", "paused", "alarm", "uploaded_offset", "batches", "records", "bytes",
           "retries", "permanent_errors", "local_errors", "gap_offsets", "forced_deletions",
           "forced_deleted_records", "mark_unsaved", "backlog_batches", "backlog_bytes",
           "backlog_age_seconds", "lag_seconds")

# Each bridge's figures published under $SYS/broker/bridge/<name>/ (docs/metrics.md).
_BRIDGE = ("state", "cursor", "lag_messages", "lag_bytes", "lag_seconds", "forwarded",
           "resent", "refused", "gaps", "gap_offsets", "reconnects", "received")


class SysTopics:
    """Publishes $SYS/broker/... as retained QoS 0 messages every ``sys_interval``."""

    def __init__(self, broker, now: float):
        self.broker = broker
        self.next_due: float | None = None
        self._last = now
        self._last_counts = broker.stats.as_dict()
        self._loads = {(name, window): 0.0 for name, _ in _LOADS for window, _ in _WINDOWS}
        self._usage = broker.memory.usage  # one reader of this process's figures per broker
        figures = self._usage.read()
        # $SYS/broker/process/cpu: percent of one core over at least CPU_SPAN seconds, from
        # this mark (when, CPU seconds then) on (as psutil's cpu_percent between two calls).
        self._cpu_mark = (now, figures[1] if figures else None)
        self._cpu = 0.0
        self.configure(now)

    def configure(self, now: float) -> None:
        """At start and on each reload. Turned on (at start, or by a reload): the version,
        and the first full report at once, so subscribers see values right away. Turned off
        by a reload: the retained $SYS messages are cleared (an empty retained message each,
        which subscribers receive), rather than left frozen at their last values."""
        interval = self.broker.config.sys_interval
        was_on = self.next_due is not None      # (None: off, or not started)
        if not interval:
            self.next_due = None
            if was_on:
                self._clear()
            return
        if not was_on:
            self._publish("$SYS/broker/version", f"edgebroker version {__version__}")
        self.next_due = now

    def _clear(self) -> None:
        for message in list(self.broker.retained.match("$SYS/#")):
            self._publish(message.topic, "")

    def _publish(self, topic: str, value, retain: bool = True) -> None:
        self.broker.route(topic, str(value).encode(), 0, retain)

    def _publish_upload(self, figures: dict) -> None:
        """The uploader's figures (edgebroker.uploader) under $SYS/broker/upload/."""
        pub = self._publish
        for name in _UPLOAD:
            value = figures[name]
            if type(value) is bool:
                value = int(value)
            elif type(value) is float:
                value = f"{value:.1f}"
            pub(f"$SYS/broker/upload/{name}", value)
        pub("$SYS/broker/upload/last_error", figures["last_error"] or "")

    def _publish_limits(self, broker) -> None:
        pub = self._publish
        for name, count in broker.limit_hits.items():
            pub(f"$SYS/broker/limits/{name}", count)
        for reason, count in broker.refused.items():
            pub(f"$SYS/broker/connections/refused/{reason}", count)
        for reason, count in broker.dropped.items():
            pub(f"$SYS/broker/publish/messages/dropped/{reason}", count)
        pub("$SYS/broker/topics/count", len(broker.topics))
        pub("$SYS/broker/topics/evicted", broker.stats.topics_evicted)
        pub("$SYS/broker/store/messages/count", broker.queued_messages)
        pub("$SYS/broker/store/messages/bytes", broker.queued_bytes)
        pub("$SYS/broker/clients/throttled", len(broker.throttled))
        if broker.journal is not None:    # damaged regions of the log found (docs/log-format.md)
            pub("$SYS/broker/log/damaged_regions", broker.journal.log.counters.corrupt_regions)
        p50, p99 = broker.pass_times.quantiles(0.5, 0.99)
        pub("$SYS/broker/loop/pass/p50", f"{p50:.6f}")
        pub("$SYS/broker/loop/pass/p99", f"{p99:.6f}")

    def _publish_clients(self, broker, now: float) -> None:
        """$SYS/broker/clients/<id>/... for each connected client (one pass over them)."""
        from edgebroker.core.metrics import client_row

        pub = self._publish
        for session in list(broker.sessions.values()):
            client = session.client
            if client is None:
                continue
            base = "$SYS/broker/clients/" + sys_topic_level(client.client_id)
            size = len(base.encode("utf-8", "surrogatepass"))
            if size > MAX_CLIENT_BASE:
                client.warn_once("sys_client_metrics", "its $SYS/broker/clients/<id>/... topics "
                                 "would be over MQTT's 65,535 bytes (%d bytes before the figure's "
                                 "name): not published", size)
                continue
            row = client_row(client, now)
            pub(f"{base}/messages/received", row["msgs_in"], False)
            pub(f"{base}/messages/sent", row["msgs_out"], False)
            pub(f"{base}/messages/dropped", row["dropped"], False)
            pub(f"{base}/bytes/received", row["bytes_in"], False)
            pub(f"{base}/bytes/sent", row["bytes_out"], False)
            pub(f"{base}/load/messages/received/persecond", f"{row['msgs_in_rate']:.2f}", False)
            pub(f"{base}/load/messages/sent/persecond", f"{row['msgs_out_rate']:.2f}", False)
            pub(f"{base}/throttled/seconds", f"{row['throttled_seconds']:.3f}", False)
            pub(f"{base}/pending/bytes", row["pending_write_bytes"], False)
            pub(f"{base}/queued/messages", row["queued"], False)


    def publish(self, now: float) -> None:
        broker = self.broker
        interval = broker.config.sys_interval
        self.next_due = now + interval if interval else None
        stats = broker.stats
        counts = stats.as_dict()
        elapsed = max(now - self._last, 1e-6)
        pub = self._publish
        pub("$SYS/broker/uptime", f"{int(now - broker.started)} seconds")
        pub("$SYS/broker/clients/connected", broker.clients_connected)
        pub("$SYS/broker/clients/active", broker.clients_connected)
        pub("$SYS/broker/clients/total", len(broker.sessions))
        pub("$SYS/broker/clients/disconnected",
            sum(1 for s in broker.sessions.values() if s.client is None))
        pub("$SYS/broker/subscriptions/count", broker.subscriptions.count + broker.shared_members)
        shared = broker.shared_figures()
        pub("$SYS/broker/shared_subscriptions/count", shared["shared_subscriptions"])
        pub("$SYS/broker/shared_subscriptions/groups", shared["shared_groups"])
        pub("$SYS/broker/shared_subscriptions/queued", shared["shared_queued_messages"])
        pub("$SYS/broker/shared_subscriptions/behind", shared["shared_groups_behind"])
        pub("$SYS/broker/shared_subscriptions/handed_over", counts["shared_handed_over"])
        pub("$SYS/broker/retained messages/count", broker.retained.count)
        pub("$SYS/broker/messages/received", counts["packets_received"])
        pub("$SYS/broker/messages/sent", counts["packets_sent"])
        pub("$SYS/broker/publish/messages/received", counts["publish_received"])
        pub("$SYS/broker/publish/messages/sent", counts["publish_sent"])
        pub("$SYS/broker/publish/messages/dropped", counts["publish_dropped"])
        pub("$SYS/broker/publish/messages/lost", counts["publish_lost"])
        pub("$SYS/broker/bytes/received", counts["bytes_received"])
        pub("$SYS/broker/bytes/sent", counts["bytes_sent"])
        for topic, counter in _SECURITY:
            pub(topic, counts[counter])
        for name, counter in _LOADS:
            rate = (counts[counter] - self._last_counts[counter]) / elapsed
            pub(f"$SYS/broker/load/{name}/persecond", f"{rate:.2f}")
            for window, seconds in _WINDOWS:
                weight = math.exp(-elapsed / seconds)
                value = self._loads[name, window] * weight + rate * 60.0 * (1.0 - weight)
                self._loads[name, window] = value
                pub(f"$SYS/broker/load/{name}/{window}", f"{value:.2f}")
        figures = self._usage.read()
        rss = 0
        if figures is not None:
            rss, cpu_seconds = figures
            since, before = self._cpu_mark
            if before is None or now - since >= CPU_SPAN:
                if before is not None:
                    self._cpu = (cpu_seconds - before) / (now - since) * 100.0
                self._cpu_mark = (now, cpu_seconds)
        pub("$SYS/broker/process/rss", rss)
        pub("$SYS/broker/process/cpu", f"{self._cpu:.1f}")
        self._publish_limits(broker)
        if broker.upload_figures is not None:
            self._publish_upload(broker.upload_figures())
        if broker.bridge_figures is not None:
            for fig in broker.bridge_figures(broker.journal.wall_ms()):
                for name in _BRIDGE:
                    value = fig[name]
                    pub(f"$SYS/broker/bridge/{fig['name']}/{name}",
                        f"{value:.1f}" if type(value) is float else value)
        if broker.config.sys_client_metrics:
            self._publish_clients(broker, now)
        self._last = now
        # Counters include the $SYS messages just published; the next rate is
        # measured from here, so they count in the next interval as Mosquitto's do.
        self._last_counts = counts


# The longest $SYS/broker/clients/<id> a client's figures can go under: the longest name after
# it ("/load/messages/received/persecond") still fits a topic's 65,535 bytes.
MAX_CLIENT_BASE = 65535 - 64
