"""The broker: one object over its parts, which the server layer holds.

``Broker`` keeps the state every part shares (configuration and limits, the
clock, ``prompt``, counters, the topic table, the memory guard, the journal) and
takes its methods from one module per concept (mixins, so the hot path calls
them as the broker's own methods, with no extra call or lookup per message):

- ``core.router``: routing, the frame cache, queues and windows, sending from the log;
- ``core.router5``: what a PUBLISH to an MQTT 5.0 subscriber carries, and its options;
- ``core.sessions``: admission, attach/detach, subscriptions, drops;
- ``core.wills``: wills, delayed ones (5.0) kept across restarts;
- ``core.retained``: retained messages for a SUBSCRIBE (held while the session is behind),
  and those a session holds sent from the retained store while it has them;
- ``core.resume``: a session's window sent again when its client is back, and let go of
  where a record is gone;
- ``core.catchup``: the log as the queue: cursors of sessions behind, reading from them;
  ``core.catchup_run`` the runs a session with one subscription sends at once;
- ``core.shared``: shared subscriptions: groups, the choice of member, hand-over;
  ``core.shared_backlog`` a group's backlog handed out and read from the log;
  ``core.shared_state`` groups across restarts (snapshot, restore, the exchange journal's
  records of them);
- ``core.timers``: the deadline heap (keepalive, CONNECT timeout, ``Timer``s) and
  the periodic maintenance;
- ``core.persistence``: snapshots (capture, restore, replay), with ``core.exchanges``
  (the QoS 2 exchanges of persistent sessions, journaled between snapshots).

Per-packet handlers are in ``core.handlers`` (tables in ``core.dispatch``); a
connection's own state in ``core.client``; the transport seam in
``core.transport``. No sockets and no clock of its own: the server layer hands
in transports and a clock, and calls ``tick`` when ``next_deadline`` comes due.

Limits (docs/limits.md): every hit is counted by limit name in
``limit_hits``, every refused connection by reason in ``refused``, every
dropped message by reason in ``dropped`` (and in ``stats.publish_dropped``).
"""

from __future__ import annotations

import heapq
import logging

from edgebroker.config import Config
from edgebroker.core.catchup import CatchUp
from edgebroker.core.catchup_run import CatchUpRuns
from edgebroker.core.client import Client
from edgebroker.core.exchange_restore import ExchangeRestore
from edgebroker.core.journal import Journal
from edgebroker.core.limits import (
    DROPS, LIMITS, REFUSALS, ControlRate, EventLog, PeerLog, TopicTable,
    zero_counts,
)
from edgebroker.core.memory import MemoryGuard
from edgebroker.core.metrics import PassTimes
from edgebroker.core.mqtt5 import receive_window
from edgebroker.core.persistence import Persistence
from edgebroker.core.resume import Resume
from edgebroker.core.retained import RetainedDelivery
from edgebroker.core.router import Router
from edgebroker.core.router5 import Router5
from edgebroker.core.sessions import Sessions
from edgebroker.core.shared import Shared
from edgebroker.core.shared_backlog import SharedBacklog
from edgebroker.core.shared_state import SharedState
from edgebroker.core.stats import Stats, SysTopics
from edgebroker.core.throttling import RateDebts, apply_rates
from edgebroker.core.timers import Timers
from edgebroker.core.wills import Wills
from edgebroker.errors import name_shown, topic_shown

log = logging.getLogger("edgebroker.broker")

# A PUBLISH is answered without the coalescing delay when its connection sent something
# less than this many coalesce_ms before (see Broker.prompt).
PROMPT_GAP_FACTOR = 20


def prompt_gap(config: Config) -> float:
    """Seconds: a PUBLISH this soon after its connection's previous packet is answered at once."""
    return config.coalesce_ms / 1000 * PROMPT_GAP_FACTOR


