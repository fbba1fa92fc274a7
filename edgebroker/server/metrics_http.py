"""Prometheus text endpoint: ``GET /metrics`` on ``[metrics] listen``, off by default.

An HTTP server (server/metrics_httpd.py) in its own threads. It never touches the broker: once
a second a timer in the core loop builds a fresh snapshot dict
(``core.metrics.snapshot``) and stores the reference here; the HTTP thread
only reads the latest reference and formats it. So a slow scraper never
blocks the loop, and the loop never waits for a lock.

Metric names, types and help texts are the table ``METRICS`` below (and
docs/metrics.md).
"""

from __future__ import annotations

import logging
import socket
import threading

from edgebroker import config as configuration
from edgebroker.core import metrics
from edgebroker.core.timers import Timer
from edgebroker.errors import ConfigError, EdgebrokerError
from edgebroker.server.metrics_httpd import MetricsHTTPServer

log = logging.getLogger("edgebroker.metrics")

SNAPSHOT_INTERVAL = 1.0


def _counter(key):
    return lambda s: s["counters"][key]


def _value(key):
    return lambda s: s[key]


def _loop(key):
    return lambda s: s["loop"][key]


# (name, type, help, value from the snapshot) -- one sample each.
METRICS = (
    ("edgebroker_uptime_seconds", "gauge", "Seconds since the broker started.",
     _value("uptime_seconds")),
    ("edgebroker_clients_connected", "gauge", "Clients connected (CONNECT accepted).",
     _value("clients_connected")),
    ("edgebroker_sockets_open", "gauge", "Open MQTT sockets, before and after CONNECT.",
     _value("sockets_open")),
    ("edgebroker_sessions", "gauge", "Sessions, connected or not.", _value("sessions")),
    ("edgebroker_subscriptions", "gauge", "Subscriptions (filter, session pairs), shared "
     "ones included.", _value("subscriptions")),
    ("edgebroker_shared_subscriptions", "gauge",
     "Shared subscriptions (group, member session pairs).",
     _value("shared_subscriptions")),
    ("edgebroker_shared_groups", "gauge", "Shared subscription groups.",
     _value("shared_groups")),
    ("edgebroker_shared_queued_messages", "gauge",
     "Messages waiting in shared subscription groups' backlogs in memory.",
     _value("shared_queued_messages")),
    ("edgebroker_shared_groups_behind", "gauge",
     "Shared subscription groups reading their backlog from the commit log.",
     _value("shared_groups_behind")),
    ("edgebroker_shared_handed_over_total", "counter",
     "Unacknowledged QoS 1 messages a leaving member handed back to its group for another.",
     _counter("shared_handed_over")),
    ("edgebroker_shared_fell_behind_total", "counter",
     "Times a shared subscription group started reading its backlog from the commit log.",
     _counter("shared_fell_behind")),
    ("edgebroker_shared_caught_up_total", "counter",
     "Times a shared subscription group behind reached the head of the log.",
     _counter("shared_caught_up")),
    ("edgebroker_retained_messages", "gauge", "Retained messages.",
     _value("retained_messages")),
    ("edgebroker_topics", "gauge", "Distinct topics tracked (limits.max_topics).",
     _value("topics")),
    ("edgebroker_topics_evicted_total", "counter",
     "Topics evicted from a full topic table for new ones (docs/limits.md).",
     _counter("topics_evicted")),
    ("edgebroker_queued_messages", "gauge", "Messages in all session queues.",
     _value("queued_messages")),
    ("edgebroker_queued_bytes", "gauge", "Bytes (topic + payload) in all session queues.",
     _value("queued_bytes")),
    ("edgebroker_sessions_behind", "gauge",
     "Sessions reading from the commit log at a cursor (behind, or offline).",
     _value("sessions_behind")),
    ("edgebroker_lag_records_max", "gauge",
     "Log records between the oldest session cursor and the head of the log.",
     _value("lag_records_max")),
    ("edgebroker_password_checks_total", "counter",
     "Password hashes computed to check logins (a cached success needs none).",
     _counter("password_checks")),
    ("edgebroker_password_check_errors_total", "counter",
     "Password checks the hash library could not run (the login was refused).",
     _counter("password_check_errors")),
    ("edgebroker_scram_succeeded_total", "counter",
     "SCRAM-SHA-256 authentications that succeeded (at CONNECT and re-authentications).",
     _counter("scram_succeeded")),
    ("edgebroker_scram_failed_total", "counter",
     "SCRAM-SHA-256 authentications that failed (each is logged with the user and why).",
     _counter("scram_failed")),
    ("edgebroker_sessions_expired_total", "counter",
     "Offline persistent sessions removed by limits.persistent_client_expiration.",
     _counter("sessions_expired")),
    ("edgebroker_sessions_fell_behind_total", "counter",
     "Times a session fell behind and started reading from the commit log.",
     _counter("sessions_fell_behind")),
    ("edgebroker_sessions_caught_up_total", "counter",
     "Times a session behind reached the head of the log and was routed to again.",
     _counter("sessions_caught_up")),
    ("edgebroker_exchange_write_errors_total", "counter",
     "Writes of the QoS 2 exchange journal that failed (exactly once across a crash at risk).",
     _counter("exchange_write_errors")),
    ("edgebroker_retention_unsaved_records_total", "counter",
     "Log records retention_bytes deleted before a session snapshot covered them.",
     _counter("retention_unsaved_records")),
    ("edgebroker_throttled_clients", "gauge",
     "Clients over their publish or control packet rate right now.",
     _value("throttled_clients")),
    ("edgebroker_throttled_seconds_total", "counter",
     "Seconds clients spent throttled (not read) for their publish or control packet rate.",
     _value("throttled_seconds")),
    ("edgebroker_timer_entries", "gauge",
     "Entries in the broker's deadline heap (keepalive, CONNECT timeout, timers).",
     _value("timer_entries")),
    ("edgebroker_timer_entries_dead", "gauge",
     "Deadline heap entries no longer used (left by closed clients and cancelled timers, or "
     "replaced by an earlier deadline); at most half the heap.",
     _value("timer_entries_dead")),
    ("edgebroker_packets_received_total", "counter", "MQTT packets received.",
     _counter("packets_received")),
    ("edgebroker_packets_sent_total", "counter", "MQTT packets sent.", _counter("packets_sent")),
    ("edgebroker_publish_received_total", "counter", "PUBLISH packets received.",
     _counter("publish_received")),
    ("edgebroker_publish_sent_total", "counter", "PUBLISH packets sent.", _counter("publish_sent")),
    ("edgebroker_publish_unrouted_total", "counter",
     "PUBLISHes received that no subscription took (logged, sent to no one; $SYS messages "
     "not counted).", _counter("publish_unrouted")),
    ("edgebroker_publish_dropped_total", "counter",
     "Messages dropped, all reasons (see edgebroker_messages_dropped_total).",
     _counter("publish_dropped")),
    ("edgebroker_bytes_received_total", "counter", "Bytes received on MQTT sockets.",
     _counter("bytes_received")),
    ("edgebroker_bytes_sent_total", "counter", "Bytes sent on MQTT sockets.",
     _counter("bytes_sent")),
    ("edgebroker_sockets_accepted_total", "counter", "MQTT sockets accepted.",
     _counter("sockets_accepted")),
    ("edgebroker_connections_accepted_total", "counter", "CONNECTs accepted.",
     _counter("connects_accepted")),
    ("edgebroker_protocol_errors_total", "counter", "Connections closed for a protocol violation.",
     _counter("protocol_errors")),
    ("edgebroker_keepalive_expired_total", "counter", "Connections closed for keepalive expiry.",
     _counter("keepalive_expired")),
    ("edgebroker_session_takeovers_total", "counter",
     "Connections closed because the same client id connected again.", _counter("takeovers")),
    ("edgebroker_connect_timeouts_total", "counter",
     "Connections closed for connect_timeout (no CONNECT, or a password check not finished).",
     _counter("connect_timeouts")),
    ("edgebroker_throttled_closed_unread_total", "counter", "Throttled connections closed as "
     "lost, their peer gone for 10 s, with bytes not read yet.",
     _counter("throttled_closed_unread")),
    ("edgebroker_throttled_unread_bytes_total", "counter", "Bytes those connections sent that "
     "were dropped unread.", _counter("throttled_unread_bytes")),
    ("edgebroker_logins_failed_total", "counter", "Logins refused for a wrong user name or "
     "password (CONNACK 4).", _counter("logins_failed")),
    ("edgebroker_logins_refused_total", "counter", "Logins refused otherwise (not authorized, "
     "too many password checks waiting, a will the ACL does not allow).",
     _counter("logins_refused")),
    ("edgebroker_acl_publish_denied_total", "counter", "PUBLISHes the ACL did not allow.",
     _counter("acl_publish_denied")),
    ("edgebroker_acl_subscribe_denied_total", "counter",
     "Subscription filters the ACL did not allow.", _counter("acl_subscribe_denied")),
    ("edgebroker_acl_deliveries_denied_total", "counter",
     "Deliveries the ACL did not allow (the subscriber may not read the topic).",
     _counter("acl_deliveries_denied")),
    ("edgebroker_tls_handshakes_failed_total", "counter",
     "TLS handshakes that failed or were not finished within handshake_timeout.",
     _counter("tls_handshakes_failed")),
    ("edgebroker_publish_lost_total", "counter", "Queued messages whose log record was gone "
     "when they were to be sent (deleted by retention or damaged).",
     _counter("publish_lost")),
    ("edgebroker_publish_refused_total", "counter", "QoS 1/2 PUBLISHes not acknowledged "
     "because the commit log could not write them.", _counter("publish_refused")),
    ("edgebroker_publish_not_logged_total", "counter", "QoS 0 messages routed without being "
     "logged while the commit log could not write.", _counter("publish_not_logged")),
    ("edgebroker_log_write_failures_total", "counter", "Times the commit log began to fail "
     "writing (disk full or failing).", _counter("log_write_failures")),
    ("edgebroker_log_damaged_regions_total", "counter", "Damaged regions of the commit log "
     "found (readers skip them; each logged once).",
     lambda s: (s.get("log") or {}).get("damaged_regions", 0)),
    ("edgebroker_publishers_paused_total", "counter", "Times a publisher was not read "
     "because the commit log could not write.", _counter("publishers_paused")),
    ("edgebroker_process_resident_memory_bytes", "gauge", "Resident memory of the broker process.",
     lambda s: s["process"]["rss_bytes"]),
    ("edgebroker_process_cpu_seconds_total", "counter", "CPU time (user + system) of the broker.",
     lambda s: s["process"]["cpu_seconds"]),
    ("edgebroker_memory_limit_bytes", "gauge", "limits.memory_limit (0: off).",
     lambda s: s["process"]["memory_limit_bytes"]),
    ("edgebroker_memory_over_limit", "gauge",
     "1 while memory is above limits.memory_limit (new connections, topics and "
     "subscriptions refused).",
     lambda s: int(s["process"]["memory_over_limit"])),
    ("edgebroker_memory_kept_bytes", "gauge", "RSS kept after a peak above "
     "limits.memory_limit that the broker admits again under (0: none).",
     lambda s: s["process"]["memory_kept_bytes"]),
    ("edgebroker_memory_released_total", "counter", "Times the broker admitted again above "
     "limits.memory_limit, its holdings having fallen after a peak.",
     lambda s: s["process"]["memory_released"]),
    # The loop's wait for a CPU (server/contention.py).
    ("edgebroker_loop_cpu_contended", "gauge", "1 from when the core thread waited for a CPU "
     "10 % or more of the time it wanted one until that is below 5 % or the loop is idle "
     "(busy polls and early sends are off meanwhile).", _loop("cpu_contended")),
    ("edgebroker_loop_cpu_contention_episodes_total", "counter", "Times the core thread "
     "became CPU-contended.", _loop("cpu_contention_episodes")),
    ("edgebroker_loop_cpu_contended_seconds_total", "counter", "Time the core thread was "
     "CPU-contended.", _loop("cpu_contended_seconds")),
    ("edgebroker_loop_cpu_wait_ratio", "gauge", "Share of the time the core thread wanted a "
     "CPU that it waited for one, over the last check's period (0.2 s or more) in which it "
     "was busy enough to tell.", _loop("cpu_wait_share")),
)

