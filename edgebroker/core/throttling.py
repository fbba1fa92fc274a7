"""A client over its publish rate or its control packet rate is throttled: its socket is not
read until its budget is back (``throttle``; ``Client.expire`` ends it), so TCP holds it back
alone. Not reading, the broker would not see the peer close before then, however long the
debt (a flood of 256 KB of packets is minutes at the default control_rate): the peer is
checked for its end without reading (``Transport.peer_end``) when each throttle ends and
every PEER_CHECK_SECONDS during one. A client whose peer has ended is still served at its
rate for up to GRACE_SECONDS (what it sent is handled in order: a DISCONNECT at its end is
handled as usual); if it is still throttled then, it is closed as a lost connection, and
what it sent that was not read yet is dropped (counted, logged); the same when a new
connection with its client id takes its session over (``taken_over``).

The rates are per client id, not per connection (``RateDebts``): what a client that leaves
still owes is kept, and a new connection with its client id starts from it (throttled at once
if it is still over). A reload that changes a rate applies it at once to every connection and
to what departed clients owe (``apply_rates``), and a throttle running is worked out again.

``throttle``, ``check_peer`` and ``peer_gone`` are ``Client`` methods (assigned in its class).
"""

from __future__ import annotations

import heapq
import logging

from edgebroker.core.limits import RESUME_SECONDS, PublishRate

log = logging.getLogger("edgebroker.client")

# How often a throttled client's peer is checked for its end, at most.
PEER_CHECK_SECONDS = 1.0
# How long a client whose peer has ended is still served at its rate: a publisher that sends
# a batch over its rate and closes (mosquitto_pub -l) is read to its end within this.
GRACE_SECONDS = 10.0


# The most departed client ids whose rate debts are kept (RateDebts); each entry is a tuple
# of five, about 400 bytes with its key and heap entry.
MAX_DEBTS = 10_000
RATES = ("messages_rate", "bytes_rate", "control_rate")


def throttle(client, limit: str, wait: float, what: str = "") -> None:
    """Not read for ``wait`` seconds, over ``limit`` (``what`` went over it: for the log)."""
    broker = client.broker
    now = broker.clock()
    if client.throttled_until:    # one more charge in the same handling: one throttle, longer
        client.throttled_until = max(client.throttled_until, now + wait)
        return broker.schedule(client)
    broker.hit(limit)
    client.throttled_until = now + wait
    client.halted = True
    client.throttle_start = now
    broker.throttled.add(client)
    client.transport.pause_reading("rate")
    warned = client.warned
    if warned is None:
        warned = client.warned = set()
    if limit not in warned:     # (a new connection of a client still in debt: see RateDebts)
        warned.add(limit)
        log.warning("%s: over its %s (%s %g/s)%s; not reading from it for %.3f s (and again "
                    "whenever it is over) (logged once per connection, and not again for a "
                    "connection of this client id while it still owes)", client.describe(),
                    "control packet rate" if limit == "control_rate" else "publish rate",
                    limit, applied_rate(client, limit), what and f" with {what}", wait)
    broker.schedule(client)


def applied_rate(client, limit: str) -> float:
    """The rate ``limit`` the client is held to."""
    if limit == "control_rate":
        return client.broker.control.rate
    rate = client.rate
    bucket = rate.messages if limit == "messages_rate" else rate.bytes
    return bucket.rate


def check_peer(client) -> None:
    """PEER_CHECK_SECONDS into a throttle (``Client.deadline``): closed if its peer's grace is
    over, else checked again PEER_CHECK_SECONDS later (the time throttled so far is counted)."""
    if not peer_gone(client):
        client._count_throttled(client.broker.clock())
        client.broker.schedule(client)