class Broker(Router, Router5, Resume, Sessions, RetainedDelivery, CatchUp, CatchUpRuns, Timers,
             Persistence, ExchangeRestore, Shared, SharedBacklog, SharedState, Wills):
    def __init__(self, config: Config, clock, commit_log=None, wall_ms=None):
        self.config = config
        self.limits = config.limits
        self.clock = clock
        self.started = clock()
        # The loop may hold a pass's log write and output for up to coalesce_ms, gathering
        # more (Loop.run), unless something queued answers a client that waits for it:
        # ``prompt`` says so (set by the core, cleared by the loop when it sends). A PUBLISH
        # counts as waited for when its connection sent something less than ``prompt_gap``
        # before: the delay then costs no client more than 1/PROMPT_GAP_FACTOR of its rate.
        self.prompt = False
        self.prompt_gap = prompt_gap(config)
        # The transport of a session catching up from the log that was sent QoS 1 or 2
        # messages in this pass: the loop may poll for its acknowledgements a little before
        # it sleeps (server.loop.BusyPoll); cleared by the loop.
        self.awaiting_acks = None
        self.busy_poll = None   # ... and that BusyPoll, for its figures (metrics.snapshot)
        self.cpu_contention = None  # the loop's server.contention.CpuContention (figures)
        self._init_sessions()
        self._init_router()
        self._init_shared()
        self.stats = Stats()
        self.topics = TopicTable()
        self.known_topics = self.topics.current  # the hot path's view (see _on_topic_expiry)
        self.throttled: set[Client] = set()
        self.throttled_seconds = 0.0      # of throttles that ended
        self.rate_debts = RateDebts()     # what departed clients owe their rates, by id
        self.limit_hits = zero_counts(LIMITS)
        self.refused = zero_counts(REFUSALS)
        self.dropped = zero_counts(DROPS)
        self._init_wills()
        self.pass_times = PassTimes()     # filled by the server loop
        self.events = EventLog(log)
        # The lines of refused and misbehaving connections.
        self.peer_log = PeerLog(self.started, config.refusal_log_interval)
        self.memory = MemoryGuard(self.limits.memory_limit)
        if self.memory.source:
            log.info("memory_limit %d bytes (%s)", self.memory.limit, self.memory.source)
        self.memory.check()
        self.control = ControlRate.for_limits(self.limits)  # None: no control_rate
        self._init_timers()
        self.journal = (Journal(commit_log, config.log.durability, wall_ms, self.stats, clock)
                        if commit_log is not None else None)
        if self.journal is not None:
            self.acknowledge = self.journal.acknowledge  # one call less per QoS 1/2 PUBLISH
        # Persistent sessions' QoS 2 exchanges (core.exchanges.ExchangeJournal), set by the
        # server with the state directory; None: not journaled (in-process use).
        self.exchanges = None
        # The uploader's figures for the stats (uploader.Uploader.figures, any thread), set by
        # the server when [upload] url is set; None: no uploading.
        self.upload_figures = None
        # Readers of the log with cursors of their own beside the sessions (the bridges,
        # edgebroker.bridge), set by the server: ``on_written()`` after a pass wrote records
        # (a reader at the head goes on without polling), ``hold()`` the oldest offset it
        # still needs (age retention keeps it; core.timers).
        self.log_consumers: list = []
        # The bridges' figures (edgebroker.bridge.Bridges.figures(wall_ms)), with [[bridge]].
        self.bridge_figures = None
        self._init_persistence(commit_log)
        self._init_catchup()
        self.sys = SysTopics(self, self.started)

    def hit(self, limit: str) -> None:
        self.limit_hits[limit] += 1

    def has_retained(self, topic: str) -> bool:
        return self.retained.get(topic) is not None

    def admit_topic(self, topic: str, client, retain: bool) -> str | None:
        """A PUBLISH to a topic not in ``known_topics``: the topic table's answer (None:
        admitted), with its evictions counted and logged."""
        topics = self.topics
        evicted = topics.evicted
        refused = topics.admit(topic, client.client_id, self.limits, self.memory.over,
                               self.has_retained, retain)
        self.known_topics = topics.current  # a full table may have started a new period
        if topics.evicted != evicted:
            self.stats.topics_evicted += topics.evicted - evicted
            top = heapq.nlargest(3, topics.per_client.items(), key=lambda item: item[1])
            self.events.log(
                logging.WARNING, "topics_evicted", self.clock(),
                "topic table full (max_topics %d): topics not published to lately (and "
                "without a retained message) make room for new ones, such as %s from %s; "
                "an evicted topic is admitted again when next published to. Most topics "
                "tracked per client id: %s", self.limits.max_topics, topic_shown(topic),
                client.describe(),
                ", ".join(f"{name_shown(cid)} {count}" for cid, count in top))
        return refused

    def apply_config(self, config: Config) -> None:
        """Settings that take effect without a restart (SIGHUP)."""
        old = self.limits
        self.config = config
        self.limits = config.limits
        self.prompt_gap = prompt_gap(config)
        now = self.clock()
        if self.memory.configure(config.limits.memory_limit) and self.memory.source:
            log.info("memory_limit %d bytes (%s)", self.memory.limit, self.memory.source)
        old_control, self.control = self.control, ControlRate.for_limits(config.limits)
        apply_rates(self, old, old_control, now)   # at once, for every client
        log_queue = self._log_is_queue(config.limits)
        if log_queue != self.log_queue:
            self.log_queue = log_queue
            log.warning("max_queued_messages/max_queued_bytes %s: sessions that fall behind from "
                        "now on %s", "cleared" if log_queue else "set",
                        "read from the commit log" if log_queue else
                        "queue in memory within them (those already behind read from the log)")
        limits = config.limits
        bytes_grew = limits.max_inflight_bytes > old.max_inflight_bytes
        if limits.max_inflight_messages != old.max_inflight_messages or bytes_grew:
            for session in list(self.sessions.values()):
                client = session.client
                if client is None:
                    continue
                before = session.receive_max or old.max_inflight_messages
                # (a 5.0 client's Receive Maximum holds)
                session.receive_max = receive_window(client.v5, limits)
                if bytes_grew or (session.receive_max or limits.max_inflight_messages) > before:
                    # Its window grew: filled now, not at the client's next acknowledgement.
                    self.pump(session)
        if config.limits.topic_expiry != old.topic_expiry:
            self._topic_expiry.start(self, now + config.limits.topic_expiry)
        if config.limits.persistent_client_expiration != old.persistent_client_expiration:
            self.expire_sessions_again()
        if config.refusal_log_interval != self.peer_log.period:
            self.peer_log.flush(now)
            self.peer_log.period = config.refusal_log_interval
            self._peer_log_period.start(self, now + self._peer_log_every())
        self.sys.configure(now)

    def acknowledge(self, client, offset: int | None, frame: bytes) -> None:
        """Send ``frame`` (a PUBACK or PUBREC) once ``offset`` is safe; with a log, the
        instance's ``acknowledge`` is the journal's own."""
        client.transport.write(frame)

    def end_pass(self) -> None:
        """The end of a loop pass, before it sends: the log's records to the OS, the QoS 1/2
        messages they hold to their subscribers, the QoS 2 exchanges that moved to their
        journal."""
        journal = self.journal
        if journal is not None:
            journal.end_pass()
            if self.unrouted:
                self.route_written()
            for consumer in self.log_consumers:
                consumer.on_written()
        self.before_send()
        self.new_pass_budgets()

    def before_send(self) -> None:
        """Something is sent now (the end of the pass, or a connection that must be sent to
        in its middle): first the QoS 2 exchange records that cover it (core.exchanges)."""
        exchanges = self.exchanges
        if exchanges is not None and exchanges.lines:
            exchanges.write()