# With [upload] url: (name, type, help, key of snapshot["upload"]).
UPLOAD_METRICS = (
    ("edgebroker_upload_batches_total", "counter", "Batches the uploader stored.", "batches"),
    ("edgebroker_upload_records_total", "counter", "Log records the uploader stored.", "records"),
    ("edgebroker_upload_bytes_total", "counter", "Compressed batch bytes the uploader stored.",
     "bytes"),
    ("edgebroker_upload_retries_total", "counter", "Failed batch uploads that were retried.",
     "retries"),
    ("edgebroker_upload_permanent_errors_total", "counter",
     "Uploads that failed in a way retrying does not cure (they raise the alarm).",
     "permanent_errors"),
    ("edgebroker_upload_local_errors_total", "counter",
     "Rounds that failed on the uploader's own files (a full disk...); retried.",
     "local_errors"),
    ("edgebroker_upload_alarm", "gauge",
     "1 while the last upload failed permanently (the data stays in the log).", "alarm"),
    ("edgebroker_upload_paused", "gauge",
     "1 while uploading is paused (edgebroker upload pause).", "paused"),
    ("edgebroker_upload_gap_offsets_total", "counter",
     "Offsets reported as never uploaded (deleted by retention_bytes before upload, damaged).",
     "gap_offsets"),
    ("edgebroker_upload_forced_deletions_total", "counter",
     "Segments retention_bytes deleted before they were uploaded.", "forced_deletions"),
    ("edgebroker_upload_forced_deleted_records_total", "counter",
     "Records in them not uploaded yet at the deletion (a batch being uploaded may still carry "
     "some; gap_offsets counts what was lost).", "forced_deleted_records"),
    ("edgebroker_upload_mark_unsaved_total", "counter",
     "Times the uploaded mark's file found no room (the mark moved in memory).", "mark_unsaved"),
    ("edgebroker_upload_backlog_bytes", "gauge", "Bytes of the log not uploaded yet.",
     "backlog_bytes"),
    ("edgebroker_upload_backlog_batches", "gauge", "About how many batches the backlog makes.",
     "backlog_batches"),
    ("edgebroker_upload_backlog_age_seconds", "gauge",
     "Age of the oldest record not uploaded yet (0: none).", "backlog_age_seconds"),
    ("edgebroker_upload_lag_seconds", "gauge",
     "Record time between the newest record in the log and the newest uploaded.", "lag_seconds"),
)
# With [[bridge]] tables: (name, type, help, key of each snapshot["bridges"] item), one sample
# per bridge, labelled bridge="NAME".
BRIDGE_METRICS = (
    ("edgebroker_bridge_up", "gauge", "1 while the bridge's link is connected.", "up"),
    ("edgebroker_bridge_forwarded_total", "counter",
     "Messages the remote acknowledged.", "forwarded"),
    ("edgebroker_bridge_forwarded_bytes_total", "counter",
     "Topic and payload bytes of the messages the remote acknowledged.", "forwarded_bytes"),
    ("edgebroker_bridge_resent_total", "counter",
     "Messages sent again (after a reconnect or a crash: at least once).", "resent"),
    ("edgebroker_bridge_refused_total", "counter",
     "Messages the remote refused (or the client library, before sending): skipped.", "refused"),
    ("edgebroker_bridge_unsendable_total", "counter",
     "Messages an out rule matched whose remote topic is no valid MQTT topic name: skipped.",
     "unsendable"),
    ("edgebroker_bridge_expired_total", "counter",
     "Messages whose MQTT 5.0 Message Expiry passed before they were forwarded: skipped.",
     "expired"),
    ("edgebroker_bridge_gaps_total", "counter",
     "Times log records were lost (deleted, damaged, missing) before the bridge forwarded them.",
     "gaps"),
    ("edgebroker_bridge_gap_offsets_total", "counter",
     "Log offsets lost before the bridge forwarded them.", "gap_offsets"),
    ("edgebroker_bridge_checkpoint_ahead_total", "counter",
     "Starts with a checkpoint past the log's end (the log lost its tail).",
     "checkpoint_ahead"),
    ("edgebroker_bridge_checkpoint_damaged_total", "counter",
     "Starts with a checkpoint that could not be read: the bridge went on from the log's "
     "head, and what was logged since that checkpoint was not forwarded.",
     "checkpoint_damaged"),
    ("edgebroker_bridge_checkpoint_failures_total", "counter",
     "Checkpoint writes that failed (after a crash the bridge goes back to the last one "
     "written).", "checkpoint_failures"),
    ("edgebroker_bridge_reconnects_total", "counter", "Connections after the first.",
     "reconnects"),
    ("edgebroker_bridge_short_links_total", "counter",
     "Links lost within 10 s of their CONNACK (the reconnect back-off grows).", "short_links"),
    ("edgebroker_bridge_received_total", "counter",
     "Messages from the remote published here.", "received"),
    ("edgebroker_bridge_ids_reused_total", "counter",
     "QoS 2 messages from the remote under a packet id still awaiting its PUBREL that differ "
     "from the message held (the remote forgot that exchange): published here as new.",
     "ids_reused"),
    ("edgebroker_bridge_lag_messages", "gauge",
     "Log offsets between the bridge's cursor and the head.", "lag_messages"),
    ("edgebroker_bridge_lag_bytes", "gauge",
     "Segment bytes between the bridge's cursor and the head.", "lag_bytes"),
    ("edgebroker_bridge_lag_seconds", "gauge",
     "Age of the record at the bridge's cursor (0: none waits).", "lag_seconds"),
)

