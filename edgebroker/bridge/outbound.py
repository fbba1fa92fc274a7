"""A bridge's outbound side: a consumer of the commit log with a cursor of its own.

The bridge reads the records its ``out`` rules match from the log in batches
(``CommitLog.read_batch``: the native scanner validates them and, with one rule, filters them
by topic), keeps at most ``READ_AHEAD`` of them in memory, and hands them to the link as the
window allows. Each record sent is *outstanding* until the remote acknowledges it (PUBACK for
QoS 1, PUBCOMP for QoS 2); the cursor is the first offset not acknowledged: the oldest
outstanding record, else the oldest record read and not sent, else where reading goes on.
So the cursor only moves past the contiguous acknowledged prefix, whatever order the
acknowledgements come in, and what lies below it was forwarded.

Records the bridge itself published here (its inbound side: the log's publisher id is the
bridge's client id) are never sent out again: that is the origin marker that keeps a 3.1.1
bridge from looping (docs/bridge.md).

A record whose remote topic is no valid topic name (``Rules.outgoing`` says why: over 65,535
bytes once ``remote_prefix`` is added) can never be sent: it is skipped as it is read, so
the cursor moves past it, counted (``unsendable``, drop reason ``bridge_unsendable``) and
logged once per episode (a run of them until a message goes out; at most once a minute).

A record's MQTT 5.0 properties (the log keeps them, docs/log-format.md) are read with it
(``carried``): on a 5.0 link they go out with the message, its Message Expiry Interval
counted down by the time since the record was logged (MQTT-3.3.2-6). A record whose
expiry passed before it was handed to the link (the link was down, or the backlog long),
on either protocol version, is not forwarded (MQTT-3.3.2-5): the cursor moves past it,
counted (``expired``, drop reason ``message_expired``) and logged once per bridge.

Memory is O(window + READ_AHEAD) whatever the backlog: the backlog stays in the log.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from edgebroker import errors
from edgebroker.errors import ProtocolError
from edgebroker.mqtt.properties import MESSAGE_EXPIRY, decode_body

log = logging.getLogger("edgebroker.bridge")

# Records read and not yet sent, at most (and their payload bytes).
READ_AHEAD = 1024
READ_AHEAD_BYTES = 4 * 1024 * 1024
# One read looks at most this many log bytes for matching records.
SCAN_BYTES = 4 * 1024 * 1024
COPY_ALL = 1 << 62   # read_batch's copy_limit: every payload comes back in memory
# Seconds between two log lines about unsendable records (each episode is logged, but not
# more often than this).
UNSENDABLE_LOG_EVERY = 60.0
# Characters of a topic shown in a log line.
SHOWN = 120


def shown(topic: str) -> str:
    """``topic`` for a log line: its start and its size when it is long."""
    return errors.shown(topic, SHOWN, "bytes")


def carried(stored: bytes, logged_ms: int) -> tuple[dict | None, int]:
    """A log record's properties (as docs/log-format.md stores them) and when it was logged
    (ms on the broker's clock) -> (those to forward on a 5.0 link, with the Message Expiry
    Interval as published, or None; the time in ms on the broker's clock the message
    expires at, 0 for never). Bytes that do not decode are forwarded as none."""
    try:
        props = decode_body(stored)
    except ProtocolError:
        return None, 0
    if not props:
        return None, 0
    interval = props.get(MESSAGE_EXPIRY)    # (0 is read as none, as Router.publish)
    if not interval:
        props.pop(MESSAGE_EXPIRY, None)
    return props, logged_ms + 1000 * interval if interval else 0


def remaining(props: dict, expires: int, now_ms: int) -> dict:
    """``props`` with the Message Expiry Interval left at ``now_ms`` (the broker's clock;
    whole seconds, rounded up: at least 1; never more than as published)."""
    props = dict(props)
    props[MESSAGE_EXPIRY] = max(1, min(props[MESSAGE_EXPIRY], -((now_ms - expires) // 1000)))
    return props


class Outbound:
    def __init__(self, name: str, commit_log, rules, own_id: bytes, cursor: int, sent: int,
                 drop=None, journal=None, clock=time.monotonic):
        """``journal``, ``clock``: the broker's (Journal.logged_ago, for Message Expiry);
        without a journal no record with properties may be read (tests)."""
        self.name = name
        self.log = commit_log
        self.journal = journal
        self.clock = clock
        self.rules = rules
        self.scan_filter = rules.scan_filter()
        self.own_id = own_id
        self.read_at = cursor          # where the next read starts
        self.saved = cursor            # the cursor in the checkpoint file (what a crash keeps)
        self.resend_until = sent       # below it, a record sent again is a resend (a crash)
        # (offset, remote topic, payload, qos, retain, 5.0 properties or None, expires at:
        # ms on the broker's clock, 0 for never)
        self.pending: deque = deque()
        self.pending_bytes = 0
        self.outstanding: dict[int, int] = {}    # offset -> bytes, in the order sent
        self.forwarded = 0             # records acknowledged by the remote
        self.forwarded_bytes = 0
        self.resent = 0                # records sent again (after a crash or a reconnect)
        self.refused = 0               # records the remote (or the client library) refused
        self.gaps = 0                  # times records were lost to the bridge
        self.gap_offsets = 0           # offsets lost
        self.skipped_own = 0           # records the bridge published itself (not sent back)
        self.unsendable = 0            # records whose remote topic is no valid topic name
        self.expired = 0               # records whose Message Expiry passed before sending
        self._drop = drop              # Broker.drop (the drop reason), or None
        self._unsendable_run = 0       # unsendable records since one went out (0: none)
        self._unsendable_logged = None   # time.monotonic() of the last line about them

    @property
    def cursor(self) -> int:
        """The first offset not acknowledged by the remote."""
        for offset in self.outstanding:
            return offset
        if self.pending:
            return self.pending[0][0]
        return self.read_at

    @property
    def sent_to(self) -> int:
        """Offsets below this were sent at least once."""
        return self.pending[0][0] if self.pending else self.read_at

    def at_head(self) -> bool:
        return not self.pending and self.read_at >= self.log.written_offset

    def check_gap(self) -> None:
        """Retention deleted records the bridge had not read (only ``retention_bytes`` does
        that, see ``hold``): go on from the oldest record kept; counted and logged."""
        first = self.log.first_offset
        if self.read_at < first:
            lost = first - self.read_at
            self.gaps += 1
            self.gap_offsets += lost
            log.warning("bridge %s: log records %d to %d were deleted before it forwarded them "
                        "(the log was over retention_bytes): %d offsets lost to the remote; it "
                        "goes on from %d", self.name, self.read_at, first - 1, lost, first)
            self.read_at = first
            if self.saved < first:
                self.saved = first

    def hold(self) -> int:
        """The oldest offset the bridge may need again: the cursor a crash would go back to."""
        return min(self.saved, self.cursor)

    def read(self) -> bool:
        """Read the next batch into ``pending`` when it runs low; True when something was read
        or the read moved on."""
        if len(self.pending) >= READ_AHEAD // 2 or self.pending_bytes >= READ_AHEAD_BYTES // 2:
            return False
        commit_log = self.log
        self.check_gap()
        start = self.read_at
        if start >= commit_log.written_offset:
            return False
        records, next_offset = commit_log.read_batch(
            start, self.scan_filter, READ_AHEAD - len(self.pending),
            READ_AHEAD_BYTES - self.pending_bytes, SCAN_BYTES, COPY_ALL, client_ids=True)
        if next_offset <= start:
            # Written but unreadable (damage the reader reported): past it, counted as a gap.
            next_offset = commit_log.written_offset
            self.gaps += 1
            self.gap_offsets += next_offset - start
            log.warning("bridge %s: log records %d to %d cannot be read: lost to the remote",
                        self.name, start, next_offset - 1)
        else:
            for a, b in commit_log.missing_between(start, next_offset):
                self.gaps += 1
                self.gap_offsets += b - a
                log.warning("bridge %s: log records %d to %d are lost to the remote (missing "
                            "from the log: no segment holds them)", self.name, a, b - 1)
        outgoing = self.rules.outgoing
        own = self.own_id
        pending = self.pending
        size = 0
        # Message Expiry: when each record was logged, on the broker's clock (its time stamp
        # is the wall clock's, which may have been stepped since: Journal.logged_ago).
        journal = self.journal
        now_ms = int(self.clock() * 1000)
        for offset, ts, qos, retain, topic, payload, _n, props, publisher in records:
            found = outgoing(topic)
            if found is None:
                continue
            if publisher == own:      # (counted only when an out rule would have sent it)
                self.skipped_own += 1
                continue
            remote_topic, rule_qos, problem = found
            if problem is not None:
                self.skip_unsendable(offset, topic, remote_topic, problem)
                continue
            self._unsendable_run = 0
            forward, expires = (carried(props, now_ms - journal.logged_ago(ts, offset))
                                if props else (None, 0))
            pending.append((offset, remote_topic, payload, rule_qos, retain, forward, expires))
            size += len(payload)
        self.pending_bytes += size
        self.read_at = next_offset
        return True

    def skip_unsendable(self, offset: int, topic, remote_topic: str, problem: str) -> None:
        """The record at ``offset`` cannot be sent as ``remote_topic`` (``problem``): not
        read into ``pending`` (or given up by the pump), counted, logged once per episode."""
        self.unsendable += 1
        if self._drop is not None:
            self._drop("bridge_unsendable", None, 1)
        self._unsendable_run += 1
        now = time.monotonic()
        last = self._unsendable_logged
        if self._unsendable_run > 1 or last is not None and now - last < UNSENDABLE_LOG_EVERY:
            return
        self._unsendable_logged = now
        if isinstance(topic, bytes):
            topic = topic.decode("utf-8", "replace")
        local = f" for {shown(topic)}" if topic is not None else ""
        log.warning("bridge %s: the message at offset %d%s cannot be forwarded: its remote "
                    "topic %s is no valid MQTT topic name (%s): skipped, counted as unsendable "
                    "(bridge_unsendable); logged once per episode, at most once a minute",
                    self.name, offset, local, shown(remote_topic), problem[:200])

    def expire(self) -> None:
        """The next record's Message Expiry passed before it was sent: skipped (the cursor
        moves past it), counted, logged once per bridge."""
        record = self.pending.popleft()
        self.pending_bytes -= len(record[2])
        self.expired += 1
        if self._drop is not None:
            self._drop("message_expired", None, 1)
        if self.expired == 1:
            log.warning("bridge %s: the message at offset %d for %s expired (its Message "
                        "Expiry Interval) before it could be forwarded: skipped, counted as "
                        "expired (message_expired); logged once", self.name, record[0],
                        shown(record[1]))

    def take(self):
        """The next record to send (offset, remote topic, payload, qos, retain, properties,
        expires at), now outstanding; None when none is read."""
        if not self.pending:
            return None
        record = self.pending.popleft()
        n = len(record[2])
        self.pending_bytes -= n
        offset = record[0]
        self.outstanding[offset] = n + len(record[1])
        if offset < self.resend_until:
            self.resent += 1
        return record

    def untake(self, record, problem: str | None = None) -> None:
        """Undo ``take`` of ``record`` (the client library did not take it): back to the
        front of ``pending`` (QueueFull, ``problem`` None), else skipped as unsendable."""
        offset = record[0]
        if self.outstanding.pop(offset, None) is not None and offset < self.resend_until:
            self.resent -= 1
        if problem is None:
            self.pending.appendleft(record)
            self.pending_bytes += len(record[2])
        else:
            self.skip_unsendable(offset, None, record[1], problem)

    def acked(self, offset: int) -> None:
        size = self.outstanding.pop(offset, None)
        if size is not None:
            self.forwarded += 1
            self.forwarded_bytes += size

    def refuse(self, offset: int) -> bool:
        """The record at ``offset`` will never be accepted by the remote: the cursor moves
        past it, counted as refused (not forwarded). False when it was not outstanding."""
        if self.outstanding.pop(offset, None) is None:
            return False
        self.refused += 1
        return True