def peer_gone(client) -> bool:
    """Whether the throttled client is closed now because its peer has ended its stream (or
    reset it) more than GRACE_SECONDS ago: as a lost connection (its will published), what it
    sent that was not read yet dropped, rather than kept, with its connection slot, until
    its debt is paid. Until then it is served at its rate as before."""
    broker = client.broker
    now = broker.clock()
    ended = client.peer_ended_at
    if not ended:
        if client.transport.peer_end() is not None:
            client.peer_ended_at = now
        return False
    if now < ended + GRACE_SECONDS:
        return False
    unread = client.transport.peer_end() or 0
    unread += client.decoder.buffered
    if unread:
        broker.stats.throttled_closed_unread += 1
        broker.stats.throttled_unread_bytes += unread
    client.connection_lost(f"closed by peer {now - ended:.1f} s ago while throttled; the "
                           f"{unread} bytes it sent that were not read yet are dropped"
                           if unread else "closed by peer")
    return True


def taken_over(client) -> int:
    """A new connection with the client's id takes its session over: if it is throttled, what
    it sent that was not read yet is dropped with it, counted as when its grace ends
    (``peer_gone``); returns those bytes (for the takeover's log line). Its client will send
    the QoS 1 and 2 messages among them again (they were not acknowledged); QoS 0 ones are
    lost. (Not read at once: that would read a socket buffer's worth past the rate at every
    reconnect; nor served at its rate beside the new connection, which holds the session.)"""
    if not client.throttled_until:
        return 0
    unread = (client.transport.peer_end() or 0) + client.decoder.buffered
    if unread:
        stats = client.broker.stats
        stats.throttled_closed_unread += 1
        stats.throttled_unread_bytes += unread
    return unread


def over_rate(client, now: float) -> tuple[str, float] | None:
    """The rate the client is over now and how long not to read it (None: it is not)."""
    over = None
    rate = client.rate
    if rate is not None:
        for limit, bucket in (("messages_rate", rate.messages), ("bytes_rate", rate.bytes)):
            if bucket is not None and bucket.refill(now) < 1.0:
                wait = bucket.wait_for_share(RESUME_SECONDS)
                if over is None or wait > over[1]:
                    over = (limit, wait)
    control = client.broker.control
    if control is not None and client.control_due > now:
        wait = control.charge(client.control_due, now, 0)[1]
        if wait > 0 and (over is None or wait > over[1]):
            over = ("control_rate", wait)
    return over


def _carry(bucket, tokens: float, stamp: float, now: float) -> None:
    """``bucket`` (a new one) holds ``tokens`` as of ``stamp`` (at most its burst), refilled
    at its own rate since."""
    bucket.tokens = min(tokens, bucket.burst)
    bucket.stamp = stamp
    bucket.refill(now)