# (name, help, snapshot key, label name) -- one sample per known name, zeros included.
LABELLED = (
    ("edgebroker_limit_hits_total", "Times each limit was reached (docs/limits.md).",
     "limit_hits", "limit"),
    ("edgebroker_connections_refused_total",
     "Connections refused (CONNACK != 0, or closed for not speaking MQTT), by reason.",
     "refused", "reason"),
    ("edgebroker_messages_dropped_total", "Messages dropped, by reason.", "dropped", "reason"),
)


def _number(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def render(snapshot: dict) -> str:
    """The Prometheus text exposition (format 0.0.4) of a snapshot."""
    out = []
    out.append("# HELP edgebroker_info Broker version (the value is always 1).")
    out.append("# TYPE edgebroker_info gauge")
    out.append(f'edgebroker_info{{version="{snapshot["version"]}"}} 1')
    for name, kind, help_text, get in METRICS:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name} {_number(get(snapshot))}")
    for name, help_text, key, label in LABELLED:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} counter")
        for item, value in sorted(snapshot[key].items()):
            out.append(f'{name}{{{label}="{item}"}} {_number(value)}')
    upload = snapshot.get("upload")
    for name, kind, help_text, key in UPLOAD_METRICS if upload else ():
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name} {_number(upload[key])}")
    bridges = snapshot.get("bridges")
    for name, kind, help_text, key in BRIDGE_METRICS if bridges else ():
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for fig in bridges:
            value = fig["state"] == "up" if key == "up" else fig[key]
            out.append(f'{name}{{bridge="{fig["name"]}"}} {_number(value)}')
    loop = snapshot["loop"]
    name = "edgebroker_loop_pass_seconds"
    out.append(f"# HELP {name} Time the core loop spent per pass (work, not waiting); "
               "quantiles over the last 1024 passes.")
    out.append(f"# TYPE {name} summary")
    out.append(f'{name}{{quantile="0.5"}} {_number(loop["pass_p50_seconds"])}')
    out.append(f'{name}{{quantile="0.99"}} {_number(loop["pass_p99_seconds"])}')
    out.append(f"{name}_sum {_number(loop['busy_seconds'])}")
    out.append(f"{name}_count {_number(loop['passes'])}")
    name = "edgebroker_loop_busy_polls_total"
    out.append(f"# HELP {name} Polls for a catching-up session's acknowledgements before "
               "sleeping (busy_poll_us), by whether they came in time.")
    out.append(f"# TYPE {name} counter")
    out.append(f'{name}{{result="hit"}} {_number(loop["busy_polls_hit"])}')
    out.append(f'{name}{{result="miss"}} {_number(loop["busy_polls_missed"])}')
    return "\n".join(out) + "\n"


