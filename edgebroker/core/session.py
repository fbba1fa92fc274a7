"""Session state: what outlives a connection when clean session is 0.

A session owns its subscriptions, the outgoing QoS 1/2 window (``inflight``,
keyed by packet id, in send order), the queue of messages waiting for the
window or for the client to come back, and the packet ids of inbound QoS 2
messages received but not yet released, each with a digest of its message (for
exactly-once delivery: ``awaiting_release``).

Queue and window entries refer to a message either as a ``Message`` (in
memory, while the client is online) or as a ``Stored`` (its commit-log offset
and size): a session that goes offline keeps those only, and its payloads are
later sent straight from the log file (a retained message's from the retained store while
that still holds it: ``StoredRetained``). A session that falls behind (or goes
offline) keeps a ``cursor`` into the log instead of more entries
(core.catchup): its queue stays small whatever its backlog.
"""

from __future__ import annotations

from collections import deque


class _SharedEmptyQueue(deque):
    """The queue of every session that never queued anything: one shared object, kept empty.

    An idle connection then costs no deque of its own (about 760 bytes); ``Session.own_queue``
    gives a session its own deque before the first append. Appending here is a bug, so it raises.
    """

    __slots__ = ()

    def _read_only(self, *args):
        raise TypeError("the shared empty session queue is read-only: use Session.own_queue()")

    append = appendleft = extend = extendleft = insert = _read_only


class _SharedEmptyIds(dict):
    """Like the above, for ``awaiting_release`` (64 bytes per idle session)."""

    __slots__ = ()

    def _read_only(self, *args, **kwargs):
        raise TypeError("the shared empty id map is read-only: use Session.own_awaiting_release()")

    __setitem__ = setdefault = update = _read_only


class _SharedEmptyDict(dict):
    """Like the above, for ``subscriptions`` and ``inflight`` (64 bytes each per idle session)."""

    __slots__ = ()

    def _read_only(self, *args, **kwargs):
        raise TypeError("the shared empty dict is read-only: use Session.own_subscriptions() or "
                        "own_inflight()")

    __setitem__ = setdefault = update = _read_only


EMPTY_QUEUE = _SharedEmptyQueue()
EMPTY_IDS = _SharedEmptyIds()
EMPTY_DICT = _SharedEmptyDict()


class Message:
    """One application message as routed: shared by every subscriber it reaches."""

    __slots__ = ("topic", "payload", "qos", "retain", "topic_bytes", "size", "offset",
                 "client_id", "properties", "expires")

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool,
                 offset: int | None = None, topic_bytes: bytes | None = None,
                 client_id: str = "", properties: bytes = b"", expires: float = 0.0):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.topic_bytes = topic.encode("utf-8") if topic_bytes is None else topic_bytes
        # What the byte limits (inflight, queued, publish rate) count: topic + payload.
        self.size = len(self.topic_bytes) + len(payload)
        self.offset = offset       # position in the commit log; None if not logged ($SYS)
        self.client_id = client_id  # the publisher's ("": the broker's own)
        # MQTT 5.0: its properties to forward (encoded, without Message Expiry Interval, which
        # ``expires`` holds as the broker clock's time it expires at; 0: never).
        self.properties = properties
        self.expires = expires


class Stored:
    """A message kept by an offline session as its place in the commit log.

    ``size`` is the ``Message.size`` it had, so the byte limits (queued and
    inflight bytes) keep counting it while only the offset is in memory.
    """

    __slots__ = ("offset", "size")

    def __init__(self, offset: int, size: int):
        self.offset = offset
        self.size = size

    def __repr__(self):
        return f"Stored({self.offset}, {self.size})"


class StoredRetained(Stored):
    """A ``Stored`` message that was published retained: its topic too, so that it is sent
    from the retained store while that still holds it (the same log offset), also once
    retention deleted its record (``Broker.retained_copy``). The topic is the message's own
    string: nothing is copied."""

    __slots__ = ("topic",)

    def __init__(self, offset: int, size: int, topic: str):
        self.offset = offset
        self.size = size
        self.topic = topic

    def __repr__(self):
        return f"StoredRetained({self.offset}, {self.size}, {self.topic!r})"


def as_stored(ref):
    """A queue or window entry's message as a ``Stored`` when it is in the log (a
    ``StoredRetained`` for a retained message)."""
    if type(ref) is Message and ref.offset is not None:
        if ref.retain:
            return StoredRetained(ref.offset, ref.size, ref.topic)
        return Stored(ref.offset, ref.size)
    return ref


# Outgoing inflight entry states.
AWAIT_ACK = 0      # PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAIT_COMP = 1     # PUBREL sent, waiting for PUBCOMP


