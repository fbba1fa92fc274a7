"""The ``[limits]`` section: what one client, and all of them together, may use of the broker
(docs/limits.md says what each limit does when it is reached; docs/config.md lists them)."""

from __future__ import annotations

from edgebroker.config_fields import (
    at_least, between, off_or_at_least, one_of, setting, size_or_auto,
)
from edgebroker.records import record

MAX_PACKET_SIZE_311 = 268_435_455  # largest remaining length 3.1.1 can encode, plus header
# A rate: 0 (no limit), or at least one per 1000 s (a smaller one made the token bucket's
# interval overflow to inf, and its waits nan).
RATE = off_or_at_least(0.001, "no limit")


@record(frozen=True)
class Limits:
    connect_timeout: float = setting(
        10.0, at_least(0.001), doc="seconds a new connection has to send CONNECT")
    max_keepalive: int = setting(
        65535, between(0, 65535),
        doc="largest keepalive (s) a client may ask for; a larger one gets CONNACK 2")
    max_packet_size: int = setting(
        1_048_576, between(2, MAX_PACKET_SIZE_311),
        doc="largest packet (bytes, whole packet) accepted; larger closes the connection")
    max_qos: int = setting(
        2, between(0, 2),
        doc="highest QoS granted to a subscription; MQTT 5.0 clients are told (Maximum QoS) "
            "and a 5.0 PUBLISH or will above it is refused (0x9B)")
    retain_available: bool = setting(
        True, doc="retained messages: false refuses a retained PUBLISH or will (MQTT 5.0: "
                  "0x9A; 3.1.1: the connection closes) and says so in the 5.0 CONNACK")
    receive_maximum: int = setting(
        1024, between(1, 65535),
        doc="QoS 2 messages a client may have awaiting PUBREL; one more closes the connection "
            "(MQTT 5.0: DISCONNECT 0x93; the CONNACK's Receive Maximum says it)")
    outbound_topic_aliases: bool = setting(
        False, doc="MQTT 5.0: give the topics sent to a client topic aliases (up to its "
                   "Topic Alias Maximum and max_outbound_topic_aliases), sending an empty "
                   "topic name after the first message")
    max_outbound_topic_aliases: int = setting(
        64, between(1, 65535),
        doc="MQTT 5.0, with outbound_topic_aliases: topic aliases the broker uses sending to "
            "one connection, at most (and at most its Topic Alias Maximum); when all are "
            "used, a new topic takes the least recently used one (fixed at CONNECT)")
    max_topic_alias: int = setting(
        10, between(0, 65535),
        doc="MQTT 5.0: topic aliases a client may set (the CONNACK's Topic Alias Maximum); "
            "0: none")
    max_client_id_length: int = setting(
        65535, between(23, 65535),
        doc="longest client id (bytes); longer gets CONNACK 2 (at least 23, MQTT-3.1.3-5)")
    max_inflight_messages: int = setting(
        20, between(1, 65535), doc="outgoing QoS 1/2 messages awaiting acknowledgement per session")
    max_queued_messages: int = setting(
        0, at_least(0),
        doc="messages queued in memory per session beyond the inflight window or while "
            "offline, dropped past it (queue_full); 0: no such limit, a session that falls "
            "behind reads from the commit log instead (docs/persistence.md)")
    queue_qos0_messages: bool = setting(
        False, doc="also queue QoS 0 messages for offline persistent sessions")
    max_connections: int = setting(
        10_000, at_least(1), doc="connected clients, broker-wide; over it CONNACK 3 then close")
    max_sessions: int = setting(
        20_000, at_least(1),
        doc="persistent sessions (clean session 0), connected or offline; a CONNECT that "
            "would create one more gets CONNACK 3")
    persistent_client_expiration: float = setting(
        0.0, at_least(0),
        doc="seconds: an offline persistent session not resumed within this time is removed; "
            "0: never")
    max_connection_rate: float = setting(
        500.0, RATE,
        doc="new connections accepted per second (token bucket); over it accepting pauses; "
            "0: no limit")
    connection_burst: int = setting(
        1000, at_least(1), doc="connections accepted at once before max_connection_rate applies")
    max_topic_length: int = setting(
        65535, between(1, 65535), doc="longest topic name or filter (bytes)")
    max_topic_levels: int = setting(
        128, at_least(1), doc="most levels in a topic name or filter")
    max_topics: int = setting(
        100_000, at_least(1),
        doc="distinct topics the broker tracks; when full, a new topic evicts one not "
            "published to lately without a retained message (all retained: a retained "
            "publish to a new topic is refused)")
    max_topics_per_client: int = setting(
        10_000, at_least(1), doc="tracked topics one client id may have created")
    topic_expiry: float = setting(
        3600.0, at_least(1),
        doc="seconds without a publish after which a topic (not retained) is forgotten")
    max_subscriptions_per_client: int = setting(
        1000, at_least(1), doc="topic filters per session; more get SUBACK 0x80")
    max_inflight_bytes: int = setting(
        1_048_576, at_least(1),
        doc="bytes (topic + payload) of the outgoing QoS 1/2 window per session")
    max_queued_bytes: int = setting(
        0, at_least(0),
        doc="bytes (topic + payload) queued in memory per session; 0: no such limit (as "
            "max_queued_messages)")
    max_lag_bytes: int = setting(
        268_435_456, at_least(0),
        doc="a session reading from the log this many log bytes behind its head skips QoS 0 "
            "messages (counted as dropped, max_lag); 0: never")
    max_lag_age: float = setting(
        600.0, at_least(0),
        doc="seconds: a QoS 0 message this old when a session behind reads it from the log "
            "is skipped (counted as dropped, max_lag); 0: never")
    max_session_lag_age: float = setting(
        0.0, at_least(0),
        doc="seconds: a session cursor on a record older than this moves forward past it, "
            "QoS 1/2 included (counted as log_gap); 0: never")
    queue_full: str = setting(
        "drop_new", one_of("drop_new", "drop_old"),
        doc="which message a full session queue drops: the new one or the oldest queued")
    messages_rate: float = setting(
        0.0, RATE, doc="PUBLISH packets per second per client; 0: no limit")
    messages_burst: int = setting(
        0, at_least(0), doc="PUBLISH packets a client may send at once; 0: one second's worth")
    bytes_rate: float = setting(
        0.0, RATE,
        doc="published bytes (topic + payload) per second per client; 0: no limit")
    bytes_burst: int = setting(
        0, at_least(0), doc="published bytes a client may send at once; 0: one second's worth")
    control_rate: float = setting(
        100.0, RATE,
        doc="packets other than PUBLISH and its acknowledgements (PINGREQ, SUBSCRIBE, "
            "UNSUBSCRIBE (one per 10 filters), AUTH; acknowledgements for no message in "
            "flight; one per 100 User Properties in any packet; WebSocket pings, pongs, empty "
            "frames) per second per client; over it the client is not read for a while; "
            "0: no limit")
    control_burst: int = setting(
        1000, at_least(0), doc="such packets a client may send at once; 0: one second's worth")
    max_pending_write_bytes: int = setting(
        1_048_576, at_least(1),
        doc="bytes waiting to be written to one connection; beyond it QoS 0 is dropped")
    memory_limit: int | str = setting(
        "auto", size_or_auto,
        doc="resident memory (bytes) above which new connections, topics and subscriptions are "
            "refused; \"auto\": half of the memory the process may use (the machine's, or its "
            "control group's limit); 0: off")

