"""Shared subscriptions: ``$share/<ShareName>/<filter>`` (MQTT 5.0 section 4.8.2; 3.1.1
clients may use them too, as with Mosquitto and EMQX).

The sessions subscribed to one ``$share/<ShareName>/<filter>`` are the members of one
``Group``. Each message that matches the filter goes to one member only, at the lower of the
message's QoS and the QoS that member was granted:

- Choice: round-robin over the members, skipping those that cannot take it now (offline, a
  full window, ``max_pending_write_bytes`` waiting, its own queue not empty, or its ACL does not
  let it read the topic). A slow member therefore never holds the others back: a backlog
  entry only busy or offline members may read (ACLs) is passed over, each topic kept in
  order (``_pass_over``, core.shared_backlog).
- No member can take a QoS 1/2 message: it waits in the group's backlog, handed out as members
  acknowledge, drain or come back (``pump_shared``, called by ``Router.pump``). The backlog is
  the log, as for sessions (core.catchup), but one per group: up to QUEUE_MESSAGES /
  QUEUE_BYTES in memory, past it the group keeps a cursor into the commit log and reads the
  records matching its filter from there (``_refill``, core.shared_backlog), so memory stays
  bounded and nothing is dropped while the records are in the log. A cursor per member
  would deliver each message to every member. Records dropped as they are written (5.0
  Message Expiry passed, too large for the member) count toward a budget per loop pass
  (``UNSENT_RECORDS``), past which the hand-out goes on in the next pass. With
  max_queued_messages/bytes set (no log as queue) the backlog is bounded by them instead and
  what does not fit is dropped (counted under that limit).
  A QoS 0 message no member can take now is dropped (``shared_no_room``).
- Hand-over: when a member's connection ends (disconnect, takeover, keep alive; its session
  persistent or not), its unacknowledged QoS 1 messages of shared groups go back to the front
  of their group's backlog and are sent anew (DUP 0) to another member. QoS 2 messages stay
  with the session: delivery completes when it reconnects (MQTT-4.8.2-4); if the session
  ends first they are not sent to anyone else (MQTT-4.8.2-5, counted: ``shared_left``).
  An unsubscribing member keeps what it was sent (MQTT-3.10.4-3): once its group ended, a
  persistent member's QoS 1 messages of it stay with the session when the connection ends.
- A group exists while it has members; when the last one leaves, its backlog is dropped
  (counted: ``shared_left``).

Retained messages are not sent for a shared subscription (MQTT 5.0 section 3.3.1.3 sends them
for non-shared ones only). The trie of groups (``shared_trie``) is apart from the sessions'
trie, and a session's shared subscriptions (``Session.shared``) apart from its
``subscriptions``: catching up from the log (core.catchup) never sees them. docs/protocol.md
("Shared subscriptions") says what the broker does and why.
"""

from __future__ import annotations

import logging
from collections import deque

from edgebroker.core.catchup import NO_HOLD, QUEUE_BYTES, QUEUE_MESSAGES
from edgebroker.core.router import queue_limit
from edgebroker.errors import QUOTA_EXCEEDED, name_shown, topic_shown
from edgebroker.core.session import AWAIT_ACK, Message
from edgebroker.core.timers import Timer
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.properties import varint
from edgebroker.mqtt.topics import parse_shared
from edgebroker.mqtt.trie import SubscriptionTrie

log = logging.getLogger("edgebroker.broker")

DENIED = object()      # _pick: every member's ACL refuses the topic


class Member:
    """One session's subscription to a group."""

    __slots__ = ("session", "group", "qos", "options", "sub_id", "ids")

    def __init__(self, session, group: "Group", qos: int, options: int, sub_id: int):
        self.session = session
        self.group = group
        self.set(qos, options, sub_id)

    def set(self, qos: int, options: int, sub_id: int) -> None:
        self.qos = qos
        self.options = options          # 5.0 options beyond the QoS (Retain As Published)
        self.sub_id = sub_id
        # The Subscription Identifier property a 5.0 member's PUBLISH carries (only this
        # subscription's: the message reaches it through this subscription alone).
        self.ids = b"\x0b" + varint(sub_id) if sub_id else b""


