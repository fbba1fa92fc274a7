"""Sessions and connections: admission, attach/detach, subscribe/unsubscribe, drops.

A connection becomes a ``Client`` (``connection_made``); a valid CONNECT is
admitted (memory_limit, max_connections, the listener's cap, max_sessions for a
new persistent session) and attached to its session, taking it over from an
older connection with the same client id. A clean session goes with its
connection; a persistent one goes offline, keeping only log offsets (and sizes)
of what it still has to receive, until it comes back or has been offline for
persistent_client_expiration (``_expire_later``: a ``Timer`` per offline session
in the broker's deadline heap, due at the session's expiry time, so nothing ever
scans the sessions; MQTT 5's Session Expiry Interval is to set that time). Subscriptions are
made within the topic limits and max_subscriptions_per_client (a refused filter
gets 0x80); retained messages follow for each granted filter (core.retained). Every dropped
message is counted by reason (``drop``), broker-wide and on its session.
"""

from __future__ import annotations

import logging

from collections import deque
from functools import partial

from edgebroker.errors import (
    QUOTA_EXCEEDED, SERVER_SHUTTING_DOWN, SESSION_TAKEN_OVER, name_shown, shown, topic_shown,
)
from edgebroker.core.cursor import needed_from
from edgebroker.core.filter_set import filter_added, filter_removed
from edgebroker.core.client import Client
from edgebroker.core.mqtt5 import kept_offline, session_expiry_cap
from edgebroker.core.retention_moves import counts_at_removal, episode_ends
from edgebroker.core.limits import check_topic
from edgebroker.core.session import EMPTY_QUEUE, Session, as_stored
from edgebroker.core.timers import Timer
from edgebroker.core import throttling
from edgebroker.mqtt import packets as P

TYPE_CHECKING = False   # typing (core.transport's Protocol) for type checkers only: memory
if TYPE_CHECKING:
    from edgebroker.core.transport import Transport

log = logging.getLogger("edgebroker.broker")

# Expiry timers of removed sessions kept for the next session that goes offline: a removed
# session's timer may still sit in the deadline heap until its old time, and reusing it adds
# no entry there (so a client cycling persistent and clean sessions grows nothing).
SPARE_TIMERS = 1024
# Seconds a connection accepted only to be refused (``connection_made``'s ``refusal``) waits
# for its CONNECT: it holds a descriptor kept for refusing the next callers.
REFUSAL_WAIT = 2.0
# The 5.0 subscription options that decide a record read from the log (Cursor.kept5).
_RECORD_OPTIONS = P.SUB_NO_LOCAL | P.SUB_RETAIN_AS_PUBLISHED