class RateDebts:
    """What clients that left still owe their rates (docs/limits.md, "Publish rate"), by client
    id, so that the buckets are per client id: a connection with that id starts from it, and
    a client that connects for every message is held to its rate as on one connection.

    An entry is (when its debt is repaid, the messages and bytes buckets' tokens (None: no
    such rate), the control packets owed, when it left, the rates it was logged as over).
    Only a client whose buckets are not full when it leaves has one (a fresh connection's
    would be the same), and it is dropped within HOUSEKEEPING_INTERVAL of being repaid
    (``prune``): it lasts as long as the debt (at most the largest burst over its rate,
    plus a packet of max_packet_size over bytes_rate). At most MAX_DEBTS are kept: beyond,
    the one repaid soonest goes. Nothing per message: one look-up at CONNECT, one entry at
    a disconnect."""

    __slots__ = ("entries", "heap")

    def __init__(self):
        self.entries: dict[str, tuple] = {}
        self.heap: list = []    # (repaid at, client id); one left behind by a later entry stays

    def __len__(self) -> int:
        return len(self.entries)

    def keep(self, client, now: float) -> None:
        """The connected ``client`` leaves: what it owes, if anything, kept by its id."""
        until = client.control_due
        tokens = [None, None]
        rate = client.rate
        if rate is not None:
            for i, bucket in enumerate((rate.messages, rate.bytes)):
                if bucket is not None:
                    tokens[i] = have = bucket.refill(now)
                    until = max(until, now + (bucket.burst - have) / bucket.rate)
        if until <= now:
            return
        control = client.broker.control
        owed = ((client.control_due - now) * control.rate
                if control is not None and client.control_due > now else 0.0)
        warned = client.warned
        logged = tuple(limit for limit in RATES if limit in warned) if warned else ()
        client_id = client.client_id
        self.entries[client_id] = (until, tokens[0], tokens[1], owed, now, logged)
        heap = self.heap
        heapq.heappush(heap, (until, client_id))
        if len(self.entries) > MAX_DEBTS:
            self._pop()
        if len(heap) > 2 * len(self.entries) + 64:  # entries left behind
            self.heap = [(entry[0], cid) for cid, entry in self.entries.items()]
            heapq.heapify(self.heap)

    def _pop(self) -> None:
        """Drop the entry repaid soonest."""
        entries, heap = self.entries, self.heap
        while heap:
            until, client_id = heapq.heappop(heap)
            entry = entries.get(client_id)
            if entry is not None and entry[0] == until:
                del entries[client_id]
                return

    def prune(self, now: float) -> None:
        """Drop the entries repaid by ``now`` (the broker's housekeeping, every second). A heap
        item left behind (its client came back, or left again with another debt) is only
        popped: the entry of that id, if any, is another one's."""
        entries, heap = self.entries, self.heap
        while heap and heap[0][0] <= now:
            until, client_id = heapq.heappop(heap)
            entry = entries.get(client_id)
            if entry is not None and entry[0] == until:
                del entries[client_id]

    def take(self, client, now: float) -> None:
        """A connection with a client id that left owing starts from its debt (its ``rate``
        and ``control_due`` set for the rates as they are now); its rate lines are not logged
        again if they were."""
        entry = self.entries.pop(client.client_id, None)
        if entry is None or entry[0] <= now:
            return
        _, messages, nbytes, owed, left, logged = entry
        rate = client.rate
        if rate is not None:
            if rate.messages is not None and messages is not None:
                _carry(rate.messages, messages, left, now)
            if rate.bytes is not None and nbytes is not None:
                _carry(rate.bytes, nbytes, left, now)
        control = client.broker.control
        if control is not None and owed:
            client.control_due = left + owed * control.interval
        if logged:
            if client.warned is None:
                client.warned = set()
            client.warned.update(logged)


def apply_rates(broker, old_limits, old_control, now: float) -> None:
    """A reload: rates that changed apply at once to every connection (and to what departed
    clients owe: ``RateDebts.take`` uses the rates as they are when they come back), and a
    throttle running is worked out again (ended now if the client is no longer over)."""
    limits = broker.limits
    publish = any(getattr(limits, k) != getattr(old_limits, k) for k in
                  ("messages_rate", "messages_burst", "bytes_rate", "bytes_burst"))
    control = broker.control
    control_changed = ((old_control.rate, old_control.ahead) if old_control else None) != (
        (control.rate, control.ahead) if control else None)
    if not (publish or control_changed):
        return
    for session in list(broker.sessions.values()):
        client = session.client
        if client is None or client.closed:
            continue
        if publish:
            old, client.rate = client.rate, PublishRate.for_limits(limits, now)
            if old is not None and client.rate is not None:
                for was, new in ((old.messages, client.rate.messages),
                                 (old.bytes, client.rate.bytes)):
                    if was is not None and new is not None:
                        _carry(new, was.refill(now), now, now)
            client.enter_connected()      # charged for PUBLISH or not
        if control_changed:
            due = client.control_due
            client.control_due = (now + (due - now) * old_control.rate * control.interval
                                  if control is not None and old_control is not None
                                  and due > now else 0.0)
        if client.throttled_until:
            over = over_rate(client, now)
            client.throttled_until = now + over[1] if over else now
            broker.schedule(client)