class Group:
    """The members of one shared subscription and the messages none could take yet."""

    __slots__ = ("key", "name", "filter", "filter_bytes", "members", "ring", "turn", "queue",
                 "queue_bytes", "cursor", "done", "aged", "dropped", "dropped0")

    def __init__(self, key: str, name: str, topic_filter: str):
        self.key = key                  # "$share/<name>/<filter>"
        self.name = name
        self.filter = topic_filter
        self.filter_bytes = topic_filter.encode("utf-8")
        self.members: dict = {}         # session -> Member
        self.ring: list[Member] = []    # round-robin order
        self.turn = 0                   # index in ring of the next member to try first
        # The backlog: (Message or Stored, QoS of the message, retain flag, topic or None).
        self.queue: deque[tuple] = deque()
        self.queue_bytes = 0
        self.cursor: int | None = None  # behind: the log offset it reads from next
        self.done: set[int] | None = None  # offsets a member was sent before a restart
        self.aged = -1                  # records skipped for max_session_lag_age after the
        #                                 logged move (-1: none logged yet)
        # Dropped in the current episode: past max_queued_* (until the backlog drains), and
        # QoS 0 with no member to take it (until one takes one); each episode logged twice.
        self.dropped = 0
        self.dropped0 = 0

    def __repr__(self):
        return f"Group({self.key!r}, {len(self.members)} members)"

    @property
    def backlog(self) -> bool:
        return bool(self.queue) or self.cursor is not None

    def floor(self) -> int:
        """The oldest log offset the group still needs (retention holds it)."""
        floor = NO_HOLD if self.cursor is None else self.cursor
        for ref, _, _, _ in self.queue:
            if ref.offset is not None and ref.offset < floor:
                floor = ref.offset
        return floor


