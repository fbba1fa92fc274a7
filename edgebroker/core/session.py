"""Session state: what outlives a connection when clean session is 0.

A session owns its subscriptions, the outgoing QoS 1/2 window (``inflight``,
keyed by packet id, in send order), the queue of messages waiting for the
window or for the client to come back, and the packet ids of inbound QoS 2
messages received but not yet released (for exactly-once delivery).

Queue and window entries refer to a message either as a ``Message`` (in
memory, while the client is online) or as its commit-log offset (an ``int``):
a session that goes offline keeps offsets only, so an offline backlog costs a
few bytes per message, and its payloads are later sent straight from the log
file.
"""

from __future__ import annotations

from collections import deque


class Message:
    """One application message as routed: shared by every subscriber it reaches."""

    __slots__ = ("topic", "payload", "qos", "retain", "topic_bytes", "offset")

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool,
                 offset: int | None = None):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.topic_bytes = topic.encode("utf-8")
        self.offset = offset       # position in the commit log; None if not logged ($SYS)


def as_offset(ref):
    """A queue or window entry's message as a log offset when it has one."""
    if type(ref) is Message and ref.offset is not None:
        return ref.offset
    return ref


# Outgoing inflight entry states.
AWAIT_ACK = 0      # PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAIT_COMP = 1     # PUBREL sent, waiting for PUBCOMP


class Outgoing:
    __slots__ = ("message", "qos", "retain", "state")

    def __init__(self, message, qos: int, retain: bool):
        self.message = message
        self.qos = qos
        self.retain = retain
        self.state = AWAIT_ACK


class Session:
    __slots__ = ("client_id", "clean", "subscriptions", "client", "inflight", "queue",
                 "awaiting_release", "_next_id", "dropped", "acl")

    def __init__(self, client_id: str, clean: bool):
        self.client_id = client_id
        self.clean = clean
        self.subscriptions: dict[str, int] = {}
        self.client = None                      # the live Client, or None while offline
        self.inflight: dict[int, Outgoing] = {}
        self.queue: deque[tuple] = deque()     # (Message or log offset, qos, retain)
        self.awaiting_release: set[int] = set()
        self._next_id = 0
        self.dropped = 0
        self.acl = None     # AclView of the last client, checked before each delivery

    def __repr__(self):
        return f"Session({self.client_id!r})"

    def allocate_id(self) -> int:
        """Next packet id not in use by this session's outgoing window."""
        pid = self._next_id
        inflight = self.inflight
        while True:
            pid = pid + 1 if pid < 65535 else 1
            if pid not in inflight:
                self._next_id = pid
                return pid