class Sessions:
    """Sessions' part of ``Broker`` (a mixin over the broker's state)."""

    def _init_sessions(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.clients_connected = 0
        self.sockets_open = 0
        self.listener_connected: dict[str, int] = {}
        self.persistent_sessions = 0          # sessions with clean session 0 (max_sessions)
        self._spare_timers: list[Timer] = []

    def connection_made(self, transport: Transport, refusal: tuple[str, str] | None = None,
                        kind: type[Client] = Client) -> Client:
        """A new connection's client; ``refusal``: (limit, why) the server accepted it only to
        refuse its CONNECT with CONNACK 3 (it waits at most REFUSAL_WAIT for it); ``kind``:
        ``Client`` or a subclass (the server's behind a framing: server/framing.py)."""
        self.stats.sockets_accepted += 1
        self.sockets_open += 1
        now = self.clock()
        client = kind(self, transport, now)
        if refusal is not None:
            client.refusal = refusal
            client.connect_deadline = min(client.connect_deadline, now + REFUSAL_WAIT)
        self.schedule(client)
        return client

    def admission(self, client: Client, client_id: str, clean: bool) -> tuple[str, str] | None:
        """Why a valid CONNECT cannot be accepted now: (limit, explanation), or None."""
        if client.refusal is not None:
            return client.refusal
        old = self.sessions.get(client_id)
        old_client = old.client if old is not None else None
        limits = self.limits
        if self.memory.over:
            return "memory_limit", (f"memory use {self.memory.rss} bytes is above memory_limit "
                                    f"({self.memory.limit})")
        if old_client is None and self.clients_connected >= limits.max_connections:
            return "max_connections", f"{self.clients_connected} clients connected (max_connections)"
        listener = client.transport.listener
        cap = listener.max_connections if listener is not None else 0
        address = client.listener_address
        if cap and (old_client is None or old_client.listener_address != address):
            count = self.listener_connected.get(address, 0)
            if count >= cap:
                return "listener_max_connections", (f"{count} clients connected on listener "
                                                    f"{address} (its max_connections)")
        if (not clean and (old is None or old.clean)
                and self.persistent_sessions >= limits.max_sessions):
            return "max_sessions", (f"{self.persistent_sessions} persistent sessions "
                                    f"(max_sessions); existing ones may still reconnect")
        return None

    def drop(self, reason: str, session: Session | None, count: int = 1) -> None:
        """Count ``count`` messages dropped for ``reason`` (broker-wide and on the session)."""
        self.stats.publish_dropped += count
        self.dropped[reason] += count
        if session is not None:
            session.saved = None
            drops = session.drops
            if drops is None:
                drops = session.drops = {}
            drops[reason] = drops.get(reason, 0) + count

    def drop_expired(self, session: Session, topic: str) -> None:
        """A message on ``topic`` for ``session`` whose Message Expiry Interval passed before
        it was sent: dropped, counted (``message_expired``), logged (at most once a minute,
        with the number of the others)."""
        self.drop("message_expired", session)
        self.events.log(logging.INFO, "message_expired", self.clock(),
                        "a message on %s for session %s expired (its Message Expiry Interval) "
                        "before it was sent; dropped", topic_shown(topic),
                        name_shown(session.client_id))

    def attach(self, client: Client, client_id: str, clean: bool,
               clean_start: bool | None = None) -> tuple[Session, bool]:
        """Bind a newly connected client to its session; returns (session, present).

        ``clean``: the session ends with the connection (3.1.1 clean session 1, 5.0 Session
        Expiry Interval 0); ``clean_start`` (5.0; 3.1.1: ``clean``): an existing session is
        discarded rather than resumed."""
        if clean_start is None:
            clean_start = clean
        old = self.sessions.get(client_id)
        if old is not None and old.client is not None:
            taken = old.client
            unread = throttling.taken_over(taken)
            log.info("client %s from %s takes over the session; closing the connection from %s%s",
                     name_shown(client_id), client.peer, taken.peer,
                     f" (throttled: the {unread} bytes it sent that were not read yet are "
                     f"dropped)" if unread else "")
            self.stats.takeovers += 1
            # A 5.0 connection's will is not published when a new connection resumes its
            # session: that connection came before the Will Delay Interval (0 too) passed
            # (MQTT-3.1.2-8; as Mosquitto). A 3.1.1 one's is (MQTT-3.1.4-2: disconnected).
            resumed = taken.v5 is not None and not old.clean and not clean_start
            if resumed and taken.will is not None:
                log.info("will of %s on %s not published: a new connection took its session "
                         "over", taken.describe(), topic_shown(taken.will.topic))
            # (its reason string gives no address)
            taken.close(will=not resumed, reason=SESSION_TAKEN_OVER,
                        why=f"client id {name_shown(client_id)} connected again")
            old = self.sessions.get(client_id)
        present = False
        if old is not None and (clean_start or old.clean):
            if not old.clean:
                self._discard_session(old, client)
            else:
                self.drop_session(old)
            old = None
        if old is None:
            session = self.sessions[client_id] = Session(client_id, clean)
            if not clean:
                self.persistent_sessions += 1
            if self.orphan_ids is not None:    # its ids from a journal (core.exchange_restore)
                self.claim_orphan_ids(session, clean_start, client.v5 is not None)
        else:
            session, present = old, True
            session.offline_at = None
            if session.expiry is not None:
                session.expiry.cancel()
            if self.will_timers:
                self.cancel_will(session)   # back within the Will Delay Interval
            if clean:  # 5.0: resumed, to end with this connection
                self._make_clean(session)
        if not clean:
            self._snapshot_dirty = True
        if session.cursor is not None:
            session.cursor.came_back(self.live_offset())
            episode_ends(session, "is back")    # (core.retention_moves)
        session.client = client
        self.clients_connected += 1
        address = client.listener_address
        if address:
            self.listener_connected[address] = self.listener_connected.get(address, 0) + 1
        self.stats.connects_accepted += 1
        return session, present

    def detach(self, client: Client, publish_will: bool) -> None:
        """A connected client's connection ended (its will is still on it)."""
        if client.rate is not None or client.control_due:
            self.rate_debts.keep(client, self.clock())
        self.clients_connected -= 1
        address = client.listener_address
        if address:
            self.listener_connected[address] -= 1
        session = client.session
        if session is not None and session.client is client:
            session.client = None
            if session.clean:
                self.drop_session(session)
            else:
                self._go_offline(session)
        will = client.will
        if not publish_will or will is None:
            return
        delay = will.delay
        if delay and session is not None and session.client is None and not session.clean:
            self.delay_will(session, client, will, delay)   # core.wills
            return
        self.publish_will(client, will, client.acl)

    def _go_offline(self, session: Session) -> None:
        """Keep only log offsets (and sizes) for an offline session: no payload memory. It
        reads what arrives meanwhile from the log when it is back (core.catchup)."""
        if session.shared is not None:
            self.hand_over(session, False)   # its shared QoS 1 messages to other members
        if session.queue:
            session.queue = deque((as_stored(ref), qos, retain)
                                  for ref, qos, retain in session.queue)
        for entry in session.inflight.values():
            entry.message = as_stored(entry.message)
        if self.log_queue and session.cursor is None and session.subscriptions:
            # (None of its own: nothing in the log is for it, so it stays in step, with no
            # lag and holding nothing; a SUBSCRIBE when it is back takes what follows.)
            self.fall_behind(session, self.live_offset())
        cursor = session.cursor
        if cursor is not None:
            cursor.went_offline(self.live_offset())
            cursor.floor = needed_from(session, cursor.unsent(), self.journal.log.first_offset)
        self.resends.pop(session, None)    # sent again when it is back (Resume.resume)
        session.saved = None
        session.offline_at = self.clock()
        self._expire_later(session)
        self._snapshot_dirty = True

    def set_session_expiry(self, session: Session, expiry: int) -> None:
        """A 5.0 client changed its Session Expiry Interval (DISCONNECT): 0 ends the session
        with the connection."""
        session.expiry_interval = expiry
        session.saved = None
        if expiry == 0:
            self._make_clean(session)
        elif not session.clean:
            self._snapshot_dirty = True

    def _make_clean(self, session: Session) -> None:
        """A persistent session is now to end with its connection (5.0)."""
        if session.clean:
            return
        session.clean = True
        self.persistent_sessions -= 1
        self._snapshot_dirty = True
        if self.exchanges is not None:
            self.exchanges.ended(session.client_id)

    def _expire_later(self, session: Session) -> None:
        """Set an offline persistent session's expiry time from ``offline_at``: its Session
        Expiry Interval (5.0) at most persistent_client_expiration when that is set (also one
        set since its CONNECT: a reload, a restart), else persistent_client_expiration; none
        for 0 (3.1.1) or 0xFFFFFFFF (5.0)."""
        expiration = kept_offline(session.expiry_interval,
                                  self.limits.persistent_client_expiration)
        timer = session.expiry
        if not expiration:
            if timer is not None:
                timer.cancel()
            return
        if timer is None:
            spare = self._spare_timers
            timer = session.expiry = spare.pop() if spare else Timer(None)
            timer.callback = partial(self._expire_session, session)
        timer.start(self, session.offline_at + expiration)

    def expire_sessions_again(self) -> None:
        """persistent_client_expiration changed (a reload): every offline session's expiry
        time follows (one pass over the sessions, at the reload only)."""
        for session in self.sessions.values():
            if session.offline_at is not None:
                self._expire_later(session)

    def _expire_session(self, session: Session) -> None:
        """An offline persistent session reached its expiry time: removed, as if it had never
        been (Mosquitto's persistent_client_expiration; 5.0's Session Expiry Interval)."""
        if session.client is not None or self.sessions.get(session.client_id) is not session:
            return
        if session.shared is not None:
            self.hand_over(session, True)   # its groups' QoS 2 messages: shared_left
        held, unread = self._backlog(session)
        offline = self.clock() - session.offline_at
        self.stats.sessions_expired += 1
        if held:
            self.drop("session_expired", None, held)
        self.drop_session(session)
        interval, cap = session.expiry_interval, self.limits.persistent_client_expiration
        setting = (f"its session expiry interval {interval} s" if interval is not None
                   and session_expiry_cap(interval, cap) == interval
                   else f"persistent_client_expiration {cap:g} s")
        self.events.log(logging.INFO, "session_expired", self.clock(),
                        "persistent session %s removed: offline for %.0f s (%s), with %d queued "
                        "or unacknowledged messages and %d log records after its cursor",
                        name_shown(session.client_id), offline, setting, held, unread)

    def _backlog(self, session: Session) -> tuple[int, int]:
        """(messages ``session`` holds queued or unacknowledged, log records after its
        cursor): what removing it discards."""
        cursor = session.cursor
        held = len(session.queue) + len(session.inflight) + (
            len(cursor.held) if cursor is not None and cursor.held else 0)
        unread = self.journal.log.next_offset - cursor.offset if cursor is not None else 0
        return held, unread

    def _discard_session(self, session: Session, client: Client) -> None:
        """A persistent session replaced by a clean one (3.1.1 clean session 1, 5.0 Clean
        Start 1): removed, its backlog logged (not counted as dropped: the client asked)."""
        held, unread = self._backlog(session)
        self.drop_session(session)
        if held or unread:
            self.events.log(logging.INFO, "session_discarded", self.clock(),
                            "persistent session %s discarded: its client connected with %s, "
                            "with %d queued or unacknowledged messages and %d log records "
                            "after its cursor", name_shown(session.client_id),
                            "Clean Start 1" if client.v5 is not None else "clean session 1",
                            held, unread)

    def drop_session(self, session: Session) -> None:
        will_timer = self.will_timers.get(session)
        if will_timer is not None:  # the session ends before its will's delay: sent now
            will_timer.cancel()
            will_timer.callback()
        if session.shared is not None:
            self.leave_shared(session)
        if not session.clean:
            self._snapshot_dirty = True
            if self.exchanges is not None:
                self.exchanges.ended(session.client_id)
        timer = session.expiry
        if timer is not None:
            session.expiry = None
            timer.cancel()
            timer.callback = None
            if len(self._spare_timers) < SPARE_TIMERS:
                self._spare_timers.append(timer)
        for topic_filter in session.subscriptions:
            self.subscriptions.remove(topic_filter, session)
        session.subscriptions.clear()
        session.filter_set = None
        self.queued_messages -= len(session.queue)
        self.queued_bytes -= session.queue_bytes
        session.queue = EMPTY_QUEUE
        session.retained_queued = None
        session.queue_bytes = 0
        session.queued_qos0 = 0
        session.inflight.clear()
        session.inflight_bytes = 0
        self.resends.pop(session, None)
        if session.cursor is not None:
            counts_at_removal(session)      # (core.retention_moves)
            session.cursor = None
            self.behind.discard(session)
            self._catch_up_again.discard(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            if not session.clean:
                self.persistent_sessions -= 1

    def close_all(self) -> None:
        """Close every connection (at shutdown), sessions kept; a 5.0 client is told
        DISCONNECT 0x8B Server shutting down. Each will is kept for the next start
        (core.wills' ``keep_will_at_stop``), not published now."""
        for session in list(self.sessions.values()):
            client = session.client
            if client is not None:
                will, client.will = client.will, None
                client.close(will=False, reason=SERVER_SHUTTING_DOWN,
                             why="server shutting down")
                if will is not None:
                    self.keep_will_at_stop(session, client, will)

    # ----- subscriptions ----------------------------------------------------------------

    def subscribe(self, session: Session, topics: list[tuple[str, int]],
                  v5: bool = False, options: int = 0) -> list[int]:
        """Add subscriptions; a filter over a limit gets 0x80 (counted, logged once per client;
        ``v5``: 0x97 Quota exceeded for memory_limit). ``options``: the 5.0 options the
        SUBSCRIBE gives them beyond the QoS (core.handlers.subscribe sets them after this)."""
        granted = []
        for topic_filter, qos in topics:
            problem = self.over_limit(session, topic_filter, topic_filter,
                                      topic_filter not in session.subscriptions)
            if problem is not None:
                granted.append(QUOTA_EXCEEDED if v5 and problem == "memory_limit"
                               else P.SUBACK_FAILURE)
                continue
            if qos > self.limits.max_qos:
                qos = self.limits.max_qos
            cursor = session.cursor
            if cursor is not None:
                # Behind: the new filter matches only records from now on; a lower QoS counts
                # only for them.
                if topic_filter not in session.subscriptions:
                    if cursor.since is None:
                        cursor.since = {}
                    cursor.since[topic_filter] = self.live_offset()
                    cursor.cache.clear()
                else:
                    at = self.live_offset()
                    cursor.subscribed_again(topic_filter, session.subscriptions[topic_filter],
                                            qos, at)
                    old = session.sub5.get(topic_filter, (0, 0))[0] if session.sub5 else 0
                    if (old ^ options) & _RECORD_OPTIONS:   # (for the records before it too)
                        cursor.options_changed(topic_filter, old & _RECORD_OPTIONS, at)
            self.subscriptions.add(topic_filter, session, qos)
            subscriptions = session.own_subscriptions()
            new = topic_filter not in subscriptions
            subscriptions[topic_filter] = qos
            if new:
                filter_added(session, topic_filter)
            _forget_options(session, topic_filter)  # a 5.0 SUBSCRIBE sets its own after this
            granted.append(qos)
        if not session.clean:
            self._snapshot_dirty = True
        return granted

    def over_limit(self, session: Session, topic_filter: str, checked: str,
                   new: bool) -> str | None:
        """The limit a subscription to ``topic_filter`` is over, or None: the topic limits on
        ``checked`` (the filter itself, or the one inside a shared subscription), and for a
        ``new`` one max_subscriptions_per_client (shared ones count) and memory_limit (the
        broker's memory above it: a filter is kept for as long as its session, so new ones are
        refused as new topics and connections are). Counted, logged once per client."""
        limits = self.limits
        problem = check_topic(checked, limits)
        if problem is None and new:
            if (len(session.subscriptions) + (len(session.shared) if session.shared else 0)
                    >= limits.max_subscriptions_per_client):
                problem = "max_subscriptions_per_client"
            elif self.memory.over:
                problem = "memory_limit"
        if problem is None:
            return None
        self.hit(problem)
        client = session.client
        if client is not None:
            what = shown(topic_filter, 200, "characters")
            if problem == "memory_limit":
                client.warn_once("subscribe:memory_limit",
                                 "subscription to %s refused (SUBACK %s): memory use %d "
                                 "bytes is above memory_limit (%d); new subscriptions are "
                                 "refused until it falls below", what,
                                 "0x80" if client.v5 is None else "0x97", self.memory.rss,
                                 self.memory.limit)
            else:
                client.warn_once("subscribe:" + problem,
                                 "subscription to %s refused (SUBACK 0x80): %s (%d)",
                                 what, problem, getattr(limits, problem))
        return problem

    def unsubscribe(self, session: Session, filters: list[str]) -> None:
        for topic_filter in filters:
            qos = session.subscriptions.pop(topic_filter, None)
            if qos is not None:
                self.subscriptions.remove(topic_filter, session)
                filter_removed(session, topic_filter)
                _forget_options(session, topic_filter)
                if session.cursor is not None:
                    session.cursor.unsubscribed(topic_filter, qos, self.live_offset())
                if not session.clean:
                    self._snapshot_dirty = True


def _forget_options(session: Session, topic_filter: str) -> None:
    """Drop a filter's 5.0 options and Subscription Identifier (``Session.sub5``): it was
    unsubscribed, or subscribed again (a 3.1.1 SUBSCRIBE replaces them with none)."""
    sub5 = session.sub5
    if sub5 is not None and sub5.pop(topic_filter, None) is not None and not sub5:
        session.sub5 = None
