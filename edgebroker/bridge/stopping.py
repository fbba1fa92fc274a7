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
"""

from __future__ import annotations

import logging

log = logging.getLogger("edgebroker.bridge")


class Stopping:
    """``Bridge``'s side of it (a mixin over its state)."""

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
        ids) for the app to write."""
        if self.state != "stopped":
            self.halt()
        ob = self.outbound
        cursor = ob.cursor
        link = self.link
        if link is not None and not link.closed:
            left = link.out_bytes
            link.close("the broker stops")
            if left:
                log.warning("bridge %s: %d bytes still in its link at the stop (the remote "
                            "takes them slower than the stop waits): QoS 1/2 messages among "
                            "them are sent again at the next start, QoS 0 ones are lost",
                            self.name, left)
        return self.path, self.name, cursor, max(cursor, ob.sent_to), self.packet_ids