class MetricsServer:
    def __init__(self, loop, httpd: MetricsHTTPServer):
        self.loop = loop
        self.httpd = httpd
        self.snapshot: dict = metrics.snapshot(loop.broker, loop.clock())
        httpd.page = self.page
        self.timer = Timer(self._publish)
        self.timer.start(loop.broker, loop.clock() + SNAPSHOT_INTERVAL)
        self.thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="metrics-http", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, loop, listen: str, ipv4_ports=frozenset()) -> "MetricsServer":
        """``ipv4_ports``: the listeners' IPv4 ports; on one of them an IPv6 address is bound
        V6ONLY (listener_config, "overlaps")."""
        try:
            where = configuration.parse_address(listen)
        except ConfigError:
            raise ConfigError(f"metrics.listen: expected HOST:PORT, got {listen!r}") from None
        family = socket.AF_INET6 if ":" in where.host else socket.AF_INET
        try:
            httpd = MetricsHTTPServer((where.host, where.port), family, where.port in ipv4_ports)
        except OSError as exc:
            raise EdgebrokerError(f"cannot listen for metrics on {where.address}: "
                                  f"{exc.strerror or exc}") from None
        server = cls(loop, httpd)
        host, port = httpd.server_address[:2]
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info("metrics on http://%s/metrics", shown)
        return server

    def page(self) -> bytes:
        """The body of ``GET /metrics`` (in the HTTP server's threads)."""
        return (render(self.snapshot) + self.httpd.render_dropped()).encode()

    def _publish(self) -> None:
        loop = self.loop
        now = loop.clock()
        self.timer.start(loop.broker, now + SNAPSHOT_INTERVAL)
        self.snapshot = metrics.snapshot(loop.broker, now)  # one reference store: atomic

    def stop(self) -> None:
        self.timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(2.0)
