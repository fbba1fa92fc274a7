"""A client over its publish rate or its control packet rate is throttled: its socket is not
read until its budget is back (``throttle``; ``Client.expire`` ends it), so TCP holds it back
alone. Not reading, the broker would not see the peer close before then, however long the
debt (a flood of 256 KB of packets is minutes at the default control_rate): the peer is
checked for its end without reading (``Transport.peer_end``) when each throttle ends and
every PEER_CHECK_SECONDS during one. A client whose peer has ended is still served at its
rate for up to GRACE_SECONDS (what it sent is handled in order: a DISCONNECT at its end is
handled as usual); if it is still throttled then, it is closed as a lost connection, and
what it sent that was not read yet is dropped (counted, logged).

These are ``Client`` methods (assigned in its class).
"""

from __future__ import annotations

import logging

log = logging.getLogger("edgebroker.client")

# How often a throttled client's peer is checked for its end, at most.
PEER_CHECK_SECONDS = 1.0
# How long a client whose peer has ended is still served at its rate: a publisher that sends
# a batch over its rate and closes (mosquitto_pub -l) is read to its end within this.
GRACE_SECONDS = 10.0


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
    client.warn_once(limit, "over its %s (%s %g/s)%s; not reading from it for %.3f s "
                     "(and again whenever it is over)",
                     "control packet rate" if limit == "control_rate" else "publish rate",
                     limit, getattr(broker.limits, limit), what and f" with {what}", wait)
    broker.schedule(client)


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