class Shared:
    """Shared subscriptions' part of ``Broker`` (a mixin over the broker's state)."""

    def _init_shared(self) -> None:
        self.groups: dict[str, Group] = {}     # key -> group
        self.shared_trie = SubscriptionTrie()  # filter -> groups
        self.shared_members = 0                # (session, group) pairs
        self._shared_again: set[Group] = set()  # groups behind to read on in the next pass
        self._shared_timer = Timer(self._on_shared_again)
        # While the log's replay after a restart runs: the QoS 0 messages for groups it passed
        # over (``route_shared``); None otherwise.
        self.shared_replayed0: int | None = None

    # ----- membership ----------------------------------------------------------------------

    def subscribe_shared(self, session, key: str, qos: int, options: int = 0,
                         sub_id: int = 0) -> int:
        """Make (or change) ``session``'s subscription to ``key`` ($share/<name>/<filter>,
        valid): the granted QoS, or 0x80 over a limit (as ``subscribe``; 0x97 for memory_limit,
        which a 3.1.1 SUBACK gives as 0x80)."""
        name, topic_filter = parse_shared(key)
        shared = session.shared
        problem = self.over_limit(session, key, topic_filter, shared is None or key not in shared)
        if problem is not None:
            return QUOTA_EXCEEDED if problem == "memory_limit" else P.SUBACK_FAILURE
        if qos > self.limits.max_qos:
            qos = self.limits.max_qos
        self.join_shared(session, key, name, topic_filter, qos, options, sub_id)
        return qos

    def join_shared(self, session, key: str, name: str, topic_filter: str, qos: int,
                    options: int, sub_id: int) -> None:
        """Make (or change) ``session``'s membership of the group ``key`` (of ``name`` and
        ``topic_filter``), whatever the limits: checked by the caller (``subscribe_shared``),
        or kept as they were when it was made (a restart, core.shared_state)."""
        shared = session.shared
        member = shared.get(key) if shared else None
        if member is not None:
            member.set(qos, options, sub_id)
        else:
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = Group(key, name, topic_filter)
                self.shared_trie.add(topic_filter, group, 2)
            member = Member(session, group, qos, options, sub_id)
            group.members[session] = member
            group.ring.append(member)
            if shared is None:
                shared = session.shared = {}
            shared[key] = member
            self.shared_members += 1
        if not session.clean:
            self._snapshot_dirty = True

    def unsubscribe_shared(self, session, key: str) -> bool:
        """End ``session``'s subscription to ``key``; False if it had none. What it was sent
        and has not acknowledged stays with it (MQTT-3.10.4-3)."""
        shared = session.shared
        member = shared.pop(key, None) if shared else None
        if member is None:
            return False
        group = member.group
        del group.members[session]
        ring = group.ring
        i = ring.index(member)
        del ring[i]
        if i < group.turn:
            group.turn -= 1
        self.shared_members -= 1
        if not session.clean:
            self._snapshot_dirty = True
        if not group.members:
            self._end_group(group)
        return True

    def _end_group(self, group: Group) -> None:
        """The last member left: the group and its backlog go (counted, logged)."""
        del self.groups[group.key]
        self.shared_trie.remove(group.filter, group)
        self._shared_again.discard(group)
        queued = len(group.queue)
        # Behind: the log records it had still to read, of any topic (an upper bound).
        unread = 0 if group.cursor is None else max(0, self.live_offset() - group.cursor)
        if queued + unread:
            self.drop("shared_left", None, queued + unread)
        if queued or group.cursor is not None:
            log.warning("shared subscription %s: its last member left; %d queued messages "
                        "dropped%s", topic_shown(group.key), queued,
                        "" if group.cursor is None else
                        f", and the {unread} log records from offset {group.cursor} on it had "
                        f"still to read (counted, whatever their topic) are not delivered")
        group.queue.clear()
        group.cursor = None

    def hand_over(self, session, ending: bool) -> None:
        """``session``'s connection ended (``ending``: and so does the session): its
        unacknowledged QoS 1 messages of groups go back to them for another member (DUP 0,
        as new messages); its QoS 2 ones stay (MQTT-4.8.2-4), or are lost with the session
        (MQTT-4.8.2-5). A QoS 1 message whose group ended (its last member left) stays with
        a session that goes on, sent again when it is back (MQTT-3.10.4-3, MQTT-4.4.0-1)."""
        inflight = session.inflight
        back: dict[Group, list] = {}
        lost = 0
        for pid, entry in list(inflight.items()):
            group = entry.group
            if group is None or entry.state != AWAIT_ACK:
                continue
            gone = self.groups.get(group.key) is not group
            if not ending and (entry.qos == 2 or gone):
                continue
            del inflight[pid]
            session.inflight_bytes -= entry.message.size
            if entry.qos == 2 or gone:
                lost += 1
                if entry.qos == 2 and session.clean and self.exchanges is not None:
                    # Its exchange is over (a restart counts those not over as lost).
                    self.exchanges.completed(session.client_id, pid)
            else:
                back.setdefault(group, []).append(entry)
        if lost:
            self.drop("shared_left", session, lost)
            log.warning("session %s ended with %d unacknowledged messages of shared "
                        "subscriptions that cannot go to another member (QoS 2, MQTT-4.8.2-5, "
                        "or the group is gone); dropped", name_shown(session.client_id), lost)
        for group, entries in back.items():
            queue = group.queue
            for entry in reversed(entries):
                ref = entry.message
                # At the QoS and RETAIN flag the group had it with: the next member may be
                # granted more than this one was (MQTT-3.8.4-8), or have Retain As Published
                # when this one had not (MQTT-3.3.1-12).
                queue.appendleft((ref, entry.group_qos, entry.group_retain,
                                  ref.topic if type(ref) is Message else None))
                group.queue_bytes += ref.size
            self.stats.shared_handed_over += len(entries)
            log.info("session %s left shared subscription %s with %d unacknowledged QoS 1 "
                     "messages: they go to another member", name_shown(session.client_id),
                     topic_shown(group.key), len(entries))
            self._drain(group)

    def leave_shared(self, session) -> None:
        """``session`` ends: hand over what it was sent, then leave every group."""
        self.hand_over(session, True)
        for key in list(session.shared):
            self.unsubscribe_shared(session, key)

    # ----- delivery ------------------------------------------------------------------------

    def route_shared(self, message: Message) -> bool:
        """Give ``message`` to one member of each group whose filter matches its topic;
        False when none does."""
        groups = self.shared_trie.match(message.topic)
        if not groups:
            return False
        if not message.qos and self.shared_replayed0 is not None:
            # The replay after a crash: before it, each went to a member or was dropped
            # (counted then). At most once: not sent again, nor counted again.
            self.shared_replayed0 += 1
            return True
        for group, _ in groups:
            self._share(group, message)
        return True

    def _share(self, group: Group, message: Message) -> None:
        qos = message.qos
        topic = message.topic
        if qos == 0:
            member = self._pick(group, 0, topic)
            if member is DENIED:
                self.stats.acl_deliveries_denied += 1
            elif member is None:
                self.drop("shared_no_room", None)
                if not group.dropped0:
                    log.warning("shared subscription %s: no member can take a QoS 0 message "
                                "now (none online, or none with room); dropping them until "
                                "one can", topic_shown(group.key))
                group.dropped0 += 1
            else:
                if group.dropped0:
                    log.warning("shared subscription %s: a member takes QoS 0 messages again; "
                                "%d were dropped", topic_shown(group.key), group.dropped0)
                    group.dropped0 = 0
                self._give(member, message, 0, message.retain)
            return
        # Behind (group.cursor), it reads a logged record from the log (_refill).
        if group.cursor is None or message.offset is None:
            if not group.queue:
                member = self._pick(group, qos, topic)
                if member is DENIED:
                    self.stats.acl_deliveries_denied += 1
                    return
                if member is not None:
                    self._give(member, message, qos, message.retain)
                    return
            self._queue(group, message, qos, topic)
        if self._guarded(group):
            # The backlog's head may be one only busy or offline members may read: another
            # member may take this one now (_pass_over).
            self._drain(group)

    @staticmethod
    def _guarded(group: Group) -> bool:
        """Whether a member has an ACL: members may differ in what they may read."""
        return any(m.session.acl is not None for m in group.ring)

    def _pick(self, group: Group, qos: int, topic: str | None):
        """The next member round-robin that can take a message of ``qos`` on ``topic`` now;
        None: none can now; DENIED: no member may read the topic."""
        ring = group.ring
        n = len(ring)
        if not n:
            return None
        limits = self.limits
        start = group.turn % n
        allowed = False
        for i in range(n):
            member = ring[(start + i) % n]
            session = member.session
            acl = session.acl
            if acl is not None and topic is not None and not acl.can_read(topic):
                continue
            allowed = True
            client = session.client
            if client is None:
                continue
            transport = client.transport
            if transport.out_bytes >= transport.max_pending:
                transport.wait_for_drain()     # Client.writable -> pump -> pump_shared
                continue
            if (qos and member.qos
                    and (session.queue
                         or len(session.inflight) >= (session.receive_max
                                                      or limits.max_inflight_messages)
                         or session.inflight_bytes >= limits.max_inflight_bytes)):
                continue
            group.turn = (start + i + 1) % n
            return member
        return None if allowed else DENIED

    def _give(self, member: Member, ref, qos: int, retain: bool) -> None:
        """Send to ``member`` (it has room: ``_pick``), at the lower of the two QoS."""
        session = member.session
        group_qos, group_retain = qos, retain
        if member.qos < qos:
            qos = member.qos
        retain = retain and bool(member.options & P.SUB_RETAIN_AS_PUBLISHED)
        if qos == 0:
            if self._write_publish(session.client, ref, 0, retain, False, None, member.ids):
                if group_qos == 2:
                    self._given(member.group, ref)
            return
        entry = self._send(session, ref, qos, retain, member.ids, member.group.key)
        if entry is not None:
            entry.group = member.group
            entry.group_qos = group_qos
            entry.group_retain = group_retain

    def _given(self, group: Group, ref) -> None:
        """A message published at QoS 2 that ``group`` gave a member at QoS 0, or at QoS 1
        and the member acknowledged it (``shared_acked``): journaled, so that after a crash
        the group does not hand it out again (``G``, core.exchanges). A QoS 1 copy not
        acknowledged at a crash goes to the group again (at least once)."""
        if self.exchanges is not None and ref.offset is not None:
            self.exchanges.given(group.key, ref.offset)

    def shared_acked(self, entry) -> None:
        """The PUBACK of a QoS 1 copy of a message published at QoS 2 a group gave."""
        self._given(entry.group, entry.message)

    def _queue(self, group: Group, message: Message, qos: int, topic: str) -> None:
        """No member can take ``message`` now: into the backlog, or past its bound, the group
        reads the log from this record on."""
        queue = group.queue
        if self.log_queue:
            if len(queue) < QUEUE_MESSAGES and group.queue_bytes < QUEUE_BYTES:
                queue.append((message, qos, message.retain, topic))
                group.queue_bytes += message.size
            elif message.offset is not None:
                group.cursor = message.offset
                self.stats.shared_fell_behind += 1
            else:
                self.drop("not_logged", None)
            return
        limit = queue_limit(self.limits, len(queue), group.queue_bytes)
        if limit is not None:
            self.hit(limit)
            self.drop(limit, None)
            if not group.dropped:
                log.warning("shared subscription %s: its backlog is full (%d messages, %d bytes; "
                            "%s %d); dropping new messages for it until it drains",
                            topic_shown(group.key),
                            len(queue), group.queue_bytes, limit, getattr(self.limits, limit))
            group.dropped += 1
            return
        queue.append((message, qos, message.retain, topic))
        group.queue_bytes += message.size

    def shared_ids(self, session, group: Group) -> bytes | None:
        """The Subscription Identifier a message of ``group`` carries to ``session`` when it is
        sent again (None: no longer a member, the session's matching filters' then)."""
        member = session.shared.get(group.key) if session.shared else None
        return member.ids if member is not None else None

    def pump_shared(self, session) -> None:
        """``session`` may have room now (an acknowledgement, its output drained, it came
        back or subscribed): its groups hand out what waits."""
        if not session.shared:
            return
        for member in list(session.shared.values()):
            group = member.group
            if group.backlog:
                self._drain(group)

    # ----- figures ----------------------------------------------------------------------------

    def shared_figures(self) -> dict:
        groups = self.groups.values()
        return {"shared_groups": len(self.groups),
                "shared_subscriptions": self.shared_members,
                "shared_queued_messages": sum(len(g.queue) for g in groups),
                "shared_groups_behind": sum(1 for g in groups if g.cursor is not None)}


__all__ = ["DENIED", "Group", "Member", "Shared"]