class Outgoing:
    # group_qos, group_retain: set with group (core.shared._give), the QoS the group had the
    # message at (a member may have been sent it lower) and its RETAIN flag as published (a
    # member without Retain As Published is sent 0); unset while group is None.
    __slots__ = ("message", "qos", "retain", "state", "group", "group_qos", "group_retain")

    def __init__(self, message, qos: int, retain: bool):
        self.message = message
        self.qos = qos
        self.retain = retain
        self.state = AWAIT_ACK
        self.group = None   # the shared subscription group it came from (core.shared)


class Session:
    __slots__ = ("client_id", "clean", "subscriptions", "client", "inflight", "queue",
                 "awaiting_release", "_next_id", "dropped", "queue_bytes", "inflight_bytes",
                 "queued_qos0", "drops", "acl", "cursor", "saved", "offline_at", "expiry",
                 "expiry_interval", "sub5", "receive_max", "shared", "retained_queued",
                 "filter_set")

    def __init__(self, client_id: str, clean: bool):
        self.client_id = client_id
        self.clean = clean
        self.subscriptions: dict[str, int] = EMPTY_DICT  # own one: own_subscriptions()
        self.client = None                      # the live Client, or None while offline
        self.inflight: dict[int, Outgoing] = EMPTY_DICT  # own one: own_inflight()
        # (Message or Stored, qos, retain); own one: own_queue()
        self.queue: deque[tuple] = EMPTY_QUEUE
        # Inbound QoS 2: packet id awaiting PUBREL -> a digest of its message (CRC-32 of topic,
        # payload and RETAIN: a re-send without DUP is told from a new message by it; the
        # snapshot and the exchange journal keep it), None for an id restored from a snapshot
        # or journal written before they kept digests.
        self.awaiting_release: dict[int, int | None] = EMPTY_IDS     # own_awaiting_release()
        self._next_id = 0
        self.dropped = 0                        # dropped in the current queue-full episode
        self.queue_bytes = 0                    # Message.size summed over the queue
        # QoS 0 entries in the queue: while there are any, an online session's new QoS 0
        # messages queue behind them (order per topic and QoS, MQTT-4.6.0-6).
        self.queued_qos0 = 0
        self.inflight_bytes = 0                 # ... and over the inflight window
        self.drops: dict[str, int] | None = None  # dropped messages by reason, all time
        self.acl = None     # AclView of the last client, checked before each delivery
        # Set while the session is behind: it reads from the commit log there instead of
        # being routed to (core.cursor.Cursor).
        self.cursor = None
        # What the last snapshot took of it while offline (core.persistence), reused while
        # it does not change; None: to be taken again.
        self.saved = None
        # A persistent session's time (the broker's clock) since it is offline, else None;
        # and the Timer that removes it when it has been offline too long (``expiry.when``
        # is its expiry time, core.sessions).
        self.offline_at: float | None = None
        self.expiry = None
        # MQTT 5.0: its Session Expiry Interval (s; 0xFFFFFFFF never), else None (3.1.1:
        # persistent_client_expiration); and the subscriptions' options beyond the QoS:
        # filter -> (options byte, subscription identifier or 0), for filters with any.
        self.expiry_interval: int | None = None
        self.sub5: dict[str, tuple[int, int]] | None = None
        # The 5.0 client's Receive Maximum when below max_inflight_messages: its window
        # (0: max_inflight_messages).
        self.receive_max = 0
        # Its shared subscriptions: "$share/<name>/<filter>" -> core.shared.Member; None
        # until it makes one.
        self.shared: dict | None = None
        # Log offsets of the retained messages in its queue (sent when it drains), so that
        # a SUBSCRIBE that asks for them again does not queue them twice; None when none.
        self.retained_queued: set[int] | None = None
        # Its filters compiled, once asked which match a topic (core.filter_set); or None.
        self.filter_set = None

    def __repr__(self):
        return f"Session({self.client_id!r})"

    def own_queue(self) -> deque:
        """The session's queue, made its own (not the shared empty one) to append to."""
        queue = self.queue
        if queue is EMPTY_QUEUE:
            queue = self.queue = deque()
        return queue

    def own_subscriptions(self) -> dict:
        subscriptions = self.subscriptions
        if subscriptions is EMPTY_DICT:
            subscriptions = self.subscriptions = {}
        return subscriptions

    def own_inflight(self) -> dict:
        inflight = self.inflight
        if inflight is EMPTY_DICT:
            inflight = self.inflight = {}
        return inflight

    def own_awaiting_release(self) -> dict:
        ids = self.awaiting_release
        if ids is EMPTY_IDS:
            ids = self.awaiting_release = {}
        return ids

    def allocate_id(self) -> int:
        """Next packet id not in use by this session's outgoing window."""
        pid = self._next_id
        inflight = self.inflight
        while True:
            pid = pid + 1 if pid < 65535 else 1
            if pid not in inflight:
                self._next_id = pid
                return pid
