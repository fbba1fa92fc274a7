"""How a bridge stops with the broker (``Bridge`` takes these methods), in three steps that
server/app.py's shutdown runs around the journal's final ``durable()``:

1. ``halt``: nothing new (no pump, no reconnect, no timer); a link not yet past its CONNACK
   is closed. A link that is up stays open: the final fsync that follows releases the
   acknowledgements (PUBACK, PUBREC) of the inbound messages logged last, into the link.
2. ``disconnect``: DISCONNECT queued behind them, and the link closes gracefully
   (``Link.finish``): it sends what it holds, then its end of the TCP connection, and reads
   (and drops) what still comes until the remote closes its end, as it does after a
   DISCONNECT. Closing a socket with bytes unread would reset the connection instead, and a
   reset may throw away the acknowledgements still on their way. The loop does this with
   the clients' last output, within the same bound (``closing``: the links not closed yet).
3. ``stop``: a link still open at the bound is closed; the final checkpoint is returned
   for the writer.

A QoS 0 message counts as forwarded once it is handed to the link, and the cursor moves
past it. At a stop on a slow link it may still be in the link's buffer, or in the
kernel's send queue, not yet acknowledged by the remote's TCP (a queue of megabytes on a
fast local socket). If the link did not close gracefully within the bound, it is reset
(``Link.reset``: the kernel drops its send queue, which would otherwise go out after the
process is gone) and the final checkpoint goes back to the first QoS 0 message of the
oldest batch handed to the link whose end the remote's TCP had not acknowledged
(``Link.unacknowledged``), so the next start sends it (and what followed it) again
instead of losing it. What the remote's TCP acknowledged and the remote had not read yet
is its own (a new connection with the same client id may end the old one before the remote
reads it: QoS 0 lost, as at most once allows). Where the batch partly arrived, the remote
may get some of those messages twice. For that the bridge keeps, per batch handed to the
link, where in the link's byte stream the batch ends and its first QoS 0 offset
(``handed``): at most the batches in the link's buffer and the kernel's send queue
(trimmed every ``TRIM_AT``).
"""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger("edgebroker.bridge")

# Batches noted before the ones the remote acknowledged are dropped (one system call).
TRIM_AT = 64


class Stopping:
    """``Bridge``'s side of it (a mixin over its state)."""

    def init_stopping(self) -> None:
        self.handed_end = 0         # the link's byte count at the end of the last batch
        # (end, first QoS 0 offset, QoS 0 messages handed before the batch) of batches in
        # the link, and the QoS 0 messages handed to it in all
        self._handed: deque = deque()
        self._handed_count = 0
        self._handed_link = None    # the link those are of
        # A link that closed during the stop (the remote reset it): _unsent_qos0 as it closed
        self._stop_unsent: int | None = None

    def handed(self, offset: int) -> None:
        """A QoS 0 message (its log offset) was handed to the link (in the last batch)."""
        link = self.link
        if link is None:
            return
        batches = self._handed
        if self._handed_link is not link:   # a new link: the old one's bytes are gone
            batches.clear()
            self._handed_link = link
        end = self.handed_end
        self._handed_count += 1
        if batches and batches[-1][0] == end:
            return                  # the same batch: its first offset is kept
        if len(batches) >= TRIM_AT:
            arrived = link.bytes_out - link.unacknowledged()
            while batches and batches[0][0] <= arrived:
                batches.popleft()
        batches.append((end, offset, self._handed_count - 1))

    def _unsent_qos0(self) -> int | None:
        """The lowest offset of a QoS 0 message of a batch that did not wholly reach the
        remote's TCP, or None."""
        link = self.link
        if link is None or self._handed_link is not link:
            return None
        arrived = link.bytes_out - (link.unacknowledged_at_close if link.closed
                                    else link.unacknowledged())
        offsets = [offset for end, offset, _ in self._handed if end > arrived]
        return min(offsets) if offsets else None

    def link_closed(self) -> None:
        """The link closed (``Bridge.on_closed``, before it lets go of it): at a stop, what it
        had not delivered is sent again at the next start (``stop``); otherwise its QoS 0
        messages still in its buffer are lost (``lost_qos0``)."""
        if self.state == "stopped":
            self._stop_unsent = self._unsent_qos0()
        else:
            self.lost_qos0(self.link)

    def lost_qos0(self, link) -> int:
        """``link`` broke (not at a stop): the QoS 0 messages of the batches handed to it
        whose end the socket had not taken (still in the link's buffer): lost, as at most
        once allows (a batch that partly went counts whole). What the kernel took still goes
        out after the close, and reaches the remote unless it ended that connection first.
        Counted (``bridge_link_lost``) and logged once per bridge."""
        if link is None or self._handed_link is not link:
            return 0
        taken = link.bytes_out
        lost = next((self._handed_count - before for end, _, before in self._handed
                     if end > taken), 0)
        self._handed.clear()
        self.count_lost_qos0(lost)
        return lost

    def count_lost_qos0(self, lost: int) -> None:
        if lost:
            self.broker.drop("bridge_link_lost", None, lost)
            self._once("link_lost", "bridge %s: %d QoS 0 messages handed to the link to %s "
                       "were still in its buffer when the link broke: lost, as QoS 0 allows "
                       "(counted as dropped, bridge_link_lost; logged once)", self.name, lost,
                       self.config.address)

    def halt(self) -> None:
        """Step 1: no timer, no pump, no new link; a link not up (past CONNACK) closes."""
        self.state = "stopped"
        for timer in (self._retry, self._tick, self._save, self._again, self._busy_retry,
                      self._give_up):
            timer.cancel()
        self.resolver = None
        link = self.link
        if link is not None and not link.closed and not (
                link.up and self.conn.state == "connected"):
            link.close("the broker stops")

    def disconnect(self) -> None:
        """Step 2: DISCONNECT behind what the link holds (the last acknowledgements), and
        the graceful close begins."""
        link = self.link
        if link is not None and not link.closed and self.conn.state == "connected":
            self.conn.disconnect()
            link.send(self.conn.data_to_send())
            if not link.closed:
                link.finish()

    def closing(self):
        """The link's loop callback while it closes (None when closed)."""
        link = self.link
        return link.on_event if link is not None and not link.closed else None

    def stop(self) -> tuple:
        """Step 3: close; returns the final checkpoint (path, name, cursor, sent, packet
        ids, subscriptions) for the app to write."""
        if self.state != "stopped":
            self.halt()
        ob = self.outbound
        cursor = ob.cursor
        unsent = self._unsent_qos0() if self.link is not None else self._stop_unsent
        link = self.link
        if link is not None and not link.closed:
            left = link.out_bytes + link.unacknowledged()
            link.reset("the broker stops")      # what it held goes at the next start
            if left:
                log.warning("bridge %s: %d bytes still in its link at the stop, not received "
                            "by the remote (it takes them slower than the stop waits): QoS "
                            "1/2 messages among them are sent again at the next start%s",
                            self.name, left,
                            f"; QoS 0 ones too, from log offset {unsent}"
                            if unsent is not None else "")
        if unsent is not None and unsent < cursor:
            cursor = unsent
        return (self.path, self.name, cursor, max(cursor, ob.sent_to), self.packet_ids,
                self.remote_subs)
