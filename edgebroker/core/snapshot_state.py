"""The state a session snapshot holds (core.snapshot writes it, core.snapshot_decode reads it
back): a module of its own, so that the reader imported only when there is a snapshot to read
does not import the writer's module that imports it."""

from __future__ import annotations

from edgebroker.core.snapshot_retained import RetainedState
from edgebroker.core.will_state import WillState
from edgebroker.records import field, record

# format 1: no cursors (every session was in step with the log); 1 and 2: retained payloads
# in the document (base64), not in a side file
READABLE = (1, 2, 3)
FILENAME = "sessions.json"
LAST_WALL_MS = 253_402_300_799_999   # 9999-12-31T23:59:59.999Z, the last time shown


@record
class SessionState:
    client_id: str
    subscriptions: dict[str, int] = field(default_factory=dict)
    # (packet id, log offset, qos, retain, state, size) in send order.
    inflight: list[tuple[int, int, int, bool, int, int]] = field(default_factory=list)
    # (log offset, qos, retain, size) oldest first. ``size`` is the message's
    # topic + payload bytes (Message.size), counted by the byte limits. A state the broker
    # took (core.persistence) holds the queue's own (message, qos, retain) entries instead,
    # and the writer reads them (``queue_entries``): the loop thread copies no more.
    queue: list[tuple] = field(default_factory=list)
    # Inbound QoS 2 packet id awaiting PUBREL -> its message's digest (None: none kept).
    awaiting_release: dict[int, int | None] = field(default_factory=dict)
    next_id: int = 0
    # The log offset it reads from when behind (core.catchup), else None; the filters
    # subscribed while behind with the offset they match from; the offset ranges it was
    # offline in ([from, to], to None while offline); messages dropped for it, by reason.
    cursor: int | None = None
    since: dict[str, int] = field(default_factory=dict)
    offline: list[list] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    # Offsets past the cursor of QoS 2 messages it was sent before a restart (Cursor.done).
    done: list[int] = field(default_factory=list)
    # Retained copies held for SUBSCRIBEs made while behind (Cursor.held, core.retained):
    # (the log offset the cursor sends them at, the message's log offset, qos, retain, size).
    held: list[tuple[int, int, int, bool, int]] = field(default_factory=list)
    # After a crash: records below it may have been sent before it (Cursor.unsure_to); 0: none.
    unsure_to: int = 0
    # The log offset of its last SUBSCRIBE again or UNSUBSCRIBE while behind (Cursor.resubscribed).
    resubscribed: int = 0
    # (filter, log offset, QoS or 5.0 options): what a filter lowered, or whose options changed,
    # while behind had for the records below the offset (Cursor.lowered, Cursor.kept5).
    lowered: list[tuple[str, int, int]] = field(default_factory=list)
    kept5: list[tuple[str, int, int]] = field(default_factory=list)
    # (filter, from, up to): the records in that offset range that a filter unsubscribed while
    # behind granted QoS 1/2 (Cursor.owed).
    owed: list[tuple[str, int, int]] = field(default_factory=list)
    # Wall-clock time (ms) it went offline, None if it was connected (persistent_client_
    # expiration counts from it; snapshots written before it was kept have none).
    offline_ms: int | None = None
    # MQTT 5.0: its Session Expiry Interval (None: 3.1.1) and its subscriptions' options
    # beyond the QoS: filter -> [options byte, subscription identifier].
    expiry_interval: int | None = None
    sub5: dict[str, list[int]] = field(default_factory=dict)
    # The in-flight entries a shared subscription group gave: packet id -> the group's key.
    groups: dict[int, str] = field(default_factory=dict)
    will: WillState | None = None   # its delayed will, offline within its Will Delay (5.0)
    # Its JSON, once the writer encoded it (an offline session's state is reused by the next
    # snapshots while it does not change, and so is this).
    encoded: bytes | None = field(default=None, compare=False, repr=False)


@record
class GroupState:
    """A shared subscription group's backlog (core.shared): its members are the sessions
    whose ``subscriptions`` hold its key."""
    key: str                        # "$share/<ShareName>/<filter>"
    cursor: int | None = None       # the log offset it reads from when behind
    # (log offset, qos, retain, size), handed out first; with the QoS 1 messages its online
    # members had not acknowledged (a restart gives them to a member anew).
    queue: list[tuple[int, int, bool, int]] = field(default_factory=list)
    # Offsets past the cursor of QoS 2 messages it gave a member before a restart (the
    # exchange journal said so; ``Group.done``): not handed out again.
    done: list[int] = field(default_factory=list)


@record
class Snapshot:
    log_next_offset: int = 0
    written_ms: int = 0
    sessions: list[SessionState] = field(default_factory=list)
    retained: list[RetainedState] = field(default_factory=list)
    shared: list[GroupState] = field(default_factory=list)
    # The first QoS 2 exchange journal generation to apply after it (core.exchanges); None:
    # none (a snapshot written before the journal, or without one).
    exchanges: int | None = None
    # Records of a restart's unclaimed packet ids were written again in that generation's file:
    # it is fsynced before the snapshot is written (core.exchange_restore; not in the
    # document). None: they could not be written, so neither is the snapshot.
    carried: bool | None = False
    # (client id, will) of clients connected at a clean stop whose session ended then: the
    # next start publishes them (core.wills' ``keep_will_at_stop``).
    wills: list[tuple[str, WillState]] = field(default_factory=list)
    # [name, size, crc32] of the side file holding the retained messages' bytes (format 3;
    # None: none, or they are in the document: formats 1 and 2).
    retained_file: list | None = None
